//! Roles and RoleBindings (pure): what a template may grant inside its namespace.
//!
//! A Role grants only what the operator's [`RoleGrants`] name, verb by verb and resource by
//! resource (see [`crate::model::grants`] for why). A rule with a wildcard, a non-resource URL
//! or a field this check does not know is refused: it cannot be judged, so it is not guessed
//! at. A RoleBinding refers to a Role of the namespace (or a ClusterRole the template allows)
//! and to ServiceAccounts of the namespace only.

use serde_json::Value;

use crate::model::crd::PolicySpec;
use crate::model::grants::RoleGrants;

/// The fields of a PolicyRule; anything else is refused (a newer API's field previewd does
/// not know might widen the rule).
const RULE_FIELDS: &[&str] = &["apiGroups", "resources", "verbs", "resourceNames"];

const HOW_TO_ALLOW: &str = "a template Role may grant only what this previewd's role rules name (--template-role-rules; the chart's templateRoleRules)";

pub fn role(object: &Value, grants: &RoleGrants) -> Vec<String> {
    if let Some(map) = object.as_object()
        && let Some(field) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "rules"))
    {
        return vec![format!(
            "{field} is not a field of a Role this check knows; refused"
        )];
    }
    let mut broken = Vec::new();
    for (i, rule) in object["rules"].as_array().into_iter().flatten().enumerate() {
        if let Some(reason) = rule_refusal(rule, grants) {
            broken.push(format!("rules[{i}] {reason}"));
        }
    }
    if !object["rules"].is_null() && !object["rules"].is_array() {
        broken.push("rules is not a list".into());
    }
    broken
}

/// Why one rule may not be granted, if it may not.
fn rule_refusal(rule: &Value, grants: &RoleGrants) -> Option<String> {
    let Some(fields) = rule.as_object() else {
        return Some("is not an object".into());
    };
    if fields.contains_key("nonResourceURLs") {
        return Some("names nonResourceURLs, which a namespaced Role cannot grant".into());
    }
    if let Some(field) = fields.keys().find(|k| !RULE_FIELDS.contains(&k.as_str())) {
        return Some(format!(
            "has the field {field}, which this check does not know"
        ));
    }
    let groups = names(&rule["apiGroups"]);
    let resources = names(&rule["resources"]);
    let verbs = names(&rule["verbs"]);
    for (field, list) in [
        ("apiGroups", &groups),
        ("resources", &resources),
        ("verbs", &verbs),
    ] {
        if list.is_empty() {
            return Some(format!("names no {field}, which this check cannot judge"));
        }
    }
    let all = [&groups, &resources, &verbs];
    if all.iter().any(|list| list.iter().any(|n| n.contains('*'))) {
        return Some(format!("uses a wildcard (*): {HOW_TO_ALLOW}, by name"));
    }
    let mut refused = Vec::new();
    for group in &groups {
        for resource in &resources {
            let denied: Vec<&str> = verbs
                .iter()
                .copied()
                .filter(|verb| !grants.allows(group, resource, verb))
                .collect();
            if !denied.is_empty() {
                let qualified = match *group {
                    "" => resource.to_string(),
                    group => format!("{resource}.{group}"),
                };
                refused.push(format!("{} on {qualified}", denied.join(", ")));
            }
        }
    }
    (!refused.is_empty()).then(|| format!("grants {}: {HOW_TO_ALLOW}", refused.join("; ")))
}

/// The strings of a list field; anything that is not a string counts as a wildcard, so that a
/// value this check cannot read is refused rather than skipped.
fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|entry| entry.as_str().unwrap_or("*"))
        .collect()
}

pub fn role_binding(object: &Value, policy: &PolicySpec, namespace: &str) -> Vec<String> {
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

    fn role_with(rules: Value) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "app"}, "rules": rules})
    }

    #[test]
    fn reads_of_the_applications_kinds_and_leader_election_pass() {
        let ordinary = role_with(json!([
            {"apiGroups": [""], "resources": ["pods", "services", "configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["leader"], "verbs": ["update"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ]));
        assert_eq!(
            role(&ordinary, &RoleGrants::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_way_out_of_the_namespace_is_refused_with_the_rule_named() {
        for (rule, expected) in [
            (
                json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["patch"]}),
                "patch on namespaces",
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}),
                "create on pods",
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]}),
                "create, get on pods/exec",
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods/portforward", "pods/attach"], "verbs": ["create"]}),
                "create on pods/portforward; create on pods/attach",
            ),
            (
                json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
                "get on secrets",
            ),
            (
                json!({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}),
                "serviceaccounts/token",
            ),
            (
                json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate", "bind"]}),
                "escalate, bind on roles.rbac.authorization.k8s.io",
            ),
            (
                json!({"apiGroups": [""], "resources": ["users", "serviceaccounts"], "verbs": ["impersonate"]}),
                "impersonate on users",
            ),
            (
                json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]}),
                "create on deployments.apps",
            ),
            (
                json!({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}),
                "wildcard",
            ),
            (
                json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}),
                "wildcard",
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}),
                "wildcard",
            ),
            (
                json!({"apiGroups": [""], "resources": [7], "verbs": ["get"]}),
                "wildcard",
            ),
            (
                json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}),
                "nonResourceURLs",
            ),
            (
                json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceSelector": {}}),
                "resourceSelector",
            ),
        ] {
            let refused = role(&role_with(json!([rule])), &RoleGrants::default());
            assert_eq!(refused.len(), 1, "{rule}: {refused:?}");
            assert!(refused[0].starts_with("rules[0] "), "{refused:?}");
            assert!(refused[0].contains(expected), "{rule}: {refused:?}");
        }
    }

    #[test]
    fn the_refusal_says_how_to_allow_it_and_the_operators_list_does() {
        let secrets =
            role_with(json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]));
        let refused = role(&secrets, &RoleGrants::default());
        assert!(refused[0].contains("--template-role-rules"), "{refused:?}");
        let grants = RoleGrants::parse(
            r#"[{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]"#,
        )
        .unwrap();
        assert!(role(&secrets, &grants).is_empty());
    }

    #[test]
    fn a_role_with_fields_this_check_does_not_know_is_refused() {
        let mut odd = role_with(json!([]));
        odd["aggregationRule"] = json!({"clusterRoleSelectors": []});
        assert!(role(&odd, &RoleGrants::default())[0].contains("aggregationRule"));
        let mut not_a_list = role_with(json!({"apiGroups": [""]}));
        not_a_list["rules"] = json!({"apiGroups": [""]});
        assert!(!role(&not_a_list, &RoleGrants::default()).is_empty());
    }
}
