//! The status step (pure, no client required): what the environment's status says, from where
//! the reconcile got to. The clock is passed in as `now`.
//!
//! * [`Progress`] collects, wave by wave, each object's health into the phase and the `Ready`
//!   condition: the first failed object makes the environment `Degraded`, the first object still
//!   progressing makes it `Deploying` (or `Seeding`, for a seed Job), else it is `Ready`;
//! * [`progress_status`] turns that into the status to write, keeping the timings of the commit;
//! * [`held_status`] and [`refused_status`] keep the previous status and say why it stopped;
//! * [`merge_patch`] is the status write's patch, which also clears what the new status drops.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::error::RefusalReason;
use crate::cluster::health::Health;
use crate::model::crd::{
    Condition, Phase, PreviewEnvironment, PreviewEnvironmentStatus, ResourceStatus, SeedStatus,
    Timings, WaitingReason,
};
use crate::plan::render::RenderedObject;
use crate::plan::routes::Route;

/// Why a reconcile that deployed left the `Ready` condition as it is (refusals have
/// [`super::error::RefusalReason`], held commits `WaitingReason`): each written as its name,
/// which alerts and `kubectl wait` may select on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressReason {
    /// Every object is healthy.
    Ready,
    /// A wave's object is on its way.
    Deploying,
    /// A wave's seed Job is running.
    Seeding,
    /// An object failed.
    ObjectFailed,
    /// A seed Job failed.
    SeedFailed,
    /// Healthy and asked to sleep: every workload scaled to zero.
    Sleeping,
}

impl ProgressReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            ProgressReason::Ready => "Ready",
            ProgressReason::Deploying => "Deploying",
            ProgressReason::Seeding => "Seeding",
            ProgressReason::ObjectFailed => "ObjectFailed",
            ProgressReason::SeedFailed => "SeedFailed",
            ProgressReason::Sleeping => "Sleeping",
        }
    }
}

/// Every reason the `Ready` condition gives, as alerts, dashboards and `kubectl wait` select
/// on it (renaming one is a breaking change): how a deploying reconcile got on, why the
/// template's render was refused, why a commit waits, or what holds the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadyReason {
    Progress(ProgressReason),
    Refused(RefusalReason),
    Waiting(WaitingReason),
    /// The template's cap is reached, or every cluster it may be placed on is full or does
    /// not answer: it waits for a slot.
    Queued,
    /// Its template places it, and no registered cluster can take it (none selected, or
    /// placement is off): it waits for one.
    NotPlaced,
    /// It runs on a registered cluster whose previewd is removing it.
    RemovedOnCluster,
    /// Being removed; something in its namespace holds the deletion (a finalizer).
    NamespaceHeld,
    /// Being removed.
    Deleting,
}

impl ReadyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadyReason::Progress(reason) => reason.as_str(),
            ReadyReason::Refused(reason) => reason.as_str(),
            ReadyReason::Waiting(reason) => reason.as_str(),
            ReadyReason::Queued => "Queued",
            ReadyReason::NotPlaced => "NotPlaced",
            ReadyReason::RemovedOnCluster => "RemovedOnCluster",
            ReadyReason::NamespaceHeld => "NamespaceHeld",
            ReadyReason::Deleting => "Deleting",
        }
    }
}

impl From<ProgressReason> for ReadyReason {
    fn from(reason: ProgressReason) -> Self {
        ReadyReason::Progress(reason)
    }
}

impl From<RefusalReason> for ReadyReason {
    fn from(reason: RefusalReason) -> Self {
        ReadyReason::Refused(reason)
    }
}

impl From<WaitingReason> for ReadyReason {
    fn from(reason: WaitingReason) -> Self {
        ReadyReason::Waiting(reason)
    }
}

/// The `Ready` condition to write: whether it holds, why, and a sentence.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadyCondition {
    pub ok: bool,
    pub reason: ReadyReason,
    pub message: String,
}

/// Where one reconcile got to, wave by wave.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    pub resources: Vec<ResourceStatus>,
    pub seeds: Vec<SeedStatus>,
    pub condition: ReadyCondition,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            phase: Phase::Ready,
            resources: Vec::new(),
            seeds: Vec::new(),
            condition: ReadyCondition {
                ok: true,
                reason: ProgressReason::Ready.into(),
                message: "every object is healthy".into(),
            },
        }
    }
}

