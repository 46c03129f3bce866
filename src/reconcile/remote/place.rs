//! Placing a new environment: the cluster with the most room among those its template selects
//! (`model::placement`), written into the API as the environment's `status.cluster` with its
//! resourceVersion as precondition. The status subresource, not the spec or an annotation:
//! teams write their environments' spec and metadata, only previewd writes their status. Decisions are taken one at a time in
//! this process, and counted with the placements its cache does not show yet, so that two
//! environments never take one last slot; two replicas cannot both place one environment (the
//! second write meets a conflict).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::cluster::writer::Writer;
use crate::model::crd::{Phase, Placement, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::FIELD_MANAGER_PLACEMENT;
use crate::model::placement::{Candidate, Choice, choose};
use crate::reconcile::context::Context;
use crate::reconcile::error::ReconcileError;
use crate::reconcile::status::{ReadyReason, held_status};
use crate::reconcile::write::write_status;

/// How long a placement written is counted from memory when the cache does not show it.
const PLACED_PATIENCE: Duration = Duration::from_secs(60);
/// How often a waiting environment looks for room again.
const WAITING_RECHECK: Duration = Duration::from_secs(5);

pub async fn place(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    placement: &Placement,
    context: &Context,
) -> Result<Action, ReconcileError> {
    if let Some((phase, message)) = not_placeable(template, context) {
        let reason = ReadyReason::NotPlaced;
        return wait(environment, context, phase, reason, &message, None).await;
    }
    let namespace = environment.namespace().unwrap_or_default();
    let mut placed = context.hub.placing.lock().await;
    let environments = context.caches.environments.state();
    let counts = placed_counts(&environments, &mut placed.0);
    let clusters = context.hub.clusters.state();
    let candidates: Vec<Candidate<'_>> = clusters
        .iter()
        .map(|cluster| Candidate {
            cluster,
            placed: counts.get(&cluster.name_any()).copied().unwrap_or(0),
            reachable: cluster.status.as_ref().is_some_and(|s| s.reachable),
        })
        .collect();
    let ahead = waiting_before(environment, placement, &environments, context);
    match choose(placement, &namespace, &candidates, ahead) {
        Choice::On(cluster) => {
            if place_on(environment, &cluster, context).await? {
                let key = ObjectRef::from_obj(environment);
                placed.0.insert(key, (cluster, Instant::now()));
            }
            // The status's watch event reconciles it on its cluster; this is the net.
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Choice::Full { selected } => {
            let message = format!(
                "Every cluster the template may use ({selected}) is full or does not answer; this environment is placed when one has room."
            );
            let position = ahead.saturating_add(1);
            wait(
                environment,
                context,
                Phase::Queued,
                ReadyReason::Queued,
                &message,
                Some(position),
            )
            .await
        }
        Choice::NoneSelected => {
            let message = format!(
                "No registered cluster has the labels {:?} and admits namespace {namespace}.",
                placement.cluster_selector
            );
            wait(
                environment,
                context,
                Phase::Pending,
                ReadyReason::NotPlaced,
                &message,
                None,
            )
            .await
        }
    }
}

/// Why no environment of `template` can be placed now, if none can: the template asks what a
/// placed environment cannot have (`Degraded`), or placement is off (`Pending`).
fn not_placeable(template: &PreviewTemplate, context: &Context) -> Option<(Phase, String)> {
    if let Some(refusal) = super::refused_template(template) {
        return Some((Phase::Degraded, refusal));
    }
    context.hub.config.credentials_namespace.is_none().then(|| {
        let message = "The template places its environments on registered clusters, and this previewd runs without --cluster-credentials-namespace: placement is off.";
        (Phase::Pending, message.to_string())
    })
}

/// Writes `environment`'s placement on `cluster`; false if it changed meanwhile.
async fn place_on(
    environment: &PreviewEnvironment,
    cluster: &str,
    context: &Context,
) -> Result<bool, ReconcileError> {
    let namespace = environment.namespace().unwrap_or_default();
    let version = environment.resource_version().unwrap_or_default();
    let name = environment.name_any();
    let (client, writer) = (&context.client, &context.writer);
    let written = record_placement(client, writer, &namespace, &name, &version, cluster).await;
    let written = written.map_err(ReconcileError::Placement)?;
    if written {
        tracing::info!(%cluster, "placed the environment");
    }
    Ok(written)
}

/// Records that environment `name` was placed on `cluster` (its `status.cluster`, as
/// `previewd-placement`, counted as `placement`), only if it is still at `resource_version`:
/// another replica that placed it first makes this a conflict, so it is placed once. Returns
/// false if it changed or is gone: decide again from what the cache then holds.
pub async fn record_placement(
    client: &kube::Client,
    writer: &Writer,
    namespace: &str,
    name: &str,
    resource_version: &str,
    cluster: &str,
) -> Result<bool, kube::Error> {
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    let body = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"cluster": {"name": cluster, "reachable": true}},
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_PLACEMENT.into()),
        ..Default::default()
    };
    let patch = Patch::Merge(body);
    match writer
        .write("placement", api.patch_status(name, &params, &patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Environments placed on each cluster: the cache's, and those this process placed that the
/// cache does not show yet (forgotten once it does, or after [`PLACED_PATIENCE`]).
fn placed_counts(
    environments: &[std::sync::Arc<PreviewEnvironment>],
    placed: &mut HashMap<ObjectRef<PreviewEnvironment>, (String, Instant)>,
) -> HashMap<String, u32> {
    let mut counts: HashMap<String, u32> = HashMap::new();
    for environment in environments {
        if let Some(cluster) = super::placed_on(environment) {
            placed.remove(&ObjectRef::from_obj(environment.as_ref()));
            let count = counts.entry(cluster.to_string()).or_default();
            *count = count.saturating_add(1);
        }
    }
    placed.retain(|_, (_, at)| at.elapsed() < PLACED_PATIENCE);
    for (cluster, _) in placed.values() {
        let count = counts.entry(cluster.clone()).or_default();
        *count = count.saturating_add(1);
    }
    counts
}

/// Environments waiting for a cluster before `environment`: not placed yet, not being removed,
/// from templates of its namespace with the same placement, created earlier (then by name).
fn waiting_before(
    environment: &PreviewEnvironment,
    placement: &Placement,
    environments: &[std::sync::Arc<PreviewEnvironment>],
    context: &Context,
) -> u32 {
    let order = |e: &PreviewEnvironment| (e.creation_timestamp(), e.name_any());
    let mine = order(environment);
    let waiting = environments
        .iter()
        .filter(|e| e.namespace() == environment.namespace())
        .filter(|e| e.metadata.deletion_timestamp.is_none())
        .filter(|e| super::placed_on(e).is_none())
        .filter(|e| order(e) < mine)
        // Only those that would be placed now: not one deployed here before its template
        // placed, nor a fork's awaiting approval (either would hold the last slot forever).
        .filter(|e| {
            context.template_of(e).is_some_and(|t| {
                to_place(e, &t) == Some(placement)
                    && !crate::reconcile::queue::awaits_approval(e, &t)
            })
        })
        .count();
    u32::try_from(waiting).unwrap_or(u32::MAX)
}

async fn wait(
    environment: &PreviewEnvironment,
    context: &Context,
    phase: Phase,
    reason: ReadyReason,
    message: &str,
    position: Option<u32>,
) -> Result<Action, ReconcileError> {
    let mut status = held_status(environment, phase, reason, message, None, Utc::now());
    status.queue_position = position;
    write_status(environment, context, status).await?;
    Ok(Action::requeue(WAITING_RECHECK))
}

/// Whether `template` places `environment` now: it has a placement, and the environment was
/// never deployed in previewd's own cluster (one that was keeps running there).
pub fn to_place<'t>(
    environment: &PreviewEnvironment,
    template: &'t PreviewTemplate,
) -> Option<&'t Placement> {
    let deployed_here = environment
        .status
        .as_ref()
        .is_some_and(|s| s.namespace.is_some() && s.cluster.is_none());
    template.spec.placement.as_ref().filter(|_| !deployed_here)
}
