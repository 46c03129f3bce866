//! One reconcile of a live `PreviewEnvironment`, as a list of named steps:
//!
//! resolve the template → hold (fork approval, queue; a visitor's slot handed to an author's
//! environment) → checks (a new commit waits for CI;
//! the commit deployed before keeps being reconciled meanwhile) → set aside? (a commit whose
//! render exhausted a worker or an engine, [`quarantine`]) → resolve the manifests → render the
//! Helm chart and build the Kustomize overlay, if any (`helm template`, `kubectl kustomize`,
//! behind the kernel's walls, cached by input) → render the templates and parse every YAML
//! document in a render worker → plan (object limit, guard, policy, workloads; no client
//! required, on a blocking thread) → check
//! the copied secrets (shared by their owners, or refused) → check the kinds (each served by the
//! cluster, or refused) → check the claims' storage classes (none keeps its volumes) → claim the namespace (created for this environment, or refused) →
//! apply the namespace → grant previewd its rights there → the generated secrets (kept once
//! made) → the guard rails → the waves ([`apply_steps`]) → prune → status (no client required)
//! → write (forge report, status, Events).
//!
//! A step that refuses returns a [`Refusal`]; [`refuse`] is the one place that writes it on the
//! environment. Errors go back to the controller, which retries with backoff.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::checks::{self, Admission, Held};
use super::context::{Context, EnvironmentRef};
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use super::hold::{displace, hold, start_queued};
use super::metrics::Observations;
use super::plan::{Limits, Plan, host_claims, place_request, plan_rendered, templates_request};
use super::renders::renderer::Renderer;
use super::status::{
    Placement, Progress, ReadyCondition, condition, held_status, progress_status, record_waking,
    refused_status,
};
use super::write::write_status;
use super::{
    access, apply, claim, coalesce, namespace, prune, quarantine, renders, resolve, secrets,
    template_status, volumes, waves,
};
use crate::cluster::observed::ObjectKey;
use crate::model::crd::{
    Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate, WaitingCommit,
};
use crate::model::naming::environment_namespace;
use crate::model::{ceiling, footprint};

pub async fn reconcile_environment(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let template = match resolve::template(environment, context) {
        Ok(template) => template,
        Err(refusal) => return refuse(environment, context, refusal, None, None).await,
    };
    if let Some(hold) = hold(environment, &template, context, Utc::now()) {
        if let Some(visitor) = &hold.displace
            && let Err(e) = displace(environment, visitor, context).await
        {
            tracing::warn!(error = %e, environment = %visitor, "could not put an environment only a visit woke to sleep; the queue's next look tries again");
        }
        write_status(environment, context, hold.status).await?;
        return Ok(Action::requeue(hold.requeue));
    }
    let (target, held) = match checks::admission(environment, &template, Utc::now()) {
        Admission::Open => (Cow::Borrowed(environment), None),
        Admission::Held(held) => match deployed_commit(environment) {
            Some(deployed) => (Cow::Owned(deployed), Some(held)),
            None => return hold_first_commit(environment, context, held).await,
        },
    };
    let namespace = environment_namespace(&target, &template.spec);
    match deploy(&target, &template, &namespace, held.as_ref(), context).await {
        Ok(action) => Ok(action),
        Err(Stop::Refused(refusal)) => {
            let waiting = held.map(|h| h.commit);
            refuse(&target, context, refusal, Some(&namespace), waiting).await
        }
        Err(Stop::Failed(error)) => Err(error),
    }
}

/// `environment` as it was when its deployed commit was the head, to keep reconciling that
/// commit while the head waits for its checks. `None` when no commit was deployed yet.
fn deployed_commit(environment: &PreviewEnvironment) -> Option<PreviewEnvironment> {
    let status = environment.status.as_ref()?;
    let deployed = status.deployed_sha.clone()?;
    let mut target = environment.clone();
    target.spec.source.head_sha = deployed;
    Some(target)
}

/// The first commit of an environment waits for its checks (`Pending`; `Degraded` once they
/// failed), or is skipped (`Pending`): nothing of it runs yet.
async fn hold_first_commit(
    environment: &PreviewEnvironment,
    context: &Context,
    held: Held,
) -> Result<Action, ReconcileError> {
    let commit = held.commit;
    let phase = if commit.failed() {
        Phase::Degraded
    } else {
        Phase::Pending
    };
    let mut status = held_status(
        environment,
        phase,
        commit.reason.as_str(),
        &commit.message,
        None,
        Utc::now(),
    );
    status.waiting = Some(commit);
    write_status(environment, context, status).await?;
    let resync = context.config.resync_interval;
    Ok(Action::requeue(
        held.recheck.map_or(resync, |r| r.min(resync)),
    ))
}

