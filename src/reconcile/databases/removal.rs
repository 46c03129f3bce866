//! Removal: an environment's branches and their roles are dropped once its namespace is gone
//! (its pods can no longer write to them), before the finalizer lets the record go. A server
//! that does not answer holds the removal, which says so and is tried again with backoff.

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::super::context::Context;
use super::super::error::ReconcileError;
use crate::database::names;
use crate::model::crd::PreviewEnvironment;

/// Drops every branch the environment holds: those its status lists, and those its
/// template's databases would name (a branch made by a previewd stopped before the status
/// was written). A server no longer registered is left alone: its operator took it away.
pub async fn drop_branches(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<(), ReconcileError> {
    let mut dropped = false;
    for (server_name, branch) in branches_of(environment, context) {
        let Some(server) = context.databases.server(&server_name) else {
            tracing::warn!(server = %server_name, branch = %branch, "the environment's database server is no longer registered; its branch is left there");
            continue;
        };
        let connection = context
            .databases
            .connect(&context.client, &server_name, &server.spec)
            .await
            .map_err(|message| removal_waits(&server_name, &message))?;
        connection
            .drop_branch(&branch)
            .await
            .map_err(|e| removal_waits(&server_name, &e.to_string()))?;
        dropped = true;
    }
    if dropped {
        wake_the_queue(context);
    }
    Ok(())
}

/// `(server, branch)` of each database the environment may hold.
fn branches_of(environment: &PreviewEnvironment, context: &Context) -> Vec<(String, String)> {
    let mut held: Vec<(String, String)> = environment
        .status
        .iter()
        .flat_map(|status| &status.databases)
        .map(|d| (d.server.clone(), d.branch.clone()))
        .collect();
    let uid = environment.metadata.uid.as_deref().unwrap_or_default();
    if let Some(template) = context.template_of(environment) {
        for wanted in &template.spec.databases {
            held.push((wanted.server.clone(), names::branch(uid, &wanted.name)));
        }
    }
    held.sort();
    held.dedup();
    held
}

fn removal_waits(server: &str, message: &str) -> ReconcileError {
    ReconcileError::Database(format!(
        "removal waits for database server {server}, which holds this environment's branch: {message}"
    ))
}

/// Asks for a reconcile of every environment queued for a branch: a place is free.
fn wake_the_queue(context: &Context) {
    for queued in context.caches.environments.state() {
        if super::queued_for_a_branch(&queued) {
            tracing::debug!(environment = %queued.name_any(), "a database branch was dropped: the queue moves");
            let _ = context
                .reconcile_trigger
                .send(ObjectRef::from_obj(&*queued));
        }
    }
}
