//! The controller: the watches that trigger reconciles, and what wraps each one (a span, the
//! finalizer that splits live environments from deleted ones, timing, backoff on errors).

use crate::cluster::storage_classes::StorageClasses;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Recorder, Reporter as EventReporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::Instrument;

use super::ControllerMetrics;
use super::cleanup::cleanup;
use super::config::ControllerConfig;
use super::context::{CachedCopy, Context, Memory};
use super::databases::Databases;
use super::error::ReconcileError;
use super::pipeline::reconcile_environment;
use super::remote::hub::Hub;
use super::remote::look_after_clusters;
use crate::cluster::applier::Applier;
use crate::cluster::caches::{Caches, Readiness, without_managed_fields};
use crate::cluster::observed::ObservedStore;
use crate::cluster::secrets::SecretReader;
use crate::cluster::writer::Writer;
use crate::engines::Engines;
use crate::forge::report::Reporter;
use crate::forge::repository::RepositoryManifests;
use crate::forge::template_client::{ForgeCallError, TemplateClients};
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::FINALIZER;

/// Runs the controller until the stream ends (it does not on its own). Sends the context to
/// `context_out` once built, so callers (tests, the sweep) can share its caches and reporter.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    context_out: Option<tokio::sync::oneshot::Sender<Arc<Context>>>,
) {
    let (environments, templates) = watched_apis(&client, config.namespace.as_deref());
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::unbounded_channel();
    let store = ObservedStore::new(client.clone(), trigger_tx.clone());
    // Readiness comes from the watch streams themselves (their InitDone events), after the
    // reflector has stored what the event says, so nobody is told before the store holds it.
    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let readiness = Arc::new(Readiness::<2>::new(ready_tx));
    let (template_store, template_writer) = reflector::store();
    let templates_ready = readiness.clone();
    let template_stream = reflector(
        template_writer,
        watcher(templates, Default::default()).modify(without_managed_fields),
    )
    .inspect(move |event| templates_ready.observe(0, event))
    .default_backoff()
    .touched_objects();
    let (environment_store, environment_writer) = reflector::store();
    let environment_stream = reflector(
        environment_writer,
        watcher(environments, Default::default()).modify(without_managed_fields),
    )
    .inspect(move |event| readiness.observe(1, event))
    .default_backoff()
    .touched_objects();
    let controller = Controller::for_stream(environment_stream, environment_store.clone())
        .with_config(controller::Config::default().concurrency(config.reconcile_concurrency));
    let caches = Caches {
        templates: template_store,
        environments: environment_store.clone(),
        ready,
    };
    let parts = Parts {
        client,
        config,
        metrics,
        caches,
        store,
        trigger: trigger_tx,
    };
    let context = Arc::new(build_context(parts));
    if let Some(out) = context_out {
        let _ = out.send(context.clone());
    }
    // The looks at registered clusters run as long as the controller, in the same future: a
    // term as leader that ends takes them with it.
    let looks = look_after_clusters(context.clone());
    let reconciles = controller
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
        .reconcile_on(stream_from(trigger_rx))
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        });
    tokio::select! {
        _ = reconciles => {}
        _ = looks => {}
    }
}

/// The APIs of the two watched kinds: in `namespace`, or cluster-wide.
fn watched_apis(
    client: &Client,
    namespace: Option<&str>,
) -> (Api<PreviewEnvironment>, Api<PreviewTemplate>) {
    match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    }
}

/// What the context is built from.
struct Parts {
    client: Client,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    caches: Caches,
    store: Arc<ObservedStore>,
    trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<PreviewEnvironment>>,
}

fn build_context(parts: Parts) -> Context {
    let Parts {
        client,
        config,
        metrics,
        caches,
        store,
        trigger,
    } = parts;
    let engines = Engines::new(config.engines.clone());
    Context {
        applier: Applier::new(
            client.clone(),
            store,
            metrics.cluster.clone(),
            config.apply_concurrency,
        ),
        recorder: Recorder::new(
            client.clone(),
            EventReporter {
                controller: "previewd".into(),
                instance: None,
            },
        ),
        reporter: Arc::new(
            Reporter::new(Arc::new(
                TemplateClients::new(metrics.forge, Arc::new(SecretReader::new(client.clone())))
                    .with_api_defaults(config.forge_api_defaults.clone()),
            ))
            .with_prices(config.prices.clone())
            .with_content_limits(config.content_limits),
        ),
        storage_classes: StorageClasses::new(client.clone()),
        hub: Hub::start(client.clone(), config.placement.clone(), trigger.clone()),
        databases: Databases::start(client.clone(), config.databases.clone()),
        client,
        config,
        metrics: metrics.reconcile,
        writer: Writer::new(metrics.cluster),
        caches,
        repository_manifests: RepositoryManifests::default(),
        engines,
        reconcile_trigger: trigger,
        memory: Memory::default(),
    }
}

