//! What the API server holds, as seen by one watch per kind across all environments (label
//! `app.kubernetes.io/managed-by=previewd`), never a watch per environment and never polling.
//!
//! For each object it keeps the object without status and bookkeeping fields (for drift
//! checks) and a small health summary; nothing else. Changes of an object that belongs to an
//! environment trigger a reconcile of that environment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::cluster::health::{self, Health};
use crate::cluster::recall;
use crate::model::crd::PreviewEnvironment;
use crate::model::metadata::{LABEL_ENVIRONMENT, LABEL_ENVIRONMENT_NAMESPACE, LABEL_MANAGED_BY};

/// Identity of an object previewd manages.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped objects (the environment's Namespace).
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        Self {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// What the store keeps of one object. The content is kept as compact JSON and parsed when
/// read: a parsed `serde_json::Value` tree of a Deployment takes about ten times the memory of
/// its text (every JSON object is a B-tree node allocated for eleven entries), and at 1,000
/// environments that difference was most of previewd's memory. Readers that only need to know
/// whether the content changed compare [`ObservedObject::digest`] and parse nothing.
#[derive(Clone, Debug)]
pub struct ObservedObject {
    /// The object without status, managedFields, uid, resourceVersion, generation, timestamps.
    content: Arc<str>,
    /// SHA-256 of `content`.
    pub digest: [u8; 32],
    /// The fields other managers own (see [`recall::foreign_fields`]), as a JSON list; `None`
    /// when there are none (most objects).
    foreign: Option<Arc<str>>,
    pub health: Health,
    resource_version: u64,
}

impl ObservedObject {
    pub fn from_server(object: &Value) -> Self {
        let content: Arc<str> = strip(object).to_string().into();
        let foreign = recall::foreign_fields(object);
        Self {
            digest: Sha256::digest(content.as_bytes()).into(),
            content,
            foreign: (!foreign.is_empty()).then(|| Value::Array(foreign).to_string().into()),
            health: health::of_object(object),
            resource_version: object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }

    /// The object without status and bookkeeping fields (see [`strip`]).
    pub fn content(&self) -> Value {
        // The text was written by `to_string` above, so it parses; `Null` is never reached.
        serde_json::from_str(&self.content).unwrap_or(Value::Null)
    }

    /// The field sets other managers own, usually none.
    pub fn foreign(&self) -> Vec<Value> {
        self.foreign
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default()
    }
}

/// The object without the fields the server and controllers own.
pub fn strip(object: &Value) -> Value {
    let mut content = object.clone();
    if let Some(map) = content.as_object_mut() {
        map.remove("status");
        if let Some(metadata) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in [
                "managedFields",
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "selfLink",
            ] {
                metadata.remove(field);
            }
        }
    }
    content
}

/// `server` reduced to the shape of `manifest`: only the fields the manifest sets, lists
/// compared element by element. Defaults filled in by the API server and fields other
/// controllers add are thereby ignored, while any change to a field previewd sets shows.
pub fn project(server: &Value, manifest: &Value) -> Value {
    match (server, manifest) {
        (Value::Object(server), Value::Object(shape)) => Value::Object(
            shape
                .iter()
                .map(|(key, sub_shape)| {
                    let value = server
                        .get(key)
                        .map(|v| project(v, sub_shape))
                        .unwrap_or(Value::Null);
                    (key.clone(), value)
                })
                .collect(),
        ),
        (Value::Array(server), Value::Array(shape)) if server.len() == shape.len() => Value::Array(
            server
                .iter()
                .zip(shape)
                .map(|(s, m)| project(s, m))
                .collect(),
        ),
        _ => server.clone(),
    }
}

type Objects = HashMap<ObjectKey, ObservedObject>;
/// One watch per (apiVersion, kind); the cell is set once its initial list is in.
type Watches = HashMap<(String, String), Arc<tokio::sync::OnceCell<()>>>;

/// The shared watch store.
pub struct ObservedStore {
    client: Client,
    objects: RwLock<Objects>,
    watches: Mutex<Watches>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    trigger: UnboundedSender<ObjectRef<PreviewEnvironment>>,
}

impl ObservedStore {
    pub fn new(
        client: Client,
        trigger: UnboundedSender<ObjectRef<PreviewEnvironment>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            objects: RwLock::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            trigger,
        })
    }

    /// Starts the watch for this kind if it is not running, and waits for its initial list.
    pub async fn ensure_watch(self: &Arc<Self>, resource: &ApiResource) -> Result<(), kube::Error> {
        let cell = {
            let mut watches = self.watches.lock().expect("watches lock");
            watches
                .entry((resource.api_version.clone(), resource.kind.clone()))
                .or_default()
                .clone()
        };
        cell.get_or_try_init(|| async {
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(self.clone().watch(resource.clone(), ready_tx));
            self.tasks.lock().expect("tasks lock").push(task);
            // The initial list of a kind; without it every object would look missing.
            match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
                Ok(Ok(())) => Ok(()),
                _ => Err(kube::Error::Service(
                    format!("the watch of {} did not list within 60 s", resource.kind).into(),
                )),
            }
        })
        .await
        .map(|_| ())
    }

    async fn watch(
        self: Arc<Self>,
        resource: ApiResource,
        ready: tokio::sync::oneshot::Sender<()>,
    ) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}=previewd"));
        let mut events = watcher(api, config).boxed();
        let mut ready = Some(ready);
        let mut initial: Option<Objects> = None;
        let same_kind =
            |key: &ObjectKey| key.api_version == resource.api_version && key.kind == resource.kind;
        loop {
            // The controller owns the trigger's receiver: once it is gone (this replica lost
            // the leader Lease, or is shutting down), nobody needs this watch any more.
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => break,
                },
                _ = self.trigger.closed() => break,
            };
            match event {
                Ok(watcher::Event::Init) => initial = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(object)) => {
                    if let Some(value) = self.to_value(&object, &resource) {
                        initial
                            .get_or_insert_with(HashMap::new)
                            .insert(ObjectKey::of(&value), ObservedObject::from_server(&value));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    let fresh = initial.take().unwrap_or_default();
                    {
                        let mut objects = self.objects.write().expect("store lock");
                        objects.retain(|key, _| !same_kind(key));
                        objects.extend(fresh);
                    }
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(watcher::Event::Apply(object)) => {
                    if let Some(value) = self.to_value(&object, &resource) {
                        self.upsert(&value, true);
                    }
                }
                Ok(watcher::Event::Delete(object)) => {
                    if let Some(value) = self.to_value(&object, &resource) {
                        self.objects
                            .write()
                            .expect("store lock")
                            .remove(&ObjectKey::of(&value));
                        self.notify(&value);
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = %resource.kind, error = %e, "watch interrupted; resuming");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn to_value(&self, object: &DynamicObject, resource: &ApiResource) -> Option<Value> {
        let mut value = serde_json::to_value(object).ok()?;
        value["apiVersion"] = Value::String(resource.api_version.clone());
        value["kind"] = Value::String(resource.kind.clone());
        Some(value)
    }

    /// Records what the server returned for an apply, so the next reconcile need not wait for
    /// the watch to see it. Older versions never replace newer ones.
    pub fn record(&self, object: &Value) {
        self.upsert(object, false);
    }

    fn upsert(&self, object: &Value, notify: bool) {
        let observed = ObservedObject::from_server(object);
        let key = ObjectKey::of(object);
        let changed = {
            let mut objects = self.objects.write().expect("store lock");
            match objects.get(&key) {
                Some(existing) if existing.resource_version > observed.resource_version => false,
                Some(existing) => {
                    let changed =
                        existing.health != observed.health || existing.digest != observed.digest;
                    objects.insert(key, observed);
                    changed
                }
                None => {
                    objects.insert(key, observed);
                    true
                }
            }
        };
        if notify && changed {
            self.notify(object);
        }
    }

    fn notify(&self, object: &Value) {
        let labels = &object["metadata"]["labels"];
        if let (Some(name), Some(namespace)) = (
            labels[LABEL_ENVIRONMENT].as_str(),
            labels[LABEL_ENVIRONMENT_NAMESPACE].as_str(),
        ) {
            let _ = self.trigger.send(ObjectRef::new(name).within(namespace));
        }
    }

    pub fn get(&self, key: &ObjectKey) -> Option<ObservedObject> {
        self.objects.read().expect("store lock").get(key).cloned()
    }

    /// The replica count the API server holds for a workload.
    pub fn live_replicas(&self, key: &ObjectKey) -> Option<i32> {
        self.get(key)?.content()["spec"]["replicas"]
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
    }

    pub fn forget(&self, key: &ObjectKey) {
        self.objects.write().expect("store lock").remove(key);
    }

    /// How many objects the store holds (for memory figures).
    pub fn len(&self) -> usize {
        self.objects.read().expect("store lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for ObservedStore {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .map(|t| t.iter().map(|t| t.abort_handle()).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn projection_ignores_server_defaults_and_added_annotations() {
        let manifest = json!({"metadata": {"name": "web", "labels": {"a": "1"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}}});
        let server = json!({"metadata": {"name": "web", "labels": {"a": "1"}, "annotations": {"deployment.kubernetes.io/revision": "1"}},
            "spec": {"replicas": 1, "progressDeadlineSeconds": 600,
                     "template": {"spec": {"containers": [{"name": "web", "image": "nginx", "imagePullPolicy": "Always"}]}}}});
        assert_eq!(project(&server, &manifest), manifest);
    }

    #[test]
    fn projection_shows_changes_to_managed_fields() {
        let manifest = json!({"spec": {"replicas": 1, "ports": [{"port": 80}]}});
        let edited = json!({"spec": {"replicas": 3, "ports": [{"port": 80}]}});
        assert_ne!(project(&edited, &manifest), manifest);
        let extra_port = json!({"spec": {"replicas": 1, "ports": [{"port": 80}, {"port": 81}]}});
        assert_ne!(project(&extra_port, &manifest), manifest);
        let removed = json!({"spec": {"ports": [{"port": 80}]}});
        assert_ne!(project(&removed, &manifest), manifest);
    }

    #[test]
    fn strip_drops_status_and_bookkeeping() {
        let object = json!({"metadata": {"name": "a", "uid": "u", "resourceVersion": "5", "managedFields": [], "labels": {"x": "y"}},
                            "spec": {"a": 1}, "status": {"b": 2}});
        assert_eq!(
            strip(&object),
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"a": 1}})
        );
    }
}
