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
use super::renders::renderer::{ForgeAccess, Renderer, RepositoryFiles};
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
    /// Which storage classes keep their volumes (read when a plan has claims).
    pub storage_classes: crate::cluster::storage_classes::StorageClasses,
    /// The registered clusters environments are placed on, and the connections to them.
    pub hub: super::remote::hub::Hub,
    /// The registered database servers and previewd's connections to them.
    pub databases: super::databases::Databases,
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
    /// What `environment`'s render depends on ([`inputs_of`]), with its template from the cache.
    pub fn inputs_of(&self, environment: &PreviewEnvironment) -> String {
        inputs_of(environment, self.template_of(environment).as_deref())
    }

    /// What the render steps need of this context: its engines, their render counter, and the
    /// repository read with each template's own forge token.
    pub fn renderer(&self) -> Renderer<'_> {
        Renderer {
            engines: &self.engines,
            renders: &self.metrics.engine_renders,
            files: RepositoryFiles {
                access: ForgeAccess::Template(self.reporter.clients()),
                kept: &self.repository_manifests,
            },
        }
    }

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
    seed_started: Locked<String, Instant>,
    /// The Ready timings this process last wrote. The next reconcile can run before the cache
    /// shows that write; without this it would declare the same commit Ready a second time (a
    /// new `readyAt`, a second time-to-Ready observation).
    ready_timings: Locked<EnvironmentRef, Timings>,
    /// Failed reconciles in a row, for the backoff.
    failures: Locked<EnvironmentRef, u32>,
    /// Environments whose objects the API server refused, until their backoff ends or their
    /// inputs change ([`Memory::held_back_for`]).
    held_back: Locked<EnvironmentRef, HeldBack>,
    /// When each environment was last re-applied in full (`--reapply-interval`).
    last_full_apply: Locked<EnvironmentRef, Instant>,
    /// When this process last wrote each environment's status after a reconcile
    /// ([`super::coalesce`]).
    last_status_write: Locked<EnvironmentRef, Instant>,
    /// The status writes the environment cache may not show yet ([`Memory::judge_cache`]).
    unseen_writes: Locked<EnvironmentRef, UnseenWrite>,
    /// When each environment is reconciled again for a forge report waiting its turn in the
    /// content budget ([`super::write::write_status`]).
    report_turns: Locked<EnvironmentRef, Instant>,
}

/// An environment waiting out its backoff after the API server refused one of its objects:
/// until when, and what its inputs were then (see [`inputs_of`]).
pub struct HeldBack {
    pub until: Instant,
    pub inputs: String,
}

/// What an environment's render depends on, as one comparable text: its spec (generation),
/// its annotations, whether it is being deleted, and its template's version. Not its status,
/// and not the objects it owns: their events cannot make a refused object acceptable.
pub fn inputs_of(environment: &PreviewEnvironment, template: Option<&PreviewTemplate>) -> String {
    use kube::ResourceExt;
    format!(
        "{:?}|{:?}|{}|{:?}",
        environment.metadata.generation,
        environment.annotations(),
        environment.metadata.deletion_timestamp.is_some(),
        template.and_then(|t| t.resource_version()),
    )
}

/// A status write this process made: the resourceVersion it was computed from, the one it
/// produced, and when.
pub struct UnseenWrite {
    pub based_on: String,
    pub written: String,
    pub at: Instant,
}

/// What a cached copy of an environment is, next to this process's last status write.
#[derive(Debug, PartialEq, Eq)]
pub enum CachedCopy {
    /// No write of ours is outstanding, or the copy is the write itself.
    Current,
    /// The copy is the very version the write was computed from: the write is not in it.
    Behind,
    /// Another version: the write and a change by someone else may each be in it or not
    /// (resourceVersions have no order to compare); only the API server can say.
    Unsure,
}

