//! The content policy (pure): what rendered objects may do beyond their own namespace, checked
//! after the guard (which decides kinds and namespaces) and before anything is applied.
//! Manifests come from templates and, with `manifests.repositoryPath`, from pull requests, so
//! the defaults are safe for untrusted code and every exception is named in the template's
//! `policy`:
//!
//! * every kind has rules in [`judge`]'s table, or the operator declared it inert; any other
//!   kind is refused;
//! * pods meet the template's Pod Security Standard ([`pods`], `Baseline` by default), mount
//!   only volume types the node does not fetch for them, and reach no other tenant's nodes or
//!   pods through scheduling fields ([`reach`]); no claim binds an existing volume ([`claims`]);
//! * Services are `ClusterIP` without `externalIPs` (no node ports, load balancers or DNS
//!   aliases to elsewhere);
//! * host names are the environment's URL host ([`hosts`]; no claiming another environment's
//!   or team's host): an Ingress's rules and TLS hosts, a Gateway API
//!   route's `hostnames` (which may not be empty: that would take every host of the Gateway's
//!   listener), a cert-manager Certificate's `dnsNames` and `commonName` (a cluster issuer
//!   would otherwise sign another team's name);
//! * annotations and labels that configure a controller other teams share (a DNS-named
//!   prefix) are refused unless built-in inert or the operator allows them ([`annotations`],
//!   [`labels`]), and previewd's own labels are previewd's alone;
//! * Ingresses carry no annotation the operator did not allow, no `defaultBackend`, and the
//!   class the template names ([`ingress`]);
//! * Roles grant only what the operator's role rules name ([`roles`]; by default reads of the
//!   application's kinds, Leases and Events), and RoleBindings refer to Roles of the namespace
//!   and to subjects of the namespace (no `cluster-admin`, no other namespace's
//!   ServiceAccounts, no users or groups);
//! * NetworkPolicies allow only peers of the namespace ([`network`]) unless the template says
//!   otherwise, and no object takes a name previewd uses (`previewd-…`);
//! * the custom kinds the chart suggests (Gateway API routes, cert-manager Certificates,
//!   ExternalSecrets) reach beyond the namespace only by references the template names
//!   ([`custom`]).
//!
//! One violation rejects the whole render, as the guard does; each names the object, the
//! field and the rule.

pub mod annotations;
pub mod claims;
#[cfg(test)]
mod corpus;
pub mod custom;
pub mod holding;
pub mod hosts;
pub mod ingress;
pub mod labels;
pub mod network;
pub mod pods;
pub mod reach;
pub mod roles;

use serde_json::Value;

use super::guard::Violation;
use super::render::RenderedObject;
use crate::model::crd::{PodSecurityLevel, PolicySpec};
use crate::model::grants::OperatorPolicy;
use crate::model::kinds::{TemplateKinds, group_of};
use crate::model::pod_kinds::pod_kind;

/// What an object is judged against besides the template's policy: where the environment
/// lives and what the operator allows every template.
pub struct Scope<'a> {
    /// The environment's namespace.
    pub namespace: &'a str,
    /// The environment's URL host.
    pub url_host: &'a str,
    pub operator: &'a OperatorPolicy,
    /// The kinds templates may create, with those the operator declared inert.
    pub kinds: &'a TemplateKinds,
}

/// Checks every object against `policy` (the template's) and `scope`. Returns all violations
/// (empty: everything may be applied).
pub fn check(objects: &[RenderedObject], policy: &PolicySpec, scope: &Scope) -> Vec<Violation> {
    let mut violations = overlapping_budgets(objects);
    violations.extend(holding::budgets_over_unscalable(objects));
    for object in objects {
        let mut reasons = reserved_name(object.name());
        reasons.extend(holding::finalizers(object.kind(), &object.object));
        reasons.extend(holding::owner_references(&object.object));
        reasons.extend(judge(object, policy, scope));
        reasons.extend(controller_metadata(object, scope));
        violations.extend(reasons.into_iter().map(|reason| Violation {
            manifest: object.manifest.clone(),
            kind: object.kind().to_string(),
            name: object.name().to_string(),
            reason,
        }));
    }
    violations
}

