//! Guard (pure): what a template may create. Only objects of the kinds the operator allows
//! (`--template-kinds`), only in the environment's own namespace. One violation rejects the
//! whole render: nothing is applied. (That an allowed kind is namespaced in this cluster is
//! checked when the plan's kinds are discovered, before anything is applied.)

use crate::model::kinds::{TemplateKinds, group_of};
use crate::plan::render::RenderedObject;

/// Why an object was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{kind}/{name} (from {manifest}): {reason}")]
pub struct Violation {
    pub manifest: String,
    pub kind: String,
    pub name: String,
    pub reason: String,
}

/// Checks every object; returns all violations (empty: everything may be applied).
pub fn check(objects: &[RenderedObject], namespace: &str, kinds: &TemplateKinds) -> Vec<Violation> {
    let mut violations = Vec::new();
    for object in objects {
        let violation = |reason: String| Violation {
            manifest: object.manifest.clone(),
            kind: object.kind().to_string(),
            name: object.name().to_string(),
            reason,
        };
        if !kinds.allows(group_of(object.api_version()), object.kind()) {
            violations.push(violation(format!(
                "kind {} ({}) may not be created by a template: it is not one of the kinds this previewd allows (--template-kinds; the chart's templateKinds and extraTemplateKinds)",
                object.kind(),
                object.api_version()
            )));
            continue;
        }
        let target = match &object.object["metadata"]["namespace"] {
            serde_json::Value::Null => namespace,
            // A number or an object here would pass as "no namespace" and reach the applier.
            other => other.as_str().unwrap_or("(not a string)"),
        };
        if target != namespace {
            violations.push(violation(format!(
                "targets namespace {target:?}; objects may only go into the environment's namespace {namespace:?}"
            )));
        }
        if object.seed.is_some() && object.kind() != "Job" {
            violations.push(violation("a seed must be a Job".into()));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(api_version: &str, kind: &str, namespace: Option<&str>) -> RenderedObject {
        let mut value = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}});
        if let Some(ns) = namespace {
            value["metadata"]["namespace"] = json!(ns);
        }
        RenderedObject {
            manifest: "m.yaml".into(),
            wave: 0,
            seed: None,
            object: value,
        }
    }

    #[test]
    fn ordinary_namespaced_objects_pass() {
        let objects = [
            object("apps/v1", "Deployment", Some("env")),
            object("v1", "Service", None),
            object("batch/v1", "Job", Some("env")),
        ];
        assert!(check(&objects, "env", &TemplateKinds::default()).is_empty());
    }

    #[test]
    fn cluster_scoped_kinds_are_refused_with_the_object_named() {
        let objects = [
            object("v1", "ConfigMap", Some("env")),
            object("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None),
        ];
        let violations = check(&objects, "env", &TemplateKinds::default());
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].kind, "ClusterRoleBinding");
        assert!(
            violations[0]
                .to_string()
                .contains("ClusterRoleBinding/x (from m.yaml)")
        );
        assert_eq!(
            check(
                &[object("v1", "Namespace", None)],
                "env",
                &TemplateKinds::default()
            )
            .len(),
            1
        );
        assert_eq!(
            check(
                &[object("v1", "ResourceQuota", None)],
                "env",
                &TemplateKinds::default()
            )
            .len(),
            1
        );
    }

    #[test]
    fn a_namespace_that_is_not_a_string_is_refused() {
        let mut odd = object("v1", "ConfigMap", None);
        odd.object["metadata"]["namespace"] = serde_json::json!(7);
        let violations = check(&[odd], "env", &TemplateKinds::default());
        assert_eq!(violations.len(), 1);
        assert!(
            violations[0].reason.contains("not a string"),
            "{}",
            violations[0]
        );
    }

    #[test]
    fn another_namespace_is_refused() {
        let violations = check(
            &[object("v1", "Secret", Some("kube-system"))],
            "env",
            &TemplateKinds::default(),
        );
        assert_eq!(violations.len(), 1);
        assert!(violations[0].reason.contains("kube-system"));
    }

    #[test]
    fn a_custom_resource_passes_only_when_the_operator_allows_its_kind() {
        let route = [object("gateway.networking.k8s.io/v1", "HTTPRoute", None)];
        let refused = check(&route, "env", &TemplateKinds::default());
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].reason.contains("--template-kinds"),
            "{}",
            refused[0]
        );
        let allowed = TemplateKinds::parse(
            r#"[{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "resource": "httproutes"}]"#,
        )
        .unwrap();
        assert!(check(&route, "env", &allowed).is_empty());
        // Allowing a kind does not allow another namespace.
        let elsewhere = [object(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            Some("kube-system"),
        )];
        assert_eq!(check(&elsewhere, "env", &allowed).len(), 1);
    }
}
