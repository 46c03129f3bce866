//! Benchmark: one sweep over 500 environments in 5 repositories, against the real control
//! plane, with the GitHub API and then the GitLab API served by wiremock in the shapes each
//! documents (GitHub: `Link` pages and ETags; GitLab: offset pages of 100 with its `x-page`
//! headers, no ETags).
//!
//! `cargo bench --bench sweep`. Per repository: 100 environments (PRs 1–100), and an open-PR
//! list of 251 (PRs 1–90 and 161 others without an environment: 3 pages of 100). PRs 91–100 were closed with their
//! webhook missed; PRs ending in 5 below 91 have been idle for 100 h against a 72 h timeout.
//! The sweep must delete exactly those 95 environments and ask the forge at most once per
//! repository, list and page (it asserts that, counting what wiremock received), then prints
//! its duration. The clock is injected: nothing waits for hours to pass.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{TimeDelta, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use previewd::cluster::caches::Caches;
use previewd::cluster::secrets::SecretReader;
use previewd::forge::template_client::TemplateClients;
use previewd::lifecycle::rules::Reason;
use previewd::lifecycle::sweeper::Sweeper;
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};
use previewd::runtime::metrics::Metrics;
use serde_json::{Value, json};
use wiremock::matchers::{method, path_regex, query_param};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const REPOSITORIES: usize = 5;
const ENVIRONMENTS_PER_REPOSITORY: u64 = 100;

fn main() {
    support::run_benchmark(async {
        benchmark(Forge::Github).await;
        benchmark(Forge::Gitlab).await;
    });
}

#[derive(Clone, Copy)]
enum Forge {
    Github,
    Gitlab,
}

impl Forge {
    fn kind(self) -> &'static str {
        match self {
            Forge::Github => "github",
            Forge::Gitlab => "gitlab",
        }
    }

    /// The open-request list and the branches of every `org/repo-N`, as this forge serves them.
    async fn serve(self) -> MockServer {
        let server = MockServer::start().await;
        match self {
            Forge::Github => mount_github(&server).await,
            Forge::Gitlab => mount_gitlab(&server).await,
        }
        server
    }
}

/// Open PRs of every repository: 1–90 and 340–500 (251 in all), served 100 per page.
fn open_pull_requests() -> Vec<Value> {
    (1..=90u64)
        .chain(340..=500)
        .map(|n| json!({"number": n}))
        .collect()
}

/// The `page` query parameter (1 when absent).
fn page_of(request: &Request) -> usize {
    request
        .url
        .query_pairs()
        .find(|(k, _)| k == "page")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(1)
}

async fn mount_github(server: &MockServer) {
    let open = open_pull_requests();
    Mock::given(method("GET"))
        .and(path_regex(r"^/repos/org/repo-\d/pulls$"))
        .respond_with(move |request: &Request| {
            let page = page_of(request);
            let etag = format!("\"pulls-page-{page}\"");
            if request
                .headers
                .get("if-none-match")
                .is_some_and(|v| v.as_bytes() == etag.as_bytes())
            {
                return ResponseTemplate::new(304).insert_header("etag", etag.as_str());
            }
            let items: Vec<Value> = open
                .iter()
                .skip((page - 1) * 100)
                .take(100)
                .cloned()
                .collect();
            ResponseTemplate::new(200)
                .set_body_json(items)
                .insert_header("etag", etag.as_str())
        })
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(r"^/repos/org/repo-\d/branches$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "main"}])))
        .mount(server)
        .await;
}

/// GitLab's offset pagination: `per_page` 100, and the headers GitLab sends with each page.
async fn mount_gitlab(server: &MockServer) {
    let open: Vec<Value> = open_pull_requests()
        .into_iter()
        .map(|pr| json!({"iid": pr["number"], "state": "opened"}))
        .collect();
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/api/v4/projects/org%2Frepo-\d/merge_requests$",
        ))
        .and(query_param("state", "opened"))
        .respond_with(move |request: &Request| {
            let page = page_of(request);
            let items: Vec<Value> = open
                .iter()
                .skip((page - 1) * 100)
                .take(100)
                .cloned()
                .collect();
            let pages = open.len().div_ceil(100);
            let next = if page < pages {
                (page + 1).to_string()
            } else {
                String::new()
            };
            ResponseTemplate::new(200)
                .set_body_json(items)
                .insert_header("x-page", page.to_string().as_str())
                .insert_header("x-per-page", "100")
                .insert_header("x-total", open.len().to_string().as_str())
                .insert_header("x-total-pages", pages.to_string().as_str())
                .insert_header("x-next-page", next.as_str())
        })
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/api/v4/projects/org%2Frepo-\d/repository/branches$",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "main"}])))
        .mount(server)
        .await;
}

