//! Traffic as activity, against a real kube-apiserver and a real Prometheus: an ingress
//! controller's request counter (served by the test, scraped every second) keeps an environment
//! awake past its `idleTimeout`, while one without requests is put to sleep by the sweep; a
//! Prometheus that cannot be reached records nothing.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use kube::api::{Api, Patch, PatchParams, PostParams};
use previewd::lifecycle::metrics::TrafficMetrics;
use previewd::lifecycle::traffic::{TrafficRecorder, TrafficSource};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use serde_json::json;
use support::prometheus::Prometheus;
use support::{eventually, in_namespace, wait_for_phase};

/// What an ingress controller exports: requests per host. Every scrape of `used` adds 10.
async fn ingress_metrics(used: String) -> std::net::SocketAddr {
    ingress_metrics_for(move || used.clone()).await
}

/// [`ingress_metrics`] for the host `used` names at each scrape (none while it is empty).
async fn ingress_metrics_for(
    used: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> std::net::SocketAddr {
    let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let serve = move || {
        let (counts, used) = (counts.clone(), used());
        async move {
            let mut counts = counts.lock().unwrap();
            if !used.is_empty() {
                *counts.entry(used).or_default() += 10;
            }
            let mut text = String::from("# TYPE ingress_requests_total counter\n");
            for (host, count) in counts.iter() {
                text.push_str(&format!(
                    "ingress_requests_total{{host=\"{host}\"}} {count}\n"
                ));
            }
            text
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(serve));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    address
}

fn recorder(
    running: &support::Running,
    client: &kube::Client,
    prometheus: &str,
) -> TrafficRecorder {
    let query = "sum(increase(ingress_requests_total{host=\"{{ host }}\"}[1m]))";
    TrafficRecorder {
        client: client.clone(),
        caches: running.caches.clone(),
        source: TrafficSource::new(
            prometheus.parse().unwrap(),
            query.into(),
            Duration::from_secs(60),
        )
        .unwrap(),
        metrics: TrafficMetrics::new(),
        writes: running.metrics.cluster.clone(),
        http: reqwest::Client::new(),
    }
}

/// The template `web` (idle after an hour, then asleep) and its environments `named` (name,
/// pull request), each Ready and then made idle for two hours: their hosts by name.
async fn idle_environments(
    client: &kube::Client,
    ns: &str,
    named: &[(&'static str, u64)],
) -> HashMap<&'static str, String> {
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "web"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "url": {"host": "{{ slug }}.traffic.example.com"},
                 "lifecycle": {"idleTimeout": "1h", "idleAction": "Sleep"},
                 "manifests": {"inline": [{"name": "app.yaml", "template": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n"}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), ns);
    let mut hosts = HashMap::new();
    for (name, number) in named {
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": name},
            "spec": {"template": "web", "source": {"repository": "Codertocat/Hello-World", "branch": name, "pullRequest": number, "headSha": "abc1234"}}
        }))
        .unwrap();
        environments
            .create(&PostParams::default(), &environment)
            .await
            .unwrap();
        let ready =
            wait_for_phase(&environments, name, Phase::Ready, Duration::from_secs(60)).await;
        hosts.insert(*name, ready.status.unwrap().host.unwrap());
        // Nobody pushed or commented for two hours: past the idle timeout.
        let quiet_since = json!({"spec": {"lastActivity": Utc::now() - TimeDelta::hours(2)}});
        environments
            .patch(name, &PatchParams::default(), &Patch::Merge(quiet_since))
            .await
            .unwrap();
    }
    hosts
}

/// The recorder's loop as previewd runs it (`service::lead` with `--traffic-*`, as a leader
/// does): requests counted by Prometheus move the used environment's activity to now, with
/// no round started by hand; the recorder's queries are counted on previewd's own metrics.
#[tokio::test]
async fn previewds_own_recorder_loop_records_traffic_every_interval() {
    in_namespace("traffic-loop", |client, ns| async move {
        let metrics = Arc::new(previewd::runtime::metrics::Metrics::new());
        let target_host = Arc::new(Mutex::new(String::new()));
        // The host is known once the environment is Ready; the counter serves it from then.
        let ingress = {
            let host = target_host.clone();
            ingress_metrics_for(move || host.lock().unwrap().clone()).await
        };
        let prometheus = Prometheus::scraping(ingress).await;
        let query = "sum(increase(ingress_requests_total{host=\"{{ host }}\"}[1m]))";
        let source = TrafficSource::new(
            prometheus.url.parse().unwrap(),
            query.into(),
            Duration::from_secs(2),
        )
        .unwrap();
        let mut config = previewd::reconcile::ControllerConfig {
            namespace: Some(ns.clone()),
            ..Default::default()
        };
        config.engines.worker = std::path::PathBuf::from(env!("CARGO_BIN_EXE_previewd"));
        let leader = tokio::spawn(previewd::runtime::service::lead(
            client.clone(),
            config,
            metrics.clone(),
            Duration::from_secs(3600),
            Some(source),
        ));
        let hosts = idle_environments(&client, &ns, &[("used", 2)]).await;
        *target_host.lock().unwrap() = hosts["used"].clone();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        eventually(
            "the loop to record used's requests",
            Duration::from_secs(90),
            || async {
                let used = environments.get("used").await.ok()?;
                let at = used.spec.last_activity?;
                (Utc::now() - at < TimeDelta::minutes(1)).then_some(())
            },
        )
        .await;
        let used = environments.get("used").await.unwrap();
        let managers = support::field_managers(&used);
        assert!(
            managers.contains(&"previewd-traffic"),
            "the recorder writes as itself: {managers:?}"
        );
        let asked = metrics.traffic.queries.with_label_values(&["active"]).get();
        assert!(
            asked >= 1,
            "the loop's queries are counted on previewd's metrics: {asked}"
        );
        leader.abort();
    })
    .await;
}

#[tokio::test]
async fn traffic_keeps_an_environment_awake_past_its_idle_timeout_and_a_quiet_one_sleeps() {
    in_namespace("traffic", |client, ns| async move {
        let running = support::start_controller(&client, &ns).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let hosts = idle_environments(&client, &ns, &[("used", 2), ("quiet", 3)]).await;
        eventually(
            "the cache to see both idle",
            Duration::from_secs(30),
            || async {
                let idle = running
                    .caches
                    .environments
                    .state()
                    .iter()
                    .filter(|e| {
                        e.spec
                            .last_activity
                            .is_some_and(|at| Utc::now() - at > TimeDelta::minutes(90))
                    })
                    .count();
                (idle == 2).then_some(())
            },
        )
        .await;

        // Prometheus unreachable: nothing is recorded, and nothing fails beyond this round.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let unreachable = recorder(&running, &client, &format!("http://{closed}"));
        let report = unreachable.record(Utc::now()).await;
        assert!(
            report.active.is_empty() && report.failed.len() == 2,
            "{report:?}"
        );
        assert_eq!(
            unreachable
                .metrics
                .queries
                .with_label_values(&["error"])
                .get(),
            2
        );

        // The ingress controller's counter for `used`, scraped by a real Prometheus.
        let target = ingress_metrics(hosts["used"].clone()).await;
        let prometheus = Prometheus::scraping(target).await;
        let recorder = recorder(&running, &client, &prometheus.url);
        // increase() needs two samples: the first rounds may find nothing yet.
        let report = eventually(
            "Prometheus to count used's requests",
            Duration::from_secs(60),
            || async {
                let report = recorder.record(Utc::now()).await;
                assert!(report.failed.is_empty(), "{report:?}");
                (report.active == [format!("{ns}/used")]).then_some(report)
            },
        )
        .await;
        assert_eq!(report.quiet, [format!("{ns}/quiet")], "{report:?}");
        let used = environments.get("used").await.unwrap();
        assert!(
            used.spec
                .last_activity
                .is_some_and(|at| Utc::now() - at < TimeDelta::minutes(1)),
            "used's activity is now"
        );
        let quiet = environments.get("quiet").await.unwrap();
        assert!(
            quiet
                .spec
                .last_activity
                .is_some_and(|at| Utc::now() - at > TimeDelta::minutes(90)),
            "quiet's is not"
        );
        // The next round does not ask about `used` again within the interval: one write at most.
        let again = recorder.record(Utc::now()).await;
        assert!(
            again.active.is_empty() && !again.quiet.is_empty(),
            "{again:?}"
        );

        // The sweep: the quiet one sleeps, the used one stays awake.
        eventually(
            "the cache to see used active",
            Duration::from_secs(30),
            || async {
                let seen = running
                    .caches
                    .environments
                    .state()
                    .into_iter()
                    .find(|e| e.metadata.name.as_deref() == Some("used"))?;
                seen.spec
                    .last_activity
                    .filter(|at| Utc::now() - *at < TimeDelta::minutes(1))
                    .map(|_| ())
            },
        )
        .await;
        let report = running
            .sweeper(&client, &ns)
            .sweep(running.reporter.clients(), Utc::now())
            .await
            .unwrap();
        assert_eq!(report.slept, [format!("{ns}/quiet")], "{report:?}");
        wait_for_phase(
            &environments,
            "quiet",
            Phase::Sleeping,
            Duration::from_secs(60),
        )
        .await;
        assert!(!environments.get("used").await.unwrap().spec.sleep);
    })
    .await;
}
