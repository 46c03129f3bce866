//! `PreviewEnvironment`: one per branch or pull request, written by previewd's webhook intake
//! (or by hand). Its spec is the durable record of what should run; its status says what does.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// CI results reported by the forge, by check name (a check run, commit status context,
    /// check suite's app, GitLab `pipeline` or job). Written by the webhook intake for the
    /// templates that wait for checks (`triggers.waitForChecks`); only entries whose `sha` is
    /// the head commit count.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, CheckRecord>,
    /// Set by `/preview deploy`: this head commit deploys without waiting for its checks (or
    /// despite a skip). A new push waits again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_without_checks: Option<String>,
    /// A head commit that is not to be deployed, and why: `[skip preview]` in its message, or
    /// a push that changed only files the template's `paths`/`ignorePaths` leave out. Written
    /// by the webhook intake from the delivery; the commit deployed before keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<SkippedCommit>,
}

/// A commit previewd does not deploy, and why (a sentence part: `only docs/ changed`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SkippedCommit {
    pub sha: String,
    pub reason: String,
}

/// One CI result for one commit.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckRecord {
    /// The commit the result is for.
    pub sha: String,
    pub state: CheckState,
}

/// Where a check stands, in the three states previewd acts on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum CheckState {
    /// Queued or running: the commit waits.
    #[default]
    Pending,
    /// Passed (GitHub's `neutral` and `skipped` count as passed, as in branch protection).
    Success,
    /// Failed, errored, cancelled or timed out: the commit is not deployed.
    Failure,
}

/// The message of the API server's refusal of a source older than the stored one (the rule
/// below); the intake reads an apply refused with it as a delivery out of order.
pub const OLDER_SOURCE_MESSAGE: &str =
    "spec.source is older than the environment's (changedAt): deliveries arrived out of order";

/// What an environment deploys. The API server keeps its order itself: a write whose
/// `changedAt` is older than the stored one is refused (a CEL transition rule), so that the
/// intake's apply needs no `resourceVersion` precondition, which every status write of the
/// controller would break (issue 58: 1,664 applies for 1,000 new heads with it).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(oldSelf.changedAt) || !has(self.changedAt) || timestamp(self.changedAt) >= timestamp(oldSelf.changedAt)",
    "message": OLDER_SOURCE_MESSAGE
}]))]
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

impl PreviewEnvironment {
    /// Creation time, then namespace and name: a total order, the same in every replica. Of
    /// two environments that claim one URL host, the older holds it (the reconcile's host
    /// claims and the wake gate both go by it).
    pub fn age(&self) -> (Option<i64>, Option<&str>, Option<&str>) {
        let meta = &self.metadata;
        (
            meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
            meta.namespace.as_deref(),
            meta.name.as_deref(),
        )
    }
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
    /// The registered cluster it runs on (its template has a `placement`), and whether that
    /// cluster answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterOfEnvironment>,
    /// The namespace the environment runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Where developers open it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The URL host this environment holds: no other environment may route it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The other Ingress hosts it holds (those its template's `policy.allowedIngressHosts`
    /// lists and its Ingresses route), claimed like the URL host: one environment each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_hosts: Vec<String>,
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
    /// The environment's databases (`spec.databases` of its template).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<super::DatabaseStatus>,
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
    /// The head commit, while it is not deployed: it waits for a maintainer's approval or for
    /// its checks (or they failed). The commit deployed before it, if any, keeps running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingCommit>,
    /// Since when the environment has been waking (it was `Sleeping` and was woken by a
    /// request, a push or `/preview wake`); cleared once it is `Ready` again. While it is set,
    /// and previewd's wake gate answers for sleeping hosts, its routes come back last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waking_since: Option<DateTime<Utc>>,
    /// Seconds the last wake took, from being woken to `Ready`: the waiting page's estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_wake_seconds: Option<f64>,
    /// What the environment's pods request while awake, and how long it has been awake and
    /// asleep (see `model::footprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footprint: Option<Footprint>,
    /// The commit whose render ran a render worker or an engine out of memory or output, with
    /// the template generation it was rendered with: no replica renders it again until the
    /// commit, the template or the memory limit changes (the previous commit keeps running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
}

/// An input that exhausted a render worker or an engine, remembered where every replica and
/// every restart sees it: the environment's status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    /// The head commit rendered.
    pub commit: String,
    /// The template's `metadata.generation` it was rendered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_generation: Option<i64>,
    /// The engines' memory limit it was rendered under (`--render-memory-limit`, bytes):
    /// raising it renders the commit again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// What the render said.
    pub message: String,
    pub since: DateTime<Utc>,
}

