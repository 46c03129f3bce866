//! Test support: one real control plane per test binary (or the cluster named by
//! `PREVIEWD_TEST_KUBECONFIG`), a fresh namespace per test, cleanup and a dump of what the
//! namespace held when a test fails.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use previewd::sandbox::{NodeSimulatorConfig, Sandbox, SandboxOptions, StderrProgress};

pub mod apiserver;
pub mod apps;
pub mod audit;
pub mod clusters;
pub mod contents;
pub mod gate;
pub mod layers;
pub mod postgres;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod tools;
pub mod webhooks;

/// The cluster every test in this binary shares.
pub struct SharedCluster {
    pub kubeconfig_path: PathBuf,
    /// pid of the sandbox's kube-apiserver; `None` on an external cluster.
    pub apiserver_pid: Option<u32>,
    /// Whether pods are run by the node simulator (they are on the sandbox).
    pub simulated_nodes: bool,
    /// The API server's audit log of writes, when asked for by [`audit_writes`] before the start.
    pub audit_log: Option<PathBuf>,
    /// Requests to the thread that owns the sandbox (fault tests); `None` on an external cluster.
    control: Option<tokio::sync::mpsc::UnboundedSender<ClusterRequest>>,
}

/// What a fault test asks of the sandbox's control plane, answered once done.
enum ClusterRequest {
    KillApiserver(tokio::sync::oneshot::Sender<()>),
    StartApiserver(tokio::sync::oneshot::Sender<Result<(), String>>),
}

/// SIGKILLs the sandbox's kube-apiserver (etcd keeps the data). Panics on an external cluster.
pub async fn kill_apiserver() {
    shared().kill_apiserver().await
}

/// Starts the killed kube-apiserver again; returns once it is ready.
pub async fn start_apiserver() {
    shared().start_apiserver().await
}

impl SharedCluster {
    /// SIGKILLs this sandbox's kube-apiserver (etcd keeps the data).
    pub async fn kill_apiserver(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.control()
            .send(ClusterRequest::KillApiserver(tx))
            .unwrap();
        rx.await.expect("the sandbox thread answered");
    }

    /// Starts this sandbox's killed kube-apiserver again; returns once it is ready.
    pub async fn start_apiserver(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.control()
            .send(ClusterRequest::StartApiserver(tx))
            .unwrap();
        rx.await
            .expect("the sandbox thread answered")
            .unwrap_or_else(|e| panic!("the apiserver did not come back: {e}"));
    }

    /// A client for this cluster, bound to the calling test's runtime.
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig_path).expect("read the kubeconfig");
        previewd::cluster::client::from_kubeconfig(kubeconfig)
            .await
            .expect("test client")
    }

    fn control(&self) -> &tokio::sync::mpsc::UnboundedSender<ClusterRequest> {
        self.control
            .as_ref()
            .expect("fault tests need the sandbox (PREVIEWD_TEST_KUBECONFIG is set)")
    }
}

/// Where the built control plane and engines are cached: `PREVIEWD_CACHE_DIR` as `previewd
/// sandbox --cache-dir` reads it, else the sandbox's default.
pub fn cache_dir() -> PathBuf {
    previewd::sandbox::cli::cache_dir_from_environment()
}

/// How many nodes the shared cluster's simulator registers (default 2, 250 pods each); a
/// benchmark that needs more pods sets it before the cluster starts.
static SIMULATED_NODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(2);

/// Asks for `nodes` simulated nodes; effective only before the first [`shared`].
#[allow(dead_code)] // only the scale benchmark needs more than the default
pub fn simulate_nodes(nodes: usize) {
    SIMULATED_NODES.store(nodes.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// Whether the shared cluster's API server keeps an audit log of writes (off by default).
static AUDIT_WRITES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks for the shared cluster's audit log ([`SharedCluster::audit_log`]); effective only before
/// the first [`shared`].
#[allow(dead_code)] // only the scale benchmark reads the audit log
pub fn audit_writes() {
    AUDIT_WRITES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The shared cluster, started on first use. The sandbox lives on a thread of its own with its
/// own runtime (each `#[tokio::test]` has a runtime that ends with the test), and is stopped by
/// previewd's exit hook when the test binary exits.
pub fn shared() -> &'static SharedCluster {
    static SHARED: OnceLock<SharedCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        previewd::install_crypto_provider();
        if let Some(path) = std::env::var_os("PREVIEWD_TEST_KUBECONFIG") {
            return SharedCluster {
                kubeconfig_path: path.into(),
                apiserver_pid: None,
                simulated_nodes: false,
                audit_log: None,
                control: None,
            };
        }
        start_sandbox(
            SIMULATED_NODES.load(std::sync::atomic::Ordering::Relaxed),
            AUDIT_WRITES.load(std::sync::atomic::Ordering::Relaxed),
        )
    })
}