async fn benchmark(kind: Forge) {
    println!("{}:", kind.kind());
    let client = support::client().await;
    let namespace =
        support::create_namespace(&client, &format!("bench-sweep-{}", kind.kind())).await;
    let forge = kind.serve().await;
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "forge"}, "stringData": {"token": "t"}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &namespace);
    for repository in 0..REPOSITORIES {
        let template: PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": format!("app-{repository}")},
            "spec": {"forge": {"kind": kind.kind(), "repository": format!("org/repo-{repository}"),
                               "apiUrl": forge.uri(), "tokenSecretRef": {"name": "forge", "key": "token"}},
                     "lifecycle": {"idleTimeout": "72h"},
                     "manifests": {"inline": [{"name": "a.yaml", "template": "kind: ConfigMap"}]}}
        }))
        .unwrap();
        templates
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
    }
    let now = Utc::now() + TimeDelta::minutes(10);
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    let created = Instant::now();
    let specs: Vec<(usize, u64)> = (0..REPOSITORIES)
        .flat_map(|r| (1..=ENVIRONMENTS_PER_REPOSITORY).map(move |n| (r, n)))
        .collect();
    futures::stream::iter(specs)
        .map(|(repository, number)| {
            let environments = environments.clone();
            let idle_hours = if number % 10 == 5 { 100 } else { 1 };
            let environment: PreviewEnvironment = serde_json::from_value(json!({
                "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
                "metadata": {"name": format!("app-{repository}-pr-{number}")},
                "spec": {"template": format!("app-{repository}"),
                         "source": {"repository": format!("org/repo-{repository}"), "branch": format!("pr-{number}"),
                                    "pullRequest": number, "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821"},
                         "lastActivity": (now - TimeDelta::hours(idle_hours)).to_rfc3339()}
            }))
            .unwrap();
            async move {
                environments
                    .create(&PostParams::default(), &environment)
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    println!(
        "  created {} environments in {:.1} s",
        REPOSITORIES as u64 * ENVIRONMENTS_PER_REPOSITORY,
        created.elapsed().as_secs_f64()
    );

    // The sweep reads the same caches the controller keeps (no controller runs here, so the
    // environments have no finalizer and go at once).
    let (template_store, template_writer) = reflector::store();
    let (environment_store, environment_writer) = reflector::store();
    tokio::spawn(
        reflector(
            template_writer,
            watcher(templates.clone(), Default::default()),
        )
        .applied_objects()
        .for_each(|_| async {}),
    );
    tokio::spawn(
        reflector(
            environment_writer,
            watcher(environments.clone(), Default::default()),
        )
        .applied_objects()
        .for_each(|_| async {}),
    );
    let expected = REPOSITORIES * ENVIRONMENTS_PER_REPOSITORY as usize;
    while environment_store.state().len() < expected || template_store.state().len() < REPOSITORIES
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let metrics = Arc::new(Metrics::new());
    let forge_clients = TemplateClients::new(
        metrics.forge.clone(),
        Arc::new(SecretReader::new(client.clone())),
    );
    let (_ready, ready) = tokio::sync::watch::channel(true);
    let sweeper = Sweeper {
        client: client.clone(),
        caches: Caches {
            templates: template_store,
            environments: environment_store,
            ready,
        },
        metrics: metrics.sweep.clone(),
        writes: metrics.cluster.clone(),
        watch_namespace: Some(namespace.clone()),
    };

    let started = Instant::now();
    let report = sweeper
        .sweep(&forge_clients, now)
        .await
        .expect("the sweep runs");
    let elapsed = started.elapsed();

    let mut by_reason: HashMap<Reason, usize> = HashMap::new();
    for (_, reason) in &report.deleted {
        *by_reason.entry(*reason).or_default() += 1;
    }
    let per_repository = ENVIRONMENTS_PER_REPOSITORY as usize / 10;
    assert_eq!(
        by_reason.get(&Reason::PullRequestClosed),
        Some(&(REPOSITORIES * per_repository)),
        "PRs 91-100 of each repository are closed"
    );
    assert_eq!(
        by_reason.get(&Reason::Idle),
        Some(&(REPOSITORIES * (per_repository - 1))),
        "PRs 5, 15, … 85 of each repository are idle"
    );
    // Exactly those: nothing else was deleted for any other reason.
    assert_eq!(
        report.deleted.len(),
        REPOSITORIES * (2 * per_repository - 1),
        "{by_reason:?}"
    );
    assert!(report.forge_unavailable.is_empty());

    let requests = forge.received_requests().await.unwrap_or_default();
    let mut per_page: HashMap<String, usize> = HashMap::new();
    for request in &requests {
        *per_page
            .entry(format!(
                "{}?{}",
                request.url.path(),
                request.url.query().unwrap_or("")
            ))
            .or_default() += 1;
    }
    let repeated: Vec<_> = per_page.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "asked twice: {repeated:?}");
    // 3 pages of open PRs (100, 100, 40) and 1 page of branches per repository.
    assert_eq!(requests.len(), REPOSITORIES * 4, "{per_page:?}");

    println!(
        "  sweep over {expected} environments in {REPOSITORIES} repositories: {:.0} ms, {} forge requests ({} per repository: 3 pages of open PRs, 1 of branches), {} deleted ({} closed PRs, {} idle)",
        elapsed.as_secs_f64() * 1000.0,
        requests.len(),
        requests.len() / REPOSITORIES,
        report.deleted.len(),
        by_reason[&Reason::PullRequestClosed],
        by_reason[&Reason::Idle],
    );

    // A second sweep: the pages of open PRs are unchanged; GitHub answers 304 (GitLab's lists
    // carry no ETag, so every page is read again).
    let started = Instant::now();
    let second = sweeper
        .sweep(&forge_clients, now)
        .await
        .expect("the sweep runs");
    let elapsed = started.elapsed();
    let not_modified = metrics_outcome(&metrics, kind.kind(), "not_modified");
    assert!(second.deleted.is_empty(), "{second:?}");
    let second_requests =
        forge.received_requests().await.unwrap_or_default().len() - requests.len();
    println!(
        "  second sweep ({} environments left): {:.0} ms, {second_requests} forge requests, {not_modified} answered 304 Not Modified",
        expected - report.deleted.len(),
        elapsed.as_secs_f64() * 1000.0,
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&namespace, &Default::default()).await;
}

/// Forge requests of the sweep's list calls with `outcome`.
fn metrics_outcome(metrics: &Metrics, forge: &str, outcome: &str) -> u64 {
    ["list_pull_requests", "list_branches"]
        .iter()
        .map(|operation| {
            metrics
                .forge
                .requests
                .with_label_values(&[forge, operation, outcome])
                .get()
        })
        .sum()
}
