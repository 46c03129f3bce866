//! How a reconcile can end other than in success.
//!
//! Two kinds, kept apart on purpose:
//! * a [`Refusal`]: the template or the environment asks for something that cannot or may not
//!   be done (template missing, manifests unreadable, a render error, too many objects, a guard
//!   rule, an object the API server refuses). It is written on the environment as a `Degraded`
//!   status that says what and where, and nothing of that render is applied;
//! * a [`ReconcileError`]: something on the way failed (the API server, the forge). It is
//!   retried with backoff and counted under its [`ReconcileError::metric_label`].

use crate::cluster::applier::ApplyError;
use crate::cluster::errors::in_words;
use crate::forge::template_client::ForgeCallError;

/// Errors of one reconcile, each from its own step.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("applying: {0}")]
    Apply(#[source] ApplyError),
    #[error("claiming the namespace: {}", in_words(.0))]
    Claim(#[source] kube::Error),
    #[error("checking previewd's access to the namespace: {}", in_words(.0))]
    Grant(#[source] kube::Error),
    #[error("previewd's RoleBinding in namespace {0} is not in force after 10 s")]
    GrantNotInForce(String),
    #[error("reading the environment's secrets: {}", in_words(.0))]
    Secrets(#[source] kube::Error),
    #[error("reading the cluster's storage classes: {}", in_words(.0))]
    StorageClasses(#[source] kube::Error),
    #[error("pruning: {}", in_words(.0))]
    Prune(#[source] kube::Error),
    #[error("writing status: {}", in_words(.0))]
    Status(#[source] kube::Error),
    #[error("reading the environment: {}", in_words(.0))]
    Read(#[source] kube::Error),
    #[error("deleting the namespace: {}", in_words(.0))]
    Cleanup(#[source] kube::Error),
    #[error("namespace {0} is still terminating")]
    NamespaceTerminating(String),
    /// Removal waits on the registered cluster the environment runs on: its record there is
    /// being removed, or the cluster does not answer.
    #[error("{0}")]
    RemovalOnCluster(String),
    /// A database server did not answer or refused (retried with backoff; branches kept).
    #[error("{0}")]
    Database(String),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// A manifest engine (Helm) could not be run (missing, or no room for its folder), or a
    /// chart repository did not answer.
    #[error("running a manifest engine: {0}")]
    Engine(#[source] crate::engines::EngineError),
    /// The status was written; only the report to the forge failed (retried with backoff).
    #[error("reporting to the forge: {0}")]
    Forge(#[source] ForgeCallError),
    /// The environment's placement could not be written (its cluster annotation).
    #[error("placing the environment: {}", in_words(.0))]
    Placement(#[source] kube::Error),
    /// A record could not be written into, or removed from, the cluster the environment runs
    /// on (that cluster's API server; retried with backoff, the environment kept as it is).
    #[error("cluster {cluster}: {}", in_words(.error))]
    Target {
        cluster: String,
        #[source]
        error: kube::Error,
    },
    /// The namespace is gone but the forge has not heard yet: the record waits (for a while,
    /// see `cleanup::FORGE_PATIENCE_AFTER_DELETION`) and tries again when the forge allows.
    #[error("telling the forge the environment is gone: {0}")]
    ForgeNotTold(#[source] ForgeCallError),
}

/// Every value [`ReconcileError::metric_label`] can take: the metric starts each at 0, so that
/// `rate()` and alerts see a zero rather than no series before the first error.
pub const ERROR_CATEGORIES: [&str; 6] =
    ["apply", "prune", "status", "cleanup", "finalizer", "forge"];

impl ReconcileError {
    /// A static category for the `previewd_reconcile_errors_total` label (one of
    /// [`ERROR_CATEGORIES`]).
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Apply(_)
            | ReconcileError::Claim(_)
            | ReconcileError::Grant(_)
            | ReconcileError::GrantNotInForce(_)
            | ReconcileError::Secrets(_)
            | ReconcileError::StorageClasses(_)
            | ReconcileError::Engine(_)
            | ReconcileError::Target { .. } => "apply",
            ReconcileError::Prune(_) => "prune",
            ReconcileError::Status(_) | ReconcileError::Read(_) | ReconcileError::Placement(_) => {
                "status"
            }
            ReconcileError::Cleanup(_)
            | ReconcileError::NamespaceTerminating(_)
            | ReconcileError::RemovalOnCluster(_) => "cleanup",
            ReconcileError::Database(_) => "database",
            ReconcileError::Finalizer(_) => "finalizer",
            ReconcileError::Forge(_) | ReconcileError::ForgeNotTold(_) => "forge",
        }
    }
}

/// Why an environment cannot be deployed as asked: the reason (a `Ready=False` condition
/// reason) and a message that names the object, file or rule.
#[derive(Debug)]
pub struct Refusal {
    pub reason: RefusalReason,
    pub message: String,
    /// Set when the refusal also fails the reconcile, so that it is retried with backoff (the
    /// API server refused an object: a template edit or a cluster change may fix it).
    pub retry: Option<Box<ReconcileError>>,
    /// Set when the input exhausted a render worker or an engine: the commit is set aside
    /// (`super::quarantine`) with this record, which the pipeline completes.
    pub quarantine: Option<Box<crate::model::crd::Quarantine>>,
    /// The objects the guard or the content policy refused, each with its reason (the message
    /// joins them): `previewd render` says each object's verdict.
    pub violations: Vec<crate::plan::guard::Violation>,
}

pub use crate::model::refusal::RefusalReason;

impl Refusal {
    pub fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            retry: None,
            quarantine: None,
            violations: Vec::new(),
        }
    }
}

/// A refusal of the plan (`crate::plan`): what the render or its objects may not be.
impl From<crate::plan::Refused> for Refusal {
    fn from(refused: crate::plan::Refused) -> Self {
        Refusal {
            violations: refused.violations,
            ..Refusal::new(refused.reason, refused.message)
        }
    }
}

/// What stops a reconcile's pipeline early: a refusal to write down, or an error to retry.
#[derive(Debug)]
pub enum Stop {
    Refused(Refusal),
    Failed(ReconcileError),
}

impl From<Refusal> for Stop {
    fn from(refusal: Refusal) -> Self {
        Stop::Refused(refusal)
    }
}

impl From<ReconcileError> for Stop {
    fn from(error: ReconcileError) -> Self {
        Stop::Failed(error)
    }
}
