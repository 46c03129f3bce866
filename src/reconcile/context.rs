//! Everything a reconcile needs, built once at start-up ([`Context`]), and the little the
//! reconciler remembers between reconciles of the same environment ([`Memory`]).
//!
//! Nothing here is needed for correctness after a restart: the cluster holds the durable state.
//! The memory only avoids double counting (a commit timed Ready twice) and paces retries.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::ObjectRef;

use super::config::ControllerConfig;
use super::metrics::ReconcileMetrics;
use crate::cluster::applier::Applier;
use crate::cluster::caches::Caches;
use crate::cluster::writer::Writer;
use crate::engines::Engines;
use crate::forge::report::Reporter;
use crate::forge::repository::RepositoryManifests;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate, Timings};

/// The key of an environment in the reconciler's memory.
pub type EnvironmentRef = ObjectRef<PreviewEnvironment>;

pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub metrics: ReconcileMetrics,
    /// Sends (and counts) the writes the reconciler makes itself: status, Events, deletes.
    pub writer: Writer,
    pub applier: Applier,
    /// Templates and environments as the controller's own watches see them.
    pub caches: Caches,
    /// Keeps the PR comment, commit status and deployment status in line with each environment.
    pub reporter: Arc<Reporter>,
    /// Manifests read from repositories, by commit.
    pub repository_manifests: RepositoryManifests,
    /// Helm, with its render limits and the cache of what it rendered.
    pub engines: Engines,
    /// Asks for a reconcile of an environment: used to start queued environments as soon as a
    /// slot frees up.
    pub(super) reconcile_trigger: tokio::sync::mpsc::UnboundedSender<EnvironmentRef>,
    pub(super) recorder: Recorder,
    pub(super) memory: Memory,
}

impl Context {
    /// Waits until the template and environment caches hold the cluster's state.
    pub async fn wait_for_caches(&self) {
        self.caches.wait_until_ready().await;
    }

    /// The environment's template, from the watch cache.
    pub fn template_of(&self, environment: &PreviewEnvironment) -> Option<Arc<PreviewTemplate>> {
        use kube::ResourceExt;
        self.caches.template(
            &environment.namespace().unwrap_or_default(),
            &environment.spec.template,
        )
    }
}

/// What this process remembers per environment between reconciles.
#[derive(Default)]
pub struct Memory {
    /// When each running seed Job (`namespace/job`) was first seen running.
    pub seed_started: Locked<String, Instant>,
    /// The Ready timings this process last wrote. The next reconcile can run before the cache
    /// shows that write; without this it would declare the same commit Ready a second time (a
    /// new `readyAt`, a second time-to-Ready observation).
    pub ready_timings: Locked<EnvironmentRef, Timings>,
    /// Failed reconciles in a row, for the backoff.
    pub failures: Locked<EnvironmentRef, u32>,
    /// When each environment was last re-applied in full (`--reapply-interval`).
    pub last_full_apply: Locked<EnvironmentRef, Instant>,
    /// When this process last wrote each environment's status after a reconcile
    /// ([`super::coalesce`]).
    pub last_status_write: Locked<EnvironmentRef, Instant>,
}

impl Memory {
    /// Forgets an environment that is gone.
    pub fn forget(&self, environment: &EnvironmentRef) {
        self.ready_timings.lock().remove(environment);
        self.failures.lock().remove(environment);
        self.last_full_apply.lock().remove(environment);
        self.last_status_write.lock().remove(environment);
    }

    /// Counts a failure; returns how long to wait before the next attempt: 2 s, doubling, at
    /// most 256 s (the attempt count is capped before shifting, so it cannot overflow).
    pub fn backoff_after_failure(&self, environment: &EnvironmentRef) -> (u32, Duration) {
        let mut failures = self.failures.lock();
        let attempt = failures.entry(environment.clone()).or_insert(0);
        *attempt = attempt.saturating_add(1);
        let delay = Duration::from_secs(1u64 << (*attempt).min(8)).min(Duration::from_secs(300));
        (*attempt, delay)
    }
}

/// A map behind a mutex that survives a panic elsewhere (poisoning is ignored: every value is
/// a plain record, valid whatever the panicking thread was doing).
pub struct Locked<K, V>(Mutex<HashMap<K, V>>);

impl<K, V> Default for Locked<K, V> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash, V> Locked<K, V> {
    pub fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