impl Progress {
    /// Whether every wave so far is healthy, so the next one may be applied.
    pub fn may_continue(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Adds wave `wave`: its objects and, in the same order, their health.
    pub fn add_wave(&mut self, wave: i32, members: &[&RenderedObject], health: &[Health]) {
        for (object, health) in members.iter().zip(health) {
            self.record(wave, object, health);
        }
        if !self.may_continue() {
            return;
        }
        let pairs = || members.iter().zip(health);
        if let Some((object, Health::Failed(message))) =
            pairs().find(|(_, h)| matches!(h, Health::Failed(_)))
        {
            let (what, reason) = match object.seed {
                Some(_) => ("seed Job", ProgressReason::SeedFailed),
                None => (object.kind(), ProgressReason::ObjectFailed),
            };
            self.phase = Phase::Degraded;
            self.condition = ReadyCondition {
                ok: false,
                reason: reason.into(),
                message: format!("{what} {} failed: {message}", object.name()),
            };
        } else if let Some((object, Health::Progressing(why))) =
            pairs().find(|(_, h)| matches!(h, Health::Progressing(_)))
        {
            let (phase, reason) = match object.seed {
                Some(_) => (Phase::Seeding, ProgressReason::Seeding),
                None => (Phase::Deploying, ProgressReason::Deploying),
            };
            self.phase = phase;
            self.condition = ReadyCondition {
                ok: false,
                reason: reason.into(),
                message: format!(
                    "waiting for wave {wave}: {} {} ({why})",
                    object.kind(),
                    object.name()
                ),
            };
        }
    }

    fn record(&mut self, wave: i32, object: &RenderedObject, health: &Health) {
        match &object.seed {
            Some(seed) => self.seeds.push(SeedStatus {
                name: seed.clone(),
                job: object.name().to_string(),
                state: match health {
                    Health::Ready => "Succeeded".into(),
                    Health::Failed(_) => "Failed".into(),
                    Health::Progressing(_) => "Running".into(),
                },
                message: health.message(),
            }),
            None => self.resources.push(ResourceStatus {
                api_version: object.api_version().to_string(),
                kind: object.kind().to_string(),
                name: object.name().to_string(),
                wave,
                state: health.state().to_string(),
                message: health.message(),
            }),
        }
    }
}

/// The previous status, `Degraded`, with a `Ready=False` condition saying why.
pub fn refused_status(
    environment: &PreviewEnvironment,
    reason: RefusalReason,
    message: &str,
    namespace: Option<&str>,
    now: DateTime<Utc>,
) -> PreviewEnvironmentStatus {
    held_status(
        environment,
        Phase::Degraded,
        reason.into(),
        message,
        namespace,
        now,
    )
}

/// The previous status with a new phase and a `Ready=False` condition saying why. The caller
/// says which commit waits, if one does (`waiting` starts empty).
pub fn held_status(
    environment: &PreviewEnvironment,
    phase: Phase,
    reason: ReadyReason,
    message: &str,
    namespace: Option<&str>,
    now: DateTime<Utc>,
) -> PreviewEnvironmentStatus {
    let previous = environment.status.clone().unwrap_or_default();
    let ready = ReadyCondition {
        ok: false,
        reason,
        message: message.to_string(),
    };
    let mut status = PreviewEnvironmentStatus {
        phase,
        namespace: namespace.map(str::to_string).or(previous.namespace.clone()),
        conditions: vec![condition(&previous.conditions, &ready, now)],
        queue_position: None,
        waiting: None,
        ..previous
    };
    // Woken into the queue (or a refusal): still waking, its routes still come back last.
    record_waking(environment, &mut status, now);
    status
}

/// `status.wakingSince` from being woken (the last activity: a request, a push or a command)
/// until `Ready`, and then how long that took (`status.lastWakeSeconds`).
pub fn record_waking(
    environment: &PreviewEnvironment,
    status: &mut PreviewEnvironmentStatus,
    now: DateTime<Utc>,
) {
    let previous = environment.status.clone().unwrap_or_default();
    status.last_wake_seconds = previous.last_wake_seconds;
    status.waking_since = None;
    let was_asleep = previous.phase == Phase::Sleeping || previous.waking_since.is_some();
    if environment.spec.sleep || !was_asleep {
        return;
    }
    let woken = previous.waking_since.unwrap_or_else(|| {
        let activity = environment.spec.last_activity.unwrap_or(now);
        activity.min(now)
    });
    if status.phase == Phase::Ready {
        let took = (now - woken).num_milliseconds().max(0) as f64 / 1000.0;
        status.last_wake_seconds = Some(took);
    } else {
        status.waking_since = Some(woken);
    }
}

/// Where the environment runs, for [`progress_status`].
pub struct Placement<'a> {
    pub namespace: &'a str,
    pub url: &'a str,
    /// The URL's host, which the environment now holds.
    pub host: &'a str,
    /// The other Ingress hosts it now holds.
    pub extra_hosts: &'a [String],
    /// The objects that route the URL's host ([`crate::plan::routes`]).
    pub routes: &'a [Route],
}

