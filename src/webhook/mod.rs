//! The webhook side: signed deliveries in, `PreviewEnvironment` records out.
//!
//! * [`server`]: the HTTP server and the order of checks a delivery goes through;
//! * [`deliveries`]: delivery ids already handled (redeliveries change nothing twice);
//! * [`intake`]: what a forge event means for the environments (pure `decide`, then `execute`);
//! * [`commands`]: `/preview …` comment commands (pure `parse` and `effect`, then `handle`);
//! * [`refusals`]: how often commenters without write access are answered;
//! * [`checks`]: CI results recorded on the environments whose new commit waits for them (pure
//!   `patches`, then `record`);
//! * [`footprints`]: the environments' footprint by template, on `/metrics`.
//!
//! Nothing here deploys: the reconciler picks the records up through the Kubernetes API.

pub mod checks;
pub mod commands;
mod deliveries;
pub mod footprints;
mod intake;
pub mod metrics;
pub mod refusals;
pub mod server;
