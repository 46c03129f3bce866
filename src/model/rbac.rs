//! previewd's RBAC, generated from [`crate::model::kinds`]: the exact content of the chart's
//! `templates/rbac.yaml` (`cargo run --bin rbacgen > charts/previewd/templates/rbac.yaml`; a
//! test fails when the file differs). The rules for the kinds templates may create are Helm
//! loops over the chart's `templateKinds` and `extraTemplateKinds` values, the same list the
//! chart passes to previewd as `--template-kinds`: the guard and the rights cannot disagree.
//!
//! Two roles, so that previewd can write application objects only in namespaces it created:
//! - the cluster role, bound cluster-wide: read the kinds it watches, create, label and delete
//!   namespaces, create RoleBindings that bind the environment role (the API server's
//!   escalation check refuses any other binding: previewd holds `bind` on that role only);
//! - the environment role, which previewd binds in each environment namespace right after it
//!   creates it: write the template kinds and guard rails there, and nowhere else.
//!
//! Secrets are read only in the namespaces where templates live (a Role per namespace), never
//! cluster-wide.

use serde_json::{Value, json};

use crate::model::kinds::{GUARD_RAIL_KINDS, Kind, is_watched};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &[
    "get", "list", "watch", "create", "patch", "update", "delete",
];

/// One rule per API group over `kinds` (first-seen order, each resource once).
fn rules(kinds: &[&Kind], verbs: &[&str]) -> Vec<Value> {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for kind in kinds {
        match groups.iter_mut().find(|(group, _)| *group == kind.group) {
            Some((_, resources)) if resources.contains(&kind.resource.as_ref()) => {}
            Some((_, resources)) => resources.push(&kind.resource),
            None => groups.push((&kind.group, vec![&kind.resource])),
        }
    }
    groups
        .into_iter()
        .map(|(group, resources)| json!({"apiGroups": [group], "resources": resources, "verbs": verbs}))
        .collect()
}

/// What the cluster-wide role grants about the guard rails in environment namespaces: reading
/// the ones previewd watches, and creating the RoleBinding that grants the environment role.
/// (Reading the template kinds is the chart's loop, [`template_kind_rules`].)
pub fn cluster_object_rules() -> Vec<Value> {
    let watched: Vec<&Kind> = GUARD_RAIL_KINDS
        .iter()
        .filter(|k| is_watched(&k.group, &k.kind))
        .collect();
    let mut rules = rules(&watched, READ);
    rules.push(json!({
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["rolebindings"],
        "verbs": ["create", "patch"],
    }));
    rules
}

/// What a hub may do on a registered (target) cluster, in the one namespace of previewd's
/// records there: the records themselves, nothing else (no Secrets, no namespaces, no
/// application kinds: the target's own previewd deploys them with its own rights).
pub fn hub_record_rules() -> Vec<Value> {
    vec![json!({
        "apiGroups": [crate::model::crd::GROUP],
        "resources": ["previewtemplates", "previewenvironments"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    })]
}

/// What the environment role grants on the guard rails inside one environment namespace.
pub fn environment_rules() -> Vec<Value> {
    rules(&GUARD_RAIL_KINDS.iter().collect::<Vec<_>>(), WRITE)
}

/// The rules for the kinds templates may create, one per kind of the chart's list: `verbs` on
/// each, Secrets left out when `watched_only` (no cluster-wide Secret reads, see
/// [`is_watched`]).
fn template_kind_rules(verbs: &[&str], watched_only: bool) -> String {
    let rule = format!(
        "  - apiGroups: [{{{{ .group | quote }}}}]\n    resources: [{{{{ .resource }}}}]\n    verbs: [{}]\n",
        verbs.join(", ")
    );
    let rule = match watched_only {
        true => format!(
            "{{{{- if not (and (eq .group \"\") (eq .kind \"Secret\")) }}}}\n{rule}{{{{- end }}}}\n"
        ),
        false => rule,
    };
    format!(
        "{{{{- range (include \"previewd.templateKinds\" . | fromJsonArray) }}}}\n{rule}{{{{- end }}}}\n"
    )
}

/// `rules` as YAML list items in flow style, indented for the chart file.
fn rules_yaml(rules: &[Value]) -> String {
    let list = |value: &Value| {
        let items: Vec<String> = value
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| match item.as_str() {
                Some("") => "\"\"".to_string(),
                Some(text) => text.to_string(),
                None => item.to_string(),
            })
            .collect();
        format!("[{}]", items.join(", "))
    };
    rules
        .iter()
        .map(|rule| {
            format!(
                "  - apiGroups: {}\n    resources: {}\n    verbs: {}\n",
                list(&rule["apiGroups"]),
                list(&rule["resources"]),
                list(&rule["verbs"])
            )
        })
        .collect()
}