/// The steps from the manifests to the written status.
async fn deploy(
    environment: &PreviewEnvironment,
    template: &Arc<PreviewTemplate>,
    namespace: &str,
    held: Option<&Held>,
    context: &Context,
) -> Result<Action, Stop> {
    let memory_limit = context.config.engines.memory_limit;
    if let Some(refusal) = quarantine::set_aside(environment, template, memory_limit) {
        return Err(refusal.into());
    }
    let observed = context.applier.observed();
    let rendered = render_and_plan(
        environment,
        template,
        namespace,
        &context.renderer(),
        Some(&context.client),
        limits(context),
        move |object| observed.live_replicas(&ObjectKey::of(object)),
    )
    .await;
    let beyond_ceiling = match &rendered {
        Err(refusal) if refusal.reason == RefusalReason::TemplateBeyondCeiling => {
            Some(refusal.message.as_str())
        }
        _ => None,
    };
    // The template's own condition says what its environments say; failing to write it
    // stops nothing of the environment's.
    if let Err(e) = template_status::say_ceiling(template, beyond_ceiling, context).await {
        tracing::warn!(error = %e, "could not write the template's WithinCeiling condition");
    }
    let mut plan = rendered
        .map_err(|refusal| quarantine::record(refusal, environment, template, memory_limit))?;
    for host in std::iter::once(&plan.host).chain(&plan.extra_hosts) {
        refuse_a_taken_host(environment, host, context)?;
    }
    secrets::add_copies(&mut plan, template, context).await?;
    waves::check_served(&plan, context).await?;
    volumes::refuse_retained(&plan, context).await?;
    let uid = environment.metadata.uid.as_deref().unwrap_or_default();
    let namespace_labels = namespace::namespace_labels(&template.spec, &plan.labels, uid);
    claim::claim_namespace(environment, namespace, &namespace_labels, context).await?;
    let key = ObjectRef::from_obj(environment);
    let bypass_cache = reapply_due(context, &key);
    let progress = apply_steps(
        &mut plan,
        template,
        &namespace_labels,
        context,
        bypass_cache,
    )
    .await?;
    prune::prune(environment, &plan.objects, context).await?;
    if bypass_cache {
        context
            .memory
            .last_full_apply
            .lock()
            .insert(key.clone(), Instant::now());
    }
    Ok(finish(environment, context, &key, plan, progress, held).await?)
}

/// The apply steps, in order: the namespace (already claimed, with `namespace_labels`),
/// previewd's access to it, the generated secrets (read back in the namespace, which needs the
/// access; added to the plan's first wave), the guard rails, then the plan's objects wave by
/// wave. Returns how far the waves got.
async fn apply_steps(
    plan: &mut Plan,
    template: &PreviewTemplate,
    namespace_labels: &std::collections::BTreeMap<String, String>,
    context: &Context,
    bypass_cache: bool,
) -> Result<Progress, Stop> {
    let namespace_object = namespace::namespace_object(&plan.namespace, namespace_labels);
    apply::apply(context, &[&namespace_object], bypass_cache).await?;
    access::grant(&plan.namespace, &plan.labels, context, bypass_cache).await?;
    secrets::add_generated(plan, template, context).await?;
    let guard_rails = namespace::guard_rails(&plan.namespace, &template.spec, &plan.labels);
    let guard_rails: Vec<&serde_json::Value> = guard_rails.iter().collect();
    apply::apply(context, &guard_rails, bypass_cache).await?;
    waves::apply_waves(&plan.objects, context, bypass_cache).await
}

/// Refuses the environment when another one holds its URL host (see [`host_claims`]): nothing
/// is applied, and the other keeps its traffic.
fn refuse_a_taken_host(
    environment: &PreviewEnvironment,
    host: &str,
    context: &Context,
) -> Result<(), Refusal> {
    let everyone = context.caches.environments.state();
    let Some(holder) = host_claims::taken_by(environment, host, everyone.iter().map(|e| &**e))
    else {
        return Ok(());
    };
    Err(Refusal::new(
        RefusalReason::HostTaken,
        format!(
            "the host {host:?} is held by environment {}/{} (a pull request and a branch of the same name, or two forks' branches, render one URL host; an extra Ingress host a template lists is one environment's at a time): it keeps it; this one deploys once that one is gone, or with a host that tells them apart (e.g. with {{{{ pr }}}})",
            holder.metadata.namespace.as_deref().unwrap_or_default(),
            holder.metadata.name.as_deref().unwrap_or_default(),
        ),
    ))
}

