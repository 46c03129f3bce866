//! One [`ForgeClient`] for either forge, with the few calls previewd makes (find, create and
//! edit its comment, commit status, repository files, write access, the sweep's lists), and
//! [`ForgeClients`], which keeps one client per forge URL and token. Each forge answers through
//! its one seam ([`super::seam::ForgeApi`], listed in [`super::forges`]); what every call
//! shares is in `transport.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::blobs::BlobCache;
use super::forges::forge;
use super::limits::check_manifest_total;
use super::limits::check_total;
pub use super::limits::{MAX_MANIFEST_BYTES, MAX_MANIFEST_FILE_BYTES, MAX_MANIFEST_FILES};
use super::metrics::ForgeMetrics;
use super::seam::{Connect, ForgeApi, Listing};
pub use super::transport::{FORGE_TIMEOUT, ForgeApiError, MAX_RATE_LIMIT_WAIT};
pub use super::vocabulary::{CommentAuthor, DeploymentState};
use super::vocabulary::{DeployUpdate, Retire, StatusUpdate};
use crate::model::crd::{ForgeKind, ForgeReport, PreviewEnvironment};

/// A client for one forge API URL and token: whichever forge, behind its one seam.
pub struct ForgeClient(Box<dyn ForgeApi>);

impl ForgeClient {
    /// Whose reads this client makes: the forge, API URL and token it was built for
    /// ([`ForgeClients`]), or a scope of its own. What it read is kept for that scope only.
    pub fn scope(&self) -> &str {
        self.0.scope()
    }

    /// The id of previewd's own comment on PR/MR `number` whose text starts with `marker`
    /// (a copy of the marker in anyone else's comment is not previewd's comment).
    pub async fn find_comment(
        &self,
        repository: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        self.0.find_comment(repository, number, marker).await
    }

    pub async fn create_comment(
        &self,
        repository: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        self.0.create_comment(repository, number, body).await
    }

    pub async fn edit_comment(
        &self,
        repository: &str,
        number: u64,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        self.0.edit_comment(repository, number, id, body).await
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
        let at = Listing::new(repository, path, sha, reader);
        let mut files = self.0.read_manifests(at).await?;
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
        let at = Listing::new(repository, path, sha, reader);
        let mut files = self.0.read_folder(at).await?;
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
        self.0.open_requests(repository).await
    }

    /// Names of the branches of `repository` (one list call per page).
    pub async fn branches(&self, repository: &str) -> Result<HashSet<String>, ForgeApiError> {
        self.0.branches(repository).await
    }

    /// Whether `user` (GitLab: the user with id `user_id`) may write to `repository`: GitHub
    /// `write`, `maintain` or `admin`; GitLab Developer (30) or above. Not a member: `false`.
    pub async fn write_access(
        &self,
        repository: &str,
        user: &str,
        user_id: Option<u64>,
    ) -> Result<bool, ForgeApiError> {
        self.0.write_access(repository, user, user_id).await
    }

    pub async fn commit_status(
        &self,
        repository: &str,
        status: &StatusUpdate,
    ) -> Result<(), ForgeApiError> {
        self.0.commit_status(repository, status).await
    }

    /// The forge's record of the environment's head (a GitHub Deployment and its status; the
    /// GitLab environment and its deployment), with the ids the forge gives back in `record`.
    pub async fn deploy(
        &self,
        environment: &PreviewEnvironment,
        update: &DeployUpdate,
        record: &mut ForgeReport,
    ) -> Result<(), ForgeApiError> {
        self.0.deploy(environment, update, record).await
    }

    /// Ends the forge's record of a removed environment.
    pub async fn retire(&self, repository: &str, retire: &Retire) -> Result<(), ForgeApiError> {
        self.0.retire(repository, retire).await
    }
}

type ClientKey = (ForgeKind, String, [u8; 32]);

/// Where a template that names no `forge.apiUrl` sends its calls, per forge: the public forge
/// unless set. Only the sandbox sets it (to its forge stand-in), so that the example templates,
/// written for GitHub, work there unchanged; a template's own `apiUrl` always wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiDefaults(HashMap<ForgeKind, String>);

impl ApiDefaults {
    /// Templates of forge `kind` that name no API URL go to `url`.
    pub fn with(mut self, kind: ForgeKind, url: String) -> Self {
        self.0.insert(kind, url);
        self
    }

    /// The API URL of a template of forge `kind` whose own is `named`.
    pub fn resolve<'a>(&'a self, kind: ForgeKind, named: Option<&'a str>) -> Option<&'a str> {
        named.or(self.0.get(&kind).map(String::as_str))
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
        let connect = Connect {
            api_url: api_url.map(str::to_string),
            token: String::from_utf8_lossy(token).into_owned(),
            budget: budget.to_string(),
            author,
            metrics: self.metrics.clone(),
            blobs: self.blobs.clone(),
            // Readings are kept per scope: the same forge, URL and token read the same content.
            scope: format!("{kind:?} {} {}", key.1, hex::encode(key.2)),
        };
        let client = Arc::new(ForgeClient((forge(kind).connect)(connect).await?));
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
