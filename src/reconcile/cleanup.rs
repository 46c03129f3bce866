//! The finalizer's work when a `PreviewEnvironment` is deleted: tell the forge, delete the
//! environment's namespace (only one previewd created for it), and wait until it is gone
//! before the record may disappear, so that a new environment of the same name never meets
//! the old one's objects.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::claim::{Ownership, ownership};
use super::context::Context;
use super::error::ReconcileError;
use super::hold::start_queued;
use super::status::{ReadyReason, held_status};
use super::write::{publish, write_status, write_status_only};
use crate::forge::client::MAX_RATE_LIMIT_WAIT;
use crate::forge::template_client::ForgeCallError;
use crate::model::crd::{ForgeReport, Phase, PreviewEnvironment};
use crate::model::metadata::deletion_reason;
use crate::model::naming::environment_namespace;

/// How long a removed environment's record waits for a failing forge to hear that it is gone,
/// counted from the record's deletion. The namespace is deleted meanwhile (a forge outage must
/// never keep namespaces alive); only the record, and so a new environment of the same name,
/// waits.
pub const FORGE_PATIENCE_AFTER_DELETION: Duration = Duration::from_secs(120);

pub async fn cleanup(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Action, ReconcileError> {
    if let Some(cluster) = super::remote::placed_on(environment) {
        super::remote::remove_from_cluster(environment, cluster, context).await?;
        return tell_forge_it_is_gone(environment, context).await;
    }
    let Some(namespace) = namespace_of(environment, context) else {
        super::databases::drop_branches(environment, context).await?;
        return Ok(Action::await_change());
    };
    let namespaces: Api<Namespace> = Api::all(context.client.clone());
    let existing = namespaces
        .get_opt(&namespace)
        .await
        .map_err(ReconcileError::Cleanup)?;
    let Some(existing) = existing else {
        return release(environment, context, &namespace).await;
    };
    // Never delete a namespace previewd did not create for this environment.
    if ownership(existing.labels(), environment) != Ownership::Ours {
        tracing::warn!(namespace = %namespace, "previewd did not create this namespace for this environment; leaving it");
        if let Err(e) = tell_forge_again(environment, context).await {
            note_forge_failure(environment, context, &e);
        }
        return Ok(Action::await_change());
    }
    if existing.metadata.deletion_timestamp.is_none() {
        delete_namespace(environment, context, &namespaces, &namespace).await?;
    } else {
        if let Err(e) = tell_forge_again(environment, context).await {
            // A process killed, or a forge failing, before the forge heard: it hears now.
            note_forge_failure(environment, context, &e);
        }
        say_what_holds(environment, context, &existing).await;
    }
    Err(ReconcileError::NamespaceTerminating(namespace))
}

/// A namespace still terminating past `--namespace-hold-grace` is held by something: a
/// finalizer no controller removes, a controller that is down. Removal never waits silently:
/// the environment says what the namespace's own conditions say (`NamespaceHeld`), in its
/// status, its PR comment and an Event, and `previewd_namespace_holds_total` counts it once.
async fn say_what_holds(
    environment: &PreviewEnvironment,
    context: &Context,
    namespace: &Namespace,
) {
    let deleted = namespace.metadata.deletion_timestamp.as_ref();
    let Some(since) = deleted.and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0))
    else {
        return;
    };
    let grace = TimeDelta::from_std(context.config.namespace_hold_grace).unwrap_or(TimeDelta::MAX);
    let now = Utc::now();
    if now.signed_duration_since(since) < grace {
        return;
    }
    let message = what_holds(namespace, since);
    let ready = environment
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let said_before = ready.filter(|c| c.reason == ReadyReason::NamespaceHeld.as_str());
    if said_before.is_some_and(|c| c.message == message) {
        return;
    }
    let first = said_before.is_none();
    let held = held_status(
        environment,
        Phase::Terminating,
        ReadyReason::NamespaceHeld,
        &message,
        None,
        now,
    );
    if let Err(e) = write_status(environment, context, held).await {
        tracing::debug!(error = %e, "could not say what holds the namespace");
        return;
    }
    if first {
        context.metrics.namespace_holds.inc();
    }
    publish(
        context,
        environment,
        EventType::Warning,
        ReadyReason::NamespaceHeld.as_str(),
        message,
    )
    .await;
}

