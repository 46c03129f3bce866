//! Manifests kept in the application's repository (`spec.manifests.repositoryPath`), read
//! through the forge API at the environment's head commit. A commit never changes, so what was
//! read for a commit is kept and that commit is never fetched twice (within [`CAPACITY`]
//! recent commits).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::client::{ForgeApiError, ForgeClient};
use crate::model::crd::InlineManifest;

/// How many (repository, path, commit) readings are kept.
pub const CAPACITY: usize = 64;

type Key = (String, String, String);

#[derive(Default)]
pub struct RepositoryManifests {
    cache: Mutex<VecDeque<(Key, Arc<Vec<InlineManifest>>)>>,
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
        if let Some((_, manifests)) = self
            .cache
            .lock()
            .expect("manifest cache")
            .iter()
            .find(|(k, _)| *k == key)
        {
            return Ok(manifests.clone());
        }
        let files = client.read_manifests(repository, path, sha).await?;
        let manifests: Arc<Vec<InlineManifest>> = Arc::new(
            files
                .into_iter()
                .map(|(name, template)| InlineManifest {
                    name: format!("{}/{name}", path.trim_matches('/')),
                    template,
                })
                .collect(),
        );
        let mut cache = self.cache.lock().expect("manifest cache");
        cache.push_back((key, manifests.clone()));
        while cache.len() > CAPACITY {
            cache.pop_front();
        }
        Ok(manifests)
    }
}
