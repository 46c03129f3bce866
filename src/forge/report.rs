//! Reporting to the forge: the one PR/MR comment, the commit status and the deployment of an
//! environment (a GitHub Deployment with its statuses; a GitLab environment with a deployment
//! per commit, stopped on removal), sent only when what they would say changed.
//!
//! What was last sent is kept in the environment's `status.forge` (comment id, SHA-256 of the
//! comment text and of the status triple), so an unchanged environment makes no forge call,
//! and a restart finds its comment again instead of making a second one. When the id is not
//! known yet (a status write was lost), the comment is looked up by its hidden marker first.
//!
//! A forge that fails never stops deploying: the caller writes the status anyway and retries
//! the report later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::client::{
    ApiDefaults, CommentAuthor, DeploymentState, ForgeApiError, ForgeClient, ForgeClients,
    TOKEN_BUDGET,
};
use super::comment::{self, CommentInput, CommentState, CommitState};
use super::github::app::AppTokens;
use super::gitlab::api::GitlabApi;
use crate::cluster::secrets::{SecretError, SecretReader};
use crate::forge::metrics::ForgeMetrics;
use crate::model::crd::{
    ForgeKind, ForgeReport, ForgeSpec, Phase, PreviewEnvironment, PreviewEnvironmentStatus,
    PreviewTemplate, WaitingCommit,
};
use crate::model::footprint::Prices;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("forge token: {0}")]
    Token(#[from] SecretError),
    #[error(transparent)]
    Forge(#[from] ForgeApiError),
}

impl ReportError {
    /// How long the forge client asked to wait before the next call, when that is why this
    /// report was not sent (a recent failure or a rate limit), rather than a refusal.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ReportError::Forge(ForgeApiError::BackingOff { wait, .. })
            | ReportError::Forge(ForgeApiError::RateLimited { wait, .. }) => Some(*wait),
            _ => None,
        }
    }

    /// Whether trying again later may succeed: the forge failed (5xx, no answer) or asked to
    /// wait. A refusal (4xx) or a missing token stays as it is until someone changes something.
    pub fn is_transient(&self) -> bool {
        match self {
            ReportError::Forge(ForgeApiError::Http { status, .. }) => *status >= 500,
            ReportError::Forge(ForgeApiError::Transport { .. }) => true,
            ReportError::Token(SecretError::Api { .. }) => true,
            other => other.retry_after().is_some(),
        }
    }
}

pub struct Reporter {
    clients: ForgeClients,
    /// Installation tokens of the templates that act as a GitHub App.
    app_tokens: AppTokens,
    secrets: Arc<SecretReader>,
    /// What was sent, by environment UID. The controller may reconcile from a cache that does
    /// not show the last status write yet; this record does, so a comment is never created
    /// twice within one process. After a restart the status (read fresh) has it.
    sent: Mutex<HashMap<String, ForgeReport>>,
    /// Write-access answers for comment commands, by (forge, API URL, repository, user), kept
    /// for [`ACCESS_TTL`]: a burst of commands costs one forge call, and a revoked permission
    /// stops working within a minute.
    access: Mutex<HashMap<AccessKey, (bool, std::time::Instant)>>,
    /// Where templates that name no API URL go ([`ApiDefaults`]).
    api_defaults: ApiDefaults,
    /// The operator's prices, for the footprint's cost in the comment (`--price-per-*`).
    prices: Option<Prices>,
}

/// (forge, API URL, repository in lower case, user).
type AccessKey = (ForgeKind, String, String, String);

/// How long a write-access answer is trusted.
pub const ACCESS_TTL: std::time::Duration = std::time::Duration::from_secs(60);