/// How long a status write is waited for in the cache at most: the watch brings it within
/// milliseconds, or within seconds on a loaded machine; past this bound something else went
/// wrong (the object was replaced, the watch restarted) and reconciling from the cache is the
/// lesser evil.
const UNSEEN_WRITE_PATIENCE: Duration = Duration::from_secs(30);

impl Memory {
    /// Forgets an environment that is gone.
    pub fn forget(&self, environment: &EnvironmentRef) {
        self.ready_timings.lock().remove(environment);
        self.failures.lock().remove(environment);
        self.held_back.lock().remove(environment);
        self.last_full_apply.lock().remove(environment);
        self.last_status_write.lock().remove(environment);
        self.unseen_writes.lock().remove(environment);
        self.report_turns.lock().remove(environment);
    }

    /// Remembers that a status write changed the environment from `based_on` to `written`
    /// (a write the server found unchanged keeps `based_on`, and is not remembered: the cache
    /// would never show another version).
    pub fn wrote_status(&self, environment: &EnvironmentRef, based_on: &str, written: &str) {
        if based_on.is_empty() || written.is_empty() || based_on == written {
            return;
        }
        let write = UnseenWrite {
            based_on: based_on.to_string(),
            written: written.to_string(),
            at: Instant::now(),
        };
        self.unseen_writes.lock().insert(environment.clone(), write);
    }

    /// Judges a cached copy (its resourceVersion) against this process's last status write.
    /// A reconcile from a copy without that write computes its status from a stale base and
    /// undoes the write (seen: a sleep remembered 1 replica instead of 3, read from a copy
    /// without the first sleeping reconcile's status). Equality only: resourceVersions have no
    /// order. Past [`UNSEEN_WRITE_PATIENCE`] the write is forgotten (the watch restarted, the
    /// object was replaced) and the copy taken as it is.
    pub fn judge_cache(&self, environment: &EnvironmentRef, cached_version: &str) -> CachedCopy {
        let mut unseen = self.unseen_writes.lock();
        let Some(write) = unseen.get(environment) else {
            return CachedCopy::Current;
        };
        if write.written == cached_version || write.at.elapsed() >= UNSEEN_WRITE_PATIENCE {
            unseen.remove(environment);
            CachedCopy::Current
        } else if write.based_on == cached_version {
            CachedCopy::Behind
        } else {
            CachedCopy::Unsure
        }
    }

    /// A fresh read from the API server found the cache's version: the cache holds every
    /// write, ours included.
    pub fn cache_caught_up(&self, environment: &EnvironmentRef) {
        self.unseen_writes.lock().remove(environment);
    }

    /// How long the environment still waits out the backoff of a refused apply, if its inputs
    /// are still those `inputs` computes: a watch event of an object it owns (a quota's usage,
    /// a pod) then changes nothing, and a retry before the backoff ends would only be refused
    /// again. `inputs` runs only for an environment held back (every reconcile asks).
    pub fn held_back_for(
        &self,
        environment: &EnvironmentRef,
        inputs: impl FnOnce() -> String,
    ) -> Option<Duration> {
        let held = self.held_back.lock();
        let entry = held.get(environment)?;
        let left = entry.until.checked_duration_since(Instant::now())?;
        (entry.inputs == inputs()).then_some(left)
    }

    /// A whole reconcile succeeded: the backoff starts again, and nothing is held back.
    pub fn succeeded(&self, environment: &EnvironmentRef) {
        self.failures.lock().remove(environment);
        self.held_back.lock().remove(environment);
    }

    /// Holds the environment back until `until` unless its `inputs` change: the API server
    /// refused one of its objects ([`Memory::held_back_for`]).
    pub fn hold_back(&self, environment: EnvironmentRef, until: Instant, inputs: String) {
        self.held_back
            .lock()
            .insert(environment, HeldBack { until, inputs });
    }

    /// When the environment was last re-applied in full (or its clock started).
    pub fn last_full_apply(&self, environment: &EnvironmentRef) -> Option<Instant> {
        self.last_full_apply.lock().get(environment).copied()
    }

