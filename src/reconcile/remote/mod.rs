//! Environments on registered clusters (`PreviewCluster`): the hub's side.
//!
//! The hub (this previewd, where webhooks arrive) places an environment whose template has a
//! `placement` on one registered cluster ([`place`]), then writes two records into that
//! cluster's namespace: the template's (without its credentials) and the environment's. The
//! previewd installed there deploys them as it deploys its own, with its own content policy,
//! namespace claim, apply cache and ceiling; the hub reads the record's status back into the
//! environment's and reports it to the forge, once. Removal deletes the record there and waits
//! until it is gone before the environment's own record may go.
//!
//! The hub's rights on a target are the records' in one namespace; see docs/architecture.md
//! ("Beyond one cluster") for the choice and what happens when either side is down.

pub(super) mod hub;
mod looks;
mod place;
mod records;

use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use super::config::PlacementConfig;
pub use hub::Target;
pub use looks::look_after_clusters;
pub use place::{place, record_placement, to_place};
pub use records::Reach;

use super::context::Context;
use super::error::ReconcileError;
use super::status::{ReadyReason, held_status};
use super::write::write_status;
use crate::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::{FIELD_MANAGER_PLACEMENT, LABEL_HUB_UID};
use records::{already_says, environment_record, mirrored_status, template_record};

/// The registered cluster `environment` was placed on, if any: its `status.cluster`, which
/// only previewd writes (and never clears while the environment lives).
pub fn placed_on(environment: &PreviewEnvironment) -> Option<&str> {
    let status = environment.status.as_ref()?;
    status.cluster.as_ref().map(|c| c.name.as_str())
}

/// What the hub knows of cluster `name` for `environment`.
enum Seen {
    /// It answers, and is connected.
    Answers(std::sync::Arc<Target>),
    /// It does not answer (or is no longer registered) since then: the environment's own
    /// `unreachableSince` when it said so before, so that its status stays the same at rest.
    Silent(chrono::DateTime<chrono::Utc>),
    /// Registered and answering, not connected in this process yet, or its records not listed
    /// yet (a restart, a new term, a rotated credential): nothing is decided until they are.
    NotYetConnected,
}

fn seen(context: &Context, name: &str, environment: &PreviewEnvironment) -> Seen {
    let said_since = environment
        .status
        .as_ref()
        .and_then(|s| s.cluster.as_ref())
        .and_then(|c| c.unreachable_since);
    let silent = |since: Option<chrono::DateTime<chrono::Utc>>| {
        Seen::Silent(said_since.or(since).unwrap_or_else(chrono::Utc::now))
    };
    let Some(cluster) = context.hub.cluster(name) else {
        return silent(None);
    };
    match (cluster.status.as_ref(), context.hub.target(name)) {
        (Some(status), Some(target)) if status.reachable && target.listed() => {
            Seen::Answers(target)
        }
        (Some(status), _) if status.reachable => Seen::NotYetConnected,
        (Some(status), _) => silent(status.since),
        (None, _) => Seen::NotYetConnected,
    }
}

/// Why `environment` may not run on `cluster` as its template asks, if it may not: the
/// cluster does not admit its namespace (a status written by hand names a cluster its template
/// could not have chosen), or the template copies Secrets (on the target every hub namespace's
/// templates share one namespace, so an owner's sharing with a namespace would no longer tell
/// teams apart).
pub fn refused_on(
    context: &Context,
    cluster: &str,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
) -> Option<String> {
    let namespace = environment.namespace().unwrap_or_default();
    if let Some(registered) = context.hub.cluster(cluster)
        && !registered.spec.admits(&namespace)
    {
        return Some(format!(
            "Cluster {cluster} does not admit environments of namespace {namespace}; nothing is written there."
        ));
    }
    refused_template(template)
}

/// Why no environment of `template` may be placed, if none may (see [`refused_on`]).
pub fn refused_template(template: &PreviewTemplate) -> Option<String> {
    (!template.spec.secrets.copy.is_empty()).then(|| {
        "The template copies Secrets (secrets.copy), which environments placed on registered clusters cannot: generate them (secrets.generate) or have them on the cluster.".to_string()
    })
}

