//! The operator's ceiling over what a template may widen (`--template-ceiling`, the chart's
//! `templateCeiling`). A `PreviewTemplate` is written by a team with rights in its own
//! namespace, yet its `policy` and `namespace` fields widen what every pull request of it gets:
//! privileged pods, bindings to ClusterRoles, Ingress hosts beyond the environment's own,
//! namespace labels that other teams' NetworkPolicies and Gateways select on. The ceiling is
//! what the cluster's operator lets any template ask for, field by field; by default nothing
//! beyond Pod Security Baseline, no extra ClusterRole, host, label or reach. A template that
//! asks for more is refused (every field beyond it named, with the ceiling) before anything
//! of it renders, and previewd's own ClusterRoles are never bindable, whatever the ceiling says.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::crd::{PodSecurityLevel, PolicySpec, PreviewTemplateSpec};
use super::metadata::prefix_in_domain;
use super::quota::{DEFAULT_QUOTA, at_most};

/// What a template may ask for, field by field (the names are those of the template's
/// `policy` and `namespace` fields they cap).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TemplateCeiling {
    /// The least strict `policy.podSecurity` a template may choose (default `Baseline`:
    /// `Privileged` checks nothing, and privileged pods with `hostPath: /` are root on a node).
    pub pod_security: PodSecurityLevel,
    /// `policy.allowedServiceTypes` a template may list.
    pub service_types: Vec<String>,
    /// Whether `policy.allowExternalIps` may be on.
    pub external_ips: bool,
    /// Hosts `policy.allowedIngressHosts` may list: exact names, or `*.domain` for any name
    /// under a domain the operator gives previews.
    pub ingress_hosts: Vec<String>,
    /// ClusterRoles `policy.allowedClusterRoles` may list (never previewd's own).
    pub cluster_roles: Vec<String>,
    /// Whether `policy.allowNetworkPeersOutside` may be on.
    pub network_peers_outside: bool,
    /// `policy.ingressClassNames` a template may list; unset: any class (a class picks which
    /// shared controller serves the environment's own host; hosts and annotations are capped).
    pub ingress_class_names: Option<Vec<String>>,
    /// `policy.allowedVolumeTypes` a template may list.
    pub volume_types: Vec<String>,
    /// Whether `policy.allowExistingVolumes` may be on.
    pub existing_volumes: bool,
    /// `policy.allowedCsiDrivers` a template may list.
    pub csi_drivers: Vec<String>,
    /// `policy.allowedPriorityClasses` a template may list.
    pub priority_classes: Vec<String>,
    /// `policy.allowedRuntimeClasses` a template may list.
    pub runtime_classes: Vec<String>,
    /// `policy.allowedTolerationKeys` a template may list.
    pub toleration_keys: Vec<String>,
    /// Whether `policy.allowMinAvailable` may be on.
    pub min_available: bool,
    /// `policy.allowedGateways` a template may list (`namespace/name`).
    pub gateways: Vec<String>,
    /// `policy.allowedClusterIssuers` a template may list.
    pub cluster_issuers: Vec<String>,
    /// `policy.allowedClusterSecretStores` a template may list.
    pub cluster_secret_stores: Vec<String>,
    /// Label keys `namespace.labels` may set. `kubernetes.io/` and `k8s.io/` keys (and their
    /// subdomains) are never settable: Kubernetes and other teams' policies select on them.
    pub namespace_labels: Vec<String>,
    /// Whether `namespace.networkPolicy` may turn the default deny off or add egress rules.
    pub network_policy: bool,
    /// The most `namespace.resourceQuota` may set, by resource, beyond the default quota's
    /// values (`super::quota::DEFAULT_QUOTA`), which cap every resource not named here. A
    /// template may always lower a value, or add a resource neither names (that only bounds).
    pub resource_quota: BTreeMap<String, String>,
}

/// Parses `--template-ceiling`: a JSON object of the fields above.
pub fn parse_ceiling(text: &str) -> Result<TemplateCeiling, String> {
    serde_json::from_str(text).map_err(|e| format!("expected the template ceiling as JSON: {e}"))
}

