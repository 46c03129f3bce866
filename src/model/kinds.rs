//! The kinds previewd may write. Templates may create the kinds of one list, [`TemplateKinds`],
//! which the operator sets (the chart's `templateKinds` and `extraTemplateKinds` values become
//! `--template-kinds` and, in the same chart, the RBAC rules: one source for the guard and the
//! rights). Its default, [`DEFAULT_TEMPLATE_KINDS`], is what the chart's values.yaml lists (a
//! test compares them). The kinds previewd writes itself, [`GUARD_RAIL_KINDS`], are fixed.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::model::naming::is_dns1123_label;

/// A namespaced kind, with the resource name RBAC rules use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kind {
    /// The API group (empty for the core group).
    pub group: Cow<'static, str>,
    pub kind: Cow<'static, str>,
    /// The plural resource name, as RBAC rules and URLs spell it.
    pub resource: Cow<'static, str>,
    /// The operator's word that objects of this kind reach nothing beyond their namespace
    /// (a custom resource of the application's own, say). A kind the content policy has no
    /// rules for is refused unless it is declared inert (docs/security.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inert: bool,
}

const fn kind(group: &'static str, kind: &'static str, resource: &'static str) -> Kind {
    Kind {
        group: Cow::Borrowed(group),
        kind: Cow::Borrowed(kind),
        resource: Cow::Borrowed(resource),
        inert: false,
    }
}

