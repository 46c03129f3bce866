//! `PreviewTemplate`: one per repository, written by a platform engineer. It says which forge
//! events create environments and what an environment consists of.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{default_true, free_form_list, free_form_object};

/// How to build preview environments for one repository.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "previewd.dev",
    version = "v1alpha1",
    kind = "PreviewTemplate",
    namespaced,
    shortname = "ptmpl",
    category = "previewd",
    status = "PreviewTemplateStatus",
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
    /// Secrets previewd puts into every environment: copies of Secrets their owners share,
    /// and secrets generated once per environment (a database password).
    #[serde(default, skip_serializing_if = "SecretsSpec::is_empty")]
    pub secrets: SecretsSpec,
    /// What the rendered objects may do beyond their namespace (pod security, exposure, RBAC).
    /// The defaults are safe for manifests from pull requests; each exception is explicit.
    #[serde(default)]
    pub policy: PolicySpec,
    /// Extra values available to the manifests as `values`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "free_form_object")]
    pub values: BTreeMap<String, serde_json::Value>,
    /// Where environments run: absent, in the cluster previewd runs in; present, on one of the
    /// registered `PreviewCluster`s it selects, chosen when the environment is created and kept
    /// for its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Databases every environment gets: each its own branch of a baseline, on a
    /// `PreviewDatabaseServer` that admits this template's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<super::TemplateDatabase>,
}

/// Which registered clusters a template's environments may run on.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The clusters whose labels hold all of these (an empty map selects every cluster that
    /// admits the template's namespace).
    #[serde(default)]
    pub cluster_selector: BTreeMap<String, String>,
}

/// Secrets for each environment, applied with its first wave.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretsSpec {
    /// Secrets copied into the environment and kept equal to their source (read at every
    /// reconcile). The source must say it may be copied: its annotation
    /// `previewd.dev/copy-to-templates-in` lists the namespaces of the templates that may copy
    /// it (or `*`), so a template cannot hand out another team's Secret, nor by mistake its own
    /// webhook secret or forge token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy: Vec<CopiedSecret>,
    /// Secrets of random values, made once when the environment first needs them and kept
    /// unchanged for its life.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generate: Vec<GeneratedSecret>,
}