fn stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// One span per reconcile, so every line it logs (and kube's own) says which environment,
/// template and repository it is about.
async fn reconcile(
    environment: Arc<PreviewEnvironment>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
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
) -> Result<Action, ReconcileError> {
    // The environment watch can list before the template watch has: reconciling then would
    // call the template missing and mark a healthy environment Degraded (seen when a new
    // leader starts with environments already in place).
    context.wait_for_caches().await;
    let started = Instant::now();
    let key = ObjectRef::from_obj(&*environment);
    let api: Api<PreviewEnvironment> = Api::namespaced(
        context.client.clone(),
        &environment.namespace().unwrap_or_default(),
    );
    let Some(environment) = with_own_writes(environment, &key, &api, &context).await? else {
        // The watch brings our own write soon, and that triggers a reconcile from it; the
        // requeue is only a safety net.
        return Ok(Action::requeue(STALE_READ_RETRY));
    };
    let inputs = || context.inputs_of(&environment);
    if let Some(left) = context.memory.held_back_for(&key, inputs) {
        // Leaves the failure count as it is: the retry at the end continues the backoff.
        tracing::debug!(
            "the API server refused an object and nothing it depends on changed; retrying in {left:?}"
        );
        return Ok(Action::requeue(left));
    }
    let has_finalizer = environment.finalizers().iter().any(|f| f == FINALIZER);
    if !has_finalizer && environment.meta().deletion_timestamp.is_none() {
        context.writer.counted("finalizer");
    }
    let removed = environment.meta().deletion_timestamp.is_some();
    let removed = removed.then(|| environment.clone());
    let result = finalizer(&api, FINALIZER, environment, |event| async {
        match event {
            FinalizerEvent::Apply(environment) => {
                reconcile_environment(&environment, &context).await
            }
            FinalizerEvent::Cleanup(environment) => cleanup(&environment, &context).await,
        }
    })
    .await;
    let result = settle(result, &key, removed, &context);
    let outcome = if result.is_ok() { "ok" } else { "error" };
    context
        .metrics
        .reconcile_duration
        .with_label_values(&[outcome])
        .observe(started.elapsed().as_secs_f64());
    result
}

/// What a reconcile through the finalizer came to: what is remembered of the environment is
/// forgotten once it is gone, its backoff restarts on success, and a read that was merely
/// stale (the watch had not brought the last write yet) is looked at again, not failed.
fn settle(
    result: Result<Action, kube::runtime::finalizer::Error<ReconcileError>>,
    key: &ObjectRef<PreviewEnvironment>,
    removed: Option<Arc<PreviewEnvironment>>,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let result = match result {
        // The environment is gone: a reconcile of a cached copy that still showed the finalizer
        // ran the cleanup again, and another had already removed the finalizer, so the API
        // server deleted the environment. Nothing failed and nothing is left to do.
        Err(kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)))
            if status.code == 404 =>
        {
            tracing::debug!(
                "the environment was deleted before this reconcile removed its finalizer"
            );
            Ok(Action::await_change())
        }
        other => other,
    };
    match result {
        Ok(action) => {
            // Backoff restarts only when a whole reconcile, forge report included, succeeded.
            context.memory.succeeded(key);
            if let Some(environment) = removed {
                // The finalizer is gone (or was never ours): nothing more to remember.
                context.memory.forget(key);
                context.reporter.forget(&environment);
            }
            Ok(action)
        }
        Err(
            kube::runtime::finalizer::Error::AddFinalizer(e)
            | kube::runtime::finalizer::Error::RemoveFinalizer(e),
        ) if is_stale_read(&e) => {
            // The cache showed the environment without the finalizer (or with it), but the
            // server's copy has changed since (usually: the previous reconcile added it, or
            // removed it, and the watch has not brought that yet). Nothing failed and nothing
            // was done: look again once the watch has caught up, leaving any backoff count as
            // it was.
            tracing::debug!(error = %e, "the environment changed since the cache read it; looking again");
            Ok(Action::requeue(STALE_READ_RETRY))
        }
        Err(
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e),
        ) => Err(e),
        Err(other) => Err(ReconcileError::Finalizer(Box::new(other))),
    }
}