fn sha_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl Reporter {
    pub fn new(metrics: ForgeMetrics, secrets: Arc<SecretReader>) -> Self {
        Self {
            app_tokens: AppTokens::new(metrics.clone()),
            clients: ForgeClients::new(metrics),
            secrets,
            sent: Mutex::new(HashMap::new()),
            access: Mutex::new(HashMap::new()),
            api_defaults: ApiDefaults::default(),
            prices: None,
        }
    }

    /// Whether `user` may write to the template's repository (asked of the forge, cached for
    /// [`ACCESS_TTL`]). A template without a token cannot ask: `false`.
    pub async fn has_write_access(
        &self,
        template: &PreviewTemplate,
        user: &str,
        user_id: Option<u64>,
    ) -> Result<bool, ReportError> {
        let forge = &template.spec.forge;
        let key = (
            forge.kind,
            self.api_url(forge).unwrap_or_default().to_string(),
            forge.repository.to_lowercase(),
            user.to_string(),
        );
        if let Some((answer, at)) = self.access.lock().expect("access cache").get(&key)
            && at.elapsed() < ACCESS_TTL
        {
            return Ok(*answer);
        }
        let Some(client) = self.client(template).await? else {
            return Ok(false);
        };
        let answer = client
            .write_access(&forge.repository, user, user_id)
            .await?;
        let mut cache = self.access.lock().expect("access cache");
        cache.retain(|_, (_, at)| at.elapsed() < ACCESS_TTL);
        cache.insert(key, (answer, std::time::Instant::now()));
        Ok(answer)
    }

    /// This reporter, sending the calls of templates that name no API URL to `defaults`.
    pub fn with_api_defaults(self, defaults: ApiDefaults) -> Self {
        Self {
            api_defaults: defaults,
            ..self
        }
    }

    /// Shows the footprint's cost at `prices` in the comments.
    pub fn with_prices(self, prices: Option<Prices>) -> Self {
        Self { prices, ..self }
    }

    /// Where `forge`'s calls go: its own API URL, else this reporter's default for its kind
    /// (`None`: the public forge).
    fn api_url<'a>(&'a self, forge: &'a ForgeSpec) -> Option<&'a str> {
        self.api_defaults
            .resolve(forge.kind, forge.api_url.as_deref())
    }

    fn last_sent(&self, uid: &str) -> Option<ForgeReport> {
        self.sent.lock().expect("sent reports").get(uid).cloned()
    }

    /// The forge client of `template` (`None` when it names no token and no GitHub App).
    pub async fn client(
        &self,
        template: &PreviewTemplate,
    ) -> Result<Option<Arc<ForgeClient>>, ReportError> {
        let forge = &template.spec.forge;
        let namespace = template.namespace().unwrap_or_default();
        let (token, budget, author) = match (&forge.github_app, &forge.token_secret_ref) {
            (Some(app), _) if forge.kind == ForgeKind::Github => {
                let key = self
                    .secrets
                    .get(&namespace, &app.private_key_secret_ref)
                    .await?;
                let api_url = self.api_url(forge);
                let repository = &forge.repository;
                let minted = self.app_tokens.token(api_url, app.app_id, &key, repository);
                let minted = minted.await?;
                let budget = format!("installation-{}", minted.installation);
                let author = CommentAuthor::GithubApp(app.app_id);
                (minted.token.into_bytes(), budget, author)
            }
            (_, Some(reference)) => (
                self.secrets.get(&namespace, reference).await?,
                TOKEN_BUDGET.to_string(),
                CommentAuthor::Token,
            ),
            _ => return Ok(None),
        };
        let api_url = self.api_url(forge);
        let client = self
            .clients
            .get_as(forge.kind, api_url, &token, &budget, author);
        Ok(Some(client.await?))
    }

    /// Brings the forge in line with `status` (the status about to be written). Returns what
    /// was sent as the new `status.forge`; on error, the part that succeeded is in the record
    /// too, so nothing is sent twice.
    pub async fn report(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        status: &PreviewEnvironmentStatus,
    ) -> (Option<ForgeReport>, Result<(), ReportError>) {
        let uid = environment.uid().unwrap_or_default();
        let mut record = self
            .last_sent(&uid)
            .or(status.forge.clone())
            .unwrap_or_default();
        let result = self.send(environment, template, status, &mut record).await;
        self.sent
            .lock()
            .expect("sent reports")
            .insert(uid, record.clone());
        let record = (record != ForgeReport::default()).then_some(record);
        (record, result)
    }

    async fn send(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        status: &PreviewEnvironmentStatus,
        record: &mut ForgeReport,
    ) -> Result<(), ReportError> {
        let Some(client) = self.client(template).await? else {
            return Ok(());
        };
        let source = &environment.spec.source;
        let id = format!(
            "{}/{}",
            environment.namespace().unwrap_or_default(),
            environment.name_any()
        );
        if let Some(number) = source.pull_request {
            let text = comment::render(&CommentInput {
                environment: &id,
                head_sha: &source.head_sha,
                state: CommentState::Live(status),
                expires_at: crate::model::clock::expires_at(environment, template),
                last_command: crate::model::metadata::last_command_reply(environment),
                prices: self.prices.as_ref(),
            });
            upsert_comment(&client, &source.repository, number, &id, &text, record).await?;
        }
        let context_name = format!("previewd/{}", template.name_any());
        if let Some(waiting) = &status.waiting {
            report_waiting(&client, &source.repository, waiting, &context_name, record).await?;
            if waiting.sha == source.head_sha {
                // Nothing of this commit runs: no deployment, no status of a deploy.
                return Ok(());
            }
        }
        let url = status.url.clone().unwrap_or_default();
        let state = comment::commit_state(status.phase);
        let status_sha = sha_hex(&format!("{state:?} {} {url}", source.head_sha));
        if record.status_sha.as_deref() == Some(status_sha.as_str()) {
            return Ok(());
        }
        let description = describe(status);
        let deployment_state = match state {
            CommitState::Success => DeploymentState::Success,
            CommitState::Failure => DeploymentState::Failure,
            CommitState::Pending | CommitState::Running => DeploymentState::InProgress,
        };
        match client.as_ref() {
            ForgeClient::Github(github) => {
                if record.deployment_sha.as_deref() != Some(source.head_sha.as_str()) {
                    let deployment = github
                        .create_deployment(
                            &source.repository,
                            &source.head_sha,
                            &environment.name_any(),
                        )
                        .await?;
                    record.deployment_id = Some(deployment);
                    record.deployment_sha = Some(source.head_sha.clone());
                }
                if let Some(deployment) = record.deployment_id {
                    github
                        .deployment_status(&source.repository, deployment, deployment_state, &url)
                        .await?;
                }
            }
            ForgeClient::Gitlab(gitlab) => {
                let deploy = GitlabDeploy {
                    environment,
                    url: &url,
                    state: deployment_state,
                };
                report_gitlab_deployment(gitlab, &deploy, record).await?;
            }
        }
        client
            .commit_status(
                &source.repository,
                &source.head_sha,
                state,
                &context_name,
                &url,
                &description,
            )
            .await?;
        record.status_sha = Some(status_sha);
        Ok(())
    }

    /// The environment is gone: the comment says so and the GitHub deployment goes inactive
    /// (GitLab: the environment stops). Returns what was sent as the new `status.forge`, with
    /// `destroyed` set once all of it was; nothing is sent again after that. The record stays
    /// in memory until [`Reporter::forget`].
    pub async fn report_destroyed(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        reason: &str,
    ) -> (ForgeReport, Result<(), ReportError>) {
        let uid = environment.uid().unwrap_or_default();
        let mut record = self
            .last_sent(&uid)
            .or(environment.status.as_ref().and_then(|s| s.forge.clone()))
            .unwrap_or_default();
        if record.destroyed {
            return (record, Ok(()));
        }
        let result = self
            .send_destroyed(environment, template, reason, &mut record)
            .await;
        // A refusal (a 4xx, a missing token) would be refused again: it is not retried.
        record.destroyed = result
            .as_ref()
            .map_or_else(|e| !e.is_transient(), |()| true);
        self.sent
            .lock()
            .expect("sent reports")
            .insert(uid, record.clone());
        (record, result)
    }

    /// Drops what was sent for a removed environment: the map must not keep every environment
    /// that ever lived.
    pub fn forget(&self, environment: &PreviewEnvironment) {
        let uid = environment.uid().unwrap_or_default();
        self.sent.lock().expect("sent reports").remove(&uid);
    }

    async fn send_destroyed(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        reason: &str,
        record: &mut ForgeReport,
    ) -> Result<(), ReportError> {
        let Some(client) = self.client(template).await? else {
            return Ok(());
        };
        let source = &environment.spec.source;
        if let Some(number) = source.pull_request {
            let id = format!(
                "{}/{}",
                environment.namespace().unwrap_or_default(),
                environment.name_any()
            );
            let text = comment::render(&CommentInput {
                environment: &id,
                head_sha: &source.head_sha,
                state: CommentState::Destroyed { reason },
                expires_at: None,
                last_command: None,
                prices: None,
            });
            upsert_comment(&client, &source.repository, number, &id, &text, record).await?;
        }
        match (client.as_ref(), record.deployment_id, record.environment_id) {
            (ForgeClient::Github(github), Some(deployment), _) => {
                github
                    .deployment_status(
                        &source.repository,
                        deployment,
                        DeploymentState::Inactive,
                        "",
                    )
                    .await?;
            }
            (ForgeClient::Gitlab(gitlab), _, Some(id)) => {
                gitlab.stop_environment(&source.repository, id).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The GitLab environment of a preview environment: `preview/<namespace>/<name>`. GitLab folds
/// the environments under `preview/` into one folder of its Environments page; the namespace
/// keeps two teams' templates of the same name for one project (each in its own namespace)
/// from sharing, and stopping, each other's GitLab environment.
pub fn gitlab_environment_name(environment: &PreviewEnvironment) -> String {
    let namespace = environment.namespace().unwrap_or_default();
    format!("preview/{namespace}/{}", environment.name_any())
}

/// What a GitLab deployment report says: which environment, its URL, the deployment's state.
struct GitlabDeploy<'a> {
    environment: &'a PreviewEnvironment,
    url: &'a str,
    state: DeploymentState,
}

/// Registers the environment in GitLab (once; its external URL when it changes) and keeps one
/// deployment per head commit, so the merge request widget shows *View app*. A new deployment
/// starts as `running` and then goes to `success` or `failed`; GitLab allows no way back to
/// `running`, so a later `InProgress` is not sent to a deployment that finished.
async fn report_gitlab_deployment(
    gitlab: &GitlabApi,
    deploy: &GitlabDeploy<'_>,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    let source = &deploy.environment.spec.source;
    let project = &source.repository;
    let name = gitlab_environment_name(deploy.environment);
    let url = deploy.url;
    match record.environment_id {
        None => {
            record.environment_id = Some(gitlab.environment(project, &name, url).await?);
            record.environment_url = Some(url.to_string());
        }
        Some(id) if !url.is_empty() && record.environment_url.as_deref() != Some(url) => {
            gitlab.environment_url(project, id, url).await?;
            record.environment_url = Some(url.to_string());
        }
        Some(_) => {}
    }
    let state = format!("{:?}", deploy.state);
    if record.deployment_sha.as_deref() != Some(source.head_sha.as_str()) {
        let id = gitlab
            .create_deployment(
                project,
                &name,
                &source.head_sha,
                &source.branch,
                deploy.state,
            )
            .await?;
        record.deployment_id = Some(id);
        record.deployment_sha = Some(source.head_sha.clone());
        record.deployment_state = Some(state);
        return Ok(());
    }
    let finished = deploy.state != DeploymentState::InProgress;
    if let Some(id) = record.deployment_id
        && finished
        && record.deployment_state.as_deref() != Some(state.as_str())
    {
        gitlab.deployment_status(project, id, deploy.state).await?;
        record.deployment_state = Some(state);
    }
    Ok(())
}

/// The commit status of a held-back head: pending while it waits, failed when its checks
/// failed or timed out, success when it is skipped, with the reason as the description.
async fn report_waiting(
    client: &ForgeClient,
    repository: &str,
    waiting: &WaitingCommit,
    context_name: &str,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    let state = match (waiting.failed(), waiting.skipped()) {
        (true, _) => CommitState::Failure,
        // Nothing to wait for: a required `previewd/<template>` status must not block merging.
        (false, true) => CommitState::Success,
        (false, false) => CommitState::Pending,
    };
    let description: String = waiting.message.chars().take(140).collect();
    let sent = sha_hex(&format!("{state:?} {} {description}", waiting.sha));
    if record.waiting_status_sha.as_deref() == Some(sent.as_str()) {
        return Ok(());
    }
    client
        .commit_status(
            repository,
            &waiting.sha,
            state,
            context_name,
            "",
            &description,
        )
        .await?;
    record.waiting_status_sha = Some(sent);
    Ok(())
}

/// Edits the environment's comment (found by id, else by marker) or creates it.
async fn upsert_comment(
    client: &ForgeClient,
    repository: &str,
    number: u64,
    environment: &str,
    text: &str,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    let text_sha = sha_hex(text);
    if record.comment_sha.as_deref() == Some(text_sha.as_str()) {
        return Ok(());
    }
    let existing = match record.comment_id {
        Some(id) => Some(id),
        None => {
            client
                .find_comment(repository, number, &comment::marker(environment))
                .await?
        }
    };
    let id = match existing {
        Some(id) => {
            client.edit_comment(repository, number, id, text).await?;
            id
        }
        None => client.create_comment(repository, number, text).await?,
    };
    record.comment_id = Some(id);
    record.comment_sha = Some(text_sha);
    Ok(())
}

/// One line for the commit status (forges cap it at 140 characters).
fn describe(status: &PreviewEnvironmentStatus) -> String {
    let text = match status.phase {
        Phase::Ready => "Preview environment ready".to_string(),
        Phase::Degraded => {
            let why = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.message.as_str())
                .unwrap_or("");
            format!("Preview environment degraded: {why}")
        }
        phase => format!("Preview environment: {phase:?}"),
    };
    text.chars().take(140).collect()
}
