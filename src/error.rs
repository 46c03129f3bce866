//! previewd's error type: a variant per step, and a low-cardinality category for metrics.

use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
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
            Error::Kube(_) => "kube",
            Error::Sandbox(_) => "sandbox",
            Error::Io { .. } => "io",
        }
    }
}
