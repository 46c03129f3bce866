//! GitLab: its webhook deliveries ([`webhook`]: verification and parsing, pure) and its API
//! ([`api`]: the calls previewd makes, with [`tree`] where the gitlab crate's own endpoint
//! does not send what GitLab documents, and [`environments`] where it has none), behind
//! previewd's one seam ([`seam`]: [`FORGE`]).

pub mod api;
mod environments;
mod seam;
mod tree;
pub mod webhook;

pub use webhook::*;

use crate::forge::seam::Forge;
use crate::model::crd::ForgeKind;

/// GitLab, whole ([`crate::forge::forges`]).
pub static FORGE: Forge = Forge {
    kind: ForgeKind::Gitlab,
    webhook: webhook::WEBHOOK,
    connect: seam::connect,
    deploy_requests: seam::deploy_requests,
    retire: seam::retire,
};
