//! Why `previewd run` could not start or keep running: a variant per cause, and a
//! low-cardinality category for metrics.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("connecting to Kubernetes: {0}")]
    Client(#[from] crate::cluster::client::ClientError),
    #[error("{0}; exiting so that the replica is restarted")]
    ControllerStopped(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl Error {
    /// A static category for metric labels (never an object name or a message).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Kube(_) | Error::Client(_) => "kube",
            Error::Io { .. } => "io",
            Error::ControllerStopped(_) => "controller",
        }
    }
}
