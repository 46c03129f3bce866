//! A real Kubernetes control plane on loopback: etcd, kube-apiserver (bearer-token auth, RBAC,
//! service-account keys), kube-controller-manager and kube-scheduler, on ports chosen free at
//! run time, with data in a temporary folder that is removed when it stops.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::config::Kubeconfig;

use super::SandboxError;
use super::process::{self, ManagedProcess};
use super::provision::Binaries;

/// The range services get their cluster IPs from.
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// Prefix of data folders, followed by the owner's pid (so dead owners' folders can be swept).
const DATA_DIR_PREFIX: &str = "previewd-sandbox-";

/// The audit policy of a control plane started with `audit_writes`: one line per create, update
/// or patch of a PreviewEnvironment or its status, a ConfigMap, a Deployment or its status, by
/// anyone (what a push writes on its way to `Ready`, and the controller manager's rollout
/// status); nothing else. Each line holds when the API server received the request and when it
/// answered (`requestReceivedTimestamp`, `stageTimestamp`, microseconds).
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch"]
    resources:
      - group: previewd.dev
        resources: ["previewenvironments", "previewenvironments/status"]
      - group: ""
        resources: ["configmaps"]
      - group: apps
        resources: ["deployments", "deployments/status"]
  - level: None
"#;

/// A running control plane. Dropping it stops every process and removes its data.
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    api_url: String,
    // Stopped in this order on drop: dependants first, etcd last.
    processes: Vec<ManagedProcess>,
    started_in: Duration,
    binaries: Binaries,
    audit_log: Option<PathBuf>,
}

/// Ports of one control plane.
#[derive(Clone, Copy, Debug)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl Ports {
    fn pick() -> Result<Self, SandboxError> {
        // Hold all listeners until every port is chosen, so the five are distinct.
        let listeners: Vec<TcpListener> = (0..5)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(|e| SandboxError::Process(format!("cannot find a free loopback port: {e}")))?;
        let port = |i: usize| listeners[i].local_addr().map(|a| a.port()).unwrap_or(0);
        Ok(Self {
            etcd_client: port(0),
            etcd_peer: port(1),
            apiserver: port(2),
            controller_manager: port(3),
            scheduler: port(4),
        })
    }
}

impl ControlPlane {
    /// Starts the control plane and waits until the apiserver answers `/readyz` and the
    /// `default` namespace's service account exists (pods can then be created). With
    /// `audit_writes`, the API server logs the writes [`AUDIT_POLICY`] names.
    pub async fn start(binaries: &Binaries, audit_writes: bool) -> Result<Self, SandboxError> {
        // A port picked free can be taken by someone else before our process binds it
        // (several test binaries start control planes at once); such a start is retried.
        let mut last_error = None;
        for _ in 0..3 {
            match Self::start_once(binaries, audit_writes).await {
                Ok(plane) => return Ok(plane),
                Err(e @ SandboxError::PortTaken(_)) => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.expect("three attempts were made"))
    }

    async fn start_once(binaries: &Binaries, audit_writes: bool) -> Result<Self, SandboxError> {
        let started = Instant::now();
        sweep_stale_data_dirs();
        let dir = make_data_dir()?;
        process::stop_all_at_exit(&dir);
        let ports = Ports::pick()?;
        let token = random_hex(16)?;
        write_credentials(&dir, &token)?;
        let audit_log = audit_writes.then(|| write_audit_policy(&dir)).transpose()?;

        let mut processes = Vec::new();
        let etcd = ManagedProcess::spawn(
            "etcd",
            &binaries.etcd,
            &etcd_args(&dir, &ports),
            &dir.join("etcd.log"),
        )?;
        processes.insert(0, etcd);

        let mut args = apiserver_args(&dir, &ports);
        if let Some(log) = &audit_log {
            args.extend(audit_args(&dir, log));
        }
        let apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &binaries.apiserver,
            &args,
            &dir.join("apiserver.log"),
        )?;
        processes.insert(0, apiserver);

        let api_url = format!("https://127.0.0.1:{}", ports.apiserver);
        let kubeconfig_path = dir.join("kubeconfig");
        let mut plane = Self {
            dir: dir.clone(),
            kubeconfig_path: kubeconfig_path.clone(),
            kubeconfig: Kubeconfig::default(),
            api_url: api_url.clone(),
            processes,
            started_in: Duration::ZERO,
            binaries: binaries.clone(),
            audit_log,
        };
        plane.wait_for_apiserver_certificate().await?;
        let kubeconfig_text = kubeconfig_yaml(&api_url, &token, &dir.join("certs/apiserver.crt"))?;
        std::fs::write(&kubeconfig_path, &kubeconfig_text)
            .map_err(|e| SandboxError::io(&kubeconfig_path, e))?;
        plane.kubeconfig = Kubeconfig::from_yaml(&kubeconfig_text).map_err(|e| {
            SandboxError::Process(format!("generated kubeconfig does not parse: {e}"))
        })?;
        plane.wait_ready().await?;

        let controller_manager = ManagedProcess::spawn(
            "kube-controller-manager",
            &binaries.controller_manager,
            &controller_manager_args(&dir, &kubeconfig_path, &ports),
            &dir.join("controller-manager.log"),
        )?;
        plane.processes.insert(0, controller_manager);
        let scheduler = ManagedProcess::spawn(
            "kube-scheduler",
            &binaries.scheduler,
            &scheduler_args(&kubeconfig_path, &ports),
            &dir.join("scheduler.log"),
        )?;
        plane.processes.insert(0, scheduler);
        plane.wait_for_default_service_account().await?;
        plane.started_in = started.elapsed();
        Ok(plane)
    }