/// An environment's footprint: the CPU and memory its pods request while awake, and its
/// awake and asleep time in stretches. The totals are those of the stretches before `since`;
/// the current stretch (awake, or asleep) runs from `since`. Written only when a stretch ends
/// (the environment falls asleep or wakes, its requests change) and otherwise once every 24 to
/// 48 hours (spread by name), so that a footprint costs almost no write of its own.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Footprint {
    /// CPU its pods request while awake, in millicores.
    pub cpu_millicores: u64,
    /// Memory its pods request while awake, in bytes.
    pub memory_bytes: u64,
    /// Whether the current stretch is asleep.
    #[serde(default)]
    pub asleep: bool,
    /// When the current stretch began.
    pub since: DateTime<Utc>,
    /// Seconds awake, and asleep, before `since`.
    #[serde(default)]
    pub awake_seconds: u64,
    #[serde(default)]
    pub asleep_seconds: u64,
    /// Core-hours and GiB-hours requested while awake before `since` (cost: times the prices).
    #[serde(default)]
    pub core_hours: f64,
    #[serde(default)]
    pub gib_hours: f64,
    /// Core-hours and GiB-hours sleeping spared before `since` (the awake requests, asleep).
    #[serde(default)]
    pub saved_core_hours: f64,
    #[serde(default)]
    pub saved_gib_hours: f64,
}

impl PreviewEnvironmentStatus {
    /// Whether commit `sha` was deployed, or its deploy has begun (its objects were applied):
    /// from then on it is not held back again, even if a check is re-run.
    pub fn has_started(&self, sha: &str) -> bool {
        let started = |known: Option<&str>| known.is_some_and(|k| k.eq_ignore_ascii_case(sha));
        started(self.deployed_sha.as_deref())
            || started(self.timings.as_ref().map(|t| t.sha.as_str()))
    }

    /// Since when commit `sha` has been held back, if it is.
    pub fn waiting_since(&self, sha: &str) -> Option<DateTime<Utc>> {
        self.waiting
            .as_ref()
            .filter(|w| w.sha == sha)
            .map(|w| w.since)
    }
}

/// A head commit that is held back, and why.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitingCommit {
    pub sha: String,
    /// `AwaitingApproval`, `ForkNotAllowed`, `AwaitingChecks`, `ChecksFailed`,
    /// `ChecksTimedOut` or `Skipped`.
    #[schemars(with = "String")]
    pub reason: WaitingReason,
    /// A sentence for people: what it waits for, or what failed.
    pub message: String,
    /// When previewd first held this commit back (the checks' timeout counts from here).
    pub since: DateTime<Utc>,
}

impl WaitingCommit {
    /// Whether its checks failed or timed out: it stays held back until a new push, a new
    /// result or `/preview deploy`, and its commit status says failure.
    pub fn failed(&self) -> bool {
        matches!(
            self.reason,
            WaitingReason::ChecksFailed | WaitingReason::ChecksTimedOut
        )
    }

    /// Whether it is not to be deployed at all (`[skip preview]`, path filters): its commit
    /// status says success, and the comment says no preview.
    pub fn skipped(&self) -> bool {
        self.reason == WaitingReason::Skipped
    }
}

/// Why a head commit is held back. Written as its name (`status.waiting.reason`, and the
/// `Ready` condition's reason), so the CRD says `string` as it did before this was a type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum WaitingReason {
    /// A fork's commit waits for `/preview approve`.
    #[default]
    AwaitingApproval,
    /// The template does not deploy forks.
    ForkNotAllowed,
    AwaitingChecks,
    ChecksFailed,
    ChecksTimedOut,
    /// `[skip preview]` or path filters: nothing to deploy.
    Skipped,
}

impl WaitingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingReason::AwaitingApproval => "AwaitingApproval",
            WaitingReason::ForkNotAllowed => "ForkNotAllowed",
            WaitingReason::AwaitingChecks => "AwaitingChecks",
            WaitingReason::ChecksFailed => "ChecksFailed",
            WaitingReason::ChecksTimedOut => "ChecksTimedOut",
            WaitingReason::Skipped => "Skipped",
        }
    }
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
    /// The forge's Deployment of the head SHA (a GitHub Deployment, a GitLab deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<u64>,
    /// The head SHA that Deployment is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_sha: Option<String>,
    /// The last state sent for that GitLab deployment (`InProgress`, `Success`, `Failure`):
    /// GitLab lets a deployment go from running to success or failure, never back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_state: Option<String>,
    /// The GitLab environment (`preview/<namespace>/<environment>`) the deployments go to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<u64>,
    /// The external URL last given to that GitLab environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_url: Option<String>,
    /// SHA-256 of the last commit/deployment status sent (state, head SHA, URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_sha: Option<String>,
    /// SHA-256 of the last commit status sent for a held-back head (state, SHA, message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_status_sha: Option<String>,
    /// The forge has been told the environment is gone (the comment says destroyed, the
    /// deployment is inactive or the GitLab environment stopped), or refused to hear it (a
    /// 4xx, a missing token: asking again would not help). Until then, a deleted environment
    /// tells it again: a process killed or a forge failing mid-removal must not leave a
    /// comment that shows a deleted environment as live.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destroyed: bool,
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

/// The cluster an environment was placed on, as its status says.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOfEnvironment {
    /// The `PreviewCluster`'s name.
    pub name: String,
    /// Whether its API server answers; while it does not, the environment is kept as it was
    /// last seen, and the rest of this status is that last sight.
    #[serde(default)]
    pub reachable: bool,
    /// Since when it has not answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<DateTime<Utc>>,
}
