//! The waves step: the plan's objects wave after wave (the namespace, previewd's access and the
//! guard rails are applied before, by the pipeline). Objects of a wave are applied concurrently
//! (bounded by `--apply-concurrency`); the next wave starts only when every object of the
//! earlier waves is healthy. Unchanged objects are skipped by the applier's cache, so a
//! reconcile of an unchanged environment sends nothing. And before anything is applied, that
//! the cluster serves every kind the plan uses ([`check_served`]).

use std::collections::BTreeSet;

use serde_json::Value;

use super::apply::{apply, refused};
use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use super::status::Progress;
use crate::cluster::applier::{ApplyError, is_not_served};
use crate::cluster::health::Health;
use crate::cluster::observed::ObjectKey;
use crate::plan::Plan;
use crate::plan::render::RenderedObject;

/// Applies wave after wave; stops applying at the first wave that is not healthy yet (later
/// waves are still listed, as waiting).
pub async fn apply_waves(
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

/// Before anything is applied: every kind the plan uses is one the cluster serves (discovered
/// once per kind and cached by the applier), and serves as a namespaced kind. A kind it does not
/// serve (a CRD not installed, an apiVersion this Kubernetes does not have) refuses the plan with
/// `KindNotServed`, naming the object, before the namespace is created; it is retried with
/// backoff, since installing the CRD fixes it. A cluster-scoped kind (an operator allowed one by
/// mistake) is refused by the guard's rule: only namespaced objects, only in the environment.
pub(super) async fn check_served(plan: &Plan, context: &Context) -> Result<(), Stop> {
    for rendered in &plan.objects {
        let (api_version, kind) = (rendered.api_version(), rendered.kind());
        let error = match context.applier.discover(api_version, kind).await {
            Ok(found) if found.namespaced => continue,
            Ok(_) => return Err(Stop::Refused(cluster_scoped(rendered))),
            Err(error) => error,
        };
        let failed = ApplyError::of(&rendered.object, error);
        if !is_not_served(&failed.source) {
            // Discovery or the kind's watch refused (previewd's RBAC): said as an apply would.
            return Err(match failed.is_refused() {
                true => Stop::Refused(refused(failed)),
                false => Stop::Failed(ReconcileError::Apply(failed)),
            });
        }
        return Err(Stop::Refused(Refusal {
            reason: RefusalReason::KindNotServed,
            message: format!(
                "this cluster does not serve {api_version} {kind}, which {kind} {} (from {}) uses: install the CRD that defines it, or use an apiVersion the cluster serves; nothing was applied",
                failed.name, rendered.manifest
            ),
            retry: Some(Box::new(ReconcileError::Apply(failed))),
            quarantine: None,
            violations: Vec::new(),
        }));
    }
    Ok(())
}

fn cluster_scoped(rendered: &RenderedObject) -> Refusal {
    Refusal::new(
        RefusalReason::GuardRejected,
        format!(
            "{}/{} (from {}): {} {} is cluster-scoped in this cluster; templates may create only namespaced objects, in the environment's namespace (remove it from --template-kinds); nothing was applied",
            rendered.kind(),
            rendered.name(),
            rendered.manifest,
            rendered.api_version(),
            rendered.kind()
        ),
    )
}
