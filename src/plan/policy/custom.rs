//! Policies for the custom kinds the chart suggests operators allow (pure): each reaches beyond
//! the namespace through a reference to something cluster-wide or in another namespace, and
//! only those references the template names are allowed.
//!
//! * Gateway API routes attach to Gateways (`parentRefs`) and send traffic to Services
//!   (`backendRefs`): a Gateway of another namespace only as `policy.allowedGateways` names it
//!   (`namespace/name`), backends only in the environment's namespace; their host names are
//!   checked in [`super::hosts`].
//! * cert-manager Certificates are signed by an issuer: a ClusterIssuer (or an external
//!   issuer kind) only as `policy.allowedClusterIssuers` names it; never a CA certificate, and
//!   no identity but the environment's host names (no URIs, e-mail addresses or IP addresses).
//! * external-secrets ExternalSecrets read from a store: a ClusterSecretStore (which reads
//!   secrets for every namespace) only as `policy.allowedClusterSecretStores` names it.

use serde_json::Value;

use super::hosts;
use crate::model::crd::PolicySpec;

pub fn gateway_route(
    object: &Value,
    policy: &PolicySpec,
    namespace: &str,
    url_host: &str,
) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    // TCP and UDP routes have no host names: attached to a shared Gateway, one takes the
    // listener's whole port.
    let by_host = matches!(kind, "HTTPRoute" | "GRPCRoute" | "TLSRoute");
    let mut broken = match by_host {
        true => hosts::route_hostnames(object, policy, url_host),
        false => Vec::new(),
    };
    let spec = &object["spec"];
    for (i, parent) in list(&spec["parentRefs"]).enumerate() {
        broken.extend(parent_refusal(parent, i, by_host, policy, namespace));
    }
    for (i, rule) in list(&spec["rules"]).enumerate() {
        let backends = list(&rule["backendRefs"])
            .enumerate()
            .map(|(j, b)| (format!("backendRefs[{j}]"), b));
        // A mirror filter sends a copy of the traffic elsewhere: the same rule as a backend.
        let mirrors = list(&rule["filters"])
            .enumerate()
            .map(|(j, f)| {
                (
                    format!("filters[{j}].requestMirror.backendRef"),
                    &f["requestMirror"]["backendRef"],
                )
            })
            .filter(|(_, backend)| !backend.is_null());
        for (at, backend) in backends.chain(mirrors) {
            if let Some(other) = backend["namespace"].as_str().filter(|n| *n != namespace) {
                broken.push(format!(
                    "spec.rules[{i}].{at} sends traffic to namespace {other:?}: only Services of the environment's namespace"
                ));
            }
            if !matches!(backend["kind"].as_str(), None | Some("Service")) {
                broken.push(format!(
                    "spec.rules[{i}].{at} is a {}, not a Service: only Services of the environment's namespace",
                    backend["kind"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    broken
}

/// Why a route may not attach to `parent`: a Gateway of another namespace the template does
/// not name, anything but a Gateway (a Service as parent routes the mesh's traffic to it,
/// GAMMA), or, for a TCP or UDP route, any Gateway outside the namespace.
fn parent_refusal(
    parent: &Value,
    i: usize,
    by_host: bool,
    policy: &PolicySpec,
    namespace: &str,
) -> Option<String> {
    let kind = parent["kind"].as_str().unwrap_or("Gateway");
    let group = parent["group"]
        .as_str()
        .unwrap_or("gateway.networking.k8s.io");
    if kind != "Gateway" || group != "gateway.networking.k8s.io" {
        return Some(format!(
            "spec.parentRefs[{i}] is a {kind} ({group}), not a Gateway: routes attach to Gateways only"
        ));
    }
    let parent_namespace = parent["namespace"].as_str().unwrap_or(namespace);
    let named = format!(
        "{parent_namespace}/{}",
        parent["name"].as_str().unwrap_or_default()
    );
    if parent_namespace == namespace {
        None
    } else if !by_host {
        Some(format!(
            "spec.parentRefs[{i}] attaches a TCP or UDP route to {named}, a Gateway of another namespace: without host names it would take the listener's whole port"
        ))
    } else if !policy.allowed_gateways.contains(&named) {
        Some(format!(
            "spec.parentRefs[{i}] attaches to {named}, a Gateway of another namespace: only those the template's policy.allowedGateways lists"
        ))
    } else {
        None
    }
}

/// The fields of a cert-manager Certificate's spec this check knows; any other is refused
/// (`literalSubject`, say, names a subject without `dnsNames` or `commonName`).
const CERTIFICATE_FIELDS: &[&str] = &[
    "secretName",
    "secretTemplate",
    "dnsNames",
    "commonName",
    "issuerRef",
    "duration",
    "renewBefore",
    "revisionHistoryLimit",
    "privateKey",
    "usages",
    "isCA",
    "subject",
    "uris",
    "emailAddresses",
    "ipAddresses",
    "otherNames",
    "encodeUsagesInRequest",
    "keystores",
    "additionalOutputFormats",
];

pub fn certificate(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let mut broken = hosts::certificate_names(object, policy, url_host);
    let spec = &object["spec"];
    for field in spec
        .as_object()
        .into_iter()
        .flat_map(|fields| fields.keys())
        .filter(|field| !CERTIFICATE_FIELDS.contains(&field.as_str()))
    {
        broken.push(format!(
            "spec.{field} is not a field this check knows; refused"
        ));
    }
    let issuer = &spec["issuerRef"];
    let issuer_kind = issuer["kind"].as_str().unwrap_or("Issuer");
    let issuer_group = issuer["group"].as_str().unwrap_or("cert-manager.io");
    let issuer_name = issuer["name"].as_str().unwrap_or_default();
    let namespaced = issuer_kind == "Issuer" && issuer_group == "cert-manager.io";
    // Listed by name, for cert-manager's own ClusterIssuer kind only: an external issuer kind
    // of the same name is another issuer.
    let listed = issuer_kind == "ClusterIssuer"
        && issuer_group == "cert-manager.io"
        && policy
            .allowed_cluster_issuers
            .iter()
            .any(|n| n == issuer_name);
    if !namespaced && !listed {
        broken.push(format!(
            "spec.issuerRef is {issuer_kind} {issuer_name:?} ({issuer_group}), an issuer beyond the namespace: only those the template's policy.allowedClusterIssuers lists"
        ));
    }
    if spec["isCA"].as_bool() == Some(true) {
        broken.push("spec.isCA is true: a preview may not hold a CA certificate".into());
    }
    for field in ["uris", "emailAddresses", "ipAddresses", "otherNames"] {
        if spec[field]
            .as_array()
            .is_some_and(|names| !names.is_empty())
        {
            broken.push(format!(
                "spec.{field} claims an identity beyond the environment's host names"
            ));
        }
    }
    broken
}

pub fn external_secret(object: &Value, policy: &PolicySpec) -> Vec<String> {
    let spec = &object["spec"];
    let mut stores = vec![("spec.secretStoreRef".to_string(), &spec["secretStoreRef"])];
    for (field, entries) in [("data", &spec["data"]), ("dataFrom", &spec["dataFrom"])] {
        for (i, entry) in list(entries).enumerate() {
            stores.push((
                format!("spec.{field}[{i}].sourceRef.storeRef"),
                &entry["sourceRef"]["storeRef"],
            ));
        }
    }
    let mut broken: Vec<String> = stores
        .into_iter()
        .filter(|(_, store)| !store.is_null())
        .filter_map(|(at, store)| {
            let kind = store["kind"].as_str().unwrap_or("SecretStore");
            let name = store["name"].as_str().unwrap_or_default();
            let allowed = kind == "SecretStore"
                || (kind == "ClusterSecretStore"
                    && policy
                        .allowed_cluster_secret_stores
                        .iter()
                        .any(|n| n == name));
            (!allowed).then(|| format!(
                "{at} is {kind} {name:?}, a store that reads secrets beyond the namespace: only SecretStores, or the ClusterSecretStores the template's policy.allowedClusterSecretStores lists"
            ))
        })
        .collect();
    // Generators (passwords, registry tokens, cloud credentials) may be cluster-wide too.
    for (field, entries) in [("data", &spec["data"]), ("dataFrom", &spec["dataFrom"])] {
        for (i, entry) in list(entries).enumerate() {
            if !entry["sourceRef"]["generatorRef"].is_null() {
                broken.push(format!(
                    "spec.{field}[{i}].sourceRef.generatorRef asks a generator for secrets: not for previews"
                ));
            }
        }
    }
    broken
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NAMESPACE: &str = "preview-x";
    const HOST: &str = "pr-1.preview.example.com";

    #[test]
    fn a_route_attaches_only_to_gateways_the_template_names() {
        let route = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "web"},
            "spec": {"parentRefs": [{"name": "previews", "namespace": "gateway-system"}, {"name": "internal", "namespace": "payments"}],
                     "hostnames": [HOST],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}, {"name": "db", "namespace": "payments", "port": 5432}]}]}});
        let policy = PolicySpec {
            allowed_gateways: vec!["gateway-system/previews".into()],
            ..Default::default()
        };
        let found = gateway_route(&route, &policy, NAMESPACE, HOST);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("spec.parentRefs[1] attaches to payments/internal"));
        assert!(
            found[1]
                .contains("spec.rules[0].backendRefs[1] sends traffic to namespace \"payments\"")
        );
        let own = json!({"kind": "TCPRoute", "spec": {"parentRefs": [{"name": "local"}], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}});
        assert!(gateway_route(&own, &PolicySpec::default(), NAMESPACE, HOST).is_empty());
    }

    #[test]
    fn routes_attach_to_gateways_only_and_l4_routes_stay_home() {
        let route = |kind: &str, spec: Value| json!({"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": kind, "metadata": {"name": "r"}, "spec": spec});
        let policy = PolicySpec {
            allowed_gateways: vec!["gateway-system/previews".into()],
            ..Default::default()
        };
        let mesh = route(
            "HTTPRoute",
            json!({"hostnames": [HOST], "parentRefs": [{"group": "", "kind": "Service", "name": "payments-api", "namespace": "payments"}]}),
        );
        assert!(gateway_route(&mesh, &policy, NAMESPACE, HOST)[0].contains("not a Gateway"));
        let tcp = route(
            "TCPRoute",
            json!({"parentRefs": [{"name": "previews", "namespace": "gateway-system"}], "rules": [{"backendRefs": [{"name": "db", "port": 5432}]}]}),
        );
        assert!(
            gateway_route(&tcp, &policy, NAMESPACE, HOST)[0]
                .contains("take the listener's whole port")
        );
        let mirror = route(
            "HTTPRoute",
            json!({"hostnames": [HOST], "parentRefs": [{"name": "local"}],
            "rules": [{"filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "sink", "namespace": "attacker", "port": 80}}}],
                       "backendRefs": [{"name": "bucket", "kind": "Bucket", "group": "storage.example.com"}]}]}),
        );
        let found = gateway_route(&mirror, &policy, NAMESPACE, HOST);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found.iter().any(|f| f.contains(
                "filters[0].requestMirror.backendRef sends traffic to namespace \"attacker\""
            )),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.contains("backendRefs[0] is a Bucket")),
            "{found:?}"
        );
    }

    #[test]
    fn a_certificate_names_no_subject_beyond_its_fields_and_issuers_are_matched_by_kind() {
        let literal = json!({"spec": {"literalSubject": "CN=login.bank.com", "issuerRef": {"name": "local"}}});
        assert!(
            certificate(&literal, &PolicySpec::default(), HOST)[0].contains("spec.literalSubject")
        );
        let policy = PolicySpec {
            allowed_cluster_issuers: vec!["letsencrypt".into()],
            ..Default::default()
        };
        let external = json!({"spec": {"dnsNames": [HOST], "issuerRef": {"name": "letsencrypt", "kind": "AWSPCAClusterIssuer", "group": "awspca.cert-manager.io"}}});
        assert_eq!(
            certificate(&external, &policy, HOST).len(),
            1,
            "same name, another issuer"
        );
    }

    #[test]
    fn a_generator_is_refused() {
        let generated = json!({"spec": {"dataFrom": [{"sourceRef": {"generatorRef": {"apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "ClusterGenerator", "name": "ecr"}}}]}});
        assert!(external_secret(&generated, &PolicySpec::default())[0].contains("generatorRef"));
    }

    #[test]
    fn a_certificate_is_the_environments_and_signed_by_a_named_issuer() {
        let certificate_of = |spec: Value| json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "tls"}, "spec": spec});
        let own = certificate_of(
            json!({"dnsNames": [HOST], "issuerRef": {"name": "local", "kind": "Issuer"}, "secretName": "tls"}),
        );
        assert!(certificate(&own, &PolicySpec::default(), HOST).is_empty());
        let hostile = certificate_of(
            json!({"dnsNames": [HOST], "isCA": true, "uris": ["spiffe://cluster/ns/kube-system/sa/admin"],
            "issuerRef": {"name": "corporate-ca", "kind": "ClusterIssuer"}}),
        );
        let found = certificate(&hostile, &PolicySpec::default(), HOST);
        assert_eq!(found.len(), 3, "{found:?}");
        let allowing = PolicySpec {
            allowed_cluster_issuers: vec!["letsencrypt".into()],
            ..Default::default()
        };
        let public = certificate_of(
            json!({"dnsNames": [HOST], "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer"}}),
        );
        assert!(certificate(&public, &allowing, HOST).is_empty());
    }

    #[test]
    fn an_external_secret_reads_only_from_stores_the_template_names() {
        let secret = json!({"apiVersion": "external-secrets.io/v1beta1", "kind": "ExternalSecret", "metadata": {"name": "db"},
            "spec": {"secretStoreRef": {"name": "vault", "kind": "ClusterSecretStore"},
                     "dataFrom": [{"extract": {"key": "prod/db"}, "sourceRef": {"storeRef": {"name": "aws", "kind": "ClusterSecretStore"}}}]}});
        let found = external_secret(&secret, &PolicySpec::default());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[1].contains("spec.dataFrom[0].sourceRef.storeRef is ClusterSecretStore \"aws\"")
        );
        let allowing = PolicySpec {
            allowed_cluster_secret_stores: vec!["vault".into(), "aws".into()],
            ..Default::default()
        };
        assert!(external_secret(&secret, &allowing).is_empty());
        let own = json!({"spec": {"secretStoreRef": {"name": "local", "kind": "SecretStore"}}});
        assert!(external_secret(&own, &PolicySpec::default()).is_empty());
    }
}
