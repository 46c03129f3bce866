//! Registered clusters for the tests and benchmarks that place environments: the hub's
//! identity on a target (previewd's records in one namespace, nothing else), its inline
//! kubeconfig, and the registration on the hub.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, PostParams};
use previewd::cluster::secrets::CLUSTER_CREDENTIAL_TYPE;
use previewd::model::crd::PreviewCluster;
use serde_json::json;

/// The hub's identity on a target: it may only read and write previewd's records in `ns`.
pub async fn records_access(client: &Client, ns: &str, user: &str) {
    // The rules the chart's hubAccess gives, generated from the same function.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "previewd-hub"},
        "rules": previewd::model::rbac::hub_record_rules(),
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "previewd-hub"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "previewd-hub"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// A kubeconfig for the sandbox at `admin_kubeconfig`, acting as `user` (its admin token,
/// impersonating), inline as a registered cluster's must be.
pub fn acting_as(admin_kubeconfig: &std::path::Path, user: &str) -> String {
    let admin = std::fs::read_to_string(admin_kubeconfig).unwrap();
    let mut kubeconfig: serde_json::Value = serde_yaml_ng::from_str(&admin).unwrap();
    for entry in kubeconfig["users"].as_array_mut().unwrap() {
        entry["user"]["as"] = json!(user);
    }
    serde_yaml_ng::to_string(&kubeconfig).unwrap()
}

/// Registers a cluster: its kubeconfig Secret in the hub's namespace and its `PreviewCluster`,
/// labelled `previewd.dev/test: <ns>` (what the hub's template selects) and admitting `ns`.
pub async fn register(
    hub: &Client,
    ns: &str,
    name: &str,
    kubeconfig: String,
    records: &str,
    capacity: u32,
) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "type": CLUSTER_CREDENTIAL_TYPE,
        "stringData": {"kubeconfig": kubeconfig}
    }))
    .unwrap();
    Api::<Secret>::namespaced(hub.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let cluster: PreviewCluster = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewCluster",
        "metadata": {"name": name, "labels": {"previewd.dev/test": ns}},
        "spec": {"kubeconfigSecretRef": {"name": name, "key": "kubeconfig"},
                 "namespace": records, "capacity": capacity, "templateNamespaces": [ns]}
    }))
    .unwrap();
    Api::<PreviewCluster>::all(hub.clone())
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
}
