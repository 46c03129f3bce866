//! The controller: reconcile a `PreviewEnvironment` into a running, seeded namespace.
//!
//! `reconcile` reads top to bottom as the pipeline: template → manifests → render → guard →
//! namespace and guard rails → waves (apply, then wait for health) → prune → status. Only
//! `apply`, the status write, events and the finalizer write to the API server, and none of
//! them writes when nothing changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;

use crate::apply::Applier;
use crate::crd::{
    Condition, FINALIZER, ForkPolicy, InlineManifest, LABEL_ENVIRONMENT,
    LABEL_ENVIRONMENT_NAMESPACE, LABEL_MANAGED_BY, LABEL_TEMPLATE, ManifestSource, Phase,
    PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate, PreviewTemplateSpec,
    ResourceStatus, SeedStatus, Timings,
};
use crate::forge::report::Reporter as ForgeReporter;
use crate::forge::repository::RepositoryManifests;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::observed::{ObjectKey, ObservedStore};
use crate::render::{self, RenderContext, RenderedObject};
use crate::secrets::SecretReader;
use crate::{guard, namespace, naming, queue, workloads};

/// The default of `--max-objects-per-environment`: the 35-object Online Boutique fits 14 times.
pub const DEFAULT_MAX_OBJECTS: usize = 500;

