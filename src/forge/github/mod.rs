//! GitHub: its webhook deliveries ([`webhook`]: verification and parsing, pure), its API
//! ([`api`]: the calls previewd makes) and GitHub App authentication ([`app`]: installation
//! tokens), behind previewd's one seam ([`seam`]: [`FORGE`]).

pub mod api;
pub mod app;
mod seam;
pub mod webhook;

pub use webhook::*;

use crate::forge::seam::Forge;
use crate::model::crd::ForgeKind;

/// GitHub, whole ([`crate::forge::forges`]).
pub static FORGE: Forge = Forge {
    kind: ForgeKind::Github,
    webhook: webhook::WEBHOOK,
    connect: seam::connect,
    deploy_requests: seam::deploy_requests,
    retire: seam::retire,
};
