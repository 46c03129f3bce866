//! The one list of kinds previewd may write. The guard refuses every template object whose kind
//! is not in [`TEMPLATE_KINDS`], and the chart's RBAC is generated from the same lists
//! ([`crate::model::rbac`]), so the two cannot disagree: adding a kind here is the whole change
//! (then `cargo run --bin rbacgen`, which a test checks).

/// A namespaced kind, with the resource name RBAC rules use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// The API group (empty for the core group).
    pub group: &'static str,
    pub kind: &'static str,
    /// The plural resource name, as RBAC rules and URLs spell it.
    pub resource: &'static str,
}

const fn kind(group: &'static str, kind: &'static str, resource: &'static str) -> Kind {
    Kind {
        group,
        kind,
        resource,
    }
}

/// Kinds a template may create. All are namespaced. Cluster-scoped kinds (ClusterRole,
/// ClusterRoleBinding, Namespace, CRDs, webhooks, PersistentVolumes, …) are refused, and so
/// are ResourceQuota and LimitRange, which previewd sets itself from the template's guard rails.
pub const TEMPLATE_KINDS: &[Kind] = &[
    kind("", "ConfigMap", "configmaps"),
    kind("", "Secret", "secrets"),
    kind("", "Service", "services"),
    kind("", "ServiceAccount", "serviceaccounts"),
    kind("", "PersistentVolumeClaim", "persistentvolumeclaims"),
    kind("", "Pod", "pods"),
    kind("apps", "Deployment", "deployments"),
    kind("apps", "StatefulSet", "statefulsets"),
    kind("batch", "Job", "jobs"),
    kind("batch", "CronJob", "cronjobs"),
    kind("networking.k8s.io", "Ingress", "ingresses"),
    kind("networking.k8s.io", "NetworkPolicy", "networkpolicies"),
    kind("rbac.authorization.k8s.io", "Role", "roles"),
    kind("rbac.authorization.k8s.io", "RoleBinding", "rolebindings"),
    kind(
        "autoscaling",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
    ),
    kind("policy", "PodDisruptionBudget", "poddisruptionbudgets"),
];

/// Kinds previewd writes itself into every environment namespace: the guard rails (quota,
/// limits, network policy) and the RoleBinding that gives previewd its rights there.
pub const GUARD_RAIL_KINDS: &[Kind] = &[
    kind("", "ResourceQuota", "resourcequotas"),
    kind("", "LimitRange", "limitranges"),
    kind("networking.k8s.io", "NetworkPolicy", "networkpolicies"),
    kind("rbac.authorization.k8s.io", "RoleBinding", "rolebindings"),
];

/// Whether templates may create `kind` of API `group`.
pub fn template_may_create(group: &str, kind: &str) -> bool {
    TEMPLATE_KINDS
        .iter()
        .any(|k| k.group == group && k.kind == kind)
}

/// Whether previewd watches `kind` across the cluster to see drift and health. Secrets are not
/// watched: a cluster-wide watch needs the right to read every Secret of the cluster, and
/// previewd reads Secrets only where a template names them (docs/security.md). A Secret previewd
/// applied is compared with what its apply returned; a hand edit of it is not seen.
pub fn is_watched(group: &str, kind: &str) -> bool {
    !(group.is_empty() && kind == "Secret")
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → the core group, "").
pub fn group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}