/// Settings of the controller (from `config`).
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Watch only this namespace's templates and environments (all namespaces if `None`).
    pub namespace: Option<String>,
    /// Server-side applies in flight at once within a wave.
    pub apply_concurrency: usize,
    /// How often every environment is reconciled again with nothing having triggered it. The
    /// reconcile compares with the watch and sends nothing unless something drifted.
    pub resync_interval: Duration,
    /// How often each environment is re-applied in full regardless of the apply cache; `None`
    /// (the default) never does. The watch already shows drift in every field previewd sets,
    /// so a blind re-apply only costs writes for environments that did not change.
    pub reapply_interval: Option<Duration>,
    /// A template that renders more objects than this is refused (a runaway loop in a
    /// template, or a hostile one, must not flood the API server).
    pub max_objects: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            apply_concurrency: 16,
            resync_interval: Duration::from_secs(600),
            reapply_interval: None,
            max_objects: DEFAULT_MAX_OBJECTS,
        }
    }
}

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the manifests: {0}")]
    Manifests(String),
    #[error("applying: {0}")]
    Apply(#[source] crate::apply::ApplyError),
    #[error("pruning: {0}")]
    Prune(#[source] kube::Error),
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    #[error("deleting the namespace: {0}")]
    Cleanup(#[source] kube::Error),
    #[error("namespace {0} is still terminating")]
    NamespaceTerminating(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The status was written; only the report to the forge failed (retried with backoff).
    #[error("reporting to the forge: {0}")]
    Forge(String),
}

impl Error {
    pub fn category(&self) -> &'static str {
        match self {
            Error::Manifests(_) => "manifests",
            Error::Apply(_) => "apply",
            Error::Prune(_) => "prune",
            Error::Status(_) => "status",
            Error::Cleanup(_) | Error::NamespaceTerminating(_) => "cleanup",
            Error::Finalizer(_) => "finalizer",
            Error::Forge(_) => "forge",
        }
    }
}

/// Everything reconcile needs, built once.
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub metrics: Arc<Metrics>,
    pub applier: Applier,
    pub templates: Store<PreviewTemplate>,
    /// Every watched environment, as the controller's own watch sees it (the webhook intake
    /// reads it to find the environment of a branch).
    pub environments: Store<PreviewEnvironment>,
    /// Turns true once both caches hold the cluster's state. Everyone waits on this rather than
    /// on `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
    /// concurrent waiters (a second waiter hung forever here).
    pub caches_ready: tokio::sync::watch::Receiver<bool>,
    /// Keeps the PR comment, commit status and deployment status in line with each environment.
    pub reporter: Arc<ForgeReporter>,
    /// Manifests read from repositories, by commit.
    pub repository_manifests: RepositoryManifests,
    /// Asks for a reconcile of an environment: used to start queued environments as soon as a
    /// slot frees up.
    reconcile_trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<PreviewEnvironment>>,
    /// When each running seed Job (`namespace/job`) was first seen running.
    seed_started: Mutex<HashMap<String, Instant>>,
    /// The Ready timings this process last wrote, by environment. The next reconcile can run
    /// before the cache shows that write; without this it would declare the same commit Ready
    /// a second time (a new `readyAt`, a second time-to-Ready observation).
    ready_timings: Mutex<HashMap<ObjectRef<PreviewEnvironment>, Timings>>,
    recorder: Recorder,
    failures: Mutex<HashMap<ObjectRef<PreviewEnvironment>, u32>>,
    last_full_apply: Mutex<HashMap<ObjectRef<PreviewEnvironment>, Instant>>,
}

impl Context {
    /// Waits until the template and environment caches hold the cluster's state.
    pub async fn wait_for_caches(&self) {
        let mut ready = self.caches_ready.clone();
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

/// Runs the controller until the stream ends (it does not on its own). Returns the context so
/// callers (tests, the sandbox) can read metrics while it runs.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    context_out: Option<tokio::sync::oneshot::Sender<Arc<Context>>>,
) {
    let (environments, templates): (Api<PreviewEnvironment>, Api<PreviewTemplate>) =
        match &config.namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::unbounded_channel();
    let store = ObservedStore::new(client.clone(), trigger_tx.clone());
    // Readiness comes from the watch streams themselves (their InitDone events), not from
    // `Store::wait_until_ready`: that one-shot channel wakes only the last of several waiters,
    // and the kube Controller already waits on the environment store.
    let (ready_tx, caches_ready) = tokio::sync::watch::channel(false);
    let readiness = Arc::new(crate::caches::Readiness::<2>::new(ready_tx));
    let (template_store, template_writer) = kube::runtime::reflector::store();
    let templates_ready = readiness.clone();
    let template_stream = kube::runtime::reflector(
        template_writer,
        watcher(templates, watcher::Config::default()),
    )
    // After the reflector: the store holds what the event says before anyone is told.
    .inspect(move |event| templates_ready.observe(0, event))
    .default_backoff()
    .touched_objects();
    let (environment_store, environment_writer) = kube::runtime::reflector::store();
    let environments_ready = readiness.clone();
    let environment_stream = kube::runtime::reflector(
        environment_writer,
        watcher(environments, watcher::Config::default()),
    )
    // After the reflector: the store holds what the event says before anyone is told.
    .inspect(move |event| environments_ready.observe(1, event))
    .default_backoff()
    .touched_objects();
    let controller = Controller::for_stream(environment_stream, environment_store.clone());
    let reporter = Arc::new(ForgeReporter::new(
        metrics.clone(),
        Arc::new(SecretReader::new(client.clone())),
    ));
    let context = Arc::new(Context {
        applier: Applier::new(
            client.clone(),
            store,
            metrics.clone(),
            config.apply_concurrency,
        ),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "previewd".into(),
                instance: None,
            },
        ),
        client,
        config,
        metrics,
        templates: template_store,
        environments: environment_store.clone(),
        caches_ready,
        reporter,
        repository_manifests: RepositoryManifests::default(),
        reconcile_trigger: trigger_tx,
        seed_started: Mutex::new(HashMap::new()),
        ready_timings: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
        last_full_apply: Mutex::new(HashMap::new()),
    });
    if let Some(out) = context_out {
        let _ = out.send(context.clone());
    }
    controller
        // A template change re-renders every environment made from it.
        .watches_stream(template_stream, move |template: PreviewTemplate| {
            let name = template.name_any();
            let namespace = template.namespace();
            environment_store
                .state()
                .into_iter()
                .filter(|env| env.spec.template == name && env.namespace() == namespace)
                .map(|env| ObjectRef::from_obj(&*env))
                .collect::<Vec<_>>()
        })
        // Objects of an environment changed (health or drift): reconcile it.
        .reconcile_on(tokio_stream_from(trigger_rx))
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// One span per reconcile, so every line it logs (and kube's own) says which environment,
/// template and repository it is about.
async fn reconcile(
    environment: Arc<PreviewEnvironment>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "reconcile",
        environment = %format!("{}/{}", environment.namespace().unwrap_or_default(), environment.name_any()),
        template = %environment.spec.template,
        repository = %environment.spec.source.repository,
        head_sha = %environment.spec.source.head_sha,
    );
    reconcile_in_span(environment, context)
        .instrument(span)
        .await
}

