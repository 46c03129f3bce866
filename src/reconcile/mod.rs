//! The reconciler: turns a `PreviewEnvironment` into a running, seeded namespace, and removes
//! the namespace when the environment is deleted.
//!
//! [`pipeline`] reads top to bottom as the steps of one reconcile, one file per step with a
//! body: [`resolve`] → [`hold`] → [`checks`] (pure) → [`plan`] (pure) → [`waves`] (apply) → [`prune`] →
//! [`status`] (pure) → [`coalesce`] (pure: may the write wait?) → [`write`]. [`cleanup`] is the finalizer's side. [`controller`] runs the
//! watches and wraps each reconcile; [`context`] is what every step is given. Only the applier,
//! the status writer, Events and the finalizer write to the API server, and none of them writes
//! when nothing changed.

mod access;
mod apply;
mod checks;
mod claim;
mod cleanup;
mod coalesce;
pub mod config;
mod context;
mod controller;
pub mod databases;
pub mod dry_run;
pub mod error;
mod finish;
mod hold;
pub mod metrics;
mod namespace;
mod pipeline;
mod prune;
mod quarantine;
pub(crate) mod queue;
pub mod remote;
mod renders;
mod resolve;
mod schedule;
mod secrets;
pub mod status;
mod template_status;
mod volumes;
mod waves;
mod write;

pub use config::{ControllerConfig, DEFAULT_MAX_BYTES, DEFAULT_MAX_OBJECTS, EnvironmentAccess};
pub use context::Context;
pub use controller::run;
pub use error::ReconcileError;

use crate::cluster::metrics::ClusterMetrics;
use crate::forge::metrics::ForgeMetrics;
use metrics::ReconcileMetrics;

/// The metrics the controller writes to: its own, the cluster layer's (applies and writes),
/// and the forge's (the reporter's calls).
#[derive(Clone, Default)]
pub struct ControllerMetrics {
    pub reconcile: ReconcileMetrics,
    pub cluster: ClusterMetrics,
    pub forge: ForgeMetrics,
}
