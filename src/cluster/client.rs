//! Building a Kubernetes client from a kubeconfig file's contents: `previewd run --kubeconfig`,
//! the sandbox and the tests all connect the same way.

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
}

/// A client for the current context of `kubeconfig`.
pub async fn from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Client, ClientError> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(ClientError::Kubeconfig)?;
    kube::Client::try_from(config).map_err(ClientError::Client)
}
