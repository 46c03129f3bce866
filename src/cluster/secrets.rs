//! Reads keys of Secrets (webhook secrets, forge tokens) with a short cache, so that a burst of
//! deliveries does not become a burst of API reads, and a rotated secret is picked up within
//! [`SECRET_TTL`]. Secret values are never logged.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::model::crd::SecretKeyRef;

/// How long a read secret is trusted before it is read again.
pub const SECRET_TTL: Duration = Duration::from_secs(30);

/// The type a registered cluster's kubeconfig Secret must have. A Secret of this type is
/// only ever read as a cluster's credential: never as a template's token or webhook secret,
/// never copied into an environment, wherever it lives and whatever names it.
pub const CLUSTER_CREDENTIAL_TYPE: &str = "previewd.dev/cluster-kubeconfig";

/// The type a database server's admin Secret must have: like a cluster's credential, never
/// read for a template nor copied into an environment.
pub const DATABASE_CREDENTIAL_TYPE: &str = "previewd.dev/database-admin";

/// Whether `secret` is a registered cluster's credential.
pub fn is_cluster_credential(secret: &Secret) -> bool {
    secret.type_.as_deref() == Some(CLUSTER_CREDENTIAL_TYPE)
}

/// Whether `secret` is one of the operator's credentials previewd holds for itself (a
/// cluster's kubeconfig, a database server's admin login): never a template's to read or copy.
pub fn is_operator_credential(secret: &Secret) -> bool {
    is_cluster_credential(secret) || secret.type_.as_deref() == Some(DATABASE_CREDENTIAL_TYPE)
}

/// What a reader reads: the Secrets templates name, or clusters' credentials; never both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Readable {
    TemplateSecrets,
    ClusterCredentials,
}

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
    #[error(
        "Secret {namespace}/{name} is an operator's credential (type {CLUSTER_CREDENTIAL_TYPE} or {DATABASE_CREDENTIAL_TYPE}): templates never read it"
    )]
    ClusterCredential { namespace: String, name: String },
    #[error(
        "Secret {namespace}/{name} is not of type {CLUSTER_CREDENTIAL_TYPE}: a registered cluster's kubeconfig must be"
    )]
    NotAClusterCredential { namespace: String, name: String },
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
    cache: Mutex<Values>,
    readable: Readable,
}

/// The values read, each with when it was read.
#[derive(Default)]
struct Values(HashMap<SecretKey, (Instant, Vec<u8>)>);

impl Values {
    /// The value of `key`, unless it is [`SECRET_TTL`] old at `now`.
    fn get(&self, key: &SecretKey, now: Instant) -> Option<Vec<u8>> {
        let (read_at, value) = self.0.get(key)?;
        (now.saturating_duration_since(*read_at) < SECRET_TTL).then(|| value.clone())
    }

    /// Keeps `value`, read at `now`, and drops every value too old to be used.
    fn put(&mut self, key: SecretKey, value: Vec<u8>, now: Instant) {
        // Secrets of deleted templates must not stay for the life of the process.
        self.0
            .retain(|_, (read_at, _)| now.saturating_duration_since(*read_at) < SECRET_TTL);
        self.0.insert(key, (now, value));
    }
}

impl SecretReader {
    /// A reader of the Secrets templates name (tokens, webhook secrets); it refuses clusters'
    /// credentials.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(Values::default()),
            readable: Readable::TemplateSecrets,
        }
    }

    /// A reader of registered clusters' kubeconfigs; it reads only Secrets of type
    /// [`CLUSTER_CREDENTIAL_TYPE`].
    pub fn for_cluster_credentials(client: Client) -> Self {
        Self {
            readable: Readable::ClusterCredentials,
            ..Self::new(client)
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
        if let Some(value) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key, Instant::now())
        {
            return Ok(value);
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
        self.may_read(&secret, namespace, &reference.name)?;
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
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(key, value.clone(), Instant::now());
        Ok(value)
    }
}

