//! The running process: configuration (the only place that reads flags and the environment),
//! leader election, metrics, logs, and the order of start-up and shutdown.

pub mod config;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod service;
pub mod telemetry;