/// Everything `spec` asks for beyond `ceiling`, one sentence per field; `own_roles` are
/// previewd's own ClusterRoles, never bindable. Empty: within the ceiling.
pub fn beyond(
    spec: &PreviewTemplateSpec,
    ceiling: &TemplateCeiling,
    own_roles: &[String],
) -> Vec<String> {
    let mut found = policy_beyond(&spec.policy, ceiling, own_roles);
    found.extend(labels_beyond(spec, ceiling));
    found.extend(quota_beyond(spec, ceiling));
    let network = &spec.namespace.network_policy;
    if !ceiling.network_policy && (!network.default_deny || !network.egress.is_empty()) {
        found.push(
            "namespace.networkPolicy turns the default deny off or adds egress; the operator's \
             ceiling keeps previewd's guard rail as it is (networkPolicy: false)"
                .into(),
        );
    }
    found
}

/// Each `namespace.resourceQuota` value above what the ceiling (or, for a resource it does not
/// name, the default quota) allows.
fn quota_beyond(spec: &PreviewTemplateSpec, ceiling: &TemplateCeiling) -> Vec<String> {
    let Some(asked) = &spec.namespace.resource_quota else {
        return Vec::new();
    };
    let cap = |resource: &str| {
        ceiling.resource_quota.get(resource).cloned().or_else(|| {
            DEFAULT_QUOTA
                .iter()
                .find(|(name, _)| *name == resource)
                .map(|(_, quantity)| quantity.to_string())
        })
    };
    let mut found = Vec::new();
    for (resource, quantity) in asked {
        let Some(cap) = cap(resource) else { continue };
        match at_most(quantity, &cap) {
            Some(true) => {}
            Some(false) => found.push(format!(
                "namespace.resourceQuota.{resource} asks for {quantity}, beyond the operator's \
                 ceiling {cap} (resourceQuota)"
            )),
            None => found.push(format!(
                "namespace.resourceQuota.{resource} {quantity:?} is no quantity previewd can \
                 compare with the operator's ceiling {cap}"
            )),
        }
    }
    found
}

/// What the template's `policy` asks for beyond `ceiling`.
pub fn policy_beyond(
    policy: &PolicySpec,
    ceiling: &TemplateCeiling,
    own_roles: &[String],
) -> Vec<String> {
    let mut found = Vec::new();
    if strictness(policy.pod_security) < strictness(ceiling.pod_security) {
        found.push(format!(
            "policy.podSecurity {:?} is below the operator's ceiling {:?}",
            policy.pod_security, ceiling.pod_security
        ));
    }
    for (field, asked, allowed) in policy_lists(policy, ceiling) {
        found.extend(beyond_list(&format!("policy.{field}"), asked, allowed));
    }
    if let Some(classes) = &ceiling.ingress_class_names {
        found.extend(beyond_list(
            "policy.ingressClassNames",
            &policy.ingress_class_names,
            classes,
        ));
    }
    found.extend(switched_on_beyond(policy, ceiling));
    found.extend(own_roles_named(&policy.allowed_cluster_roles, own_roles));
    found.extend(hosts_beyond(
        &policy.allowed_ingress_hosts,
        &ceiling.ingress_hosts,
    ));
    found
}

