//! Benchmark: previewd with many environments. A real `previewd run` process (so that its RSS
//! and CPU time are its own) on the local control plane with the node simulator, fed signed
//! GitHub deliveries on loopback, reporting to a stand-in GitHub API.
//!
//! For each size (default 50, 100, 200 environments of a 10-object app, grown one stage into
//! the next):
//! 1. opens the new PRs and measures the time until every environment is `Ready`;
//! 2. a quiet minute: no deliveries, previewd resyncs every environment every 30 s. Every write
//!    previewd sends then is waste;
//! 3. churn: a push (a `synchronize` with a new head) to a random environment every second for
//!    2 minutes. Measured: push → `Ready` at that head, write requests, apply-cache hits, and
//!    which objects changed (resourceVersion) in environments that were not pushed: waste.
//!
//! After the last size, previewd is replaced twice (SIGKILL and restart; then a failover to a
//! standby replica): each successor starts with an empty apply cache and must write nothing
//! for the unchanged environments, counted by the API server.
//!
//! Printed per size: time to all Ready, latency p50/p99 and its parts (delivery → the new head
//! on the environment → objects applied, applied → rollout complete, rollout complete → Ready)
//! and every reconcile's steps as previewd times them, writes per minute in churn and at
//! steady state, objects changed in untouched environments, apply-cache hit ratio, previewd's
//! RSS (now and peak) and CPU seconds. Writes are counted twice: by previewd's own metrics and
//! by the API server's `apiserver_request_total` (by verb and resource, every client, with the
//! Lease and node heartbeats apart; previewd's own Lease renewals are counted by a watch on it).
//! It fails when an environment does not end Ready at its last head, or when anything was
//! written for environments that did not change (by previewd's count, by the resourceVersions,
//! or by the API server's count of writes of previewd's shape); never on timing.
//!
//! `cargo bench --bench scale`. `PREVIEWD_SCALE_SIZES` (default `50,100,200`),
//! `PREVIEWD_SCALE_CHURN_SECONDS` (default 120) and `PREVIEWD_SCALE_QUIET_SECONDS` (default 60)
//! change the run. `PREVIEWD_SCALE_CONTENT_BUDGET`: `off` (the default here: the content
//! budget is raised out of the way, so that the figures are the cluster side's) or `default`
//! (previewd's own: 70 content-creating requests a minute and 450 an hour, under GitHub's 80 and
//! 500). With the default budget the reports of the opened environments are still draining in
//! the quiet window: each report sent is recorded in its environment's status, so status writes
//! then are not waste, as long as there are no more of them than content-creating requests
//! (comments, deployments and statuses: the stand-in forge's POSTs and PATCHes) sent; every
//! other write still is.

#[path = "../support/mod.rs"]
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use previewd::model::crd::{Phase, PreviewEnvironment};
use support::apiserver::{self, RequestCounts, RequestSeconds, Requests};
use support::audit::{self, PushPath};
use support::process::PreviewdProcess;
use support::webhooks::*;

const REPOSITORY: &str = "Codertocat/Hello-World";
/// How often previewd reconciles an unchanged environment during the benchmark: twice in the
/// quiet minute, so that the minute shows what resyncs cost.
const RESYNC: &str = "30s";

/// The 10-object application. A push changes 3 of them (the release ConfigMap and the two
/// Deployments' pod templates); the other 7 render the same for every commit.
const APP: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {LOG_LEVEL: info, FEATURE_FLAGS: "search,checkout"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: release}
data: {GIT_SHA: "{{ sha }}", BRANCH: "{{ branch }}"}
---
apiVersion: v1
kind: Secret
metadata: {name: app}
stringData: {SESSION_KEY: "preview-only-session-key"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {previewd.dev/sha: "{{ sha }}"}
    spec:
      serviceAccountName: app
      containers:
        - name: web
          image: "registry.example.com/web:{{ sha }}"
          ports: [{name: http, containerPort: 8080, protocol: TCP}]
          envFrom: [{configMapRef: {name: settings}}, {configMapRef: {name: release}}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker}
spec:
  replicas: 1
  selector: {matchLabels: {app: worker}}
  template:
    metadata:
      labels: {app: worker}
      annotations: {previewd.dev/sha: "{{ sha }}"}
    spec:
      serviceAccountName: app
      containers:
        - name: worker
          image: "registry.example.com/worker:{{ sha }}"
          envFrom: [{secretRef: {name: app}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: app}
rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: app}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}
subjects: [{kind: ServiceAccount, name: app}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  rules:
    - host: "{{ slug }}.preview.example.com"
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {service: {name: web, port: {number: 80}}}
"#;

fn main() {
    // Two pods per environment; a simulated node takes 250, like a kubelet with --max-pods=250.
    let pods = sizes().into_iter().max().unwrap_or(0) * 2;
    support::simulate_nodes((pods / 200 + 1) as usize);
    // When the API server received and answered each write on a push's way to Ready.
    support::audit_writes();
    support::run_benchmark(benchmark());
}

/// Which content budget previewd runs with (`PREVIEWD_SCALE_CONTENT_BUDGET`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ContentBudget {
    /// Raised out of the way: every report goes out at once.
    Off,
    /// previewd's own: 70 content-creating requests a minute, 450 an hour.
    Default,
}

fn content_budget() -> ContentBudget {
    match std::env::var("PREVIEWD_SCALE_CONTENT_BUDGET").as_deref() {
        Err(_) | Ok("off") => ContentBudget::Off,
        Ok("default") => ContentBudget::Default,
        Ok(other) => panic!("PREVIEWD_SCALE_CONTENT_BUDGET: `off` or `default`, not {other:?}"),
    }
}

/// A write the API server served that the benchmark counts as waste when nothing changed:
/// one of previewd's shape, apart from (with the default content budget) the status writes that
/// record a report sent while the budget drains.
fn is_waste(request: &Requests, budget: ContentBudget) -> bool {
    let report_record =
        request.resource == "previewenvironments" && request.subresource == "status";
    request.is_previewd_shaped() && !(budget == ContentBudget::Default && report_record)
}

fn sizes() -> Vec<u64> {
    std::env::var("PREVIEWD_SCALE_SIZES")
        .unwrap_or_else(|_| "50,100,200".into())
        .split(',')
        .map(|s| s.trim().parse().expect("PREVIEWD_SCALE_SIZES: numbers"))
        .collect()
}

