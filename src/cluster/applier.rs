//! Apply: server-side apply under one field manager, objects of a wave in parallel (bounded),
//! and a skip cache so that nothing unchanged is sent.
//!
//! Per object the cache keeps two SHA-256s: of the rendered manifest, and of what the apply
//! returned (projected onto the manifest's fields, see [`observed::project`]). An object is
//! applied when its manifest changed, when it is missing from the watch store, or when what
//! the watch last saw (projected the same way) differs from what the apply returned: drift. A
//! periodic full resync bypasses the cache.
//!
//! The cache is in memory; after a restart it is seeded from the cluster instead of re-sending
//! everything: each object carries the hash of the manifest it was applied from (see
//! [`recall`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PropagationPolicy,
};
use kube::{Api, Client};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::cluster::health::Health;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::observed::{self, ObjectKey, ObservedStore};
use crate::cluster::recall;
use crate::cluster::writer::Writer;
use crate::model::kinds::{group_of, is_watched};
use crate::model::metadata::FIELD_MANAGER_RECONCILE;

type Sha = [u8; 32];

fn sha(value: &Value) -> Sha {
    Sha256::digest(value.to_string().as_bytes()).into()
}

#[derive(Clone, Copy)]
struct CacheEntry {
    manifest: Sha,
    applied: Sha,
    /// The digest of the observed content last found to match `applied`: while the watch
    /// shows that same content, the drift check needs no parse.
    checked: Option<Sha>,
}

/// An apply that failed, and the object it was for (a user reading a condition needs the
/// object, not only the API server's words).
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: {}", crate::cluster::errors::in_words(.source))]
pub struct ApplyError {
    pub kind: String,
    pub name: String,
    #[source]
    pub source: kube::Error,
}

impl ApplyError {
    pub fn of(manifest: &Value, source: kube::Error) -> Self {
        Self {
            kind: manifest["kind"].as_str().unwrap_or("object").to_string(),
            name: manifest["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            source,
        }
    }

    /// Whether the API server refused the object itself: retrying the same manifest cannot
    /// succeed, so the environment should say so. Invalid (422), bad request (400), forbidden
    /// (403, previewd's RBAC), a kind the cluster does not serve (404, discovery), and the 500
    /// "failed to create typed patch object" with which server-side apply refuses a manifest
    /// its schema cannot merge. Outages, timeouts, 409 and 429 are transient: not refused, and
    /// neither is the 403 for a namespace still terminating (a PR closed and reopened at once).
    pub fn is_refused(&self) -> bool {
        match &self.source {
            kube::Error::Api(status) => {
                let terminating = status.message.contains("because it is being terminated");
                (matches!(status.code, 400 | 403 | 404 | 422) && !terminating)
                    || (status.code == 500
                        && status
                            .message
                            .contains("failed to create typed patch object"))
            }
            kube::Error::Discovery(_) => true,
            _ => false,
        }
    }
}

/// Whether discovering an `apiVersion`/`kind` failed because the cluster does not serve it: a
/// group/version the API server answers 404 for, or a kind missing from a version it serves
/// (a CRD not installed, or an apiVersion the cluster's Kubernetes does not have).
pub fn is_not_served(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

/// What one `apply` call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub sent: usize,
    pub skipped: usize,
}

pub struct Applier {
    client: Client,
    store: Arc<ObservedStore>,
    writer: Writer,
    concurrency: usize,
    cache: Mutex<HashMap<ObjectKey, CacheEntry>>,
    resources: Mutex<HashMap<(String, String), Discovered>>,
}

/// A kind as discovery found it.
#[derive(Clone, Debug)]
pub struct Discovered {
    pub resource: ApiResource,
    /// Whether its objects live in a namespace (a template may create only those).
    pub namespaced: bool,
}

impl Applier {
    pub fn new(
        client: Client,
        store: Arc<ObservedStore>,
        metrics: ClusterMetrics,
        concurrency: usize,
    ) -> Self {
        Self {
            client,
            store,
            writer: Writer::new(metrics),
            concurrency: concurrency.max(1),
            cache: Mutex::new(HashMap::new()),
            resources: Mutex::new(HashMap::new()),
        }
    }

    /// The API resource of `apiVersion`/`kind` (discovered once), with its watch running.
    pub async fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<ApiResource, kube::Error> {
        Ok(self.discover(api_version, kind).await?.resource)
    }

