//! Benchmark: previewd's apply of the Online Boutique (35 objects) against
//! `kubectl apply --server-side` of the same objects, on the same control plane, in one run.
//!
//! Run with `cargo bench --bench apply` (a release build; the sandbox starts itself, or set
//! `PREVIEWD_TEST_KUBECONFIG` to use another cluster). It prints figures and fails only when
//! something breaks, never because a machine is slow.
//!
//! Each round deploys into four fresh namespaces, one per contestant, rotating who goes first:
//! - previewd cold: a new client and applier, so discovery, the TLS handshake and the watches
//!   start inside the measured apply (a controller's first apply after start-up);
//! - previewd warm: the applier of earlier rounds (discovery done, watches running);
//! - `kubectl apply --server-side`: a new process per apply, as a CI job or a script runs it,
//!   with its discovery cache filled;
//! - the floor: the bare kube client sending the same 35 server-side applies, 16 in flight, with
//!   no previewd logic (no render, no cache, no watches): what the API server costs.
//!
//! Then each applies the same objects again, unchanged. Requests are counted on the wire: for
//! previewd by a layer in its HTTP client (which also records each response's HTTP version),
//! for kubectl from its `-v=6` request log, asserted to match the object count.

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiResource, Discovery};
use kube::runtime::reflector::ObjectRef;
use previewd::cluster::applier::Applier;
use previewd::cluster::metrics::ClusterMetrics;
use previewd::cluster::observed::ObservedStore;
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};
use serde_json::Value;

const ROUNDS: usize = 5;
const OBJECTS: usize = 35;
/// In flight at once, for previewd's applier and for the floor alike.
const CONCURRENCY: usize = 16;

fn main() {
    support::run_benchmark(benchmark());
}

/// What a counting client saw on the wire: requests sent, and responses by HTTP version.
#[derive(Default)]
struct Wire {
    requests: AtomicU64,
    versions: Mutex<BTreeMap<String, u64>>,
}

/// A client that counts every HTTP request it sends and the HTTP version of every answer.
async fn counting_client(kubeconfig: &Path, wire: Arc<Wire>) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    let sent = wire.clone();
    let count = tower::util::MapRequestLayer::new(move |request| {
        sent.requests.fetch_add(1, Ordering::Relaxed);
        request
    });
    let version = tower::util::MapResponseLayer::new(
        move |response: http::Response<Box<kube::client::DynBody>>| {
            let mut versions = wire.versions.lock().expect("versions lock");
            *versions
                .entry(format!("{:?}", response.version()))
                .or_default() += 1;
            response
        },
    );
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&count)
        .with_layer(&version)
        .build()
}

/// The receiver of the reconcile triggers the watches send: the benchmark reconciles nothing,
/// but the watches run only while someone holds it.
type Triggers = tokio::sync::mpsc::UnboundedReceiver<ObjectRef<PreviewEnvironment>>;

/// A fresh applier on a fresh client: discovery, connections and watches all start in its
/// first apply.
async fn new_applier(kubeconfig: &Path, wire: Arc<Wire>) -> (Applier, Triggers) {
    let counted = counting_client(kubeconfig, wire).await;
    let (trigger, reconciles) = tokio::sync::mpsc::unbounded_channel();
    let store = ObservedStore::new(counted.clone(), trigger);
    let applier = Applier::new(counted, store, ClusterMetrics::new(), CONCURRENCY);
    (applier, reconciles)
}

/// The Online Boutique example rendered for `namespace`, exactly as previewd sends it.
fn boutique_objects(namespace: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/online-boutique");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect("example file");
    let template: PreviewTemplate = serde_yaml_ng::from_str(&read("template.yaml")).unwrap();
    let environment: PreviewEnvironment =
        serde_yaml_ng::from_str(&read("environment.yaml")).unwrap();
    let context =
        previewd::plan::values::render_context(&environment, &template.spec, namespace).unwrap();
    let labels: BTreeMap<String, String> =
        previewd::model::metadata::environment_labels(&environment, &template);
    // The release's 35 objects (the template's first manifest), as every earlier run of this
    // benchmark measured; the example's Ingress (its second manifest) is left out.
    let release = &template.spec.manifests.inline[..1];
    let objects = previewd::plan::render::render(release, &template.spec.seeds, &context, &labels)
        .expect("the example renders");
    objects.into_iter().map(|o| o.object).collect()
}

struct Kubectl {
    kubeconfig: std::path::PathBuf,
    cache_dir: tempfile::TempDir,
}

impl Kubectl {
    /// Runs kubectl; returns (wall time, requests sent, of which PATCH).
    fn run(&self, args: &[&str]) -> (Duration, usize, usize) {
        let started = Instant::now();
        let output = Command::new(support::tools::kubectl())
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
        let requests: Vec<&str> = log.lines().filter_map(request_verb).collect();
        let patches = requests.iter().filter(|verb| **verb == "PATCH").count();
        (elapsed, requests.len(), patches)
    }

