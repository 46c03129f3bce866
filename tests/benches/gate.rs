//! Benchmark: the wake gate.
//!
//! 1. Requests per second on loopback, 32 keep-alive connections, the same load generator for
//!    five servers in turn, five rounds: a bare hyper HTTP/1.1 server answering a fixed 404 (the
//!    floor), the same under the gate's connection bounds, the gate for a host no environment
//!    holds (404), a bare server sending the gate's waiting page, and the gate for the host of a
//!    sleeping environment among 1,000 (the waiting page; its wake, one write per 30 s, goes to
//!    a counting waker here: the write is measured in part 3). Each ratio is to the bare server
//!    in the same round.
//! 2. A flood for every sleeping host from 500 client addresses: the wakes stay within the wake
//!    budget (60 in all per 10 minutes), asserted.
//! 3. Wake latency against the real control plane: an environment of a Deployment (2 replicas),
//!    a Service and an Ingress asleep; a request through the sandbox's ingress gets the waiting
//!    page; then the time until the app answers, split into what previewd does (the wake write,
//!    the reconcile that scales the workloads up, the one that puts the route back) and what
//!    Kubernetes does (scheduling, the simulated kubelet's start-up delay, the controllers), as
//!    a watch of the objects sees each step.
//!
//! `cargo bench --bench gate`. Prints figures; asserts only that every answer was the expected
//! one and that the app answered.

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::{Response, StatusCode};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use previewd::gate::metrics::GateMetrics;
use previewd::gate::server::{ClusterWaker, Gate, Waker, Woke};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate};
use previewd::sandbox::ingress::SandboxIngress;
use serde_json::json;

const REQUESTS: usize = 20_000;
const CONNECTIONS: usize = 32;
const ENVIRONMENTS: usize = 1_000;
const WAKES: usize = 5;

fn main() {
    support::run_benchmark(benchmark());
}

async fn benchmark() {
    throughput().await;
    flood().await;
    wake_latency().await;
}

/// Wakes nothing; counts.
struct NoWake(std::sync::atomic::AtomicUsize);

impl Waker for NoWake {
    fn wake<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a previewd::cluster::records::Seen<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Woke, String>> + Send + 'a>>
    {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(Woke::Written) })
    }
}

/// A bare hyper HTTP/1.1 server that answers every request with a fixed 404.
/// What a bare hyper server answers every request with: status, headers and body.
#[derive(Clone)]
struct Fixed {
    status: StatusCode,
    headers: Vec<(http::header::HeaderName, &'static str)>,
    body: bytes::Bytes,
}

impl Fixed {
    /// A 404 and nothing else: the floor.
    fn not_found() -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"No preview environment at this address.\n"),
        }
    }

    /// The bytes the gate sends for a sleeping environment's host (its waiting page, the same
    /// status, headers and body), answered without looking anything up: what a server that
    /// answers this page costs the load generator and the kernel, apart from the gate's work.
    fn waiting_page() -> Self {
        let holder = previewd::gate::hosts::Holder {
            namespace: "previews".into(),
            name: "pr-500".into(),
            team: "previews".into(),
            head: String::new(),
            resource_version: String::new(),
            asleep: true,
            generation: 0,
            phase: Phase::Sleeping,
            queue_position: None,
            last_wake_seconds: None,
        };
        let page = previewd::gate::page::waiting(&holder, true);
        Self {
            status: page.status,
            headers: vec![
                (http::header::CONTENT_TYPE, page.content_type),
                (http::header::CACHE_CONTROL, "no-store"),
                (http::header::RETRY_AFTER, "5"),
            ],
            body: bytes::Bytes::from(page.body),
        }
    }
}

