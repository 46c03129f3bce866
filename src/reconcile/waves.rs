//! The apply step: the namespace and its guard rails, then the objects wave after wave. Objects
//! of a wave are applied concurrently (bounded by `--apply-concurrency`); the next wave starts
//! only when every object of the earlier waves is healthy. Unchanged objects are skipped by the
//! applier's cache, so a reconcile of an unchanged environment sends nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::context::Context;
use super::error::{ReconcileError, Refusal, Stop};
use super::plan::Plan;
use super::plan::render::RenderedObject;
use super::status::Progress;
use super::{access, namespace};
use crate::cluster::applier::ApplyError;
use crate::cluster::health::Health;
use crate::cluster::observed::ObjectKey;
use crate::model::crd::PreviewTemplate;

/// Applies the plan: namespace (already claimed, with `namespace_labels`), guard rails, then
/// the waves; returns how far it got.
pub async fn apply_plan(
    plan: &Plan,
    template: &PreviewTemplate,
    namespace_labels: &BTreeMap<String, String>,
    context: &Context,
    bypass_cache: bool,
) -> Result<Progress, Stop> {
    let namespace_object = namespace::namespace_object(&plan.namespace, namespace_labels);
    apply(context, &[&namespace_object], bypass_cache).await?;
    access::grant(&plan.namespace, &plan.labels, context, bypass_cache).await?;
    let guard_rails = namespace::guard_rails(&plan.namespace, &template.spec, &plan.labels);
    apply(
        context,
        &guard_rails.iter().collect::<Vec<_>>(),
        bypass_cache,
    )
    .await?;
    apply_waves(&plan.objects, context, bypass_cache).await
}

/// Applies wave after wave; stops applying at the first wave that is not healthy yet (later
/// waves are still listed, as waiting).
async fn apply_waves(
    objects: &[RenderedObject],
    context: &Context,
    bypass_cache: bool,
) -> Result<Progress, Stop> {
    let waves: BTreeSet<i32> = objects.iter().map(|o| o.wave).collect();
    let mut progress = Progress::default();
    for wave in waves {
        let members: Vec<&RenderedObject> = objects.iter().filter(|o| o.wave == wave).collect();
        let health: Vec<Health> = if progress.may_continue() {
            let manifests: Vec<&Value> = members.iter().map(|o| &o.object).collect();
            apply(context, &manifests, bypass_cache).await?;
            members
                .iter()
                .map(|o| context.applier.health(&ObjectKey::of(&o.object)))
                .collect()
        } else {
            let waiting =
                Health::Progressing(format!("waiting for wave {}", wave.saturating_sub(1)));
            vec![waiting; members.len()]
        };
        progress.add_wave(wave, &members, &health);
    }
    Ok(progress)
}

/// Applies `manifests`; returns how many were sent. The API server refusing an object's content
/// is a refusal that names it (and is retried with backoff, since a template edit or a cluster
/// change may fix it); any other failure is an error to retry.
pub(super) async fn apply(
    context: &Context,
    manifests: &[&Value],
    bypass_cache: bool,
) -> Result<usize, Stop> {
    match context.applier.apply(manifests, bypass_cache).await {
        Ok(stats) => Ok(stats.sent),
        Err(error) if error.is_refused() => Err(Stop::Refused(refused(error))),
        Err(error) => Err(Stop::Failed(ReconcileError::Apply(error))),
    }
}

fn refused(error: ApplyError) -> Refusal {
    Refusal {
        reason: "ApplyRefused",
        message: format!("the API server refused {error}"),
        retry: Some(Box::new(ReconcileError::Apply(error))),
    }
}
