//! Environment records: every write of a `PreviewEnvironment`'s spec and metadata, made by the
//! webhook intake, CI results, comment commands, the sweep, the wake gate and the traffic
//! recorder alike (the reconciler only writes their status). Each under its own field
//! manager, with one meaning for a 404: the environment is gone.
//!
//! Every write goes through [`Records`], which sends it through previewd's [`Writer`]: counted
//! on `previewd_write_requests_total` under its purpose's operation, bounded by the writer's
//! timeout, under its purpose's field manager. The one other write of a record's metadata is
//! the reconciler's finalizer, which kube's finalizer helper adds and removes (counted as
//! `finalizer` by the controller).
//!
//! Each write is ordered and explained: an apply never replaces a newer source with an older
//! one (deliveries arrive out of order), and a deletion first writes its reason on the record
//! so that the PR comment can say why the environment went.

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::writer::Writer;
use crate::model::crd::{OLDER_SOURCE_MESSAGE, PreviewEnvironment};
use crate::model::metadata::{
    ANNOTATION_DELETION_REASON, ANNOTATION_WOKEN_BY_REQUEST, FIELD_MANAGER_CHECKS,
    FIELD_MANAGER_COMMANDS, FIELD_MANAGER_GATE, FIELD_MANAGER_INTAKE, FIELD_MANAGER_SWEEP,
    FIELD_MANAGER_TRAFFIC,
};

/// Who deletes an environment with its reason: the field manager of the reason's write and
/// the operation the deletion is counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleter {
    /// A delivery (merged, closed, branch deleted): `intake_delete`, as `previewd-intake`.
    Intake,
    /// A comment command (`/preview destroy`): `command`, as `previewd-commands`.
    Command,
}

impl Deleter {
    fn operation(self) -> &'static str {
        match self {
            Deleter::Intake => "intake_delete",
            Deleter::Command => "command",
        }
    }

    fn field_manager(self) -> &'static str {
        match self {
            Deleter::Intake => FIELD_MANAGER_INTAKE,
            Deleter::Command => FIELD_MANAGER_COMMANDS,
        }
    }
}

/// previewd's one way to write a `PreviewEnvironment`'s spec and metadata: each method is one
/// purpose, with its own field manager and its own operation on the writer's counters.
#[derive(Clone, Copy)]
pub struct Records<'a> {
    client: &'a Client,
    writer: &'a Writer,
}

impl<'a> Records<'a> {
    pub fn new(client: &'a Client, writer: &'a Writer) -> Self {
        Self { client, writer }
    }

    /// The intake's apply of a delivered change, in order ([`Applied`]); one apply request,
    /// counted as `intake_apply`.
    pub async fn apply_in_order(
        &self,
        wanted: &PreviewEnvironment,
    ) -> Result<Applied, kube::Error> {
        apply_in_order(self.client, self.writer, wanted).await
    }

    /// A push wakes a sleeping environment (`intake_wake`, as `previewd-intake`).
    pub async fn wake(&self, namespace: &str, name: &str) -> Result<bool, kube::Error> {
        let wake = wake(self.client, namespace, name);
        self.writer.write("intake_wake", wake).await
    }

    /// A request at the wake gate wakes it (`gate_wake`, as `previewd-gate`); see
    /// [`wake_for_request`].
    pub async fn wake_for_request(
        &self,
        namespace: &str,
        name: &str,
        seen: &Seen<'_>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, kube::Error> {
        let wake = wake_for_request(self.client, namespace, name, seen, now);
        self.writer.write("gate_wake", wake).await
    }

    /// The queue puts a visitor's environment to sleep for an author's (`queue_displace`, as
    /// `previewd-sweep`); false if it changed since `seen` or is gone.
    pub async fn put_visitor_to_sleep(
        &self,
        namespace: &str,
        name: &str,
        seen: &Seen<'_>,
    ) -> Result<bool, kube::Error> {
        let sleep = put_visitor_to_sleep(self.client, namespace, name, seen);
        self.writer.write("queue_displace", sleep).await
    }

