//! The environment's namespace and its guard rails (pure): the Namespace itself, its
//! ResourceQuota and LimitRange (the defaults with the template's changes over them,
//! [`crate::model::quota`]) and default-deny NetworkPolicy (ingress and egress).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::crd::PreviewTemplateSpec;
use crate::model::metadata::LABEL_ENVIRONMENT_UID;
use crate::model::quota::{container_limits, quota_hard};

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
    database_egress: &[Value],
) -> Vec<Value> {
    let metadata = |name: &str| json!({"name": name, "namespace": namespace, "labels": labels});
    let mut objects = Vec::new();
    let hard = quota_hard(template);
    objects.push(json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": metadata(QUOTA_NAME), "spec": {"hard": hard}}));
    let limits = container_limits(template);
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
    let policy = &template.namespace.network_policy;
    if policy.default_deny {
        // Ingress only from pods of this namespace and, if named, the ingress controller's.
        let mut from = vec![json!({"podSelector": {}})];
        if let Some(ingress_namespace) = &policy.ingress_namespace {
            from.push(json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ingress_namespace}}}));
        }
        objects.push(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata(NETWORK_POLICY_NAME),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": from}], "egress": egress_rules(&policy.dns_peers, &policy.egress, database_egress)}
        }));
    }
    objects
}

/// Egress out of a default-deny namespace: DNS (port 53 to the cluster's DNS only: port 53 to
/// any address would carry anything to anywhere), the namespace's own pods, what the template
/// lists, and each database server of the environment on its port.
fn egress_rules(dns_peers: &[Value], extra: &[Value], databases: &[Value]) -> Vec<Value> {
    let dns_peers = match dns_peers {
        [] => vec![default_dns_peer()],
        listed => listed.to_vec(),
    };
    let dns = json!({"to": dns_peers,
                     "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]});
    let own_pods = json!({"to": [{"podSelector": {}}]});
    [dns, own_pods]
        .into_iter()
        .chain(extra.iter().cloned())
        .chain(databases.iter().cloned())
        .collect()
}

/// The cluster DNS of most clusters: CoreDNS or kube-dns, labelled `k8s-app: kube-dns`, in
/// `kube-system` (the namespace label `kubernetes.io/metadata.name` is set by Kubernetes itself
/// from 1.21 on).
fn default_dns_peer() -> Value {
    json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{LimitRangeSpec, PodSecurityLevel};

    #[test]
    fn previewds_own_names_are_reserved_by_the_content_policy() {
        let access = crate::reconcile::access::ACCESS_BINDING_NAME;
        for name in [QUOTA_NAME, LIMITS_NAME, NETWORK_POLICY_NAME, access] {
            assert!(
                name.starts_with(crate::plan::policy::RESERVED_PREFIX),
                "{name}"
            );
        }
    }

    #[test]
    fn the_namespace_carries_the_pod_security_level_of_the_templates_policy() {
        const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
        let mut template = PreviewTemplateSpec::default();
        // A template's own namespace labels cannot lower the level its policy asks for.
        template
            .namespace
            .labels
            .insert(ENFORCE.into(), "privileged".into());
        let labels = namespace_labels(&template, &BTreeMap::new(), "uid-1");
        assert_eq!(labels[ENFORCE], "baseline", "the default level");
        let namespace = namespace_object("preview-x", &labels);
        assert_eq!(namespace["metadata"]["labels"][ENFORCE], "baseline");
        template.policy.pod_security = PodSecurityLevel::Restricted;
        let labels = namespace_labels(&template, &BTreeMap::new(), "uid-1");
        assert_eq!(labels[ENFORCE], "restricted");
    }

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
        let objects = guard_rails("preview-x", &template, &BTreeMap::new(), &[]);
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["ResourceQuota", "LimitRange", "NetworkPolicy"]);
        assert_eq!(objects[0]["spec"]["hard"]["pods"], "20");
        assert_eq!(
            objects[0]["spec"]["hard"]["requests.ephemeral-storage"], "20Gi",
            "a template's quota changes values, it never drops the default's"
        );
        assert_eq!(objects[1]["spec"]["limits"][0]["default"]["cpu"], "500m");
        assert_eq!(objects[1]["spec"]["limits"][0]["default"]["memory"], "2Gi");
        assert!(objects[1]["spec"]["limits"][0].get("max").is_none());
        let from = &objects[2]["spec"]["ingress"][0]["from"];
        assert_eq!(
            from[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "ingress-nginx"
        );
        // Egress is denied too, but for DNS and the namespace's own pods.
        let policy = &objects[2]["spec"];
        assert_eq!(policy["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(policy["egress"][0]["ports"][0]["port"], 53);
        assert_eq!(policy["egress"].as_array().map(Vec::len), Some(2));
        // DNS goes to the cluster's DNS only, never to any address.
        assert_eq!(policy["egress"][0]["to"], json!([default_dns_peer()]));
        template.namespace.network_policy.dns_peers =
            vec![json!({"ipBlock": {"cidr": "10.96.0.10/32"}})];
        let objects = guard_rails("preview-x", &template, &BTreeMap::new(), &[]);
        assert_eq!(
            objects[2]["spec"]["egress"][0]["to"],
            json!([{"ipBlock": {"cidr": "10.96.0.10/32"}}])
        );
        template.namespace.network_policy.egress =
            vec![json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]})];
        let objects = guard_rails("preview-x", &template, &BTreeMap::new(), &[]);
        assert_eq!(
            objects[2]["spec"]["egress"][2]["to"][0]["ipBlock"]["cidr"],
            "0.0.0.0/0"
        );
        // Without a quota or limits of its own, a namespace gets the default ones: CPU and
        // memory requests, Jobs and CronJobs counted, and defaults for containers that say
        // nothing, so the quota counts them too.
        template.namespace.network_policy.default_deny = false;
        template.namespace.resource_quota = None;
        template.namespace.limit_range = None;
        let objects = guard_rails("preview-x", &template, &BTreeMap::new(), &[]);
        assert_eq!(objects.len(), 2);
        let hard = &objects[0]["spec"]["hard"];
        assert_eq!(hard["pods"], "50");
        assert_eq!(hard["services.loadbalancers"], "0");
        for held in [
            "requests.cpu",
            "requests.memory",
            "count/jobs.batch",
            "count/cronjobs.batch",
            "requests.ephemeral-storage",
            "limits.ephemeral-storage",
        ] {
            assert!(hard[held].is_string(), "{held} in {hard}");
        }
        let limits = &objects[1]["spec"]["limits"][0];
        assert_eq!(
            limits["defaultRequest"],
            json!({"cpu": "50m", "memory": "64Mi", "ephemeral-storage": "64Mi"})
        );
        assert_eq!(
            limits["default"],
            json!({"cpu": "2", "memory": "2Gi", "ephemeral-storage": "2Gi"})
        );
    }
}