    /// Path of a kubeconfig (admin, bearer token) for this control plane.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The folder with the kubeconfig, logs and data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The binaries it runs, and the kubectl of the same release.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The API server's audit log (JSON lines, written at least once a second), when started
    /// with `audit_writes`.
    pub fn audit_log_path(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// How long the start took, from nothing to pods being creatable.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A client for this control plane, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<kube::Client, SandboxError> {
        client_from_kubeconfig(self.kubeconfig.clone()).await
    }

    /// A process of the control plane by name (`kube-apiserver`, `etcd`, …), for fault tests.
    pub fn process_mut(&mut self, name: &str) -> Option<&mut ManagedProcess> {
        self.processes.iter_mut().find(|p| p.name() == name)
    }

    /// Starts the process `name` again (after a fault test killed it through
    /// [`ControlPlane::process_mut`]) with the same arguments and data; for the apiserver,
    /// returns once it answers `/readyz` again.
    pub async fn start_again(&mut self, name: &str) -> Result<(), SandboxError> {
        let process = self
            .process_mut(name)
            .ok_or_else(|| SandboxError::Process(format!("no process named {name}")))?;
        process.start_again()?;
        if name == "kube-apiserver" {
            self.wait_ready().await?;
        }
        Ok(())
    }

    /// Stops everything (scheduler, controller-manager, apiserver, etcd) and removes the data.
    pub fn stop(mut self) {
        self.stop_processes();
    }

