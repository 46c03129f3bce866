//! Benchmark: the scale run spread over two control planes. Three real `previewd run`
//! processes: the hub (webhooks in, placement, the forge reports), and an agent on each
//! cluster (A: a namespace of the shared control plane; B: a second control plane) deploying
//! the records the hub writes there. The hub's credential on each cluster is previewd's records
//! in one namespace, nothing else.
//!
//! 1. Opens `PREVIEWD_CLUSTERS_ENVIRONMENTS` pull requests (default 100) of a 3-object app
//!    through signed deliveries to the hub; both clusters take up to all of them, so placement
//!    by room spreads them evenly. Measured: time until every environment is `Ready`.
//! 2. A quiet window (`PREVIEWD_CLUSTERS_QUIET_SECONDS`, default 20; the hub looks at each
//!    cluster every 2 s): every write any of the three sends is waste, and fails the run.
//! 3. Churn (`PREVIEWD_CLUSTERS_CHURN_SECONDS`, default 60): a push to a random environment
//!    every second. Measured per push: push → the record on its cluster at the new head (the
//!    hub's share: delivery, intake, placement check, one apply across clusters) and push →
//!    the hub's environment `Ready` at it (with the agent's deploy and the status read back).
//!
//! Printed per cluster and in total: environments, push → record and push → Ready (p50, p99),
//! writes per push, RSS now and peak. It fails when an environment does not end Ready at its
//! last head on the cluster it was placed on, or when anything is written at rest; never on
//! timing.
//!
//! `cargo bench --bench clusters`.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use previewd::model::crd::{Phase, PreviewCluster, PreviewEnvironment};
use support::clusters::{acting_as, records_access, register};
use support::process::PreviewdProcess;
use support::webhooks::*;

const REPOSITORY: &str = "Codertocat/Hello-World";

/// The app: a push changes the ConfigMap and the Deployment's pod template.
const APP: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: release}
data: {GIT_SHA: "{{ sha }}"}
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
      containers:
        - name: web
          image: registry.example/web:1
          resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

fn main() {
    support::run_benchmark(benchmark());
}

fn head(number: u64, change: u64) -> String {
    format!("{number:08x}{change:032x}")
}

/// When each (hub environment name, head) was first seen: as a record on a cluster, and as
/// the hub's environment Ready at it.
#[derive(Default)]
struct Seen {
    recorded: HashMap<(String, String), Instant>,
    ready: HashMap<(String, String), Instant>,
}

type Shared = Arc<Mutex<Seen>>;

/// Notes when each hub environment is first Ready at each head.
async fn watch_hub(environments: Api<PreviewEnvironment>, seen: Shared) {
    let events = watcher(environments, watcher::Config::default()).applied_objects();
    futures::pin_mut!(events);
    while let Some(Ok(environment)) = events.next().await {
        let Some(status) = environment.status.as_ref() else {
            continue;
        };
        if status.phase != Phase::Ready {
            continue;
        }
        let Some(sha) = status.deployed_sha.clone() else {
            continue;
        };
        let key = (environment.name_any(), sha);
        let mut seen = seen.lock().unwrap();
        seen.ready.entry(key).or_insert_with(Instant::now);
    }
}

/// Notes when each record on a cluster first holds each head.
async fn watch_records(records: Api<PreviewEnvironment>, seen: Shared) {
    let events = watcher(records, watcher::Config::default()).applied_objects();
    futures::pin_mut!(events);
    while let Some(Ok(record)) = events.next().await {
        let Some(hub_name) = record.labels().get("previewd.dev/hub-name").cloned() else {
            continue;
        };
        let key = (hub_name, record.spec.source.head_sha.clone());
        let mut seen = seen.lock().unwrap();
        seen.recorded.entry(key).or_insert_with(Instant::now);
    }
}

/// RSS now and at its peak, in MiB, of process `pid`.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn describe(latencies: &mut [Duration]) -> String {
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "p50 {:.0} ms, p99 {:.0} ms",
        ms(percentile(latencies, 0.50)),
        ms(percentile(latencies, 0.99))
    )
}

/// The three processes, and which cluster each hub environment runs on.
struct Run {
    hub: PreviewdProcess,
    agents: [(String, PreviewdProcess); 2],
    http: reqwest::Client,
}

impl Run {
    async fn writes(&self) -> [f64; 3] {
        let mut totals = [0.0; 3];
        let processes = [&self.hub, &self.agents[0].1, &self.agents[1].1];
        for (total, process) in totals.iter_mut().zip(processes) {
            let written = process.metric_total(&self.http, "previewd_write_requests_total");
            *total = written.await.unwrap_or(0.0);
        }
        totals
    }
}