/// The chart's `templates/rbac.yaml`.
pub fn chart_rbac_yaml() -> String {
    CHART_RBAC
        .replace("@TEMPLATE_KINDS_READ@", &template_kind_rules(READ, true))
        .replace("@TEMPLATE_KINDS_WRITE@", &template_kind_rules(WRITE, false))
        .replace(
            "@CLUSTER_OBJECT_RULES@",
            &rules_yaml(&cluster_object_rules()),
        )
        .replace("@ENVIRONMENT_RULES@", &rules_yaml(&environment_rules()))
        .replace("@HUB_RECORD_RULES@", &rules_yaml(&hub_record_rules()))
}

/// The chart file around the generated rules: names, bindings and Helm values.
const CHART_RBAC: &str = r#"{{- /*
Generated by `cargo run --bin rbacgen > charts/previewd/templates/rbac.yaml` from
src/model/kinds.rs; do not edit (a test fails when this differs). docs/security.md explains it.
*/}}
{{- if .Values.rbac.create }}
{{- $fullname := include "previewd.fullname" . }}
{{- $account := include "previewd.serviceAccountName" . }}
# Cluster-wide: its CRDs, namespaces, reading what it watches, and binding the environment role.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
rules:
  - apiGroups: [previewd.dev]
    resources: [previewtemplates]
    verbs: [get, list, watch]
  # Its WithinCeiling condition, when a template asks for more than the operator's ceiling.
  - apiGroups: [previewd.dev]
    resources: [previewtemplates/status]
    verbs: [get, patch]
  - apiGroups: [previewd.dev]
    resources: [previewenvironments]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [previewd.dev]
    resources: [previewenvironments/status]
    verbs: [get, patch, update]
  - apiGroups: [previewd.dev]
    resources: [previewenvironments/finalizers]
    verbs: [update]
  # Registered clusters (placement): read them, and write what their looks saw.
  - apiGroups: [previewd.dev]
    resources: [previewclusters]
    verbs: [get, list, watch]
  - apiGroups: [previewd.dev]
    resources: [previewclusters/status]
    verbs: [get, patch]
  # Registered database servers: read them (a database per environment).
  - apiGroups: [previewd.dev]
    resources: [previewdatabaseservers]
    verbs: [get, list, watch]
  # Environment namespaces: previewd creates them, and never labels or deletes one that it
  # did not create for the environment (its UID label; the code checks, RBAC cannot).
  - apiGroups: [""]
    resources: [namespaces]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [create, patch]
  # Which storage classes keep their volumes (reclaimPolicy Retain): claims on them are refused.
  - apiGroups: [storage.k8s.io]
    resources: [storageclasses]
    verbs: [get, list]
  # To check at start that the installed PreviewEnvironment CRD keeps the order of deliveries.
  - apiGroups: [apiextensions.k8s.io]
    resources: [customresourcedefinitions]
    verbs: [get]
    resourceNames: [previewenvironments.previewd.dev]
  # To wait until a new environment namespace's RoleBinding is in force.
  - apiGroups: [authorization.k8s.io]
    resources: [selfsubjectaccessreviews]
    verbs: [create]
  # The only roles previewd may bind (the API server refuses any other binding).
  - apiGroups: [rbac.authorization.k8s.io]
    resources: [clusterroles]
    verbs: [bind]
    resourceNames:
      - {{ $fullname }}-environment
      {{- range .Values.rbac.bindableClusterRoles }}
      - {{ . | quote }}
      {{- end }}
  # The kinds templates may create (values templateKinds and extraTemplateKinds), to watch.
@TEMPLATE_KINDS_READ@@CLUSTER_OBJECT_RULES@---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $fullname }}
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ .Release.Namespace }}
---
# Bound by previewd in each namespace it creates for an environment, and nowhere else.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $fullname }}-environment
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
rules:
  # The kinds templates may create (values templateKinds and extraTemplateKinds).