/// A second control plane of its own (started on first use, for the tests that place
/// environments on two clusters); never an external cluster.
pub fn second() -> &'static SharedCluster {
    static SECOND: OnceLock<SharedCluster> = OnceLock::new();
    SECOND.get_or_init(|| {
        previewd::install_crypto_provider();
        start_sandbox(1, false)
    })
}

/// Starts a sandbox with `nodes` simulated nodes on a thread of its own, which keeps it
/// running (and answers its fault requests) until the process ends.
fn start_sandbox(nodes: usize, audit_writes: bool) -> SharedCluster {
    let (tx, rx) = std::sync::mpsc::channel();
    let (control, mut requests) = tokio::sync::mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("test-sandbox".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("sandbox runtime");
            runtime.block_on(async move {
                let options = SandboxOptions {
                    cache_dir: cache_dir(),
                    nodes: NodeSimulatorConfig {
                        nodes,
                        ..NodeSimulatorConfig::default()
                    },
                    audit_writes,
                };
                match Sandbox::start(options, Arc::new(StderrProgress)).await {
                    Ok(mut sandbox) => {
                        let pid = sandbox
                            .control_plane_mut()
                            .process_mut("kube-apiserver")
                            .and_then(|p| p.pid());
                        let audit_log = sandbox
                            .control_plane()
                            .audit_log_path()
                            .map(Path::to_path_buf);
                        let kubeconfig = sandbox.kubeconfig_path().to_path_buf();
                        let _ = tx.send(Ok((kubeconfig, pid, audit_log)));
                        // The sender lives in a static: this loop runs until the process ends.
                        while let Some(request) = requests.recv().await {
                            let plane = sandbox.control_plane_mut();
                            match request {
                                ClusterRequest::KillApiserver(done) => {
                                    if let Some(p) = plane.process_mut("kube-apiserver") {
                                        p.kill();
                                    }
                                    let _ = done.send(());
                                }
                                ClusterRequest::StartApiserver(done) => {
                                    let result = plane
                                        .start_again("kube-apiserver")
                                        .await
                                        .map_err(|e| e.to_string());
                                    let _ = done.send(result);
                                }
                            }
                        }
                        drop(sandbox);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        })
        .expect("spawn the sandbox thread");
    let (kubeconfig_path, apiserver_pid, audit_log) = rx
        .recv()
        .expect("sandbox thread answered")
        .unwrap_or_else(|e| panic!("the test control plane did not start: {e}"));
    SharedCluster {
        kubeconfig_path,
        apiserver_pid,
        simulated_nodes: true,
        audit_log,
        control: Some(control),
    }
}

/// A client for the shared cluster, bound to the calling test's runtime.
pub async fn client() -> Client {
    log_for_failures();
    let path = shared().kubeconfig_path.clone();
    let kubeconfig = Kubeconfig::read_from(&path).expect("read the test kubeconfig");
    previewd::cluster::client::from_kubeconfig(kubeconfig)
        .await
        .expect("test client")
}

/// The connection settings of the shared cluster, for a test that builds a client of its own
/// (e.g. with a layer that watches or holds its requests).
pub async fn shared_config() -> kube::Config {
    let kubeconfig =
        Kubeconfig::read_from(&shared().kubeconfig_path).expect("read the test kubeconfig");
    previewd::cluster::client::config_from_kubeconfig(kubeconfig)
        .await
        .expect("test kube config")
}

/// The built-in template kinds plus `extra` (`{"group", "kind", "resource"[, "inert"]}` each),
/// as the operator's `--template-kinds` would give them.
pub fn template_kinds_and(extra: &[serde_json::Value]) -> previewd::model::kinds::TemplateKinds {
    let mut kinds = serde_json::to_value(previewd::model::kinds::DEFAULT_TEMPLATE_KINDS).unwrap();
    kinds.as_array_mut().unwrap().extend_from_slice(extra);
    previewd::model::kinds::TemplateKinds::parse(&kinds.to_string()).unwrap()
}

/// A kubeconfig that acts as `user` in `groups`: the admin token of the shared cluster,
/// impersonating (written into `dir`).
pub fn impersonating_kubeconfig(user: &str, groups: &[String], dir: &std::path::Path) -> PathBuf {
    let admin = std::fs::read_to_string(&shared().kubeconfig_path).unwrap();
    let mut kubeconfig: serde_json::Value = serde_yaml_ng::from_str(&admin).unwrap();
    for entry in kubeconfig["users"].as_array_mut().unwrap() {
        entry["user"]["as"] = serde_json::json!(user);
        entry["user"]["as-groups"] = serde_json::json!(groups);
    }
    let path = dir.join("impersonating.kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

/// A client that acts as ServiceAccount `name` of `namespace` (impersonated by the admin).
pub async fn client_as_service_account(namespace: &str, name: &str) -> Client {
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_string(),
    ];
    let scratch = tempfile::tempdir().unwrap();
    let path = impersonating_kubeconfig(&user, &groups, scratch.path());
    previewd::cluster::client::from_kubeconfig(Kubeconfig::read_from(&path).unwrap())
        .await
        .unwrap()
}

/// What previewd logs during the tests goes to the test's captured output, shown only for a
/// failing test: the evidence for a failure seen only under load, in CI's log. Info level by
/// default; `PREVIEWD_TEST_LOG` (an `EnvFilter`, e.g. `previewd=debug,kube_runtime=debug`) says
/// more. The benchmarks (no test harness: nothing is captured) log only when asked: a line per
/// delivery on their output would cost the throughput they measure. They are told by the
/// `--bench` argument `cargo bench` gives them, not by `cfg(test)`, which cargo sets for bench
/// targets too (the webhooks benchmark logged every delivery at 39186fb: docs/performance.md).
fn log_for_failures() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let benchmark = std::env::args().any(|argument| argument == "--bench");
        let filter = match std::env::var("PREVIEWD_TEST_LOG") {
            Ok(filter) => filter,
            Err(_) if benchmark => return,
            Err(_) => "previewd=info".into(),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .with_test_writer()
            .try_init();
    });
}

/// What previewd logs on the calling thread while the guard lives, as JSON lines (info and
/// above): a `#[tokio::test]` runs its tasks on its own thread, so this is what the test's own
/// controller, sweeper or server said, and nothing of another test's.
pub fn capture_logs() -> (tracing::subscriber::DefaultGuard, CapturedLogs) {
    let captured = CapturedLogs::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::new("previewd=info"))
        .with_writer(move || writer.clone())
        .finish();
    (tracing::subscriber::set_default(subscriber), captured)
}

/// The log lines [`capture_logs`] collected.
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLogs {
    pub fn lines(&self) -> Vec<serde_json::Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `test` in a fresh namespace named after it; on failure prints what the namespace
/// held; deletes the namespace afterwards either way.
pub async fn in_namespace<F, Fut>(test_name: &str, test: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let _running = activity().read().await;
    in_namespace_with_quiet_windows(test_name, test).await;
}

/// Held for reading by every test of this binary while it runs (`in_namespace`), and for writing
/// by a test that counts the API server's requests (`quiet_window`): the server's counters have
/// no namespace label, so a count is only clean while no other test of the binary writes.
fn activity() -> &'static tokio::sync::RwLock<()> {
    static ACTIVITY: OnceLock<tokio::sync::RwLock<()>> = OnceLock::new();
    ACTIVITY.get_or_init(|| tokio::sync::RwLock::new(()))
}

/// Waits until no other test of this binary runs and holds them off until the guard is dropped.
/// Only for tests run by `in_namespace_with_quiet_windows` (one run by `in_namespace` would wait
/// for itself).
pub async fn quiet_window() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    activity().write().await
}

