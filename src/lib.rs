//! previewd: a Kubernetes controller that gives every branch or pull request its own
//! short-lived preview environment. See `docs/architecture.md` for the data flow.

pub mod apply;
pub mod caches;
pub mod commands;
pub mod config;
pub mod controller;
pub mod crd;
pub mod error;
pub mod forge;
pub mod gc;
pub mod guard;
pub mod health;
pub mod intake;
pub mod leader;
pub mod metrics;
pub mod namespace;
pub mod naming;
pub mod observed;
pub mod queue;
pub mod render;
pub mod sandbox;
pub mod secrets;
pub mod server;
pub mod service;
pub mod sweep;
pub mod telemetry;
pub mod workloads;

pub use error::Error;

/// Installs rustls' process-wide crypto provider (ring). Must run before any TLS client is
/// built: when several crates enable different rustls back-ends, rustls cannot pick one by
/// itself and panics at the first connection. Safe to call more than once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