    fn stop_processes(&mut self) {
        for mut process in self.processes.drain(..) {
            process.stop(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The apiserver writes its self-signed certificate before it serves; the kubeconfig
    /// embeds it, so wait for the file (and fail early when the process dies).
    async fn wait_for_apiserver_certificate(&mut self) -> Result<(), SandboxError> {
        let cert = self.dir.join("certs/apiserver.crt");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            self.check_alive()?;
            if std::fs::metadata(&cert)
                .map(|m| m.len() > 0)
                .unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(50)).await; // let the write finish
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(self.failure("kube-apiserver wrote no certificate within 60 s"))
    }

    async fn wait_ready(&mut self) -> Result<(), SandboxError> {
        let client = self.client().await?;
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            self.check_alive()?;
            // `send` rather than `request_text`: the 500s of a starting apiserver are expected
            // here and should not be logged as client errors.
            let request = http::Request::get("/readyz")
                .body(kube::client::Body::empty())
                .expect("static request");
            if let Ok(response) = client.send(request).await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(self.failure("kube-apiserver was not ready within 90 s"))
    }

    /// Pods can be created once their namespace's `default` service account exists (the
    /// service-account admission plugin refuses them before); the controller-manager makes it.
    /// Their tokens are projected at run time since Kubernetes 1.24: no token Secret to wait for.
    async fn wait_for_default_service_account(&mut self) -> Result<(), SandboxError> {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let client = self.client().await?;
        let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client, "default");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            self.check_alive()?;
            if let Ok(Some(_)) = accounts.get_opt("default").await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(self.failure("the controller-manager created no default service account within 60 s"))
    }

    fn check_alive(&mut self) -> Result<(), SandboxError> {
        let dead = self.processes.iter_mut().find_map(|p| {
            p.exited()
                .map(|status| (p.name().to_string(), status, p.log_tail(15)))
        });
        match dead {
            None => Ok(()),
            Some((name, status, tail)) if tail.contains("address already in use") => Err(
                SandboxError::PortTaken(format!("{name} exited ({status}): {tail}")),
            ),
            Some((name, status, tail)) => Err(SandboxError::Process(format!(
                "{name} exited ({status}); last lines of its log ({}):\n{tail}",
                self.dir.display()
            ))),
        }
    }

    fn failure(&self, what: &str) -> SandboxError {
        let tails: Vec<String> = self
            .processes
            .iter()
            .map(|p| {
                format!(
                    "--- {} ({})\n{}",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(10)
                )
            })
            .collect();
        SandboxError::Process(format!("{what}\n{}", tails.join("\n")))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_processes();
    }
}

/// A kube client from a kubeconfig, honouring its current context.
async fn client_from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Client, SandboxError> {
    crate::cluster::client::from_kubeconfig(kubeconfig)
        .await
        .map_err(|e| SandboxError::Process(e.to_string()))
}

fn etcd_args(dir: &Path, ports: &Ports) -> Vec<String> {
    vec![
        format!("--data-dir={}", dir.join("etcd").display()),
        format!(
            "--listen-client-urls=http://127.0.0.1:{}",
            ports.etcd_client
        ),
        format!(
            "--advertise-client-urls=http://127.0.0.1:{}",
            ports.etcd_client
        ),
        format!("--listen-peer-urls=http://127.0.0.1:{}", ports.etcd_peer),
        format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{}",
            ports.etcd_peer
        ),
        format!(
            "--initial-cluster=default=http://127.0.0.1:{}",
            ports.etcd_peer
        ),
        "--log-level=warn".into(),
    ]
}

fn controller_manager_args(dir: &Path, kubeconfig_path: &Path, ports: &Ports) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig_path.display()),
        "--leader-elect=false".into(),
        format!("--secure-port={}", ports.controller_manager),
        "--bind-address=127.0.0.1".into(),
        format!(
            "--service-account-private-key-file={}",
            dir.join("sa.key").display()
        ),
        format!(
            "--root-ca-file={}",
            dir.join("certs/apiserver.crt").display()
        ),
        "--use-service-account-credentials=false".into(),
        // No cloud, no kubelet: keep the node lifecycle controller's defaults but let a
        // test's namespace deletion and GC happen quickly.
        "--concurrent-namespace-syncs=10".into(),
        "--concurrent-gc-syncs=20".into(),
    ]
}

fn scheduler_args(kubeconfig_path: &Path, ports: &Ports) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig_path.display()),
        "--leader-elect=false".into(),
        format!("--secure-port={}", ports.scheduler),
        "--bind-address=127.0.0.1".into(),
    ]
}

fn apiserver_args(dir: &Path, ports: &Ports) -> Vec<String> {
    vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
        format!("--secure-port={}", ports.apiserver),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        // Current servers refuse a loopback address for the `kubernetes` Service's endpoints;
        // nothing runs in the sandbox's pods that would call the API through it.
        "--endpoint-reconciler-type=none".into(),
        format!("--cert-dir={}", dir.join("certs").display()),
        format!("--token-auth-file={}", dir.join("tokens.csv").display()),
        "--authorization-mode=RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        format!(
            "--service-account-key-file={}",
            dir.join("sa.pub").display()
        ),
        format!(
            "--service-account-signing-key-file={}",
            dir.join("sa.key").display()
        ),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--allow-privileged=true".into(),
        // No kubelet answers on the nodes' addresses; never try to reach one.
        "--kubelet-preferred-address-types=InternalIP".into(),
    ]
}

