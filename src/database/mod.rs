//! A database per environment, on a PostgreSQL server the operator names.
//!
//! A template asks for a database with a baseline (its rows, loaded once per baseline version);
//! every environment gets a branch of it. Three kinds of PostgreSQL objects, all named by
//! previewd from hashes ([`names`]), never from what a template or a pull request wrote:
//!
//! * a **baseline role** per template database (`pvd_base_<key>`): it owns what the baseline's
//!   loader creates, logs in only while a version is being loaded, and never reaches a branch;
//! * a **baseline database** per version (`pvd_base_<key>_<version>`), owned by previewd's
//!   admin role, which takes no connection once sealed: PostgreSQL copies it with `CREATE
//!   DATABASE … TEMPLATE`, which needs the source to be idle;
//! * a **branch** per environment (`pvd_env_<hash>`): a database and a login role of the same
//!   name. The branch is owned by its role, the baseline's objects in it are handed to the role
//!   (`REASSIGN OWNED`), and `CONNECT` is revoked from `PUBLIC`, so no other environment's role
//!   can open it.
//!
//! Every step is idempotent and a half-made branch is recognisable (its marker comment is
//! written last), so a previewd stopped at any point finishes the same branch when it comes
//! back: no second database, no orphan. Identifiers reach SQL only through [`sql::ident`],
//! values only as bound parameters or [`sql::literal`].

mod baseline;
mod branch;
pub mod names;
mod roles;
mod server;
pub mod sql;

pub use baseline::{BaselineLogin, BaselineTarget};
pub use branch::Branched;
pub use server::{DatabaseServer, ServerAddress, ServerLimits};

/// What can go wrong between previewd and a database server.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    /// The server did not answer or refused previewd's login: everything is kept as it is.
    #[error("cannot reach the database server {server}: {message}")]
    Unreachable { server: String, message: String },
    /// A statement failed; `step` says which.
    #[error("database server {server}, {step}: {message}")]
    Statement {
        server: String,
        step: &'static str,
        message: String,
    },
    /// The server holds as many branches as its limit allows.
    #[error("the database server {server} holds {branches} branches, its limit")]
    Full { server: String, branches: u64 },
    /// No sealed version of the baseline exists yet.
    #[error("the baseline {0} has no loaded version yet")]
    BaselineNotReady(String),
    /// A name or value that cannot be written as SQL (a NUL byte, too long for PostgreSQL).
    #[error("cannot be written as SQL: {0}")]
    Unwritable(String),
}
