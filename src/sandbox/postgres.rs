//! A PostgreSQL server of the sandbox's own, from the PostgreSQL installed on this machine
//! (Debian's `postgresql` package): for the demo's database per environment, the tests and
//! the benchmarks. Never a stand-in: the real server, in a folder of its own, on a free port of
//! 127.0.0.1, stopped (fast shutdown) with the sandbox.
//!
//! PostgreSQL refuses to run as root; run as root (CI, containers), it runs as the `postgres`
//! user the package creates. It has two logins: its superuser, for the tests to look from
//! outside, and `previewd`, the admin previewd uses, with `CREATEDB` and `CREATEROLE` and no
//! more, as docs/installing.md asks of an operator's server.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::SandboxError;
use super::process::{ManagedProcess, SpawnOptions, stop_all_at_exit};
use crate::database::{DatabaseServer, ServerAddress, ServerLimits};

/// The superuser initdb makes.
pub const SUPERUSER: &str = "postgres";
/// The admin previewd logs in as.
pub const ADMIN: &str = "previewd";

/// How the server is started.
#[derive(Debug, Clone, Copy, Default)]
pub struct PostgresOptions {
    /// Whether writes are flushed to disk as on a real server (`fsync`, full page writes).
    /// Tests and the demo run without: their data lives as long as they do.
    pub durable: bool,
}

/// A running PostgreSQL of the sandbox's own.
pub struct LocalPostgres {
    process: ManagedProcess,
    bin: PathBuf,
    port: u16,
    superuser_password: String,
    admin_password: String,
}

impl LocalPostgres {
    /// The folder of the installed PostgreSQL's programs: `$PREVIEWD_POSTGRES_BIN`, else the
    /// newest `/usr/lib/postgresql/<version>/bin` holding `postgres` and `initdb`.
    pub fn installed() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("PREVIEWD_POSTGRES_BIN") {
            return Some(PathBuf::from(dir));
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let bin = entry.path().join("bin");
                let complete = bin.join("postgres").is_file() && bin.join("initdb").is_file();
                complete.then_some((version, bin))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    }

