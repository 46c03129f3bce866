//! The two custom resources of group `previewd.dev`, version `v1alpha1`.
//!
//! * [`PreviewTemplate`]: one per repository, written by a platform engineer. It says which forge
//!   events create environments and what an environment consists of.
//! * [`PreviewEnvironment`]: one per branch or pull request, written by previewd's webhook intake
//!   (or by hand). It is the durable record of what should run; its status says what does run.
//!
//! The schemas must stay within what every supported API server accepts as a structural schema:
//! no CEL rules (`x-kubernetes-validations`), free-form values only under
//! `x-kubernetes-preserve-unknown-fields`.
//!
//! The labels, annotations, finalizer and field managers these resources carry are in
//! [`super::metadata`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of both resources.
pub const GROUP: &str = "previewd.dev";
// ---------------------------------------------------------------------------------------------
// PreviewTemplate
// ---------------------------------------------------------------------------------------------

/// How to build preview environments for one repository.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "previewd.dev",
    version = "v1alpha1",
    kind = "PreviewTemplate",
    namespaced,
    shortname = "ptmpl",
    category = "previewd",
    printcolumn = r#"{"name":"Forge","type":"string","jsonPath":".spec.forge.kind"}"#,
    printcolumn = r#"{"name":"Repository","type":"string","jsonPath":".spec.forge.repository"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PreviewTemplateSpec {
    /// Which forge and repository this template serves, and how to talk to it.
    pub forge: ForgeSpec,
    /// Which forge events create, update and remove environments.
    #[serde(default)]
    pub triggers: Triggers,
    /// How each environment's namespace is named and fenced in.
    #[serde(default)]
    pub namespace: NamespaceSpec,
    /// How the environment's URL is formed.
    #[serde(default)]
    pub url: UrlSpec,
    /// When environments are removed or put to sleep, and how many may run at once.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// The application's manifests, as minijinja templates.
    pub manifests: ManifestSource,
    /// Jobs that load test data; the environment waits for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<SeedSpec>,
    /// Extra values available to the manifests as `values`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "free_form_object")]
    pub values: BTreeMap<String, serde_json::Value>,
}

