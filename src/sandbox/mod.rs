//! The local sandbox: a real Kubernetes control plane and a node simulator on this machine,
//! for people trying previewd out (`previewd sandbox`) and for the integration tests.
//!
//! * [`versions`]: the one place that pins Kubernetes, etcd and Helm.
//! * [`provision`]: finds those binaries (`KUBEBUILDER_ASSETS`, PATH) or builds them once from
//!   their Go modules ([`go_build`]) and caches them; [`machine`]: programs, Debian packages,
//!   build locks and progress lines.
//! * [`control_plane`]: starts and stops those processes on free loopback ports.
//! * [`node_simulator`]: registers Nodes and plays kubelet for the pods bound to them.
//! * [`example_templates`]: generates the `online-boutique` example template from the fixture app.
//! * [`process`]: children that never outlive previewd.
//! * [`forge_standin`]: a local GitHub and GitLab API that reports what previewd sends, and
//!   serves [`repositories`]: the examples' chart and overlay, and folders of one's own.
//! * [`helm`]: the `helm` the sandbox runs: the one `--helm` names, or the pinned one.
//! * [`playground`]: example templates, fresh webhook credentials, deliveries to `curl`.
//! * [`demo`]: `previewd sandbox --demo`, a pull request's life played from the fixtures.
//! * [`cli`]: the sandbox's flags; [`session`]: one `previewd sandbox` run from start to stop.
//! * [`dry_run`]: `previewd render`, what previewd would apply, with no cluster.

pub mod cli;
pub mod control_plane;
pub mod database;
pub mod demo;
pub mod dry_run;
pub mod example_templates;
mod forge_contents;
mod forge_relay;
pub mod forge_standin;
pub mod go_build;
pub mod helm;
pub mod ingress;
pub mod machine;
pub mod node_simulator;
pub mod playground;
pub mod postgres;
pub mod process;
pub mod provision;
pub mod repositories;
pub mod session;
pub mod versions;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use control_plane::ControlPlane;
pub use machine::{Progress, StderrProgress};
pub use node_simulator::{NodeSimulator, NodeSimulatorConfig};
pub use provision::Binaries;

/// What can go wrong while provisioning or running the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("provisioning the sandbox: {0}")]
    Provision(String),
    #[error("building the control plane: {0}")]
    Build(String),
    #[error("sandbox process: {0}")]
    Process(String),
    /// A port chosen free was taken before our process bound it; the start is retried.
    #[error("a sandbox port was taken by another process: {0}")]
    PortTaken(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the sandbox control plane: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::error::Error),
}

impl SandboxError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Options of a sandbox start.
#[derive(Clone, Debug)]
pub struct SandboxOptions {
    /// Where the built control-plane binaries are cached (`~/.cache/previewd`).
    pub cache_dir: PathBuf,
    pub nodes: NodeSimulatorConfig,
    /// Whether the API server keeps an audit log of the writes on a push's way to `Ready`
    /// ([`ControlPlane::audit_log_path`]), for benchmarks that split a path into the API
    /// server's time and the time between its answers.
    pub audit_writes: bool,
}

/// A control plane with simulated nodes and previewd's CRDs installed.
pub struct Sandbox {
    // Field order is drop order: stop simulating before the control plane goes away.
    node_simulator: NodeSimulator,
    control_plane: ControlPlane,
}

impl Sandbox {
    /// Provisions (first time only), starts the control plane and the node simulator, and
    /// installs the CRDs. Building takes minutes the first time, so it runs off the async
    /// threads.
    pub async fn start(
        options: SandboxOptions,
        progress: std::sync::Arc<dyn Progress>,
    ) -> Result<Self, SandboxError> {
        let cache_dir = options.cache_dir.clone();
        let binaries = tokio::task::spawn_blocking(move || {
            provision::ensure_binaries(&cache_dir, progress.as_ref())
        })
        .await
        .map_err(|e| SandboxError::Provision(format!("provisioning task failed: {e}")))??;
        let control_plane = ControlPlane::start(&binaries, options.audit_writes).await?;
        let client = control_plane.client().await?;
        install_crds(&client).await?;
        let node_simulator = NodeSimulator::start(client, options.nodes).await?;
        Ok(Self {
            node_simulator,
            control_plane,
        })
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    pub fn control_plane_mut(&mut self) -> &mut ControlPlane {
        &mut self.control_plane
    }

    pub fn node_names(&self) -> &[String] {
        self.node_simulator.node_names()
    }

    pub fn kubeconfig_path(&self) -> &Path {
        self.control_plane.kubeconfig_path()
    }
}

/// Server-side applies previewd's CRDs and waits until the API server serves them.
pub async fn install_crds(client: &kube::Client) -> Result<(), SandboxError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(crate::model::metadata::FIELD_MANAGER_RECONCILE).force();
    for crd in crate::model::crd::all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &params, &Patch::Apply(&crd)).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let current = crds.get(&name).await?;
            let established = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(SandboxError::Process(format!(
                    "CRD {name} was not established within 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
