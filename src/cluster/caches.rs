//! The watched caches of `PreviewTemplate`s and `PreviewEnvironment`s, and the readiness signal
//! that says they hold the cluster's state. The webhook side and the reconciler both read
//! [`Caches`]; it is defined here, below both, so that neither needs the other.
//!
//! Every replica serves webhooks, but only the leader reconciles, so the server cannot borrow
//! the controller's caches: it keeps its own pair of watches ([`Caches::start`]). On the leader
//! that is a second watch of the same two kinds; both are small (one object per environment and
//! template), and the separation means a lost lease never takes webhooks down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, ResourceExt};

use crate::model::crd::{PreviewEnvironment, PreviewTemplate};

/// Turns a readiness flag true once every one of `N` watches has listed everything once
/// (their `InitDone` event). Used instead of `Store::wait_until_ready`, whose one-shot channel
/// wakes only the last of several concurrent waiters.
pub struct Readiness<const N: usize> {
    listed: [AtomicBool; N],
    ready: tokio::sync::watch::Sender<bool>,
}

impl<const N: usize> Readiness<N> {
    pub fn new(ready: tokio::sync::watch::Sender<bool>) -> Self {
        Self {
            listed: std::array::from_fn(|_| AtomicBool::new(false)),
            ready,
        }
    }

    pub fn observe<K>(&self, watch: usize, event: &Result<watcher::Event<K>, watcher::Error>) {
        if let Ok(watcher::Event::InitDone) = event {
            self.listed[watch].store(true, Ordering::SeqCst);
            if self.listed.iter().all(|l| l.load(Ordering::SeqCst)) {
                self.ready.send_replace(true);
            }
        }
    }
}

/// Drops an object's managedFields before a reflector stores it. Nobody reads them from the
/// caches, and for an environment they are the largest part of the object: its status's field
/// set is a JSON tree per status writer, kept in every cache of every replica.
pub fn without_managed_fields<K: ResourceExt>(object: &mut K) {
    object.managed_fields_mut().clear();
}

/// Templates and environments as the API server holds them, kept current by two watches.
#[derive(Clone)]
pub struct Caches {
    pub templates: Store<PreviewTemplate>,
    pub environments: Store<PreviewEnvironment>,
    /// True once both caches have listed everything once.
    pub ready: tokio::sync::watch::Receiver<bool>,
}

impl Caches {
    /// Waits until both caches hold the cluster's state. Everyone waits on this rather than on
    /// `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
    /// concurrent waiters (a second waiter hung forever).
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// The template `name` in `namespace`, as the cache holds it.
    pub fn template(&self, namespace: &str, name: &str) -> Option<Arc<PreviewTemplate>> {
        self.templates
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
    }
}

/// The two watch tasks behind a [`Caches`]; they stop when this is dropped (before the
/// API server goes away, so that it is not left waiting on open watches).
pub struct CacheWatches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for CacheWatches {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Caches {
    /// Starts the two watches (in `namespace`, or cluster-wide) on the current runtime. They
    /// retry with backoff on their own and run until the returned guard is dropped.
    pub fn start(client: Client, namespace: Option<&str>) -> (Self, CacheWatches) {
        let (templates_api, environments_api): (Api<PreviewTemplate>, Api<PreviewEnvironment>) =
            match namespace {
                Some(ns) => (
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client, ns),
                ),
                None => (Api::all(client.clone()), Api::all(client)),
            };
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let readiness = Arc::new(Readiness::<2>::new(ready_tx));
        let (templates, template_writer) = reflector::store();
        let (environments, environment_writer) = reflector::store();
        let templates_ready = readiness.clone();
        let template_task = tokio::spawn(
            reflector(
                template_writer,
                watcher(templates_api, watcher::Config::default()).modify(without_managed_fields),
            )
            // After the reflector: the store holds what the event says before anyone is told.
            .inspect(move |event| templates_ready.observe(0, event))
            .default_backoff()
            .for_each(|_| async {}),
        );
        let environment_task = tokio::spawn(
            reflector(
                environment_writer,
                watcher(environments_api, watcher::Config::default())
                    .modify(without_managed_fields),
            )
            // After the reflector: the store holds what the event says before anyone is told.
            .inspect(move |event| readiness.observe(1, event))
            .default_backoff()
            .for_each(|_| async {}),
        );
        let caches = Self {
            templates,
            environments,
            ready,
        };
        (caches, CacheWatches(vec![template_task, environment_task]))
    }
}