/// Annotations and labels that configure a shared controller, on every metadata that becomes
/// an object's. An Ingress's annotations all configure one: [`ingress`] has their own list.
fn controller_metadata(object: &RenderedObject, scope: &Scope) -> Vec<String> {
    let group = group_of(object.api_version());
    let ingress = object.kind() == "Ingress" && matches!(group, "networking.k8s.io" | "extensions");
    let operator = scope.operator;
    let mut reasons = Vec::new();
    for (metadata, place) in annotations::metadata_of(&object.object) {
        if !ingress {
            reasons.extend(annotations::check(
                metadata,
                &place,
                &operator.object_annotations,
            ));
        }
        reasons.extend(labels::check(metadata, place, &operator.object_labels));
    }
    reasons
}

/// The table of kinds: every kind a template may create has its rules here, or is declared
/// inert by the operator; any other kind is refused, since nothing says what it may reach.
fn judge(object: &RenderedObject, policy: &PolicySpec, scope: &Scope) -> Vec<String> {
    let value = &object.object;
    let (namespace, url_host) = (scope.namespace, scope.url_host);
    match (group_of(object.api_version()), object.kind()) {
        ("", "ConfigMap" | "ServiceAccount") | ("autoscaling", "HorizontalPodAutoscaler") => {
            Vec::new()
        }
        ("", "Secret") => secret(value),
        ("", "Service") => service(value, policy),
        ("", "PersistentVolumeClaim") => claims::claim(&value["spec"], "spec", policy),
        ("policy", "PodDisruptionBudget") => disruption_budget(value, policy),
        ("networking.k8s.io" | "extensions", "Ingress") => {
            ingress::ingress(value, policy, &scope.operator.ingress_annotations, url_host)
        }
        ("networking.k8s.io", "NetworkPolicy") => network::network_policy(value, policy),
        ("rbac.authorization.k8s.io", "Role") => roles::role(value, &scope.operator.role_grants),
        ("rbac.authorization.k8s.io", "RoleBinding") => {
            roles::role_binding(value, policy, namespace)
        }
        (
            "gateway.networking.k8s.io",
            "HTTPRoute" | "GRPCRoute" | "TLSRoute" | "TCPRoute" | "UDPRoute",
        ) => custom::gateway_route(value, policy, namespace, url_host),
        ("cert-manager.io", "Certificate") => custom::certificate(value, policy, url_host),
        ("external-secrets.io", "ExternalSecret") => custom::external_secret(value, policy),
        ("apps", "DaemonSet") => vec![
            "a DaemonSet runs a pod on every node of the cluster, other teams' included: use a Deployment".into(),
        ],
        (group, kind) if pod_kind(group, kind).is_some() => {
            let max_grace = scope.operator.max_grace_seconds();
            pod_template(kind, value, policy, max_grace)
        }
        (group, kind) if scope.kinds.is_inert(group, kind) => Vec::new(),
        (group, kind) => vec![format!(
            "previewd has no content policy for kind {kind} of group {group:?}, so it cannot tell what such an object reaches beyond the namespace: the operator may declare the kind inert (inert: true in its templateKinds entry) if it reaches nothing"
        )],
    }
}

/// A pod template's Pod Security Standard and what it reaches beyond it ([`reach`]); nothing
/// for an object without one, or at `Privileged`.
fn pod_template(kind: &str, object: &Value, policy: &PolicySpec, max_grace: u64) -> Vec<String> {
    let Some((metadata, spec, path)) = pods::pod_template(kind, object) else {
        // Nothing to judge is nothing to apply: previewd cannot say what it would run.
        return vec![
            "has no pod template previewd can read (the pod spec is missing or not an object)"
                .into(),
        ];
    };
    if !(metadata.is_null() || metadata.is_object()) {
        return vec!["the pod template's metadata is not an object".into()];
    }
    let mut broken = pods::check(spec, path, policy.pod_security);
    broken.extend(holding::grace_period(spec, path, max_grace));
    if policy.pod_security != PodSecurityLevel::Privileged {
        broken.extend(reach::check(metadata, spec, path, policy));
    }
    broken.extend(claims::embedded(object, spec, path, policy));
    broken
}