/// The head SHA of PR `number` after `change` pushes: 40 hex digits that, like real commit SHAs,
/// differ in their first seven (the short SHA the PR comment shows).
fn head(number: u64, change: u64) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{number}/{change}"));
    hex::encode(digest)[..40].to_string()
}

/// When each (PR, head) was first seen `Ready`, from a watch of the environments.
type ReadySeen = Arc<Mutex<HashMap<(u64, String), Instant>>>;

/// When each (PR, head) was first seen as the environment's head (the webhook intake's write
/// of `spec.source.headSha`), from the same watch.
type HeadsSeen = Arc<Mutex<HashMap<(u64, String), Instant>>>;

async fn watch_ready(environments: Api<PreviewEnvironment>, seen: ReadySeen, heads: HeadsSeen) {
    let mut stream = watcher(environments, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(environment) = event else { continue };
        let Some(number) = environment.spec.source.pull_request else {
            continue;
        };
        heads
            .lock()
            .unwrap()
            .entry((number, environment.spec.source.head_sha.clone()))
            .or_insert_with(Instant::now);
        let Some(status) = environment.status else {
            continue;
        };
        if let (Phase::Ready, Some(sha)) = (status.phase, status.deployed_sha) {
            seen.lock()
                .unwrap()
                .entry((number, sha))
                .or_insert_with(Instant::now);
        }
    }
}

/// When the benchmark's watch first saw each Deployment of an environment namespace at a head
/// SHA (its pod template's `previewd.dev/sha`): applied, and rolled out (the controller reports
/// the generation observed, every replica updated and available).
#[derive(Clone, Default)]
struct RolloutSeen {
    applied: HashMap<String, Instant>,
    complete: HashMap<String, Instant>,
}

/// By (environment namespace, head SHA).
type Rollouts = Arc<Mutex<HashMap<(String, String), RolloutSeen>>>;

async fn watch_rollouts(client: Client, seen: Rollouts) {
    let deployments: Api<Deployment> = Api::all(client);
    let config = watcher::Config::default().labels("app.kubernetes.io/managed-by=previewd");
    let mut stream = watcher(deployments, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(deployment) = event else { continue };
        let at = Instant::now();
        let name = deployment.name_any();
        let namespace = deployment.namespace().unwrap_or_default();
        let spec = deployment.spec.as_ref();
        let sha = spec.and_then(|s| {
            s.template
                .metadata
                .as_ref()?
                .annotations
                .as_ref()?
                .get("previewd.dev/sha")
                .cloned()
        });
        let Some(sha) = sha else { continue };
        let wanted = spec.and_then(|s| s.replicas).unwrap_or(1);
        let status = deployment.status.clone().unwrap_or_default();
        let complete = status.observed_generation >= deployment.metadata.generation
            && status.updated_replicas == Some(wanted)
            && status.available_replicas == Some(wanted)
            && status.replicas == Some(wanted);
        let mut seen = seen.lock().unwrap();
        let entry = seen.entry((namespace, sha)).or_default();
        entry.applied.entry(name.clone()).or_insert(at);
        if complete {
            entry.complete.entry(name).or_insert(at);
        }
    }
}

/// push → Ready in four parts, per push that reached Ready: delivery → the new head on the
/// environment (previewd's webhook intake), → objects applied (previewd's controller), →
/// rollout complete (Kubernetes), → status Ready (previewd). `None` for a push whose parts were
/// not all seen (superseded).
fn breakdown(
    pushed: Instant,
    head_seen: Instant,
    ready: Instant,
    rollout: &RolloutSeen,
    deployments: usize,
) -> Option<[Duration; 4]> {
    if rollout.applied.len() < deployments || rollout.complete.len() < deployments {
        return None;
    }
    let applied = *rollout.applied.values().max()?;
    let head_seen = head_seen.min(applied);
    let complete = (*rollout.complete.values().max()?).max(applied);
    let ready = ready.max(complete);
    Some([
        head_seen.checked_duration_since(pushed)?,
        applied - head_seen,
        complete - applied,
        ready - complete,
    ])
}

/// The wall-clock time of `at`, to compare the benchmark's own times with the API server's
/// audit log: `clock` is an `Instant` and the wall-clock time read at the same moment.
fn wall_clock(clock: (Instant, DateTime<Utc>), at: Instant) -> DateTime<Utc> {
    clock.1 + TimeDelta::from_std(at.saturating_duration_since(clock.0)).unwrap_or_default()
}

/// Each push's way to Ready as the API server's audit log shows it (`support::audit`); a push
/// the watches did not see `Ready` at its head is left out, as from the latencies.
fn audited_paths(log: &std::path::Path, churn: &Churn) -> Vec<PushPath> {
    let clock = churn.clock;
    let writes = audit::read(log, clock.1);
    churn
        .pushes
        .iter()
        .filter_map(|(number, sha, sent)| {
            let (environment, objects_namespace) = churn.environments.get(number)?;
            let ready = churn.ready.get(&(*number, sha.clone()))?;
            let rollout = churn
                .rollouts
                .get(&(objects_namespace.clone(), sha.clone()))?;
            if rollout.complete.len() < 2 {
                return None;
            }
            let push = audit::Push {
                environment,
                namespace: churn.namespace,
                objects_namespace,
                sent: wall_clock(clock, *sent),
                rollout_seen: wall_clock(clock, *rollout.complete.values().max()?),
                ready_seen: wall_clock(clock, *ready),
            };
            audit::path_of(&writes, &push)
        })
        .collect()
}

/// What [`audited_paths`] needs to know of a churn: copies of what the watches saw, so that no
/// lock is held while the log is read.
struct Churn<'a> {
    namespace: &'a str,
    /// An `Instant` and the wall-clock time, read together as the churn started.
    clock: (Instant, DateTime<Utc>),
    /// (PR, head, when sent)
    pushes: &'a [(u64, String, Instant)],
    /// By PR: the environment's name and its objects' namespace.
    environments: HashMap<u64, (String, String)>,
    ready: HashMap<(u64, String), Instant>,
    rollouts: HashMap<(String, String), RolloutSeen>,
}