/// Kinds templates may create unless the operator says otherwise. All are namespaced.
/// Cluster-scoped kinds (ClusterRole, Namespace, CRDs, webhooks, …) can never be allowed, and
/// neither can ResourceQuota and LimitRange, which previewd sets itself from the template's
/// guard rails (see [`TemplateKinds::parse`]).
pub const DEFAULT_TEMPLATE_KINDS: &[Kind] = &[
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

/// Kinds no configuration may allow: previewd's own (a PR could create environments or
/// templates), the guard rails it sets itself, and the built-in cluster-scoped kinds (the
/// applier also refuses any kind the cluster reports as cluster-scoped, CRDs included).
const NEVER_ALLOWED: &[(&str, &str)] = &[
    ("", "Namespace"),
    ("", "ResourceQuota"),
    ("", "LimitRange"),
    ("", "Node"),
    ("", "PersistentVolume"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
    ),
    ("storage.k8s.io", "StorageClass"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("apiregistration.k8s.io", "APIService"),
];

/// The group previewd's own resources live in; no kind of it may be allowed.
const OWN_GROUP: &str = "previewd.dev";

/// The kinds templates may create, as the operator configured them (`--template-kinds`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateKinds(Vec<Kind>);

impl Default for TemplateKinds {
    fn default() -> Self {
        Self(DEFAULT_TEMPLATE_KINDS.to_vec())
    }
}

impl TemplateKinds {
    /// The list from its JSON form, `[{"group": "gateway.networking.k8s.io", "kind":
    /// "HTTPRoute", "resource": "httproutes"}, …]` (what the chart passes). Every entry is
    /// checked: a name the API server could not have, a wildcard, or a kind that must never be
    /// allowed refuses the whole list, so previewd does not start with a configuration it would
    /// only half apply.
    pub fn parse(text: &str) -> Result<Self, String> {
        let kinds: Vec<Kind> = serde_json::from_str(text).map_err(|e| {
            format!("expected a JSON list of {{\"group\", \"kind\", \"resource\"}} objects: {e}")
        })?;
        let mut unique: Vec<Kind> = Vec::with_capacity(kinds.len());
        for kind in kinds {
            check_kind(&kind)?;
            if !unique.contains(&kind) {
                unique.push(kind);
            }
        }
        Ok(Self(unique))
    }

    /// Whether templates may create `kind` of API `group`.
    pub fn allows(&self, group: &str, kind: &str) -> bool {
        self.0.iter().any(|k| k.group == group && k.kind == kind)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Kind> {
        self.0.iter()
    }

    /// Whether the operator declared `kind` of API `group` inert.
    pub fn is_inert(&self, group: &str, kind: &str) -> bool {
        self.0
            .iter()
            .any(|k| k.group == group && k.kind == kind && k.inert)
    }
}

fn check_kind(kind: &Kind) -> Result<(), String> {
    let problem = if !is_kind_name(&kind.kind) {
        Some("the kind must be a name like HTTPRoute (letters and digits, starting upper-case)")
    } else if !is_resource_name(&kind.resource) {
        Some("the resource must be the lower-case plural the API uses, like httproutes")
    } else if !is_group_name(&kind.group) {
        Some("the group must be empty (core) or a DNS name like gateway.networking.k8s.io")
    } else if kind.group == OWN_GROUP || kind.group.ends_with(".previewd.dev") {
        Some("previewd's own kinds may not be created by templates")
    } else if NEVER_ALLOWED
        .iter()
        .any(|(group, name)| kind.group == *group && kind.kind == *name)
    {
        Some("this kind is cluster-scoped or set by previewd itself, and can never be allowed")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(format!(
            "template kind {:?} (group {:?}, resource {:?}): {problem}",
            kind.kind, kind.group, kind.resource
        )),
        None => Ok(()),
    }
}

fn is_kind_name(text: &str) -> bool {
    text.len() <= 63
        && text.starts_with(|c: char| c.is_ascii_uppercase())
        && text.chars().all(|c| c.is_ascii_alphanumeric())
}

/// A plural resource name: a DNS-1123 label that starts with a letter (`httproutes`).
fn is_resource_name(text: &str) -> bool {
    is_dns1123_label(text) && text.starts_with(|c: char| c.is_ascii_lowercase())
}

/// An API group: empty (the core group) or a DNS subdomain (`gateway.networking.k8s.io`).
fn is_group_name(text: &str) -> bool {
    text.is_empty() || (text.len() <= 253 && text.split('.').all(is_dns1123_label))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_list_adds_custom_resources_and_drops_what_it_leaves_out() {
        let kinds = TemplateKinds::parse(
            r#"[{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "resource": "httproutes"},
                {"group": "", "kind": "ConfigMap", "resource": "configmaps"},
                {"group": "", "kind": "ConfigMap", "resource": "configmaps"}]"#,
        )
        .unwrap();
        assert!(kinds.allows("gateway.networking.k8s.io", "HTTPRoute"));
        assert!(kinds.allows("", "ConfigMap"));
        assert!(!kinds.allows("apps", "Deployment"), "not in the list");
        assert!(!kinds.allows("", "HTTPRoute"), "the group counts");
        assert_eq!(kinds.iter().count(), 2, "duplicates are kept once");
        assert!(TemplateKinds::default().allows("apps", "Deployment"));
    }

    #[test]
    fn dangerous_or_malformed_entries_refuse_the_whole_list() {
        let entry = |group: &str, kind: &str, resource: &str| {
            TemplateKinds::parse(
                &serde_json::json!([{"group": group, "kind": kind, "resource": resource}])
                    .to_string(),
            )
        };
        for (group, kind, resource, says) in [
            ("", "Namespace", "namespaces", "can never be allowed"),
            (
                "",
                "ResourceQuota",
                "resourcequotas",
                "can never be allowed",
            ),
            (
                "rbac.authorization.k8s.io",
                "ClusterRoleBinding",
                "clusterrolebindings",
                "can never be allowed",
            ),
            (
                "previewd.dev",
                "PreviewEnvironment",
                "previewenvironments",
                "previewd's own",
            ),
            ("", "ConfigMap", "*", "resource"),
            ("*", "ConfigMap", "configmaps", "group"),
            ("Example.COM", "Widget", "widgets", "group"),
            ("", "configmap", "configmaps", "kind"),
            ("", "", "configmaps", "kind"),
        ] {
            let error = entry(group, kind, resource).unwrap_err();
            assert!(error.contains(says), "{group}/{kind}/{resource}: {error}");
        }
        assert!(TemplateKinds::parse("ConfigMap").is_err());
        assert!(TemplateKinds::parse(r#"[{"kind": "ConfigMap"}]"#).is_err());
    }
}