    /// `kubectl version --client`, e.g. `v1.37.2`.
    fn version(&self) -> String {
        let output = Command::new(support::tools::kubectl())
            .args(["version", "--client", "-o", "json"])
            .output()
            .expect("run kubectl version");
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        answer["clientVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("unknown")
            .to_string()
    }
}

/// The verb of a line of kubectl's `-v=6` log that records one HTTP request.
fn request_verb(line: &str) -> Option<&'static str> {
    let (_, rest) = line.split_once("round_trippers.go:")?;
    const VERBS: [&str; 5] = ["GET", "PATCH", "POST", "PUT", "DELETE"];
    // kubectl from 1.30 logs structured pairs: `"Response" verb="PATCH" url=… status=…`.
    if let Some((_, after)) = rest.split_once("\"Response\" verb=\"") {
        return VERBS
            .into_iter()
            .find(|verb| after.starts_with(&format!("{verb}\"")));
    }
    // Older kubectl: `] PATCH https://… 200 OK in 3 milliseconds`.
    let after = rest.split_once("] ").map(|(_, r)| r).unwrap_or("");
    VERBS
        .into_iter()
        .find(|verb| after.starts_with(&format!("{verb} ")))
}

/// The floor: the same server-side applies from the bare kube client, no previewd logic.
struct Floor {
    client: Client,
    resources: BTreeMap<(String, String), ApiResource>,
}

impl Floor {
    /// Resolves every kind of the objects once, before anything is timed.
    async fn new(client: Client, objects: &[Value]) -> Self {
        let discovery = Discovery::new(client.clone())
            .run()
            .await
            .expect("discovery");
        let mut resources = BTreeMap::new();
        for object in objects {
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            let kind = object["kind"].as_str().unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
            let (resource, _) = discovery.resolve_gvk(&gvk).expect("a served kind");
            resources.insert((api_version.to_string(), kind.to_string()), resource);
        }
        Self { client, resources }
    }

    async fn apply(&self, objects: &[Value]) -> Duration {
        let started = Instant::now();
        let params = PatchParams::apply("previewd-bench-floor").force();
        let sends = objects.iter().map(|object| {
            let key = (
                object["apiVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                object["kind"].as_str().unwrap_or_default().to_string(),
            );
            let api: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
                &self.resources[&key],
            );
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let params = params.clone();
            async move { api.patch(&name, &params, &Patch::Apply(object)).await }
        });
        let answers: Vec<_> = futures::stream::iter(sends)
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let elapsed = started.elapsed();
        for answer in answers {
            answer.expect("floor apply");
        }
        elapsed
    }
}

/// One contestant's figures in one round: first apply, then the same objects again.
#[derive(Clone, Copy, Default)]
struct Pair {
    first: Duration,
    unchanged: Duration,
}

/// Picks one contestant's pair out of a round.
type PickPair = fn(&Round) -> Pair;

#[derive(Default)]
struct Round {
    cold: Pair,
    warm: Pair,
    kubectl: Pair,
    floor: Pair,
}

/// A manifest file of `objects` for kubectl.
fn manifest_file(objects: &[Value]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("manifest file");
    let documents: Vec<String> = objects
        .iter()
        .map(|o| serde_yaml_ng::to_string(o).unwrap())
        .collect();
    std::fs::write(file.path(), documents.join("---\n")).expect("write manifests");
    file
}

/// previewd's applier on `objects`: (wall time, requests on the wire, applies sent).
async fn previewd_apply(
    applier: &Applier,
    wire: &Wire,
    objects: &[Value],
) -> (Duration, u64, usize) {
    let refs: Vec<&Value> = objects.iter().collect();
    let before = wire.requests.load(Ordering::Relaxed);
    let started = Instant::now();
    let stats = applier.apply(&refs, false).await.expect("previewd apply");
    let elapsed = started.elapsed();
    (
        elapsed,
        wire.requests.load(Ordering::Relaxed) - before,
        stats.sent,
    )
}

/// Median, minimum and maximum in ms.
fn spread(values: impl Iterator<Item = Duration>) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = values.map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[0], ms[ms.len() - 1])
}

