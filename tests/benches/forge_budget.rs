//! Benchmark: the content budget against a stand-in GitHub that enforces GitHub's secondary
//! limits on content-creating requests (comments, commit statuses, deployments and their
//! statuses): 80 in any minute and 500 in any hour per token, a breach answered as GitHub
//! documents it (403, "You have exceeded a secondary rate limit", `Retry-After`).
//!
//! 1. `PREVIEWD_BUDGET_ENVIRONMENTS` pull requests (default 1,000) are opened, and their
//!    environments deployed and reported, by a previewd whose budget is large enough for all
//!    of it at once: opening them at GitHub's pace would take hours (7 requests each, 500 an
//!    hour). The stand-in does not count this phase.
//! 2. That previewd is replaced by one with the default budget (70 a minute, 450 an hour), and
//!    the stand-in starts counting, as GitHub would in a fresh hour.
//! 3. Churn: a push to a random pull request every second for `PREVIEWD_BUDGET_CHURN_SECONDS`
//!    (default 60: 60 pushes at 4 requests a final report is about what GitHub's hour holds).
//! 4. Then it waits until every pull request pushed shows its last commit's final state at the
//!    stand-in: its comment says `ready` at that commit, the commit's status is `success`, and
//!    the commit's deployment has a `success` status.
//!
//! 5. One pull request pushing every second beside a hundred quiet ones that get a push a minute
//!    among them (`PREVIEWD_BUDGET_BUSY_SECONDS`, default 600; `PREVIEWD_BUDGET_QUIET_EVERY`,
//!    default 60): how long each quiet push takes to show its final state, against the bound
//!    the fair shares state ([`BusyBesideQuiet`]).
//!
//! Printed: content-creating requests per push (by kind, and those superseded before they were
//! sent), the delay from each pull request's last push to its final commit status (p50, p99),
//! the quiet pull requests' delays beside the busy one (p50, max, the bound), and the breaches. It fails if the stand-in refused any request for a breach, or if a pull
//! request does not show its last commit's final state within 20 minutes; never on timing.
//!
//! `cargo bench --bench forge_budget`. `PREVIEWD_BUDGET_LIMITS=1000000,1000000` runs the churn
//! with a budget that holds nothing back, to compare (the breaches are then printed, not
//! refused).

#[path = "../support/mod.rs"]
mod support;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams};
use previewd::model::crd::{Phase, PreviewEnvironment};
use serde_json::{Value, json};
use support::process::PreviewdProcess;
use support::webhooks::*;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const REPOSITORY: &str = "Codertocat/Hello-World";
/// GitHub's published secondary limits on content-creating requests, per token.
const GITHUB_PER_MINUTE: usize = 80;
const GITHUB_PER_HOUR: usize = 500;

fn main() {
    support::run_benchmark(benchmark());
}

/// The head of PR `number` after `change` pushes (40 hex digits, distinct in their first 7).
fn head(number: u64, change: u64) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("budget {number}/{change}"));
    hex::encode(digest)[..40].to_string()
}

/// A content-creating request the stand-in accepted.
#[derive(Clone)]
struct Accepted {
    at: Instant,
    method: String,
    path: String,
    body: Value,
}

/// The stand-in's count of content-creating requests: the last hour's, once counting started.
#[derive(Default)]
struct Limits {
    counting: bool,
    window: VecDeque<Instant>,
    accepted: Vec<Accepted>,
    breaches: usize,
}

/// Matches the content-creating requests that breach GitHub's limits (they get the 403), and
/// records the ones that do not (the stand-in's other mocks answer them).
#[derive(Clone, Default)]
struct SecondaryLimits(Arc<Mutex<Limits>>);

/// Whether `request` creates content as GitHub counts it: a comment or its edit, a commit
/// status, a deployment or a deployment status (anything else previewd might send is not
/// counted, and would show as unanswered).
fn creates_content(request: &Request) -> bool {
    let path = request.url.path();
    let method = request.method.as_str();
    (method == "POST" || method == "PATCH")
        && (path.contains("/comments")
            || path.contains("/statuses/")
            || path.ends_with("/deployments")
            || path.ends_with("/statuses"))
}

