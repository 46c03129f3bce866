//! Step: a claim on a storage class that keeps its volumes after their claims are gone
//! (`reclaimPolicy: Retain`) is refused, since every environment removed would leave its
//! volume and disk behind. The classes are the cluster's, read when a plan has claims
//! ([`crate::cluster::storage_classes`]); which claims ask for which class is pure
//! ([`crate::plan::policy::claims`]). The operator may let such claims through
//! (`--allow-retained-volumes`) where volumes are cleaned up by other means.

use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use crate::plan::Plan;
use crate::plan::policy::claims;

pub(super) async fn refuse_retained(plan: &Plan, context: &Context) -> Result<(), Stop> {
    if context.config.operator_policy.allow_retained_volumes {
        return Ok(());
    }
    let asks = plan
        .objects
        .iter()
        .any(|object| !claims::classes_asked(object).is_empty());
    if !asks {
        return Ok(());
    }
    let reclaim = context
        .storage_classes
        .reclaim()
        .await
        .map_err(|e| Stop::Failed(ReconcileError::StorageClasses(e)))?;
    let found = claims::retained(&plan.objects, |class| {
        reclaim.retaining_class(class).map(str::to_string)
    });
    if found.is_empty() {
        return Ok(());
    }
    let message = found
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    Err(Stop::Refused(Refusal::new(
        RefusalReason::PolicyRejected,
        message,
    )))
}
