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
    let mut broken = match kind {
        "HTTPRoute" | "GRPCRoute" | "TLSRoute" => hosts::gateway_route(object, policy, url_host),
        _ => Vec::new(),
    };
    let spec = &object["spec"];
    for (i, parent) in list(&spec["parentRefs"]).enumerate() {
        let parent_namespace = parent["namespace"].as_str().unwrap_or(namespace);
        let name = parent["name"].as_str().unwrap_or_default();
        let named = format!("{parent_namespace}/{name}");
        if parent_namespace != namespace && !policy.allowed_gateways.contains(&named) {
            broken.push(format!(
                "spec.parentRefs[{i}] attaches to {named}, a Gateway of another namespace: only those the template's policy.allowedGateways lists"
            ));
        }
    }
    for (i, rule) in list(&spec["rules"]).enumerate() {
        for (j, backend) in list(&rule["backendRefs"]).enumerate() {
            if let Some(other) = backend["namespace"].as_str().filter(|n| *n != namespace) {
                broken.push(format!(
                    "spec.rules[{i}].backendRefs[{j}] sends traffic to namespace {other:?}: only Services of the environment's namespace"
                ));
            }
        }
    }
    broken
}

pub fn certificate(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let mut broken = hosts::certificate(object, policy, url_host);
    let spec = &object["spec"];
    let issuer = &spec["issuerRef"];
    let issuer_kind = issuer["kind"].as_str().unwrap_or("Issuer");
    let issuer_group = issuer["group"].as_str().unwrap_or("cert-manager.io");
    let issuer_name = issuer["name"].as_str().unwrap_or_default();
    let namespaced = issuer_kind == "Issuer" && issuer_group == "cert-manager.io";
    if !namespaced
        && !policy
            .allowed_cluster_issuers
            .iter()
            .any(|n| n == issuer_name)
    {
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
    stores
        .into_iter()
        .filter(|(_, store)| !store.is_null())
        .filter_map(|(at, store)| {
            let kind = store["kind"].as_str().unwrap_or("SecretStore");
            let name = store["name"].as_str().unwrap_or_default();
            let allowed = kind == "SecretStore"
                || policy
                    .allowed_cluster_secret_stores
                    .iter()
                    .any(|n| n == name);
            (!allowed).then(|| format!(
                "{at} is {kind} {name:?}, a store that reads secrets for every namespace: only those the template's policy.allowedClusterSecretStores lists"
            ))
        })
        .collect()
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
