//! Building Kubernetes clients: `previewd run` (from a kubeconfig or in the cluster), the
//! sandbox and the tests all connect the same way.
//!
//! Every client has a bound on the requests it has in flight ([`limited`]). kube's client speaks
//! HTTP/1.1, one request per connection at a time: without a bound, each request that finds no
//! idle connection opens a new TLS connection, and idle ones are kept for 90 s. While 400
//! environments were being created previewd held 1,135 connections to the API server, which was
//! most of previewd's memory and a cost to an API server that other teams share. A bounded
//! client queues the rest, in order, on a few dozen connections.

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::limit::ConcurrencyLimitLayer;

/// Requests one client has in flight at once unless `--api-concurrency` says otherwise. A watch
/// counts only until its answer starts; its stream then no longer holds a place.
pub const DEFAULT_API_CONCURRENCY: usize = 32;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("no Kubernetes configuration found: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
}

/// The connection settings of the current context of `kubeconfig`.
pub async fn config_from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Config, ClientError> {
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(ClientError::Kubeconfig)
}

/// The in-cluster configuration, else the default kubeconfig.
pub async fn inferred_config() -> Result<kube::Config, ClientError> {
    kube::Config::infer().await.map_err(ClientError::Infer)
}

/// A client for the current context of `kubeconfig`, with the default bound.
pub async fn from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Client, ClientError> {
    limited(
        config_from_kubeconfig(kubeconfig).await?,
        DEFAULT_API_CONCURRENCY,
    )
}

/// A client with at most `in_flight` requests waiting for their answer at once (at least 1);
/// the others wait their turn in order.
pub fn limited(config: kube::Config, in_flight: usize) -> Result<kube::Client, ClientError> {
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Client)?;
    Ok(builder
        .with_layer(&ConcurrencyLimitLayer::new(in_flight.max(1)))
        .build())
}
