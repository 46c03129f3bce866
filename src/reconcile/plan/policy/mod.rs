//! The content policy (pure): what rendered objects may do beyond their own namespace, checked
//! after the guard (which decides kinds and namespaces) and before anything is applied.
//! Manifests come from templates and, with `manifests.repositoryPath`, from pull requests, so
//! the defaults are safe for untrusted code and every exception is named in the template's
//! `policy`:
//!
//! * pods meet the template's Pod Security Standard ([`pods`], `Baseline` by default);
//! * Services are `ClusterIP` without `externalIPs` (no node ports, load balancers or DNS
//!   aliases to elsewhere);
//! * host names are the environment's URL host or names in its domain (no claiming another
//!   team's host): an Ingress's rules and TLS hosts, a Gateway API route's `hostnames` (which
//!   may not be empty: that would take every host of the Gateway's listener), a cert-manager
//!   Certificate's `dnsNames` and `commonName` (a cluster issuer would otherwise sign another
//!   team's name);
//! * RoleBindings refer to Roles of the namespace and to subjects of the namespace (no
//!   `cluster-admin`, no other namespace's ServiceAccounts, no users or groups).
//!
//! One violation rejects the whole render, as the guard does; each names the object, the
//! field and the rule.

pub mod pods;

use serde_json::Value;

use super::guard::Violation;
use super::render::RenderedObject;
use crate::model::crd::PolicySpec;

/// Checks every object against `policy`; `namespace` is the environment's and `url_host` its
/// URL's host. Returns all violations (empty: everything may be applied).
pub fn check(
    objects: &[RenderedObject],
    policy: &PolicySpec,
    namespace: &str,
    url_host: &str,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for object in objects {
        let group = object.api_version().split_once('/').map(|(group, _)| group);
        let reasons = match (group, object.kind()) {
            (_, "Service") => service(&object.object, policy),
            (_, "Ingress") => ingress(&object.object, policy, url_host),
            (_, "RoleBinding") => role_binding(&object.object, policy, namespace),
            (Some("gateway.networking.k8s.io"), "HTTPRoute" | "GRPCRoute" | "TLSRoute") => {
                gateway_route(&object.object, policy, url_host)
            }
            (Some("cert-manager.io"), "Certificate") => {
                certificate(&object.object, policy, url_host)
            }
            (_, kind) => pods::pod_spec(kind, &object.object)
                .map(|(spec, path)| pods::check(spec, path, policy.pod_security))
                .unwrap_or_default(),
        };
        violations.extend(reasons.into_iter().map(|reason| Violation {
            manifest: object.manifest.clone(),
            kind: object.kind().to_string(),
            name: object.name().to_string(),
            reason,
        }));
    }
    violations
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
            "spec.externalIPs is set: not allowed unless the template's policy.allowExternalIPs is true".into(),
        );
    }
    broken
}

fn ingress(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let hosts = object["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| rule["host"].as_str().unwrap_or_default())
        .chain(
            object["spec"]["tls"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|tls| tls["hosts"].as_array().into_iter().flatten())
                .map(|host| host.as_str().unwrap_or_default()),
        );
    hosts_outside(hosts, policy, url_host)
}

fn gateway_route(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let hostnames = strings(&object["spec"]["hostnames"]);
    if hostnames.is_empty() {
        return vec![format!(
            "spec.hostnames is empty, so the route would take every host of its Gateway's listener: list the environment's host ({url_host:?})"
        )];
    }
    hosts_outside(hostnames.into_iter(), policy, url_host)
}

fn certificate(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let spec = &object["spec"];
    let names = strings(&spec["dnsNames"])
        .into_iter()
        .chain(spec["commonName"].as_str());
    hosts_outside(names, policy, url_host)
}

fn strings(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|entry| entry.as_str().unwrap_or_default())
        .collect()
}