/// p50 and p99 of previewd's own time per push and of the API server's, in words.
fn describe_audited(paths: &[PushPath], pushes: usize) -> String {
    if paths.is_empty() {
        return format!("none of the {pushes} pushes found in the log");
    }
    let column = |pick: &dyn Fn(&PushPath) -> Duration| p50_p99(paths.iter().map(pick), 1);
    format!(
        "previewd's own time (all but the rollout and the API server serving previewd's writes) {}: delivery → the intake's write received {}, its answer → the first object's apply received {}, the rollout's last status write answered → previewd's status write received {}; the API server serving previewd's writes {} ({} of {pushes} pushes)",
        column(&PushPath::previewd),
        column(&|p| p.intake),
        column(&|p| p.deploy),
        column(&|p| p.ready),
        column(&|p| p.served),
        paths.len()
    )
}

/// p50 and p99 of each part of [`breakdown`], and of previewd's share (all but the rollout), in
/// words.
fn describe_breakdown(parts: &[[Duration; 4]]) -> String {
    let column = |pick: &dyn Fn(&[Duration; 4]) -> Duration| p50_p99(parts.iter().map(pick), 0);
    format!(
        "delivery → objects applied {} (delivery → new head on the environment {}, → objects applied {}); applied → rollout complete (Kubernetes) {}; rollout complete → status Ready {}; previewd's share (all but the rollout) {} ({} pushes)",
        column(&|p| p[0] + p[1]),
        column(&|p| p[0]),
        column(&|p| p[1]),
        column(&|p| p[2]),
        column(&|p| p[3]),
        column(&|p| p[0] + p[1] + p[3]),
        parts.len()
    )
}

/// Waits (at most 10 minutes) until every (PR, head) in `expected` has been seen Ready; on
/// timeout prints the environments that are not, and previewd's last log lines, and fails.
async fn wait_all_ready(
    seen: &ReadySeen,
    expected: &[(u64, String)],
    environments: &Api<PreviewEnvironment>,
    previewd: &PreviewdProcess,
    what: &str,
) {
    let deadline = Instant::now()
        + Duration::from_secs(
            std::env::var("PREVIEWD_SCALE_READY_TIMEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(600),
        );
    loop {
        let missing: Vec<(u64, String)> = {
            let seen = seen.lock().unwrap();
            expected
                .iter()
                .filter(|key| !seen.contains_key(*key))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let numbers: HashSet<u64> = missing.iter().map(|(n, _)| *n).collect();
            for environment in environments
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
            {
                if environment
                    .spec
                    .source
                    .pull_request
                    .is_some_and(|n| numbers.contains(&n))
                {
                    eprintln!(
                        "not Ready: {} head {} status {}",
                        environment.name_any(),
                        environment.spec.source.head_sha,
                        serde_json::to_string(&environment.status).unwrap()
                    );
                }
            }
            let lines = previewd.log_lines();
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("previewd: {line}");
            }
            panic!(
                "{} {what} environments not Ready at their head after 10 minutes",
                missing.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// previewd's counters, read from its `/metrics`.
#[derive(Clone, Debug, Default)]
struct Counters {
    /// Write requests by operation (`apply`, `status`, `event`, `intake_apply`, …).
    writes_by_operation: std::collections::BTreeMap<String, f64>,
    writes: f64,
    applies_sent: f64,
    applies_skipped: f64,
    reconciles: f64,
}

impl Counters {
    async fn read(previewd: &PreviewdProcess, http: &reqwest::Client) -> Self {
        let text = previewd
            .metrics_text(http)
            .await
            .expect("previewd answers /metrics");
        let writes_by_operation = text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("previewd_write_requests_total{operation=\"")?;
                let (operation, value) = rest.split_once("\"} ")?;
                Some((operation.to_string(), value.parse().ok()?))
            })
            .collect();
        Self {
            writes_by_operation,
            writes: metric_sum(&text, "previewd_write_requests_total"),
            applies_sent: metric_value(&text, r#"previewd_apply_requests_total{outcome="sent"}"#)
                .unwrap_or(0.0),
            applies_skipped: metric_value(
                &text,
                r#"previewd_apply_requests_total{outcome="skipped"}"#,
            )
            .unwrap_or(0.0),
            reconciles: metric_sum(&text, "previewd_reconcile_duration_seconds_count"),
        }
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            writes_by_operation: self
                .writes_by_operation
                .iter()
                .map(|(operation, value)| {
                    let before = earlier
                        .writes_by_operation
                        .get(operation)
                        .copied()
                        .unwrap_or(0.0);
                    (operation.clone(), value - before)
                })
                .filter(|(_, delta)| *delta > 0.0)
                .collect(),
            writes: self.writes - earlier.writes,
            applies_sent: self.applies_sent - earlier.applies_sent,
            applies_skipped: self.applies_skipped - earlier.applies_skipped,
            reconciles: self.reconciles - earlier.reconciles,
        }
    }

    fn hit_ratio(&self) -> f64 {
        let total = self.applies_sent + self.applies_skipped;
        if total == 0.0 {
            0.0
        } else {
            self.applies_skipped / total
        }
    }
}

/// previewd's `previewd_reconcile_step_seconds`, read from its `/metrics`: per step, the
/// cumulative count at each bucket bound, the sum and the count.
#[derive(Default)]
struct StepTimes {
    /// (step, bound) → reconciles whose step took at most `bound` seconds.
    buckets: std::collections::BTreeMap<(String, String), f64>,
    sums: HashMap<String, f64>,
}

impl StepTimes {
    async fn read(previewd: &PreviewdProcess, http: &reqwest::Client) -> Self {
        let text = previewd
            .metrics_text(http)
            .await
            .expect("previewd answers /metrics");
        let mut times = Self::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("previewd_reconcile_step_seconds") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                let end = labels[start..].find('"')? + start;
                Some(labels[start..end].to_string())
            };
            let Some(step) = label("step") else { continue };
            if labels.starts_with("_bucket") {
                let Some(bound) = label("le") else { continue };
                times.buckets.insert((step, bound), value);
            } else if labels.starts_with("_sum") {
                times.sums.insert(step, value);
            }
        }
        times
    }

    /// Per step, between `earlier` and these: how many, the mean, and the bucket bound the
    /// 99th percentile falls under, in words (steps not taken are left out).
    fn since(&self, earlier: &Self) -> String {
        let mut by_step: std::collections::BTreeMap<&str, Vec<(f64, f64)>> = Default::default();
        for ((step, bound), count) in &self.buckets {
            let before = earlier.buckets.get(&(step.clone(), bound.clone()));
            let Ok(bound) = bound.parse::<f64>() else {
                continue;
            };
            by_step
                .entry(step.as_str())
                .or_default()
                .push((bound, count - before.copied().unwrap_or(0.0)));
        }
        let mut words = Vec::new();
        for step in previewd::reconcile::metrics::STEPS {
            let Some(buckets) = by_step.get_mut(step) else {
                continue;
            };
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = buckets.last().map_or(0.0, |(_, c)| *c);
            if count < 1.0 {
                continue;
            }
            let sum = self.sums.get(step).copied().unwrap_or(0.0)
                - earlier.sums.get(step).copied().unwrap_or(0.0);
            let p99 = buckets
                .iter()
                .find(|(_, c)| *c >= count * 0.99)
                .map_or(f64::INFINITY, |(bound, _)| *bound);
            words.push(format!(
                "{step} {count:.0}× mean {:.1} ms, p99 ≤ {:.1} ms",
                sum / count * 1000.0,
                p99 * 1000.0
            ));
        }
        words.join("; ")
    }
}

