//! Reads keys of Secrets (webhook secrets, forge tokens) with a short cache, so that a burst of
//! deliveries does not become a burst of API reads, and a rotated secret is picked up within
//! [`SECRET_TTL`]. Secret values are never logged.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::model::crd::SecretKeyRef;

/// How long a read secret is trusted before it is read again.
pub const SECRET_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("Secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    MissingKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("reading Secret {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// (namespace, Secret name, key).
type SecretKey = (String, String, String);

pub struct SecretReader {
    client: Client,
    cache: Mutex<HashMap<SecretKey, (Instant, Vec<u8>)>>,
}

impl SecretReader {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The value of `reference` in `namespace`.
    pub async fn get(
        &self,
        namespace: &str,
        reference: &SecretKeyRef,
    ) -> Result<Vec<u8>, SecretError> {
        let key = (
            namespace.to_string(),
            reference.name.clone(),
            reference.key.clone(),
        );
        if let Some((read_at, value)) = self.cache.lock().expect("secret cache").get(&key)
            && read_at.elapsed() < SECRET_TTL
        {
            return Ok(value.clone());
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api
            .get_opt(&reference.name)
            .await
            .map_err(|source| SecretError::Api {
                namespace: namespace.into(),
                name: reference.name.clone(),
                source,
            })?
            .ok_or_else(|| SecretError::NotFound {
                namespace: namespace.into(),
                name: reference.name.clone(),
            })?;
        let value = secret
            .data
            .and_then(|mut data| data.remove(&reference.key))
            // A trailing newline (a Secret made from a file) is never part of a token.
            .map(|bytes| bytes.0.trim_ascii_end().to_vec())
            .ok_or_else(|| SecretError::MissingKey {
                namespace: namespace.into(),
                name: reference.name.clone(),
                key: reference.key.clone(),
            })?;
        let mut cache = self.cache.lock().expect("secret cache");
        // Secrets of deleted templates must not stay for the life of the process.
        cache.retain(|_, (read_at, _)| read_at.elapsed() < SECRET_TTL);
        cache.insert(key, (Instant::now(), value.clone()));
        Ok(value)
    }
}
