//! The last steps of a reconcile that deployed: the status (progress, URL, timings, sleep,
//! footprint; no client required), then the write (forge report, status, Events) with the
//! metrics it carries, and when to look again.

use chrono::Utc;
use kube::runtime::controller::Action;

use super::checks::Held;
use super::context::{Context, EnvironmentRef};
use super::error::ReconcileError;
use super::hold::start_queued;
use super::metrics::Observations;
use super::status::{
    Placement, Progress, ProgressReason, ReadyCondition, condition, progress_status, record_waking,
};
use super::write::write_status;
use super::{coalesce, schedule};
use crate::model::crd::{Phase, PreviewEnvironment, PreviewEnvironmentStatus};
use crate::model::footprint;
use crate::plan::Plan;

/// Writes where the environment got to, records its metrics, and says when to look again.
pub(super) async fn finish(
    environment: &PreviewEnvironment,
    context: &Context,
    key: &EnvironmentRef,
    plan: Plan,
    progress: Progress,
    held: Option<&Held>,
) -> Result<Action, ReconcileError> {
    let previous = environment.status.clone().unwrap_or_default();
    let mut status = next_status(environment, context, key, &plan, progress);
    status.waiting = held.map(|h| h.commit.clone());
    // A render succeeded: what was set aside is behind, unless it is the head that waits for
    // its checks while the deployed commit is reconciled (set aside still when they pass).
    status.quarantine = previous
        .quarantine
        .clone()
        .filter(|set_aside| held.is_some_and(|h| h.commit.sha == set_aside.commit));
    let requeue = schedule::requeue_after(status.phase, held, context, key);
    let since_last_write = context.memory.since_status_write(key);
    if let Some(wait) = coalesce::write_can_wait(
        environment.status.as_ref(),
        &status,
        since_last_write,
        Utc::now(),
    ) {
        return Ok(Action::requeue(wait.min(requeue)));
    }
    if environment.status.as_ref() != Some(&status) {
        context.memory.note_status_write(key);
    }
    let fell_asleep = status.phase == Phase::Sleeping && previous.phase != Phase::Sleeping;
    let mut observations = context
        .memory
        .with_seeds_started(|seeds| Observations::between(&previous, &status, seeds));
    let ready_timings = status.timings.clone().filter(|t| t.ready_at.is_some());
    let written = write_status(environment, context, status).await;
    // The metrics go with the status write: a forge report that failed after it (retried
    // with backoff) must not lose them, since the next reconcile sees the written status as
    // the previous one and would not count the change again.
    if !matches!(written, Err(ReconcileError::Status(_))) {
        // A commit this process already declared Ready is not timed again (the cache had not
        // caught up with that write).
        let already_timed =
            ready_timings.is_some_and(|timings| context.memory.timed_ready_before(key, timings));
        if already_timed {
            observations.seconds_to_ready = None;
        }
        observations.record(&context.metrics);
    }
    written?;
    if fell_asleep {
        start_queued(environment, context);
    }
    Ok(Action::requeue(requeue))
}

/// The environment's databases: the plan's, and those its status listed that the template no
/// longer asks for (their branches are still on the server; removal drops every one listed).
fn databases_held(
    planned: &[crate::model::crd::DatabaseStatus],
    environment: &PreviewEnvironment,
) -> Vec<crate::model::crd::DatabaseStatus> {
    let mut held = planned.to_vec();
    let listed = environment.status.iter().flat_map(|s| &s.databases);
    for before in listed {
        if !held
            .iter()
            .any(|d| d.branch == before.branch && d.server == before.server)
        {
            held.push(crate::model::crd::DatabaseStatus {
                state: "Kept".into(),
                message: Some(
                    "the template no longer asks for it: dropped with the environment".into(),
                ),
                ..before.clone()
            });
        }
    }
    held
}

/// The status step: progress, the environment's URL and the remembered timings into the status
/// to write; a healthy environment that was asked to sleep is `Sleeping`.
fn next_status(
    environment: &PreviewEnvironment,
    context: &Context,
    key: &EnvironmentRef,
    plan: &Plan,
    progress: Progress,
) -> PreviewEnvironmentStatus {
    let now = Utc::now();
    let remembered = context.memory.ready_timings(key);
    let placement = Placement {
        namespace: &plan.namespace,
        url: &plan.url,
        host: &plan.host,
        extra_hosts: &plan.extra_hosts,
        routes: &plan.routes,
    };
    let mut status = progress_status(environment, progress, placement, remembered, now);
    status.replicas_before_sleep = plan.replicas_before_sleep.clone();
    status.databases = databases_held(&plan.databases, environment);
    record_waking(environment, &mut status, now);
    if environment.spec.sleep && status.phase == Phase::Ready {
        let previous = environment.status.clone().unwrap_or_default();
        status.phase = Phase::Sleeping;
        let gate = context.config.gate_answers && !plan.routes.is_empty();
        let message = match gate {
            true => {
                "Asleep: every workload is scaled to zero. Open its URL, comment `/preview wake` or push a commit to wake it."
            }
            false => {
                "Asleep: every workload is scaled to zero. Comment `/preview wake` or push a commit to wake it."
            }
        };
        let asleep = ReadyCondition {
            ok: false,
            reason: ProgressReason::Sleeping.into(),
            message: message.into(),
        };
        status.conditions = vec![condition(&previous.conditions, &asleep, now)];
        if gate {
            // Its routes are withdrawn: the URL leads to the wake gate, which wakes it.
            status.url = Some(plan.url.clone());
        }
    }
    let previous = environment
        .status
        .as_ref()
        .and_then(|s| s.footprint.as_ref());
    let asleep = status.phase == Phase::Sleeping;
    let name = format!(
        "{}/{}",
        key.namespace.as_deref().unwrap_or_default(),
        key.name
    );
    let refresh = footprint::refresh_after(&name);
    let record = footprint::account(previous, plan.requests, asleep, now, refresh);
    status.footprint = Some(record);
    status
}
