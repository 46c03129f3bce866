//! What the hub keeps of its target clusters: the registered `PreviewCluster`s (a cache of the
//! API), a connection to each (a client built from its kubeconfig Secret, and caches of the
//! records previewd wrote there), and the placements this process wrote that its cache has not
//! shown yet.
//!
//! Nothing here decides from memory alone: placements live in the environments' status,
//! reachability in the clusters' status. Memory only saves reads (the records' caches) and
//! closes the window between a placement's write and its watch event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};

use crate::model::crd::{PreviewCluster, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::{LABEL_HUB_NAME, LABEL_HUB_NAMESPACE};
use crate::reconcile::config::PlacementConfig;

/// One registered cluster, connected.
pub struct Target {
    pub client: Client,
    /// The namespace of the records there.
    pub namespace: String,
    /// The environment records previewd wrote there, as their watch shows them.
    pub environments: Store<PreviewEnvironment>,
    /// The template records previewd wrote there.
    pub templates: Store<PreviewTemplate>,
    /// What the connection was built from (the kubeconfig and the namespace): another value
    /// (a rotated credential) builds a new one.
    pub(super) built_from: String,
    /// How many of the two caches have listed everything once: until both have, an absent
    /// record may only not be listed yet, and nothing is decided from them.
    listed: Arc<AtomicUsize>,
    _watches: Watches,
}

impl Target {
    /// Connects with `client` and starts watching previewd's records in `namespace`; each
    /// change of an environment record triggers a reconcile of the hub environment it stands
    /// for.
    pub fn start(
        client: Client,
        namespace: &str,
        built_from: String,
        trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<PreviewEnvironment>>,
    ) -> Self {
        let config = watcher::Config::default().labels(LABEL_HUB_NAMESPACE);
        let listed = Arc::new(AtomicUsize::new(0));
        let (environments, environment_writer) = reflector::store();
        let environments_listed = once_listed(listed.clone());
        let environment_watch = reflector(
            environment_writer,
            watcher(Api::namespaced(client.clone(), namespace), config.clone()),
        )
        .inspect(move |event| environments_listed(event))
        .default_backoff()
        .touched_objects()
        .for_each(move |record| {
            if let Ok(record) = record
                && let Some(hub) = hub_environment_of(&record)
            {
                let _ = trigger.send(hub);
            }
            async {}
        });
        let (templates, template_writer) = reflector::store();
        let templates_listed = once_listed(listed.clone());
        let template_watch = reflector(
            template_writer,
            watcher(Api::namespaced(client.clone(), namespace), config),
        )
        .inspect(move |event| templates_listed(event))
        .default_backoff()
        .for_each(|_| async {});
        Self {
            client,
            namespace: namespace.to_string(),
            environments,
            templates,
            built_from,
            listed,
            _watches: Watches(vec![
                tokio::spawn(environment_watch),
                tokio::spawn(template_watch),
            ]),
        }
    }

    /// Whether both caches have listed the records once (a restart, a new term and a rotated
    /// credential start them empty).
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire) >= 2
    }

    /// The environment record `name`, as its cache holds it.
    pub fn environment(&self, name: &str) -> Option<Arc<PreviewEnvironment>> {
        self.environments
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The template record `name`, as its cache holds it.
    pub fn template(&self, name: &str) -> Option<Arc<PreviewTemplate>> {
        self.templates
            .get(&ObjectRef::new(name).within(&self.namespace))
    }
}

/// Counts one cache as listed at its first `InitDone`.
fn once_listed<K>(
    listed: Arc<AtomicUsize>,
) -> impl Fn(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
    let counted = std::sync::atomic::AtomicBool::new(false);
    move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) && !counted.swap(true, Ordering::AcqRel) {
            listed.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The hub environment a record stands for, from its labels.
fn hub_environment_of(record: &PreviewEnvironment) -> Option<ObjectRef<PreviewEnvironment>> {
    let labels = record.labels();
    let namespace = labels.get(LABEL_HUB_NAMESPACE)?;
    let name = labels.get(LABEL_HUB_NAME)?;
    Some(ObjectRef::new(name).within(namespace))
}

/// The watch tasks of a target; they stop when it is dropped (unregistered, or rebuilt with a
/// rotated credential).
struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The hub's part of the context.
pub struct Hub {
    pub config: PlacementConfig,
    /// The registered clusters (empty while placement is off).
    pub clusters: Store<PreviewCluster>,
    targets: Mutex<HashMap<String, Arc<Target>>>,
    /// Placements decided one at a time, so that two environments never take the last slot.
    pub(super) placing: tokio::sync::Mutex<Placed>,
    pub(super) trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<PreviewEnvironment>>,
    _watch: Watches,
}

/// Placements this process wrote, by environment: counted with the cache's until the cache
/// shows them (or they are a minute old).
#[derive(Default)]
pub struct Placed(pub(super) HashMap<ObjectRef<PreviewEnvironment>, (String, std::time::Instant)>);

impl Hub {
    /// The hub, watching `PreviewCluster`s with `client` when placement is on (until it is
    /// dropped).
    pub fn start(
        client: Client,
        config: PlacementConfig,
        trigger: tokio::sync::mpsc::UnboundedSender<ObjectRef<PreviewEnvironment>>,
    ) -> Self {
        let (clusters, writer) = reflector::store();
        let mut watches = Vec::new();
        if config.credentials_namespace.is_some() {
            let watch = reflector(writer, watcher(Api::all(client), Default::default()))
                .default_backoff()
                .for_each(|_| async {});
            // Stops when the hub is dropped, with the controller's context.
            watches.push(tokio::spawn(watch));
        }
        Self {
            config,
            clusters,
            _watch: Watches(watches),
            targets: Mutex::new(HashMap::new()),
            placing: tokio::sync::Mutex::new(Placed::default()),
            trigger,
        }
    }

    /// The registered cluster `name`.
    pub fn cluster(&self, name: &str) -> Option<Arc<PreviewCluster>> {
        self.clusters.get(&ObjectRef::new(name))
    }

    /// The connection to cluster `name`, if one is made.
    pub fn target(&self, name: &str) -> Option<Arc<Target>> {
        self.lock_targets().get(name).cloned()
    }

    pub(super) fn keep_target(&self, name: &str, target: Arc<Target>) {
        self.lock_targets().insert(name.to_string(), target);
    }

    /// Drops the connections of clusters no longer registered.
    pub(super) fn drop_targets_except(&self, registered: &[String]) {
        self.lock_targets()
            .retain(|name, _| registered.iter().any(|r| r == name));
    }

    fn lock_targets(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Target>>> {
        self.targets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
