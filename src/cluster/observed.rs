//! What the API server holds, as seen by one watch per kind across all environments (label
//! `app.kubernetes.io/managed-by=previewd`), never a watch per environment and never polling.
//!
//! For each object it keeps the object without status and bookkeeping fields (for drift
//! checks) and a small health summary; nothing else. Changes of an object that belongs to an
//! environment trigger a reconcile of that environment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
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

/// Where one kind's watch is: the list it is reading, and whether its first list is in.
struct KindWatch {
    resource: ApiResource,
    /// The list being read (between `Init` and `InitDone`).
    initial: Option<Objects>,
    /// Told when the first list is in; `None` afterwards, so a later list is a re-list.
    ready: Option<tokio::sync::oneshot::Sender<()>>,
}

impl KindWatch {
    fn new(resource: ApiResource, ready: tokio::sync::oneshot::Sender<()>) -> Self {
        Self {
            resource,
            initial: None,
            ready: Some(ready),
        }
    }
}

/// A watched object as JSON, with the apiVersion and kind a dynamic watch leaves out.
fn to_value(object: &DynamicObject, resource: &ApiResource) -> Option<Value> {
    let mut value = serde_json::to_value(object).ok()?;
    value["apiVersion"] = Value::String(resource.api_version.clone());
    value["kind"] = Value::String(resource.kind.clone());
    Some(value)
}
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
            let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
            watches
                .entry((resource.api_version.clone(), resource.kind.clone()))
                .or_default()
                .clone()
        };
        cell.get_or_try_init(|| async {
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(self.clone().watch(resource.clone(), ready_tx));
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(task);
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
        let mut kind = KindWatch::new(resource, ready);
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
                Ok(event) => self.on_event(&mut kind, event),
                Err(e) => {
                    tracing::warn!(kind = %kind.resource.kind, error = %e, "watch interrupted; resuming");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Takes one event of a kind's watch into the store, and triggers the reconciles of the
    /// environments whose objects it changed.
    fn on_event(&self, kind: &mut KindWatch, event: watcher::Event<DynamicObject>) {
        match event {
            watcher::Event::Init => kind.initial = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                if let Some(value) = to_value(&object, &kind.resource) {
                    kind.initial
                        .get_or_insert_with(HashMap::new)
                        .insert(ObjectKey::of(&value), ObservedObject::from_server(&value));
                }
            }
            watcher::Event::InitDone => {
                let fresh = kind.initial.take().unwrap_or_default();
                // A re-list (after a 410 or a broken watch) brings what the watch missed as a
                // list, not as events: it must trigger reconciles as events would, or a status
                // change inside the gap waits for the resync. The first list tells nobody
                // (every environment is reconciled when the controller starts).
                let relist = kind.ready.is_none();
                let changed = self.replace_kind(&kind.resource, fresh, relist);
                if let Some(ready) = kind.ready.take() {
                    let _ = ready.send(());
                }
                for object in changed {
                    self.notify(&object.content());
                }
            }
            watcher::Event::Apply(object) => {
                if let Some(value) = to_value(&object, &kind.resource) {
                    self.upsert(&value, true);
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(value) = to_value(&object, &kind.resource) {
                    self.objects
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&ObjectKey::of(&value));
                    self.notify(&value);
                }
            }
        }
    }

    /// Replaces every object of one kind with a fresh list of it. With `collect`, returns the
    /// objects that appeared, went, or changed in health or content, so their environments can
    /// hear of it (cheap clones: the content is shared; parsed only after the lock is released,
    /// and not at all on a first list, which tells nobody). An object the store holds at a
    /// newer resourceVersion than the list (recorded from an apply that finished after the list
    /// was read) is kept. One the store recorded after the list was read that the list lacks
    /// is dropped until the watch brings it; its environment, told, re-applies it once.
    fn replace_kind(
        &self,
        resource: &ApiResource,
        fresh: Objects,
        collect: bool,
    ) -> Vec<ObservedObject> {
        let same_kind =
            |key: &ObjectKey| key.api_version == resource.api_version && key.kind == resource.kind;
        let mut objects = self.objects.write().unwrap_or_else(PoisonError::into_inner);
        let mut old: Objects = HashMap::new();
        objects.retain(|key, object| match same_kind(key) {
            true => {
                old.insert(key.clone(), object.clone());
                false
            }
            false => true,
        });
        let mut changed = Vec::new();
        for (key, listed) in fresh {
            match old.remove(&key) {
                Some(known) if known.resource_version > listed.resource_version => {
                    objects.insert(key, known);
                }
                Some(known) if known.health == listed.health && known.digest == listed.digest => {
                    objects.insert(key, listed);
                }
                _ => {
                    if collect {
                        changed.push(listed.clone());
                    }
                    objects.insert(key, listed);
                }
            }
        }
        if collect {
            changed.extend(old.into_values());
        }
        changed
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
            let mut objects = self.objects.write().unwrap_or_else(PoisonError::into_inner);
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
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// The replica count the API server holds for a workload.
    pub fn live_replicas(&self, key: &ObjectKey) -> Option<i32> {
        self.get(key)?.content()["spec"]["replicas"]
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
    }

    pub fn forget(&self, key: &ObjectKey) {
        self.objects
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// How many objects the store holds (for memory figures).
    pub fn len(&self) -> usize {
        self.objects
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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

    fn widget(resource_version: &str, ready: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "cert", "namespace": "preview-pr-7", "resourceVersion": resource_version,
                "labels": {LABEL_ENVIRONMENT: "pr-7", LABEL_ENVIRONMENT_NAMESPACE: "team"}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Issuing"}]}}))
        .unwrap()
    }

    fn list(store: &ObservedStore, kind: &mut KindWatch, objects: Vec<DynamicObject>) {
        store.on_event(kind, watcher::Event::Init);
        for object in objects {
            store.on_event(kind, watcher::Event::InitApply(object));
        }
        store.on_event(kind, watcher::Event::InitDone);
    }

    /// A watch that breaks (a 410, a closed connection) lists its kind again; what changed in
    /// the gap arrives in that list, and must reconcile the environment as an event would (a
    /// Widget turning not-ready used to wait for the resync).
    /// A panic while the store was held must not turn every later read of it (each
    /// reconcile's) into a panic.
    #[tokio::test]
    async fn a_panic_holding_the_store_leaves_it_readable() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let (trigger, _triggered) = tokio::sync::mpsc::unbounded_channel();
        let store = ObservedStore::new(Client::try_from(config).unwrap(), trigger);
        let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _objects = store.objects.write();
            let _watches = store.watches.lock();
            panic!("a bug while the store is held");
        }));
        assert!(poisoned.is_err() && store.objects.is_poisoned());
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "namespace": "preview-pr-2", "resourceVersion": "1"}});
        store.record(&object);
        let key = ObjectKey::of(&object);
        assert!(store.get(&key).is_some());
        assert_eq!(store.len(), 1);
        store.forget(&key);
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn a_relist_triggers_the_environments_whose_objects_changed_in_the_gap() {
        use kube::api::GroupVersionKind;
        // Never contacted: the events are fed by hand.
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let (trigger, mut triggered) = tokio::sync::mpsc::unbounded_channel();
        let store = ObservedStore::new(Client::try_from(config).unwrap(), trigger);
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
        let (ready, mut listed) = tokio::sync::oneshot::channel();
        let mut kind = KindWatch::new(resource, ready);
        let key = ObjectKey::of(&to_value(&widget("5", "True"), &kind.resource).unwrap());
        let environment = ObjectRef::<PreviewEnvironment>::new("pr-7").within("team");

        // The first list fills the store and triggers nothing (every environment is
        // reconciled when the controller starts).
        list(&store, &mut kind, vec![widget("5", "True")]);
        assert!(listed.try_recv().is_ok(), "the first list is announced");
        assert_eq!(store.get(&key).unwrap().health, Health::Ready);
        assert!(triggered.try_recv().is_err());

        // A re-list that finds nothing new triggers nothing.
        list(&store, &mut kind, vec![widget("5", "True")]);
        assert!(triggered.try_recv().is_err());

        // The Widget went not-ready while the watch was broken.
        list(&store, &mut kind, vec![widget("7", "False")]);
        assert_eq!(triggered.try_recv().ok(), Some(environment.clone()));
        assert!(matches!(
            store.get(&key).unwrap().health,
            Health::Progressing(_)
        ));

        // An apply recorded after the list was read is newer than the list: kept, not news.
        store.record(&to_value(&widget("9", "True"), &kind.resource).unwrap());
        list(&store, &mut kind, vec![widget("8", "False")]);
        assert_eq!(store.get(&key).unwrap().health, Health::Ready);
        assert!(triggered.try_recv().is_err());

        // It was deleted while the watch was broken.
        list(&store, &mut kind, vec![]);
        assert_eq!(triggered.try_recv().ok(), Some(environment));
        assert!(store.get(&key).is_none());
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