impl wiremock::Match for SecondaryLimits {
    fn matches(&self, request: &Request) -> bool {
        if !creates_content(request) {
            return false;
        }
        let mut limits = self.0.lock().unwrap();
        if !limits.counting {
            return false;
        }
        let now = Instant::now();
        while limits
            .window
            .front()
            .is_some_and(|at| now - *at >= Duration::from_secs(3_600))
        {
            limits.window.pop_front();
        }
        let minute = limits
            .window
            .iter()
            .rev()
            .take_while(|at| now - **at < Duration::from_secs(60))
            .count();
        if minute >= GITHUB_PER_MINUTE || limits.window.len() >= GITHUB_PER_HOUR {
            limits.breaches += 1;
            return true;
        }
        limits.window.push_back(now);
        let body = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        limits.accepted.push(Accepted {
            at: now,
            method: request.method.to_string(),
            path: request.url.path().to_string(),
            body,
        });
        false
    }
}

/// Deployments get ids of their own (the shared stand-in gives every one id 77), so that a
/// deployment status tells which commit it is about.
#[derive(Clone, Default)]
struct DeploymentIds(Arc<Mutex<Vec<String>>>);

impl Respond for DeploymentIds {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut refs = self.0.lock().unwrap();
        refs.push(body["ref"].as_str().unwrap_or_default().to_string());
        ResponseTemplate::new(201).set_body_json(json!({"id": 1_000 + refs.len()}))
    }
}

/// The stand-in GitHub: the shared answers, GitHub's limits in front of them, and deployment ids.
async fn stand_in() -> (MockServer, SecondaryLimits, DeploymentIds) {
    let forge = MockServer::start().await;
    let limits = SecondaryLimits::default();
    let message = json!({"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"});
    Mock::given(limits.clone())
        .respond_with(
            ResponseTemplate::new(403)
                .set_body_json(message)
                .insert_header("retry-after", "60"),
        )
        .with_priority(1)
        .mount(&forge)
        .await;
    let ids = DeploymentIds::default();
    Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path_regex(
            r"^/repos/[^/]+/[^/]+/deployments$",
        ))
        .respond_with(ids.clone())
        .with_priority(2)
        .mount(&forge)
        .await;
    mount_github_api(&forge).await;
    (forge, limits, ids)
}

/// What the stand-in shows of one pull request's environment: its comment's last text, and
/// per commit its commit statuses and its deployment's statuses, in order.
#[derive(Default)]
struct Shown {
    comment: String,
    commit_states: HashMap<String, Vec<(String, Instant)>>,
    deployment_states: HashMap<String, Vec<String>>,
}

fn shown(accepted: &[Accepted], ids: &[String]) -> HashMap<u64, Shown> {
    let mut by_pr: HashMap<u64, Shown> = HashMap::new();
    let mut pr_of_commit: HashMap<String, u64> = HashMap::new();
    let mut statuses_of_commit: Vec<(String, String, Instant)> = Vec::new();
    for request in accepted {
        let path = request.path.as_str();
        if path.contains("/comments") {
            let text = request.body["body"].as_str().unwrap_or_default();
            if let Some(number) = pr_in_marker(text) {
                by_pr.entry(number).or_default().comment = text.to_string();
            }
        } else if let Some(commit) = path.split("/statuses/").nth(1) {
            let state = request.body["state"].as_str().unwrap_or_default();
            statuses_of_commit.push((commit.to_string(), state.to_string(), request.at));
        } else if let Some(id) = path
            .strip_suffix("/statuses")
            .and_then(|p| p.rsplit('/').next())
        {
            let commit = id
                .parse::<usize>()
                .ok()
                .and_then(|id| ids.get(id.checked_sub(1_001)?).cloned())
                .unwrap_or_default();
            let state = request.body["state"].as_str().unwrap_or_default();
            deployment_states_of(&mut by_pr, &pr_of_commit, &commit).push(state.to_string());
        } else if request.method == "POST" && path.ends_with("/deployments") {
            let environment = request.body["environment"].as_str().unwrap_or_default();
            let commit = request.body["ref"].as_str().unwrap_or_default();
            if let Some(number) = pr_of_environment(environment) {
                pr_of_commit.insert(commit.to_string(), number);
            }
        }
    }
    for (commit, state, at) in statuses_of_commit {
        if let Some(number) = pr_of_commit.get(&commit) {
            let shown = by_pr.entry(*number).or_default();
            shown
                .commit_states
                .entry(commit)
                .or_default()
                .push((state, at));
        }
    }
    by_pr
}

