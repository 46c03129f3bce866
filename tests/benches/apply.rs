//! Benchmark: previewd's apply of the Online Boutique (35 objects) against
//! `kubectl apply --server-side` of the same objects, on the same control plane, in one run.
//!
//! Run with `cargo bench --bench apply` (a release build; the sandbox starts itself, or set
//! `PREVIEWD_TEST_KUBECONFIG` to use another cluster). It prints figures and fails only when
//! something breaks, never because a machine is slow.
//!
//! Each round deploys into two fresh namespaces, one per contestant, alternating who goes
//! first. Both sides are measured warm (kubectl with its discovery cache filled, previewd with
//! its discovery and watches running, as in a controller that has deployed before); previewd's
//! very first apply, cold, is printed too. Requests are counted on the wire: for previewd by a
//! layer in its HTTP client, for kubectl from its `-v=6` request log.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use previewd::cluster::applier::Applier;
use previewd::cluster::metrics::ClusterMetrics;
use previewd::cluster::observed::ObservedStore;
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};
use serde_json::Value;

const ROUNDS: usize = 5;

fn main() {
    support::run_benchmark(benchmark());
}

/// A client that counts every HTTP request it sends.
async fn counting_client(kubeconfig: &Path, requests: Arc<AtomicU64>) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    let count = tower::util::MapRequestLayer::new(move |request| {
        requests.fetch_add(1, Ordering::Relaxed);
        request
    });
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&count)
        .build()
}

/// The Online Boutique example rendered for `namespace`, exactly as previewd sends it.
fn boutique_objects(namespace: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/online-boutique");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect("example file");
    let template: PreviewTemplate = serde_yaml_ng::from_str(&read("template.yaml")).unwrap();
    let environment: PreviewEnvironment =
        serde_yaml_ng::from_str(&read("environment.yaml")).unwrap();
    let context =
        previewd::reconcile::plan::values::render_context(&environment, &template.spec, namespace)
            .unwrap();
    let labels: BTreeMap<String, String> =
        previewd::model::metadata::environment_labels(&environment, &template);
    let objects = previewd::reconcile::plan::render::render(
        &template.spec.manifests.inline,
        &template.spec.seeds,
        &context,
        &labels,
    )
    .expect("the example renders");
    objects.into_iter().map(|o| o.object).collect()
}

struct Kubectl {
    kubeconfig: std::path::PathBuf,
    cache_dir: tempfile::TempDir,
}

impl Kubectl {
    /// Runs kubectl; returns (wall time, requests sent).
    fn run(&self, args: &[&str]) -> (Duration, usize) {
        let started = Instant::now();
        let output = Command::new("kubectl")
            .args(args)
            .arg("-v=6")
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache_dir.path())
            .output()
            .expect("run kubectl");
        let elapsed = started.elapsed();
        assert!(
            output.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let log = String::from_utf8_lossy(&output.stderr);
        let requests = log.lines().filter(|l| is_request_line(l)).count();
        (elapsed, requests)
    }
}

/// A line of kubectl's `-v=6` log that records one HTTP request.
fn is_request_line(line: &str) -> bool {
    let Some((_, rest)) = line.split_once("round_trippers.go:") else {
        return false;
    };
    let after = rest.split_once("] ").map(|(_, r)| r).unwrap_or("");
    ["GET ", "PATCH ", "POST ", "PUT ", "DELETE "]
        .iter()
        .any(|verb| after.starts_with(verb))
}

struct Round {
    previewd_first: Duration,
    previewd_unchanged: Duration,
    previewd_unchanged_requests: u64,
    kubectl_first: Duration,
    kubectl_unchanged: Duration,
    kubectl_unchanged_requests: usize,
}

