//! One [`ForgeClient`] for either forge, with the few calls previewd makes (find, create and
//! edit its comment, commit status, repository files, write access, the sweep's lists), and
//! [`ForgeClients`], which keeps one client per forge URL and token. The calls themselves are
//! in `github/api.rs` and `gitlab/api.rs`; what every call shares is in `transport.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::blobs::BlobCache;
use super::comment::CommitState;
use super::github::api::GithubApi;
use super::gitlab::api::GitlabApi;
use super::limits::check_manifest_total;
use super::limits::check_total;
pub use super::limits::{MAX_MANIFEST_BYTES, MAX_MANIFEST_FILE_BYTES, MAX_MANIFEST_FILES};
use super::metrics::ForgeMetrics;
pub use super::transport::{FORGE_TIMEOUT, ForgeApiError, MAX_RATE_LIMIT_WAIT};
pub use super::vocabulary::{CommentAuthor, DeploymentState};
use crate::model::crd::ForgeKind;

/// A client for one forge API URL and token.
pub enum ForgeClient {
    Github(GithubApi),
    Gitlab(GitlabApi),
}

impl ForgeClient {
    /// Whose reads this client makes: the forge, API URL and token it was built for
    /// ([`ForgeClients`]), or a scope of its own. What it read is kept for that scope only.
    pub fn scope(&self) -> &str {
        match self {
            ForgeClient::Github(api) => api.scope(),
            ForgeClient::Gitlab(api) => api.scope(),
        }
    }
}

impl ForgeClient {
    /// The id of previewd's own comment on PR/MR `number` whose text starts with `marker`
    /// (a copy of the marker in anyone else's comment is not previewd's comment).
    pub async fn find_comment(
        &self,
        repository: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.find_comment(repository, number, marker).await,
            ForgeClient::Gitlab(api) => api.find_comment(repository, number, marker).await,
        }
    }

    pub async fn create_comment(
        &self,
        repository: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.create_comment(repository, number, body).await,
            ForgeClient::Gitlab(api) => api.create_comment(repository, number, body).await,
        }
    }

    pub async fn edit_comment(
        &self,
        repository: &str,
        number: u64,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.edit_comment(repository, id, body).await,
            ForgeClient::Gitlab(api) => api.edit_comment(repository, number, id, body).await,
        }
    }

    /// The YAML files (`.yaml`, `.yml`) directly in folder `path` of the repository at commit
    /// `sha`, as (file name, text), sorted by name; `path` may also name one file. The files are
    /// code from the pull request: more than [`MAX_MANIFEST_FILES`] files, a file over
    /// [`MAX_MANIFEST_FILE_BYTES`] or more than [`MAX_MANIFEST_BYTES`] in all are refused
    /// ([`ForgeApiError::ManifestsTooLarge`]), by the listing where the forge gives sizes.
    pub async fn read_manifests(
        &self,
        repository: &str,
        path: &str,
        sha: &str,
        reader: &str,
    ) -> Result<Vec<(String, String)>, ForgeApiError> {
        let mut files = match self {
            ForgeClient::Github(api) => api.read_manifests(repository, path, sha, reader).await?,
            ForgeClient::Gitlab(api) => api.read_manifests(repository, path, sha, reader).await?,
        };
        check_manifest_total(path, &files)?;
        files.sort();
        Ok(files)
    }

    /// Every file under folder `path` (a chart, an overlay) at commit `sha`, as (path relative
    /// to the folder, bytes), sorted by path, within the same limits as
    /// [`ForgeClient::read_manifests`] (counting every file, not only YAML).
    pub async fn read_folder(
        &self,
        repository: &str,
        path: &str,
        sha: &str,
        reader: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError> {
        let mut files = match self {
            ForgeClient::Github(api) => api.read_folder(repository, path, sha, reader).await?,
            ForgeClient::Gitlab(api) => api.read_folder(repository, path, sha, reader).await?,
        };
        let total: usize = files.iter().map(|(_, bytes)| bytes.len()).sum();
        check_total(path, total)?;
        files.sort();
        Ok(files)
    }

    /// Numbers of the open pull/merge requests of `repository` (one list call per page).
    pub async fn open_pull_requests(
        &self,
        repository: &str,
    ) -> Result<HashSet<u64>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                let pages = api
                    .list_all(
                        "list_pull_requests",
                        &format!("/repos/{repository}/pulls?state=open"),
                        &["number"],
                    )
                    .await?;
                Ok(pages
                    .iter()
                    .filter_map(|pr| pr["number"].as_u64())
                    .collect())
            }
            ForgeClient::Gitlab(api) => api.open_merge_requests(repository).await,
        }
    }

    /// Names of the branches of `repository` (one list call per page).
    pub async fn branches(&self, repository: &str) -> Result<HashSet<String>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                let pages = api
                    .list_all(
                        "list_branches",
                        &format!("/repos/{repository}/branches"),
                        &["name"],
                    )
                    .await?;
                Ok(pages
                    .iter()
                    .filter_map(|b| b["name"].as_str().map(str::to_string))
                    .collect())
            }
            ForgeClient::Gitlab(api) => api.branches(repository).await,
        }
    }

    /// Whether `user` (GitLab: the user with id `user_id`) may write to `repository`: GitHub
    /// `write`, `maintain` or `admin`; GitLab Developer (30) or above. Not a member: `false`.
    pub async fn write_access(
        &self,
        repository: &str,
        user: &str,
        user_id: Option<u64>,
    ) -> Result<bool, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.write_access(repository, user).await,
            ForgeClient::Gitlab(api) => match user_id {
                Some(id) => api.write_access(repository, id).await,
                None => Ok(false),
            },
        }
    }

    pub async fn commit_status(
        &self,
        repository: &str,
        sha: &str,
        state: CommitState,
        context: &str,
        target_url: &str,
        description: &str,
    ) -> Result<(), ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                api.commit_status(repository, sha, state, context, target_url, description)
                    .await
            }
            ForgeClient::Gitlab(api) => {
                api.commit_status(repository, sha, state, context, target_url, description)
                    .await
            }
        }
    }
}

