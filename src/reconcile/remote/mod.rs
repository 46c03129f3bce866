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

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use super::config::PlacementConfig;
pub use hub::Target;
pub use looks::look_after_clusters;
pub use place::{place, to_place};
pub use records::Reach;

use super::context::Context;
use super::error::ReconcileError;
use super::status::{ReadyReason, held_status};
use super::write::write_status;
use crate::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::{ANNOTATION_CLUSTER, FIELD_MANAGER_PLACEMENT};
use records::{already_says, environment_record, mirrored_status, template_record};

/// The registered cluster `environment` was placed on, if any.
pub fn placed_on(environment: &PreviewEnvironment) -> Option<&str> {
    environment
        .annotations()
        .get(ANNOTATION_CLUSTER)
        .map(String::as_str)
}

/// Whether cluster `name` answers, as its status says (a cluster unregistered, or never seen
/// answering, does not).
fn reach_of(context: &Context, name: &str) -> Reach {
    let status = context.hub.cluster(name).and_then(|c| c.status.clone());
    match status {
        Some(status) if status.reachable => Reach::Answers,
        Some(status) => Reach::Silent(status.since.unwrap_or_else(chrono::Utc::now)),
        None => Reach::Silent(chrono::Utc::now()),
    }
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
    let target = context.hub.target(cluster);
    let (Reach::Answers, Some(target)) = (reach_of(context, cluster), target) else {
        let silent = match reach_of(context, cluster) {
            Reach::Answers => Reach::Silent(chrono::Utc::now()),
            silent => silent,
        };
        let status = mirrored_status(environment, None, cluster, silent);
        write_status(environment, context, status).await?;
        return Ok(Action::requeue(context.hub.config.look_interval));
    };
    let template_record = template_record(template, &target.namespace);
    let live_template = target.template(&template_record.name_any());
    if !already_says(live_template.as_deref(), &template_record, |t| {
        serde_json::to_value(&t.spec).unwrap_or_default()
    }) {
        write_record(&target, cluster, &template_record, context).await?;
    }
    let record = environment_record(environment, &template_record, &target.namespace);
    let live = target.environment(&record.name_any());
    if !already_says(live.as_deref(), &record, |e| {
        serde_json::to_value(&e.spec).unwrap_or_default()
    }) {
        write_record(&target, cluster, &record, context).await?;
    }
    let status = mirrored_status(environment, live.as_deref(), cluster, Reach::Answers);
    write_status(environment, context, status).await?;
    Ok(Action::requeue(context.config.resync_interval))
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
    let target = context.hub.target(cluster);
    let (Reach::Answers, Some(target)) = (reach_of(context, cluster), target) else {
        let message = format!(
            "Removal waits for cluster {cluster} to answer: the environment is removed there first."
        );
        say_removing(environment, context, &message).await?;
        return Err(ReconcileError::RemovalOnCluster(message));
    };
    let hub_namespace = environment.namespace().unwrap_or_default();
    let name =
        crate::model::naming::record_name("environment", &hub_namespace, &environment.name_any());
    let message = format!("Being removed on cluster {cluster}.");
    if target
        .environment(&name)
        .is_some_and(|live| live.metadata.deletion_timestamp.is_some())
    {
        // Deleted already: its previewd is removing it.
        say_removing(environment, context, &message).await?;
        return Err(ReconcileError::RemovalOnCluster(message));
    }
    let api: Api<PreviewEnvironment> = Api::namespaced(target.client.clone(), &target.namespace);
    let params = DeleteParams::background();
    let delete = api.delete(&name, &params);
    let gone = match context.writer.write("target_record", delete).await {
        Err(kube::Error::Api(status)) if status.code == 404 => true,
        Err(error) => {
            return Err(ReconcileError::Target {
                cluster: cluster.to_string(),
                error,
            });
        }
        Ok(_) => false,
    };
    if gone {
        return Ok(());
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