/// A bare hyper server answering `fixed` to every request; with `bounded`, under the gate's
/// connection bounds (a head timeout, so a timer per request, and a lifetime per connection):
/// what the gate's defences cost, apart from its own work.
async fn bare_hyper(fixed: Fixed, bounded: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let fixed = fixed.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_request| {
                    let mut response = Response::new(axum::body::Body::from(fixed.body.clone()));
                    *response.status_mut() = fixed.status;
                    for (name, value) in &fixed.headers {
                        let value = http::HeaderValue::from_static(value);
                        response.headers_mut().insert(name.clone(), value);
                    }
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                if !bounded {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    return;
                }
                let bounds = previewd::gate::server::Bounds::default();
                let connection = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(bounds.head_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(bounds.connection_lifetime, connection).await;
            });
        }
    });
    address
}

/// The gate over 1,000 environments, one in ten asleep; returns its address and a sleeping host.
async fn gate_over_environments() -> (std::net::SocketAddr, String) {
    let (address, sleeping, _) = gate_over_environments_counting().await;
    (address, sleeping)
}

/// [`gate_over_environments`], with the count of wakes it asked for.
async fn gate_over_environments_counting() -> (std::net::SocketAddr, String, Arc<NoWake>) {
    let (store, mut writer) = kube::runtime::reflector::store::<PreviewEnvironment>();
    for n in 0..ENVIRONMENTS {
        let mut environment = PreviewEnvironment::new(&format!("pr-{n}"), Default::default());
        environment.metadata.namespace = Some("previews".into());
        environment.spec.source.pull_request = Some(n as u64);
        environment.spec.source.branch = format!("feature-{n}");
        environment.spec.sleep = n % 10 == 0;
        environment.status = Some(PreviewEnvironmentStatus {
            phase: if environment.spec.sleep {
                Phase::Sleeping
            } else {
                Phase::Ready
            },
            host: Some(format!("pr-{n}.preview.example.com")),
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(environment));
    }
    let waker = Arc::new(NoWake(Default::default()));
    let gate = Gate::new(store, waker.clone(), GateMetrics::new(), Default::default());
    let address = support::gate::listen(gate).await;
    (address, "pr-500.preview.example.com".into(), waker)
}

/// A flood for every sleeping host (one in ten of the 1,000) from 500 client addresses, each
/// named by `X-Forwarded-For` through the trusted loopback: the wakes it causes stay within
/// the wake budget's 60 in all (and 10 per client), whatever the flood.
async fn flood() {
    let (gate, _, wakes) = gate_over_environments_counting().await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()
        .unwrap();
    let url = format!("http://{gate}/");
    let sleeping: Vec<String> = (0..ENVIRONMENTS)
        .filter(|n| n % 10 == 0)
        .map(|n| format!("pr-{n}.preview.example.com"))
        .collect();
    const CLIENTS: usize = 500;
    let requests: Vec<(String, String)> = (0..sleeping.len() * 20)
        .map(|i| {
            let client = format!("198.51.{}.{}", (i % CLIENTS) / 250, (i % CLIENTS) % 250 + 1);
            (sleeping[i % sleeping.len()].clone(), client)
        })
        .collect();
    // Until the gate's index holds the hosts (an awake host's answer is the waiting page too,
    // and wakes nothing).
    loop {
        let answer = http
            .get(&url)
            .header("Host", "pr-1.preview.example.com")
            .send()
            .await;
        if answer.is_ok_and(|a| a.status() == 503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let count = requests.len();
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(requests)
        .map(|(host, client)| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let answer = http
                    .get(url)
                    .header("Host", host)
                    .header("X-Forwarded-For", client)
                    .send()
                    .await
                    .unwrap();
                answer.status().as_u16()
            }
        })
        .buffer_unordered(CONNECTIONS)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let other: Vec<&u16> = statuses.iter().filter(|status| **status != 503).collect();
    assert!(other.is_empty(), "every answer a waiting page: {other:?}");
    let woke = wakes.0.load(std::sync::atomic::Ordering::SeqCst);
    let limits = previewd::gate::budget::WakeLimits::default();
    println!(
        "  flood: {count} requests for every one of the {} sleeping hosts from {CLIENTS} client addresses in {:.1} s: {woke} wakes (the wake budget: {} in all and {} per client per {} min)",
        sleeping.len(),
        elapsed.as_secs_f64(),
        limits.in_all,
        limits.per_client,
        limits.window.as_secs() / 60
    );
    assert!(
        woke <= limits.in_all as usize,
        "{woke} wakes beyond the budget"
    );
}

/// Sends [`REQUESTS`] GETs with `host` over [`CONNECTIONS`] keep-alive connections; returns
/// requests per second and the p50 and p99 latency, asserting every status is `expected`.
async fn load(
    address: std::net::SocketAddr,
    host: &str,
    expected: u16,
) -> (f64, Duration, Duration) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()
        .unwrap();
    let url = format!("http://{address}/");
    let send = |_| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let started = Instant::now();
            let answer = http
                .get(url)
                .header("Host", host)
                .header("Accept", "text/html")
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let _ = answer.bytes().await.unwrap();
            (status, started.elapsed())
        }
    };
    // Warm-up: the connections, the host index's snapshot.
    let _: Vec<_> = futures::stream::iter(0..CONNECTIONS * 4)
        .map(send)
        .buffer_unordered(CONNECTIONS)
        .collect()
        .await;
    let started = Instant::now();
    let results: Vec<(u16, Duration)> = futures::stream::iter(0..REQUESTS)
        .map(send)
        .buffer_unordered(CONNECTIONS)
        .collect()
        .await;
    let elapsed = started.elapsed();
    assert!(
        results.iter().all(|(status, _)| *status == expected),
        "every answer {expected}"
    );
    let mut latencies: Vec<Duration> = results.into_iter().map(|(_, l)| l).collect();
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    (REQUESTS as f64 / elapsed.as_secs_f64(), at(0.5), at(0.99))
}