impl SecretsSpec {
    pub fn is_empty(&self) -> bool {
        self.copy.is_empty() && self.generate.is_empty()
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CopiedSecret {
    /// The source Secret's name.
    pub name: String,
    /// The source's namespace (default: the template's). previewd must be allowed to read
    /// Secrets there (the chart's `rbac.secretNamespaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name in the environment (default: the source's name).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "as")]
    pub target: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedSecret {
    /// The Secret's name in the environment.
    pub name: String,
    /// Its keys, each a random value of `length` letters and digits.
    pub keys: Vec<String>,
    /// Characters per value (16 to 128; default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u32>,
}

/// The content policy every rendered object is checked against before anything is applied.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// The Kubernetes Pod Security Standard every pod template must meet (`Baseline` by
    /// default; `Restricted` is stricter, `Privileged` checks nothing). The environment's
    /// namespace carries the matching `pod-security.kubernetes.io/enforce` label.
    #[serde(default)]
    pub pod_security: PodSecurityLevel,
    /// Service types allowed besides `ClusterIP` (`NodePort`, `LoadBalancer`, `ExternalName`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_service_types: Vec<String>,
    /// Allow `spec.externalIPs` on Services.
    #[serde(default)]
    pub allow_external_ips: bool,
    /// Ingress hosts allowed besides the environment's URL host and the names of its domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_ingress_hosts: Vec<String>,
    /// ClusterRoles a RoleBinding may refer to (by name); by default RoleBindings may refer to
    /// Roles of the environment's namespace only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_cluster_roles: Vec<String>,
    /// Let the template's NetworkPolicies allow peers outside the environment's namespace
    /// (`ipBlock`, `namespaceSelector`, rules without peers). Off by default: policies add up,
    /// so one such rule reopens what the guard rail's default-deny closed.
    #[serde(default)]
    pub allow_network_peers_outside: bool,
    /// The Ingress classes the template's Ingresses may name. Empty (the default): Ingresses
    /// name no class and the cluster's default class serves them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_class_names: Vec<String>,
    /// Volume types pods may use besides configMap, csi, downwardAPI, emptyDir, ephemeral,
    /// persistentVolumeClaim, projected and secret (e.g. `nfs`: the node mounts it for the pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_volume_types: Vec<String>,
    /// Let PersistentVolumeClaims (objects, StatefulSet claim templates, ephemeral volumes) bind
    /// existing PersistentVolumes: by `volumeName`, by `selector`, or with an empty
    /// `storageClassName` (another tenant's data, unless the volumes are meant for previews).
    #[serde(default)]
    pub allow_existing_volumes: bool,
    /// CSI drivers pods may use for inline `csi` volumes (the driver mounts with the node's
    /// identity; some mount network shares).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_csi_drivers: Vec<String>,
    /// PriorityClasses pods may name (a high one evicts other teams' pods).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_priority_classes: Vec<String>,
    /// RuntimeClasses pods may name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_runtime_classes: Vec<String>,
    /// Taint keys pods may tolerate, besides the `node.kubernetes.io/not-ready` and
    /// `unreachable` tolerations Kubernetes gives every pod. A toleration without a key (every
    /// taint) is never allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_toleration_keys: Vec<String>,
    /// Let PodDisruptionBudgets use `minAvailable` (which can block node drains for every team
    /// when it equals the replica count).
    #[serde(default)]
    pub allow_min_available: bool,
    /// Gateways of other namespaces that Gateway API routes may attach to, as `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_gateways: Vec<String>,
    /// cert-manager ClusterIssuers (or external issuers) Certificates may name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_cluster_issuers: Vec<String>,
    /// external-secrets ClusterSecretStores ExternalSecrets may read from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_cluster_secret_stores: Vec<String>,
}

/// What previewd says of a template itself (its environments say the rest).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreviewTemplateStatus {
    /// `WithinCeiling`: `False` while the template asks for more than the operator's ceiling
    /// (`--template-ceiling`), with every field beyond it named; `True` once it no longer does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<super::Condition>,
}

/// A Kubernetes Pod Security Standard level.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum PodSecurityLevel {
    Privileged,
    #[default]
    Baseline,
    Restricted,
}

impl PodSecurityLevel {
    /// The value of the `pod-security.kubernetes.io/enforce` label.
    pub fn label(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }
}

/// The forge a template's repository lives on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    #[default]
    Github,
    Gitlab,
}

impl ForgeKind {
    /// Every forge previewd speaks to (`forge::forges` has what each is).
    pub const ALL: [ForgeKind; 2] = [ForgeKind::Github, ForgeKind::Gitlab];

    /// As the spec writes it (`github`, `gitlab`): the `forge` label of the metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ForgeKind::Github => "github",
            ForgeKind::Gitlab => "gitlab",
        }
    }
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
    /// GitHub only: act as this GitHub App, installed on the repository, instead of with a
    /// token (installation tokens limited to the repository, renewed before they expire).
    /// Takes precedence over `tokenSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_app: Option<GithubApp>,
    /// Secret key holding the webhook secret (GitHub) or token (GitLab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret_ref: Option<SecretKeyRef>,
}

/// A GitHub App: its id and its private key.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GithubApp {
    /// The App's id (its settings page: *App ID*).
    pub app_id: u64,
    /// Secret key holding the App's private key, in the PEM form GitHub hands out.
    pub private_key_secret_ref: SecretKeyRef,
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
    /// Deploy a new commit only once CI reports these checks passed; until then the commit
    /// deployed before keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_checks: Option<WaitForChecks>,
    /// Deploy a new commit only when the push changed a file matching one of these globs
    /// (`src/**`, `charts/**`; `*` stays within a folder, `**` spans folders). Empty: any file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Changed files matching these globs do not count (`docs/**`, `**/*.md`): a push that
    /// changed only such files is not deployed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_paths: Vec<String>,
    /// PRs carrying this label get no environment (adding it removes the one they have).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_label: Option<String>,
}

