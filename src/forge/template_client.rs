//! The forge client a template acts through: its token (`forge.tokenSecretRef`) or its GitHub
//! App's installation token, at its API URL (or the operator's default for its kind). The
//! reporter, the sweep, the repository reader and the comment commands all get their client
//! here, so a template's credentials are read in one place.

use std::sync::Arc;

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::client::TOKEN_BUDGET;
use super::client::{ApiDefaults, CommentAuthor, ForgeApiError, ForgeClient, ForgeClients};
use super::github::app::AppTokens;
use super::metrics::ForgeMetrics;
use crate::cluster::secrets::{SecretError, SecretReader};
use crate::model::crd::{ForgeKind, ForgeSpec, PreviewTemplate};

/// Why a call to a template's forge did not happen or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForgeCallError {
    #[error("forge token: {0}")]
    Token(#[from] SecretError),
    #[error(transparent)]
    Forge(#[from] ForgeApiError),
}

impl ForgeCallError {
    /// How long the forge client asked to wait before the next call, when that is why this
    /// call was not sent (a recent failure or a rate limit), rather than a refusal.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ForgeCallError::Forge(ForgeApiError::BackingOff { wait, .. })
            | ForgeCallError::Forge(ForgeApiError::RateLimited { wait, .. })
            | ForgeCallError::Forge(ForgeApiError::ContentBudget { wait }) => Some(*wait),
            _ => None,
        }
    }

    /// How long a report waits for its turn in the content budget, when that is why it was
    /// not sent: not a failure, nothing to warn about.
    pub fn waits_for_budget(&self) -> Option<std::time::Duration> {
        match self {
            ForgeCallError::Forge(ForgeApiError::ContentBudget { wait }) => Some(*wait),
            _ => None,
        }
    }

    /// Whether trying again later may succeed: the forge failed (5xx, no answer) or asked to
    /// wait, or the API server could not give the token. A refusal (4xx) or a missing token
    /// stays as it is until someone changes something.
    pub fn is_transient(&self) -> bool {
        match self {
            ForgeCallError::Forge(ForgeApiError::Http { status, .. }) => *status >= 500,
            ForgeCallError::Forge(ForgeApiError::Transport { .. }) => true,
            ForgeCallError::Token(SecretError::Api { .. }) => true,
            other => other.retry_after().is_some(),
        }
    }
}

/// Builds (and keeps, through [`ForgeClients`]) the forge client of each template.
pub struct TemplateClients {
    clients: ForgeClients,
    /// Installation tokens of the templates that act as a GitHub App.
    app_tokens: AppTokens,
    secrets: Arc<SecretReader>,
    /// Where templates that name no API URL go ([`ApiDefaults`]).
    api_defaults: ApiDefaults,
    metrics: ForgeMetrics,
}

impl TemplateClients {
    pub fn new(metrics: ForgeMetrics, secrets: Arc<SecretReader>) -> Self {
        Self {
            app_tokens: AppTokens::new(metrics.clone()),
            clients: ForgeClients::new(metrics.clone()),
            secrets,
            api_defaults: ApiDefaults::default(),
            metrics,
        }
    }

    /// These clients, sending the calls of templates that name no API URL to `defaults`.
    pub fn with_api_defaults(self, defaults: ApiDefaults) -> Self {
        Self {
            api_defaults: defaults,
            ..self
        }
    }

    /// Where `forge`'s calls go: its own API URL, else the default for its kind (`None`: the
    /// public forge).
    pub fn api_url<'a>(&'a self, forge: &'a ForgeSpec) -> Option<&'a str> {
        self.api_defaults
            .resolve(forge.kind, forge.api_url.as_deref())
    }

    /// The forge client of `template` (`None` when it names no token and no GitHub App).
    pub async fn client(
        &self,
        template: &PreviewTemplate,
    ) -> Result<Option<Arc<ForgeClient>>, ForgeCallError> {
        let client = self.client_with_budget(template).await?;
        Ok(client.map(|(client, _)| client))
    }

    /// The forge client of `template`, with the key of the content budget it spends
    /// ([`crate::forge::budget`]): the App installation's or the token's on GitHub (GitHub
    /// counts per installation or user), the token's on GitLab (GitLab counts per user).
    pub async fn client_with_budget(
        &self,
        template: &PreviewTemplate,
    ) -> Result<Option<(Arc<ForgeClient>, String)>, ForgeCallError> {
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
        // GitHub counts an App's requests per installation, and a token's per user (two
        // tokens of one user are two budgets here: keep previewd's tokens to one each); GitLab
        // counts per user too, so one team's token never waits for, or is paused by, another's.
        let content_budget = match author {
            CommentAuthor::GithubApp(_) => budget.clone(),
            CommentAuthor::Token => format!("token {}", hex::encode(Sha256::digest(&token))),
        };
        let origin = match api_url.map(|url| url.trim_end_matches('/')) {
            None | Some("https://api.github.com" | "https://gitlab.com") => "public",
            Some(url) => url,
        };
        let content_budget = format!("{:?} {origin} {content_budget}", forge.kind);
        let client = self
            .clients
            .get_as(forge.kind, api_url, &token, &budget, author);
        Ok(Some((client.await?, content_budget)))
    }

    /// The metrics the clients count into.
    pub fn metrics(&self) -> &ForgeMetrics {
        &self.metrics
    }
}