/// What the operator allows every template (`--max-objects-per-environment`,
/// `--template-kinds`, the policy flags).
fn limits(context: &Context) -> Limits {
    Limits {
        max_objects: context.config.max_objects,
        max_bytes: context.config.max_bytes,
        kinds: context.config.template_kinds.clone(),
        operator: context.config.operator_policy.clone(),
        gate_answers: context.config.gate_answers,
    }
}

/// The render and plan steps: the template's manifests (a ConfigMap's read from `cluster`;
/// none: refused), the engines' output, the templates rendered where their memory is bounded
/// ([`renders::isolated`]), then every check on a blocking thread (a large render's checks
/// must not stall the runtime's workers: webhooks, watches, other reconciles).
/// `live_replicas` says how many replicas a workload runs now. `previewd render` runs exactly
/// these steps ([`super::dry_run`]).
pub(super) async fn render_and_plan(
    environment: &PreviewEnvironment,
    template: &Arc<PreviewTemplate>,
    namespace: &str,
    renderer: &Renderer<'_>,
    cluster: Option<&kube::Client>,
    limits: Limits,
    live_replicas: impl Fn(&serde_json::Value) -> Option<i32> + Send + 'static,
) -> Result<Plan, Refusal> {
    within_ceiling(template, &limits)?;
    let templates = resolve::manifests(environment, template, renderer, cluster).await?;
    let from_engines = renders::render_engines(environment, template, namespace, renderer).await?;
    let request = templates_request(environment, template, templates, namespace);
    let mut rendered = renders::isolated::render(request, template, renderer)
        .await?
        .templates()
        .map_err(super::plan::render_failed)?;
    for engine_output in from_engines {
        let request = place_request(environment, template, engine_output, namespace);
        let placed = renders::isolated::render(request, template, renderer).await?;
        rendered
            .objects
            .extend(placed.placed().map_err(super::plan::render_failed)?);
    }
    let (environment, template) = (environment.clone(), template.clone());
    let namespace = namespace.to_string();
    let planned = tokio::task::spawn_blocking(move || {
        plan_rendered(
            &environment,
            &template,
            rendered,
            &namespace,
            &limits,
            live_replicas,
        )
    })
    .await;
    planned.unwrap_or_else(|stopped| {
        Err(Refusal::new(
            RefusalReason::RenderFailed,
            format!("rendering stopped unexpectedly, a bug in previewd: {stopped}"),
        ))
    })
}

/// Refuses a template that asks for more than the operator's ceiling, every field named, before
/// anything of it is read or rendered.
fn within_ceiling(template: &PreviewTemplate, limits: &Limits) -> Result<(), Refusal> {
    let operator = &limits.operator;
    let beyond = ceiling::beyond(
        &template.spec,
        &operator.ceiling,
        &operator.own_cluster_roles,
    );
    if beyond.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        RefusalReason::TemplateBeyondCeiling,
        format!(
            "the template asks for more than the cluster's operator allows: {}; nothing was \
             applied (the operator raises the ceiling with --template-ceiling, the chart's \
             templateCeiling)",
            beyond.join("; ")
        ),
    ))
}