@TEMPLATE_KINDS_WRITE@@ENVIRONMENT_RULES@  # What template Roles may grant (value templateRoleRules): the API server lets previewd
  # create only Roles that grant what it holds.
{{- range (include "previewd.templateRoleRules" . | fromJsonArray) }}
  - apiGroups: {{ .apiGroups | toJson }}
    resources: {{ .resources | toJson }}
    verbs: {{ .verbs | toJson }}
{{- end }}
---
# The leader Lease, in previewd's own namespace.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $fullname }}-leader
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $fullname }}-leader
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $fullname }}-leader
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ .Release.Namespace }}
{{- /* Webhook secrets and forge tokens: read only where templates live. */}}
{{- $secretNamespaces := .Values.rbac.secretNamespaces | default (list (.Values.watchNamespace | default .Release.Namespace)) }}
{{- range $secretNamespaces }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $fullname }}-secrets
  namespace: {{ . }}
  labels:
    {{- include "previewd.labels" $ | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $fullname }}-secrets
  namespace: {{ . }}
  labels:
    {{- include "previewd.labels" $ | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $fullname }}-secrets
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ $.Release.Namespace }}
{{- end }}
{{- /* The operator's credentials in previewd's own namespace: registered clusters'
kubeconfigs (placement), database servers' admin logins (databases). */}}
{{- if or .Values.placement.enabled .Values.databases.enabled }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $fullname }}-cluster-credentials
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $fullname }}-cluster-credentials
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "previewd.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $fullname }}-cluster-credentials
subjects:
  - kind: ServiceAccount
    name: {{ $account }}
    namespace: {{ .Release.Namespace }}
{{- end }}
{{- /* On a registered cluster: the hub writes previewd's records here, and nothing else. */}}
{{- with .Values.hubAccess.subjects }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $fullname }}-hub-records
  namespace: {{ $.Values.watchNamespace | default $.Release.Namespace }}
  labels:
    {{- include "previewd.labels" $ | nindent 4 }}
rules:
@HUB_RECORD_RULES@---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $fullname }}-hub-records
  namespace: {{ $.Values.watchNamespace | default $.Release.Namespace }}
  labels:
    {{- include "previewd.labels" $ | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $fullname }}-hub-records
subjects:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_rbac_is_generated_from_the_kind_list() {
        let file = "charts/previewd/templates/rbac.yaml";
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == chart_rbac_yaml(),
            "{file} is out of date: run `cargo run --bin rbacgen > {file}`"
        );
    }

    fn grants(rules: &[Value], group: &str, resource: &str, verb: &str) -> bool {
        rules.iter().any(|rule| {
            rule["apiGroups"][0] == group
                && rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r == resource))
                && rule["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == verb))
        })
    }

    #[test]
    fn guard_rails_are_writable_in_environment_namespaces_only() {
        let environment = environment_rules();
        let cluster = cluster_object_rules();
        for kind in GUARD_RAIL_KINDS {
            assert!(grants(&environment, &kind.group, &kind.resource, "patch"));
            assert!(grants(&environment, &kind.group, &kind.resource, "delete"));
            assert!(!grants(&cluster, &kind.group, &kind.resource, "delete"));
            assert!(!grants(&cluster, &kind.group, &kind.resource, "update"));
        }
        // Cluster-wide, Secrets are not even readable.
        assert!(!grants(&cluster, "", "secrets", "get"));
        assert!(!grants(&cluster, "", "secrets", "list"));
    }

    /// The chart's default list is the built-in one: an operator who leaves the values alone
    /// gets the RBAC that `--template-kinds`' default needs (the chart test renders and applies
    /// it with the real Helm engine and checks the rights it grants).
    #[test]
    fn the_charts_default_template_kinds_are_previewds_default() {
        use crate::model::kinds::DEFAULT_TEMPLATE_KINDS;
        let path = format!("{}/charts/previewd/values.yaml", env!("CARGO_MANIFEST_DIR"));
        let values: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap_or_default())
                .unwrap_or_default();
        let listed: Vec<Kind> =
            serde_json::from_value(values["templateKinds"].clone()).unwrap_or_default();
        assert_eq!(listed, DEFAULT_TEMPLATE_KINDS);
        assert_eq!(values["extraTemplateKinds"], json!([]));
    }

    /// The chart's default role rules are previewd's: what `--template-role-rules` allows by
    /// default is what the chart passes and what its environment role holds.
    #[test]
    fn the_charts_default_role_rules_are_previewds_default() {
        use crate::model::grants::RoleGrants;
        let path = format!("{}/charts/previewd/values.yaml", env!("CARGO_MANIFEST_DIR"));
        let values: Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap_or_default())
                .unwrap_or_default();
        let listed = RoleGrants::parse(&values["templateRoleRules"].to_string());
        assert_eq!(listed, Ok(RoleGrants::default()));
    }
}
