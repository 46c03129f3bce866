//! Manifests kept in the application's repository (`spec.manifests.repositoryPath`), read
//! through the forge API at the environment's head commit. A commit never changes, so what was
//! read for a commit is kept and that commit is never fetched twice (within [`CAPACITY`]
//! recent commits). A commit refused for its size is kept as refused, for the same reason.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::client::{ForgeApiError, ForgeClient};
use crate::model::crd::InlineManifest;

/// How many (repository, path, commit) readings are kept.
pub const CAPACITY: usize = 64;

type Key = (String, String, String);

/// What is kept of one reading: the manifests, or (path, problem) of a size refusal.
type Reading = Result<Arc<Vec<InlineManifest>>, (String, String)>;

#[derive(Default)]
pub struct RepositoryManifests {
    cache: Mutex<VecDeque<(Key, Reading)>>,
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
        let cached = self
            .cache
            .lock()
            .expect("manifest cache")
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, reading)| reading.clone());
        let reading = match cached {
            Some(reading) => reading,
            None => {
                let reading = match client.read_manifests(repository, path, sha).await {
                    Ok(files) => Ok(Arc::new(named(path, files))),
                    Err(ForgeApiError::ManifestsTooLarge { path, problem }) => Err((path, problem)),
                    // Anything else may pass: not kept.
                    Err(other) => return Err(other),
                };
                self.keep(key, reading.clone());
                reading
            }
        };
        reading.map_err(|(path, problem)| ForgeApiError::ManifestsTooLarge { path, problem })
    }

    fn keep(&self, key: Key, reading: Reading) {
        let mut cache = self.cache.lock().expect("manifest cache");
        cache.push_back((key, reading));
        while cache.len() > CAPACITY {
            cache.pop_front();
        }
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
