//! The integration tests that can share a control plane, as one test binary: the cluster
//! starts once (about 10 s) rather than once per file, and the tests link once. Each file is a
//! module with its own doc comment; `cargo test --test integration reconcile::` runs one of them.
//!
//! What may share: a test works in its own namespace (`support::in_namespace`), watches and
//! sweeps only that namespace, keeps its Leases there and names cluster-scoped objects after it.
//! A test that counts the API server's requests holds a quiet window (`support::quiet_window`),
//! which waits for every other test of this binary. What may not share lives in a binary of its
//! own: `tests/chaos.rs` kills the API server under everyone and cuts watches, and
//! `tests/sandbox_cli.rs` starts whole sandboxes of its own.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod ceiling;
mod chart;
mod clusters;
mod containment;
mod content_policy;
mod control_plane;
mod databases;
mod docs;
mod engines;
mod faults;
mod footprint;
mod forge_budget;
mod forge_workflow;
mod gate;
mod high_availability;
mod holding;
mod hostile;
mod image;
mod lifecycle;
mod quarantine;
mod reconcile;
mod security;
mod sweep;
mod traffic;
mod webhooks;
