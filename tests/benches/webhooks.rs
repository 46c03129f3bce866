//! Benchmark: webhook throughput and latency for signed `pull_request.synchronize` deliveries
//! on loopback, against the real control plane (each delivery is verified, parsed, decided and
//! written as one server-side apply of its PreviewEnvironment; the controller runs alongside).
//!
//! `cargo bench --bench webhooks`. Prints requests/s and latency percentiles; asserts only that
//! every delivery was accepted.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use previewd::forge::github;
use previewd::model::crd::PreviewTemplate;
use previewd::webhook::server;
use serde_json::json;

const SECRET: &[u8] = b"bench-secret";
/// New heads: each is an apply and a redeploy, about 100 a second on this machine (10 s).
const DELIVERIES: usize = 1_000;
/// Redeliveries: thousands a second, so ten thousand, and the rate is an average over about
/// 2 s rather than the 0.2 s a thousand took, which a moment of other work on the two cores
/// could move.
const REDELIVERIES: usize = 10_000;
const IN_FLIGHT: usize = 32;

fn main() {
    support::run_benchmark(benchmark());
}

/// What one delivery got: its HTTP status, how long the answer took, and the answer's
/// `outcome`.
type Answered = (u16, Duration, String);

/// The webhook server's own timing of its deliveries (`previewd_webhook_duration_seconds`,
/// from a delivery's arrival to its answer): previewd's share, without the load generator's
/// queue and the loopback.
#[derive(Clone, Copy)]
struct ServerTimes {
    count: u64,
    sum: f64,
    /// Deliveries answered within each of [`ServerTimes::BOUNDS`].
    within: [u64; 4],
}

impl ServerTimes {
    const BOUNDS: [f64; 4] = [0.001, 0.0025, 0.005, 0.01];

    fn read(histogram: &prometheus::Histogram) -> Self {
        let sample = prometheus::core::Metric::metric(histogram);
        let histogram = sample.get_histogram();
        let mut within = [0; 4];
        for bucket in histogram.get_bucket() {
            if let Some(i) = Self::BOUNDS.iter().position(|b| *b == bucket.upper_bound()) {
                within[i] = bucket.cumulative_count();
            }
        }
        Self {
            count: histogram.get_sample_count(),
            sum: histogram.get_sample_sum(),
            within,
        }
    }

    /// What the server measured between `before` and now, in words.
    fn since(self, before: Self) -> String {
        let count = self.count.saturating_sub(before.count).max(1) as f64;
        let mean_ms = (self.sum - before.sum) / count * 1000.0;
        let shares: Vec<String> = Self::BOUNDS
            .iter()
            .zip(self.within.iter().zip(before.within.iter()))
            .map(|(bound, (now, then))| {
                let share = now.saturating_sub(*then) as f64 / count * 100.0;
                format!("{share:.1} % within {} ms", bound * 1000.0)
            })
            .collect();
        format!(
            "the webhook server's own time (arrival → answer): mean {mean_ms:.2} ms; {}",
            shares.join(", ")
        )
    }
}

