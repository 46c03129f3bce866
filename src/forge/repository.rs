//! Files kept in the application's repository, read through the forge API at the environment's
//! head commit: manifest folders (`spec.manifests.repositoryPath`) and chart folders
//! (`spec.manifests.helm.chart.path`). A commit never changes, so what was read for a commit
//! is kept and that commit is never fetched twice (within the [`CAPACITY`] readings used
//! last). A commit refused for its size, or whose path is not a folder, is kept as refused, for
//! the same reason.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use super::client::{ForgeApiError, ForgeClient};
use crate::model::crd::InlineManifest;

/// How many (repository, path, commit) readings are kept, of each kind.
pub const CAPACITY: usize = 64;

/// (whose reading: the client's [`ForgeClient::scope`], repository, path, commit).
type Key = (String, String, String, String);

/// A chart or overlay folder: (path relative to the folder, bytes), sorted by path.
pub type FolderFiles = Vec<(String, Vec<u8>)>;

/// What is kept of one reading: what was read, or the refusal (kept: it cannot change).
type Reading<T> = Result<Arc<T>, ForgeApiError>;

struct Readings<T> {
    kept: Mutex<VecDeque<(Key, Reading<T>)>>,
}

impl<T> Default for Readings<T> {
    fn default() -> Self {
        Self {
            kept: Mutex::new(VecDeque::new()),
        }
    }
}

impl<T> Readings<T> {
    /// The kept reading of `key`, if any, moved to the newest end: the readings in use stay,
    /// the least recently used go first.
    fn kept_reading(&self, key: &Key) -> Option<Reading<T>> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let at = kept.iter().position(|(k, _)| k == key)?;
        let entry = kept.remove(at)?;
        let reading = entry.1.clone();
        kept.push_back(entry);
        Some(reading)
    }

    async fn get<F>(&self, key: Key, read: F) -> Reading<T>
    where
        F: Future<Output = Result<T, ForgeApiError>>,
    {
        if let Some(reading) = self.kept_reading(&key) {
            return reading;
        }
        let reading = match read.await {
            Ok(found) => Ok(Arc::new(found)),
            Err(refused @ ForgeApiError::ManifestsTooLarge { .. })
            | Err(refused @ ForgeApiError::NotAFolder { .. })
            | Err(refused @ ForgeApiError::NotInRepository { .. }) => Err(refused),
            // Anything else may pass: not kept.
            Err(other) => return Err(other),
        };
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.push_back((key, reading.clone()));
        while kept.len() > CAPACITY {
            kept.pop_front();
        }
        reading
    }
}

#[derive(Default)]
pub struct RepositoryManifests {
    manifests: Readings<Vec<InlineManifest>>,
    folders: Readings<FolderFiles>,
}

impl RepositoryManifests {
    /// The manifests in `path` of `repository` at commit `sha`, each named `<path>/<file>`.
    /// Files read for it spend `reader`'s share of the repository's reads (the first reader's,
    /// when several environments ask for one commit at once).
    pub async fn get(
        &self,
        client: &ForgeClient,
        repository: &str,
        path: &str,
        sha: &str,
        reader: &str,
    ) -> Result<Arc<Vec<InlineManifest>>, ForgeApiError> {
        let key = key_of(client, repository, path, sha);
        let read = async {
            let files = client.read_manifests(repository, path, sha, reader).await?;
            Ok(named(path, files))
        };
        self.manifests.get(key, read).await
    }

    /// Every file of folder `path` of `repository` at commit `sha` (a chart).
    pub async fn folder(
        &self,
        client: &ForgeClient,
        repository: &str,
        path: &str,
        sha: &str,
        reader: &str,
    ) -> Result<Arc<FolderFiles>, ForgeApiError> {
        let key = key_of(client, repository, path, sha);
        self.folders
            .get(key, client.read_folder(repository, path, sha, reader))
            .await
    }
}

/// A reading is kept for the client that made it (forge, API URL and token): another team's
/// template naming the same repository and commit, with a server of its own as `apiUrl` or a
/// token that may not read the repository, never gets it, and never fills it.
fn key_of(client: &ForgeClient, repository: &str, path: &str, sha: &str) -> Key {
    (
        client.scope().to_string(),
        repository.to_string(),
        path.to_string(),
        sha.to_string(),
    )
}