/// How many times each scenario of [`throughput`] runs, in turn with the others: a ratio is
/// taken within a round (the scenario against the bare server just before it), so that what
/// else the two cores do for a moment moves both sides of it.
const ROUNDS: usize = 5;

async fn throughput() {
    let bare = bare_hyper(Fixed::not_found(), false).await;
    let bounded = bare_hyper(Fixed::not_found(), true).await;
    let same_page = bare_hyper(Fixed::waiting_page(), true).await;
    let (gate, sleeping) = gate_over_environments().await;
    let nobody = "pr-9999.preview.example.com";
    let scenarios: [(&str, std::net::SocketAddr, &str, u16); 5] = [
        ("bare hyper server, fixed 404", bare, nobody, 404),
        (
            "bare hyper server under the gate's connection bounds (head timeout, lifetime), fixed 404",
            bounded,
            nobody,
            404,
        ),
        ("gate, a host no environment holds (404)", gate, nobody, 404),
        (
            "bare hyper server under those bounds answering the gate's waiting page (same status, headers and body)",
            same_page,
            &sleeping,
            503,
        ),
        (
            "gate, a sleeping environment's host (waiting page)",
            gate,
            &sleeping,
            503,
        ),
    ];
    println!(
        "Wake gate: {REQUESTS} GETs per scenario and round, {ROUNDS} rounds of the five in turn, on loopback, {CONNECTIONS} keep-alive connections, one load generator (reqwest) for all five; {ENVIRONMENTS} environments in the gate's index:"
    );
    let mut runs: Vec<Vec<(f64, Duration, Duration)>> = vec![Vec::new(); scenarios.len()];
    for _ in 0..ROUNDS {
        for (i, (_, address, host, status)) in scenarios.iter().enumerate() {
            runs[i].push(load(*address, host, *status).await);
        }
    }
    for (i, (what, ..)) in scenarios.iter().enumerate() {
        println!("  {what}: {}", describe_rounds(&runs[i], &runs[0]));
    }
}

