//! Sending manifests (server-side apply, through the applier and its skip cache), and what an
//! apply that failed means for the reconcile: the API server refusing an object's content is a
//! refusal that names it, anything else an error to retry. Every step that applies (the
//! namespace, previewd's access, the guard rails, the waves) goes through here.

use serde_json::Value;

use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use crate::cluster::applier::ApplyError;

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

/// The refusal an apply the API server refused becomes (`ApplyRefused`, retried with backoff).
pub(super) fn refused(error: ApplyError) -> Refusal {
    Refusal {
        reason: RefusalReason::ApplyRefused,
        message: format!("the API server refused {error}"),
        retry: Some(Box::new(ReconcileError::Apply(error))),
        quarantine: None,
        violations: Vec::new(),
    }
}
