//! The prune step: deletes the objects (and seed Jobs) the previous render produced and this
//! one does not. The previous render is what the status lists, so this survives restarts; it
//! runs in every reconcile, not only once Ready, because the next status write replaces that
//! list and would forget what to delete.

use std::collections::BTreeSet;

use kube::ResourceExt;

use super::context::Context;
use super::error::ReconcileError;
use crate::cluster::observed::ObjectKey;
use crate::model::crd::{PreviewEnvironment, PreviewEnvironmentStatus};
use crate::plan::render::RenderedObject;

pub async fn prune(
    environment: &PreviewEnvironment,
    objects: &[RenderedObject],
    context: &Context,
) -> Result<(), ReconcileError> {
    let Some(status) = &environment.status else {
        return Ok(());
    };
    let current: BTreeSet<ObjectKey> = objects.iter().map(|o| ObjectKey::of(&o.object)).collect();
    for key in previously_rendered(status)
        .into_iter()
        .filter(|k| !current.contains(k))
    {
        tracing::info!(environment = %environment.name_any(), object = %key, "pruning an object the template no longer renders");
        context
            .applier
            .delete(&key)
            .await
            .map_err(ReconcileError::Prune)?;
    }
    Ok(())
}

/// The objects and seed Jobs the status lists.
fn previously_rendered(status: &PreviewEnvironmentStatus) -> Vec<ObjectKey> {
    let namespace = status.namespace.clone().unwrap_or_default();
    let objects = status.resources.iter().map(|r| ObjectKey {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: namespace.clone(),
        name: r.name.clone(),
    });
    let seeds = status.seeds.iter().map(|s| ObjectKey {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        namespace: namespace.clone(),
        name: s.job.clone(),
    });
    objects.chain(seeds).collect()
}
