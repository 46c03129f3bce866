//! One PostgreSQL server previewd may create databases on: its address, the admin login, the
//! limits, and the connections previewd opens for each operation (no pool: branching is rare
//! next to the work each one does, and a connection held at rest would count against the
//! server's own limit).

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, NoTls};

use super::DatabaseError;
use super::names::BRANCH_PREFIX;

/// How long a connection may take to open before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The admin's session settings: names resolve in the catalogue only (`pg_temp` is never
/// searched for functions or operators, and listed last for the rest).
const CATALOGUE_ONLY: &str = "-c search_path=pg_catalog,pg_temp";

/// The oldest PostgreSQL previewd branches on: 15 closed `public` to `CREATE` for new
/// databases and lets `CREATE DATABASE` copy by file (`STRATEGY FILE_COPY`).
pub const OLDEST_SERVER: i32 = 150_000;

/// Where the server is and how previewd logs in as its admin (a role with `CREATEDB` and
/// `CREATEROLE`; a superuser is not needed).
#[derive(Clone)]
pub struct ServerAddress {
    /// The name the operator gave the server, for messages and metrics.
    pub name: String,
    pub host: String,
    pub port: u16,
    pub admin_user: String,
    pub admin_password: String,
    /// The database previewd's admin connects to for server-wide statements.
    pub admin_database: String,
}

impl std::fmt::Debug for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerAddress")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("admin_user", &self.admin_user)
            .finish_non_exhaustive()
    }
}

/// What one server takes at most.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Branches (environment databases) on the server at once.
    pub max_branches: u64,
    /// Branch, drop and baseline operations running at once: each copies or removes a whole
    /// database, and the server's disk is shared by all of them.
    pub concurrent_operations: usize,
    /// Connections each environment's role may open (`CONNECTION LIMIT`).
    pub role_connection_limit: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_branches: 100,
            concurrent_operations: 4,
            role_connection_limit: 20,
        }
    }
}

/// A database server and the turns of its operations.
#[derive(Debug, Clone)]
pub struct DatabaseServer {
    address: ServerAddress,
    limits: ServerLimits,
    turns: Arc<Semaphore>,
    /// Branches being made now: counted against the limit with those on the server, so that
    /// branches made at once cannot pass it together.
    reserved: Arc<Mutex<BTreeSet<String>>>,
}

impl DatabaseServer {
    pub fn new(address: ServerAddress, limits: ServerLimits) -> Self {
        let turns = Arc::new(Semaphore::new(limits.concurrent_operations.clamp(1, 64)));
        Self {
            address,
            limits,
            turns,
            reserved: Arc::default(),
        }
    }

    /// Reserves a place for branch `name` if the server's branches, those being made and this
    /// one stay within the limit; the place is given back when the guard goes.
    pub(super) fn reserve(
        &self,
        name: &str,
        on_server: &[String],
    ) -> Result<Reservation, DatabaseError> {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        let held: BTreeSet<&str> = on_server
            .iter()
            .map(String::as_str)
            .chain(reserved.iter().map(String::as_str))
            .filter(|other| *other != name)
            .collect();
        let held = u64::try_from(held.len()).unwrap_or(u64::MAX);
        if held >= self.limits.max_branches {
            return Err(self.full(held));
        }
        reserved.insert(name.to_string());
        Ok(Reservation {
            name: name.to_string(),
            reserved: self.reserved.clone(),
        })
    }

    /// Refuses a server older than [`OLDEST_SERVER`].
    pub(super) async fn recent_enough(&self, admin: &Client) -> Result<(), DatabaseError> {
        let row = admin
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| self.failed("reading the server's version", e))?;
        let version: i32 = row.get(0);
        if version < OLDEST_SERVER {
            return Err(self.statement(
                "reading the server's version",
                &format!("PostgreSQL {version} is older than 15, which previewd needs"),
            ));
        }
        Ok(())
    }

    pub fn address(&self) -> &ServerAddress {
        &self.address
    }

    pub fn limits(&self) -> ServerLimits {
        self.limits
    }

    /// Waits for one of the server's operation turns.
    pub(super) async fn turn(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed, so acquiring only waits.
        loop {
            if let Ok(permit) = self.turns.clone().acquire_owned().await {
                return permit;
            }
        }
    }

    /// A connection as previewd's admin to `database` (the admin database when `None`). Its
    /// `search_path` is the catalogue alone: a function or operator another role created in a
    /// schema of that database (`public` on a server upgraded from before 15) never runs in
    /// place of the catalogue's, as the admin
    /// (`a_function_planted_where_the_admin_looks_never_runs_as_the_admin`).
    pub(super) async fn admin(&self, database: Option<&str>) -> Result<Client, DatabaseError> {
        let database = database.unwrap_or(&self.address.admin_database);
        let (user, password) = (&self.address.admin_user, &self.address.admin_password);
        self.connect_with(database, user, password, Some(CATALOGUE_ONLY))
            .await
    }

    /// A connection as `user` to `database`; its connection task ends with the client.
    pub(super) async fn connect(
        &self,
        database: &str,
        user: &str,
        password: &str,
    ) -> Result<Client, DatabaseError> {
        self.connect_with(database, user, password, None).await
    }

    async fn connect_with(
        &self,
        database: &str,
        user: &str,
        password: &str,
        options: Option<&str>,
    ) -> Result<Client, DatabaseError> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.address.host)
            .port(self.address.port)
            .user(user)
            .password(password)
            .dbname(database)
            .application_name("previewd")
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(options) = options {
            config.options(options);
        }
        let connecting = config.connect(NoTls);
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| self.unreachable("no answer within 5 s".into()))?
            .map_err(|e| self.unreachable(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        Ok(client)
    }

    fn unreachable(&self, message: String) -> DatabaseError {
        DatabaseError::Unreachable {
            server: self.address.name.clone(),
            message,
        }
    }

    /// The error of `step`, naming the server; PostgreSQL's own message when it gave one.
    pub(super) fn failed(&self, step: &'static str, error: tokio_postgres::Error) -> DatabaseError {
        let message = match error.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => error.to_string(),
        };
        DatabaseError::Statement {
            server: self.address.name.clone(),
            step,
            message,
        }
    }

    /// Runs `statement` (no parameters) as `step`.
    pub(super) async fn run(
        &self,
        client: &Client,
        step: &'static str,
        statement: &str,
    ) -> Result<(), DatabaseError> {
        client
            .batch_execute(statement)
            .await
            .map_err(|e| self.failed(step, e))
    }

    /// Runs one statement as the admin, on the admin database (setting a server up).
    pub async fn execute_as_admin(&self, statement: &str) -> Result<(), DatabaseError> {
        let admin = self.admin(None).await?;
        self.run(&admin, "a statement of the operator's", statement)
            .await
    }

    /// The branch databases on the server, by name.
    pub async fn branches(&self) -> Result<Vec<String>, DatabaseError> {
        let client = self.admin(None).await?;
        self.branches_on(&client).await
    }

    pub(super) async fn branches_on(&self, client: &Client) -> Result<Vec<String>, DatabaseError> {
        let rows = client
            .query(
                "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname",
                &[&BRANCH_PREFIX],
            )
            .await
            .map_err(|e| self.failed("listing branches", e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    pub(super) fn full(&self, branches: u64) -> DatabaseError {
        DatabaseError::Full {
            server: self.address.name.clone(),
            branches,
        }
    }
}

/// A branch's place while it is being made (see [`DatabaseServer::reserve`]).
pub(super) struct Reservation {
    name: String,
    reserved: Arc<Mutex<BTreeSet<String>>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name);
    }
}