    /// The environment was re-applied in full at `at` (or its clock starts there).
    pub fn note_full_apply(&self, environment: &EnvironmentRef, at: Instant) {
        self.last_full_apply.lock().insert(environment.clone(), at);
    }

    /// How long ago this process last wrote the environment's status after a reconcile.
    pub fn since_status_write(&self, environment: &EnvironmentRef) -> Option<Duration> {
        let last = self.last_status_write.lock().get(environment).copied();
        last.map(|at| at.elapsed())
    }

    /// A reconcile is about to write a changed status now ([`super::coalesce`]).
    pub fn note_status_write(&self, environment: &EnvironmentRef) {
        self.last_status_write
            .lock()
            .insert(environment.clone(), Instant::now());
    }

    /// The Ready timings this process last wrote for the environment.
    pub fn ready_timings(&self, environment: &EnvironmentRef) -> Option<Timings> {
        self.ready_timings.lock().get(environment).cloned()
    }

    /// Remembers `timings` as written; whether this process had written the same commit's
    /// Ready already (then it is not timed again).
    pub fn timed_ready_before(&self, environment: &EnvironmentRef, timings: Timings) -> bool {
        let mut remembered = self.ready_timings.lock();
        let known = remembered
            .get(environment)
            .is_some_and(|t| t.sha == timings.sha);
        remembered.insert(environment.clone(), timings);
        known
    }

    /// Runs `f` on the record of when each running seed Job was first seen running.
    pub fn with_seeds_started<R>(&self, f: impl FnOnce(&mut HashMap<String, Instant>) -> R) -> R {
        f(&mut self.seed_started.lock())
    }

