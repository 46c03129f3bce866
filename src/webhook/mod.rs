//! The webhook side: signed deliveries in, `PreviewEnvironment` records out.
//!
//! * [`server`]: the HTTP server and the order of checks a delivery goes through;
//! * [`intake`]: what a forge event means for the environments (pure `decide`, then `execute`);
//! * [`commands`]: `/preview …` comment commands (pure `parse` and `effect`, then `handle`).
//!
//! Nothing here deploys: the reconciler picks the records up through the Kubernetes API.

mod commands;
mod intake;
pub mod metrics;
pub mod server;
