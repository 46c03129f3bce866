//! An environment's branch of a sealed baseline: a database copied with `CREATE DATABASE …
//! TEMPLATE`, owned by a login role of the same name that reaches it alone.
//!
//! The steps, each safe to run again: the role (created, or its password set again); the copy,
//! closed to connections until `PUBLIC`'s `CONNECT` is revoked; the baseline role's objects in
//! the copy handed to the environment's role; the marker comment, last. A database without the
//! marker is a branch a stopped previewd left half-made, and is dropped and made again.

use std::time::{Duration, Instant};

use super::DatabaseError;
use super::baseline::{BaselineTarget, Found};
use super::names::BRANCH_PREFIX;
use super::server::DatabaseServer;
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
        let connections = self.limits().role_connection_limit;
        let half_made = match self.find(&admin, name).await? {
            Found::Present(Some(ref c)) if c == READY => {
                self.login_role(&admin, name, password, connections).await?;
                return Ok(Branched::Present);
            }
            Found::Present(_) => true,
            Found::Absent => false,
        };
        self.within_limit(&admin, name).await?;
        if !matches!(self.find(&admin, &baseline.database).await?, Found::Present(Some(ref c)) if c == super::baseline::SEALED)
        {
            return Err(DatabaseError::BaselineNotReady(baseline.database.clone()));
        }
        self.login_role(&admin, name, password, connections).await?;
        let database = ident(name)?;
        if half_made {
            let drop = format!("DROP DATABASE {database} WITH (FORCE)");
            self.run(&admin, "dropping a half-made branch", &drop)
                .await?;
        }
        for statement in [
            format!(
                "CREATE DATABASE {database} OWNER {database} TEMPLATE {} ALLOW_CONNECTIONS false{}",
                ident(&baseline.database)?,
                self.copy_strategy(&admin).await?
            ),
            format!("REVOKE ALL ON DATABASE {database} FROM PUBLIC"),
            format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true"),
        ] {
            self.run(&admin, "copying the baseline", &statement).await?;
        }
        let inside = self.admin(Some(name)).await?;
        let hand_over = format!("REASSIGN OWNED BY {} TO {database}", ident(&baseline.role)?);
        self.run(&inside, "handing the copy to its role", &hand_over)
            .await?;
        drop(inside);
        let mark = format!("COMMENT ON DATABASE {database} IS {}", literal(READY)?);
        self.run(&admin, "marking the branch", &mark).await?;
        Ok(Branched::Made {
            took: started.elapsed(),
        })
    }

    /// How the copy is made: PostgreSQL 15 and later copy a database through the WAL by
    /// default, block by block; `FILE_COPY` copies its files and checkpoints, four times as
    /// fast for a 1 GiB baseline here (docs/performance.md, "A database per environment").
    /// Before 15 there is no choice and no keyword: the copy is by file.
    async fn copy_strategy(
        &self,
        admin: &tokio_postgres::Client,
    ) -> Result<&'static str, DatabaseError> {
        let row = admin
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| self.failed("reading the server's version", e))?;
        let version: i32 = row.get(0);
        Ok(if version >= 150_000 {
            " STRATEGY FILE_COPY"
        } else {
            ""
        })
    }

    /// Whether the branch `name` exists and is finished.
    pub async fn branch_ready(&self, name: &str) -> Result<bool, DatabaseError> {
        let admin = self.admin(None).await?;
        let found = self.find(&admin, name).await?;
        Ok(matches!(found, Found::Present(Some(ref c)) if c == READY))
    }

    /// Drops the branch `name` and its role, whatever state they are in (absent is done).
    pub async fn drop_branch(&self, name: &str) -> Result<(), DatabaseError> {
        let _turn = self.turn().await;
        let admin = self.admin(None).await?;
        let quoted = ident(name)?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {quoted}"),
        ] {
            self.run(&admin, "dropping a branch", &statement).await?;
        }
        Ok(())
    }

    /// Refuses a new branch when the server holds its limit (`name` itself not counted, so a
    /// half-made branch being finished is never refused for its own place).
    async fn within_limit(
        &self,
        admin: &tokio_postgres::Client,
        name: &str,
    ) -> Result<(), DatabaseError> {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1) AND datname <> $2",
                &[&BRANCH_PREFIX, &name],
            )
            .await
            .map_err(|e| self.failed("counting branches", e))?;
        let held: i64 = row.get(0);
        let held = u64::try_from(held).unwrap_or(0);
        if held >= self.limits().max_branches {
            return Err(self.full(held));
        }
        Ok(())
    }
}
