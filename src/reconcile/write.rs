//! The write step: the status (only when it changed), the report to the forge that goes with
//! it, and an Event for an outcome (a commit deployed, a failure, asleep, queued).
//!
//! The forge is told first, so that what was sent is recorded by the same status write; a forge
//! failure still lets the status be written, and is returned afterwards to be retried.

use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::time::{Duration, Instant};

use super::context::Context;
use super::error::ReconcileError;
use super::status::merge_patch;
use crate::forge::client::MAX_RATE_LIMIT_WAIT;
use crate::model::crd::{Phase, PreviewEnvironment, PreviewEnvironmentStatus};
use crate::model::metadata::FIELD_MANAGER_RECONCILE;

/// Reports `status` to the forge, then writes it if it differs from what the object holds.
pub async fn write_status(
    environment: &PreviewEnvironment,
    context: &Context,
    mut status: PreviewEnvironmentStatus,
) -> Result<(), ReconcileError> {
    let mut forge_result = Ok(());
    if let Some(template) = context.template_of(environment) {
        let report = context.reporter.report(environment, &template, &status);
        let (record, result) = context.metrics.timed("report", report).await;
        status.forge = record;
        forge_result = match result {
            Err(e) if let Some(wait) = e.waits_for_budget() => {
                come_back_for_the_report(environment, context, wait);
                Ok(())
            }
            other => other.map_err(ReconcileError::Forge),
        };
    }
    let result = write_status_only(environment, context, status).await;
    result.and(forge_result)
}

/// A report waiting its turn in the content budget is no failure: the reconcile goes on (the
/// status is written, the rest of the pipeline runs, its own requeue stands), and the
/// environment is reconciled again at the report's turn, once however many reconciles meet
/// the wait.
fn come_back_for_the_report(environment: &PreviewEnvironment, context: &Context, wait: Duration) {
    let key = ObjectRef::from_obj(environment);
    let now = Instant::now();
    let turn = now + wait.clamp(Duration::from_millis(200), MAX_RATE_LIMIT_WAIT);
    if !context.memory.take_report_turn(&key, now, turn) {
        return;
    }
    tracing::debug!(environment = %environment.name_any(), "the forge report waits {wait:?} for its turn in the content budget");
    let trigger = context.reconcile_trigger.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(turn.into()).await;
        let _ = trigger.send(key);
    });
}

/// Writes `status` if it differs from what the object holds (a merge patch that also clears
/// what the new status leaves out); publishes an Event when the phase changes.
pub async fn write_status_only(
    environment: &PreviewEnvironment,
    context: &Context,
    status: PreviewEnvironmentStatus,
) -> Result<(), ReconcileError> {
    if environment.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let previous = environment.status.clone().unwrap_or_default();
    let api: Api<PreviewEnvironment> = Api::namespaced(
        context.client.clone(),
        &environment.namespace().unwrap_or_default(),
    );
    let patch = serde_json::json!({ "status": merge_patch(
        &serde_json::to_value(&previous).unwrap_or_default(),
        &serde_json::to_value(&status).unwrap_or_default(),
    ) });
    let name = environment.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_RECONCILE.into()),
        ..Default::default()
    };
    let patch = Patch::Merge(patch);
    let write = context
        .writer
        .write("status", api.patch_status(&name, &params, &patch));
    let written = context
        .metrics
        .timed("status", write)
        .await
        .map_err(ReconcileError::Status)?;
    context.memory.wrote_status(
        &ObjectRef::from_obj(environment),
        &environment.resource_version().unwrap_or_default(),
        &written.resource_version().unwrap_or_default(),
    );
    let new_commit = status.phase == Phase::Ready && previous.deployed_sha != status.deployed_sha;
    if previous.phase != status.phase || environment.status.is_none() || new_commit {
        announce_phase(environment, context, &previous, &status).await;
    }
    Ok(())
}

/// Logs a phase change, and records an outcome as an Event (a warning for `Degraded`): the
/// way `kubectl describe` shows a Deployment's rollouts, one Event per commit deployed or per
/// failure, not one per step on the way (`Pending`, `Deploying`, `Seeding` are in the status).
async fn announce_phase(
    environment: &PreviewEnvironment,
    context: &Context,
    previous: &PreviewEnvironmentStatus,
    status: &PreviewEnvironmentStatus,
) {
    let message = status
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    tracing::info!(
        from = previous.phase.as_str(),
        to = status.phase.as_str(),
        "phase changed: {message}"
    );
    let (kind, note) = match status.phase {
        Phase::Degraded => (EventType::Warning, message),
        Phase::Ready => {
            let sha = status.deployed_sha.as_deref().unwrap_or_default();
            let short = sha.get(..7).unwrap_or(sha);
            (EventType::Normal, format!("{short} deployed: {message}"))
        }
        Phase::Sleeping | Phase::Queued => (EventType::Normal, message),
        Phase::Pending | Phase::Deploying | Phase::Seeding | Phase::Terminating => return,
    };
    publish(context, environment, kind, status.phase.as_str(), note).await;
}

/// Records an Event on the environment; a failure is logged, never fails the reconcile.
pub async fn publish(
    context: &Context,
    environment: &PreviewEnvironment,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = environment.object_ref(&());
    let publish = context
        .writer
        .write("event", context.recorder.publish(&event, &reference));
    let published = context.metrics.timed("event", publish).await;
    if let Err(e) = published {
        tracing::debug!(error = %e, "could not publish an event");
    }
}