async fn benchmark() {
    let cluster = support::shared();
    let client = support::client().await;
    let requests = Arc::new(AtomicU64::new(0));
    let counted = counting_client(&cluster.kubeconfig_path, requests.clone()).await;
    let (trigger, _reconciles) = tokio::sync::mpsc::unbounded_channel();
    let store = ObservedStore::new(counted.clone(), trigger);
    let applier = Applier::new(counted, store, ClusterMetrics::new(), 16);
    let kubectl = Kubectl {
        kubeconfig: cluster.kubeconfig_path.clone(),
        cache_dir: tempfile::tempdir().expect("kubectl cache dir"),
    };
    kubectl.run(&["api-resources"]); // fills kubectl's discovery cache

    // previewd cold: a controller's very first apply (discovery and watches start here).
    let cold_namespace = support::create_namespace(&client, "bench-cold").await;
    let objects = boutique_objects(&cold_namespace);
    let started = Instant::now();
    let refs: Vec<&Value> = objects.iter().collect();
    let stats = applier.apply(&refs, false).await.expect("cold apply");
    let cold = started.elapsed();
    assert_eq!(stats.sent, 35);

    let mut namespaces = vec![cold_namespace];
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let previewd_namespace = support::create_namespace(&client, "bench-previewd").await;
        let kubectl_namespace = support::create_namespace(&client, "bench-kubectl").await;
        namespaces.extend([previewd_namespace.clone(), kubectl_namespace.clone()]);
        let ours = boutique_objects(&previewd_namespace);
        let theirs = boutique_objects(&kubectl_namespace);
        let file = tempfile::NamedTempFile::new().expect("manifest file");
        let documents: Vec<String> = theirs
            .iter()
            .map(|o| serde_yaml_ng::to_string(o).unwrap())
            .collect();
        std::fs::write(file.path(), documents.join("---\n")).expect("write manifests");
        let kubectl_apply = [
            "apply",
            "--server-side",
            "--field-manager=previewd-bench",
            "-n",
            kubectl_namespace.as_str(),
            "-f",
            file.path().to_str().unwrap(),
        ];
        let ours_refs: Vec<&Value> = ours.iter().collect();
        let previewd_apply = || async {
            let before = requests.load(Ordering::Relaxed);
            let started = Instant::now();
            let stats = applier
                .apply(&ours_refs, false)
                .await
                .expect("previewd apply");
            (
                started.elapsed(),
                requests.load(Ordering::Relaxed) - before,
                stats,
            )
        };
        let (previewd_first, kubectl_first) = if round % 2 == 0 {
            let (ours, _, _) = previewd_apply().await;
            (ours, kubectl.run(&kubectl_apply).0)
        } else {
            let theirs = kubectl.run(&kubectl_apply).0;
            (previewd_apply().await.0, theirs)
        };
        let (previewd_unchanged, previewd_unchanged_requests, stats) = previewd_apply().await;
        assert_eq!(stats.sent, 0, "an unchanged re-apply sends nothing");
        let (kubectl_unchanged, kubectl_unchanged_requests) = kubectl.run(&kubectl_apply);
        rounds.push(Round {
            previewd_first,
            previewd_unchanged,
            previewd_unchanged_requests,
            kubectl_first,
            kubectl_unchanged,
            kubectl_unchanged_requests,
        });
    }

    let median = |pick: fn(&Round) -> Duration| {
        let mut values: Vec<Duration> = rounds.iter().map(pick).collect();
        values.sort();
        values[values.len() / 2]
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let previewd_first = median(|r| r.previewd_first);
    let kubectl_first = median(|r| r.kubectl_first);
    let previewd_unchanged = median(|r| r.previewd_unchanged);
    let kubectl_unchanged = median(|r| r.kubectl_unchanged);
    println!(
        "Online Boutique, 35 objects, {ROUNDS} rounds, medians (same control plane, same run):"
    );
    println!(
        "  first apply      previewd {:8.1} ms   kubectl --server-side {:8.1} ms   previewd is {:.1}x faster",
        ms(previewd_first),
        ms(kubectl_first),
        kubectl_first.as_secs_f64() / previewd_first.as_secs_f64()
    );
    println!(
        "  unchanged again  previewd {:8.3} ms, {} requests   kubectl {:8.1} ms, {} requests",
        ms(previewd_unchanged),
        rounds
            .iter()
            .map(|r| r.previewd_unchanged_requests)
            .max()
            .unwrap(),
        ms(kubectl_unchanged),
        rounds[0].kubectl_unchanged_requests,
    );
    println!(
        "  previewd's cold first apply (discovery and watches started in it): {:.1} ms",
        ms(cold)
    );
    println!(
        "  rounds (previewd/kubectl first apply, ms): {}",
        rounds
            .iter()
            .map(|r| format!("{:.0}/{:.0}", ms(r.previewd_first), ms(r.kubectl_first)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    for namespace in namespaces {
        let _ = api.delete(&namespace, &Default::default()).await;
    }
}