/// The API server's mean time for each write on a push's way to Ready, in words: the intake's
/// apply of the environment, the applies of the changed objects, the status write.
fn path_seconds(now: &RequestSeconds, before: &RequestSeconds) -> String {
    let path = [
        ("APPLY", "previewenvironments", "the intake's apply"),
        ("APPLY", "configmaps", "apply of a ConfigMap"),
        ("APPLY", "deployments", "apply of a Deployment"),
        ("PATCH", "previewenvironments/status", "the status write"),
    ];
    path.iter()
        .filter_map(|(verb, resource, what)| {
            let (mean, served) = now.mean_ms_since(before, verb, resource)?;
            Some(format!(
                "{what} ({verb} {resource}) {mean:.1} ms ({served:.0})"
            ))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A process's resident memory (now and peak, MiB), CPU seconds (user + system) and open
/// sockets (each API server connection is one, and costs memory on both ends), from /proc.
#[derive(Clone, Copy, Debug)]
struct ProcessUsage {
    rss_mib: f64,
    peak_rss_mib: f64,
    cpu_seconds: f64,
    sockets: usize,
}

fn process_usage(pid: u32) -> ProcessUsage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which may hold spaces) start at field 3; utime and stime
    // are fields 14 and 15.
    let after_name: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 =
        after_name[11].parse::<f64>().unwrap() + after_name[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ProcessUsage {
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
        cpu_seconds: ticks / ticks_per_second,
        sockets: open_sockets(pid),
    }
}

fn open_sockets(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Waits until previewd has sent no write for 6 s (at most 3 minutes): the steady state.
async fn settle(previewd: &PreviewdProcess, http: &reqwest::Client) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = Counters::read(previewd, http).await.writes;
    let mut quiet_polls = 0;
    while quiet_polls < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = Counters::read(previewd, http).await.writes;
        quiet_polls = if now == last { quiet_polls + 1 } else { 0 };
        last = now;
    }
}

/// Every object of the kinds the app renders, keyed by (kind, namespace, name), with its
/// resourceVersion; plus the PreviewEnvironments themselves.
async fn object_versions(
    client: &Client,
    namespace: &str,
) -> HashMap<(String, String, String), String> {
    let resources = [
        ApiResource::erase::<ServiceAccount>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Secret>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<Role>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<Ingress>(&()),
    ];
    let mut versions = HashMap::new();
    for resource in &resources {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        for object in api.list(&ListParams::default()).await.expect("list").items {
            versions.insert(
                (
                    resource.kind.clone(),
                    object.namespace().unwrap_or_default(),
                    object.name_any(),
                ),
                object.resource_version().unwrap_or_default(),
            );
        }
    }
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    for environment in environments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        versions.insert(
            (
                "PreviewEnvironment".into(),
                namespace.to_string(),
                environment.name_any(),
            ),
            environment.resource_version().unwrap_or_default(),
        );
    }
    versions
}

/// Which PR each environment namespace (and each PreviewEnvironment name) belongs to.
async fn owners(environments: &Api<PreviewEnvironment>) -> HashMap<String, u64> {
    let mut owners = HashMap::new();
    for environment in environments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let Some(number) = environment.spec.source.pull_request else {
            continue;
        };
        if let Some(namespace) = environment
            .status
            .as_ref()
            .and_then(|s| s.namespace.clone())
        {
            owners.insert(namespace, number);
        }
        owners.insert(environment.name_any(), number);
    }
    owners
}

/// Objects whose resourceVersion changed between `before` and `after` (or that appeared or
/// disappeared), in environments of PRs not in `touched`.
fn changed_outside(
    before: &HashMap<(String, String, String), String>,
    after: &HashMap<(String, String, String), String>,
    owners: &HashMap<String, u64>,
    bench_namespace: &str,
    touched: &HashSet<u64>,
    budget: ContentBudget,
) -> Vec<String> {
    // With previewd's own content budget, reports drain for minutes after the environments
    // were opened, and each one sent is recorded in its environment's status: a
    // PreviewEnvironment's version moves then. Its writes are counted apart (status writes, no
    // more than the content-creating requests sent; any other write of it is still waste by
    // the API server's count); the objects in its namespace are still compared here.
    let records_reports = budget == ContentBudget::Default;
    let owner = |(kind, namespace, name): &(String, String, String)| -> Option<u64> {
        if kind == "PreviewEnvironment" && namespace == bench_namespace {
            owners.get(name).copied()
        } else {
            owners.get(namespace).copied()
        }
    };
    let keys: HashSet<_> = before.keys().chain(after.keys()).collect();
    let mut changed: Vec<String> = keys
        .into_iter()
        .filter(|key| owner(key).is_some_and(|pr| !touched.contains(&pr)))
        .filter(|(kind, _, _)| !(records_reports && kind == "PreviewEnvironment"))
        .filter(|key| before.get(*key) != after.get(*key))
        .map(|(kind, namespace, name)| format!("{kind} {namespace}/{name}"))
        .collect();
    changed.sort();
    changed
}

