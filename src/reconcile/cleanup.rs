//! The finalizer's work when a `PreviewEnvironment` is deleted: tell the forge, delete the
//! environment's namespace (only one previewd created for it), and wait until it is gone
//! before the record may disappear, so that a new environment of the same name never meets
//! the old one's objects.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::claim::{Ownership, ownership};
use super::context::Context;
use super::error::ReconcileError;
use super::hold::start_queued;
use super::status::held_status;
use super::write::{publish, write_status_only};
use crate::model::crd::{Phase, PreviewEnvironment};
use crate::model::metadata::deletion_reason;
use crate::model::naming::environment_namespace;

pub async fn cleanup(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let Some(namespace) = namespace_of(environment, context) else {
        return Ok(Action::await_change());
    };
    let namespaces: Api<Namespace> = Api::all(context.client.clone());
    let existing = namespaces
        .get_opt(&namespace)
        .await
        .map_err(ReconcileError::Cleanup)?;
    let Some(existing) = existing else {
        // Gone: the finalizer may be released.
        context.applier.forget_namespace(&namespace);
        context.memory.forget(&ObjectRef::from_obj(environment));
        return Ok(Action::await_change());
    };
    // Never delete a namespace previewd did not create for this environment.
    if ownership(existing.labels(), environment) != Ownership::Ours {
        tracing::warn!(namespace = %namespace, "previewd did not create this namespace for this environment; leaving it");
        return Ok(Action::await_change());
    }
    if existing.metadata.deletion_timestamp.is_none() {
        delete_namespace(environment, context, &namespaces, &namespace).await?;
    }
    Err(ReconcileError::NamespaceTerminating(namespace))
}

/// The namespace the environment ran in: from its status, else derived from its template.
fn namespace_of(environment: &PreviewEnvironment, context: &Context) -> Option<String> {
    let from_status = environment
        .status
        .as_ref()
        .and_then(|s| s.namespace.clone());
    from_status.or_else(|| {
        context
            .template_of(environment)
            .map(|template| environment_namespace(environment, &template.spec))
    })
}

/// Frees the slot, tells the forge and `kubectl describe` why, and deletes the namespace.
async fn delete_namespace(
    environment: &PreviewEnvironment,
    context: &Context,
    namespaces: &Api<Namespace>,
    namespace: &str,
) -> Result<(), ReconcileError> {
    start_queued(environment, context);
    let reason = deletion_reason(environment);
    report_destroyed(environment, context, &reason).await;
    let terminating = held_status(
        environment,
        Phase::Terminating,
        "Deleting",
        &reason,
        None,
        Utc::now(),
    );
    if let Err(e) = write_status_only(environment, context, terminating).await {
        tracing::debug!(error = %e, "could not write the Terminating status");
    }
    context
        .writer
        .write("delete", namespaces.delete(namespace, &Default::default()))
        .await
        .map_err(ReconcileError::Cleanup)?;
    publish(
        context,
        environment,
        EventType::Normal,
        "Deleting",
        format!("deleting namespace {namespace}: {reason}"),
    )
    .await;
    Ok(())
}

/// Tells the forge the environment is gone. A failure is logged and counted, never blocks the
/// deletion: a forge outage must not keep namespaces alive. But when the forge client only
/// asks to wait a little (it backs off after a recent failure, or a rate limit ends soon), this
/// is the last chance to correct the comment, so it waits (at most 3 times, 10 s each) rather
/// than leave a comment that shows a deleted environment as live.
async fn report_destroyed(environment: &PreviewEnvironment, context: &Context, reason: &str) {
    const PATIENCE: Duration = Duration::from_secs(10);
    let Some(template) = context.template_of(environment) else {
        return;
    };
    let mut attempts = 0;
    let result = loop {
        attempts += 1;
        let result = context
            .reporter
            .report_destroyed(environment, &template, reason)
            .await;
        match result.as_ref().err().and_then(|e| e.retry_after()) {
            Some(wait) if attempts < 3 && wait <= PATIENCE => tokio::time::sleep(wait).await,
            _ => break result,
        }
    };
    if let Err(e) = result {
        context
            .metrics
            .reconcile_errors
            .with_label_values(&["forge"])
            .inc();
        tracing::warn!(environment = %environment.name_any(), error = %e, "could not tell the forge the environment was destroyed");
    }
}
