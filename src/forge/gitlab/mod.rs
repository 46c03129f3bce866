//! GitLab: its webhook deliveries ([`webhook`]: verification and parsing, pure) and its API
//! ([`api`]: the calls previewd makes, with [`tree`] where the gitlab crate's own endpoint
//! does not send what GitLab documents, and [`environments`] where it has none).

pub mod api;
mod environments;
mod tree;
pub mod webhook;

pub use webhook::*;