fn deployment_states_of<'a>(
    by_pr: &'a mut HashMap<u64, Shown>,
    pr_of_commit: &HashMap<String, u64>,
    commit: &str,
) -> &'a mut Vec<String> {
    let number = pr_of_commit.get(commit).copied().unwrap_or(0);
    let shown = by_pr.entry(number).or_default();
    shown
        .deployment_states
        .entry(commit.to_string())
        .or_default()
}

/// The PR number in a comment's marker (`<!-- previewd:environment=<ns>/<environment> -->`).
fn pr_in_marker(text: &str) -> Option<u64> {
    let marker = text.split("previewd:environment=").nth(1)?;
    pr_of_environment(marker.split_whitespace().next()?)
}

/// The PR number in an environment's name, `<template>-pr-<number>-<hash>`.
fn pr_of_environment(name: &str) -> Option<u64> {
    let after = name.rsplit("-pr-").next()?;
    after.split('-').next()?.parse().ok()
}

/// Whether PR `number` shows commit `sha` in its final state; when its commit status said so.
fn final_state(shown: &HashMap<u64, Shown>, number: u64, sha: &str) -> Option<Instant> {
    let shown = shown.get(&number)?;
    let short = &sha[..7];
    let comment_ready = shown.comment.contains("Preview environment: ready")
        && shown.comment.contains(&format!("`{short}`"));
    let deployed = shown
        .deployment_states
        .get(sha)
        .is_some_and(|states| states.last().is_some_and(|s| s == "success"));
    let (state, at) = shown.commit_states.get(sha)?.last()?;
    (comment_ready && deployed && state == "success").then_some(*at)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Waits until every environment is Ready at its head.
async fn wait_ready(environments: &Api<PreviewEnvironment>, heads: &HashMap<u64, String>) {
    let deadline = Instant::now() + Duration::from_secs(1_200);
    loop {
        let listed = environments.list(&ListParams::default()).await.unwrap();
        let ready = listed
            .items
            .iter()
            .filter(|e| {
                let number = e.spec.source.pull_request.unwrap_or(0);
                let status = e.status.as_ref();
                heads.get(&number) == Some(&e.spec.source.head_sha)
                    && status.is_some_and(|s| s.phase == Phase::Ready)
                    && status.and_then(|s| s.deployed_sha.as_ref()) == heads.get(&number)
            })
            .count();
        if ready == heads.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ready} of {} environments Ready after 20 minutes",
            heads.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the stand-in has received no request for 5 s.
async fn forge_quiet(forge: &MockServer) {
    let mut last = 0;
    let mut quiet = 0;
    while quiet < 10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = forge.received_requests().await.unwrap_or_default().len();
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
}

async fn benchmark() {
    let size = support::setting::<u64>("PREVIEWD_BUDGET_ENVIRONMENTS", 1_000);
    // `PREVIEWD_BUDGET_LIMITS=<per minute>,<per hour>`: the churn's previewd spends that budget
    // instead of its default, to compare.
    let budget_flags: Option<(String, String)> =
        std::env::var("PREVIEWD_BUDGET_LIMITS").ok().and_then(|v| {
            let (minute, hour) = v.split_once(',')?;
            Some((minute.trim().to_string(), hour.trim().to_string()))
        });
    let within_githubs_limits = budget_flags.as_ref().is_none_or(|(minute, hour)| {
        minute
            .parse::<usize>()
            .is_ok_and(|m| m <= GITHUB_PER_MINUTE)
            && hour.parse::<usize>().is_ok_and(|h| h <= GITHUB_PER_HOUR)
    });
    let churn_seconds = support::setting::<u64>("PREVIEWD_BUDGET_CHURN_SECONDS", 60);
    let client = support::client().await;
    let namespace = support::create_namespace(&client, "bench-budget").await;
    let (forge, limits, ids) = stand_in().await;
    install_template_with(
        &client,
        &namespace,
        "github",
        REPOSITORY,
        Some(&forge.uri()),
        json!({}),
        CONFIG_MAP_APP,
    )
    .await;
    let logs = tempfile::tempdir().unwrap();
    let start = |name: &str, budget: &[&str]| {
        let mut args: Vec<&str> = vec![
            "--watch-namespace",
            &namespace,
            // The stand-in lists no pull requests; the sweep must not run mid-benchmark.
            "--sweep-interval",
            "24h",
            "--lease-namespace",
            &namespace,
        ];
        args.extend(budget);
        PreviewdProcess::start(
            name,
            &support::shared().kubeconfig_path,
            &args,
            &[],
            logs.path(),
        )
    };
    let http = reqwest::Client::new();
    println!(
        "forge budget: {size} environments, a push a second for {churn_seconds} s; the stand-in allows {GITHUB_PER_MINUTE} a minute and {GITHUB_PER_HOUR} an hour; previewd's budget: {}",
        budget_flags
            .as_ref()
            .map_or("the default".to_string(), |(m, h)| format!(
                "{m} a minute, {h} an hour"
            ))
    );

    // 1. Set up, with a budget that never holds a report back.
    let setup = start(
        "previewd-setup",
        &[
            "--forge-content-per-minute",
            "1000000",
            "--forge-content-per-hour",
            "1000000",
        ],
    );
    setup.wait_ready(&http).await;
    let started = Instant::now();
    let mut heads: HashMap<u64, String> = (1..=size).map(|n| (n, head(n, 0))).collect();
    let mut changes: HashMap<u64, u64> = (1..=size).map(|n| (n, 0)).collect();
    let opened_at = Utc::now() - chrono::TimeDelta::hours(1);
    futures::stream::iter(1..=size)
        .map(|number| {
            let body = pull_request_change(number, 0, &head(number, 0), opened_at);
            let (setup, http) = (&setup, &http);
            async move {
                let delivery = format!("open-{number}");
                setup.send(http, "pull_request", &delivery, &body).await
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    wait_ready(&environments, &heads).await;
    forge_quiet(&forge).await;
    println!(
        "  set up: {size} environments Ready and reported {:.1} s after the first delivery ({} forge requests)",
        started.elapsed().as_secs_f64(),
        forge.received_requests().await.unwrap_or_default().len()
    );

    // 2. The default budget, and GitHub's limits from now on.
    drop(setup);
    let previewd = match &budget_flags {
        Some((minute, hour)) => start(
            "previewd",
            &[
                "--forge-content-per-minute",
                minute,
                "--forge-content-per-hour",
                hour,
            ],
        ),
        None => start("previewd", &[]),
    };
    previewd.wait_ready(&http).await;
    limits.0.lock().unwrap().counting = true;

    // 3. Churn.
    let mut rng = 0x5eedu64;
    let mut last_push: HashMap<u64, Instant> = HashMap::new();
    let churn_started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for second in 0..churn_seconds {
        tick.tick().await;
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let number = 1 + (rng >> 33) % size;
        let change = changes.get_mut(&number).unwrap();
        *change += 1;
        let sha = head(number, *change);
        let body = pull_request_change(number, *change, &sha, Utc::now());
        previewd
            .send(&http, "pull_request", &format!("push-{second}"), &body)
            .await;
        heads.insert(number, sha);
        last_push.insert(number, Instant::now());
    }
    let pushes = churn_seconds as usize;

    // 4. Until every pushed PR shows its last commit's final state.
    let deadline = Instant::now() + Duration::from_secs(1_200);
    let delays: Vec<Duration> = loop {
        let (accepted, breaches) = {
            let limits = limits.0.lock().unwrap();
            (limits.accepted.clone(), limits.breaches)
        };
        // A budget larger than GitHub's is run to show what GitHub then refuses.
        assert!(
            breaches == 0 || !within_githubs_limits,
            "the stand-in refused {breaches} requests for GitHub's limits"
        );
        let shown = shown(&accepted, &ids.0.lock().unwrap());
        let arrived: Vec<Duration> = last_push
            .iter()
            .filter_map(|(number, pushed)| {
                let at = final_state(&shown, *number, &heads[number])?;
                Some(at.saturating_duration_since(*pushed))
            })
            .collect();
        if arrived.len() == last_push.len() {
            break arrived;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} pull requests show their last commit's final state after 20 minutes",
            arrived.len(),
            last_push.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let drained = churn_started.elapsed();
    // Whatever previewd still sends once every final state is shown is checked too.
    forge_quiet(&forge).await;
    let breaches = limits.0.lock().unwrap().breaches;
    assert!(
        breaches == 0 || !within_githubs_limits,
        "the stand-in refused {breaches} requests for GitHub's limits"
    );
    let mut delays = delays;
    delays.sort();

    let metrics = http
        .get(format!("{}/metrics", previewd.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let accepted = limits.0.lock().unwrap().accepted.clone();
    let mut by_kind: std::collections::BTreeMap<&str, usize> = Default::default();
    for request in &accepted {
        *by_kind.entry(kind_of(request)).or_default() += 1;
    }
    let per_push: Vec<String> = by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {:.2}", *n as f64 / pushes as f64))
        .collect();
    let superseded = metric_sum_matching(
        &metrics,
        "previewd_forge_content_requests_total",
        "superseded",
    );
    println!(
        "  churn: {pushes} pushes to {} pull requests; {} content-creating requests, {:.2} per push ({}); {superseded} superseded before they were sent; {breaches} refused by the stand-in for GitHub's limits",
        last_push.len(),
        accepted.len(),
        accepted.len() as f64 / pushes as f64,
        per_push.join(", ")
    );
    println!(
        "  last push → final state at the forge (comment ready, deployment and commit status success): p50 {:.1} s, p99 {:.1} s; every pull request showed it {:.1} s after the churn began",
        percentile(&delays, 0.50).as_secs_f64(),
        percentile(&delays, 0.99).as_secs_f64(),
        drained.as_secs_f64()
    );

    // 5. One pull request pushing as fast as it can beside quiet ones.
    let busy = BusyBesideQuiet {
        previewd: &previewd,
        http: &http,
        limits: &limits,
        ids: &ids,
        size,
    };
    busy.run(&mut heads, &mut changes).await;

    drop(previewd);
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await;
}

/// Step 5: PR 1 gets a push every second for `PREVIEWD_BUDGET_BUSY_SECONDS` (default 600),
/// while PRs 2..=101 get a push in turn every `PREVIEWD_BUDGET_QUIET_EVERY` seconds (default 60:
/// a push a minute among a hundred quiet pull requests). Printed: how long each quiet push took
/// to show its final state at the forge, against the bound the fair shares give (a quiet
/// environment's final report is never held for the busy one: the last quarter of each window
/// is kept for environments that spent little, so it waits for its own deploy only), and how
/// many of the busy one's commits showed theirs.
struct BusyBesideQuiet<'a> {
    previewd: &'a PreviewdProcess,
    http: &'a reqwest::Client,
    limits: &'a SecondaryLimits,
    ids: &'a DeploymentIds,
    size: u64,
}

/// The bound stated for a quiet environment's push → final state beside a busy one: its own
/// deploy and report (a few seconds here), well within a minute.
const QUIET_BOUND: Duration = Duration::from_secs(60);

impl BusyBesideQuiet<'_> {
    async fn run(&self, heads: &mut HashMap<u64, String>, changes: &mut HashMap<u64, u64>) {
        let seconds = support::setting::<u64>("PREVIEWD_BUDGET_BUSY_SECONDS", 600);
        let quiet_every = support::setting::<u64>("PREVIEWD_BUDGET_QUIET_EVERY", 60).max(1);
        let quiet_count = self.size.saturating_sub(1).min(100);
        if quiet_count == 0 {
            return;
        }
        let mut quiet_pushes: Vec<(u64, String, Instant)> = Vec::new();
        let mut busy_heads: Vec<String> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for second in 0..seconds {
            tick.tick().await;
            busy_heads.push(
                self.push(1, heads, changes, &format!("busy-{second}"))
                    .await,
            );
            if second % quiet_every == quiet_every - 1 {
                let number = 2 + (second / quiet_every) % quiet_count;
                let delivery = format!("quiet-{second}");
                let pushed = Instant::now();
                let sha = self.push(number, heads, changes, &delivery).await;
                quiet_pushes.push((number, sha, pushed));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(1_200);
        let delays: Vec<Duration> = loop {
            let accepted = self.limits.0.lock().unwrap().accepted.clone();
            let shown = shown(&accepted, &self.ids.0.lock().unwrap());
            let arrived: Vec<Duration> = quiet_pushes
                .iter()
                .filter_map(|(number, sha, pushed)| {
                    let at = final_state(&shown, *number, sha)?;
                    Some(at.saturating_duration_since(*pushed))
                })
                .collect();
            if arrived.len() == quiet_pushes.len() {
                // Its comment says only its newest commit, so its commit statuses count.
                let busy_shown = busy_heads
                    .iter()
                    .filter(|sha| {
                        accepted.iter().any(|request| {
                            request.path.ends_with(sha.as_str())
                                && request.body["state"] == "success"
                        })
                    })
                    .count();
                println!(
                    "  busy beside quiet: PR 1 pushed every second for {seconds} s; {busy_shown} of its {} commits got their final commit status (its share of the budget); {} quiet pushes (one every {quiet_every} s among {quiet_count} PRs)",
                    busy_heads.len(),
                    quiet_pushes.len()
                );
                break arrived;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} quiet pushes show their final state after 20 minutes",
                arrived.len(),
                quiet_pushes.len()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let mut delays = delays;
        delays.sort();
        let longest = delays.last().copied().unwrap_or_default();
        println!(
            "  quiet push → final state at the forge beside the busy one: p50 {:.0} ms, max {:.0} ms; bound stated: {} s ({})",
            percentile(&delays, 0.50).as_secs_f64() * 1000.0,
            longest.as_secs_f64() * 1000.0,
            QUIET_BOUND.as_secs(),
            if longest <= QUIET_BOUND {
                "held"
            } else {
                "exceeded"
            }
        );
        let breaches = self.limits.0.lock().unwrap().breaches;
        println!("  refused by the stand-in for GitHub's limits meanwhile: {breaches}");
    }

    /// Pushes a new commit to PR `number`; returns its head.
    async fn push(
        &self,
        number: u64,
        heads: &mut HashMap<u64, String>,
        changes: &mut HashMap<u64, u64>,
        delivery: &str,
    ) -> String {
        let change = changes.entry(number).or_default();
        *change += 1;
        let sha = head(number, *change);
        let body = pull_request_change(number, *change, &sha, Utc::now());
        self.previewd
            .send(self.http, "pull_request", delivery, &body)
            .await;
        heads.insert(number, sha.clone());
        sha
    }
}

/// The kind of a content-creating request, as previewd's metric names it.
fn kind_of(request: &Accepted) -> &'static str {
    let path = request.path.as_str();
    if path.contains("/comments") {
        "comment"
    } else if path.contains("/deployments/") {
        "deployment_status"
    } else if path.ends_with("/deployments") {
        "deployment"
    } else {
        "commit_status"
    }
}

/// The sum of the series of metric `name` whose labels contain `label`.
fn metric_sum_matching(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