/// Keeps the environment's records on `cluster` as the hub's say, and its status as the
/// record's says. A cluster that does not answer is left alone: the environment keeps its last
/// seen status, and says its cluster does not answer.
pub async fn run_on_cluster(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    cluster: &str,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let look_again = Action::requeue(context.hub.config.look_interval);
    if let Some(refusal) = refused_on(context, cluster, environment, template) {
        say_not_placed(environment, context, Phase::Degraded, &refusal).await?;
        return Ok(look_again);
    }
    let target = match seen(context, cluster, environment) {
        Seen::Answers(target) => target,
        Seen::NotYetConnected => return Ok(look_again),
        Seen::Silent(since) => {
            let status = mirrored_status(environment, None, cluster, Reach::Silent(since), false);
            write_status(environment, context, status).await?;
            return Ok(look_again);
        }
    };
    let template_record = template_record(template, &target.namespace);
    let live_template = target.template(&template_record.name_any());
    if !already_says(live_template.as_deref(), &template_record, |t| &t.spec) {
        write_record(&target, cluster, &template_record, context).await?;
    }
    let record = environment_record(environment, &template_record, &target.namespace);
    let live = target.environment(&record.name_any());
    if let Some(other) = live.as_deref().filter(|l| !stands_for(l, environment)) {
        // The name is another environment's: one of the same name removed and made again,
        // whose record is still going, or another hub's. This one waits.
        let message = format!(
            "Record {}/{} on cluster {cluster} stands for another environment (uid {}); this one is written once it is gone.",
            target.namespace,
            other.name_any(),
            other
                .labels()
                .get(LABEL_HUB_UID)
                .map(String::as_str)
                .unwrap_or("unknown")
        );
        say_not_placed(environment, context, Phase::Pending, &message).await?;
        return Ok(look_again);
    }
    let current = already_says(live.as_deref(), &record, |e| &e.spec);
    if !current {
        write_record(&target, cluster, &record, context).await?;
    }
    let status = mirrored_status(
        environment,
        live.as_deref(),
        cluster,
        Reach::Answers,
        current,
    );
    write_status(environment, context, status).await?;
    Ok(Action::requeue(context.config.resync_interval))
}

/// Writes why `environment` does not run on its cluster now (`NotPlaced`, in `phase`).
async fn say_not_placed(
    environment: &PreviewEnvironment,
    context: &Context,
    phase: Phase,
    message: &str,
) -> Result<(), ReconcileError> {
    let reason = ReadyReason::NotPlaced;
    let status = held_status(
        environment,
        phase,
        reason,
        message,
        None,
        chrono::Utc::now(),
    );
    write_status(environment, context, status).await
}

/// Whether `record` stands for `environment` (its hub uid label; a record without one is not
/// previewd's).
fn stands_for(record: &PreviewEnvironment, environment: &PreviewEnvironment) -> bool {
    let uid = environment.uid().unwrap_or_default();
    record.labels().get(LABEL_HUB_UID) == Some(&uid)
}

/// One server-side apply of a record on the target, as `previewd-placement`.
async fn write_record<K>(
    target: &Target,
    cluster: &str,
    record: &K,
    context: &Context,
) -> Result<(), ReconcileError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(target.client.clone(), &target.namespace);
    let params = PatchParams::apply(FIELD_MANAGER_PLACEMENT).force();
    let (name, patch) = (record.name_any(), Patch::Apply(record));
    let apply = api.patch(&name, &params, &patch);
    context
        .writer
        .write("target_record", apply)
        .await
        .map(|_| ())
        .map_err(|error| ReconcileError::Target {
            cluster: cluster.to_string(),
            error,
        })
}

/// Removes the environment from `cluster`: deletes its record there; `Ok` once the target's
/// previewd has removed it (its namespace gone). Waiting is an error, retried: kube's
/// finalizer helper releases the hub's record on any `Ok` of the cleanup. A cluster that does
/// not answer holds the removal, and the environment says so: it is never forgotten while it
/// may still run.
pub async fn remove_from_cluster(
    environment: &PreviewEnvironment,
    cluster: &str,
    context: &Context,
) -> Result<(), ReconcileError> {
    let target = match seen(context, cluster, environment) {
        Seen::Answers(target) => target,
        Seen::Silent(_) | Seen::NotYetConnected => {
            let message = format!(
                "Removal waits for cluster {cluster} to answer: the environment is removed there first."
            );
            say_removing(environment, context, &message).await?;
            return Err(ReconcileError::RemovalOnCluster(message));
        }
    };
    let hub_namespace = environment.namespace().unwrap_or_default();
    let name =
        crate::model::naming::record_name("environment", &hub_namespace, &environment.name_any());
    let live = target.environment(&name);
    if live.as_deref().is_some_and(|l| !stands_for(l, environment)) {
        // Not this environment's record (another's of the same name): nothing of it is there.
        return Ok(());
    }
    let message = format!("Being removed on cluster {cluster}.");
    if live
        .as_deref()
        .is_some_and(|l| l.metadata.deletion_timestamp.is_some())
    {
        // Deleted already: its previewd is removing it.
        say_removing(environment, context, &message).await?;
        return Err(ReconcileError::RemovalOnCluster(message));
    }
    let api: Api<PreviewEnvironment> = Api::namespaced(target.client.clone(), &target.namespace);
    // Only the record the cache showed, if it showed one: never a newer one of the same name.
    let params = DeleteParams {
        preconditions: live
            .as_deref()
            .and_then(|l| l.uid())
            .map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..DeleteParams::background()
    };
    let delete = api.delete(&name, &params);
    match context.writer.write("target_record", delete).await {
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => {
            return Err(ReconcileError::Target {
                cluster: cluster.to_string(),
                error,
            });
        }
        Ok(_) => {}
    }
    say_removing(environment, context, &message).await?;
    Err(ReconcileError::RemovalOnCluster(message))
}

async fn say_removing(
    environment: &PreviewEnvironment,
    context: &Context,
    message: &str,
) -> Result<(), ReconcileError> {
    // The status before stays, the cluster with it.
    let status = held_status(
        environment,
        Phase::Terminating,
        ReadyReason::RemovedOnCluster,
        message,
        None,
        chrono::Utc::now(),
    );
    write_status(environment, context, status).await
}
