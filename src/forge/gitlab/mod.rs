//! GitLab: its webhook deliveries ([`webhook`]: verification and parsing, pure) and its API
//! ([`api`]: the calls previewd makes, with [`tree`] where the gitlab crate's own endpoint
//! does not send what GitLab documents).

pub mod api;
mod tree;
pub mod webhook;

pub use webhook::*;