/// The URL, once one of the objects that route its host is healthy: a link in the PR comment
/// must lead somewhere.
fn routed_url(placement: &Placement<'_>, resources: &[ResourceStatus]) -> Option<String> {
    let routed = placement.routes.iter().any(|route| {
        resources
            .iter()
            .any(|r| r.kind == route.kind && r.name == route.name && r.state == "Ready")
    });
    routed.then(|| placement.url.to_string())
}

/// The status from the objects' progress. `remembered` is the Ready timings this process last
/// wrote for the environment, used when the cached status does not show them yet.
pub fn progress_status(
    environment: &PreviewEnvironment,
    progress: Progress,
    placement: Placement<'_>,
    remembered: Option<Timings>,
    now: DateTime<Utc>,
) -> PreviewEnvironmentStatus {
    let previous = environment.status.clone().unwrap_or_default();
    let sha = &environment.spec.source.head_sha;
    let ready = progress.phase == Phase::Ready;
    let timings = timings(environment, &previous, remembered, ready, now);
    PreviewEnvironmentStatus {
        phase: progress.phase,
        // Deployed here: in the cluster previewd runs in.
        cluster: None,
        namespace: Some(placement.namespace.to_string()),
        url: routed_url(&placement, &progress.resources),
        host: Some(placement.host.to_string()),
        extra_hosts: placement.extra_hosts.to_vec(),
        deployed_sha: if ready {
            Some(sha.clone())
        } else {
            previous.deployed_sha.clone()
        },
        observed_generation: environment.metadata.generation,
        resources: progress.resources,
        seeds: progress.seeds,
        databases: previous.databases.clone(),
        conditions: vec![condition(&previous.conditions, &progress.condition, now)],
        timings: Some(timings),
        forge: previous.forge.clone(),
        queue_position: None,
        replicas_before_sleep: previous.replicas_before_sleep.clone(),
        waiting: None,
        waking_since: previous.waking_since,
        last_wake_seconds: previous.last_wake_seconds,
        footprint: previous.footprint.clone(),
        // Rendered: whatever was set aside before is behind.
        quarantine: None,
    }
}

/// The head commit's timings: kept from the status (or this process's memory) once Ready was
/// reached, started at the environment's last activity otherwise, and completed when `ready`.
fn timings(
    environment: &PreviewEnvironment,
    previous: &PreviewEnvironmentStatus,
    remembered: Option<Timings>,
    ready: bool,
    now: DateTime<Utc>,
) -> Timings {
    let sha = &environment.spec.source.head_sha;
    let cached = previous.timings.clone().filter(|t| &t.sha == sha);
    let remembered = remembered.filter(|t| &t.sha == sha && t.ready_at.is_some());
    let mut timings = match (cached, remembered) {
        (Some(cached), _) if cached.ready_at.is_some() => cached,
        (_, Some(remembered)) => remembered,
        (Some(cached), None) => cached,
        (None, None) => Timings {
            sha: sha.clone(),
            requested_at: environment.spec.last_activity.unwrap_or(now),
            ready_at: None,
            seconds_to_ready: None,
        },
    };
    if ready && timings.ready_at.is_none() {
        timings.ready_at = Some(now);
        timings.seconds_to_ready =
            Some(((now - timings.requested_at).num_milliseconds() as f64 / 1000.0).max(0.0));
    }
    timings
}

/// The `Ready` condition, keeping its transition time when its status did not change.
pub fn condition(previous: &[Condition], ready: &ReadyCondition, now: DateTime<Utc>) -> Condition {
    let status = if ready.ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == status)
        .map(|c| c.last_transition_time)
        .unwrap_or(now);
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: ready.reason.as_str().into(),
        message: ready.message.clone(),
        last_transition_time: since,
    }
}

/// A JSON merge patch (RFC 7386) from `old` to `new`. Fields the status no longer has are
/// sent as `null`: optional fields are left out when empty, and a merge patch that merely
/// leaves them out would keep their old values (a stale queue position, the previous commit's
/// ready time).
pub fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (key, value) in new {
                let value = match old.get(key) {
                    Some(previous) => merge_patch(previous, value),
                    None => value.clone(),
                };
                patch.insert(key.clone(), value);
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests;