impl SecretReader {
    /// Refuses an operator's credential (a cluster's, a database server's) to a template
    /// reader, and anything but a cluster's credential to a credential reader.
    fn may_read(&self, secret: &Secret, namespace: &str, name: &str) -> Result<(), SecretError> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        match self.readable {
            Readable::TemplateSecrets if is_operator_credential(secret) => {
                Err(SecretError::ClusterCredential { namespace, name })
            }
            Readable::ClusterCredentials if !is_cluster_credential(secret) => {
                Err(SecretError::NotAClusterCredential { namespace, name })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_clusters_credential_is_read_only_as_one() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (templates, clusters) = (
            SecretReader::new(client.clone()),
            SecretReader::for_cluster_credentials(client),
        );
        let credential = Secret {
            type_: Some(CLUSTER_CREDENTIAL_TYPE.into()),
            ..Default::default()
        };
        let token = Secret {
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        assert!(matches!(
            templates.may_read(&credential, "previewd", "eu"),
            Err(SecretError::ClusterCredential { .. })
        ));
        assert!(templates.may_read(&token, "previewd", "token").is_ok());
        assert!(clusters.may_read(&credential, "previewd", "eu").is_ok());
        assert!(matches!(
            clusters.may_read(&token, "previewd", "token"),
            Err(SecretError::NotAClusterCredential { .. })
        ));
    }

    #[tokio::test]
    async fn a_database_servers_admin_login_is_never_read_for_a_template() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (templates, clusters) = (
            SecretReader::new(client.clone()),
            SecretReader::for_cluster_credentials(client),
        );
        let admin = Secret {
            type_: Some(DATABASE_CREDENTIAL_TYPE.into()),
            ..Default::default()
        };
        assert!(matches!(
            templates.may_read(&admin, "previewd", "shared-pg-admin"),
            Err(SecretError::ClusterCredential { .. })
        ));
        // Nor as a cluster's kubeconfig: each credential reads as what it is.
        assert!(matches!(
            clusters.may_read(&admin, "previewd", "shared-pg-admin"),
            Err(SecretError::NotAClusterCredential { .. })
        ));
    }

    fn key(name: &str) -> SecretKey {
        ("previews".into(), name.into(), "token".into())
    }

    /// A panic while the cache was held (a bug anywhere) must not turn every later read of a
    /// Secret into a panic: the next read goes on (here to an API server that is not there).
    #[tokio::test]
    async fn a_panic_holding_the_cache_leaves_later_reads_working() {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let reader = SecretReader::new(Client::try_from(config).unwrap());
        let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = reader.cache.lock();
            panic!("a bug while the cache is held");
        }));
        assert!(poisoned.is_err() && reader.cache.is_poisoned());
        let reference = SecretKeyRef {
            name: "forge".into(),
            key: "token".into(),
        };
        let read = reader.get("previews", &reference).await;
        assert!(matches!(read, Err(SecretError::Api { .. })), "{read:?}");
    }

    #[test]
    fn a_value_is_served_from_the_cache_for_30_seconds_then_read_again() {
        // So a rotated Secret takes effect within half a minute (docs/forges.md).
        let mut values = Values::default();
        let read = Instant::now();
        values.put(key("hello-world-forge"), b"old".to_vec(), read);
        let after = |seconds| read + Duration::from_secs(seconds);
        assert_eq!(
            values.get(&key("hello-world-forge"), after(29)).as_deref(),
            Some(&b"old"[..])
        );
        assert_eq!(values.get(&key("hello-world-forge"), after(30)), None);
        assert_eq!(
            values.get(&key("hello-world-forge"), after(31)),
            None,
            "read again"
        );
        assert_eq!(values.get(&key("other"), read), None, "per Secret and key");
    }

    #[test]
    fn old_values_are_dropped_when_a_new_one_is_kept() {
        let mut values = Values::default();
        let read = Instant::now();
        values.put(key("a"), b"a".to_vec(), read);
        values.put(key("b"), b"b".to_vec(), read + Duration::from_secs(20));
        values.put(key("c"), b"c".to_vec(), read + Duration::from_secs(31));
        assert_eq!(values.0.len(), 2, "only values still in use are held");
        assert!(!values.0.contains_key(&key("a")));
    }
}
