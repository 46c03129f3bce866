//! A template database's baseline: opened for its loader, loaded, sealed.
//!
//! A version is loaded into a database of its own while previewd's admin owns it and the
//! baseline role owns its `public` schema; the loader (SQL previewd runs as that role, or a
//! job given [`BaselineLogin`]) can create what it likes there and nothing elsewhere. Sealing
//! closes the database to connections, ends its sessions, takes the role's login away and
//! marks the database; only a sealed version is branched. Sealing a new version drops the
//! older ones: environments already branched keep their copy, new ones get the new rows.

use super::DatabaseError;
use super::names::{BaselineKey, baseline_database, baseline_role};
use super::server::DatabaseServer;
use super::sql::{ident, literal};

/// The comment a sealed baseline database carries.
pub(super) const SEALED: &str = "previewd baseline, sealed";
/// Connections the baseline role may hold while it loads.
const LOADER_CONNECTIONS: u32 = 4;

/// One version of a template database's baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineTarget {
    pub role: String,
    pub database: String,
}

impl BaselineTarget {
    pub fn new(key: BaselineKey<'_>, version: &str) -> Self {
        Self {
            role: baseline_role(key),
            database: baseline_database(key, version),
        }
    }
}

/// How a loader logs in to a baseline being loaded.
#[derive(Clone)]
pub struct BaselineLogin {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for BaselineLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaselineLogin")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What the catalogue says of a database previewd named.
pub(super) enum Found {
    Absent,
    /// Exists, with its comment (previewd's marker once finished).
    Present(Option<String>),
}

/// Whose sessions [`DatabaseServer::end_sessions`] ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Sessions<'a> {
    /// Every session on this database.
    On(&'a str),
    /// Every session of this role.
    Of(&'a str),
}

impl DatabaseServer {
    /// Whether `database` exists and what its comment says.
    pub(super) async fn find(
        &self,
        client: &tokio_postgres::Client,
        database: &str,
    ) -> Result<Found, DatabaseError> {
        let row = client
            .query_opt(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
                &[&database],
            )
            .await
            .map_err(|e| self.failed("reading the catalogue", e))?;
        Ok(match row {
            None => Found::Absent,
            Some(row) => Found::Present(row.get(0)),
        })
    }

    /// Whether this version is loaded and sealed, ready to branch.
    pub async fn baseline_sealed(&self, target: &BaselineTarget) -> Result<bool, DatabaseError> {
        let admin = self.admin(None).await?;
        let found = self.find(&admin, &target.database).await?;
        Ok(matches!(found, Found::Present(Some(ref c)) if c == SEALED))
    }

    /// Makes an empty database for this version (dropping an unfinished one of the same
    /// version) and lets the baseline role in with `password`, for its loader.
    pub async fn open_baseline(
        &self,
        target: &BaselineTarget,
        password: &str,
    ) -> Result<BaselineLogin, DatabaseError> {
        let _turn = self.turn().await;
        let admin = self.admin(None).await?;
        self.recent_enough(&admin).await?;
        let database = ident(&target.database)?;
        let role = ident(&target.role)?;
        match self.find(&admin, &target.database).await? {
            Found::Present(Some(ref c)) if c == SEALED => {
                return Err(self.statement("opening a baseline", "this version is sealed"));
            }
            Found::Present(_) => {
                let drop = format!("DROP DATABASE {database} WITH (FORCE)");
                self.run(&admin, "dropping an unfinished baseline", &drop)
                    .await?;
            }
            Found::Absent => {}
        }
        self.login_role(&admin, &target.role, password, LOADER_CONNECTIONS)
            .await?;
        // Closed to connections until PUBLIC's CONNECT is gone: no other role slips in.
        // (One statement a request: CREATE DATABASE refuses to run in a transaction block,
        // which several statements in one request are.)
        for statement in [
            // From template0: template1 is open to connections, and what anyone left there
            // would be copied into every baseline and branch.
            format!("CREATE DATABASE {database} TEMPLATE template0 ALLOW_CONNECTIONS false"),
            format!("REVOKE ALL ON DATABASE {database} FROM PUBLIC"),
            format!("GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {database} TO {role}"),
            format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true"),
        ] {
            self.run(&admin, "creating a baseline", &statement).await?;
        }
        let inside = self.admin(Some(&target.database)).await?;
        let schema = format!("ALTER SCHEMA public OWNER TO {role}");
        self.run(
            &inside,
            "handing the baseline's schema to its role",
            &schema,
        )
        .await?;
        Ok(BaselineLogin {
            host: self.address().host.clone(),
            port: self.address().port,
            database: target.database.clone(),
            user: target.role.clone(),
            password: password.to_string(),
        })
    }

    /// Runs `sql` as the baseline role, in its database (a baseline given as SQL text). The
    /// text is the template's: it runs with the baseline role's rights, never previewd's.
    pub async fn load_sql(&self, login: &BaselineLogin, sql: &str) -> Result<(), DatabaseError> {
        let loader = self
            .connect(&login.database, &login.user, &login.password)
            .await?;
        self.run(&loader, "loading the baseline", sql).await
    }

    /// Closes this version to connections, ends its sessions, takes the role's login away,
    /// marks it sealed, and drops the other versions of the same template database.
    pub async fn seal_baseline(&self, target: &BaselineTarget) -> Result<(), DatabaseError> {
        let _turn = self.turn().await;
        let admin = self.admin(None).await?;
        let database = ident(&target.database)?;
        let role = ident(&target.role)?;
        for statement in [
            format!("ALTER DATABASE {database} ALLOW_CONNECTIONS false"),
            format!("ALTER ROLE {role} NOLOGIN"),
        ] {
            self.run(&admin, "closing the baseline", &statement).await?;
        }
        self.end_sessions(&admin, Sessions::On(&target.database))
            .await?;
        self.end_sessions(&admin, Sessions::Of(&target.role))
            .await?;
        let mark = format!("COMMENT ON DATABASE {database} IS {}", literal(SEALED)?);
        self.run(&admin, "sealing the baseline", &mark).await?;
        // Older sealed versions only: an unsealed one may be another version's load under way
        // (it is dropped when that version is opened again).
        for old in self.versions(&admin, &target.role).await? {
            let found = self.find(&admin, &old).await?;
            let sealed = matches!(found, Found::Present(Some(ref c)) if c == SEALED);
            if old != target.database && sealed {
                let drop = format!("DROP DATABASE {} WITH (FORCE)", ident(&old)?);
                self.run(&admin, "dropping an older baseline", &drop)
                    .await?;
            }
        }
        Ok(())
    }

    /// Drops every version of a template database's baseline and its role (the template no
    /// longer asks for it). Branches already made stay.
    pub async fn drop_baseline(&self, key: BaselineKey<'_>) -> Result<(), DatabaseError> {
        let _turn = self.turn().await;
        let admin = self.admin(None).await?;
        let role = baseline_role(key);
        for version in self.versions(&admin, &role).await? {
            let drop = format!("DROP DATABASE {} WITH (FORCE)", ident(&version)?);
            self.run(&admin, "dropping a baseline", &drop).await?;
        }
        self.drop_role(&admin, &role).await
    }

    /// The databases holding versions of the baseline whose role is `role`.
    async fn versions(
        &self,
        admin: &tokio_postgres::Client,
        role: &str,
    ) -> Result<Vec<String>, DatabaseError> {
        let prefix = format!("{role}_");
        let rows = admin
            .query(
                "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
                &[&prefix],
            )
            .await
            .map_err(|e| self.failed("listing baseline versions", e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Ends every session of `role` (a load that ran past its time).
    pub async fn end_sessions_of_role(&self, role: &str) -> Result<(), DatabaseError> {
        let admin = self.admin(None).await?;
        self.end_sessions(&admin, Sessions::Of(role)).await
    }

    /// Ends every session of `whose` but previewd's own, waiting up to 5 s for each to end
    /// (a role's on any database). The two queries are fixed: a name
    /// reaches them only as a bound parameter.
    pub(super) async fn end_sessions(
        &self,
        admin: &tokio_postgres::Client,
        whose: Sessions<'_>,
    ) -> Result<(), DatabaseError> {
        let (query, name, step) = match whose {
            Sessions::On(database) => (
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
                "ending sessions",
            ),
            Sessions::Of(role) => (
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
                 WHERE usename = $1 AND pid <> pg_backend_pid()",
                role,
                "ending a role's sessions",
            ),
        };
        admin
            .execute(query, &[&name])
            .await
            .map_err(|e| self.failed(step, e))?;
        Ok(())
    }

    pub(super) fn statement(&self, step: &'static str, message: &str) -> DatabaseError {
        DatabaseError::Statement {
            server: self.address().name.clone(),
            step,
            message: message.to_string(),
        }
    }
}