/// The prefix of the names previewd gives its own objects in an environment namespace (its
/// guard rails and its access binding): a template object of the same name would replace one.
pub const RESERVED_PREFIX: &str = "previewd-";

fn reserved_name(name: &str) -> Vec<String> {
    if name.starts_with(RESERVED_PREFIX) {
        vec![format!(
            "names starting with {RESERVED_PREFIX:?} are previewd's own (its guard rails and access binding): rename it"
        )]
    } else {
        Vec::new()
    }
}

/// A Secret of type `kubernetes.io/service-account-token` is filled by Kubernetes with a
/// long-lived token of the ServiceAccount it names.
fn secret(object: &Value) -> Vec<String> {
    if object["type"] == "kubernetes.io/service-account-token" {
        vec!["type is kubernetes.io/service-account-token, which asks Kubernetes for a ServiceAccount's long-lived token: pods get their own tokens mounted".into()]
    } else {
        Vec::new()
    }
}

/// Two budgets over one pod make the eviction API refuse every eviction of it ("more than one
/// PodDisruptionBudget"), which blocks node drains like a budget of zero. Budgets whose
/// selectors could match one pod (their `matchLabels` agree wherever both set a key, or either
/// has `matchExpressions`, which this check does not solve) are refused together.
fn overlapping_budgets(objects: &[RenderedObject]) -> Vec<Violation> {
    let budgets: Vec<&RenderedObject> = objects
        .iter()
        .filter(|o| group_of(o.api_version()) == "policy" && o.kind() == "PodDisruptionBudget")
        .collect();
    let mut violations = Vec::new();
    for (i, budget) in budgets.iter().enumerate() {
        let other = budgets
            .iter()
            .enumerate()
            .find(|(j, other)| *j != i && may_overlap(&budget.object, &other.object));
        if let Some((_, other)) = other {
            violations.push(Violation {
                manifest: budget.manifest.clone(),
                kind: budget.kind().to_string(),
                name: budget.name().to_string(),
                reason: format!(
                    "spec.selector may match the same pods as PodDisruptionBudget {:?}, and two budgets over one pod block its eviction, and so node drains: give them disjoint matchLabels",
                    other.name()
                ),
            });
        }
    }
    violations
}

fn may_overlap(a: &Value, b: &Value) -> bool {
    let (a, b) = (&a["spec"]["selector"], &b["spec"]["selector"]);
    if !a["matchExpressions"].is_null() || !b["matchExpressions"].is_null() {
        return true;
    }
    let empty = serde_json::Map::new();
    let labels_a = a["matchLabels"].as_object().unwrap_or(&empty);
    let labels_b = b["matchLabels"].as_object().unwrap_or(&empty);
    labels_a
        .iter()
        .all(|(key, value)| labels_b.get(key).is_none_or(|other| other == value))
}

/// A budget that allows no disruption keeps the cluster's operators from draining the nodes
/// its pods run on (every team's nodes): `maxUnavailable` must allow one, and `minAvailable`
/// (which previewd cannot compare with a replica count) only as the template allows.
fn disruption_budget(object: &Value, policy: &PolicySpec) -> Vec<String> {
    let spec = &object["spec"];
    let mut broken = Vec::new();
    if !spec["minAvailable"].is_null() && !policy.allow_min_available {
        broken.push("spec.minAvailable may keep every pod from eviction and so block node drains for every team: use maxUnavailable, or set the template's policy.allowMinAvailable".into());
    }
    let none_unavailable = match &spec["maxUnavailable"] {
        Value::Number(n) => n.as_i64() == Some(0),
        Value::String(text) => text.trim_end_matches('%').trim().parse::<f64>().ok() == Some(0.0),
        _ => false,
    };
    if none_unavailable {
        broken.push("spec.maxUnavailable is 0, which blocks every node drain for every team: allow at least one".into());
    }
    broken
}