/// Which CI results a new commit waits for, and how long.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitForChecks {
    /// Check names: on GitHub a check run's name, a commit status's context or a check suite's
    /// app (`github-actions`); on GitLab `pipeline` (the commit's pipeline) or a job's name.
    /// Empty: every check the forge reports for the commit, at least one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// How long to wait for the checks (`45m`; default `1h`). Then the commit is marked as
    /// timed out; a late success still deploys it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

impl Default for Triggers {
    fn default() -> Self {
        Self {
            pull_requests: true,
            branches: Vec::new(),
            required_label: None,
            draft_pull_requests: false,
            fork_policy: ForkPolicy::Deny,
            wait_for_checks: None,
            paths: Vec::new(),
            ignore_paths: Vec::new(),
            skip_label: None,
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
    /// Deny ingress from outside the namespace, and egress but for DNS, the namespace's own
    /// pods and `egress` (default on).
    #[serde(default = "default_true")]
    pub default_deny: bool,
    /// Namespace of the ingress controller, whose traffic is let in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_namespace: Option<String>,
    /// Egress allowed besides DNS and the namespace's own pods, as NetworkPolicy egress rules
    /// (`to`, `ports`), e.g. a shared database or the internet (`ipBlock`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub egress: Vec<serde_json::Value>,
    /// Where the cluster's DNS runs, as NetworkPolicy peers: the only place port 53 may go
    /// (a port-53 rule to any address is a tunnel out). Default: pods labelled
    /// `k8s-app: kube-dns` in `kube-system`, which is CoreDNS and kube-dns alike.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub dns_peers: Vec<serde_json::Value>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            default_deny: true,
            ingress_namespace: None,
            egress: Vec::new(),
            dns_peers: Vec::new(),
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
    /// A Helm chart, rendered by Helm itself (`helm template`) for each environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<HelmSource>,
    /// A Kustomize overlay from the repository, built by Kustomize itself (`kubectl
    /// kustomize`) for each environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kustomize: Option<KustomizeSource>,
}

/// A Kustomize overlay in the application's repository, and what previewd sets on top of it
/// (the environment's namespace always; the images and patches given here).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizeSource {
    /// The folder Kustomize builds (it holds `kustomization.yaml`), e.g.
    /// `deploy/overlays/preview`.
    pub path: String,
    /// The folder previewd reads from the repository at the head commit; `path` and every
    /// base, component and file its kustomizations use must be inside it (e.g. `deploy` for
    /// an overlay that uses `../../base`). Default: `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Images to set, as `kustomize edit set image` does. Every string is a template with the
    /// environment's facts: `newTag: "{{ sha }}"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<KustomizeImage>,
    /// Patches applied on top, as a kustomization's `patches`; `patch` is a template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<KustomizePatch>,
}

/// A Kustomize `images:` entry: the image `name` the manifests use, and what replaces it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizeImage {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A Kustomize `patches:` entry: a strategic-merge or JSON 6902 patch, and what it applies
/// to (by default, the object the patch names).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizePatch {
    pub patch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<KustomizeTarget>,
}

/// Which objects a Kustomize patch applies to.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizeTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_selector: Option<String>,
}

/// A Helm chart and the values it is rendered with.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HelmSource {
    /// Where the chart is.
    pub chart: ChartLocation,
    /// The release name Helm sees as `.Release.Name` (a template; default: the environment's
    /// name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,
    /// Values given to the chart (as a values file). Every string in it is a template with the
    /// environment's facts: `tag: "{{ sha }}"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "free_form_object")]
    pub values: BTreeMap<String, serde_json::Value>,
}

/// A chart in the application's repository (`path`), or a published one (`repository`,
/// `name`, `version`). Exactly one of `path` and `repository` is set.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChartLocation {
    /// The chart's folder in the repository, read at the environment's head commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A Helm repository URL (`https://charts.example.com`) or an OCI registry
    /// (`oci://registry.example.com/charts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// The chart's name in `repository`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The chart's exact version (required with `repository`, so that a new upload cannot
    /// change running environments unseen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
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