type ClientKey = (ForgeKind, String, [u8; 32]);

/// Where a template that names no `forge.apiUrl` sends its calls, per forge: the public forge
/// unless set. Only the sandbox sets it (to its forge stand-in), so that the example templates,
/// written for GitHub, work there unchanged; a template's own `apiUrl` always wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiDefaults {
    pub github: Option<String>,
    pub gitlab: Option<String>,
}

impl ApiDefaults {
    /// The API URL of a template of forge `kind` whose own is `named`.
    pub fn resolve<'a>(&'a self, kind: ForgeKind, named: Option<&'a str>) -> Option<&'a str> {
        let default = match kind {
            ForgeKind::Github => self.github.as_deref(),
            ForgeKind::Gitlab => self.gitlab.as_deref(),
        };
        named.or(default)
    }
}

/// The rate-limit budget of a personal or project token (the label of
/// `previewd_forge_rate_limit_remaining`).
pub const TOKEN_BUDGET: &str = "token";

/// Clients by (forge, API URL, token), built on first use and kept: their gates and connection
/// pools must outlive one reconcile.
pub struct ForgeClients {
    metrics: ForgeMetrics,
    clients: tokio::sync::Mutex<HashMap<ClientKey, Arc<ForgeClient>>>,
    /// Repository files by blob id, for every client: they outlive a rotated token.
    blobs: Arc<BlobCache>,
}

impl ForgeClients {
    pub fn new(metrics: ForgeMetrics) -> Self {
        Self {
            metrics,
            clients: tokio::sync::Mutex::new(HashMap::new()),
            blobs: Arc::default(),
        }
    }

    /// The client of a user's `token` at `api_url`; `budget` names whose rate limit it spends
    /// ([`TOKEN_BUDGET`]).
    pub async fn get(
        &self,
        kind: ForgeKind,
        api_url: Option<&str>,
        token: &[u8],
        budget: &str,
    ) -> Result<Arc<ForgeClient>, ForgeApiError> {
        self.get_as(kind, api_url, token, budget, CommentAuthor::Token)
            .await
    }

    /// The client of `token` at `api_url`, commenting as `author`; `budget` names whose rate
    /// limit it spends ([`TOKEN_BUDGET`], or `installation-<id>` for a GitHub App's
    /// installation token).
    pub async fn get_as(
        &self,
        kind: ForgeKind,
        api_url: Option<&str>,
        token: &[u8],
        budget: &str,
        author: CommentAuthor,
    ) -> Result<Arc<ForgeClient>, ForgeApiError> {
        let key = (
            kind,
            api_url.unwrap_or_default().to_string(),
            Sha256::digest(token).into(),
        );
        let mut clients = self.clients.lock().await;
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        if let Some(api_url) = api_url {
            super::transport::check_api_url(api_url)?;
        }
        let token = String::from_utf8_lossy(token).into_owned();
        // Readings are kept per scope: the same forge, URL and token read the same content.
        let scope = format!("{kind:?} {} {}", key.1, hex::encode(key.2));
        let client = Arc::new(match kind {
            ForgeKind::Github => {
                let budget = budget.to_string();
                let api = GithubApi::new(api_url, token, budget, self.metrics.clone())?;
                let api = api
                    .commenting_as(author)
                    .keeping_blobs_in(self.blobs.clone());
                ForgeClient::Github(api.scoped(scope))
            }
            ForgeKind::Gitlab => {
                let api = GitlabApi::connect(api_url, token, self.metrics.clone()).await?;
                ForgeClient::Gitlab(api.keeping_blobs_in(self.blobs.clone()).scoped(scope))
            }
        });
        if clients.len() >= MAX_CLIENTS {
            // Rotated tokens and edited URLs leave clients nobody asks for again; any one may
            // go (a client in use stays alive through its Arc, and is rebuilt when asked).
            if let Some(evicted) = clients.keys().next().cloned() {
                clients.remove(&evicted);
            }
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// How many clients are kept.
    pub async fn kept(&self) -> usize {
        self.clients.lock().await.len()
    }
}

/// The most forge clients kept: one per (forge, URL, token) in use, with room for rotations.
pub const MAX_CLIENTS: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotated_tokens_do_not_grow_the_client_map_without_bound() {
        let clients = ForgeClients::new(ForgeMetrics::default());
        let mut newest = None;
        for rotation in 0..(MAX_CLIENTS + 50) {
            let token = format!("token-{rotation}");
            newest = Some(
                clients
                    .get(ForgeKind::Github, None, token.as_bytes(), TOKEN_BUDGET)
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(clients.kept().await, MAX_CLIENTS);
        // The client in use is the one kept: asking again builds nothing new.
        let token = format!("token-{}", MAX_CLIENTS + 49);
        let again = clients
            .get(ForgeKind::Github, None, token.as_bytes(), TOKEN_BUDGET)
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&again, &newest.unwrap()));
    }
}
