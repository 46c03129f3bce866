//! GitHub: its webhook deliveries ([`webhook`]: verification and parsing, pure) and its API
//! ([`api`]: the calls previewd makes).

pub mod api;
pub mod webhook;

pub use webhook::*;