    /// The traffic recorder notes activity (`traffic`, as `previewd-traffic`).
    pub async fn note_activity(
        &self,
        namespace: &str,
        name: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, kube::Error> {
        let note = note_activity(self.client, namespace, name, now);
        self.writer.write("traffic", note).await
    }

    /// A CI result is recorded (`intake_check`, as `previewd-checks`).
    pub async fn record_checks(
        &self,
        namespace: &str,
        name: &str,
        checks: &serde_json::Value,
    ) -> Result<bool, kube::Error> {
        let record = record_checks(self.client, namespace, name, checks);
        self.writer.write("intake_check", record).await
    }

    /// A comment command's effect and answer (`command`, as `previewd-commands`).
    pub async fn answer_command(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<bool, kube::Error> {
        let answer = answer_command(self.client, namespace, name, patch);
        self.writer.write("command", answer).await
    }

    /// The sweep puts an idle environment to sleep (`sleep`, as `previewd-sweep`).
    pub async fn put_to_sleep(&self, namespace: &str, name: &str) -> Result<bool, kube::Error> {
        let sleep = put_to_sleep(self.client, namespace, name);
        self.writer.write("sleep", sleep).await
    }

    /// Deletes an environment after writing why on it, counted once (the reason's patch and
    /// the delete are one write of `by`'s operation). False if it was already gone.
    pub async fn delete_with_reason(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        by: Deleter,
    ) -> Result<bool, kube::Error> {
        let manager = by.field_manager();
        let delete = delete_with_reason(self.client, namespace, name, reason, manager);
        self.writer.write(by.operation(), delete).await
    }

    /// The sweep deletes an environment as judged from a cached copy (as `previewd-sweep`;
    /// each of its write requests, the reason, the delete and a reason taken back, is a
    /// `delete` within the writer's timeout); see [`delete_as_judged`].
    pub async fn delete_as_judged(
        &self,
        judged: &PreviewEnvironment,
        reason: &str,
    ) -> Result<bool, kube::Error> {
        delete_as_judged(self.client, self.writer, judged, reason).await
    }

    /// The step of [`Records::delete_as_judged`] after its read (see
    /// [`delete_unless_changed`]).
    pub async fn delete_unless_changed(
        &self,
        judged: &PreviewEnvironment,
        read: PreviewEnvironment,
        reason: &str,
    ) -> Result<bool, kube::Error> {
        delete_unless_changed(self.client, self.writer, judged, read, reason).await
    }
}

/// Wakes a sleeping environment (a new commit was pushed to it). Returns false if it is gone.
async fn wake(client: &Client, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let woke = patch_spec(client, namespace, name, serde_json::json!({"sleep": false})).await?;
    if woke {
        tracing::info!(environment = %name, %namespace, "a push wakes the environment");
    }
    Ok(woke)
}

/// What a writer saw of an environment: the write applies only if it is still so (the API
/// server compares `resource_version`, and answers 409 otherwise).
pub struct Seen<'a> {
    /// Its head commit.
    pub head: &'a str,
    pub resource_version: &'a str,
}

/// Wakes a sleeping environment because a request reached its host (previewd's wake gate):
/// the request is activity, so the idle timeout counts from `now`; and the environment is
/// marked woken by a visitor at its head (`ANNOTATION_WOKEN_BY_REQUEST`), so that it yields
/// its slot to an environment its author waits for. Only if it is still as `seen` (a writer's
/// command or a push since must not be turned into a visitor's wake): a conflict is an error,
/// and the gate tries again with what its cache then holds. Returns false if it is gone.
async fn wake_for_request(
    client: &Client,
    namespace: &str,
    name: &str,
    seen: &Seen<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, kube::Error> {
    let wake = serde_json::json!({
        "metadata": {
            "resourceVersion": seen.resource_version,
            "annotations": {ANNOTATION_WOKEN_BY_REQUEST: seen.head},
        },
        "spec": {"sleep": false, "lastActivity": now},
    });
    merge(client, namespace, name, FIELD_MANAGER_GATE, wake).await
}

/// Puts an environment that runs only for a visitor to sleep, for one its author waits for
/// (`reconcile::queue`), as `previewd-sweep`; only if it is still as `seen` (no push, command
/// or other change since the queue decided). Returns false if it changed or is gone.
async fn put_visitor_to_sleep(
    client: &Client,
    namespace: &str,
    name: &str,
    seen: &Seen<'_>,
) -> Result<bool, kube::Error> {
    let body = serde_json::json!({
        "metadata": {"resourceVersion": seen.resource_version},
        "spec": {"sleep": true},
    });
    match merge(client, namespace, name, FIELD_MANAGER_SWEEP, body).await {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        other => other,
    }
}

/// Records that the environment was used at `now` (its host got requests), as
/// `previewd-traffic`: the idle timeout counts from here. Returns false if it is gone.
async fn note_activity(
    client: &Client,
    namespace: &str,
    name: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, kube::Error> {
    let body = serde_json::json!({"spec": {"lastActivity": now}});
    merge(client, namespace, name, FIELD_MANAGER_TRAFFIC, body).await
}

/// Records CI results on the environment (`spec.checks`, merged), as `previewd-checks`.
/// Returns false if the environment is gone.
async fn record_checks(
    client: &Client,
    namespace: &str,
    name: &str,
    checks: &serde_json::Value,
) -> Result<bool, kube::Error> {
    let body = serde_json::json!({"spec": {"checks": checks}});
    merge(client, namespace, name, FIELD_MANAGER_CHECKS, body).await
}

/// Writes a comment command's effect and answer (`patch`: spec fields and the answer's
/// annotation), as `previewd-commands`. Returns false if the environment is gone.
async fn answer_command(
    client: &Client,
    namespace: &str,
    name: &str,
    patch: serde_json::Value,
) -> Result<bool, kube::Error> {
    merge(client, namespace, name, FIELD_MANAGER_COMMANDS, patch).await
}

/// Puts an idle environment to sleep (the sweep, for `idleAction: Sleep`), as
/// `previewd-sweep`. Returns false if the environment is gone.
async fn put_to_sleep(client: &Client, namespace: &str, name: &str) -> Result<bool, kube::Error> {
    let body = serde_json::json!({"spec": {"sleep": true}});
    merge(client, namespace, name, FIELD_MANAGER_SWEEP, body).await
}

/// Merges `spec` into the environment's spec, as the intake. Returns false if the environment
/// is gone.
async fn patch_spec(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> Result<bool, kube::Error> {
    let body = serde_json::json!({ "spec": spec });
    merge(client, namespace, name, FIELD_MANAGER_INTAKE, body).await
}

/// The one merge patch of an environment record, by `manager`: a 404 means it is gone
/// (`Ok(false)`), everywhere alike.
async fn merge(
    client: &Client,
    namespace: &str,
    name: &str,
    manager: &str,
    body: serde_json::Value,
) -> Result<bool, kube::Error> {
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(body)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Per-environment turns for the intake's writes in this process, striped over a fixed set of
/// locks: deliveries for one environment are applied one at a time, in the order they took
/// their turn, rather than all at once against the same object.
fn turn_for(namespace: &str, name: &str) -> &'static tokio::sync::Mutex<()> {
    static TURNS: std::sync::LazyLock<Vec<tokio::sync::Mutex<()>>> =
        std::sync::LazyLock::new(|| (0..64).map(|_| tokio::sync::Mutex::new(())).collect());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&(namespace, name), &mut hasher);
    &TURNS[(std::hash::Hasher::finish(&hasher) % 64) as usize]
}

/// What became of an intake's apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Written,
    /// The environment already holds a newer change (a delivery out of order): not written.
    Older,
    /// The environment of that name is being removed (its finalizer still runs): the change,
    /// written onto it, vanishes with it; delivered again once it is gone, it makes a new one.
    BeingRemoved,
}

/// Server-side applies `wanted`, in order. The API server itself refuses a source older than
/// the stored one (the CEL rule on `spec.source`, whose message is [`OLDER_SOURCE_MESSAGE`]),
/// so nothing is read first and the apply carries no `resourceVersion` precondition, which
/// every status write of the controller would break (a 409, a read and an apply again: 1,664
/// applies for 1,000 new heads in the webhooks benchmark). The applied object says whether it
/// is being removed: then the change vanishes with it, and the delivery is answered so that
/// the forge sends it again.
async fn apply_in_order(
    client: &Client,
    writer: &Writer,
    wanted: &PreviewEnvironment,
) -> Result<Applied, kube::Error> {
    let namespace = wanted.namespace().unwrap_or_default();
    let name = wanted.name_any();
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    let _turn = turn_for(&namespace, &name).lock().await;
    let mut body = serde_json::to_value(wanted).map_err(kube::Error::SerdeError)?;
    // `sleep: false` belongs to whoever puts an environment to sleep; the intake must not
    // wake it by owning that field.
    if let Some(spec) = body["spec"].as_object_mut() {
        spec.remove("sleep");
    }
    if let Some(metadata) = body["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    let params = PatchParams::apply(FIELD_MANAGER_INTAKE).force();
    let patch = Patch::Apply(&body);
    let apply = api.patch(&name, &params, &patch);
    match writer.write("intake_apply", apply).await {
        Ok(applied) if applied.metadata.deletion_timestamp.is_some() => {
            tracing::info!(environment = %name, "the environment is being removed: the change goes with it");
            Ok(Applied::BeingRemoved)
        }
        Ok(_) => Ok(Applied::Written),
        Err(kube::Error::Api(status))
            if status.code == 422 && status.message.contains(OLDER_SOURCE_MESSAGE) =>
        {
            tracing::info!(
                environment = %name,
                delivered = %wanted.spec.source.head_sha,
                "a delivery older than the environment's last change: not applied"
            );
            Ok(Applied::Older)
        }
        Err(e) => Err(e),
    }
}

/// Deletes an environment after writing why on it (annotation
/// [`ANNOTATION_DELETION_REASON`]), so the PR comment can say it. Returns false if it was
/// already gone.
async fn delete_with_reason(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
    manager: &str,
) -> Result<bool, kube::Error> {
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    let why =
        serde_json::json!({"metadata": {"annotations": {ANNOTATION_DELETION_REASON: reason}}});
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(why)).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
        Err(e) => return Err(e),
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(environment = %name, %namespace, reason, "deleting environment");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Like [`delete_with_reason`], for a decision made from a cached copy (the sweep): the
/// environment is read again first, and left alone if its deletion has begun or its spec changed
/// since the copy that was judged (its `generation` moved: someone extended it, woke it, pushed).
/// Status writes do not count. `Ok(false)` says it was not deleted; the next sweep judges it
/// afresh. One read per deletion, which the sweep rarely makes.
async fn delete_as_judged(
    client: &Client,
    writer: &Writer,
    judged: &PreviewEnvironment,
    reason: &str,
) -> Result<bool, kube::Error> {
    let api: Api<PreviewEnvironment> =
        Api::namespaced(client.clone(), &judged.namespace().unwrap_or_default());
    let Some(read) = api.get_opt(&judged.name_any()).await? else {
        return Ok(false);
    };
    delete_unless_changed(client, writer, judged, read, reason).await
}

/// The step of [`delete_as_judged`] after its read: `read` is the environment as last read.
/// Nothing is deleted if it is not the object that was judged (same UID: a PR closed and
/// reopened makes a new one of the same name) or its spec changed since `judged`. The reason is
/// written, and the deletion sent, each only on the exact version last read (a precondition on
/// its `resourceVersion` and UID), so a change that lands in between (an extension, a push)
/// refuses them with a conflict; the environment is then read again and judged again, a few
/// times at most (status writes also move the version, without changing the verdict). Not
/// deleted after all, it loses the reason written for it. A conflict on every try leaves it to
/// the next sweep.
async fn delete_unless_changed(
    client: &Client,
    writer: &Writer,
    judged: &PreviewEnvironment,
    mut read: PreviewEnvironment,
    reason: &str,
) -> Result<bool, kube::Error> {
    const ATTEMPTS: usize = 4;
    let namespace = judged.namespace().unwrap_or_default();
    let name = judged.name_any();
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &namespace);
    let mut reason_written = false;
    for _ in 0..ATTEMPTS {
        let changed = read.metadata.deletion_timestamp.is_some()
            || read.metadata.uid != judged.metadata.uid
            || read.metadata.generation != judged.metadata.generation;
        if changed {
            tracing::info!(environment = %name, %namespace, reason, "not deleted: the environment changed since it was judged");
            if reason_written && read.metadata.uid == judged.metadata.uid {
                forget_reason(writer, &api, &name).await?;
            }
            return Ok(false);
        }
        match delete_at_version(writer, &api, &name, &read, reason, &mut reason_written).await {
            Ok(deleted) => {
                if deleted {
                    tracing::info!(environment = %name, %namespace, reason, "deleting environment");
                }
                return Ok(deleted);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let Some(again) = api.get_opt(&name).await? else {
                    return Ok(false);
                };
                read = again;
            }
            Err(e) => return Err(e),
        }
    }
    if reason_written {
        forget_reason(writer, &api, &name).await?;
    }
    Ok(false)
}

/// Writes the reason and deletes, each only on the version of `read` (then on the version the
/// reason's write made) and its UID. A conflict is returned as the API server's 409.
async fn delete_at_version(
    writer: &Writer,
    api: &Api<PreviewEnvironment>,
    name: &str,
    read: &PreviewEnvironment,
    reason: &str,
    reason_written: &mut bool,
) -> Result<bool, kube::Error> {
    let why = serde_json::json!({"metadata": {
        "resourceVersion": read.resource_version(),
        "annotations": {ANNOTATION_DELETION_REASON: reason}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_SWEEP.into()),
        ..Default::default()
    };
    let patch = Patch::Merge(why);
    let written = match writer
        .write("delete", api.patch(name, &params, &patch))
        .await
    {
        Ok(written) => written,
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
        Err(e) => return Err(e),
    };
    *reason_written = true;
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: written.resource_version(),
            uid: read.uid(),
        }),
        ..Default::default()
    };
    match writer.write("delete", api.delete(name, &params)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes back a deletion reason written for a deletion that was then not made, so that a
/// later removal for another reason is not said with this one.
async fn forget_reason(
    writer: &Writer,
    api: &Api<PreviewEnvironment>,
    name: &str,
) -> Result<(), kube::Error> {
    let forget =
        serde_json::json!({"metadata": {"annotations": {ANNOTATION_DELETION_REASON: null}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_SWEEP.into()),
        ..Default::default()
    };
    let patch = Patch::Merge(forget);
    match writer
        .write("delete", api.patch(name, &params, &patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