async fn reconcile_in_span(
    environment: Arc<PreviewEnvironment>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    // The environment watch can list before the template watch has: reconciling then would
    // call the template missing and mark a healthy environment Degraded (seen when a new
    // leader starts with environments already in place).
    context.wait_for_caches().await;
    let started = Instant::now();
    let api: Api<PreviewEnvironment> = Api::namespaced(
        context.client.clone(),
        &environment.namespace().unwrap_or_default(),
    );
    let environment_ref = environment.clone();
    let has_finalizer = environment.finalizers().iter().any(|f| f == FINALIZER);
    if !has_finalizer && environment.meta().deletion_timestamp.is_none() {
        context.metrics.write("finalizer");
    }
    let result = finalizer(&api, FINALIZER, environment, |event| async {
        match event {
            FinalizerEvent::Apply(environment) => {
                reconcile_environment(&environment, &context).await
            }
            FinalizerEvent::Cleanup(environment) => cleanup(&environment, &context).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    if result.is_ok() {
        // Backoff restarts only when a whole reconcile, forge report included, succeeded.
        context
            .failures
            .lock()
            .expect("failures lock")
            .remove(&ObjectRef::from_obj(&*environment_ref));
    }
    let outcome = if result.is_ok() { "ok" } else { "error" };
    context
        .metrics
        .reconcile_duration
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    result
}

fn error_policy(
    environment: Arc<PreviewEnvironment>,
    error: &Error,
    context: Arc<Context>,
) -> Action {
    context
        .metrics
        .reconcile_errors
        .with_label_values(&[error.category()])
        .inc();
    if let Error::NamespaceTerminating(_) = error {
        return Action::requeue(Duration::from_secs(1));
    }
    let key = ObjectRef::from_obj(&*environment);
    let attempt = {
        let mut failures = context.failures.lock().expect("failures lock");
        let attempt = failures.entry(key).or_insert(0);
        *attempt += 1;
        *attempt
    };
    let delay = Duration::from_secs(1u64 << attempt.min(8)).min(Duration::from_secs(300));
    tracing::warn!(environment = %environment.name_any(), attempt, error = %error, "reconcile failed; retrying in {delay:?}");
    Action::requeue(delay)
}

/// Where one reconcile got to.
struct Progress {
    phase: Phase,
    resources: Vec<ResourceStatus>,
    seeds: Vec<SeedStatus>,
    condition: (bool, &'static str, String),
}

async fn reconcile_environment(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(environment);
    let env_namespace = environment.namespace().unwrap_or_default();
    let Some(template) = context
        .templates
        .get(&ObjectRef::new(&environment.spec.template).within(&env_namespace))
    else {
        let message = format!(
            "PreviewTemplate {:?} not found in namespace {env_namespace:?}",
            environment.spec.template
        );
        write_status(
            environment,
            context,
            failed_status(environment, "TemplateNotFound", &message, None),
        )
        .await?;
        return Ok(Action::requeue(context.config.resync_interval));
    };
    if let Some(hold) = hold(environment, &template, context) {
        let requeue = if hold.phase == Phase::Queued {
            // The slot is normally handed over at once (see `start_queued`); this is the net.
            Duration::from_secs(30).min(context.config.resync_interval)
        } else {
            context.config.resync_interval
        };
        write_status(environment, context, hold).await?;
        return Ok(Action::requeue(requeue));
    }
    let namespace = environment_namespace(environment, &template.spec);
    let labels = environment_labels(environment, &template);
    let context_values = render_context(environment, &template.spec, &namespace);

    let manifests = match manifests(&template, &environment.spec.source.head_sha, context).await {
        Ok(manifests) => manifests,
        Err(message) => {
            let status = failed_status(
                environment,
                "ManifestsUnavailable",
                &message,
                Some(&namespace),
            );
            write_status(environment, context, status).await?;
            return Ok(Action::requeue(context.config.resync_interval));
        }
    };
    let rendered = match context_values.and_then(|values| {
        render::render(&manifests, &template.spec.seeds, &values, &labels)
            .map(|objects| (values, objects))
    }) {
        Ok(rendered) => rendered,
        Err(error) => {
            // A broken template is not retried until it changes (or the slow resync).
            let status = failed_status(
                environment,
                "RenderFailed",
                &error.to_string(),
                Some(&namespace),
            );
            write_status(environment, context, status).await?;
            return Ok(Action::requeue(context.config.resync_interval));
        }
    };
    let (values, mut objects) = rendered;
    if objects.len() > context.config.max_objects {
        let message = format!(
            "the template renders {} objects, more than the limit of {} per environment (--max-objects-per-environment); nothing was applied",
            objects.len(),
            context.config.max_objects
        );
        let status = failed_status(environment, "TooManyObjects", &message, Some(&namespace));
        write_status(environment, context, status).await?;
        return Ok(Action::requeue(context.config.resync_interval));
    }
    let violations = guard::check(&objects, &namespace);
    if !violations.is_empty() {
        let message = violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let status = failed_status(environment, "GuardRejected", &message, Some(&namespace));
        write_status(environment, context, status).await?;
        return Ok(Action::requeue(context.config.resync_interval));
    }

    let previous_status = environment.status.clone().unwrap_or_default();
    let replicas_before_sleep = workloads::prepare(
        &mut objects,
        environment.spec.sleep,
        &previous_status.replicas_before_sleep,
        |object| context.applier.live_replicas(&ObjectKey::of(object)),
        environment.spec.redeploy.as_deref(),
    );
    let bypass_cache = reapply_due(context, &key);
    let namespace_object = namespace::namespace_object(&namespace, &template.spec, &labels);
    let applied = async {
        context
            .applier
            .apply(&[&namespace_object], bypass_cache)
            .await
            .map_err(Error::Apply)?;
        let guard_rails = namespace::guard_rails(&namespace, &template.spec, &labels);
        context
            .applier
            .apply(&guard_rails.iter().collect::<Vec<_>>(), bypass_cache)
            .await
            .map_err(Error::Apply)?;
        apply_waves(&objects, context, bypass_cache).await
    }
    .await;
    let progress = match applied {
        // The API server refused an object's content: say which, and where, on the environment
        // (retries go on with backoff, and a template edit triggers one at once).
        Err(Error::Apply(error)) if error.is_refused() => {
            let message = format!("the API server refused {error}");
            let status = failed_status(environment, "ApplyRefused", &message, Some(&namespace));
            write_status(environment, context, status).await?;
            return Err(Error::Apply(error));
        }
        other => other?,
    };
    // Prune in every reconcile, not only once Ready: the next status write replaces the record
    // of what the previous render produced, so waiting would forget what to delete.
    prune(environment, &objects, context).await?;
    if bypass_cache {
        context
            .last_full_apply
            .lock()
            .expect("reapply lock")
            .insert(key.clone(), Instant::now());
    }
    let remembered = context
        .ready_timings
        .lock()
        .expect("ready timings lock")
        .get(&key)
        .cloned();
    let mut status = progress_status(environment, progress, &namespace, &values.url, remembered);
    status.replicas_before_sleep = replicas_before_sleep;
    if environment.spec.sleep && status.phase == Phase::Ready {
        status.phase = Phase::Sleeping;
        status.conditions = vec![condition(
            &previous_status.conditions,
            false,
            "Sleeping",
            "Asleep: every workload is scaled to zero. Comment `/preview wake` or push a commit to wake it.",
        )];
    }
    let requeue = match status.phase {
        Phase::Ready | Phase::Degraded | Phase::Sleeping => context.config.resync_interval,
        // The watch store triggers us when objects change; this is only a safety net.
        _ => Duration::from_secs(30).min(context.config.resync_interval),
    };
    let fell_asleep = status.phase == Phase::Sleeping && previous_status.phase != Phase::Sleeping;
    let mut observations = observe_progress(&previous_status, &status, context);
    let ready_timings = status.timings.clone().filter(|t| t.ready_at.is_some());
    write_status(environment, context, status).await?;
    // A commit this process already declared Ready is not timed again (the cache had not
    // caught up with that write).
    let already_timed = ready_timings.is_some_and(|timings| {
        let mut remembered = context.ready_timings.lock().expect("ready timings lock");
        let known = remembered.get(&key).is_some_and(|t| t.sha == timings.sha);
        remembered.insert(key.clone(), timings);
        known
    });
    if already_timed {
        observations.seconds_to_ready = None;
    }
    observations.record(&context.metrics);
    if fell_asleep {
        start_queued(environment, context);
    }
    Ok(Action::requeue(requeue))
}

/// What one reconcile's progress adds to the metrics: recorded only once its status is
/// written, so that a retried write does not count twice.
#[derive(Default)]
struct Observations {
    seconds_to_ready: Option<f64>,
    seed_durations: Vec<f64>,
    seed_failures: u64,
}

impl Observations {
    fn record(&self, metrics: &Metrics) {
        if let Some(seconds) = self.seconds_to_ready {
            metrics.time_to_ready.observe(seconds);
        }
        for seconds in &self.seed_durations {
            metrics.seed_duration.observe(*seconds);
        }
        metrics.seed_failures.inc_by(self.seed_failures);
    }
}

/// Compares the status about to be written with the previous one: a commit that just became
/// Ready, seeds that just succeeded (timed from when previewd first saw them running) or failed.
fn observe_progress(
    previous: &PreviewEnvironmentStatus,
    status: &PreviewEnvironmentStatus,
    context: &Context,
) -> Observations {
    let mut observations = Observations::default();
    let was_ready = |sha: &str| {
        previous
            .timings
            .as_ref()
            .is_some_and(|t| t.sha == sha && t.ready_at.is_some())
    };
    if let Some(timings) = &status.timings
        && timings.ready_at.is_some()
        && !was_ready(&timings.sha)
    {
        observations.seconds_to_ready = timings.seconds_to_ready;
    }
    let namespace = status.namespace.clone().unwrap_or_default();
    let mut started = context.seed_started.lock().expect("seed clock");
    for seed in &status.seeds {
        let key = format!("{namespace}/{}", seed.job);
        let before = previous
            .seeds
            .iter()
            .find(|s| s.job == seed.job)
            .map(|s| s.state.as_str());
        match seed.state.as_str() {
            "Running" => {
                started.entry(key).or_insert_with(Instant::now);
            }
            "Succeeded" if before != Some("Succeeded") => {
                if let Some(at) = started.remove(&key) {
                    observations.seed_durations.push(at.elapsed().as_secs_f64());
                }
            }
            "Failed" if before != Some("Failed") => {
                started.remove(&key);
                observations.seed_failures += 1;
            }
            _ => {}
        }
    }
    observations
}

/// Why `environment` may not deploy now, as the status to write: a fork pull request waiting
/// for approval, or no free slot under the template's cap (queued).
fn hold(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    context: &Context,
) -> Option<PreviewEnvironmentStatus> {
    if queue::awaits_approval(environment, template) {
        let short_sha: String = environment.spec.source.head_sha.chars().take(7).collect();
        let (reason, message) = match template.spec.triggers.fork_policy {
            ForkPolicy::RequireApproval => (
                "AwaitingApproval",
                format!(
                    "This pull request comes from a fork: a maintainer must comment `/preview approve` to deploy commit `{short_sha}`."
                ),
            ),
            _ => (
                "ForkNotAllowed",
                "This pull request comes from a fork, and the template does not deploy forks (triggers.forkPolicy)."
                    .to_string(),
            ),
        };
        return Some(held_status(
            environment,
            Phase::Pending,
            reason,
            &message,
            None,
        ));
    }
    if environment.spec.sleep {
        return None;
    }
    let peers: Vec<Arc<PreviewEnvironment>> = context
        .environments
        .state()
        .into_iter()
        .filter(|e| {
            e.spec.template == environment.spec.template && e.namespace() == environment.namespace()
        })
        .collect();
    let peers: Vec<&PreviewEnvironment> = peers.iter().map(|p| p.as_ref()).collect();
    match queue::admission(environment, &peers, template) {
        queue::Admission::Run => None,
        queue::Admission::Queued { position, cap } => {
            let message = format!(
                "The template runs at most {cap} environments at once; this one starts when one of them is removed or goes to sleep."
            );
            let mut status = held_status(environment, Phase::Queued, "Queued", &message, None);
            status.queue_position = Some(position);
            Some(status)
        }
    }
}

/// A slot of `environment`'s template just freed up (it is being deleted, or fell asleep):
/// reconcile the queued environments of that template now, so the first in line starts.
fn start_queued(environment: &PreviewEnvironment, context: &Context) {
    for peer in context.environments.state() {
        let queued = peer
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Phase::Queued);
        if queued
            && peer.spec.template == environment.spec.template
            && peer.namespace() == environment.namespace()
            && peer.name_any() != environment.name_any()
        {
            let _ = context.reconcile_trigger.send(ObjectRef::from_obj(&*peer));
        }
    }
}

/// Applies wave after wave; stops at the first wave that is not healthy yet.
async fn apply_waves(
    objects: &[RenderedObject],
    context: &Context,
    bypass_cache: bool,
) -> Result<Progress, Error> {
    let waves: BTreeSet<i32> = objects.iter().map(|o| o.wave).collect();
    let mut resources = Vec::new();
    let mut seeds = Vec::new();
    let mut phase = Phase::Ready;
    let mut condition = (true, "Ready", "every object is healthy".to_string());
    for wave in waves {
        let members: Vec<&RenderedObject> = objects.iter().filter(|o| o.wave == wave).collect();
        if phase == Phase::Ready {
            let manifests: Vec<&Value> = members.iter().map(|o| &o.object).collect();
            context
                .applier
                .apply(&manifests, bypass_cache)
                .await
                .map_err(Error::Apply)?;
        }
        let mut wave_health = Vec::new();
        for object in &members {
            let health = if phase == Phase::Ready {
                context.applier.health(&ObjectKey::of(&object.object))
            } else {
                Health::Progressing(format!("waiting for wave {}", wave - 1))
            };
            wave_health.push(health.clone());
            match &object.seed {
                Some(seed) => seeds.push(SeedStatus {
                    name: seed.clone(),
                    job: object.name().to_string(),
                    state: match &health {
                        Health::Ready => "Succeeded".into(),
                        Health::Failed(_) => "Failed".into(),
                        Health::Progressing(_) => "Running".into(),
                    },
                    message: health.message(),
                }),
                None => resources.push(ResourceStatus {
                    api_version: object.api_version().to_string(),
                    kind: object.kind().to_string(),
                    name: object.name().to_string(),
                    wave,
                    state: health.state().to_string(),
                    message: health.message(),
                }),
            }
        }
        if phase != Phase::Ready {
            continue;
        }
        if let Some((object, Health::Failed(message))) = members
            .iter()
            .zip(&wave_health)
            .find(|(_, h)| matches!(h, Health::Failed(_)))
        {
            phase = Phase::Degraded;
            let what = if object.seed.is_some() {
                "seed Job"
            } else {
                object.kind()
            };
            condition = (
                false,
                if object.seed.is_some() {
                    "SeedFailed"
                } else {
                    "ObjectFailed"
                },
                format!("{what} {} failed: {message}", object.name()),
            );
        } else if let Some((object, _)) = members
            .iter()
            .zip(&wave_health)
            .find(|(_, h)| matches!(h, Health::Progressing(_)))
        {
            phase = if object.seed.is_some() {
                Phase::Seeding
            } else {
                Phase::Deploying
            };
            condition = (
                false,
                if object.seed.is_some() {
                    "Seeding"
                } else {
                    "Deploying"
                },
                format!(
                    "waiting for wave {wave}: {} {}",
                    object.kind(),
                    object.name()
                ),
            );
        }
    }
    Ok(Progress {
        phase,
        resources,
        seeds,
        condition,
    })
}

/// Deletes objects (and seed Jobs) the previous render produced and this one does not. The
/// previous render is what the status lists, so this survives restarts.
async fn prune(
    environment: &PreviewEnvironment,
    objects: &[RenderedObject],
    context: &Context,
) -> Result<(), Error> {
    let Some(status) = &environment.status else {
        return Ok(());
    };
    let namespace = status.namespace.clone().unwrap_or_default();
    let current: BTreeSet<ObjectKey> = objects.iter().map(|o| ObjectKey::of(&o.object)).collect();
    let previous = status
        .resources
        .iter()
        .map(|r| ObjectKey {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: namespace.clone(),
            name: r.name.clone(),
        })
        .chain(status.seeds.iter().map(|s| ObjectKey {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            namespace: namespace.clone(),
            name: s.job.clone(),
        }));
    for key in previous.filter(|k| !current.contains(k)) {
        tracing::info!(environment = %environment.name_any(), object = %key, "pruning an object the template no longer renders");
        context.applier.delete(&key).await.map_err(Error::Prune)?;
    }
    Ok(())
}

/// The finalizer's work: delete the namespace and wait until it is gone.
async fn cleanup(environment: &PreviewEnvironment, context: &Context) -> Result<Action, Error> {
    let namespace = match &environment
        .status
        .as_ref()
        .and_then(|s| s.namespace.clone())
    {
        Some(ns) => ns.clone(),
        None => match context.templates.get(
            &ObjectRef::new(&environment.spec.template)
                .within(&environment.namespace().unwrap_or_default()),
        ) {
            Some(template) => environment_namespace(environment, &template.spec),
            None => return Ok(Action::await_change()),
        },
    };
    let namespaces: Api<Namespace> = Api::all(context.client.clone());
    match namespaces
        .get_opt(&namespace)
        .await
        .map_err(Error::Cleanup)?
    {
        None => {
            context.applier.forget_namespace(&namespace);
            context
                .last_full_apply
                .lock()
                .expect("resync lock")
                .remove(&ObjectRef::from_obj(environment));
            context
                .ready_timings
                .lock()
                .expect("ready timings lock")
                .remove(&ObjectRef::from_obj(environment));
            Ok(Action::await_change())
        }
        Some(existing) => {
            // Never delete a namespace previewd did not create for this environment.
            let labels = existing.labels();
            if labels.get(LABEL_ENVIRONMENT) != Some(&environment.name_any()) {
                tracing::warn!(namespace = %namespace, "namespace is not labelled as this environment's; leaving it");
                return Ok(Action::await_change());
            }
            if existing.metadata.deletion_timestamp.is_none() {
                start_queued(environment, context);
                let reason = deletion_reason(environment);
                report_destroyed(environment, context, &reason).await;
                // The reason goes into the status and an Event too, for `kubectl describe`.
                let terminating =
                    held_status(environment, Phase::Terminating, "Deleting", &reason, None);
                if let Err(e) = write_status_only(environment, context, terminating).await {
                    tracing::debug!(error = %e, "could not write the Terminating status");
                }
                context.metrics.write("delete");
                namespaces
                    .delete(&namespace, &Default::default())
                    .await
                    .map_err(Error::Cleanup)?;
                publish(
                    context,
                    environment,
                    EventType::Normal,
                    "Deleting",
                    format!("deleting namespace {namespace}: {reason}"),
                )
                .await;
            }
            Err(Error::NamespaceTerminating(namespace))
        }
    }
}

/// Tells the forge the environment is gone. A failure is logged and counted, never blocks the
/// deletion: a forge outage must not keep namespaces alive. But when the forge client only
/// asks to wait a little (it backs off after a recent failure, or a rate limit ends soon), this
/// is the last chance to correct the comment, so it waits (at most 3 times, 10 s each) rather
/// than leave a comment that shows a deleted environment as live.
async fn report_destroyed(environment: &PreviewEnvironment, context: &Context, reason: &str) {
    const PATIENCE: Duration = Duration::from_secs(10);
    let Some(template) = template_of(environment, context) else {
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

/// Why the environment is being deleted: what the webhook, the sweep or a command wrote on it,
/// else a deletion by hand.
fn deletion_reason(environment: &PreviewEnvironment) -> String {
    environment
        .annotations()
        .get(crate::intake::ANNOTATION_DELETION_REASON)
        .cloned()
        .unwrap_or_else(|| "the PreviewEnvironment was deleted".into())
}

/// Whether the slow periodic resync is due: then the apply cache is bypassed. The clock of an
/// environment starts at its first reconcile, whose cache is empty anyway.
fn reapply_due(context: &Context, key: &ObjectRef<PreviewEnvironment>) -> bool {
    let Some(interval) = context.config.reapply_interval else {
        return false;
    };
    let mut last = context.last_full_apply.lock().expect("reapply lock");
    match last.get(key) {
        None => {
            last.insert(key.clone(), Instant::now());
            false
        }
        Some(at) => at.elapsed() >= interval,
    }
}

/// The environment's namespace name (deterministic).
pub fn environment_namespace(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
) -> String {
    let prefix = template
        .namespace
        .prefix
        .clone()
        .unwrap_or_else(|| "preview".into());
    naming::namespace_name(
        &prefix,
        &environment.namespace().unwrap_or_default(),
        &environment.name_any(),
    )
}

/// The labels previewd puts on every object of `environment`.
pub fn environment_labels(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY.to_string(), "previewd".to_string()),
        (LABEL_ENVIRONMENT.to_string(), environment.name_any()),
        (
            LABEL_ENVIRONMENT_NAMESPACE.to_string(),
            environment.namespace().unwrap_or_default(),
        ),
        (LABEL_TEMPLATE.to_string(), template.name_any()),
    ]
    .into()
}

/// What the templates see for `environment` deployed into `namespace`.
pub fn render_context(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
    namespace: &str,
) -> Result<RenderContext, render::RenderError> {
    let source = &environment.spec.source;
    let mut context = RenderContext {
        name: environment.name_any(),
        branch: source.branch.clone(),
        slug: naming::slug(&source.branch),
        sha: source.head_sha.clone(),
        short_sha: source.head_sha.chars().take(7).collect(),
        pr: source.pull_request,
        repository: source.repository.clone(),
        author: source.author.clone().unwrap_or_default(),
        namespace: namespace.to_string(),
        host: String::new(),
        url: String::new(),
        values: template.values.clone(),
    };
    context.host = match &template.url.host {
        Some(host) => render::render_string("url.host", host, &context)?,
        None => format!("{namespace}.preview.localhost"),
    };
    context.url = format!(
        "{}://{}",
        template.url.scheme.as_deref().unwrap_or("https"),
        context.host
    );
    Ok(context)
}

/// The template's manifests: inline, or every key of a ConfigMap (sorted by key).
async fn manifests(
    template: &PreviewTemplate,
    head_sha: &str,
    context: &Context,
) -> Result<Vec<InlineManifest>, String> {
    let ManifestSource {
        inline,
        config_map,
        repository_path,
    } = &template.spec.manifests;
    let mut all = inline.clone();
    if let Some(path) = repository_path {
        let client = context
            .reporter
            .client(template)
            .await
            .map_err(|e| format!("reading {path} from the repository: {e}"))?
            .ok_or_else(|| {
                format!("reading {path} from the repository needs forge.tokenSecretRef")
            })?;
        let from_repository = context
            .repository_manifests
            .get(&client, &template.spec.forge.repository, path, head_sha)
            .await
            .map_err(|e| format!("reading {path} at {head_sha}: {e}"))?;
        all.extend(from_repository.iter().cloned());
    }
    if let Some(source) = config_map {
        let api: Api<ConfigMap> = Api::namespaced(
            context.client.clone(),
            &template.namespace().unwrap_or_default(),
        );
        let map = api
            .get_opt(&source.name)
            .await
            .map_err(|e| format!("reading ConfigMap {}: {e}", source.name))?
            .ok_or_else(|| {
                format!(
                    "ConfigMap {:?} named by the template does not exist",
                    source.name
                )
            })?;
        for (key, text) in map.data.unwrap_or_default() {
            all.push(InlineManifest {
                name: format!("{}/{key}", source.name),
                template: text,
            });
        }
    }
    if all.is_empty() {
        return Err("the template has no manifests".into());
    }
    Ok(all)
}

fn failed_status(
    environment: &PreviewEnvironment,
    reason: &'static str,
    message: &str,
    namespace: Option<&str>,
) -> PreviewEnvironmentStatus {
    held_status(environment, Phase::Degraded, reason, message, namespace)
}

/// The previous status with a new phase and a `Ready=False` condition saying why.
fn held_status(
    environment: &PreviewEnvironment,
    phase: Phase,
    reason: &'static str,
    message: &str,
    namespace: Option<&str>,
) -> PreviewEnvironmentStatus {
    let previous = environment.status.clone().unwrap_or_default();
    PreviewEnvironmentStatus {
        phase,
        namespace: namespace.map(str::to_string).or(previous.namespace.clone()),
        conditions: vec![condition(&previous.conditions, false, reason, message)],
        queue_position: None,
        ..previous
    }
}

/// The status from the objects' progress. `remembered` is the Ready timings this process last
/// wrote for the environment, used when the cached status does not show them yet.
fn progress_status(
    environment: &PreviewEnvironment,
    progress: Progress,
    namespace: &str,
    url: &str,
    remembered: Option<Timings>,
) -> PreviewEnvironmentStatus {
    let previous = environment.status.clone().unwrap_or_default();
    let (ok, reason, message) = progress.condition;
    let sha = &environment.spec.source.head_sha;
    let now = Utc::now();
    let cached = previous.timings.clone().filter(|t| &t.sha == sha);
    let remembered = remembered.filter(|t| &t.sha == sha && t.ready_at.is_some());
    let mut timings = match (cached, remembered) {
        (Some(cached), _) if cached.ready_at.is_some() => cached,
        (_, Some(remembered)) => remembered,
        (Some(cached), None) => cached,
        (None, None) => Timings {
            sha: sha.clone(),
            requested_at: environment.spec.last_activity.unwrap_or(now),
            ready_at: None,
            seconds_to_ready: None,
        },
    };
    let ready = progress.phase == Phase::Ready;
    if ready && timings.ready_at.is_none() {
        timings.ready_at = Some(now);
        timings.seconds_to_ready =
            Some(((now - timings.requested_at).num_milliseconds() as f64 / 1000.0).max(0.0));
    }
    PreviewEnvironmentStatus {
        phase: progress.phase,
        namespace: Some(namespace.to_string()),
        url: Some(url.to_string()),
        deployed_sha: if ready {
            Some(sha.clone())
        } else {
            previous.deployed_sha.clone()
        },
        observed_generation: environment.metadata.generation,
        resources: progress.resources,
        seeds: progress.seeds,
        conditions: vec![condition(&previous.conditions, ok, reason, &message)],
        timings: Some(timings),
        forge: previous.forge.clone(),
        queue_position: None,
        replicas_before_sleep: previous.replicas_before_sleep.clone(),
    }
}

/// The `Ready` condition, keeping its transition time when its status did not change.
fn condition(previous: &[Condition], ok: bool, reason: &str, message: &str) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since: DateTime<Utc> = previous
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == status)
        .map(|c| c.last_transition_time)
        .unwrap_or_else(Utc::now);
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
    }
}