    /// `apiVersion`/`kind` as the cluster serves it (discovered once), with its watch running.
    pub async fn discover(&self, api_version: &str, kind: &str) -> Result<Discovered, kube::Error> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self
            .resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(found.clone());
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let (resource, capabilities) = kube::discovery::pinned_kind(
            &self.client,
            &GroupVersionKind::gvk(group, version, kind),
        )
        .await?;
        let found = Discovered {
            resource,
            namespaced: capabilities.scope == kube::discovery::Scope::Namespaced,
        };
        // Unwatched kinds (Secrets) are compared with what their apply returned instead.
        if is_watched(group, kind) {
            self.store.ensure_watch(&found.resource).await?;
        }
        self.resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, found.clone());
        Ok(found)
    }

    fn api(&self, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
        if namespace.is_empty() {
            Api::all_with(self.client.clone(), resource)
        } else {
            Api::namespaced_with(self.client.clone(), namespace, resource)
        }
    }

    /// Whether `sent` must be sent: see the module documentation.
    async fn needs_apply(&self, key: &ObjectKey, sent: &Value, manifest_sha: &Sha) -> bool {
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied();
        let entry = match cached {
            Some(entry) => entry,
            None => match self.recall(key, sent, manifest_sha).await {
                Some(entry) => entry,
                None => return true,
            },
        };
        if entry.manifest != *manifest_sha {
            return true;
        }
        let Some(observed) = self.store.get(key) else {
            return true;
        };
        if entry.checked == Some(observed.digest) {
            return false;
        }
        if sha(&observed::project(&observed.content(), sent)) != entry.applied {
            return true;
        }
        self.remember(
            key.clone(),
            CacheEntry {
                checked: Some(observed.digest),
                ..entry
            },
        );
        false
    }

    fn remember(&self, key: ObjectKey, entry: CacheEntry) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, entry);
    }

    /// After a restart the cache is empty: an object that the cluster shows as applied from this
    /// very manifest and untouched since (see [`recall`]) is taken as applied, and its cache
    /// entry seeded from what is observed. Secrets are not watched: they are read (a read, not
    /// a write); a failed read means the object is applied, as before.
    async fn recall(
        &self,
        key: &ObjectKey,
        sent: &Value,
        manifest_sha: &Sha,
    ) -> Option<CacheEntry> {
        let observed = match self.store.get(key) {
            Some(observed) => observed,
            None if is_watched(group_of(&key.api_version), &key.kind) => return None,
            None => self.read(key).await?,
        };
        let hash = hex::encode(manifest_sha);
        let content = observed.content();
        if !recall::applied_unchanged(&content, &observed.foreign(), sent, &hash) {
            return None;
        }
        let entry = CacheEntry {
            manifest: *manifest_sha,
            applied: sha(&observed::project(&content, sent)),
            checked: Some(observed.digest),
        };
        self.remember(key.clone(), entry);
        Some(entry)
    }

    /// Reads an unwatched object into the store; `None` when it is missing or unreadable.
    async fn read(&self, key: &ObjectKey) -> Option<observed::ObservedObject> {
        let resource = self.resource(&key.api_version, &key.kind).await.ok()?;
        let object = self
            .api(&resource, &key.namespace)
            .get_opt(&key.name)
            .await
            .ok()??;
        self.store.record(&typed(&object, key));
        self.store.get(key)
    }

    /// Applies `objects` concurrently (at most `concurrency` at once). With `bypass_cache`
    /// everything is sent (the periodic resync).
    pub async fn apply(
        &self,
        objects: &[&Value],
        bypass_cache: bool,
    ) -> Result<ApplyStats, ApplyError> {
        for object in objects {
            self.resource(
                object["apiVersion"].as_str().unwrap_or_default(),
                object["kind"].as_str().unwrap_or_default(),
            )
            .await
            .map_err(|source| ApplyError::of(object, source))?;
        }
        // Futures collected first: a stream built from a borrowing closure trips the compiler's
        // higher-ranked lifetime inference once it sits inside the controller's future.
        let pending: Vec<_> = objects
            .iter()
            .map(|object| Box::pin(self.apply_one(object, bypass_cache)))
            .collect();
        let sent: Vec<bool> = futures::stream::iter(pending)
            .buffer_unordered(self.concurrency)
            .try_collect()
            .await?;
        let sent_count = sent.iter().filter(|s| **s).count();
        Ok(ApplyStats {
            sent: sent_count,
            skipped: sent.len() - sent_count,
        })
    }

    async fn apply_one(&self, manifest: &Value, bypass_cache: bool) -> Result<bool, ApplyError> {
        self.apply_one_inner(manifest, bypass_cache)
            .await
            .map_err(|source| ApplyError::of(manifest, source))
    }

    async fn apply_one_inner(
        &self,
        manifest: &Value,
        bypass_cache: bool,
    ) -> Result<bool, kube::Error> {
        let key = ObjectKey::of(manifest);
        let manifest_sha = sha(manifest);
        let sent = recall::annotated(manifest, &hex::encode(manifest_sha));
        if !bypass_cache && !self.needs_apply(&key, &sent, &manifest_sha).await {
            self.writer
                .metrics()
                .applies
                .with_label_values(&["skipped"])
                .inc();
            return Ok(false);
        }
        let resource = self.resource(&key.api_version, &key.kind).await?;
        let params = PatchParams::apply(FIELD_MANAGER_RECONCILE).force();
        self.writer
            .metrics()
            .applies
            .with_label_values(&["sent"])
            .inc();
        let api = self.api(&resource, &key.namespace);
        let returned = self
            .writer
            .write("apply", api.patch(&key.name, &params, &Patch::Apply(&sent)))
            .await?;
        let returned = typed(&returned, &key);
        self.store.record(&returned);
        let applied = sha(&observed::project(&observed::strip(&returned), &sent));
        let entry = CacheEntry {
            manifest: manifest_sha,
            applied,
            checked: None,
        };
        self.remember(key, entry);
        Ok(true)
    }

    /// Deletes an object previewd no longer renders (background propagation: a Job's pods go too).
    pub async fn delete(&self, key: &ObjectKey) -> Result<(), kube::Error> {
        let resource = self.resource(&key.api_version, &key.kind).await?;
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let api = self.api(&resource, &key.namespace);
        match self
            .writer
            .write("delete", api.delete(&key.name, &params))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.forget(key);
        Ok(())
    }

    /// Health of an object from the watch store (not seen yet: still progressing).
    pub fn health(&self, key: &ObjectKey) -> Health {
        self.store
            .get(key)
            .map(|o| o.health)
            .unwrap_or_else(|| Health::Progressing("not observed yet".into()))
    }

    /// The labels of an object as the watch store holds it (not seen: `None`).
    pub fn observed_labels(&self, key: &ObjectKey) -> Option<BTreeMap<String, String>> {
        let observed = self.store.get(key)?;
        serde_json::from_value(observed.content()["metadata"]["labels"].take()).ok()
    }

    /// The watch store, for readers that must outlive a borrow of the applier (the plan step,
    /// which runs on a blocking thread).
    pub fn observed(&self) -> Arc<ObservedStore> {
        self.store.clone()
    }

    /// Drops an object from the cache and the store (its environment is gone).
    pub fn forget(&self, key: &ObjectKey) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        self.store.forget(key);
    }

    /// Forgets every cached object in `namespace`.
    pub fn forget_namespace(&self, namespace: &str) {
        let keys: Vec<ObjectKey> = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .filter(|k| k.namespace == namespace || k.name == namespace && k.namespace.is_empty())
            .cloned()
            .collect();
        for key in keys {
            self.forget(&key);
        }
    }
}