/// Writes where the environment got to, records its metrics, and says when to look again.
async fn finish(
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
    let mut requeue = match status.phase {
        Phase::Ready | Phase::Degraded | Phase::Sleeping => {
            // A full re-apply falls due at its own time, not at the next resync after it.
            let reapply = reapply_left(context, key).unwrap_or(Duration::MAX);
            context.config.resync_interval.min(reapply)
        }
        // The watch store triggers us when objects change; this is only a safety net.
        _ => Duration::from_secs(30).min(context.config.resync_interval),
    };
    if let Some(recheck) = held.and_then(|h| h.recheck) {
        requeue = requeue.min(recheck);
    }
    let since_last_write = context
        .memory
        .last_status_write
        .lock()
        .get(key)
        .map(Instant::elapsed);
    if let Some(wait) = coalesce::write_can_wait(
        environment.status.as_ref(),
        &status,
        since_last_write,
        Utc::now(),
    ) {
        return Ok(Action::requeue(wait.min(requeue)));
    }
    if environment.status.as_ref() != Some(&status) {
        context
            .memory
            .last_status_write
            .lock()
            .insert(key.clone(), Instant::now());
    }
    let fell_asleep = status.phase == Phase::Sleeping && previous.phase != Phase::Sleeping;
    let mut observations = {
        let mut seeds_started = context.memory.seed_started.lock();
        Observations::between(&previous, &status, &mut seeds_started)
    };
    let ready_timings = status.timings.clone().filter(|t| t.ready_at.is_some());
    let written = write_status(environment, context, status).await;
    // The metrics go with the status write: a forge report that failed after it (retried
    // with backoff) must not lose them, since the next reconcile sees the written status as
    // the previous one and would not count the change again.
    if !matches!(written, Err(ReconcileError::Status(_))) {
        // A commit this process already declared Ready is not timed again (the cache had not
        // caught up with that write).
        let already_timed = ready_timings.is_some_and(|timings| {
            let mut remembered = context.memory.ready_timings.lock();
            let known = remembered.get(key).is_some_and(|t| t.sha == timings.sha);
            remembered.insert(key.clone(), timings);
            known
        });
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
    let remembered = context.memory.ready_timings.lock().get(key).cloned();
    let placement = Placement {
        namespace: &plan.namespace,
        url: &plan.url,
        host: &plan.host,
        extra_hosts: &plan.extra_hosts,
        routes: &plan.routes,
    };
    let mut status = progress_status(environment, progress, placement, remembered, now);
    status.replicas_before_sleep = plan.replicas_before_sleep.clone();
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
            reason: "Sleeping",
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

/// Writes a refusal on the environment (`Degraded`, with what and where). A broken or unsafe
/// template is not retried until it changes (or the slow resync); a refusal that carries an
/// error is also retried with backoff.
async fn refuse(
    environment: &PreviewEnvironment,
    context: &Context,
    refusal: Refusal,
    namespace: Option<&str>,
    waiting: Option<WaitingCommit>,
) -> Result<Action, ReconcileError> {
    let mut status = refused_status(
        environment,
        refusal.reason.as_str(),
        &refusal.message,
        namespace,
        Utc::now(),
    );
    status.waiting = waiting;
    // Set aside by this refusal (or still); a refusal of another kind keeps what was.
    if let Some(set_aside) = refusal.quarantine {
        status.quarantine = Some(*set_aside);
    }
    write_status(environment, context, status).await?;
    match refusal.retry {
        Some(error) => Err(*error),
        None => Ok(Action::requeue(context.config.resync_interval)),
    }
}

/// Whether the slow periodic full re-apply is due: then the apply cache is bypassed. The clock
/// of an environment starts at its first reconcile, set back by a spread that its name picks
/// (up to one interval): a restarted previewd meets all environments at once, and their full
/// re-applies must not all fall due together.
fn reapply_due(context: &Context, key: &EnvironmentRef) -> bool {
    let Some(interval) = context.config.reapply_interval else {
        return false;
    };
    let mut last = context.memory.last_full_apply.lock();
    match last.get(key) {
        None => {
            let started = Instant::now();
            let spread = reapply_spread(key, interval);
            last.insert(key.clone(), started.checked_sub(spread).unwrap_or(started));
            false
        }
        Some(at) => at.elapsed() >= interval,
    }
}

/// How long until the environment's next full re-apply (`None` without `--reapply-interval`,
/// or before its first reconcile); at least a second, so a due re-apply that failed is not
/// retried in a loop.
fn reapply_left(context: &Context, key: &EnvironmentRef) -> Option<Duration> {
    let interval = context.config.reapply_interval?;
    let last = *context.memory.last_full_apply.lock().get(key)?;
    let left = interval.saturating_sub(last.elapsed());
    Some(left.max(Duration::from_secs(1)))
}

/// A fraction of `interval` that depends only on the environment's name: the same in every
/// replica and every run, different between environments.
fn reapply_spread(key: &EnvironmentRef, interval: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let fraction = (hasher.finish() % 1024) as f64 / 1024.0;
    interval.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_reapplies_of_many_environments_are_spread_over_the_interval() {
        let interval = Duration::from_secs(3600);
        let spreads: Vec<Duration> = (0..200)
            .map(|n| {
                reapply_spread(
                    &ObjectRef::new(&format!("pr-{n}")).within("previews"),
                    interval,
                )
            })
            .collect();
        assert!(spreads.iter().all(|s| *s < interval));
        let first_quarter = spreads.iter().filter(|s| **s < interval / 4).count();
        assert!(
            (25..=75).contains(&first_quarter),
            "{first_quarter} of 200 fall in the first quarter"
        );
    }
}