/// Each file as a manifest named `<path>/<file>`.
fn named(path: &str, files: Vec<(String, String)>) -> Vec<InlineManifest> {
    files
        .into_iter()
        .map(|(name, template)| InlineManifest {
            name: format!("{}/{name}", path.trim_matches('/')),
            template,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn key(commit: usize) -> Key {
        let (scope, repository) = (
            "github https://api.github.com token".into(),
            "octo/app".into(),
        );
        (scope, repository, "deploy".into(), format!("{commit:040x}"))
    }

    #[tokio::test]
    async fn the_64_readings_used_last_are_kept_and_an_older_one_is_read_again() {
        let readings: Readings<usize> = Readings::default();
        let reads = &AtomicUsize::new(0);
        // The forge's read, counted when it runs.
        let read = move |commit: usize| async move {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ForgeApiError>(commit)
        };
        for commit in 0..65 {
            readings.get(key(commit), read(commit)).await.unwrap();
        }
        assert_eq!(reads.load(Ordering::SeqCst), 65);
        // The 64 newest are kept: no forge call (asked before the oldest, which would push
        // another out when read again).
        for commit in [64, 1] {
            assert_eq!(
                *readings.get(key(commit), read(commit)).await.unwrap(),
                commit
            );
        }
        assert_eq!(
            reads.load(Ordering::SeqCst),
            65,
            "kept commits are not read again"
        );
        assert_eq!(*readings.get(key(0), read(0)).await.unwrap(), 0);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            66,
            "the oldest was read again"
        );
        // It pushed out the least recently used (2), not commit 1, which was just used.
        readings.get(key(1), read(1)).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 66, "a reading in use stays");
        readings.get(key(2), read(2)).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 67);
    }

    /// A GitHub API serving `text` as `deploy/app.yaml` of `octo/app` at every commit, under
    /// one blob id whatever the text (as a hostile server would claim).
    async fn github_serving(text: &str) -> wiremock::MockServer {
        use base64::Engine;
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        let server = wiremock::MockServer::start().await;
        let id = "b".repeat(40);
        let tree = serde_json::json!({"truncated": false, "tree": [
            {"path": "deploy", "type": "tree", "mode": "040000", "sha": "d".repeat(40)},
            {"path": "deploy/app.yaml", "type": "blob", "mode": "100644", "sha": id, "size": text.len()}]});
        Mock::given(method("GET"))
            .and(path_regex("^/repos/octo/app/git/trees/"))
            .respond_with(ResponseTemplate::new(200).set_body_json(tree))
            .mount(&server)
            .await;
        let content = base64::engine::general_purpose::STANDARD.encode(text);
        let blob = serde_json::json!({"sha": id, "encoding": "base64", "content": content});
        Mock::given(method("GET"))
            .and(path_regex("^/repos/octo/app/git/blobs/"))
            .respond_with(ResponseTemplate::new(200).set_body_json(blob))
            .mount(&server)
            .await;
        server
    }

    /// Another team's template names the same repository and commit, with a server of its own
    /// as `apiUrl`: it gets what its server says, and the real forge's reader still gets the
    /// real content (readings and blobs are kept per forge and token). The real forge with
    /// another token (one that may not read the repository) is asked again, not served the
    /// first token's reading.
    #[tokio::test]
    async fn a_reading_is_kept_for_its_own_forge_and_token_only() {
        use crate::forge::client::ForgeClients;
        use crate::forge::metrics::ForgeMetrics;
        use crate::model::crd::ForgeKind;
        crate::install_crypto_provider();
        let (real, hostile) = (github_serving("real").await, github_serving("forged").await);
        let clients = ForgeClients::new(ForgeMetrics::new());
        let client = |url: String, token: &'static [u8]| {
            let clients = &clients;
            async move {
                let client = clients.get(ForgeKind::Github, Some(&url), token, "token");
                client.await.unwrap()
            }
        };
        let victim = client(real.uri(), b"victim").await;
        let attacker = client(hostile.uri(), b"attacker").await;
        let other_token = client(real.uri(), b"attacker").await;
        let manifests = RepositoryManifests::default();
        let sha = "c".repeat(40);
        let read = |client: Arc<ForgeClient>| {
            let (manifests, sha) = (&manifests, sha.clone());
            async move {
                let read = manifests
                    .get(&client, "octo/app", "deploy", &sha, "test/pr-1")
                    .await;
                read.unwrap()[0].template.clone()
            }
        };

        assert_eq!(read(victim.clone()).await, "real");
        assert_eq!(read(attacker).await, "forged");
        assert_eq!(read(victim).await, "real");
        let trees_asked = || async {
            let requests = real.received_requests().await.unwrap_or_default();
            requests
                .iter()
                .filter(|r| r.url.path().contains("/git/trees/"))
                .count()
        };
        assert_eq!(trees_asked().await, 1);
        assert_eq!(read(other_token).await, "real");
        assert_eq!(
            trees_asked().await,
            2,
            "another token lists the tree itself"
        );
    }
}
