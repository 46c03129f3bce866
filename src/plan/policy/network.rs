//! NetworkPolicies (pure): what a template may open.
//!
//! NetworkPolicies add up: one template policy that allows a peer reopens what the guard
//! rail's default-deny closed, for the pods it selects. So a template NetworkPolicy may allow
//! only peers inside the environment (a `podSelector` without a `namespaceSelector`), unless the
//! template's `policy.allowNetworkPeersOutside` says otherwise; an `ipBlock`, another namespace,
//! or a rule with no peers at all (which Kubernetes reads as "every peer") is refused. Fields
//! this check does not know are refused too: a newer API's field might widen a rule.

use serde_json::{Map, Value};

use crate::model::crd::PolicySpec;

const SPEC_FIELDS: &[&str] = &["podSelector", "policyTypes", "ingress", "egress"];
const HOW_TO_ALLOW: &str = "template NetworkPolicies may allow only pods of the environment's namespace unless the template's policy.allowNetworkPeersOutside is true (a chart's own NetworkPolicies can instead be turned off in its values: previewd's guard rail already isolates the environment)";

pub fn network_policy(object: &Value, policy: &PolicySpec) -> Vec<String> {
    let Some(spec) = object["spec"].as_object() else {
        return vec!["spec is missing".into()];
    };
    let mut broken = Vec::new();
    if let Some(field) = unknown_field(spec, SPEC_FIELDS) {
        broken.push(format!(
            "spec.{field} is not a field this check knows; refused"
        ));
    }
    if policy.allow_network_peers_outside {
        return broken;
    }
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in spec
            .get(direction)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("spec.{direction}[{i}]");
            broken.extend(rule_refusals(rule, &at, peers));
        }
    }
    broken
}

/// Why one ingress or egress rule (`peers` is `from` or `to`) opens more than the namespace.
fn rule_refusals(rule: &Value, at: &str, peers: &str) -> Vec<String> {
    let Some(fields) = rule.as_object() else {
        return vec![format!("{at} is not an object")];
    };
    if let Some(field) = unknown_field(fields, &[peers, "ports"]) {
        return vec![format!(
            "{at}.{field} is not a field this check knows; refused"
        )];
    }
    let listed = fields.get(peers).and_then(Value::as_array);
    let Some(listed) = listed.filter(|list| !list.is_empty()) else {
        return vec![format!(
            "{at} has no {peers}, which allows every peer, in every namespace and beyond the cluster: {HOW_TO_ALLOW}"
        )];
    };
    listed
        .iter()
        .enumerate()
        .filter_map(|(j, peer)| {
            let inside = peer.as_object().is_some_and(|p| {
                p.len() == 1 && p.get("podSelector").is_some_and(Value::is_object)
            });
            (!inside).then(|| {
                let names: Vec<&str> = peer
                    .as_object()
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                format!(
                    "{at}.{peers}[{j}] names {}: {HOW_TO_ALLOW}",
                    if names.is_empty() {
                        "nothing a peer can be".to_string()
                    } else {
                        names.join(" and ")
                    }
                )
            })
        })
        .collect()
}

fn unknown_field<'a>(fields: &'a Map<String, Value>, known: &[&str]) -> Option<&'a str> {
    fields
        .keys()
        .map(String::as_str)
        .find(|field| !known.contains(field))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy_with(spec: Value) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "app"}, "spec": spec})
    }

    #[test]
    fn peers_of_the_namespace_pass() {
        let ordinary = policy_with(json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}],
            "egress": [{"to": [{"podSelector": {}}]}],
        }));
        assert_eq!(
            network_policy(&ordinary, &PolicySpec::default()),
            Vec::<String>::new()
        );
        let deny_all = policy_with(json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
        assert!(network_policy(&deny_all, &PolicySpec::default()).is_empty());
    }

    #[test]
    fn every_peer_outside_the_namespace_is_refused_by_path() {
        for (spec, expected) in [
            (
                json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}),
                "spec.egress[0].to[0] names ipBlock",
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
                "spec.ingress[0].from[0] names namespaceSelector",
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {}}]}]}),
                "names namespaceSelector and podSelector",
            ),
            (
                json!({"podSelector": {}, "egress": [{}]}),
                "spec.egress[0] has no to",
            ),
            (
                json!({"podSelector": {}, "egress": [{"ports": [{"port": 443}]}]}),
                "spec.egress[0] has no to",
            ),
            (
                json!({"podSelector": {}, "ingress": [{"from": []}]}),
                "spec.ingress[0] has no from",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{}]}]}),
                "names nothing a peer can be",
            ),
            (
                json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}], "endPort": 9}]}),
                "spec.egress[0].endPort is not a field",
            ),
            (
                json!({"podSelector": {}, "futureField": true}),
                "spec.futureField",
            ),
        ] {
            let refused = network_policy(&policy_with(spec.clone()), &PolicySpec::default());
            assert_eq!(refused.len(), 1, "{spec}: {refused:?}");
            assert!(refused[0].contains(expected), "{spec}: {refused:?}");
        }
    }

    #[test]
    fn the_template_may_allow_peers_outside() {
        let open = policy_with(
            json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}),
        );
        let allowing = PolicySpec {
            allow_network_peers_outside: true,
            ..Default::default()
        };
        assert!(network_policy(&open, &allowing).is_empty());
    }
}
