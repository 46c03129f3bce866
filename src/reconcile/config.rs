//! Settings of the reconciler, from `runtime::config` (flags) or a test.

use std::time::Duration;

use crate::engines::EngineConfig;
use crate::forge::budget::ContentLimits;
use crate::forge::client::ApiDefaults;
use crate::model::footprint::Prices;
use crate::model::grants::OperatorPolicy;
use crate::model::kinds::TemplateKinds;

pub use crate::plan::{DEFAULT_MAX_BYTES, DEFAULT_MAX_OBJECTS};

/// How long a namespace terminates before previewd says what holds it: Kubernetes removes an
/// ordinary environment's objects in seconds; minutes mean a finalizer or a stuck controller.
pub const DEFAULT_NAMESPACE_HOLD_GRACE: Duration = Duration::from_secs(300);

/// The default of `--reconcile-concurrency`. Unbounded, a restart or a failover reconciled every
/// environment at once, each holding its rendered plan: at 400 environments that doubled
/// previewd's memory for a few seconds, and gained nothing, since their requests queue for the
/// API client's bound anyway (`--api-concurrency`).
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 32;

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Watch only this namespace's templates and environments (all namespaces if `None`).
    pub namespace: Option<String>,
    /// Environments reconciled at once; the others wait their turn (kube's runner never runs
    /// two reconciles of one environment together).
    pub reconcile_concurrency: u16,
    /// Server-side applies in flight at once within a wave.
    pub apply_concurrency: usize,
    /// How often every environment is reconciled again with nothing having triggered it. The
    /// reconcile compares with the watch and sends nothing unless something drifted.
    pub resync_interval: Duration,
    /// How often each environment is re-applied in full regardless of the apply cache; `None`
    /// (the default) never does. The watch already shows drift in every field previewd sets,
    /// so a blind re-apply only costs writes for environments that did not change.
    pub reapply_interval: Option<Duration>,
    /// A template that renders more objects than this is refused (a runaway loop in a
    /// template, or a hostile one, must not flood the API server).
    pub max_objects: usize,
    /// A template whose objects take more bytes than this (as JSON) is refused.
    pub max_bytes: usize,
    /// How long a removed environment's namespace may terminate before previewd says, on the
    /// environment, in its PR comment and in `previewd_namespace_holds_total`, what holds it.
    pub namespace_hold_grace: Duration,
    /// The kinds templates may create (`--template-kinds`); anything else is refused.
    pub template_kinds: TemplateKinds,
    /// What template Roles may grant and which Ingress annotations templates may set
    /// (`--template-role-rules`, `--ingress-annotations`); anything else is refused.
    pub operator_policy: OperatorPolicy,
    /// The Helm program and the render time limit (`--helm`, `--render-timeout`).
    pub engines: EngineConfig,
    /// The role previewd binds to itself in each environment namespace it creates, when its
    /// RBAC confines writes to those namespaces (the chart); `None` with a kubeconfig that may
    /// already write everywhere (the sandbox, a developer's cluster).
    pub environment_access: Option<EnvironmentAccess>,
    /// Where templates that name no `forge.apiUrl` send their calls (the public forges; the
    /// sandbox: its forge stand-in).
    pub forge_api_defaults: ApiDefaults,
    /// Whether previewd's wake gate answers for sleeping hosts (`--gate-listen`): then a
    /// sleeping environment's routes are withdrawn, and its URL leads to the gate.
    pub gate_answers: bool,
    /// The operator's prices (`--price-per-core-hour`, `--price-per-gib-hour`): the comment
    /// shows the footprint's cost with them.
    pub prices: Option<Prices>,
    /// The content-creating requests previewd sends per GitHub App installation or token, or
    /// GitLab token (`--forge-content-per-minute`, `--forge-content-per-hour`).
    pub content_limits: ContentLimits,
    /// Placing environments on registered clusters (`PreviewCluster`s).
    pub placement: PlacementConfig,
    /// A database per environment on registered servers (`PreviewDatabaseServer`s).
    pub databases: super::databases::DatabaseConfig,
}

/// Who previewd is, and which ClusterRole gives it its rights in an environment namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentAccess {
    pub cluster_role: String,
    pub service_account_namespace: String,
    pub service_account_name: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            reconcile_concurrency: DEFAULT_RECONCILE_CONCURRENCY,
            apply_concurrency: 16,
            resync_interval: Duration::from_secs(600),
            reapply_interval: None,
            max_objects: DEFAULT_MAX_OBJECTS,
            max_bytes: DEFAULT_MAX_BYTES,
            namespace_hold_grace: DEFAULT_NAMESPACE_HOLD_GRACE,
            template_kinds: TemplateKinds::default(),
            operator_policy: OperatorPolicy::default(),
            engines: EngineConfig::default(),
            environment_access: None,
            forge_api_defaults: ApiDefaults::default(),
            gate_answers: false,
            prices: None,
            content_limits: ContentLimits::default(),
            placement: Default::default(),
            databases: Default::default(),
        }
    }
}

/// How placement runs (`--cluster-credentials-namespace` and its timings).
#[derive(Clone, Debug)]
pub struct PlacementConfig {
    /// previewd's own namespace, where the clusters' kubeconfig Secrets are. `None`: placement
    /// is off, and a template with a `placement` says so.
    pub credentials_namespace: Option<String>,
    /// How often each registered cluster is looked at (its API server asked one small list).
    pub look_interval: Duration,
    /// How long a cluster may fail to answer before it is said to be unreachable (no new
    /// environments, the comment says so). Its environments are never removed for it.
    pub unreachable_grace: Duration,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            credentials_namespace: None,
            look_interval: Duration::from_secs(10),
            unreachable_grace: Duration::from_secs(30),
        }
    }
}
