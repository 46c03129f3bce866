//! The API server's audit log of writes ([`super::audit_writes`], the sandbox's audit policy):
//! when the API server received each write and when it answered, in microseconds. A benchmark
//! splits a push's way to `Ready` with it into the API server's time serving previewd's writes
//! and the time between its answers and previewd's next write (previewd's own work, and the
//! watch event's way from the API server to previewd), one push at a time.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// One line of the audit log: a write and when the API server received and answered it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Write {
    /// `create`, `update` or `patch` (a server-side apply is a `patch`).
    pub verb: String,
    pub object_ref: ObjectRef,
    pub request_received_timestamp: DateTime<Utc>,
    /// When the response was complete (the only stage the policy logs).
    pub stage_timestamp: DateTime<Utc>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ObjectRef {
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

impl Write {
    fn received(&self) -> DateTime<Utc> {
        self.request_received_timestamp
    }

    fn answered(&self) -> DateTime<Utc> {
        self.stage_timestamp
    }

    fn of(&self, resource: &str, subresource: &str, namespace: &str) -> bool {
        let object = &self.object_ref;
        object.resource == resource
            && object.subresource == subresource
            && object.namespace == namespace
    }
}

/// Every write in the log at `path` received at or after `since`, in the order received. Fails
/// on a line that is not an audit event (but the last, which the API server may be writing).
pub fn read(path: &Path, since: DateTime<Utc>) -> Vec<Write> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the audit log {}: {e}", path.display()));
    let complete = text.rsplit_once('\n').map_or("", |(whole, _)| whole);
    let mut writes: Vec<Write> = complete
        .lines()
        .map(|line| {
            serde_json::from_str::<Write>(line)
                .unwrap_or_else(|e| panic!("an audit line that is not an event ({e}): {line}"))
        })
        .filter(|w| w.received() >= since)
        .collect();
    writes.sort_by_key(Write::received);
    writes
}

/// What one push is to find in the log.
pub struct Push<'a> {
    /// The PreviewEnvironment's name and namespace.
    pub environment: &'a str,
    pub namespace: &'a str,
    /// The namespace of the environment's objects.
    pub objects_namespace: &'a str,
    /// When the benchmark sent the delivery.
    pub sent: DateTime<Utc>,
    /// When the benchmark's watch saw the last of the environment's Deployments rolled out.
    pub rollout_seen: DateTime<Utc>,
    /// When the benchmark's watch saw the environment `Ready` at the push's head.
    pub ready_seen: DateTime<Utc>,
}

/// One push's way to `Ready` as the API server saw it.
#[derive(Clone, Copy, Debug)]
pub struct PushPath {
    /// Delivery sent → the intake's write of the new head received.
    pub intake: Duration,
    /// That write answered → the controller's first apply of the app's objects received.
    pub deploy: Duration,
    /// The controller manager's status write that completed the rollout answered → previewd's
    /// status write (`Ready`) received.
    pub ready: Duration,
    /// The API server serving previewd's writes: the intake's, the objects' applies (sent at
    /// once: the first received → the last answered) and the status write.
    pub served: Duration,
}

impl PushPath {
    /// previewd's own time: everything but the API server serving it and the rollout.
    pub fn previewd(&self) -> Duration {
        self.intake + self.deploy + self.ready
    }
}

/// `push`'s path in `log`, or `None` when a step is missing. Each write is the one that made
/// the step the benchmark saw: previewd's status write is the last one received before the
/// watch saw `Ready` at the head; the rollout's completing write, the controller manager's last
/// one before both the watch saw the rollout complete and that status write; the applies, those
/// received from the intake's write on until then. A watch event can reach previewd a moment
/// before the writer's own answer is complete: windows open at a write's arrival.
pub fn path_of(log: &[Write], push: &Push) -> Option<PushPath> {
    let environment = |w: &&Write, subresource: &str| {
        w.of("previewenvironments", subresource, push.namespace)
            && w.object_ref.name == push.environment
    };
    let intake = log
        .iter()
        .find(|w| environment(w, "") && w.received() >= push.sent)?;
    let status = log.iter().rev().find(|w| {
        environment(w, "status")
            && w.received() > intake.received()
            && w.received() <= push.ready_seen
    })?;
    let rollout_done = log.iter().rev().find(|w| {
        w.of("deployments", "status", push.objects_namespace)
            && w.received() > intake.received()
            && w.received() <= push.rollout_seen.min(status.received())
    })?;
    let applies: Vec<&Write> = log
        .iter()
        .filter(|w| {
            let object = w.of("configmaps", "", push.objects_namespace)
                || w.of("deployments", "", push.objects_namespace);
            object
                && w.verb == "patch"
                && w.received() >= intake.received()
                && w.received() < rollout_done.received()
        })
        .collect();
    let first_apply = applies.iter().map(|w| w.received()).min()?;
    let last_answer = applies.iter().map(|w| w.answered()).max()?;
    Some(PushPath {
        intake: between(push.sent, intake.received()),
        deploy: between(intake.answered(), first_apply),
        ready: between(rollout_done.answered(), status.received()),
        served: between(intake.received(), intake.answered())
            + between(first_apply, last_answer)
            + between(status.received(), status.answered()),
    })
}

/// `to - from`, or zero when `to` is earlier (a watch event can reach previewd a moment before
/// the writer's own answer is complete).
fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or_default()
}
