//! What the operator allows every template beyond its own policy ([`OperatorPolicy`]): what a
//! template's Role may grant, an allow-list the operator sets (`--template-role-rules`, the
//! chart's `templateRoleRules`), [`DEFAULT_ROLE_GRANTS`] unless they do; and which Ingress
//! annotations templates may set (`--ingress-annotations`, none by default).
//!
//! Why an allow-list: previewd creates a template's Roles with its own rights, and Kubernetes
//! lets anyone create a Role that grants what they hold themselves. previewd holds rights on
//! Namespace objects cluster-wide, and `PATCH /api/v1/namespaces/X` is authorized by a
//! RoleBinding *in X*: a pull request's Role could let its own pods relabel their namespace
//! (its Pod Security level, previewd's owner label) or create pods through the API that
//! previewd never checks. So a Role may grant only verbs on resources some grant names, and
//! wildcards, `escalate`, `bind` and `impersonate` never come from the default.

use serde::{Deserialize, Serialize};

/// What the operator allows every template: settings of the shared cluster that a template
/// author (a team) may not widen for their own pull requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorPolicy {
    /// What template Roles may grant.
    pub role_grants: RoleGrants,
    /// Ingress annotations templates may set, by exact key (previewd's own `previewd.dev/`
    /// ones always pass). Each configures the ingress controller every team shares.
    pub ingress_annotations: Vec<String>,
    /// Annotations with a DNS-named prefix that other objects may carry besides the built-in
    /// inert ones: exact keys or `prefix/*`. Each configures a controller (a mesh, an API
    /// gateway, a secret injector, external-dns).
    pub object_annotations: Vec<String>,
    /// Labels with a DNS-named prefix that objects may carry besides the built-in inert ones
    /// (`app.kubernetes.io/*`, `helm.sh/*`): exact keys or `prefix/*`. Each configures a
    /// controller (a mesh's injection or data plane, kube-proxy).
    pub object_labels: Vec<String>,
    /// What a template's `policy` and `namespace` fields may widen, field by field
    /// (`super::ceiling`).
    pub ceiling: super::ceiling::TemplateCeiling,
    /// previewd's own ClusterRoles (its own and the environment role it binds): no template
    /// may bind them, whatever the ceiling says.
    pub own_cluster_roles: Vec<String>,
    /// Whether claims may ask for a storage class that keeps its volumes after their claims
    /// are gone (`--allow-retained-volumes`; off: each environment removed would leave its
    /// volumes behind).
    pub allow_retained_volumes: bool,
    /// The longest `terminationGracePeriodSeconds` a pod may ask for
    /// (`--max-termination-grace-period`; `None`: [`DEFAULT_MAX_GRACE_SECONDS`]).
    pub max_grace_period: Option<u64>,
}

/// The longest `terminationGracePeriodSeconds` by default: a sleeping or removed environment's
/// pods stop within five minutes.
pub const DEFAULT_MAX_GRACE_SECONDS: u64 = 300;

impl OperatorPolicy {
    /// The longest grace period a pod may ask for, in seconds.
    pub fn max_grace_seconds(&self) -> u64 {
        self.max_grace_period.unwrap_or(DEFAULT_MAX_GRACE_SECONDS)
    }
}

/// Annotation keys, each named exactly (`--ingress-annotations`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnnotationKeys(pub Vec<String>);

/// Parses `--object-annotations` and `--object-labels`: a JSON list of exact keys or
/// `prefix/*` (every key of one prefix); no other wildcard.
pub fn parse_annotation_patterns(text: &str) -> Result<AnnotationKeys, String> {
    let keys: Vec<String> =
        serde_json::from_str(text).map_err(|e| format!("expected a JSON list of keys: {e}"))?;
    let bad = |key: &String| {
        let exact = key.strip_suffix("/*").unwrap_or(key);
        exact.is_empty() || exact.contains('*')
    };
    match keys.iter().find(|key| bad(key)) {
        Some(key) => Err(format!(
            "key {key:?}: name a key exactly or every key of one prefix (prefix/*)"
        )),
        None => Ok(AnnotationKeys(keys)),
    }
}

/// Parses `--ingress-annotations`: a JSON list of annotation keys.
pub fn parse_annotation_keys(text: &str) -> Result<AnnotationKeys, String> {
    let keys: Vec<String> = serde_json::from_str(text)
        .map_err(|e| format!("expected a JSON list of annotation keys: {e}"))?;
    match keys.iter().find(|key| key.is_empty() || key.contains('*')) {
        Some(key) => Err(format!(
            "annotation key {key:?}: name each key exactly (no wildcards)"
        )),
        None => Ok(AnnotationKeys(keys)),
    }
}