    /// Takes the environment's next reconcile for a forge report at `turn`, unless one is
    /// already due between `now` and then: whether this one was taken.
    pub fn take_report_turn(
        &self,
        environment: &EnvironmentRef,
        now: Instant,
        turn: Instant,
    ) -> bool {
        let mut turns = self.report_turns.lock();
        if turns
            .get(environment)
            .is_some_and(|at| *at > now && *at <= turn)
        {
            return false;
        }
        turns.insert(environment.clone(), turn);
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    fn environment() -> EnvironmentRef {
        ObjectRef::new("pr-7").within("previews")
    }

    #[test]
    fn a_refused_environment_is_held_back_until_its_backoff_ends_or_its_inputs_change() {
        let memory = Memory::default();
        assert_eq!(memory.held_back_for(&environment(), || "v1".into()), None);
        let until = Instant::now() + Duration::from_secs(60);
        let held = HeldBack {
            until,
            inputs: "v1".into(),
        };
        memory.held_back.lock().insert(environment(), held);
        let left = memory.held_back_for(&environment(), || "v1".into());
        assert!(
            left.is_some_and(|left| left <= Duration::from_secs(60)),
            "{left:?}"
        );
        assert_eq!(
            memory.held_back_for(&environment(), || "v2".into()),
            None,
            "inputs changed"
        );
        let ended = HeldBack {
            until: Instant::now(),
            inputs: "v1".into(),
        };
        memory.held_back.lock().insert(environment(), ended);
        assert_eq!(
            memory.held_back_for(&environment(), || "v1".into()),
            None,
            "backoff over"
        );
        memory.forget(&environment());
        assert!(memory.held_back.lock().is_empty());
    }

    /// The environments `map` holds something of.
    fn keys<V>(map: &Locked<EnvironmentRef, V>) -> Vec<EnvironmentRef> {
        map.lock().keys().cloned().collect()
    }

    #[test]
    fn forgetting_an_environment_empties_every_map_of_it_and_keeps_the_other_environments() {
        // docs/security.md: "the reconciler's memory (forgotten with their environment)". A map
        // that `forget` missed would keep every environment that ever lived.
        let memory = Memory::default();
        let gone = environment();
        let kept: EnvironmentRef = ObjectRef::new("pr-8").within("previews");
        for environment in [&gone, &kept] {
            let timings = Timings::default();
            memory
                .ready_timings
                .lock()
                .insert(environment.clone(), timings);
            memory.backoff_after_failure(environment);
            let held = HeldBack {
                until: Instant::now() + Duration::from_secs(60),
                inputs: "v1".into(),
            };
            memory.held_back.lock().insert(environment.clone(), held);
            memory
                .last_full_apply
                .lock()
                .insert(environment.clone(), Instant::now());
            memory
                .last_status_write
                .lock()
                .insert(environment.clone(), Instant::now());
            memory.wrote_status(environment, "41", "42");
            memory
                .report_turns
                .lock()
                .insert(environment.clone(), Instant::now());
        }

        memory.forget(&gone);

        // Every field is named, so that a map added to `Memory` fails to compile here until it
        // is listed (and, if it is kept per environment, cleared by `forget`). `seed_started`
        // is keyed by seed Job (`namespace/job`), not by environment: it is bounded by age
        // instead (a day, `metrics.rs`).
        let Memory {
            seed_started: _,
            ready_timings,
            failures,
            held_back,
            last_full_apply,
            last_status_write,
            unseen_writes,
            report_turns,
        } = &memory;
        let only_kept = vec![kept.clone()];
        assert_eq!(keys(ready_timings), only_kept, "ready_timings");
        assert_eq!(keys(failures), only_kept, "failures");
        assert_eq!(keys(held_back), only_kept, "held_back");
        assert_eq!(keys(last_full_apply), only_kept, "last_full_apply");
        assert_eq!(keys(last_status_write), only_kept, "last_status_write");
        assert_eq!(keys(unseen_writes), only_kept, "unseen_writes");
        assert_eq!(keys(report_turns), only_kept, "report_turns");
    }

    #[test]
    fn a_cache_that_shows_the_version_a_status_write_was_computed_from_is_behind() {
        let memory = Memory::default();
        memory.wrote_status(&environment(), "41", "42");
        assert_eq!(memory.judge_cache(&environment(), "41"), CachedCopy::Behind);
        assert_eq!(
            memory.judge_cache(&environment(), "41"),
            CachedCopy::Behind,
            "until the cache moves on"
        );
        assert_eq!(
            memory.judge_cache(&environment(), "42"),
            CachedCopy::Current
        );
        assert_eq!(
            memory.judge_cache(&environment(), "41"),
            CachedCopy::Current,
            "once the write was seen, the entry is gone"
        );
    }

    #[test]
    fn a_version_that_is_neither_the_base_nor_the_write_needs_the_api_server() {
        // Someone else wrote between this process's read and its write (a `/preview sleep`
        // patch, say): the cache may show theirs without ours.
        let memory = Memory::default();
        memory.wrote_status(&environment(), "41", "43");
        assert_eq!(memory.judge_cache(&environment(), "42"), CachedCopy::Unsure);
        memory.cache_caught_up(&environment());
        assert_eq!(
            memory.judge_cache(&environment(), "42"),
            CachedCopy::Current
        );
    }

    #[test]
    fn a_write_the_server_found_unchanged_is_not_waited_for() {
        let memory = Memory::default();
        memory.wrote_status(&environment(), "41", "41");
        assert_eq!(
            memory.judge_cache(&environment(), "41"),
            CachedCopy::Current
        );
        memory.wrote_status(&environment(), "", "42");
        assert_eq!(memory.judge_cache(&environment(), ""), CachedCopy::Current);
    }

    #[test]
    fn other_environments_are_not_held_back() {
        let memory = Memory::default();
        memory.wrote_status(&environment(), "41", "42");
        let other = ObjectRef::new("pr-8").within("previews");
        assert_eq!(memory.judge_cache(&other, "41"), CachedCopy::Current);
    }
}
