//! previewd: a Kubernetes controller that gives every branch or pull request its own
//! short-lived preview environment. See `docs/architecture.md` for the layers and the data flow.
//!
//! One folder per layer, each importing only the layers listed before it (a test,
//! `tests/integration/architecture.rs`, fails on any import that points up or closes a circle):
//!
//! * [`model`]: the custom resources, names, durations, labels and annotations. No I/O.
//! * [`cluster`]: talking to the Kubernetes API: the applier and its skip cache, the watches,
//!   health, secrets, environment records, the one writer every write goes through.
//! * [`engines`]: the third-party renderers previewd runs as programs (`helm template`), each
//!   with a time and output limit and a cache of what it printed.
//! * [`database`]: PostgreSQL servers previewd makes a database per environment on: baselines
//!   loaded once, branched per environment with a role that reaches its branch alone.
//! * [`forge`]: GitHub and GitLab: webhook parsing, API calls, the PR comment and statuses.
//! * [`plan`]: the pure step from a template and its render to the exact objects to apply (the
//!   guard, the content policy, sleep and routes), which the reconciler, `previewd render` and
//!   the sandbox's checks share.
//! * [`webhook`]: the HTTP server, verification, delivery dedupe, intake and comment commands.
//! * [`lifecycle`]: the sweep (which environments go, and why) and its loop.
//! * [`gate`]: the wake gate, which answers for sleeping environments' hosts and wakes them.
//! * [`reconcile`]: the pipeline that turns a `PreviewEnvironment` into a running namespace.
//! * [`runtime`]: configuration, leader election, metrics, logs, start-up and shutdown.
//! * [`sandbox`]: a real control plane on this machine, for people and for the tests.
//!
//! The webhook side and the reconciler never import each other: they meet through the
//! Kubernetes API (the `PreviewEnvironment` is the durable record) and the caches of
//! [`cluster::caches`].

pub mod cluster;
pub mod database;
pub mod engines;
pub mod forge;
pub mod gate;
pub mod lifecycle;
pub mod model;
pub mod plan;
pub mod reconcile;
pub mod runtime;
pub mod sandbox;
pub mod webhook;

/// Installs rustls' process-wide crypto provider (ring). Must run before any TLS client is
/// built: when several crates enable different rustls back-ends, rustls cannot pick one by
/// itself and panics at the first connection. Safe to call more than once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