/// Sends `deliveries` with at most [`IN_FLIGHT`] at once, checks that every one was answered
/// 202 with `outcome`, and prints throughput and latency, and previewd's own share of it (the
/// server's timing, from `server`).
async fn run<F, Fut>(
    what: &str,
    outcome: &str,
    deliveries: Vec<(String, Vec<u8>)>,
    send: &F,
    server: &prometheus::Histogram,
) where
    F: Fn(String, Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = Answered>,
{
    let count = deliveries.len();
    let server_before = ServerTimes::read(server);
    let started = Instant::now();
    let results: Vec<(String, Answered)> = futures::stream::iter(deliveries)
        .map(|(id, body)| {
            let answered = send(id.clone(), body);
            async move { (id, answered.await) }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let unexpected: Vec<&(String, Answered)> = results
        .iter()
        .filter(|(_, (status, _, said))| *status != 202 || said != outcome)
        .collect();
    assert!(
        unexpected.is_empty(),
        "{what}: {} of {count} not answered 202 {outcome}: {:?}",
        unexpected.len(),
        unexpected.iter().take(10).collect::<Vec<_>>()
    );
    let mut latencies: Vec<Duration> = results.iter().map(|(_, (_, l, _))| *l).collect();
    latencies.sort();
    let percentile =
        |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  {what}: {count} deliveries, {:.0}/s, latency p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        count as f64 / elapsed.as_secs_f64(),
        ms(percentile(0.50)),
        ms(percentile(0.90)),
        ms(percentile(0.99)),
        ms(*latencies.last().unwrap())
    );
    println!(
        "    of which previewd: {}",
        ServerTimes::read(server).since(server_before)
    );
}

async fn benchmark() {
    let client = support::client().await;
    let namespace = support::create_namespace(&client, "bench-webhooks").await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "webhook"}, "stringData": {"secret": "bench-secret"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "app"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World",
                           "webhookSecretRef": {"name": "webhook", "key": "secret"}},
                 "manifests": {"inline": [{"name": "app.yaml", "template":
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ sha }}\"\n"}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    let running = support::start_controller(&client, &namespace).await;
    let state = running.server_state(&client, 2 << 20);
    let server_times = running
        .metrics
        .webhook
        .duration
        .with_label_values(&["github"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/github", listener.local_addr().unwrap());
    tokio::spawn(server::serve(state, listener, std::future::pending()));
    // Ready once the server's caches are synced (its /readyz).
    let http = reqwest::Client::new();
    let readyz = url.replace("/webhooks/github", "/readyz");
    while !http
        .get(&readyz)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("[bench] controller and webhook server running");

    let fixture: serde_json::Value = serde_json::from_slice(
        &std::fs::read(support::fixture("github/pull_request.synchronize.json")).unwrap(),
    )
    .unwrap();
    // Deliveries are built and signed before the clock starts.
    let same_commit = fixture.to_string().into_bytes();
    let new_commits: Vec<Vec<u8>> = (0..DELIVERIES)
        .map(|i| {
            let mut delivery = fixture.clone();
            // A copy per delivery with its own head SHA, as successive pushes would carry.
            delivery["pull_request"]["head"]["sha"] = format!("{i:040x}").into();
            delivery.to_string().into_bytes()
        })
        .collect();
    let send = |id: String, body: Vec<u8>| {
        let (http, url) = (http.clone(), url.clone());
        let signature = github::sign(SECRET, &body);
        async move {
            let started = Instant::now();
            let response = http
                .post(url)
                .header("X-GitHub-Event", "pull_request")
                .header("X-GitHub-Delivery", id)
                .header("X-Hub-Signature-256", signature)
                .body(body)
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            let answer: serde_json::Value = response.json().await.unwrap_or_default();
            let outcome = answer["outcome"].as_str().unwrap_or_default().to_string();
            (status, started.elapsed(), outcome)
        }
    };
    // Writes to PreviewEnvironments themselves (not their status, which the controller
    // writes as it redeploys), as the API server counted them.
    let environment_writes = |counts: &support::apiserver::RequestCounts| {
        counts.writes(|series| {
            series.resource == "previewenvironments" && series.subresource.is_empty()
        })
    };
    // Warm-up: connections, caches, the environment's creation. It ends once the intake's
    // view (the controller's watch of PreviewEnvironments) holds the environment the first
    // delivery wrote, which a redelivery answered `unchanged` shows. Until then a redelivery
    // is applied again, as it should be: on a loaded machine the watch event can come after
    // the twentieth warm-up delivery (CI once measured 27 redeliveries applied that way).
    let warm_until = Instant::now() + Duration::from_secs(60);
    for i in 0.. {
        let (status, _, outcome) = send(format!("warm-{i}"), same_commit.clone()).await;
        assert_eq!(status, 202, "{outcome}");
        if i >= 20 && outcome == "unchanged" {
            break;
        }
        assert!(
            Instant::now() < warm_until,
            "the intake never saw the environment its first delivery wrote: {i} warm-up deliveries, the last answered {outcome}"
        );
    }
    println!(
        "Webhooks: signed pull_request.synchronize deliveries ({:.1} KB each) on loopback, {IN_FLIGHT} in flight, real apiserver, controller running:",
        same_commit.len() as f64 / 1000.0
    );
    let same: Vec<(String, Vec<u8>)> = (0..REDELIVERIES)
        .map(|i| (format!("same-{i}"), same_commit.clone()))
        .collect();
    // Settled: the warm-up's environment is written, and nothing else writes it meanwhile.
    let before = support::apiserver::request_counts(&client).await;
    run(
        "the same commit again (redeliveries, retries)",
        "unchanged",
        same,
        &send,
        &server_times,
    )
    .await;
    let served = support::apiserver::request_counts(&client)
        .await
        .since(&before);
    assert_eq!(environment_writes(&served), 0, "{}", served.describe());
    let fresh: Vec<(String, Vec<u8>)> = new_commits
        .into_iter()
        .enumerate()
        .map(|(i, body)| (format!("new-{i}"), body))
        .collect();
    let before = support::apiserver::request_counts(&client).await;
    // previewd's own count of its apply requests: the API server's count also holds what
    // kube's retry layer sends again after a 429 or 5xx, which a loaded machine can cause.
    let intake_applies = running
        .metrics
        .cluster
        .writes
        .with_label_values(&["intake_apply"]);
    let intake_applies_before = intake_applies.get();
    run(
        "a new head SHA each (one server-side apply each)",
        "accepted",
        fresh,
        &send,
        &server_times,
    )
    .await;
    let served = support::apiserver::request_counts(&client)
        .await
        .since(&before);
    // One apply each: the API server keeps the order (the CRD's rule on `spec.source`), so
    // the controller's status writes meanwhile cost no second apply (they did, with the
    // resourceVersion precondition before: 1,664 for 1,000 heads at b41db6a).
    let applies = served.count("APPLY", "previewenvironments");
    assert_eq!(
        intake_applies.get().saturating_sub(intake_applies_before) as usize,
        DELIVERIES,
        "{}",
        served.describe()
    );
    println!(
        "  server-side applies of the PreviewEnvironment: {applies} for {DELIVERIES} new heads"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let _ = namespaces.delete(&namespace, &Default::default()).await;
}
