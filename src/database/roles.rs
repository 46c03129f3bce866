//! The roles previewd makes: created or given a password again, and dropped with whatever
//! they left behind, whatever they did to themselves meanwhile.

use super::DatabaseError;
use super::baseline::Sessions;
use super::server::DatabaseServer;
use super::sql::{ident, literal};

impl DatabaseServer {
    /// Creates `role` as a plain login role, or gives an existing one this password and limit
    /// again; then makes previewd's admin a member, so an admin that is no superuser may
    /// hand its objects over and end its sessions.
    pub(super) async fn login_role(
        &self,
        admin: &tokio_postgres::Client,
        role: &str,
        password: &str,
        connections: u32,
    ) -> Result<(), DatabaseError> {
        let exists = self.role_exists(admin, role).await?;
        let name = ident(role)?;
        // A SCRAM verifier, not the password: a statement the server logs (a failure, or
        // log_statement) holds nothing a client can log in with.
        let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
        let password = literal(&verifier)?;
        let statement = if exists {
            format!(
                "ALTER ROLE {name} WITH LOGIN CONNECTION LIMIT {connections} PASSWORD {password}"
            )
        } else {
            format!(
                "CREATE ROLE {name} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
                 NOBYPASSRLS NOINHERIT CONNECTION LIMIT {connections} PASSWORD {password}"
            )
        };
        self.run(admin, "writing a login role", &statement).await?;
        let member = format!("GRANT {name} TO CURRENT_USER");
        self.run(admin, "joining a login role", &member).await
    }

    /// Drops `role` (absent is done). previewd first takes its membership back (a role on
    /// PostgreSQL 15 may revoke it from previewd itself), takes its login and ends its
    /// sessions, then drops what it owns or was granted in every database where it holds
    /// something (a large object in `postgres`, default privileges), which would otherwise
    /// refuse `DROP ROLE`.
    pub(super) async fn drop_role(
        &self,
        admin: &tokio_postgres::Client,
        role: &str,
    ) -> Result<(), DatabaseError> {
        if !self.role_exists(admin, role).await? {
            return Ok(());
        }
        let name = ident(role)?;
        for statement in [
            format!("GRANT {name} TO CURRENT_USER"),
            format!("ALTER ROLE {name} NOLOGIN"),
        ] {
            self.run(admin, "taking a role back", &statement).await?;
        }
        self.end_sessions(admin, Sessions::Of(role)).await?;
        for database in self.databases_holding(admin, role).await? {
            let inside = self.admin(Some(&database)).await?;
            let drop = format!("DROP OWNED BY {name}");
            self.run(&inside, "dropping what a role holds", &drop)
                .await?;
        }
        let drop = format!("DROP ROLE IF EXISTS {name}");
        self.run(admin, "dropping a role", &drop).await
    }

    pub(super) async fn role_exists(
        &self,
        admin: &tokio_postgres::Client,
        role: &str,
    ) -> Result<bool, DatabaseError> {
        let row = admin
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .map_err(|e| self.failed("reading the catalogue", e))?;
        Ok(row.is_some())
    }

    /// The databases (open to connections) where `role` owns or was granted something.
    async fn databases_holding(
        &self,
        admin: &tokio_postgres::Client,
        role: &str,
    ) -> Result<Vec<String>, DatabaseError> {
        let rows = admin
            .query(
                "SELECT DISTINCT d.datname FROM pg_shdepend s \
                 JOIN pg_database d ON d.oid = s.dbid \
                 JOIN pg_roles r ON r.oid = s.refobjid AND s.refclassid = 'pg_authid'::regclass \
                 WHERE r.rolname = $1 AND d.datallowconn",
                &[&role],
            )
            .await
            .map_err(|e| self.failed("finding what a role holds", e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