/// A violation for each host outside the environment's domain.
fn hosts_outside<'a>(
    hosts: impl Iterator<Item = &'a str>,
    policy: &PolicySpec,
    url_host: &str,
) -> Vec<String> {
    hosts
        .filter(|host| !host_allowed(host, url_host, &policy.allowed_ingress_hosts))
        .map(|host| format!(
            "host {host:?} is outside the environment's domain (URL host {url_host:?}): list it in the template's policy.allowedIngressHosts"
        ))
        .collect()
}

/// Whether an Ingress may claim `host`: the URL host, a name below it, a name in the URL
/// host's parent domain when that domain has at least two labels (`x.preview.example.com`
/// for `pr-1.preview.example.com`, never all of `com`), or a host the template allows. An
/// empty host (every host) is never allowed.
fn host_allowed(host: &str, url_host: &str, allowed: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let url_host = url_host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || (host.contains('*') && !allowed.iter().any(|a| a == &host)) {
        return false;
    }
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(&host)) {
        return true;
    }
    if url_host.is_empty() {
        return false;
    }
    let below = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
    let parent = url_host
        .split_once('.')
        .map(|(_, parent)| parent)
        .filter(|parent| parent.contains('.'));
    below(&url_host) || parent.is_some_and(below)
}

fn role_binding(object: &Value, policy: &PolicySpec, namespace: &str) -> Vec<String> {
    let mut broken = Vec::new();
    let role = &object["roleRef"];
    let role_name = role["name"].as_str().unwrap_or_default();
    match role["kind"].as_str().unwrap_or_default() {
        "Role" => {}
        "ClusterRole" if policy.allowed_cluster_roles.iter().any(|r| r == role_name) => {}
        kind => broken.push(format!(
            "roleRef is {kind} {role_name:?}: only Roles of the namespace, or ClusterRoles the template's policy.allowedClusterRoles lists"
        )),
    }
    for (i, subject) in object["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let kind = subject["kind"].as_str().unwrap_or_default();
        let subject_namespace = subject["namespace"].as_str().unwrap_or(namespace);
        if kind != "ServiceAccount" || subject_namespace != namespace {
            broken.push(format!(
                "subjects[{i}] is {kind} {:?} in {subject_namespace:?}: only ServiceAccounts of the environment's namespace",
                subject["name"].as_str().unwrap_or_default()
            ));
        }
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
        check(
            &[object(value)],
            policy,
            "preview-x",
            "pr-1.preview.example.com",
        )
        .into_iter()
        .map(|v| v.to_string())
        .collect()
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
            stolen[0].contains("\"login.bank.com\" is outside"),
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
        // The same names in another group are not cert-manager's.
        let other = json!({"apiVersion": "example.com/v1", "kind": "Certificate",
            "metadata": {"name": "x"}, "spec": {"dnsNames": ["www.example.com"]}});
        assert!(reasons(other, &policy).is_empty());
    }

    #[test]
    fn ingress_hosts_stay_in_the_environments_domain() {
        let policy = PolicySpec::default();
        let ingress = |host: &str| {
            json!({"kind": "Ingress", "metadata": {"name": "web"},
                   "spec": {"rules": [{"host": host}], "tls": [{"hosts": [host]}]}})
        };
        for fine in [
            "pr-1.preview.example.com",
            "api.pr-1.preview.example.com",
            "api-pr-1.preview.example.com",
        ] {
            assert!(reasons(ingress(fine), &policy).is_empty(), "{fine}");
        }
        for hostile in [
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
        assert!(!host_allowed("evil.com", "example.com", &[]));
        assert!(host_allowed("a.example.com", "example.com", &[]));
    }

    #[test]
    fn role_bindings_stay_in_the_namespace() {
        let policy = PolicySpec::default();
        let binding = |role_kind: &str, role: &str, subject: Value| {
            json!({"kind": "RoleBinding", "metadata": {"name": "b"},
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
        let deployment = json!({"kind": "Deployment", "metadata": {"name": "web"},
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