/// `in_namespace` for a test that opens a `quiet_window`.
pub async fn in_namespace_with_quiet_windows<F, Fut>(test_name: &str, test: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = client().await;
    let namespace = create_namespace(&client, test_name).await;
    let outcome = std::panic::AssertUnwindSafe(test(client.clone(), namespace.clone()))
        .catch_unwind()
        .await;
    if outcome.is_err() {
        dump_namespace(&client, &namespace).await;
    }
    let namespaces: Api<Namespace> = Api::all(client);
    let _ = namespaces
        .delete(&namespace, &DeleteParams::default())
        .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

pub async fn create_namespace(client: &Client, test_name: &str) -> String {
    let suffix: String = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let base: String = test_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!(
        "t-{}-{}",
        &base[..base.len().min(40)].trim_end_matches('-'),
        &suffix[suffix.len() - 6..]
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"previewd.dev/test": "true"}}
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the test namespace");
    wait_for_default_service_account(client, &name).await;
    name
}

/// Pods cannot be created before the namespace's `default` service account exists (its
/// tokens are projected at run time since Kubernetes 1.24). The controller manager makes it,
/// but after the API server was restarted (the chaos tests restart it) its watches can take
/// longer than a test should wait to come back: then the test makes the account itself, as
/// the controller would (an account already made meanwhile is as good).
async fn wait_for_default_service_account(client: &Client, namespace: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    for _ in 0..50 {
        if let Ok(Some(_)) = accounts.get_opt("default").await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("default".into());
    match accounts
        .create(&kube::api::PostParams::default(), &account)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("namespace {namespace} has no default service account: {error}"),
    }
}

