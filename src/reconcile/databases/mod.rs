//! The databases step: each database a template asks for (`spec.databases`) as a branch of its
//! baseline on a registered `PreviewDatabaseServer`, the environment's Secret with the
//! connection details (added to the plan's first wave, applied and pruned like the generated
//! secrets), and the egress the guard rail's NetworkPolicy opens to that server alone.
//!
//! At rest nothing is asked of the server: an environment whose status says its branch is
//! `Ready` and whose Secret holds the password is planned from those. The server is asked only
//! to branch (a new environment, a lost Secret) and at removal, which drops the branch and its
//! role after the namespace is gone, never before; an unreachable server holds the removal and
//! says so, and never loses a branch. Sleep keeps both.

mod branches;
mod registry;
mod removal;

pub use branches::{PlannedDatabases, add_databases};
pub use registry::{DatabaseConfig, Databases};
pub use removal::drop_branches;

use crate::model::crd::{Phase, PreviewEnvironment};
use crate::model::refusal::RefusalReason;

/// Where this environment waits for a branch on a full server: 1 + the environments queued
/// for a branch that were created before it (what the `Queued` status and comment show).
pub fn queue_position(
    environment: &PreviewEnvironment,
    everyone: &[std::sync::Arc<PreviewEnvironment>],
) -> u32 {
    let created = |e: &PreviewEnvironment| e.metadata.creation_timestamp.clone();
    let ahead = everyone
        .iter()
        .filter(|other| other.metadata.uid != environment.metadata.uid)
        .filter(|other| queued_for_a_branch(other) && created(other) < created(environment))
        .count();
    u32::try_from(ahead).unwrap_or(u32::MAX).saturating_add(1)
}

/// Whether `environment` is `Queued` because its database server holds its limit.
pub fn queued_for_a_branch(environment: &PreviewEnvironment) -> bool {
    environment.status.as_ref().is_some_and(|status| {
        status.phase == Phase::Queued
            && status
                .conditions
                .iter()
                .any(|c| c.reason == RefusalReason::DatabaseServerFull.as_str())
    })
}