/// The forge a template's repository lives on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    #[default]
    Github,
    Gitlab,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForgeSpec {
    /// `github` or `gitlab`.
    pub kind: ForgeKind,
    /// `owner/name` on GitHub, the full project path (`group/sub/project`) on GitLab.
    pub repository: String,
    /// API base URL for self-hosted forges (GitHub Enterprise, self-managed GitLab). Tokens are
    /// only ever sent here. Defaults to the public forge's API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Secret key holding the API token used for comments and statuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
    /// Secret key holding the webhook secret (GitHub) or token (GitLab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the template's namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// What to do with pull requests from forks.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum ForkPolicy {
    /// Never deploy fork PRs.
    #[default]
    Deny,
    /// Deploy fork PRs once a maintainer comments `/preview approve`.
    RequireApproval,
    /// Deploy fork PRs like any other.
    Allow,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Triggers {
    /// Create an environment for every open pull/merge request.
    #[serde(default = "default_true")]
    pub pull_requests: bool,
    /// Also create environments for pushes to branches matching these globs (`feature/*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<String>,
    /// Only PRs carrying this label get an environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_label: Option<String>,
    /// Deploy draft PRs too.
    #[serde(default)]
    pub draft_pull_requests: bool,
    /// Pull requests from forks.
    #[serde(default)]
    pub fork_policy: ForkPolicy,
}

impl Default for Triggers {
    fn default() -> Self {
        Self {
            pull_requests: true,
            branches: Vec::new(),
            required_label: None,
            draft_pull_requests: false,
            fork_policy: ForkPolicy::Deny,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSpec {
    /// Prefix of every environment namespace (default `preview`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Extra labels on the namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `hard` limits of a ResourceQuota created in every environment namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_quota: Option<BTreeMap<String, String>>,
    /// Container defaults of a LimitRange created in every environment namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_range: Option<LimitRangeSpec>,
    /// The default-deny NetworkPolicy and its exceptions.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LimitRangeSpec {
    /// Default limits for containers that set none (`cpu`, `memory`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub default: BTreeMap<String, String>,
    /// Default requests for containers that set none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub default_request: BTreeMap<String, String>,
    /// Per-container maximum.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Deny ingress from outside the namespace (default on).
    #[serde(default = "default_true")]
    pub default_deny: bool,
    /// Namespace of the ingress controller, whose traffic is let in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_namespace: Option<String>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            default_deny: true,
            ingress_namespace: None,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UrlSpec {
    /// minijinja template of the host, e.g. `{{ slug }}.preview.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `https` (default) or `http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
}

/// What happens to an environment that has been idle too long.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum IdleAction {
    #[default]
    Delete,
    Sleep,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Idle time (no push, no command) after which `idleAction` applies, e.g. `72h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Age after which an environment is deleted whatever happens, e.g. `14d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// How many environments of this template may run at once; the rest are queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_environments: Option<u32>,
    /// `Delete` (default) or `Sleep`.
    #[serde(default)]
    pub idle_action: IdleAction,
}

/// Where the manifests come from. Exactly one source should be set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestSource {
    /// Manifests written into the template itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inline: Vec<InlineManifest>,
    /// Manifests kept in a ConfigMap of the template's namespace: every key is one manifest file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapSource>,
    /// Manifests read from the repository at the head commit (cached by commit SHA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_path: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InlineManifest {
    /// A name for error messages (`web.yaml`).
    pub name: String,
    /// The minijinja template; may hold several YAML documents.
    pub template: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapSource {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedSpec {
    /// The seed's name, unique within the template.
    pub name: String,
    /// The wave it runs in: after every object of lower waves is healthy.
    #[serde(default)]
    pub wave: i32,
    /// minijinja template of a `batch/v1` Job (YAML). Its name is replaced by one derived from
    /// a hash of its rendered content, so it runs once per content.
    pub job: String,
}

// ---------------------------------------------------------------------------------------------
// PreviewEnvironment
// ---------------------------------------------------------------------------------------------

/// One preview environment: a branch or pull request of a repository, deployed from a template.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "previewd.dev",
    version = "v1alpha1",
    kind = "PreviewEnvironment",
    namespaced,
    status = "PreviewEnvironmentStatus",
    shortname = "penv",
    category = "previewd",
    printcolumn = r#"{"name":"Branch","type":"string","jsonPath":".spec.source.branch"}"#,
    printcolumn = r#"{"name":"PR","type":"integer","jsonPath":".spec.source.pullRequest"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.url"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PreviewEnvironmentSpec {
    /// Name of the `PreviewTemplate` (same namespace).
    pub template: String,
    /// What is deployed.
    pub source: Source,
    /// Last push or command; the idle timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<DateTime<Utc>>,
    /// Desired sleep: workloads scaled to zero.
    #[serde(default)]
    pub sleep: bool,
    /// `/preview extend`: neither the idle timeout nor the maximum age removes (or puts to
    /// sleep) the environment before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_until: Option<DateTime<Utc>>,
    /// For a fork pull request under `forkPolicy: RequireApproval`: the head commit a
    /// maintainer approved with `/preview approve`. Only that commit is deployed; a new push
    /// from the fork waits for a new approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_sha: Option<String>,
    /// Set by `/preview deploy`: a new value restarts every Deployment and StatefulSet
    /// (their pod template carries it as an annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redeploy: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// Repository as the template names it.
    pub repository: String,
    /// The branch (the PR's head branch for a PR).
    pub branch: String,
    /// Pull/merge request number; absent for a plain branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<u64>,
    /// The commit to deploy.
    pub head_sha: String,
    /// Who pushed or opened the PR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The PR comes from a fork.
    #[serde(default)]
    pub fork: bool,
    /// When the forge says this source last changed (`pull_request.updated_at`, the push's
    /// time). A delivery older than this is not applied: deliveries can arrive out of order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<DateTime<Utc>>,
}

impl Source {
    /// Whether this describes an earlier state than `current`, by the forge's own timestamps.
    /// Without a timestamp on either side nothing can be told (the newer delivery wins by
    /// arriving). Two changes within the same second (GitHub's resolution) are taken in
    /// arrival order.
    pub fn is_older_than(&self, current: &Source) -> bool {
        matches!((self.changed_at, current.changed_at), (Some(w), Some(c)) if w < c)
    }
}

/// Where an environment stands. Serialized as the plain word `kubectl` shows.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum Phase {
    #[default]
    Pending,
    Queued,
    Deploying,
    Seeding,
    Ready,
    Degraded,
    Sleeping,
    Terminating,
}

impl Phase {
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::Queued,
        Phase::Deploying,
        Phase::Seeding,
        Phase::Ready,
        Phase::Degraded,
        Phase::Sleeping,
        Phase::Terminating,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Queued => "Queued",
            Phase::Deploying => "Deploying",
            Phase::Seeding => "Seeding",
            Phase::Ready => "Ready",
            Phase::Degraded => "Degraded",
            Phase::Sleeping => "Sleeping",
            Phase::Terminating => "Terminating",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreviewEnvironmentStatus {
    #[serde(default)]
    pub phase: Phase,
    /// The namespace the environment runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Where developers open it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The head SHA that is deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_sha: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per applied object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceStatus>,
    /// One entry per seed job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<SeedStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the current head SHA was requested, and when it became Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// What previewd last reported to the forge (the PR comment, deployment, commit status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeReport>,
    /// While `Queued`: the place in the template's queue (1 = next to start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    /// Replica counts of Deployments and StatefulSets (`Kind/name`) from before the last sleep;
    /// waking restores them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replicas_before_sleep: BTreeMap<String, i32>,
}

/// What previewd last told the forge, so that an unchanged environment makes no forge call and
/// a restart never makes a second comment.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForgeReport {
    /// Id of the one comment previewd keeps on the pull/merge request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment_id: Option<u64>,
    /// SHA-256 of the comment's last text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment_sha: Option<String>,
    /// GitHub Deployment of the head SHA (GitHub only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<u64>,
    /// The head SHA that Deployment is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_sha: Option<String>,
    /// SHA-256 of the last commit/deployment status sent (state, head SHA, URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_sha: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub wave: i32,
    /// `Applied`, `Ready`, `Progressing` or `Failed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedStatus {
    pub name: String,
    /// The Job's name (content-hashed).
    pub job: String,
    /// `Running`, `Succeeded` or `Failed`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A condition in the usual Kubernetes shape.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: DateTime<Utc>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// The head SHA these timings are for.
    pub sha: String,
    pub requested_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<DateTime<Utc>>,
    /// Seconds from request to Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_to_ready: Option<f64>,
}

fn default_true() -> bool {
    true
}

/// Schema for a map of arbitrary JSON values (the template's `values`).
fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Both CRDs, in a stable order, as `crdgen` writes them.
pub fn all_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![PreviewTemplate::crd(), PreviewEnvironment::crd()]
}

/// The CRDs as one multi-document YAML file: the exact content of `crds/previewd.dev.yaml`.
pub fn crds_yaml() -> String {
    let mut out = String::from(
        "# Generated by `cargo run --bin crdgen`; do not edit. A test fails when this differs.\n",
    );
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd).expect("a CRD always serializes to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_in_repository_match_the_code() {
        // The Helm chart carries the same file (Helm installs what is in a chart's crds/).
        for file in [
            "crds/previewd.dev.yaml",
            "charts/previewd/crds/previewd.dev.yaml",
        ] {
            let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                on_disk == crds_yaml(),
                "{file} is out of date: run `cargo run --bin crdgen > {file}`"
            );
        }
    }

    #[test]
    fn crd_schemas_carry_no_cel_rules() {
        // CEL (`x-kubernetes-validations`) is unknown to older API servers and makes the CRD
        // fail to install there; keep validation in the controller.
        assert!(!crds_yaml().contains("x-kubernetes-validations"));
    }

    #[test]
    fn environment_printer_columns_are_the_documented_ones() {
        use kube::CustomResourceExt;
        let crd = PreviewEnvironment::crd();
        let columns: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(columns, ["Branch", "PR", "Phase", "URL", "Age"]);
        assert_eq!(crd.spec.names.short_names, Some(vec!["penv".to_string()]));
        assert!(
            crd.spec.versions[0]
                .subresources
                .as_ref()
                .unwrap()
                .status
                .is_some()
        );
    }

    #[test]
    fn template_defaults_fill_in_from_a_minimal_spec() {
        let spec: PreviewTemplateSpec = serde_json::from_value(serde_json::json!({
            "forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
            "manifests": {"inline": [{"name": "a.yaml", "template": "kind: ConfigMap"}]}
        }))
        .unwrap();
        assert!(spec.triggers.pull_requests);
        assert!(!spec.triggers.draft_pull_requests);
        assert_eq!(spec.triggers.fork_policy, ForkPolicy::Deny);
        assert!(spec.namespace.network_policy.default_deny);
        assert_eq!(spec.lifecycle.idle_action, IdleAction::Delete);
    }
}
