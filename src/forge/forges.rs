//! The forges previewd speaks to, listed once. Everything else reaches a forge through its
//! [`Forge`] (webhook, client, report costs) and [`super::seam::ForgeApi`].
//!
//! To add a forge: a folder beside `github/` and `gitlab/` that fills in a [`Forge`], a
//! variant of [`ForgeKind`] (the template's `forge.kind`), and its line below; the compiler
//! points at this match until it has one.

use super::seam::Forge;
use super::{github, gitlab};
use crate::model::crd::ForgeKind;

/// The forge of `kind`.
pub fn forge(kind: ForgeKind) -> &'static Forge {
    match kind {
        ForgeKind::Github => &github::FORGE,
        ForgeKind::Gitlab => &gitlab::FORGE,
    }
}

/// Every forge, in the order [`ForgeKind::ALL`] lists them.
pub fn all() -> impl Iterator<Item = &'static Forge> {
    ForgeKind::ALL.into_iter().map(forge)
}
