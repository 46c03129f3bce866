//! Benchmark: webhook throughput and latency for signed `pull_request.synchronize` deliveries
//! on loopback, against the real control plane (each delivery is verified, parsed, decided and
//! written as one server-side apply of its PreviewEnvironment; the controller runs alongside).
//!
//! `cargo bench --bench webhooks`. Prints requests/s and latency percentiles; asserts only that
//! every delivery was accepted.

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use previewd::controller::{self, ControllerConfig};
use previewd::crd::PreviewTemplate;
use previewd::forge::github;
use previewd::metrics::Metrics;
use previewd::server::{self, ServerState};
use serde_json::json;

const SECRET: &[u8] = b"bench-secret";
const DELIVERIES: usize = 2_000;
const IN_FLIGHT: usize = 32;

fn main() {
    previewd::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("benchmark runtime");
    runtime.block_on(benchmark());
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

    let (tx, rx) = tokio::sync::oneshot::channel();
    let metrics = Arc::new(Metrics::new());
    let config = ControllerConfig {
        namespace: Some(namespace.clone()),
        ..Default::default()
    };
    tokio::spawn(controller::run(
        client.clone(),
        config,
        metrics.clone(),
        Some(tx),
    ));
    let context = rx.await.expect("controller context");
    let state = ServerState::new(
        client.clone(),
        context.templates.clone(),
        context.environments.clone(),
        metrics,
        2 << 20,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/github", listener.local_addr().unwrap());
    tokio::spawn(server::serve(state, listener));
    let _ = context.templates.wait_until_ready().await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let body = std::fs::read(support::fixture("github/pull_request.synchronize.json")).unwrap();
    let signature = github::sign(SECRET, &body);
    let http = reqwest::Client::new();
    let send = |i: usize| {
        let (http, url, body, signature) =
            (http.clone(), url.clone(), body.clone(), signature.clone());
        async move {
            let started = Instant::now();
            let response = http
                .post(url)
                .header("X-GitHub-Event", "pull_request")
                .header("X-GitHub-Delivery", format!("bench-{i}"))
                .header("X-Hub-Signature-256", signature)
                .body(body)
                .send()
                .await
                .expect("send");
            (response.status().as_u16(), started.elapsed())
        }
    };
    // Warm-up: connections, caches, the environment's creation.
    for i in 0..20 {
        assert_eq!(send(DELIVERIES + i).await.0, 202);
    }
    let started = Instant::now();
    let results: Vec<(u16, Duration)> = futures::stream::iter(0..DELIVERIES)
        .map(send)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let elapsed = started.elapsed();
    assert!(
        results.iter().all(|(status, _)| *status == 202),
        "every delivery accepted"
    );
    let mut latencies: Vec<Duration> = results.iter().map(|(_, l)| *l).collect();
    latencies.sort();
    let percentile =
        |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "Webhooks: {DELIVERIES} signed pull_request.synchronize deliveries (28 KB), {IN_FLIGHT} in flight, loopback, real apiserver:"
    );
    println!(
        "  {:.0} deliveries/s   latency p50 {:.1} ms   p90 {:.1} ms   p99 {:.1} ms   max {:.1} ms",
        DELIVERIES as f64 / elapsed.as_secs_f64(),
        ms(percentile(0.50)),
        ms(percentile(0.90)),
        ms(percentile(0.99)),
        ms(*latencies.last().unwrap())
    );
    println!("  each: HMAC check, parse, decide, one server-side apply of the PreviewEnvironment");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let _ = namespaces.delete(&namespace, &Default::default()).await;
}
