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
use std::time::Instant;

use chrono::Utc;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::checks::{self, Admission, Held};
use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use super::hold::{displace, hold};
use super::renders::renderer::Renderer;
use super::status::{Progress, held_status, refused_status};
use super::write::write_status;
use super::{
    access, apply, claim, databases, finish, namespace, prune, quarantine, remote, renders,
    resolve, schedule, secrets, template_status, volumes, waves,
};
use crate::cluster::observed::ObjectKey;
use crate::model::ceiling;
use crate::model::crd::{Phase, PreviewEnvironment, PreviewTemplate, WaitingCommit};
use crate::model::naming::environment_namespace;
use crate::plan::{Limits, Plan, host_claims, place_request, plan_rendered, templates_request};

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
    // Placed on a registered cluster, or to be: its previewd deploys it there.
    if let Some(cluster) = remote::placed_on(environment) {
        return remote::run_on_cluster(environment, &template, cluster, context).await;
    }
    if let Some(placement) = remote::to_place(environment, &template) {
        return remote::place(environment, &template, placement, context).await;
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
        commit.reason.into(),
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
    let renderer = context.renderer();
    let rendered = render_and_plan(
        environment,
        template,
        namespace,
        &renderer,
        Some(&context.client),
        limits(context),
        move |object| observed.live_replicas(&ObjectKey::of(object)),
    );
    let rendered = context.metrics.timed("render", rendered).await;
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
    let checks = checks_before_applying(&mut plan, environment, template, context);
    context.metrics.timed("checks", checks).await?;
    let uid = environment.metadata.uid.as_deref().unwrap_or_default();
    let namespace_labels = namespace::namespace_labels(&template.spec, &plan.labels, uid);
    let claimed = claim::claim_namespace(environment, namespace, &namespace_labels, context);
    context.metrics.timed("claim", claimed).await?;
    let key = ObjectRef::from_obj(environment);
    let bypass_cache = schedule::reapply_due(context, &key);
    let applied = apply_steps(
        &mut plan,
        environment,
        template,
        &namespace_labels,
        context,
        bypass_cache,
    );
    let progress = context.metrics.timed("apply", applied).await?;
    let pruned = prune::prune(environment, &plan.objects, context);
    context.metrics.timed("prune", pruned).await?;
    if bypass_cache {
        context.memory.note_full_apply(&key, Instant::now());
    }
    Ok(finish::finish(environment, context, &key, plan, progress, held).await?)
}

/// The checks before anything is applied: the URL hosts are this environment's, the copied
/// secrets are shared with it (added to the plan), the cluster serves every kind, and no claim's
/// storage class keeps its volumes.
async fn checks_before_applying(
    plan: &mut Plan,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<(), Stop> {
    for host in std::iter::once(&plan.host).chain(&plan.extra_hosts) {
        refuse_a_taken_host(environment, host, context)?;
    }
    secrets::add_copies(plan, template, context).await?;
    waves::check_served(plan, context).await?;
    volumes::refuse_retained(plan, context).await
}

/// The apply steps, in order: the namespace (already claimed, with `namespace_labels`),
/// previewd's access to it, the generated secrets and the databases' connection Secrets (read
/// back in the namespace, which needs the access; added to the plan's first wave; a database
/// is branched here when it is not yet), the guard rails (open to the databases' servers), then
/// the plan's objects wave by wave. Returns how far the waves got.
async fn apply_steps(
    plan: &mut Plan,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace_labels: &std::collections::BTreeMap<String, String>,
    context: &Context,
    bypass_cache: bool,
) -> Result<Progress, Stop> {
    let namespace_object = namespace::namespace_object(&plan.namespace, namespace_labels);
    apply::apply(context, &[&namespace_object], bypass_cache).await?;
    access::grant(&plan.namespace, &plan.labels, context, bypass_cache).await?;
    secrets::add_generated(plan, template, context).await?;
    let databases = databases::add_databases(plan, environment, template, context).await?;
    plan.databases = databases.statuses;
    let guard_rails = namespace::guard_rails(
        &plan.namespace,
        &template.spec,
        &plan.labels,
        &databases.egress,
    );
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
    let holds_first = host_claims::holds_before(environment, host);
    let Some(holder) = context.caches.environments.find(holds_first) else {
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
        .map_err(crate::plan::render_failed)?;
    for engine_output in from_engines {
        let request = place_request(environment, template, engine_output, namespace);
        let placed = renders::isolated::render(request, template, renderer).await?;
        rendered
            .objects
            .extend(placed.placed().map_err(crate::plan::render_failed)?);
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
    match planned {
        Ok(plan) => Ok(plan?),
        Err(stopped) => Err(Refusal::new(
            RefusalReason::RenderFailed,
            format!("rendering stopped unexpectedly, a bug in previewd: {stopped}"),
        )),
    }
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
        refusal.reason,
        &refusal.message,
        namespace,
        Utc::now(),
    );
    status.waiting = waiting;
    if refusal.reason == RefusalReason::DatabaseServerFull {
        // Waits for a branch, in the order of creation (as the template cap's queue).
        status.phase = Phase::Queued;
        let everyone = context.caches.environments.state();
        status.queue_position = Some(databases::queue_position(environment, &everyone));
    }
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