/// Waits until every hub environment is Ready at `heads`' head on a cluster; returns where
/// each runs.
async fn all_ready(
    environments: &Api<PreviewEnvironment>,
    heads: &HashMap<u64, u64>,
    what: &str,
) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = environments.list(&Default::default()).await.unwrap();
        let mut placed = HashMap::new();
        let ready = list.items.iter().filter(|e| {
            let number = e.spec.source.pull_request.unwrap_or(0);
            let wanted = heads.get(&number).map(|&c| head(number, c));
            let status = e.status.clone().unwrap_or_default();
            let cluster = status.cluster.map(|c| c.name);
            if let Some(cluster) = &cluster {
                placed.insert(e.name_any(), cluster.clone());
            }
            status.phase == Phase::Ready && status.deployed_sha == wanted && cluster.is_some()
        });
        if ready.count() == heads.len() {
            return placed;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not all Ready in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn start(hub_client: &Client, logs: &std::path::Path) -> (Run, String) {
    let second = support::second();
    let remote = second.client().await;
    let hub_ns = support::create_namespace(hub_client, "bench-clusters-hub").await;
    let records_a = support::create_namespace(hub_client, "bench-clusters-a").await;
    let records_b = support::create_namespace(&remote, "bench-clusters-b").await;
    let user = format!("previewd-hub-{hub_ns}");
    records_access(hub_client, &records_a, &user).await;
    records_access(&remote, &records_b, &user).await;
    let (a, b) = (format!("{hub_ns}-a"), format!("{hub_ns}-b"));
    let capacity = u32::try_from(support::setting::<u64>(
        "PREVIEWD_CLUSTERS_ENVIRONMENTS",
        100,
    ))
    .unwrap();
    let shared_kubeconfig = &support::shared().kubeconfig_path;
    let kubeconfig_a = acting_as(shared_kubeconfig, &user);
    register(hub_client, &hub_ns, &a, kubeconfig_a, &records_a, capacity).await;
    let kubeconfig_b = acting_as(&second.kubeconfig_path, &user);
    register(hub_client, &hub_ns, &b, kubeconfig_b, &records_b, capacity).await;
    let agent = |name: &str, kubeconfig: &std::path::Path, namespace: &str| {
        let flags = [
            "--watch-namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--sweep-interval",
            "24h",
        ];
        PreviewdProcess::start(name, kubeconfig, &flags, &[], logs)
    };
    let agent_a = agent("agent-a", shared_kubeconfig, &records_a);
    let agent_b = agent("agent-b", &second.kubeconfig_path, &records_b);
    let hub_flags = [
        "--watch-namespace",
        &hub_ns,
        "--lease-namespace",
        &hub_ns,
        "--sweep-interval",
        "24h",
        "--cluster-credentials-namespace",
        &hub_ns,
        "--cluster-look-interval",
        "2s",
        // The cluster side is measured; the content budget has its own benchmark.
        "--forge-content-per-minute",
        "1000000",
        "--forge-content-per-hour",
        "1000000",
    ];
    let hub = PreviewdProcess::start("hub", shared_kubeconfig, &hub_flags, &[], logs);
    let http = reqwest::Client::new();
    for process in [&hub, &agent_a, &agent_b] {
        process.wait_ready(&http).await;
    }
    let clusters: Api<PreviewCluster> = Api::all(hub_client.clone());
    for cluster in [&a, &b] {
        support::eventually("the cluster reachable", Duration::from_secs(60), || async {
            let status = clusters.get(cluster).await.ok()?.status?;
            status.reachable.then_some(())
        })
        .await;
    }
    let agents = [(a, agent_a), (b, agent_b)];
    (Run { hub, agents, http }, hub_ns)
}

async fn benchmark() {
    let count = support::setting::<u64>("PREVIEWD_CLUSTERS_ENVIRONMENTS", 100);
    let quiet_seconds = support::setting::<u64>("PREVIEWD_CLUSTERS_QUIET_SECONDS", 20);
    let churn_seconds = support::setting::<u64>("PREVIEWD_CLUSTERS_CHURN_SECONDS", 60);
    let hub_client = support::client().await;
    let logs = tempfile::tempdir().unwrap();
    let (run, hub_ns) = start(&hub_client, logs.path()).await;
    let forge = github_forge().await;
    let placement =
        serde_json::json!({"placement": {"clusterSelector": {"previewd.dev/test": hub_ns}}});
    install_template_with(
        &hub_client,
        &hub_ns,
        "github",
        REPOSITORY,
        Some(&forge.uri()),
        placement,
        APP,
    )
    .await;
    let environments: Api<PreviewEnvironment> = Api::namespaced(hub_client.clone(), &hub_ns);
    let seen: Shared = Arc::default();
    let remote = support::second().client().await;
    let watches = [
        tokio::spawn(watch_hub(environments.clone(), seen.clone())),
        tokio::spawn(watch_records(
            Api::namespaced(
                hub_client.clone(),
                &records_namespace(&hub_client, &run.agents[0].0).await,
            ),
            seen.clone(),
        )),
        tokio::spawn(watch_records(
            Api::namespaced(
                remote,
                &records_namespace(&hub_client, &run.agents[1].0).await,
            ),
            seen.clone(),
        )),
    ];
    println!(
        "clusters: {count} environments of a 3-object app over two control planes (A: the hub's own, B: a second), a previewd on each, the hub looking at each every 2 s"
    );

    // 1. Open.
    let started = Instant::now();
    let opened_at = Utc::now() - TimeDelta::hours(1);
    futures::stream::iter(1..=count)
        .map(|number| {
            let body = pull_request_change(number, 0, &head(number, 0), opened_at);
            let (hub, http) = (&run.hub, &run.http);
            async move {
                hub.send(http, "pull_request", &format!("open-{number}"), &body)
                    .await
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let mut heads: HashMap<u64, u64> = (1..=count).map(|n| (n, 0)).collect();
    let placed = all_ready(&environments, &heads, "opened").await;
    let on = |cluster: &str| placed.values().filter(|c| c.as_str() == cluster).count();
    println!(
        "  all {count} Ready {:.1} s after the first delivery; A holds {}, B holds {}",
        started.elapsed().as_secs_f64(),
        on(&run.agents[0].0),
        on(&run.agents[1].0)
    );

    // 2. Quiet.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = run.writes().await;
    tokio::time::sleep(Duration::from_secs(quiet_seconds)).await;
    let after = run.writes().await;
    let quiet: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    println!(
        "  quiet {quiet_seconds} s: writes by the hub {}, agent A {}, agent B {}",
        quiet[0], quiet[1], quiet[2]
    );
    assert!(quiet.iter().all(|&w| w == 0.0), "writes at rest: {quiet:?}");

    // 3. Churn.
    let mut pushes: Vec<(String, String, Instant)> = Vec::new();
    let mut rng = 0x5eed_u64;
    let before = run.writes().await;
    let churn_started = Instant::now();
    while churn_started.elapsed() < Duration::from_secs(churn_seconds) {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let number = (rng >> 33) % count + 1;
        let change = heads.get(&number).copied().unwrap_or(0) + 1;
        heads.insert(number, change);
        let sha = head(number, change);
        let body = pull_request_change(number, change, &sha, Utc::now());
        let name = environment_of(&environments, number).await;
        pushes.push((name, sha, Instant::now()));
        run.hub
            .send(
                &run.http,
                "pull_request",
                &format!("push-{number}-{change}"),
                &body,
            )
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    all_ready(&environments, &heads, "after the churn").await;
    let after = run.writes().await;
    for watch in watches {
        watch.abort();
    }
    report(&run, &placed, &pushes, &seen, before, after);
}

/// The records namespace cluster `name` was registered with.
async fn records_namespace(hub: &Client, name: &str) -> String {
    let clusters: Api<PreviewCluster> = Api::all(hub.clone());
    clusters.get(name).await.unwrap().spec.namespace
}

/// The name of the hub environment of pull request `number`.
async fn environment_of(environments: &Api<PreviewEnvironment>, number: u64) -> String {
    let list = environments.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .find(|e| e.spec.source.pull_request == Some(number))
        .map(|e| e.name_any())
        .expect("the pull request's environment")
}

/// Per cluster and in total: push → record, push → Ready, writes per push, RSS.
fn report(
    run: &Run,
    placed: &HashMap<String, String>,
    pushes: &[(String, String, Instant)],
    seen: &Shared,
    before: [f64; 3],
    after: [f64; 3],
) {
    let seen = seen.lock().unwrap();
    let since = |map: &HashMap<(String, String), Instant>, name: &str, sha: &str, at: Instant| {
        map.get(&(name.to_string(), sha.to_string()))
            .map(|seen| seen.saturating_duration_since(at))
    };
    let count = pushes.len();
    println!("  churn: {count} pushes, one a second");
    let mut all_ready = Vec::new();
    for (index, (cluster, agent)) in run.agents.iter().enumerate() {
        let on_cluster: Vec<&(String, String, Instant)> = pushes
            .iter()
            .filter(|(name, _, _)| placed.get(name) == Some(cluster))
            .collect();
        let mut recorded: Vec<Duration> = on_cluster
            .iter()
            .filter_map(|(n, sha, at)| since(&seen.recorded, n, sha, *at))
            .collect();
        let mut ready: Vec<Duration> = on_cluster
            .iter()
            .filter_map(|(n, sha, at)| since(&seen.ready, n, sha, *at))
            .collect();
        all_ready.extend(ready.iter().copied());
        let writes = (after[index + 1] - before[index + 1]) / on_cluster.len().max(1) as f64;
        let (rss, peak) = rss_mib(agent.child.id());
        let label = if index == 0 { "A" } else { "B" };
        println!(
            "    cluster {label}: {} pushes; push → record there {} (the hub's share); push → Ready {}; agent writes per push {writes:.1}; agent RSS {rss:.0} MiB (peak {peak:.0})",
            on_cluster.len(),
            describe(&mut recorded),
            describe(&mut ready)
        );
    }
    let hub_writes = (after[0] - before[0]) / count.max(1) as f64;
    let (rss, peak) = rss_mib(run.hub.child.id());
    println!(
        "    total: push → Ready {}; hub writes per push {hub_writes:.1}; hub RSS {rss:.0} MiB (peak {peak:.0})",
        describe(&mut all_ready)
    );
}