async fn benchmark() {
    let cluster = support::shared();
    let kubeconfig = cluster.kubeconfig_path.clone();
    let client = support::client().await;
    let kubectl = Kubectl {
        kubeconfig: kubeconfig.clone(),
        cache_dir: tempfile::tempdir().expect("kubectl cache dir"),
    };
    kubectl.run(&["api-resources"]); // fills kubectl's discovery cache
    let kubectl_version = kubectl.version();

    // The warm applier has deployed once before the rounds; the floor has resolved its kinds.
    let warm_wire = Arc::new(Wire::default());
    let (warm, _warm_triggers) = new_applier(&kubeconfig, warm_wire.clone()).await;
    let warmup_namespace = support::create_namespace(&client, "bench-warmup").await;
    let warmup = boutique_objects(&warmup_namespace);
    previewd_apply(&warm, &warm_wire, &warmup).await;
    let floor = Floor::new(client.clone(), &warmup).await;

    let mut namespaces = vec![warmup_namespace];
    let mut rounds = Vec::new();
    let mut kubectl_requests = (0, 0);
    for round in 0..ROUNDS {
        let mut figures = Round::default();
        for turn in 0..4 {
            let contestant = (round + turn) % 4;
            let namespace = support::create_namespace(&client, "bench-apply").await;
            namespaces.push(namespace.clone());
            let objects = boutique_objects(&namespace);
            assert_eq!(objects.len(), OBJECTS);
            match contestant {
                0 => {
                    let wire = Arc::new(Wire::default());
                    let (cold, _cold_triggers) = new_applier(&kubeconfig, wire.clone()).await;
                    let (first, _, sent) = previewd_apply(&cold, &wire, &objects).await;
                    assert_eq!(sent, OBJECTS);
                    let (unchanged, requests, sent) = previewd_apply(&cold, &wire, &objects).await;
                    assert_eq!(
                        (requests, sent),
                        (0, 0),
                        "an unchanged re-apply sends nothing"
                    );
                    figures.cold = Pair { first, unchanged };
                }
                1 => {
                    let (first, requests, sent) = previewd_apply(&warm, &warm_wire, &objects).await;
                    assert_eq!(
                        (requests, sent),
                        (OBJECTS as u64, OBJECTS),
                        "one request per object"
                    );
                    let (unchanged, requests, sent) =
                        previewd_apply(&warm, &warm_wire, &objects).await;
                    assert_eq!(
                        (requests, sent),
                        (0, 0),
                        "an unchanged re-apply sends nothing"
                    );
                    figures.warm = Pair { first, unchanged };
                }
                2 => {
                    let file = manifest_file(&objects);
                    let apply = [
                        "apply",
                        "--server-side",
                        "--field-manager=previewd-bench",
                        "-n",
                        namespace.as_str(),
                        "-f",
                        file.path().to_str().unwrap(),
                    ];
                    let (first, requests, patches) = kubectl.run(&apply);
                    assert_eq!(
                        patches, OBJECTS,
                        "kubectl's log shows one PATCH per object ({requests} requests)"
                    );
                    let (unchanged, requests, patches) = kubectl.run(&apply);
                    assert_eq!(
                        patches, OBJECTS,
                        "kubectl re-sends every object ({requests} requests)"
                    );
                    kubectl_requests = (requests, patches);
                    figures.kubectl = Pair { first, unchanged };
                }
                _ => {
                    let first = floor.apply(&objects).await;
                    let unchanged = floor.apply(&objects).await;
                    figures.floor = Pair { first, unchanged };
                }
            }
        }
        rounds.push(figures);
    }
    report(&rounds, &kubectl_version, kubectl_requests, &warm_wire);

    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    for namespace in namespaces {
        let _ = api.delete(&namespace, &Default::default()).await;
    }
}

fn report(rounds: &[Round], kubectl_version: &str, kubectl_requests: (usize, usize), wire: &Wire) {
    let floor_first = spread(rounds.iter().map(|r| r.floor.first)).0;
    let floor_unchanged = spread(rounds.iter().map(|r| r.floor.unchanged)).0;
    println!(
        "Online Boutique, {OBJECTS} objects, {ROUNDS} rounds, same control plane, same run; ms as median (min-max):"
    );
    println!(
        "  {:<40} {:>24} {:>24}",
        "", "first apply", "same objects again"
    );
    let rows: [(&str, PickPair); 4] = [
        ("previewd, cold (new client, watches)", |r| r.cold),
        ("previewd, warm (a running controller)", |r| r.warm),
        ("kubectl apply --server-side (process)", |r| r.kubectl),
        ("floor: bare kube client, 16 in flight", |r| r.floor),
    ];
    for (name, pick) in rows {
        let first = spread(rounds.iter().map(|r| pick(r).first));
        let unchanged = spread(rounds.iter().map(|r| pick(r).unchanged));
        println!(
            "  {name:<40} {:>7.1} ({:.0}-{:.0}) {:>5.2}x floor {:>7.1} ({:.0}-{:.0}) {:>6.2}x floor",
            first.0,
            first.1,
            first.2,
            first.0 / floor_first,
            unchanged.0,
            unchanged.1,
            unchanged.2,
            unchanged.0 / floor_unchanged,
        );
    }
    let versions = wire.versions.lock().expect("versions lock");
    println!(
        "  requests for the same objects again: previewd 0 (asserted), kubectl {} ({} PATCH, asserted = {OBJECTS}), floor {OBJECTS}",
        kubectl_requests.0, kubectl_requests.1
    );
    println!("  kubectl: {kubectl_version}; previewd's responses by HTTP version: {versions:?}");
}
