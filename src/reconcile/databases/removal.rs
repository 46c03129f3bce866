//! Removal: an environment's branches and their roles are dropped once its namespace is gone
//! (its pods can no longer write to them), before the finalizer lets the record go. A server
//! that does not answer holds the removal, which says so and is tried again with backoff.

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::super::context::Context;
use super::super::error::ReconcileError;
use crate::database::names;
use crate::model::crd::PreviewEnvironment;

/// How long dropping one branch may take before the removal is tried again.
const DROP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Drops every branch the environment holds: those its status lists, and those its
/// template's databases would name (a branch made by a previewd stopped before the status
/// was written). A server no longer registered is left alone: its operator took it away.
pub async fn drop_branches(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<(), ReconcileError> {
    let held = branches_of(environment, context);
    if held.is_empty() {
        return Ok(());
    }
    if context.databases.config.credentials_namespace.is_none() {
        tracing::warn!(environment = %environment.name_any(), "databases are off in this previewd: the environment's branches are left on their servers");
        return Ok(());
    }
    if !context.databases.listed().await {
        let why = "removal waits: the registered database servers are not listed yet";
        return Err(ReconcileError::Database(why.into()));
    }
    for (server_name, branch) in held {
        let Some(server) = context.databases.server(&server_name) else {
            tracing::warn!(server = %server_name, branch = %branch, "the environment's database server is no longer registered; its branch is left there");
            continue;
        };
        let connection = context
            .databases
            .connect(&context.client, &server_name, &server.spec)
            .await
            .map_err(|message| removal_waits(&server_name, &message))?;
        let dropping = connection.drop_branch(&branch);
        tokio::time::timeout(DROP_TIMEOUT, dropping)
            .await
            .map_err(|_| removal_waits(&server_name, "the drop did not finish within 2 min"))?
            .map_err(|e| removal_waits(&server_name, &e.to_string()))?;
    }
    wake_the_queue(context);
    Ok(())
}

/// `(server, branch)` of each database the environment may hold: those its status lists, and
/// those its template's databases name. Only names previewd gives this environment (its UID
/// and a database's name): a status written by hand, or read back from another cluster, names
/// nothing else to drop.
fn branches_of(environment: &PreviewEnvironment, context: &Context) -> Vec<(String, String)> {
    let uid = environment.metadata.uid.as_deref().unwrap_or_default();
    let mut held: Vec<(String, String)> = environment
        .status
        .iter()
        .flat_map(|status| &status.databases)
        .filter(|d| d.branch == names::branch(uid, &d.name))
        .map(|d| (d.server.clone(), d.branch.clone()))
        .collect();
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