/// Verbs on resources of API groups that template Roles may grant. `*` in a list of the
/// operator's matches anything (the operator's decision, never the default's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleGrant {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The default: reads of the application's own kinds (no Secrets: a namespace's Secrets hold
/// its ServiceAccounts' tokens), leader election (Leases, ConfigMaps) and Events. Nothing that
/// creates pods, reads tokens, execs into pods or touches RBAC or the namespace itself.
pub const DEFAULT_ROLE_GRANTS: &[(&str, &[&str], &[&str])] = &[
    (
        "",
        &[
            "configmaps",
            "endpoints",
            "persistentvolumeclaims",
            "pods",
            "pods/log",
            "serviceaccounts",
            "services",
        ],
        READ,
    ),
    (
        "apps",
        &["deployments", "replicasets", "statefulsets", "daemonsets"],
        READ,
    ),
    ("batch", &["jobs", "cronjobs"], READ),
    ("networking.k8s.io", &["ingresses", "networkpolicies"], READ),
    ("discovery.k8s.io", &["endpointslices"], READ),
    ("autoscaling", &["horizontalpodautoscalers"], READ),
    ("policy", &["poddisruptionbudgets"], READ),
    ("coordination.k8s.io", &["leases"], WRITE),
    ("", &["configmaps"], WRITE),
    (
        "",
        &["events"],
        &["get", "list", "watch", "create", "update", "patch"],
    ),
    (
        "events.k8s.io",
        &["events"],
        &["get", "list", "watch", "create", "update", "patch"],
    ),
];

/// The grants in force, as the operator configured them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleGrants(Vec<RoleGrant>);

impl Default for RoleGrants {
    fn default() -> Self {
        Self(
            DEFAULT_ROLE_GRANTS
                .iter()
                .map(|(group, resources, verbs)| RoleGrant {
                    api_groups: vec![group.to_string()],
                    resources: resources.iter().map(|r| r.to_string()).collect(),
                    verbs: verbs.iter().map(|v| v.to_string()).collect(),
                })
                .collect(),
        )
    }
}

impl RoleGrants {
    /// The list from its JSON form, `[{"apiGroups": [""], "resources": ["secrets"], "verbs":
    /// ["get"]}, …]` (what the chart passes). Empty lists and unknown fields refuse the whole
    /// list, so a typo does not silently allow less, or more, than meant.
    pub fn parse(text: &str) -> Result<Self, String> {
        let grants: Vec<RoleGrant> = serde_json::from_str(text).map_err(|e| {
            format!(
                "expected a JSON list of {{\"apiGroups\", \"resources\", \"verbs\"}} objects: {e}"
            )
        })?;
        for (i, grant) in grants.iter().enumerate() {
            if grant.api_groups.is_empty() || grant.resources.is_empty() || grant.verbs.is_empty() {
                return Err(format!(
                    "role rule {i}: apiGroups, resources and verbs must each name at least one entry"
                ));
            }
        }
        Ok(Self(grants))
    }

    /// Whether some grant allows `verb` on `resource` of `group`.
    pub fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        let names = |list: &[String], wanted: &str| list.iter().any(|n| n == wanted || n == "*");
        self.0.iter().any(|grant| {
            names(&grant.api_groups, group)
                && names(&grant.resources, resource)
                && names(&grant.verbs, verb)
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &RoleGrant> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_reads_and_leader_election_only() {
        let grants = RoleGrants::default();
        assert!(grants.allows("apps", "deployments", "watch"));
        assert!(grants.allows("coordination.k8s.io", "leases", "update"));
        assert!(grants.allows("", "pods/log", "get"));
        for (group, resource, verb) in [
            ("", "namespaces", "patch"),
            ("", "pods", "create"),
            ("", "pods/exec", "create"),
            ("", "secrets", "get"),
            ("", "serviceaccounts/token", "create"),
            ("apps", "deployments", "create"),
            ("rbac.authorization.k8s.io", "roles", "escalate"),
            ("", "users", "impersonate"),
            ("*", "*", "*"),
        ] {
            assert!(
                !grants.allows(group, resource, verb),
                "{verb} on {group}/{resource}"
            );
        }
    }

    #[test]
    fn annotation_keys_are_named_exactly() {
        assert_eq!(
            parse_annotation_keys(r#"["cert-manager.io/cluster-issuer"]"#),
            Ok(AnnotationKeys(vec![
                "cert-manager.io/cluster-issuer".to_string()
            ]))
        );
        assert!(parse_annotation_keys(r#"["nginx.ingress.kubernetes.io/*"]"#).is_err());
        assert!(parse_annotation_keys(r#"[""]"#).is_err());
        assert!(parse_annotation_keys("cert-manager.io/cluster-issuer").is_err());
    }

    #[test]
    fn object_annotation_patterns_name_a_key_or_one_prefix() {
        assert_eq!(
            parse_annotation_patterns(r#"["konghq.com/*", "linkerd.io/inject"]"#),
            Ok(AnnotationKeys(vec![
                "konghq.com/*".to_string(),
                "linkerd.io/inject".to_string()
            ]))
        );
        for bad in [
            r#"["*"]"#,
            r#"["/*"]"#,
            r#"["*.io/*"]"#,
            r#"["konghq.com/plug*"]"#,
        ] {
            assert!(parse_annotation_patterns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_operator_list_replaces_the_default_and_is_checked_whole() {
        let grants = RoleGrants::parse(
            r#"[{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]"#,
        )
        .unwrap();
        assert!(grants.allows("", "secrets", "get"));
        assert!(
            !grants.allows("", "configmaps", "get"),
            "the default is replaced"
        );
        for broken in [
            r#"[{"apiGroups": [""], "resources": [], "verbs": ["get"]}]"#,
            r#"[{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["x"]}]"#,
            r#"{"apiGroups": [""]}"#,
        ] {
            assert!(RoleGrants::parse(broken).is_err(), "{broken}");
        }
    }
}
