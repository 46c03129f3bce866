//! The registered database servers (a watch of `PreviewDatabaseServer`s), the connections
//! previewd makes to them with the admin credential from previewd's own namespace, and one
//! load at a time per baseline version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use crate::cluster::secrets::DATABASE_CREDENTIAL_TYPE;
use crate::database::{DatabaseServer, ServerAddress, ServerLimits};
use crate::model::crd::{PreviewDatabaseServer, PreviewDatabaseServerSpec};

/// How databases run (`--database-credentials-namespace`).
#[derive(Clone, Debug, Default)]
pub struct DatabaseConfig {
    /// previewd's own namespace, where the servers' admin Secrets are. `None`: databases are
    /// off, and a template asking for one is told so.
    pub credentials_namespace: Option<String>,
}

/// The databases' part of the context.
pub struct Databases {
    pub config: DatabaseConfig,
    servers: Store<PreviewDatabaseServer>,
    connections: Mutex<HashMap<String, (String, DatabaseServer)>>,
    loads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Baseline versions whose SQL failed, with PostgreSQL's message: not loaded again until
    /// the SQL changes (a new version).
    failed: Mutex<HashMap<String, String>>,
    _watch: Option<WatchTask>,
}

struct WatchTask(tokio::task::JoinHandle<()>);

impl Drop for WatchTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Databases {
    /// Watches the registered servers when databases are on.
    pub fn start(client: Client, config: DatabaseConfig) -> Self {
        let (servers, writer) = reflector::store();
        let watch = config.credentials_namespace.is_some().then(|| {
            let watch = reflector(writer, watcher(Api::all(client), Default::default()))
                .default_backoff()
                .for_each(|_| async {});
            // Stops with the controller's context.
            WatchTask(tokio::spawn(watch))
        });
        Self {
            config,
            servers,
            connections: Mutex::new(HashMap::new()),
            loads: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            _watch: watch,
        }
    }

    /// Whether the watch has listed the registered servers (it starts empty: until then, a
    /// server not seen is not a server that is gone). Waits up to 10 s.
    pub async fn listed(&self) -> bool {
        let listing = self.servers.wait_until_ready();
        tokio::time::timeout(std::time::Duration::from_secs(10), listing)
            .await
            .is_ok_and(|listed| listed.is_ok())
    }

    /// The registered server `name`, as the watch last saw it.
    pub fn server(&self, name: &str) -> Option<Arc<PreviewDatabaseServer>> {
        self.servers.get(&ObjectRef::new(name))
    }

    /// previewd's connection to server `name`, with its admin credential read now (so that a
    /// rotated credential is used at the next operation). The Secret must be of the admin type.
    pub async fn connect(
        &self,
        client: &Client,
        name: &str,
        spec: &PreviewDatabaseServerSpec,
    ) -> Result<DatabaseServer, String> {
        let Some(namespace) = &self.config.credentials_namespace else {
            return Err(
                "databases are off in this previewd (--database-credentials-namespace is not set)"
                    .into(),
            );
        };
        let secret_name = &spec.admin_secret_ref.name;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let secret = secrets
            .get_opt(secret_name)
            .await
            .map_err(|e| format!("reading the admin Secret {namespace}/{secret_name}: {e}"))?
            .ok_or_else(|| format!("the admin Secret {namespace}/{secret_name} does not exist"))?;
        if secret.type_.as_deref() != Some(DATABASE_CREDENTIAL_TYPE) {
            return Err(format!(
                "the admin Secret {namespace}/{secret_name} is not of type {DATABASE_CREDENTIAL_TYPE}"
            ));
        }
        let key = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .and_then(|value| String::from_utf8(value.0.clone()).ok())
                .ok_or_else(|| {
                    format!("the admin Secret {namespace}/{secret_name} has no key {key}")
                })
        };
        let address = ServerAddress {
            name: name.to_string(),
            host: spec.host.clone(),
            port: spec.port,
            admin_user: key("username")?,
            admin_password: key("password")?,
            admin_database: "postgres".into(),
        };
        Ok(self.connection(address, limits(spec)))
    }

    /// The connection for this address and these limits: the same one (and so the same
    /// operation turns) while neither changes.
    fn connection(&self, address: ServerAddress, limits: ServerLimits) -> DatabaseServer {
        let mut hasher = Sha256::new();
        for part in [&address.host, &address.admin_user, &address.admin_password] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.update(format!("{}:{limits:?}", address.port));
        let fingerprint = hex::encode(hasher.finalize());
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((known, server)) = connections.get(&address.name)
            && *known == fingerprint
        {
            return server.clone();
        }
        let name = address.name.clone();
        let server = DatabaseServer::new(address, limits);
        connections.insert(name, (fingerprint, server.clone()));
        server
    }

    /// PostgreSQL's message for a baseline version whose SQL failed.
    pub(super) fn failed_load(&self, baseline: &str) -> Option<String> {
        let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.get(baseline).cloned()
    }

    pub(super) fn note_failed_load(&self, baseline: &str, message: String) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.insert(baseline.to_string(), message);
    }

    /// The lock held while one baseline version is loaded: two environments of a template
    /// that ask at once must not both open (and so drop) the same version.
    pub(super) fn load_lock(&self, baseline: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(baseline.to_string())
            .or_default()
            .clone()
    }
}

fn limits(spec: &PreviewDatabaseServerSpec) -> ServerLimits {
    let defaults = ServerLimits::default();
    let limits = &spec.limits;
    ServerLimits {
        max_branches: limits.max_branches.unwrap_or(defaults.max_branches),
        concurrent_operations: limits
            .concurrent_operations
            .map_or(defaults.concurrent_operations, |n| n.clamp(1, 64) as usize),
        role_connection_limit: limits
            .connections_per_role
            .unwrap_or(defaults.role_connection_limit),
    }
}
