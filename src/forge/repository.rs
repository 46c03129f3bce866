//! Files kept in the application's repository, read through the forge API at the environment's
//! head commit: manifest folders (`spec.manifests.repositoryPath`) and chart folders
//! (`spec.manifests.helm.chart.path`). A commit never changes, so what was read for a commit
//! is kept and that commit is never fetched twice (within [`CAPACITY`] recent commits). A
//! commit refused for its size, or whose path is not a folder, is kept as refused, for the
//! same reason.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use super::client::{ForgeApiError, ForgeClient};
use crate::model::crd::InlineManifest;

/// How many (repository, path, commit) readings are kept, of each kind.
pub const CAPACITY: usize = 64;

type Key = (String, String, String);

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
    async fn get<F>(&self, key: Key, read: F) -> Reading<T>
    where
        F: Future<Output = Result<T, ForgeApiError>>,
    {
        let cached = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, reading)| reading.clone());
        if let Some(reading) = cached {
            return reading;
        }
        let reading = match read.await {
            Ok(found) => Ok(Arc::new(found)),
            Err(refused @ ForgeApiError::ManifestsTooLarge { .. })
            | Err(refused @ ForgeApiError::NotAFolder { .. }) => Err(refused),
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
    pub async fn get(
        &self,
        client: &ForgeClient,
        repository: &str,
        path: &str,
        sha: &str,
    ) -> Result<Arc<Vec<InlineManifest>>, ForgeApiError> {
        let key = (repository.to_string(), path.to_string(), sha.to_string());
        let read = async {
            let files = client.read_manifests(repository, path, sha).await?;
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
    ) -> Result<Arc<FolderFiles>, ForgeApiError> {
        let key = (repository.to_string(), path.to_string(), sha.to_string());
        self.folders
            .get(key, client.read_folder(repository, path, sha))
            .await
    }
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
        ("octo/app".into(), "deploy".into(), format!("{commit:040x}"))
    }

    #[tokio::test]
    async fn readings_of_64_commits_are_kept_and_an_older_one_is_read_again() {
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
    }
}
