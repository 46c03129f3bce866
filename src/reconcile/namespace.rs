//! The environment's namespace and its guard rails (pure): the Namespace itself, and the
//! template's ResourceQuota, LimitRange and default-deny NetworkPolicy.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::crd::PreviewTemplateSpec;
use crate::model::metadata::LABEL_ENVIRONMENT_UID;

pub const QUOTA_NAME: &str = "previewd-quota";
pub const LIMITS_NAME: &str = "previewd-limits";
pub const NETWORK_POLICY_NAME: &str = "previewd-default-deny";

/// The labels of the environment's namespace: the template's own, then previewd's (which win),
/// the environment's UID, which marks the namespace as created for it, and the Pod Security
/// level the template's policy asks for.
pub fn namespace_labels(
    template: &PreviewTemplateSpec,
    labels: &BTreeMap<String, String>,
    environment_uid: &str,
) -> BTreeMap<String, String> {
    let mut all_labels = template.namespace.labels.clone();
    all_labels.extend(labels.clone());
    all_labels.insert(
        LABEL_ENVIRONMENT_UID.to_string(),
        environment_uid.to_string(),
    );
    // Clusters from 1.23 enforce the template's level themselves (older ones ignore the label;
    // previewd's own check in `plan::policy` holds either way).
    all_labels.insert(
        "pod-security.kubernetes.io/enforce".to_string(),
        template.policy.pod_security.label().to_string(),
    );
    all_labels
}

/// The Namespace object.
pub fn namespace_object(name: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// ResourceQuota, LimitRange and NetworkPolicy, as the template asks for them.
pub fn guard_rails(
    namespace: &str,
    template: &PreviewTemplateSpec,
    labels: &BTreeMap<String, String>,
) -> Vec<Value> {
    let metadata = |name: &str| json!({"name": name, "namespace": namespace, "labels": labels});
    let mut objects = Vec::new();
    if let Some(hard) = &template.namespace.resource_quota {
        objects.push(json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": metadata(QUOTA_NAME), "spec": {"hard": hard}}));
    }
    if let Some(limits) = &template.namespace.limit_range {
        let mut item = json!({"type": "Container"});
        for (field, values) in [
            ("default", &limits.default),
            ("defaultRequest", &limits.default_request),
            ("max", &limits.max),
        ] {
            if !values.is_empty() {
                item[field] = json!(values);
            }
        }
        objects.push(json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": metadata(LIMITS_NAME), "spec": {"limits": [item]}}));
    }
    let policy = &template.namespace.network_policy;
    if policy.default_deny {
        // Ingress only from pods of this namespace and, if named, the ingress controller's.
        let mut from = vec![json!({"podSelector": {}})];
        if let Some(ingress_namespace) = &policy.ingress_namespace {
            from.push(json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ingress_namespace}}}));
        }
        objects.push(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata(NETWORK_POLICY_NAME),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": from}]}
        }));
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::LimitRangeSpec;

    #[test]
    fn guard_rails_follow_the_template() {
        let mut template = PreviewTemplateSpec::default();
        template.namespace.network_policy.default_deny = true;
        template.namespace.network_policy.ingress_namespace = Some("ingress-nginx".into());
        template.namespace.resource_quota = Some([("pods".to_string(), "20".to_string())].into());
        template.namespace.limit_range = Some(LimitRangeSpec {
            default: [("cpu".to_string(), "500m".to_string())].into(),
            ..Default::default()
        });
        let objects = guard_rails("preview-x", &template, &BTreeMap::new());
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["ResourceQuota", "LimitRange", "NetworkPolicy"]);
        assert_eq!(objects[0]["spec"]["hard"]["pods"], "20");
        assert_eq!(objects[1]["spec"]["limits"][0]["default"]["cpu"], "500m");
        assert!(objects[1]["spec"]["limits"][0].get("max").is_none());
        let from = &objects[2]["spec"]["ingress"][0]["from"];
        assert_eq!(
            from[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "ingress-nginx"
        );
        template.namespace.network_policy.default_deny = false;
        template.namespace.resource_quota = None;
        template.namespace.limit_range = None;
        assert!(guard_rails("preview-x", &template, &BTreeMap::new()).is_empty());
    }
}
