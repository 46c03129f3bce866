//! `PreviewCluster`: a target cluster previewd may place environments on, registered by the
//! operator. Cluster-scoped, like a ClusterRole: no team's namespace can register one.
//!
//! previewd (the hub, where webhooks arrive) writes only `PreviewTemplate` and
//! `PreviewEnvironment` records into [`PreviewClusterSpec::namespace`] of the target; a previewd
//! installed there (the agent) deploys them as it deploys its own. See docs/architecture.md
//! ("Beyond one cluster") for why and what happens when either side is down.

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::SecretKeyRef;

/// A cluster environments can be placed on; its labels (`metadata.labels`) are what templates
/// select by (`spec.placement.clusterSelector`).
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "previewd.dev",
    version = "v1alpha1",
    kind = "PreviewCluster",
    status = "PreviewClusterStatus",
    shortname = "pcluster",
    category = "previewd",
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".spec.capacity"}"#,
    printcolumn = r#"{"name":"Placed","type":"integer","jsonPath":".status.environments"}"#,
    printcolumn = r#"{"name":"Reachable","type":"boolean","jsonPath":".status.reachable"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PreviewClusterSpec {
    /// A kubeconfig for the target, in a Secret of previewd's own namespace (never a
    /// template's or an environment's). It needs only the records' rights in `namespace`
    /// (docs/installing.md, "Registering a cluster").
    pub kubeconfig_secret_ref: SecretKeyRef,
    /// The namespace on the target where previewd writes its records and the target's previewd
    /// watches. It cannot change (the API server refuses it): records written into the old one
    /// would be left running there. Register the cluster again under another name instead.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "namespace cannot change: register the cluster again under another name"}]))]
    pub namespace: String,
    /// Environments at most on this cluster.
    pub capacity: u32,
    /// The namespaces whose templates may place environments here; `*` for all. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub template_namespaces: Vec<String>,
}

impl PreviewClusterSpec {
    /// Whether templates of `namespace` may place environments on this cluster.
    pub fn admits(&self, namespace: &str) -> bool {
        self.template_namespaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == namespace)
    }
}

/// What previewd last saw of the cluster. Written only when it changes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreviewClusterStatus {
    /// Whether its API server answered the last look. A cluster not reachable for longer
    /// than the grace period gets no new environments; those on it stay as they are.
    #[serde(default)]
    pub reachable: bool,
    /// Since when `reachable` has been what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// What the last look said, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Environments placed on it.
    #[serde(default)]
    pub environments: u32,
}