/// The environment as a reconcile must see it: at least as new as this process's last status
/// write (see [`Memory::judge_cache`]). `None` when the cache surely lacks that write (wait for
/// the watch); a fresh read from the API server when it may; the cached copy otherwise (nearly
/// always: one GET per reconcile only between a write and the watch bringing it).
async fn with_own_writes(
    environment: Arc<PreviewEnvironment>,
    key: &ObjectRef<PreviewEnvironment>,
    api: &Api<PreviewEnvironment>,
    context: &Context,
) -> Result<Option<Arc<PreviewEnvironment>>, ReconcileError> {
    let version = environment.resource_version().unwrap_or_default();
    match context.memory.judge_cache(key, &version) {
        CachedCopy::Current => Ok(Some(environment)),
        CachedCopy::Behind => {
            tracing::debug!("the cache does not show this process's last status write yet");
            Ok(None)
        }
        CachedCopy::Unsure => {
            let name = environment.name_any();
            let fresh = context
                .metrics
                .timed("read", api.get_opt(&name))
                .await
                .map_err(ReconcileError::Read)?;
            let Some(fresh) = fresh else {
                return Ok(None);
            };
            if fresh.resource_version() == environment.resource_version() {
                context.memory.cache_caught_up(key);
            }
            tracing::debug!(
                "read the environment from the API server: the cache may lack this process's last status write"
            );
            Ok(Some(Arc::new(fresh)))
        }
    }
}

/// How soon a reconcile that read a stale cache looks again.
const STALE_READ_RETRY: Duration = Duration::from_secs(1);

/// Whether the API server refused the finalizer patch because its `test` of the finalizer list
/// (which the cache showed) no longer holds: 422 for a failed JSON-patch test, 409 for a conflict.
fn is_stale_read(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if matches!(status.code, 409 | 422))
}

fn error_policy(
    environment: Arc<PreviewEnvironment>,
    error: &ReconcileError,
    context: Arc<Context>,
) -> Action {
    if let ReconcileError::ForgeNotTold(e) = error
        && let Some(wait) = e.waits_for_budget()
    {
        // Not a failure: the removal's report waits its turn in the content budget.
        tracing::debug!(environment = %environment.name_any(), "the forge report waits {wait:?} for the content budget");
        return Action::requeue(wait.max(Duration::from_millis(200)));
    }
    context
        .metrics
        .reconcile_errors
        .with_label_values(&[error.metric_label()])
        .inc();
    match error {
        ReconcileError::NamespaceTerminating(_) => return Action::requeue(Duration::from_secs(1)),
        // Its status says it; the look at the cluster reconciles it again once it answers.
        ReconcileError::RemovalOnCluster(_) => return Action::requeue(Duration::from_secs(2)),
        ReconcileError::ForgeNotTold(e) => return retry_telling_the_forge(&environment, e),
        _ => {}
    }
    let key = ObjectRef::from_obj(&*environment);
    let (attempt, delay) = context.memory.backoff_after_failure(&key);
    if matches!(error, ReconcileError::Apply(refused) if refused.is_refused()) {
        // Only a change of the environment or its template can help before the next try.
        let inputs = context.inputs_of(&environment);
        let until = Instant::now() + delay;
        context.memory.hold_back(key, until, inputs);
    }
    tracing::warn!(environment = %environment.name_any(), attempt, error = %error, "reconcile failed; retrying in {delay:?}");
    Action::requeue(delay)
}

/// A removed environment whose forge has not heard: the next try is when the forge client
/// allows (it backs off on its own), at least a second and at most 10 s away. Not the
/// reconcile's doubling backoff, which would soon outlast the patience for the forge.
fn retry_telling_the_forge(environment: &PreviewEnvironment, error: &ForgeCallError) -> Action {
    let Some(wait) = error.retry_after() else {
        tracing::warn!(environment = %environment.name_any(), error = %error, "could not tell the forge the environment was destroyed; trying again");
        return Action::requeue(Duration::from_secs(2));
    };
    tracing::debug!(environment = %environment.name_any(), error = %error, "the forge has not heard the environment is gone yet");
    Action::requeue(wait.clamp(Duration::from_secs(1), Duration::from_secs(10)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the server rejected our request", "Invalid")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_a_changed_object_counts_as_a_stale_read() {
        assert!(is_stale_read(&api_error(422)), "a failed JSON-patch test");
        assert!(is_stale_read(&api_error(409)), "a conflict");
        for code in [403, 404, 500, 503] {
            assert!(
                !is_stale_read(&api_error(code)),
                "HTTP {code} is a real failure"
            );
        }
    }
}