/// Writes the status only when it differs from what the object holds; publishes an Event when
/// the phase changes.
async fn write_status(
    environment: &PreviewEnvironment,
    context: &Context,
    mut status: PreviewEnvironmentStatus,
) -> Result<(), Error> {
    // The forge first, so that what was sent is recorded by this same status write.
    let mut forge_result = Ok(());
    if let Some(template) = template_of(environment, context) {
        let (record, result) = context
            .reporter
            .report(environment, &template, &status)
            .await;
        status.forge = record;
        forge_result = result.map_err(|e| Error::Forge(e.to_string()));
    }
    let result = write_status_only(environment, context, status).await;
    result.and(forge_result)
}

/// The environment's template, from the watch cache.
fn template_of(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Option<Arc<PreviewTemplate>> {
    context.templates.get(
        &ObjectRef::new(&environment.spec.template)
            .within(&environment.namespace().unwrap_or_default()),
    )
}

async fn write_status_only(
    environment: &PreviewEnvironment,
    context: &Context,
    status: PreviewEnvironmentStatus,
) -> Result<(), Error> {
    let previous = environment.status.clone().unwrap_or_default();
    if environment.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<PreviewEnvironment> = Api::namespaced(
        context.client.clone(),
        &environment.namespace().unwrap_or_default(),
    );
    context.metrics.write("status");
    api.patch_status(
        &environment.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": merge_patch(
            &serde_json::to_value(&previous).unwrap_or_default(),
            &serde_json::to_value(&status).unwrap_or_default(),
        ) })),
    )
    .await
    .map_err(Error::Status)?;
    if previous.phase != status.phase || environment.status.is_none() {
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
        let kind = if status.phase == Phase::Degraded {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(context, environment, kind, status.phase.as_str(), message).await;
    }
    Ok(())
}

/// A JSON merge patch (RFC 7386) from `old` to `new`. Fields the status no longer has are
/// sent as `null`: optional fields are left out when empty, and a merge patch that merely
/// leaves them out would keep their old values (a stale queue position, the previous commit's
/// ready time).
fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (key, value) in new {
                let value = match old.get(key) {
                    Some(previous) => merge_patch(previous, value),
                    None => value.clone(),
                };
                patch.insert(key.clone(), value);
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

async fn publish(
    context: &Context,
    environment: &PreviewEnvironment,
    type_: EventType,
    reason: &str,
    note: String,
) {
    context.metrics.write("event");
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = context
        .recorder
        .publish(&event, &environment.object_ref(&()))
        .await
    {
        tracing::debug!(error = %e, "could not publish an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patches_clear_what_the_new_status_leaves_out() {
        let old = json!({"phase": "Queued", "queuePosition": 1,
                         "timings": {"sha": "a", "readyAt": "2026-11-22T10:00:00Z"}});
        let new = json!({"phase": "Deploying", "timings": {"sha": "b"}});
        assert_eq!(
            merge_patch(&old, &new),
            json!({"phase": "Deploying", "queuePosition": null,
                   "timings": {"sha": "b", "readyAt": null}})
        );
    }
}
