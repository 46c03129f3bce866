//! GitHub: its webhook deliveries ([`webhook`]: verification and parsing, pure), its API
//! ([`api`]: the calls previewd makes) and GitHub App authentication ([`app`]: installation
//! tokens).

pub mod api;
pub mod app;
pub mod webhook;

pub use webhook::*;