fn service(object: &Value, policy: &PolicySpec) -> Vec<String> {
    let mut broken = Vec::new();
    let kind = object["spec"]["type"].as_str().unwrap_or("ClusterIP");
    if kind != "ClusterIP" && !policy.allowed_service_types.iter().any(|t| t == kind) {
        broken.push(format!(
            "spec.type is {kind}: only ClusterIP unless the template's policy.allowedServiceTypes lists it"
        ));
    }
    let external = object["spec"]["externalIPs"]
        .as_array()
        .is_some_and(|ips| !ips.is_empty());
    if external && !policy.allow_external_ips {
        broken.push(
            "spec.externalIPs is set: not allowed unless the template's policy.allowExternalIps is true".into(),
        );
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> RenderedObject {
        RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object: value,
        }
    }

    fn reasons(value: Value, policy: &PolicySpec) -> Vec<String> {
        let scope = Scope {
            namespace: "preview-x",
            url_host: "pr-1.preview.example.com",
            operator: &OperatorPolicy::default(),
            kinds: &TemplateKinds::default(),
        };
        check(&[object(value)], policy, &scope)
            .into_iter()
            .map(|v| v.to_string())
            .collect()
    }

    #[test]
    fn names_of_previewds_own_prefix_are_refused() {
        // The reconciler's own objects' names begin with RESERVED_PREFIX (checked beside them,
        // in reconcile/namespace.rs): a render must not replace its guard rails.
        let replacement = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "previewd-default-deny"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}});
        let found = reasons(replacement, &PolicySpec::default());
        assert!(found[0].contains("are previewd's own"), "{found:?}");
        let ordinary = json!({"kind": "ConfigMap", "metadata": {"name": "web-previewd-config"}});
        assert!(reasons(ordinary, &PolicySpec::default()).is_empty());
    }

    #[test]
    fn a_kind_without_a_policy_is_refused_unless_the_operator_declares_it_inert() {
        let widget =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
        let found = reasons(widget.clone(), &PolicySpec::default());
        assert!(
            found[0].contains("no content policy for kind Widget"),
            "{found:?}"
        );
        let kinds = TemplateKinds::parse(
            r#"[{"group": "example.com", "kind": "Widget", "resource": "widgets", "inert": true}]"#,
        )
        .unwrap();
        let scope = Scope {
            namespace: "preview-x",
            url_host: "pr-1.preview.example.com",
            operator: &OperatorPolicy::default(),
            kinds: &kinds,
        };
        assert!(check(&[object(widget)], &PolicySpec::default(), &scope).is_empty());
        let daemon = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": []}}}});
        assert!(reasons(daemon, &PolicySpec::default())[0].contains("every node"));
    }

    #[test]
    fn budgets_over_the_same_pods_are_refused_together() {
        let budget = |name: &str, labels: Value| {
            object(
                json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
                          "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}),
            )
        };
        let scope = Scope {
            namespace: "preview-x",
            url_host: "pr-1.preview.example.com",
            operator: &OperatorPolicy::default(),
            kinds: &TemplateKinds::default(),
        };
        let disjoint = [
            budget("web", json!({"app": "web"})),
            budget("db", json!({"app": "db"})),
        ];
        assert!(check(&disjoint, &PolicySpec::default(), &scope).is_empty());
        let overlapping = [
            budget("web", json!({"app": "web"})),
            budget("all", json!({})),
        ];
        let found = check(&overlapping, &PolicySpec::default(), &scope);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0]
                .to_string()
                .contains("may match the same pods as PodDisruptionBudget \"all\"")
        );
    }

    #[test]
    fn budgets_that_block_node_drains_and_token_secrets_are_refused() {
        let budget = |spec: Value| json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "b"}, "spec": spec});
        assert!(reasons(budget(json!({"maxUnavailable": 1})), &PolicySpec::default()).is_empty());
        for blocking in [
            json!({"maxUnavailable": 0}),
            json!({"maxUnavailable": "0%"}),
            json!({"minAvailable": 1}),
        ] {
            assert_eq!(
                reasons(budget(blocking.clone()), &PolicySpec::default()).len(),
                1,
                "{blocking}"
            );
        }
        let allowing = PolicySpec {
            allow_min_available: true,
            ..Default::default()
        };
        assert!(reasons(budget(json!({"minAvailable": 1})), &allowing).is_empty());
        let token = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t",
            "annotations": {"kubernetes.io/service-account.name": "default"}}, "type": "kubernetes.io/service-account-token"});
        assert!(reasons(token, &PolicySpec::default())[0].contains("long-lived token"));
        let opaque = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "b"}});
        assert!(reasons(opaque, &PolicySpec::default()).is_empty());
    }

    #[test]
    fn a_claim_binds_no_existing_volume_unless_allowed() {
        let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
            "spec": {"volumeName": "team-b-database", "accessModes": ["ReadWriteOnce"]}});
        let found = reasons(claim.clone(), &PolicySpec::default());
        assert!(
            found[0].contains("spec.volumeName binds an existing PersistentVolume"),
            "{found:?}"
        );
        let allowing = PolicySpec {
            allow_existing_volumes: true,
            ..Default::default()
        };
        assert!(reasons(claim, &allowing).is_empty());
        let provisioned = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"]}});
        assert!(reasons(provisioned, &PolicySpec::default()).is_empty());
    }

    #[test]
    fn replication_controllers_pods_are_checked_too() {
        let controller = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "old"},
            "spec": {"template": {"spec": {"volumes": [{"name": "v", "nfs": {"server": "10.0.0.1", "path": "/"}}],
                                           "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true}}]}}}});
        let found = reasons(controller, &PolicySpec::default());
        assert_eq!(found.len(), 2, "{found:?}");
    }

    #[test]
    fn services_stay_inside_the_cluster_unless_allowed() {
        let policy = PolicySpec::default();
        let plain = json!({"kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
        assert!(reasons(plain, &policy).is_empty());
        for kind in ["NodePort", "LoadBalancer", "ExternalName"] {
            let exposed =
                json!({"kind": "Service", "metadata": {"name": "web"}, "spec": {"type": kind}});
            let found = reasons(exposed.clone(), &policy);
            assert!(
                found[0].contains(&format!("spec.type is {kind}")),
                "{found:?}"
            );
            let allowing = PolicySpec {
                allowed_service_types: vec![kind.into()],
                ..Default::default()
            };
            assert!(reasons(exposed, &allowing).is_empty());
        }
        let external = json!({"kind": "Service", "metadata": {"name": "web"}, "spec": {"externalIPs": ["1.2.3.4"]}});
        assert!(
            reasons(external, &policy)[0].contains("Service/web (from app.yaml): spec.externalIPs")
        );
    }

    #[test]
    fn gateway_routes_and_certificates_stay_in_the_environments_domain() {
        let policy = PolicySpec::default();
        let route = |hostnames: Value| {
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                   "metadata": {"name": "web"}, "spec": {"hostnames": hostnames}})
        };
        assert!(reasons(route(json!(["pr-1.preview.example.com"])), &policy).is_empty());
        let stolen = reasons(
            route(json!(["pr-1.preview.example.com", "login.bank.com"])),
            &policy,
        );
        assert_eq!(stolen.len(), 1, "{stolen:?}");
        assert!(
            stolen[0].contains("\"login.bank.com\" is not the environment's URL host"),
            "{stolen:?}"
        );
        let everything = reasons(route(json!([])), &policy);
        assert!(
            everything[0].contains("spec.hostnames is empty"),
            "{everything:?}"
        );
        let certificate = |names: Value, common: &str| {
            json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                   "metadata": {"name": "web-tls"},
                   "spec": {"dnsNames": names, "commonName": common, "secretName": "web-tls"}})
        };
        let own = certificate(
            json!(["pr-1.preview.example.com"]),
            "pr-1.preview.example.com",
        );
        assert!(reasons(own, &policy).is_empty());
        let theirs = certificate(
            json!(["pr-1.preview.example.com", "www.example.com"]),
            "example.com",
        );
        assert_eq!(reasons(theirs, &policy).len(), 2, "dnsNames and commonName");
        // The same kind in another group is not cert-manager's: it has no rules, so it is
        // refused as such, not judged by cert-manager's.
        let other = json!({"apiVersion": "example.com/v1", "kind": "Certificate",
            "metadata": {"name": "x"}, "spec": {"dnsNames": ["www.example.com"]}});
        let found = reasons(other, &policy);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("no content policy for kind Certificate"),
            "{found:?}"
        );
    }

    #[test]
    fn ingress_hosts_stay_in_the_environments_domain() {
        let policy = PolicySpec::default();
        let ingress = |host: &str| {
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"},
                   "spec": {"rules": [{"host": host}], "tls": [{"hosts": [host]}]}})
        };
        assert!(reasons(ingress("pr-1.preview.example.com"), &policy).is_empty());
        for hostile in [
            "api.pr-1.preview.example.com",
            "api-pr-1.preview.example.com",
            "pr-2.preview.example.com",
            "www.example.com",
            "example.com",
            "login.bank.com",
            "",
            "*.preview.example.com",
        ] {
            assert_eq!(
                reasons(ingress(hostile), &policy).len(),
                2,
                "{hostile:?}: rule and tls"
            );
        }
        let allowing = PolicySpec {
            allowed_ingress_hosts: vec!["demo.example.com".into()],
            ..Default::default()
        };
        assert!(reasons(ingress("demo.example.com"), &allowing).is_empty());
        // A URL host of two labels does not open its whole top-level domain.
        assert!(!hosts::host_allowed("evil.com", "example.com", &[]));
        assert!(!hosts::host_allowed("a.example.com", "example.com", &[]));
    }

    #[test]
    fn role_bindings_stay_in_the_namespace() {
        let policy = PolicySpec::default();
        let binding = |role_kind: &str, role: &str, subject: Value| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "b"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                   "subjects": [subject]})
        };
        let own = json!({"kind": "ServiceAccount", "name": "app"});
        assert!(reasons(binding("Role", "reader", own.clone()), &policy).is_empty());
        let admin = reasons(
            binding("ClusterRole", "cluster-admin", own.clone()),
            &policy,
        );
        assert!(
            admin[0].contains("roleRef is ClusterRole \"cluster-admin\""),
            "{admin:?}"
        );
        let elsewhere =
            json!({"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"});
        assert_eq!(
            reasons(binding("Role", "reader", elsewhere), &policy).len(),
            1
        );
        let user = json!({"kind": "User", "name": "alice"});
        assert_eq!(reasons(binding("Role", "reader", user), &policy).len(), 1);
        let allowing = PolicySpec {
            allowed_cluster_roles: vec!["view".into()],
            ..Default::default()
        };
        assert!(reasons(binding("ClusterRole", "view", own), &allowing).is_empty());
    }

    #[test]
    fn pods_in_workloads_are_checked_at_the_templates_level() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"template": {"spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "x"}]}}}});
        let found = reasons(deployment.clone(), &PolicySpec::default());
        assert!(
            found[0].contains("Deployment/web (from app.yaml): spec.template.spec.hostNetwork"),
            "{found:?}"
        );
        let privileged = PolicySpec {
            pod_security: crate::model::crd::PodSecurityLevel::Privileged,
            ..Default::default()
        };
        assert!(reasons(deployment, &privileged).is_empty());
    }
}
