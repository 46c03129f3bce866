//! An environment's branch of a sealed baseline: a database copied with `CREATE DATABASE …
//! TEMPLATE`, owned by a login role of the same name that reaches it alone.
//!
//! The steps, each safe to run again: the role (created, or its password set again); the copy,
//! closed to connections until `PUBLIC`'s `CONNECT` is revoked; the baseline role's objects in
//! the copy handed to the environment's role; the marker comment, last. A database without the
//! marker is a branch a stopped previewd left half-made, and is dropped and made again.

use std::time::{Duration, Instant};

use super::DatabaseError;
use super::baseline::{BaselineTarget, Found, SEALED};
use super::server::{DatabaseServer, Reservation};
use super::sql::{ident, literal};

/// The comment a finished branch carries.
const READY: &str = "previewd branch, ready";

/// What [`DatabaseServer::branch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branched {
    /// The branch was made now; `took` is the time from the turn to the marker.
    Made { took: Duration },
    /// It was there already, finished; only its role's password was set.
    Present,
}

impl DatabaseServer {
    /// Makes the branch `name` of `baseline` (a sealed version) for an environment, its role
    /// logging in with `password`. Refused with [`DatabaseError::Full`] when the server holds
    /// its limit of branches.
    pub async fn branch(
        &self,
        name: &str,
        baseline: &BaselineTarget,
        password: &str,
    ) -> Result<Branched, DatabaseError> {
        let _turn = self.turn().await;
        let started = Instant::now();
        let admin = self.admin(None).await?;
        self.recent_enough(&admin).await?;
        let connections = self.limits().role_connection_limit;
        let half_made = match self.find(&admin, name).await? {
            Found::Present(Some(ref c)) if c == READY => {
                self.login_role(&admin, name, password, connections).await?;
                return Ok(Branched::Present);
            }
            Found::Present(_) => true,
            Found::Absent => false,
        };
        let _place = self.within_limit(&admin, name).await?;
        let found = self.find(&admin, &baseline.database).await?;
        if !matches!(found, Found::Present(Some(ref c)) if c == SEALED) {
            return Err(DatabaseError::BaselineNotReady(baseline.database.clone()));
        }
        self.login_role(&admin, name, password, connections).await?;
        if half_made {
            let drop = format!("DROP DATABASE {} WITH (FORCE)", ident(name)?);
            self.run(&admin, "dropping a half-made branch", &drop)
                .await?;
        }
        self.copy(&admin, name, baseline).await?;
        Ok(Branched::Made {
            took: started.elapsed(),
        })
    }

    /// The copy, by file, closed to connections until `PUBLIC`'s `CONNECT` is gone; the
    /// baseline role's objects handed to the branch's role; the marker, last. (Through the
    /// WAL, PostgreSQL's default since 15, a 1 GiB copy took five times as long here:
    /// docs/performance.md, "A database per environment".)
    async fn copy(
        &self,
        admin: &tokio_postgres::Client,
        name: &str,
        baseline: &BaselineTarget,
    ) -> Result<(), DatabaseError> {
        let database = ident(name)?;
        for statement in [
            format!(
                "CREATE DATABASE {database} OWNER {database} TEMPLATE {} ALLOW_CONNECTIONS false \
                 STRATEGY FILE_COPY",
                ident(&baseline.database)?
            ),
            format!("REVOKE ALL ON DATABASE {database} FROM PUBLIC"),
            format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true"),
        ] {
            self.run(admin, "copying the baseline", &statement).await?;
        }
        let inside = self.admin(Some(name)).await?;
        let hand_over = format!("REASSIGN OWNED BY {} TO {database}", ident(&baseline.role)?);
        self.run(&inside, "handing the copy to its role", &hand_over)
            .await?;
        drop(inside);
        let mark = format!("COMMENT ON DATABASE {database} IS {}", literal(READY)?);
        self.run(admin, "marking the branch", &mark).await
    }

    /// Whether the branch `name` exists and is finished.
    pub async fn branch_ready(&self, name: &str) -> Result<bool, DatabaseError> {
        let admin = self.admin(None).await?;
        let found = self.find(&admin, name).await?;
        Ok(matches!(found, Found::Present(Some(ref c)) if c == READY))
    }

    /// Drops the branch `name` and its role, whatever state they are in (absent is done), and
    /// whatever the role did to itself (see [`DatabaseServer::drop_role`]).
    pub async fn drop_branch(&self, name: &str) -> Result<(), DatabaseError> {
        let _turn = self.turn().await;
        let admin = self.admin(None).await?;
        let quoted = ident(name)?;
        if self.role_exists(&admin, name).await? {
            // The owner's membership first: without it the database cannot be dropped.
            let member = format!("GRANT {quoted} TO CURRENT_USER");
            self.run(&admin, "taking a branch back", &member).await?;
        }
        let drop = format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)");
        self.run(&admin, "dropping a branch", &drop).await?;
        self.drop_role(&admin, name).await
    }

    /// Gives the role of the finished branch `name` this password again (its Secret was lost).
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), DatabaseError> {
        let admin = self.admin(None).await?;
        let connections = self.limits().role_connection_limit;
        self.login_role(&admin, name, password, connections).await
    }

    /// Reserves `name`'s place among the server's branches (refused when the server holds
    /// its limit; `name` itself is not counted, so a half-made branch being finished is never
    /// refused for its own place).
    async fn within_limit(
        &self,
        admin: &tokio_postgres::Client,
        name: &str,
    ) -> Result<Reservation, DatabaseError> {
        let on_server = self.branches_on(admin).await?;
        self.reserve(name, &on_server)
    }
}