/// "p50 … ms, p99 … ms" of `values`, in milliseconds with `decimals` places.
fn p50_p99(values: impl Iterator<Item = Duration>, decimals: usize) -> String {
    let mut values: Vec<Duration> = values.collect();
    values.sort();
    let ms = |p: f64| percentile(&values, p).as_secs_f64() * 1000.0;
    format!(
        "p50 {:.decimals$} ms, p99 {:.decimals$} ms",
        ms(0.50),
        ms(0.99)
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// A small deterministic generator (the run repeats; no dependency needed).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// One line of the closing table.
struct StageFigures {
    environments: u64,
    new: u64,
    all_ready: Duration,
    steady_writes_per_minute: f64,
    /// Writes of previewd's shape the API server served in the quiet window (see `Requests::is_previewd_shaped`).
    apiserver_quiet_writes: u64,
    steady_reconciles: f64,
    pushes: usize,
    latency_p50: Duration,
    latency_p99: Duration,
    churn_writes_per_minute: f64,
    writes_per_push: f64,
    untouched_changed: usize,
    hit_ratio: f64,
    usage: ProcessUsage,
    cpu_seconds: f64,
}

/// How many requests the stand-in forge has received so far (wiremock keeps them in order).
async fn forge_requests_so_far(forge: &wiremock::MockServer) -> usize {
    forge.received_requests().await.unwrap_or_default().len()
}

/// The forge requests received after the first `from`: how many, and per push by method and
/// path shape (numbers and commit SHAs as `*`), e.g. `POST /repos/*/*/statuses/* 1.00`.
/// The content-creating requests (comments, deployments, statuses: every POST and PATCH) the
/// stand-in forge received after the first `from`.
async fn content_requests_since(forge: &wiremock::MockServer, from: usize) -> usize {
    let received = forge.received_requests().await.unwrap_or_default();
    let creating = |r: &&wiremock::Request| {
        matches!(
            r.method,
            wiremock::http::Method::POST | wiremock::http::Method::PATCH
        )
    };
    received.iter().skip(from).filter(creating).count()
}

async fn forge_requests_since(
    forge: &wiremock::MockServer,
    from: usize,
    pushes: usize,
) -> (usize, String) {
    let received = forge.received_requests().await.unwrap_or_default();
    let mut by_shape: std::collections::BTreeMap<String, usize> = Default::default();
    for request in received.iter().skip(from) {
        let path = request.url.path();
        // `/repos/{owner}/{name}/…`: the repository's name is not part of the shape.
        let in_repository = path.starts_with("/repos/");
        let shape: Vec<&str> = path
            .split('/')
            .enumerate()
            .map(|(i, part)| {
                let variable = !part.is_empty() && part.chars().all(|c| c.is_ascii_hexdigit());
                match variable || in_repository && (i == 2 || i == 3) {
                    true => "*",
                    false => part,
                }
            })
            .collect();
        *by_shape
            .entry(format!("{} {}", request.method, shape.join("/")))
            .or_default() += 1;
    }
    let total = received.len().saturating_sub(from);
    let shapes: Vec<String> = by_shape
        .iter()
        .map(|(shape, n)| format!("{shape} {:.2}", *n as f64 / pushes.max(1) as f64))
        .collect();
    (total, shapes.join(", "))
}

fn is_heartbeat(requests: &Requests) -> bool {
    requests.is_heartbeat()
}

/// The API server's writes per push, by verb and resource, heartbeats left out.
fn per_push(served: &RequestCounts, pushes: usize) -> String {
    served
        .0
        .iter()
        .filter(|(r, _)| r.is_write() && !is_heartbeat(r))
        .map(|(r, n)| {
            let subresource = if r.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", r.subresource)
            };
            format!(
                "{} {}{subresource} {:.2}",
                r.verb,
                r.resource,
                *n as f64 / pushes.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes to previewd's leader Lease seen by a watch (each renewal changes it), counted into
/// `LEASE_WRITES` until the task is aborted.
static LEASE_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn count_lease_writes(client: Client, namespace: String) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields("metadata.name=previewd-leader");
    let mut events = std::pin::pin!(watcher(leases, config));
    let mut seen_version: Option<String> = None;
    while let Some(event) = events.next().await {
        if let Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event {
            let version = lease.resource_version();
            if seen_version.is_some() && seen_version != version {
                LEASE_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            seen_version = version;
        }
    }
}

/// What replacing previewd cost: the API server's writes of previewd's shape after a
/// SIGKILL-and-restart and after a failover to a standby, and the process now leading.
struct Replacements {
    writes: [u64; 2],
    successor: PreviewdProcess,
}

/// 4. A new previewd starts with an empty apply cache, twice: the leader is SIGKILLed and
///    started again (a crash, a node drained), then a standby replica is started beside it and
///    the leader SIGKILLed again (a failover). Each successor must reconcile every environment
///    and, since nothing changed, write nothing; counted by the API server.
async fn replace_previewd(
    leader: PreviewdProcess,
    start: &impl Fn(&str) -> PreviewdProcess,
    client: &Client,
    http: &reqwest::Client,
    environments: u64,
    budget: ContentBudget,
) -> Replacements {
    let mut writes = [0; 2];
    let mut leader = leader;
    for (round, how) in ["SIGKILL and restart", "failover to a standby"]
        .iter()
        .enumerate()
    {
        let standby = (round == 1).then(|| start("previewd-standby"));
        if let Some(standby) = &standby {
            standby.wait_ready(http).await;
        }
        let served_before = apiserver::request_counts(client).await;
        let killed_at = Instant::now();
        drop(leader); // SIGKILL: no hand-over, the Lease runs out.
        let successor = standby.unwrap_or_else(|| start("previewd-restarted"));
        successor.wait_ready(http).await;
        let reconciled = wait_reconciled(&successor, http, environments).await;
        settle(&successor, http).await;
        let own = Counters::read(&successor, http).await;
        let served = apiserver::request_counts(client)
            .await
            .since(&served_before);
        writes[round] = served.writes(|r| is_waste(r, budget));
        // Its peak: every environment reconciled at once after a start is previewd's busiest
        // moment.
        let usage = process_usage(successor.child.id());
        println!(
            "  {environments} environments, {how}: every environment reconciled {:.1} s after the SIGKILL; the API server served {} writes of previewd's shape ({} in all apart from Leases and node status); previewd counted {} writes, {} applies sent, {} skipped; its RSS {:.1} MiB (peak {:.1} MiB)",
            reconciled.duration_since(killed_at).as_secs_f64(),
            writes[round],
            served.writes(|r| !is_heartbeat(r)),
            own.writes.abs(), // an empty f64 sum is -0
            own.applies_sent,
            own.applies_skipped,
            usage.rss_mib,
            usage.peak_rss_mib,
        );
        leader = successor;
    }
    Replacements {
        writes,
        successor: leader,
    }
}

/// Waits until `previewd` has reconciled at least `environments` times (each environment once:
/// a new leader starts with every environment queued); when it had.
async fn wait_reconciled(
    previewd: &PreviewdProcess,
    http: &reqwest::Client,
    environments: u64,
) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let reconciles = Counters::read(previewd, http).await.reconciles;
        if reconciles >= environments as f64 {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{} reconciled {reconciles} of {environments} environments in 5 minutes",
            previewd.name
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn benchmark() {
    let budget = content_budget();
    let churn_seconds: u64 = support::setting("PREVIEWD_SCALE_CHURN_SECONDS", 120);
    let quiet_seconds: u64 = support::setting("PREVIEWD_SCALE_QUIET_SECONDS", 60);
    let client = support::client().await;
    let namespace = support::create_namespace(&client, "bench-scale").await;
    let forge = github_forge().await;
    install_template_with(
        &client,
        &namespace,
        "github",
        REPOSITORY,
        Some(&forge.uri()),
        // The URL the app's Ingress serves (the content policy keeps Ingress hosts in it).
        serde_json::json!({"url": {"host": "{{ slug }}.preview.example.com"}}),
        APP,
    )
    .await;
    let logs = tempfile::tempdir().unwrap();
    // The stand-in GitHub has no limits, and this benchmark measures the cluster side: opening
    // 200 pull requests at GitHub's pace would take three hours, and reports let through later
    // would write statuses in the quiet window. The content budget has its own benchmark
    // (tests/benches/forge_budget.rs); `PREVIEWD_SCALE_CONTENT_BUDGET=default` keeps it here.
    let unbounded = [
        "--forge-content-per-minute",
        "1000000",
        "--forge-content-per-hour",
        "1000000",
    ];
    let budget_flags: &[&str] = match budget {
        ContentBudget::Off => &unbounded,
        ContentBudget::Default => &[],
    };
    let start = |name: &str| {
        let mut flags = vec![
            "--watch-namespace",
            &namespace,
            "--resync-interval",
            RESYNC,
            // The stand-in forge lists no pull requests; the sweep must not run mid-benchmark.
            "--sweep-interval",
            "24h",
            // The leader Lease beside the environments, where the benchmark counts its renewals.
            "--lease-namespace",
            &namespace,
        ];
        flags.extend_from_slice(budget_flags);
        PreviewdProcess::start(
            name,
            &support::shared().kubeconfig_path,
            &flags,
            &[],
            logs.path(),
        )
    };
    let previewd = start("previewd");
    let http = reqwest::Client::new();
    previewd.wait_ready(&http).await;
    let pid = previewd.child.id();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    let seen: ReadySeen = Arc::default();
    let heads: HeadsSeen = Arc::default();
    let watch = tokio::spawn(watch_ready(
        environments.clone(),
        seen.clone(),
        heads.clone(),
    ));
    let rollouts: Rollouts = Arc::default();
    let rollout_watch = tokio::spawn(watch_rollouts(client.clone(), rollouts.clone()));

    println!(
        "scale: previewd pid {pid}, 10-object app, resync {RESYNC}, churn {churn_seconds} s at 1 push/s, quiet window {quiet_seconds} s, content budget {budget:?}"
    );
    let mut changes: HashMap<u64, u64> = HashMap::new();
    let mut rng = Lcg(0x5eed);
    let mut figures = Vec::new();
    let mut opened = 0u64;
    let mut cpu_before = process_usage(pid).cpu_seconds;
    for size in sizes() {
        // 1. Open PRs opened+1..=size; time until all of them are Ready.
        let started = Instant::now();
        let opened_at = Utc::now() - TimeDelta::hours(1);
        futures::stream::iter(opened + 1..=size)
            .map(|number| {
                let body = pull_request_change(number, 0, &head(number, 0), opened_at);
                let (previewd, http) = (&previewd, &http);
                async move {
                    previewd
                        .send(http, "pull_request", &format!("open-{number}"), &body)
                        .await
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<()>>()
            .await;
        let new = size - opened;
        changes.extend((opened + 1..=size).map(|n| (n, 0)));
        opened = size;
        let expected: Vec<(u64, String)> = changes.iter().map(|(&n, &c)| (n, head(n, c))).collect();
        wait_all_ready(&seen, &expected, &environments, &previewd, "opened").await;
        let all_ready = started.elapsed();
        println!(
            "  {size} environments: the {new} new ones all Ready {:.1} s after the first delivery",
            all_ready.as_secs_f64()
        );

        // 2. Quiet window: nothing changes; every write is waste.
        settle(&previewd, &http).await;
        let owner_map = owners(&environments).await;
        let quiet_start = Counters::read(&previewd, &http).await;
        let versions_before_quiet = object_versions(&client, &namespace).await;
        let served_before_quiet = apiserver::request_counts(&client).await;
        let forge_before_quiet = forge_requests_so_far(&forge).await;
        let renewals = tokio::spawn(count_lease_writes(client.clone(), namespace.clone()));
        tokio::time::sleep(Duration::from_secs(quiet_seconds)).await;
        renewals.abort();
        let served_in_quiet = apiserver::request_counts(&client)
            .await
            .since(&served_before_quiet);
        let previewd_lease_writes = LEASE_WRITES.load(std::sync::atomic::Ordering::Relaxed);
        LEASE_WRITES.store(0, std::sync::atomic::Ordering::Relaxed);
        let quiet = Counters::read(&previewd, &http).await.since(quiet_start);
        let versions_after_quiet = object_versions(&client, &namespace).await;
        let changed_in_quiet = changed_outside(
            &versions_before_quiet,
            &versions_after_quiet,
            &owner_map,
            &namespace,
            &HashSet::new(),
            budget,
        );
        let (forge_in_quiet, _) = forge_requests_since(&forge, forge_before_quiet, 1).await;
        println!("  {size} environments, quiet {quiet_seconds} s: {forge_in_quiet} forge requests");
        let report_records = match budget {
            ContentBudget::Off => 0.0,
            ContentBudget::Default => quiet
                .writes_by_operation
                .get("status")
                .copied()
                .unwrap_or(0.0),
        };
        if budget == ContentBudget::Default {
            let content = content_requests_since(&forge, forge_before_quiet).await;
            println!(
                "  {size} environments, quiet {quiet_seconds} s, reports draining within the content budget: {content} content-creating forge requests sent, {report_records} status writes recording them"
            );
            assert!(
                report_records <= content as f64,
                "{report_records} status writes in the quiet window for {content} content-creating requests sent: status written without a report"
            );
        }
        let steady_writes_per_minute =
            (quiet.writes - report_records) * 60.0 / quiet_seconds as f64;
        println!(
            "  {size} environments, quiet {quiet_seconds} s: {} reconciles (resyncs), {} writes, {} applies skipped by the cache, {} objects changed",
            quiet.reconciles,
            quiet.writes,
            quiet.applies_skipped,
            changed_in_quiet.len()
        );

        // Asserted on the writes of previewd's shape (PATCH/APPLY, PreviewEnvironments); all
        // the others (the controller manager's) are printed beside them.
        let apiserver_quiet_writes = served_in_quiet.writes(|r| is_waste(r, budget));
        println!(
            "  {size} environments, quiet {quiet_seconds} s, counted by the API server: {apiserver_quiet_writes} writes of previewd's shape, {} writes in all apart from Leases and node status ({}); Lease writes {} in all, of which previewd's own Lease {previewd_lease_writes} ({:.1}/min)",
            served_in_quiet.writes(|r| !is_heartbeat(r)),
            served_in_quiet
                .0
                .iter()
                .filter(|(r, _)| r.is_write() && !is_heartbeat(r))
                .map(|(r, n)| format!("{} {}: {n}", r.verb, r.resource))
                .collect::<Vec<_>>()
                .join(", "),
            served_in_quiet.writes(|r| r.resource == "leases"),
            previewd_lease_writes as f64 * 60.0 / quiet_seconds as f64,
        );

        // 3. Churn: one push a second to a random environment.
        let served_before_churn = apiserver::request_counts(&client).await;
        let seconds_before_churn = RequestSeconds::read(&client).await;
        let forge_before_churn = forge_requests_so_far(&forge).await;
        let churn_start = Counters::read(&previewd, &http).await;
        let steps_before_churn = StepTimes::read(&previewd, &http).await;
        let versions_before_churn = versions_after_quiet;
        let churn_started = Instant::now();
        let churn_clock = (churn_started, Utc::now());
        let mut pushes: Vec<(u64, String, Instant)> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for second in 0..churn_seconds {
            tick.tick().await;
            let number = 1 + rng.below(size);
            let change = changes.get_mut(&number).unwrap();
            *change += 1;
            let sha = head(number, *change);
            let body = pull_request_change(number, *change, &sha, Utc::now());
            let sent = Instant::now();
            previewd
                .send(
                    &http,
                    "pull_request",
                    &format!("push-{size}-{second}"),
                    &body,
                )
                .await;
            pushes.push((number, sha, sent));
        }
        let last_heads: Vec<(u64, String)> =
            changes.iter().map(|(&n, &c)| (n, head(n, c))).collect();
        wait_all_ready(&seen, &last_heads, &environments, &previewd, "pushed").await;
        settle(&previewd, &http).await;
        let churn_elapsed = churn_started.elapsed();
        let churn = Counters::read(&previewd, &http).await.since(churn_start);
        let steps_in_churn = StepTimes::read(&previewd, &http)
            .await
            .since(&steps_before_churn);
        let served_in_churn = apiserver::request_counts(&client)
            .await
            .since(&served_before_churn);
        let seconds_in_churn = RequestSeconds::read(&client).await;
        let versions_after_churn = object_versions(&client, &namespace).await;
        let (forge_in_churn, forge_per_push) =
            forge_requests_since(&forge, forge_before_churn, pushes.len()).await;
        let touched: HashSet<u64> = pushes.iter().map(|(n, _, _)| *n).collect();
        let untouched_changed = changed_outside(
            &versions_before_churn,
            &versions_after_churn,
            &owner_map,
            &namespace,
            &touched,
            budget,
        );
        let mut latencies: Vec<Duration> = {
            let seen = seen.lock().unwrap();
            pushes
                .iter()
                .filter_map(|(n, sha, sent)| {
                    Some(seen.get(&(*n, sha.clone()))?.duration_since(*sent))
                })
                .collect()
        };
        latencies.sort();
        let superseded = pushes.len() - latencies.len();
        let by_number: HashMap<u64, (String, String)> = environments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| {
                let name = e.name_any();
                Some((e.spec.source.pull_request?, (name, e.status?.namespace?)))
            })
            .collect();
        let namespaces: HashMap<u64, String> = by_number
            .iter()
            .map(|(n, (_, objects))| (*n, objects.clone()))
            .collect();
        let parts: Vec<[Duration; 4]> = {
            let (seen, rollouts) = (seen.lock().unwrap(), rollouts.lock().unwrap());
            let heads = heads.lock().unwrap();
            pushes
                .iter()
                .filter_map(|(n, sha, sent)| {
                    let key = (*n, sha.clone());
                    let (ready, head_seen) = (*seen.get(&key)?, *heads.get(&key)?);
                    let rollout = rollouts.get(&(namespaces.get(n)?.clone(), sha.clone()))?;
                    breakdown(*sent, head_seen, ready, rollout, 2)
                })
                .collect()
        };
        let usage = process_usage(pid);
        let cpu_seconds = usage.cpu_seconds - cpu_before;
        cpu_before = usage.cpu_seconds;
        let stage = StageFigures {
            environments: size,
            new,
            all_ready,
            steady_writes_per_minute,
            steady_reconciles: quiet.reconciles,
            pushes: pushes.len(),
            latency_p50: percentile(&latencies, 0.50),
            latency_p99: percentile(&latencies, 0.99),
            churn_writes_per_minute: churn.writes * 60.0 / churn_elapsed.as_secs_f64(),
            writes_per_push: churn.writes / pushes.len().max(1) as f64,
            untouched_changed: untouched_changed.len() + changed_in_quiet.len(),
            apiserver_quiet_writes,
            hit_ratio: churn.hit_ratio(),
            usage,
            cpu_seconds,
        };
        println!(
            "  {size} environments, churn: {} pushes to {} environments ({superseded} superseded by a newer push before Ready), push → Ready p50 {:.2} s, p99 {:.2} s; {} writes ({:.1} per push), {} applies sent, {} skipped (hit ratio {:.1}%); objects changed in environments not pushed: {}",
            stage.pushes,
            touched.len(),
            stage.latency_p50.as_secs_f64(),
            stage.latency_p99.as_secs_f64(),
            churn.writes,
            stage.writes_per_push,
            churn.applies_sent,
            churn.applies_skipped,
            stage.hit_ratio * 100.0,
            untouched_changed.len()
        );
        println!(
            "  {size} environments, push → Ready in parts (times at which the benchmark's own watches saw each step): {}",
            describe_breakdown(&parts)
        );
        if let Some(log) = &support::shared().audit_log {
            let churn = Churn {
                namespace: &namespace,
                clock: churn_clock,
                pushes: &pushes,
                environments: by_number,
                ready: seen.lock().unwrap().clone(),
                rollouts: rollouts.lock().unwrap().clone(),
            };
            // Tens of megabytes at 1,000 environments: off the runtime's scheduling.
            let paths = tokio::task::block_in_place(|| audited_paths(log, &churn));
            println!(
                "  {size} environments, push → Ready by the API server's audit log (when it received and answered each write): {}",
                describe_audited(&paths, pushes.len())
            );
        }
        println!(
            "  {size} environments, churn, every reconcile's steps as previewd timed them (previewd_reconcile_step_seconds): {steps_in_churn}"
        );
        println!(
            "  {size} environments, churn, the API server's own time per request of previewd's writes on the way to Ready (apiserver_request_duration_seconds, mean): {}",
            path_seconds(&seconds_in_churn, &seconds_before_churn)
        );
        let by_operation: Vec<String> = churn
            .writes_by_operation
            .iter()
            .map(|(operation, count)| {
                format!("{operation} {:.1}", count / pushes.len().max(1) as f64)
            })
            .collect();
        println!(
            "  {size} environments, churn writes per push by operation: {}",
            by_operation.join(", ")
        );
        println!(
            "  {size} environments, churn, the API server's writes per push by verb and resource (every client: previewd, the controller manager, the scheduler, the node simulator; Leases and node status left out): {}",
            per_push(&served_in_churn, pushes.len())
        );
        println!(
            "  {size} environments, churn: {forge_in_churn} forge requests, {:.2} per push ({forge_per_push})",
            forge_in_churn as f64 / pushes.len().max(1) as f64
        );
        println!(
            "  {size} environments: previewd RSS {:.1} MiB (peak {:.1} MiB), {} open sockets, {:.1} CPU s in this stage",
            usage.rss_mib, usage.peak_rss_mib, usage.sockets, cpu_seconds
        );
        // At most 32 API requests in flight (--api-concurrency), the watches, the Lease, the
        // forge stand-in and the benchmark's deliveries: about 60. Without the bound previewd
        // held 1,135 connections to the API server at 400 environments.
        assert!(
            usage.sockets <= 100,
            "previewd holds {} sockets at {size} environments: is the API client unbounded again?",
            usage.sockets
        );
        for object in changed_in_quiet.iter().chain(&untouched_changed).take(10) {
            println!("    changed without a push: {object}");
        }
        figures.push(stage);
    }

    let replacements = replace_previewd(previewd, &start, &client, &http, opened, budget).await;
    let previewd = replacements.successor;

    println!();
    println!(
        "  envs | new: all Ready | push→Ready p50 | p99    | writes/min churn | per push | writes/min steady | untouched changed | cache hits | RSS MiB (peak) | CPU s"
    );
    for f in &figures {
        println!(
            "  {:>4} | {:>4}: {:>6.1} s | {:>12.2} s | {:>4.2} s | {:>16.1} | {:>8.1} | {:>17.1} | {:>17} | {:>9.1}% | {:>5.1} ({:>5.1}) | {:>5.1}",
            f.environments,
            f.new,
            f.all_ready.as_secs_f64(),
            f.latency_p50.as_secs_f64(),
            f.latency_p99.as_secs_f64(),
            f.churn_writes_per_minute,
            f.writes_per_push,
            f.steady_writes_per_minute,
            f.untouched_changed,
            f.hit_ratio * 100.0,
            f.usage.rss_mib,
            f.usage.peak_rss_mib,
            f.cpu_seconds
        );
    }
    if let Some(pid) = support::shared().apiserver_pid {
        let apiserver = process_usage(pid);
        println!(
            "  (kube-apiserver for comparison: RSS {:.0} MiB, {:.0} CPU s since it started)",
            apiserver.rss_mib, apiserver.cpu_seconds
        );
    }
    println!(
        "  (steady-state resyncs: {} reconciles in the last quiet window, all without a write)",
        figures.last().map_or(0.0, |f| f.steady_reconciles)
    );

    // Tear down through previewd, as a user closing every PR would: delete the environments and
    // wait for previewd's finalizer to remove their namespaces.
    let started = Instant::now();
    let _ = environments
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let removed = tokio::time::timeout(Duration::from_secs(300), async {
        while !environments
            .list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    match removed {
        Ok(()) => println!(
            "  deleting {opened} environments: {:.1} s until previewd had removed every one",
            started.elapsed().as_secs_f64()
        ),
        Err(_) => println!("  deleting {opened} environments: not finished after 300 s"),
    }
    watch.abort();
    rollout_watch.abort();
    drop(previewd);
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await;

    assert!(
        replacements.writes == [0, 0],
        "a new previewd rewrote unchanged environments: {:?} writes of previewd's shape after a restart and after a failover",
        replacements.writes
    );
    let wasted: usize = figures.iter().map(|f| f.untouched_changed).sum();
    let steady_writes: f64 = figures.iter().map(|f| f.steady_writes_per_minute).sum();
    let served_quiet: u64 = figures.iter().map(|f| f.apiserver_quiet_writes).sum();
    assert!(
        wasted == 0 && steady_writes == 0.0 && served_quiet == 0,
        "previewd wrote for environments that did not change: {wasted} objects changed, {steady_writes} writes/min at steady state by previewd's count, {served_quiet} by the API server's"
    );
}