/// Prints events, pods, deployments and jobs of a namespace (for failed tests).
pub async fn dump_namespace(client: &Client, namespace: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Event, Pod};
    eprintln!("===== what namespace {namespace} held when the test failed =====");
    let lp = ListParams::default();
    if let Ok(events) = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    {
        for e in events.items.iter().rev().take(40) {
            eprintln!(
                "event {} {}: {} {}",
                e.involved_object.kind.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            );
        }
    }
    if let Ok(pods) = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    {
        for p in pods.items {
            let status = p.status.clone().unwrap_or_default();
            eprintln!(
                "pod {} node={:?} phase={:?}",
                p.name_any(),
                p.spec.and_then(|s| s.node_name),
                status.phase
            );
        }
    }
    if let Ok(deployments) = Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    {
        for d in deployments.items {
            eprintln!(
                "deployment {} status={}",
                d.name_any(),
                serde_json::to_string(&d.status).unwrap_or_default()
            );
        }
    }
    if let Ok(jobs) = Api::<Job>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
    {
        for j in jobs.items {
            eprintln!(
                "job {} status={}",
                j.name_any(),
                serde_json::to_string(&j.status).unwrap_or_default()
            );
        }
    }
    eprintln!("===== end of dump =====");
}

/// A controller running on the calling test's runtime: its context (caches, forge reporter)
/// and the metrics registry it writes to.
pub struct Running {
    pub context: Arc<previewd::reconcile::Context>,
    pub metrics: Arc<previewd::runtime::metrics::Metrics>,
}

/// `running.reporter`, `running.caches`, … reach the controller's context.
impl std::ops::Deref for Running {
    type Target = previewd::reconcile::Context;
    fn deref(&self) -> &Self::Target {
        &self.context
    }
}

impl Running {
    /// A webhook server state sharing the controller's caches, forge clients and metrics.
    pub fn server_state(
        &self,
        client: &Client,
        max_body_bytes: usize,
    ) -> Arc<previewd::webhook::server::ServerState> {
        previewd::webhook::server::ServerState::new(
            client.clone(),
            self.context.caches.clone(),
            Arc::new(previewd::forge::access::WriteAccess::new(
                self.context.reporter.clients().clone(),
            )),
            self.metrics.server(),
            previewd::webhook::server::DeliveryLimits::with_max_body(max_body_bytes),
        )
    }

    /// A sweeper sharing the controller's caches and metrics, for `namespace`.
    pub fn sweeper(
        &self,
        client: &Client,
        namespace: &str,
    ) -> previewd::lifecycle::sweeper::Sweeper {
        sweeper_of(&self.context, &self.metrics, client, namespace)
    }
}