/// An object the API server returned, as JSON with the `apiVersion` and `kind` of `key` (a
/// dynamic object's own type fields may be empty), the form the store records.
fn typed(object: &DynamicObject, key: &ObjectKey) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    value["apiVersion"] = Value::String(key.api_version.clone());
    value["kind"] = Value::String(key.kind.clone());
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, message: &str) -> bool {
        let status: kube::core::Status =
            serde_json::from_value(serde_json::json!({"code": code, "message": message})).unwrap();
        ApplyError::of(
            &serde_json::json!({"kind": "Deployment", "metadata": {"name": "web"}}),
            kube::Error::Api(Box::new(status)),
        )
        .is_refused()
    }

    /// A panic while the apply cache was held must not turn every later reconcile into a
    /// panic: the cache and the discovered resources are used on.
    #[tokio::test]
    async fn a_panic_holding_the_caches_leaves_the_applier_working() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (trigger, _triggered) = tokio::sync::mpsc::unbounded_channel();
        let store = ObservedStore::new(client.clone(), trigger);
        let applier = Applier::new(client, store, ClusterMetrics::new(), 1);
        let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _cache = applier.cache.lock();
            let _resources = applier.resources.lock();
            panic!("a bug while the caches are held");
        }));
        assert!(poisoned.is_err() && applier.cache.is_poisoned());
        let key = ObjectKey::of(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "preview-pr-2"}}));
        applier.forget(&key);
        applier.forget_namespace("preview-pr-2");
        let discovered = applier.discover("example.com/v1", "Widget").await;
        assert!(discovered.is_err(), "no API server here, and no panic");
    }

    #[test]
    fn refusals_are_told_apart_from_outages() {
        assert!(refused(
            422,
            "Deployment.apps \"web\" is invalid: spec.selector: Required value"
        ));
        assert!(refused(
            403,
            "deployments.apps is forbidden: User cannot patch"
        ));
        assert!(refused(
            500,
            "failed to create typed patch object: .spec.ports: element 0"
        ));
        assert!(!refused(500, "etcdserver: request timed out"));
        assert!(!refused(
            503,
            "the server is currently unable to handle the request"
        ));
        assert!(!refused(409, "the object has been modified"));
        assert!(!refused(429, "too many requests"));
        assert!(!refused(
            403,
            "unable to create new content in namespace preview-x because it is being terminated"
        ));
    }
}