/// A scenario's rounds in words: the median rate, its ratio to the bare server's in each round
/// (median, and the lowest and highest), and the median p50 and p99.
fn describe_rounds(
    rounds: &[(f64, Duration, Duration)],
    floor: &[(f64, Duration, Duration)],
) -> String {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let ratios: Vec<f64> = rounds.iter().zip(floor).map(|(r, f)| r.0 / f.0).collect();
    let (lowest, highest) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    let ms = |pick: fn(&(f64, Duration, Duration)) -> Duration| {
        median(
            rounds
                .iter()
                .map(|r| pick(r).as_secs_f64() * 1000.0)
                .collect(),
        )
    };
    format!(
        "{:.0} requests/s ({:.2} of the bare server in the same round; {lowest:.2} to {highest:.2} over the rounds), p50 {:.2} ms, p99 {:.2} ms (medians of {} rounds)",
        median(rounds.iter().map(|r| r.0).collect()),
        median(ratios.clone()),
        ms(|r| r.1),
        ms(|r| r.2),
        rounds.len()
    )
}

const APP: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.example/web:1}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
spec:
  rules:
    - host: \"{{ host }}\"
      http:
        paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]
";

/// When each step of one wake was seen.
#[derive(Default)]
struct Seen {
    woken: Option<Instant>,
    scaled_up: Option<Instant>,
    available: Option<Instant>,
    routed: Option<Instant>,
}

/// Watches the environment's Deployment and Ingress and the environment itself, recording when
/// each step of a wake that started at `since` was seen.
fn watch_steps(
    client: &kube::Client,
    namespace: &str,
    target: &str,
    seen: Arc<std::sync::Mutex<Seen>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), target);
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), target);
    let (a, b, c) = (seen.clone(), seen.clone(), seen);
    vec![
        tokio::spawn(
            watcher(environments, Default::default()).for_each(move |event| {
                if let Ok(watcher::Event::Apply(e)) = event
                    && !e.spec.sleep
                {
                    a.lock().unwrap().woken.get_or_insert_with(Instant::now);
                }
                async {}
            }),
        ),
        tokio::spawn(
            watcher(deployments, Default::default()).for_each(move |event| {
                if let Ok(watcher::Event::Apply(d)) = event {
                    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                    let available = d
                        .status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0);
                    let mut seen = b.lock().unwrap();
                    if wanted > 0 {
                        seen.scaled_up.get_or_insert_with(Instant::now);
                    }
                    if wanted > 0 && available >= wanted {
                        seen.available.get_or_insert_with(Instant::now);
                    }
                }
                async {}
            }),
        ),
        tokio::spawn(
            watcher(ingresses, Default::default()).for_each(move |event| {
                if let Ok(watcher::Event::Apply(_)) = event {
                    c.lock().unwrap().routed.get_or_insert_with(Instant::now);
                }
                async {}
            }),
        ),
    ]
}