/// Writes [`AUDIT_POLICY`] into `dir`; returns where the audit log will be.
fn write_audit_policy(dir: &Path) -> Result<PathBuf, SandboxError> {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).map_err(|e| SandboxError::io(&policy, e))?;
    Ok(dir.join("audit.log"))
}

/// The API server's flags for an audit log at `log`. The file is written in batches (`batch`:
/// the API server still checks the policy and builds each event as it serves), at least once a
/// second so that a benchmark reads them soon after; the log is not rotated below 1 GiB.
fn audit_args(dir: &Path, log: &Path) -> Vec<String> {
    vec![
        format!(
            "--audit-policy-file={}",
            dir.join("audit-policy.yaml").display()
        ),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".into(),
        "--audit-log-mode=batch".into(),
        "--audit-log-batch-max-wait=1s".into(),
        "--audit-log-maxsize=1024".into(),
    ]
}

/// The admin token (group system:masters) and the service-account signing keys.
fn write_credentials(dir: &Path, token: &str) -> Result<(), SandboxError> {
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, format!("{token},admin,admin,\"system:masters\"\n"))
        .map_err(|e| SandboxError::io(&tokens, e))?;
    let key = dir.join("sa.key");
    let public = dir.join("sa.pub");
    openssl(&["genrsa", "-out", &key.to_string_lossy(), "2048"])?;
    openssl(&[
        "rsa",
        "-in",
        &key.to_string_lossy(),
        "-pubout",
        "-out",
        &public.to_string_lossy(),
    ])
}

fn openssl(args: &[&str]) -> Result<(), SandboxError> {
    let output = Command::new("openssl").args(args).output().map_err(|e| {
        SandboxError::Process(format!("cannot run openssl (apt-get install openssl): {e}"))
    })?;
    if !output.status.success() {
        return Err(SandboxError::Process(format!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

fn kubeconfig_yaml(api_url: &str, token: &str, ca_file: &Path) -> Result<String, SandboxError> {
    use base64::Engine as _;
    let ca = std::fs::read(ca_file).map_err(|e| SandboxError::io(ca_file, e))?;
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: previewd-sandbox\n  cluster:\n    server: {api_url}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: previewd-sandbox\n  context:\n    cluster: previewd-sandbox\n    user: admin\n    namespace: default\ncurrent-context: previewd-sandbox\n",
        base64::engine::general_purpose::STANDARD.encode(&ca)
    ))
}

/// Data lives in memory (/dev/shm) where there is one: etcd fsyncs on every write.
fn make_data_dir() -> Result<PathBuf, SandboxError> {
    let base = data_dir_base();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DATA_DIR_PREFIX}{}-", std::process::id()))
        .tempdir_in(&base)
        .map_err(|e| SandboxError::io(&base, e))?
        .keep();
    Ok(dir)
}

fn data_dir_base() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    let writable = tempfile::tempdir_in(&shm).is_ok();
    if writable { shm } else { std::env::temp_dir() }
}

/// Removes data folders left by sandboxes whose process is gone (killed with SIGKILL).
pub fn sweep_stale_data_dirs() {
    let Ok(entries) = std::fs::read_dir(data_dir_base()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix(DATA_DIR_PREFIX) else {
            continue;
        };
        let owner = rest
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok());
        if owner.is_some_and(|pid| !process::pid_alive(pid)) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `bytes` random bytes from the kernel, as hex (tokens, secrets).
pub(super) fn random_hex(bytes: usize) -> Result<String, SandboxError> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buffer))
        .map_err(|e| SandboxError::io(Path::new("/dev/urandom"), e))?;
    Ok(hex::encode(buffer))
}