/// What the namespace's conditions say holds it (Kubernetes' namespace controller writes them).
/// The same words while nothing changes (no clock in them: each new message is a status write
/// and a PR comment edit).
fn what_holds(namespace: &Namespace, since: DateTime<Utc>) -> String {
    let since = since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let name = namespace.name_any();
    let said: Vec<String> = namespace
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status == "True")
        .filter_map(|c| c.message.clone())
        .collect();
    let holds = if said.is_empty() {
        "its conditions name nothing yet (its controller may be down)".to_string()
    } else {
        said.join("; ")
    };
    format!(
        "namespace {name} has been terminating since {since}: {holds}; previewd removes the environment once it is gone"
    )
}

/// The namespace is gone: the finalizer may be released once the forge has heard, or cannot
/// hear soon (see [`forge_worth_waiting_for`]).
async fn release(
    environment: &PreviewEnvironment,
    context: &Context,
    namespace: &str,
) -> Result<Action, ReconcileError> {
    // The namespace is gone, and with it everything that could write to the branches.
    super::databases::drop_branches(environment, context).await?;
    let action = tell_forge_it_is_gone(environment, context).await?;
    // The reconciler's and the reporter's memory of the environment are dropped once the
    // finalizer is gone (the controller does it): if removing it fails, the next look must
    // still know what the forge was told.
    context.applier.forget_namespace(namespace);
    Ok(action)
}

/// The environment is gone from where it ran: the forge hears it (or cannot hear soon), then
/// the finalizer may be released.
async fn tell_forge_it_is_gone(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Action, ReconcileError> {
    if let Err(e) = tell_forge_again(environment, context).await {
        let deleted_at = environment.metadata.deletion_timestamp.as_ref();
        let deleted_at = deleted_at.and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0));
        if forge_worth_waiting_for(&e, deleted_at, Utc::now()) {
            return Err(ReconcileError::ForgeNotTold(e));
        }
        if e.waits_for_budget().is_some() {
            // Given up: said and counted, unlike a turn that is still coming.
            tracing::warn!(environment = %environment.name_any(), "the forge was not told the environment is gone: its turn in the content budget is more than an hour after the deletion");
            context
                .metrics
                .reconcile_errors
                .with_label_values(&["forge"])
                .inc();
        }
        note_forge_failure(environment, context, &e);
    }
    Ok(Action::await_change())
}