async fn wake_latency() {
    let client = support::client().await;
    let namespace = support::create_namespace(&client, "bench-gate").await;
    let running = support::gate::controller(&client, &namespace, &[]).await;
    let waker = Arc::new(ClusterWaker::new(
        client.clone(),
        running.metrics.cluster.clone(),
    ));
    let (gate_address, gate_metrics) = support::gate::serve(&running, waker).await;
    let ingress = SandboxIngress::start(client.clone(), gate_address)
        .await
        .unwrap();

    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "web"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "url": {"host": "{{ slug }}.bench.example.com"},
                 "manifests": {"inline": [{"name": "app.yaml", "template": APP}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": "pr-2"},
        "spec": {"template": "web", "source": {"repository": "Codertocat/Hello-World", "branch": "wake", "pullRequest": 2, "headSha": "abc1234"}}
    }))
    .unwrap();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    environments
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
    let ready = support::wait_for_phase(
        &environments,
        "pr-2",
        Phase::Ready,
        Duration::from_secs(120),
    )
    .await;
    let status = ready.status.unwrap();
    let (target, host) = (status.namespace.unwrap(), status.host.unwrap());
    let http = reqwest::Client::new();
    let url = format!("http://{}/", ingress.address);
    let get = |accept: &'static str| {
        let (http, url, host) = (http.clone(), url.clone(), host.clone());
        async move {
            http.get(url)
                .header("Host", host)
                .header("Accept", accept)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };

    println!(
        "Wake latency: one Deployment (2 replicas), Service and Ingress, through the sandbox's ingress; {WAKES} wakes (the simulated kubelet starts a pod 0.5 s after it is bound):"
    );
    let mut rows = Vec::new();
    for _ in 0..WAKES {
        let patch = Patch::Merge(json!({"spec": {"sleep": true}}));
        environments
            .patch("pr-2", &PatchParams::default(), &patch)
            .await
            .unwrap();
        support::wait_for_phase(
            &environments,
            "pr-2",
            Phase::Sleeping,
            Duration::from_secs(60),
        )
        .await;
        // Its route withdrawn (asked of the API server: a request would wake it).
        let routes: Api<Ingress> = Api::namespaced(client.clone(), &target);
        while routes.get_opt("web").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The watches start before the request; what they list first is the state asleep.
        let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let watches = watch_steps(&client, &namespace, &target, seen.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let gate_before = gate_metrics.wake_seconds.get_sample_sum();
        let started = Instant::now();
        assert_eq!(
            get("text/html").await,
            503,
            "the first request gets the waiting page"
        );
        let answered = loop {
            if get("*/*").await == 200 {
                break started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for watch in watches {
            watch.abort();
        }
        let seen = seen.lock().unwrap();
        let at = |step: Option<Instant>| {
            step.map(|s| s.saturating_duration_since(started))
                .unwrap_or_default()
        };
        let gate_share = gate_metrics.wake_seconds.get_sample_sum() - gate_before;
        rows.push([
            Duration::from_secs_f64(gate_share.max(0.0)),
            at(seen.woken),
            at(seen.scaled_up),
            at(seen.available),
            at(seen.routed),
            answered,
        ]);
    }
    let median = |column: usize| {
        let mut values: Vec<Duration> = rows.iter().map(|r| r[column]).collect();
        values.sort();
        values[values.len() / 2]
    };
    let s = |d: Duration| d.as_secs_f64();
    let (gate, woken, scaled, available, routed, answered) = (
        median(0),
        median(1),
        median(2),
        median(3),
        median(4),
        median(5),
    );
    assert_eq!(
        gate_metrics.wake_seconds.get_sample_count(),
        WAKES as u64,
        "the gate times each wake it wrote (previewd_gate_wake_seconds)"
    );
    // previewd's own share: the gate's (its answer to the API server's acceptance of the
    // wake, its own histogram) and the two reconciles'. The rest of "request → wake seen" is
    // the sandbox's ingress (it lists the Ingresses per request) and the watch's delivery.
    let previewd_share = gate + scaled.saturating_sub(woken) + routed.saturating_sub(available);
    println!(
        "  request → wake seen by a watch: {:.3} s, of which the gate (its answer → the API server accepted the wake, previewd_gate_wake_seconds): {:.3} s",
        s(woken),
        s(gate)
    );
    println!(
        "  wake → workloads scaled up (previewd's reconcile): {:.3} s",
        s(scaled.saturating_sub(woken))
    );
    println!(
        "  scaled up → pods available (scheduler, kubelet, controllers): {:.3} s",
        s(available.saturating_sub(scaled))
    );
    println!(
        "  available → route back (previewd's reconcile, the last wave): {:.3} s",
        s(routed.saturating_sub(available))
    );
    println!(
        "  route back → the app answers (ingress, endpoints): {:.3} s",
        s(answered.saturating_sub(routed))
    );
    println!(
        "  request → the app's first answer: median {:.2} s over {WAKES} wakes; previewd's own share {:.2} s ({:.0} %)",
        s(answered),
        s(previewd_share),
        100.0 * s(previewd_share) / s(answered)
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let _ = namespaces.delete(&namespace, &Default::default()).await;
}