/// A sweeper sharing `context`'s caches and `metrics`, for `namespace`.
pub fn sweeper_of(
    context: &previewd::reconcile::Context,
    metrics: &previewd::runtime::metrics::Metrics,
    client: &Client,
    namespace: &str,
) -> previewd::lifecycle::sweeper::Sweeper {
    previewd::lifecycle::sweeper::Sweeper {
        client: client.clone(),
        caches: context.caches.clone(),
        metrics: metrics.sweep.clone(),
        writes: metrics.cluster.clone(),
        watch_namespace: Some(namespace.to_string()),
    }
}

/// Starts previewd's controller for `namespace` on the calling test's runtime.
pub async fn start_controller(client: &Client, namespace: &str) -> Running {
    let config = previewd::reconcile::ControllerConfig {
        namespace: Some(namespace.to_string()),
        ..Default::default()
    };
    start_controller_with(client, config).await
}

/// Starts previewd's controller with `config` on the calling test's runtime. Its templates
/// render in the built `previewd` (by default the controller's own program, here the test's).
pub async fn start_controller_with(
    client: &Client,
    mut config: previewd::reconcile::ControllerConfig,
) -> Running {
    config.engines.worker = std::path::PathBuf::from(env!("CARGO_BIN_EXE_previewd"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let metrics = Arc::new(previewd::runtime::metrics::Metrics::new());
    tokio::spawn(previewd::reconcile::run(
        client.clone(),
        config,
        metrics.controller(),
        Some(tx),
    ));
    let context = rx.await.expect("controller context");
    Running { context, metrics }
}

/// Polls `check` every 250 ms until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The field managers that have written `object` (its `managedFields`): who changed it.
pub fn field_managers<K: kube::Resource>(object: &K) -> Vec<&str> {
    object
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.as_deref())
        .collect()
}

/// The fixture folder shared by the project (`../shared/fixtures`).
pub fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures")
        .join(path)
}

/// Parses a multi-document YAML file into JSON objects (empty documents skipped).
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| serde_json::Value::deserialize(doc).expect("valid YAML document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Server-side applies arbitrary objects into `namespace`, resolving each kind through discovery.
pub async fn apply_all(client: &Client, namespace: &str, objects: &[serde_json::Value]) {
    use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
    use kube::discovery::pinned_kind;
    for object in objects {
        let api_version = object["apiVersion"].as_str().expect("apiVersion");
        let kind = object["kind"].as_str().expect("kind");
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = pinned_kind(client, &gvk).await.expect("kind is served");
        let api: Api<DynamicObject> = match capabilities.scope {
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
            kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
        };
        api.patch(
            name,
            &PatchParams::apply("previewd-tests").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {kind}/{name}: {e}"));
    }
}

/// Waits until environment `name` reaches `phase`.
pub async fn wait_for_phase(
    api: &Api<previewd::model::crd::PreviewEnvironment>,
    name: &str,
    phase: previewd::model::crd::Phase,
    timeout: Duration,
) -> previewd::model::crd::PreviewEnvironment {
    eventually(&format!("{name} to be {phase:?}"), timeout, || {
        let api = api.clone();
        async move {
            api.get(name)
                .await
                .ok()
                .filter(|e| e.status.as_ref().is_some_and(|s| s.phase == phase))
        }
    })
    .await
}

/// The message of environment `name`'s `Ready` condition once its reason is `reason`.
#[allow(dead_code)] // not every test binary waits for a refusal
pub async fn ready_reason(
    api: &Api<previewd::model::crd::PreviewEnvironment>,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> String {
    eventually(&format!("{name}: {reason}"), timeout, || {
        let api = api.clone();
        async move {
            let status = api.get(name).await.ok()?.status?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (ready.reason == reason).then(|| ready.message.clone())
        }
    })
    .await
}

/// A benchmark's setting: the environment variable `name` parsed, else `default`.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs a benchmark's body on a multi-threaded runtime (benchmarks have no test harness).
pub fn run_benchmark<F: Future>(benchmark: F) -> F::Output {
    previewd::install_crypto_provider();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("benchmark runtime")
        .block_on(benchmark)
}