/// Whether a removed environment's record should wait for the forge to hear it is gone: only
/// while trying again may help, and for at most [`FORGE_PATIENCE_AFTER_DELETION`] (a forge
/// that asks to wait beyond that is not waited for at all).
fn forge_worth_waiting_for(
    error: &ForgeCallError,
    deleted_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    // A report waiting its turn in the content budget will go: it is waited for up to the
    // longest turn there is.
    let patience = match error.waits_for_budget() {
        Some(_) => MAX_RATE_LIMIT_WAIT,
        None => FORGE_PATIENCE_AFTER_DELETION,
    };
    let patience = TimeDelta::from_std(patience).unwrap_or_default();
    let waited = deleted_at.map_or(TimeDelta::MAX, |at| now.signed_duration_since(at));
    let asked = error.retry_after().unwrap_or_default();
    let asked = TimeDelta::from_std(asked).unwrap_or(TimeDelta::MAX);
    error.is_transient() && waited.checked_add(&asked).is_some_and(|end| end < patience)
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
    let (told, result) = tell_forge(environment, context).await;
    if let Err(e) = &result {
        // Never blocks the deletion: a forge outage must not keep namespaces alive. It is told
        // again while the namespace terminates, and after.
        note_forge_failure(environment, context, e);
    }
    let mut terminating = held_status(
        environment,
        Phase::Terminating,
        ReadyReason::Deleting,
        &reason,
        None,
        Utc::now(),
    );
    terminating.forge = told.or(terminating.forge);
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

/// Tells the forge the environment is gone, unless it has heard (`status.forge.destroyed`).
/// Returns what was sent, for `status.forge`; `None` when the template (and with it the forge)
/// is gone.
async fn tell_forge(
    environment: &PreviewEnvironment,
    context: &Context,
) -> (Option<ForgeReport>, Result<(), ForgeCallError>) {
    let Some(template) = context.template_of(environment) else {
        return (None, Ok(()));
    };
    let reason = deletion_reason(environment);
    let (record, result) = context
        .reporter
        .report_destroyed(environment, &template, &reason)
        .await;
    (Some(record), result)
}

/// [`tell_forge`] after the Terminating status was written: what was sent goes into it.
async fn tell_forge_again(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<(), ForgeCallError> {
    let (told, result) = tell_forge(environment, context).await;
    let mut status = environment.status.clone().unwrap_or_default();
    if told.is_some() && status.forge != told {
        status.forge = told;
        if let Err(e) = write_status_only(environment, context, status).await {
            tracing::debug!(error = %e, "could not record what the forge was told");
        }
    }
    result
}

/// Logs and counts a failed report of the removal. A report the forge client held back (it is
/// backing off, or rate-limited) is tried again at the next look, quietly.
fn note_forge_failure(environment: &PreviewEnvironment, context: &Context, error: &ForgeCallError) {
    if error.retry_after().is_some() {
        tracing::debug!(environment = %environment.name_any(), error = %error, "the forge has not heard the environment is gone yet");
        return;
    }
    context
        .metrics
        .reconcile_errors
        .with_label_values(&["forge"])
        .inc();
    tracing::warn!(environment = %environment.name_any(), error = %error, "could not tell the forge the environment was destroyed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::client::ForgeApiError;

    fn answered(status: u16) -> ForgeCallError {
        ForgeCallError::Forge(ForgeApiError::Http {
            operation: "edit comment",
            status,
            message: String::new(),
        })
    }

    #[test]
    fn a_removed_environment_waits_for_a_failing_forge_two_minutes_at_most() {
        let deleted = Utc::now();
        let backing_off = ForgeCallError::Forge(ForgeApiError::BackingOff {
            operation: "edit comment",
            wait: Duration::from_secs(4),
        });
        // The last try is one that can end within the 2 minutes: a forge client backing off
        // for 4 s more has 4 s less.
        for (error, last) in [(answered(503), 119), (backing_off, 115)] {
            let after = |seconds| deleted + TimeDelta::seconds(seconds);
            assert!(forge_worth_waiting_for(&error, Some(deleted), after(1)));
            assert!(forge_worth_waiting_for(&error, Some(deleted), after(last)));
            assert!(!forge_worth_waiting_for(
                &error,
                Some(deleted),
                after(last + 1)
            ));
        }
    }

    #[test]
    fn a_forge_that_refuses_is_not_waited_for() {
        let deleted = Utc::now();
        for status in [401, 403, 404, 422] {
            assert!(!forge_worth_waiting_for(
                &answered(status),
                Some(deleted),
                deleted
            ));
        }
        let no_token = ForgeCallError::Token(crate::cluster::secrets::SecretError::NotFound {
            namespace: "team".into(),
            name: "forge-token".into(),
        });
        assert!(!forge_worth_waiting_for(&no_token, Some(deleted), deleted));
    }

    #[test]
    fn a_forge_asking_to_wait_beyond_the_patience_is_not_waited_for() {
        let deleted = Utc::now();
        let limited = |seconds| {
            ForgeCallError::Forge(ForgeApiError::RateLimited {
                operation: "edit comment",
                wait: Duration::from_secs(seconds),
            })
        };
        let now = deleted + TimeDelta::seconds(30);
        assert!(forge_worth_waiting_for(&limited(60), Some(deleted), now));
        assert!(!forge_worth_waiting_for(&limited(90), Some(deleted), now));
        assert!(!forge_worth_waiting_for(
            &limited(3_600),
            Some(deleted),
            now
        ));
    }

    /// docs/forges.md: "A removed environment's record waits up to an hour for its removal's
    /// turn": a turn in the content budget is not a failing forge; the report will go.
    #[test]
    fn a_removal_waiting_its_turn_in_the_content_budget_is_waited_for_up_to_an_hour() {
        let deleted = Utc::now();
        let turn = |seconds| {
            ForgeCallError::Forge(ForgeApiError::ContentBudget {
                wait: Duration::from_secs(seconds),
            })
        };
        let now = deleted + TimeDelta::seconds(30);
        assert!(forge_worth_waiting_for(&turn(600), Some(deleted), now));
        assert!(forge_worth_waiting_for(&turn(3_000), Some(deleted), now));
        let later = deleted + TimeDelta::minutes(59);
        assert!(!forge_worth_waiting_for(&turn(120), Some(deleted), later));
    }
}