/// Each allow-list of the policy beside the ceiling's list for it: (field, asked, allowed).
fn policy_lists<'a>(
    policy: &'a PolicySpec,
    ceiling: &'a TemplateCeiling,
) -> [(&'static str, &'a [String], &'a [String]); 10] {
    [
        (
            "allowedServiceTypes",
            &policy.allowed_service_types,
            &ceiling.service_types,
        ),
        (
            "allowedVolumeTypes",
            &policy.allowed_volume_types,
            &ceiling.volume_types,
        ),
        (
            "allowedCsiDrivers",
            &policy.allowed_csi_drivers,
            &ceiling.csi_drivers,
        ),
        (
            "allowedPriorityClasses",
            &policy.allowed_priority_classes,
            &ceiling.priority_classes,
        ),
        (
            "allowedRuntimeClasses",
            &policy.allowed_runtime_classes,
            &ceiling.runtime_classes,
        ),
        (
            "allowedTolerationKeys",
            &policy.allowed_toleration_keys,
            &ceiling.toleration_keys,
        ),
        (
            "allowedGateways",
            &policy.allowed_gateways,
            &ceiling.gateways,
        ),
        (
            "allowedClusterIssuers",
            &policy.allowed_cluster_issuers,
            &ceiling.cluster_issuers,
        ),
        (
            "allowedClusterSecretStores",
            &policy.allowed_cluster_secret_stores,
            &ceiling.cluster_secret_stores,
        ),
        (
            "allowedClusterRoles",
            &policy.allowed_cluster_roles,
            &ceiling.cluster_roles,
        ),
    ]
}

/// The policy's switches that are on where the ceiling keeps them off.
fn switched_on_beyond(policy: &PolicySpec, ceiling: &TemplateCeiling) -> Vec<String> {
    let switches = [
        (
            "policy.allowExternalIps",
            policy.allow_external_ips,
            ceiling.external_ips,
        ),
        (
            "policy.allowNetworkPeersOutside",
            policy.allow_network_peers_outside,
            ceiling.network_peers_outside,
        ),
        (
            "policy.allowExistingVolumes",
            policy.allow_existing_volumes,
            ceiling.existing_volumes,
        ),
        (
            "policy.allowMinAvailable",
            policy.allow_min_available,
            ceiling.min_available,
        ),
    ];
    switches
        .into_iter()
        .filter(|(_, asked, allowed)| *asked && !*allowed)
        .map(|(field, _, _)| format!("{field} is on; the operator's ceiling keeps it off"))
        .collect()
}

/// How strict a level is: a template may be as strict as it likes, never less than the ceiling.
fn strictness(level: PodSecurityLevel) -> u8 {
    match level {
        PodSecurityLevel::Privileged => 0,
        PodSecurityLevel::Baseline => 1,
        PodSecurityLevel::Restricted => 2,
    }
}

fn beyond_list(field: &str, asked: &[String], allowed: &[String]) -> Vec<String> {
    asked
        .iter()
        .filter(|item| !allowed.contains(item))
        .map(|item| {
            format!(
                "{field} lists {item:?}, beyond the operator's ceiling ({})",
                listed(allowed)
            )
        })
        .collect()
}

fn listed(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

fn own_roles_named(asked: &[String], own_roles: &[String]) -> Vec<String> {
    asked
        .iter()
        .filter(|role| own_roles.contains(role))
        .map(|role| {
            format!(
                "policy.allowedClusterRoles lists {role:?}, one of previewd's own ClusterRoles, \
                 which no template may bind"
            )
        })
        .collect()
}

/// Extra Ingress hosts, each an exact name of the ceiling or under one of its `*.domain`s.
fn hosts_beyond(asked: &[String], allowed: &[String]) -> Vec<String> {
    let within = |host: &str| {
        let host = host.to_ascii_lowercase();
        allowed.iter().any(|pattern| {
            let pattern = pattern.to_ascii_lowercase();
            match pattern.strip_prefix("*.") {
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|name| name.len() > 1 && name.ends_with('.')),
                None => host == pattern,
            }
        })
    };
    asked
        .iter()
        .filter(|host| !within(host))
        .map(|host| {
            format!(
                "policy.allowedIngressHosts lists {host:?}, outside the operator's ceiling ({})",
                listed(allowed)
            )
        })
        .collect()
}

/// Namespace label keys: from the ceiling's list, never Kubernetes' own prefixes.
fn labels_beyond(spec: &PreviewTemplateSpec, ceiling: &TemplateCeiling) -> Vec<String> {
    spec.namespace
        .labels
        .keys()
        .filter(|key| reserved_label(key) || !ceiling.namespace_labels.contains(key))
        .map(|key| {
            let why = if reserved_label(key) {
                "a Kubernetes key, which no template may set".to_string()
            } else {
                format!(
                    "beyond the operator's ceiling ({})",
                    listed(&ceiling.namespace_labels)
                )
            };
            format!("namespace.labels sets {key:?}, {why}")
        })
        .collect()
}

/// `kubernetes.io/…` and `k8s.io/…` keys, and those of their subdomains
/// (`pod-security.kubernetes.io/enforce`, `node.k8s.io/…`).
fn reserved_label(key: &str) -> bool {
    let Some((prefix, _)) = key.rsplit_once('/') else {
        return false;
    };
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|reserved| prefix_in_domain(prefix, reserved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewTemplate;

    fn spec(policy: serde_json::Value, namespace: serde_json::Value) -> PreviewTemplateSpec {
        let template: PreviewTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": "web", "namespace": "team"},
            "spec": {"forge": {"kind": "github", "repository": "org/web"},
                     "url": {"host": "{{ slug }}.preview.example.com"},
                     "manifests": {"inline": []}, "policy": policy, "namespace": namespace}
        }))
        .unwrap();
        template.spec
    }

    #[test]
    fn an_ordinary_template_is_within_the_default_ceiling() {
        let ordinary = spec(
            serde_json::json!({"ingressClassNames": ["nginx"], "podSecurity": "Restricted"}),
            serde_json::json!({"labels": {}}),
        );
        assert_eq!(
            beyond(&ordinary, &TemplateCeiling::default(), &[]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_example_templates_are_within_the_default_ceiling() {
        for (name, text) in [
            (
                "online-boutique",
                include_str!("../../templates/online-boutique/template.yaml"),
            ),
            (
                "web-chart",
                include_str!("../../templates/web-chart/template.yaml"),
            ),
            (
                "web-kustomize",
                include_str!("../../templates/web-kustomize/template.yaml"),
            ),
            (
                "web-postgres",
                include_str!("../../templates/web-postgres/template.yaml"),
            ),
        ] {
            let template: PreviewTemplate = serde_yaml_ng::from_str(text).unwrap();
            let found = beyond(&template.spec, &TemplateCeiling::default(), &[]);
            assert_eq!(found, Vec::<String>::new(), "{name}");
        }
    }

    #[test]
    fn every_field_that_widens_is_capped_and_named() {
        let wide = spec(
            serde_json::json!({
                "podSecurity": "Privileged", "allowedClusterRoles": ["previewd-environment", "view"],
                "allowedIngressHosts": ["shop.other-team.example.com", "status.preview.example.com"],
                "allowedServiceTypes": ["LoadBalancer"], "allowExternalIps": true,
                "allowNetworkPeersOutside": true, "allowedVolumeTypes": ["hostPath"],
                "allowExistingVolumes": true, "allowedCsiDrivers": ["nfs.csi.k8s.io"],
                "allowedPriorityClasses": ["system-node-critical"], "allowedRuntimeClasses": ["runc"],
                "allowedTolerationKeys": ["dedicated"], "allowMinAvailable": true,
                "allowedGateways": ["infra/public"], "allowedClusterIssuers": ["letsencrypt"],
                "allowedClusterSecretStores": ["vault"]
            }),
            serde_json::json!({
                "labels": {"team": "payments", "kubernetes.io/metadata.name": "kube-system",
                           "pod-security.kubernetes.io/enforce": "privileged"},
                "networkPolicy": {"defaultDeny": false},
                "resourceQuota": {"pods": "500", "limits.ephemeral-storage": "1Pi",
                                  "requests.cpu": "lots", "count/deployments.apps": "5"}
            }),
        );
        let own = ["previewd-environment".to_string()];
        let said = beyond(&wide, &TemplateCeiling::default(), &own).join("\n");
        for field in [
            "policy.podSecurity Privileged is below the operator's ceiling Baseline",
            "\"previewd-environment\", one of previewd's own ClusterRoles",
            "policy.allowedClusterRoles lists \"view\", beyond the operator's ceiling (none)",
            "policy.allowedIngressHosts lists \"shop.other-team.example.com\"",
            "policy.allowedServiceTypes",
            "policy.allowExternalIps",
            "policy.allowNetworkPeersOutside",
            "policy.allowedVolumeTypes",
            "policy.allowExistingVolumes",
            "policy.allowedCsiDrivers",
            "policy.allowedPriorityClasses",
            "policy.allowedRuntimeClasses",
            "policy.allowedTolerationKeys",
            "policy.allowMinAvailable",
            "policy.allowedGateways",
            "policy.allowedClusterIssuers",
            "policy.allowedClusterSecretStores",
            "namespace.labels sets \"team\", beyond the operator's ceiling (none)",
            "namespace.labels sets \"kubernetes.io/metadata.name\", a Kubernetes key",
            "\"pod-security.kubernetes.io/enforce\", a Kubernetes key",
            "namespace.networkPolicy turns the default deny off",
            "namespace.resourceQuota.pods asks for 500, beyond the operator's ceiling 50",
            "namespace.resourceQuota.limits.ephemeral-storage asks for 1Pi, beyond the operator's ceiling 40Gi",
            "namespace.resourceQuota.requests.cpu \"lots\" is no quantity previewd can compare",
        ] {
            assert!(said.contains(field), "{field} not in:\n{said}");
        }

        // An operator who allows it all still never lets a template bind previewd's own role
        // or set a Kubernetes label key.
        let open: TemplateCeiling = parse_ceiling(
            r#"{"podSecurity": "Privileged", "clusterRoles": ["previewd-environment", "view"],
                "ingressHosts": ["*.example.com"], "serviceTypes": ["LoadBalancer"],
                "externalIps": true, "networkPeersOutside": true, "volumeTypes": ["hostPath"],
                "existingVolumes": true, "csiDrivers": ["nfs.csi.k8s.io"],
                "priorityClasses": ["system-node-critical"], "runtimeClasses": ["runc"],
                "tolerationKeys": ["dedicated"], "minAvailable": true, "gateways": ["infra/public"],
                "clusterIssuers": ["letsencrypt"], "clusterSecretStores": ["vault"],
                "namespaceLabels": ["team", "kubernetes.io/metadata.name"], "networkPolicy": true,
                "resourceQuota": {"pods": "500", "limits.ephemeral-storage": "2Pi"}}"#,
        )
        .unwrap();
        let left = beyond(&wide, &open, &own);
        assert_eq!(left.len(), 4, "{left:#?}");
        assert!(left[0].contains("previewd's own ClusterRoles"), "{left:#?}");
        assert!(
            left[1..3].iter().all(|l| l.contains("a Kubernetes key")),
            "{left:#?}"
        );
        assert!(left[3].contains("\"lots\""), "{left:#?}");
    }

    #[test]
    fn extra_hosts_lie_under_the_operators_domains() {
        let ceiling = TemplateCeiling {
            ingress_hosts: vec!["*.preview.example.com".into(), "status.example.com".into()],
            ..Default::default()
        };
        let hosts = |list: &[&str]| {
            let policy = serde_json::json!({"allowedIngressHosts": list});
            beyond(&spec(policy, serde_json::json!({})), &ceiling, &[])
        };
        assert!(hosts(&["api.preview.example.com", "STATUS.example.com"]).is_empty());
        for outside in [
            "preview.example.com",
            "evilpreview.example.com",
            "example.com",
            "x.status.example.com",
        ] {
            assert_eq!(hosts(&[outside]).len(), 1, "{outside}");
        }
    }

    #[test]
    fn a_ceiling_with_an_unknown_field_is_refused_at_start() {
        let said = parse_ceiling(r#"{"podSecurty": "Privileged"}"#).unwrap_err();
        assert!(said.contains("podSecurty"), "{said}");
    }
}
