//! Ingresses (pure): the environment's hosts, and nothing of the ingress controller beyond
//! routing them.
//!
//! An Ingress is read by a controller that serves every team: its annotations are that
//! controller's whole configuration surface (config snippets, external auth URLs, mirrors,
//! load-balancer groups), a `defaultBackend` catches every host nobody else claims, and its
//! class picks which controller (and which network) serves it. So: hosts are the environment's
//! ([`super::hosts`]); annotations only those the operator allows (`--ingress-annotations`,
//! none by default; previewd's own `previewd.dev/` ones always); no `defaultBackend`; the
//! class one the template's `policy.ingressClassNames` lists (none set: no class, the
//! cluster's default); fields this check does not know are refused.

use serde_json::Value;

use super::hosts::hosts_outside;
use crate::model::crd::PolicySpec;

const SPEC_FIELDS: &[&str] = &["ingressClassName", "rules", "tls", "defaultBackend"];

pub fn ingress(
    object: &Value,
    policy: &PolicySpec,
    allowed_annotations: &[String],
    url_host: &str,
) -> Vec<String> {
    let mut broken = annotations(object, allowed_annotations);
    let spec = &object["spec"];
    if let Some(field) = spec
        .as_object()
        .into_iter()
        .flat_map(|fields| fields.keys())
        .find(|field| !SPEC_FIELDS.contains(&field.as_str()))
    {
        broken.push(format!(
            "spec.{field} is not a field this check knows; refused"
        ));
    }
    if !spec["defaultBackend"].is_null() {
        broken.push(
            "spec.defaultBackend would receive the traffic of every host no other Ingress claims: route the environment's host with a rule instead".into(),
        );
    }
    broken.extend(class(spec, policy));
    let hosts = spec["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| rule["host"].as_str().unwrap_or_default())
        .chain(
            spec["tls"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|tls| tls["hosts"].as_array().into_iter().flatten())
                .map(|host| host.as_str().unwrap_or_default()),
        );
    broken.extend(hosts_outside(hosts, policy, url_host));
    broken
}

fn annotations(object: &Value, allowed: &[String]) -> Vec<String> {
    object["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, _)| key)
        .filter(|key| !key.starts_with("previewd.dev/") && !allowed.iter().any(|a| a == *key))
        .map(|key| format!(
            "metadata.annotations has {key:?}, which configures the ingress controller every team shares: only annotations this previewd allows (--ingress-annotations; the chart's ingressAnnotations)"
        ))
        .collect()
}

fn class(spec: &Value, policy: &PolicySpec) -> Option<String> {
    let named = &policy.ingress_class_names;
    match spec["ingressClassName"].as_str() {
        Some(class) if named.iter().any(|n| n == class) => None,
        None if named.is_empty() => None,
        Some(class) => Some(format!(
            "spec.ingressClassName is {class:?}: only a class the template's policy.ingressClassNames lists ({named:?})"
        )),
        None => Some(format!(
            "spec.ingressClassName is not set, so the cluster's default class would serve it: name one of the template's policy.ingressClassNames ({named:?})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOST: &str = "pr-1.preview.example.com";

    fn ingress_with(metadata: Value, spec: Value) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata, "spec": spec})
    }

    fn routed(host: &str) -> Value {
        json!({"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]})
    }

    #[test]
    fn the_environments_host_routed_plainly_passes() {
        let plain = ingress_with(
            json!({"name": "web", "annotations": {"previewd.dev/wave": "2"}}),
            routed(HOST),
        );
        assert_eq!(
            ingress(&plain, &PolicySpec::default(), &[], HOST),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_controllers_surface_is_refused_by_field() {
        let snippet = ingress_with(
            json!({"name": "web", "annotations": {"nginx.ingress.kubernetes.io/configuration-snippet": "return 200;"}}),
            routed(HOST),
        );
        let found = ingress(&snippet, &PolicySpec::default(), &[], HOST);
        assert!(
            found[0].contains("configuration-snippet")
                && found[0].contains("--ingress-annotations"),
            "{found:?}"
        );
        let allowed = ["nginx.ingress.kubernetes.io/configuration-snippet".to_string()];
        assert!(ingress(&snippet, &PolicySpec::default(), &allowed, HOST).is_empty());

        let mut catch_all = routed(HOST);
        catch_all["defaultBackend"] = json!({"service": {"name": "web", "port": {"number": 80}}});
        let found = ingress(
            &ingress_with(json!({"name": "web"}), catch_all),
            &PolicySpec::default(),
            &[],
            HOST,
        );
        assert!(found[0].contains("spec.defaultBackend"), "{found:?}");

        let mut future = routed(HOST);
        future["backend"] = json!({});
        let found = ingress(
            &ingress_with(json!({"name": "web"}), future),
            &PolicySpec::default(),
            &[],
            HOST,
        );
        assert!(
            found[0].contains("spec.backend is not a field"),
            "{found:?}"
        );
    }

    #[test]
    fn the_class_is_the_templates() {
        let mut internal = routed(HOST);
        internal["ingressClassName"] = json!("internal-lb");
        let object = ingress_with(json!({"name": "web"}), internal);
        let found = ingress(&object, &PolicySpec::default(), &[], HOST);
        assert!(
            found[0].contains("spec.ingressClassName is \"internal-lb\""),
            "{found:?}"
        );
        let naming = PolicySpec {
            ingress_class_names: vec!["internal-lb".into()],
            ..Default::default()
        };
        assert!(ingress(&object, &naming, &[], HOST).is_empty());
        let unnamed = ingress_with(json!({"name": "web"}), routed(HOST));
        assert!(ingress(&unnamed, &naming, &[], HOST)[0].contains("is not set"));
    }

    #[test]
    fn another_environments_host_is_refused() {
        let sibling = ingress_with(json!({"name": "web"}), routed("pr-2.preview.example.com"));
        let found = ingress(&sibling, &PolicySpec::default(), &[], HOST);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("\"pr-2.preview.example.com\" is not the environment's URL host")
        );
    }
}
