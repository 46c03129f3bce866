//! The hold step: whether an environment may deploy now. A fork pull request waits for its
//! approval (or is never deployed, by the template's fork policy); beyond the template's cap of
//! concurrent environments it queues, authors' claims before visitors' and each in the order
//! it was made (`queue`), and puts to sleep a peer that runs only for a visitor when it may
//! have that one's slot ([`displace`]). Also hands a freed slot to the next in line.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::error::RefusalReason;
use super::queue::{self, Admission};
use super::status::{ReadyReason, held_status};
use crate::model::crd::{
    ForkPolicy, Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate,
    WaitingCommit, WaitingReason,
};

/// An environment that may not deploy now: the status to write, and when to look again.
pub struct Hold {
    pub status: PreviewEnvironmentStatus,
    pub requeue: Duration,
    /// A peer running only for a visitor, to put to sleep so that this one (an author's) has
    /// its slot (`queue::Admission::Queued::displaces`).
    pub displace: Option<String>,
}

/// Why `environment` may not deploy now, if it may not.
pub fn hold(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    context: &Context,
    now: DateTime<Utc>,
) -> Option<Hold> {
    let resync = context.config.resync_interval;
    if queue::awaits_approval(environment, template) {
        return Some(Hold {
            status: awaiting_approval(environment, template, now),
            requeue: resync,
            displace: None,
        });
    }
    if environment.spec.sleep || queue::runs_whatever_its_peers(environment, template) {
        // The common case, on every reconcile: no look at the other environments at all.
        return None;
    }
    let peers = peers_of(environment, context);
    let peers: Vec<&PreviewEnvironment> = peers.iter().map(|p| p.as_ref()).collect();
    match queue::admission(environment, &peers, template) {
        Admission::Run => None,
        Admission::Queued {
            position,
            cap,
            displaces,
        } => {
            let message = match &displaces {
                Some(_) => format!(
                    "The template runs at most {cap} environments at once; this one starts as soon as one that only a visit to its URL woke goes back to sleep for it."
                ),
                None => format!(
                    "The template runs at most {cap} environments at once; this one starts when one of them is removed or goes to sleep."
                ),
            };
            let mut status = held_status(
                environment,
                Phase::Queued,
                ReadyReason::Queued,
                &message,
                None,
                now,
            );
            status.queue_position = Some(position);
            // The slot is normally handed over at once (see `start_queued`); this is the net.
            let requeue = Duration::from_secs(30).min(resync);
            Some(Hold {
                status,
                requeue,
                displace: displaces,
            })
        }
    }
}

fn awaiting_approval(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    now: DateTime<Utc>,
) -> PreviewEnvironmentStatus {
    let short_sha: String = environment.spec.source.head_sha.chars().take(7).collect();
    let (reason, message) = match template.spec.triggers.fork_policy {
        ForkPolicy::RequireApproval => (
            WaitingReason::AwaitingApproval,
            format!(
                "This pull request comes from a fork: a maintainer must review it and comment `/preview approve {}` to deploy commit `{short_sha}`.",
                environment.spec.source.head_sha
            ),
        ),
        _ => (
            WaitingReason::ForkNotAllowed,
            "This pull request comes from a fork, and the template does not deploy forks (triggers.forkPolicy)."
                .to_string(),
        ),
    };
    let mut status = held_status(
        environment,
        Phase::Pending,
        reason.into(),
        &message,
        None,
        now,
    );
    let head = &environment.spec.source.head_sha;
    let since = environment
        .status
        .as_ref()
        .and_then(|s| s.waiting_since(head))
        .unwrap_or(now);
    status.waiting = Some(WaitingCommit {
        sha: head.clone(),
        reason,
        message,
        since,
    });
    status
}

/// The other environments of the same template, from the cache (the environment included).
/// Filtered in the cache, and compared in place: a copy of every environment's handle and
/// names, for each of thousands of environments on every look, was previewd's busiest work.
fn peers_of(environment: &PreviewEnvironment, context: &Context) -> Vec<Arc<PreviewEnvironment>> {
    context.caches.environments.state_filter(|e| {
        e.spec.template == environment.spec.template
            && e.metadata.namespace == environment.metadata.namespace
    })
}

/// A slot of `environment`'s template just freed up (it is being deleted, or fell asleep):
/// reconcile the queued environments of that template now, so the first in line starts, and
/// those refused because `environment` held their URL host (`HostTaken`; a deleted environment
/// holds nothing), of any template, so they need not wait for the resync.
pub fn start_queued(environment: &PreviewEnvironment, context: &Context) {
    for peer in peers_of(environment, context) {
        let queued = peer
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Phase::Queued);
        if queued && peer.name_any() != environment.name_any() {
            let _ = context.reconcile_trigger.send(ObjectRef::from_obj(&*peer));
        }
    }
    // Two templates may render one host: those refused for it may be anyone's (few, and a
    // reconcile of one that still cannot have the host only says so again).
    if environment
        .status
        .as_ref()
        .and_then(|s| s.host.as_ref())
        .is_none()
    {
        return;
    }
    let me = ObjectRef::from_obj(environment);
    for other in context.caches.environments.state() {
        let host_taken = other.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.reason == RefusalReason::HostTaken.as_str())
        });
        let reference = ObjectRef::from_obj(&*other);
        if host_taken && reference != me {
            let _ = context.reconcile_trigger.send(reference);
        }
    }
}

/// Puts `name`, a peer of `environment` that runs only because a request woke it, to sleep,
/// so that `environment` (its author's) has its slot; the sleep hands the slot over
/// ([`start_queued`]). A write like the sweep's, counted as `queue_displace`.
pub async fn displace(
    environment: &PreviewEnvironment,
    name: &str,
    context: &Context,
) -> Result<(), kube::Error> {
    let namespace = environment.namespace().unwrap_or_default();
    let peers = peers_of(environment, context);
    let Some(visitor) = peers.into_iter().find(|p| p.name_any() == name) else {
        return Ok(());
    };
    let seen = crate::cluster::records::Seen {
        head: &visitor.spec.source.head_sha,
        resource_version: visitor
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
    };
    let records = crate::cluster::records::Records::new(&context.client, &context.writer);
    if !records
        .put_visitor_to_sleep(&namespace, name, &seen)
        .await?
    {
        // It changed since the queue decided (a push, a command): the next look decides anew.
        return Ok(());
    }
    tracing::info!(
        environment = %name,
        %namespace,
        waiting = %environment.name_any(),
        "an environment only a visit woke goes back to sleep for one its author waits for"
    );
    Ok(())
}