    /// Makes a new cluster in a folder of its own and starts it.
    pub async fn start(options: PostgresOptions) -> Result<Self, SandboxError> {
        let bin = Self::installed().ok_or_else(|| {
            SandboxError::Provision(
                "PostgreSQL is not installed (Debian: apt-get install postgresql)".into(),
            )
        })?;
        let dir = tempfile::Builder::new()
            .prefix("previewd-sandbox-postgres-")
            .tempdir()
            .map_err(|e| SandboxError::io(Path::new("/tmp"), e))?
            .keep();
        stop_all_at_exit(&dir);
        let user = server_user()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| SandboxError::io(&dir, e))?;
        }
        let superuser_password = super::control_plane::random_hex(16)?;
        init_cluster(&bin, &dir, user, &superuser_password).await?;
        let (process, port) = start_server(&bin, &dir, user, options)?;
        let mut server = Self {
            process,
            bin,
            port,
            superuser_password,
            admin_password: super::control_plane::random_hex(16)?,
        };
        server.wait_until_answering().await?;
        server.create_admin().await?;
        Ok(server)
    }

    /// previewd's admin login on this server, as an operator would name it.
    pub fn admin_address(&self, name: &str) -> ServerAddress {
        self.address(name, ADMIN, &self.admin_password)
    }

    /// The superuser's login, for looking at the server from outside previewd.
    pub fn superuser_address(&self) -> ServerAddress {
        self.address("superuser", SUPERUSER, &self.superuser_password)
    }

    /// A [`DatabaseServer`] for previewd's admin, with `limits`.
    pub fn server(&self, name: &str, limits: ServerLimits) -> DatabaseServer {
        DatabaseServer::new(self.admin_address(name), limits)
    }

    /// The folder of PostgreSQL's programs (`pg_dump`, `pg_restore`).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn address(&self, name: &str, user: &str, password: &str) -> ServerAddress {
        ServerAddress {
            name: name.to_string(),
            host: "127.0.0.1".into(),
            port: self.port,
            admin_user: user.into(),
            admin_password: password.into(),
            admin_database: "postgres".into(),
        }
    }

    async fn wait_until_answering(&mut self) -> Result<(), SandboxError> {
        let server = DatabaseServer::new(self.superuser_address(), ServerLimits::default());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match server.branches().await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(SandboxError::Process(format!(
                        "PostgreSQL did not answer within 30 s: {e}\n{}",
                        self.process.log_tail(20)
                    )));
                }
                Err(_) => {}
            }
            if let Some(status) = self.process.exited() {
                return Err(SandboxError::Process(format!(
                    "PostgreSQL exited ({status}):\n{}",
                    self.process.log_tail(20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn create_admin(&self) -> Result<(), SandboxError> {
        let server = DatabaseServer::new(self.superuser_address(), ServerLimits::default());
        let statement = format!(
            "CREATE ROLE {} WITH LOGIN CREATEDB CREATEROLE PASSWORD {}",
            crate::database::sql::ident(ADMIN).map_err(|e| SandboxError::Process(e.to_string()))?,
            crate::database::sql::literal(&self.admin_password)
                .map_err(|e| SandboxError::Process(e.to_string()))?
        );
        server
            .execute_as_admin(&statement)
            .await
            .map_err(|e| SandboxError::Process(format!("creating previewd's admin: {e}")))
    }
}

/// `(uid, gid)` of the `postgres` user when we are root (PostgreSQL will not run as root);
/// `None` otherwise.
fn server_user() -> Result<Option<(u32, u32)>, SandboxError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new(SUPERUSER).map_err(|e| SandboxError::Process(e.to_string()))?;
    // SAFETY: getpwnam returns NULL or a pointer to a static record we read at once.
    let record = unsafe { libc::getpwnam(name.as_ptr()) };
    if record.is_null() {
        return Err(SandboxError::Provision(
            "running as root, PostgreSQL needs the postgres user (Debian's postgresql package \
             creates it)"
                .into(),
        ));
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*record).pw_uid, (*record).pw_gid) };
    Ok(Some((uid, gid)))
}

/// `initdb` into `<dir>/data`: the superuser with a password, scram logins, UTF-8, C locale.
async fn init_cluster(
    bin: &Path,
    dir: &Path,
    user: Option<(u32, u32)>,
    password: &str,
) -> Result<(), SandboxError> {
    let password_file = dir.join("superuser-password");
    std::fs::write(&password_file, password).map_err(|e| SandboxError::io(&password_file, e))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&password_file, Some(uid), Some(gid))
            .map_err(|e| SandboxError::io(&password_file, e))?;
    }
    let mut command = tokio::process::Command::new(bin.join("initdb"));
    command
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-U", SUPERUSER, "--auth=scram-sha-256", "-E", "UTF8"])
        .args(["--no-locale", "--no-sync", "--no-instructions"])
        .arg(format!("--pwfile={}", password_file.display()))
        .current_dir(dir)
        .kill_on_drop(true);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    let output = command
        .output()
        .await
        .map_err(|e| SandboxError::Process(format!("cannot run initdb: {e}")))?;
    let _ = std::fs::remove_file(&password_file);
    if !output.status.success() {
        return Err(SandboxError::Process(format!(
            "initdb failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

/// Starts `postgres` on a free port of 127.0.0.1, its socket in `dir`.
fn start_server(
    bin: &Path,
    dir: &Path,
    user: Option<(u32, u32)>,
    options: PostgresOptions,
) -> Result<(ManagedProcess, u16), SandboxError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|e| SandboxError::Process(format!("no free port: {e}")))?
        .port();
    let mut args: Vec<String> = vec![
        "-D".into(),
        dir.join("data").display().to_string(),
        "-p".into(),
        port.to_string(),
        "-c".into(),
        "listen_addresses=127.0.0.1".into(),
        "-c".into(),
        format!("unix_socket_directories={}", dir.display()),
        "-c".into(),
        "max_connections=300".into(),
    ];
    if !options.durable {
        for setting in [
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
        ] {
            args.extend(["-c".to_string(), setting.to_string()]);
        }
    }
    let spawn = SpawnOptions {
        user,
        stop_signal: libc::SIGINT,
    };
    let log = dir.join("postgres.log");
    let process =
        ManagedProcess::spawn_with("postgres", &bin.join("postgres"), &args, &log, spawn)?;
    Ok((process, port))
}
