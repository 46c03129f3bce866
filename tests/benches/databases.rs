//! Benchmark: an environment's database by branching a seeded baseline against restoring the
//! same dump into an empty database, side by side on one real PostgreSQL (Debian's, started
//! durable: fsync and full page writes on, as a real server runs).
//!
//! `cargo bench --bench databases`. Loads a baseline of `PREVIEWD_DATABASE_BASELINE_MIB`
//! (default 1024) as its baseline role would, dumps it (`pg_dump -Fc`, as the hook jobs of
//! teams that restore per environment do), seals it, then alternates
//! `PREVIEWD_DATABASE_ROUNDS` (default 3) rounds of: a new database restored from the dump
//! (`CREATE DATABASE` + `pg_restore --jobs 2`) and a new branch (`DatabaseServer::branch`),
//! each after a `CHECKPOINT`, so that neither pays for what the other left to write.
//! Prints each time and the ratio, then makes `PREVIEWD_DATABASE_AT_ONCE` (default 20)
//! branches at once under the server's default limits and prints the wall time and each
//! branch's own. Fails if a restored database or a branch does not hold the baseline's rows.

#[path = "../support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use previewd::database::names::{self, BaselineKey};
use previewd::database::{BaselineLogin, BaselineTarget, Branched, DatabaseServer, ServerLimits};
use previewd::sandbox::postgres::{LocalPostgres, PostgresOptions};

use support::postgres::{connect, superuser_of};
use support::setting;

const KEY: BaselineKey<'static> = BaselineKey {
    template_namespace: "bench",
    template_name: "shop",
    database: "events",
};

/// About the bytes one row takes on disk with its index entry (measured: the figure printed is
/// PostgreSQL's own size of the database).
const BYTES_PER_ROW: u64 = 260;

fn main() {
    support::run_benchmark(benchmark());
}

async fn benchmark() {
    let mib: u64 = setting("PREVIEWD_DATABASE_BASELINE_MIB", 1024);
    let rounds: usize = setting("PREVIEWD_DATABASE_ROUNDS", 3);
    let at_once: usize = setting("PREVIEWD_DATABASE_AT_ONCE", 20);
    let postgres = support::postgres::start(PostgresOptions { durable: true });
    let server = postgres.server("bench", ServerLimits::default());
    let rows = mib * 1024 * 1024 / BYTES_PER_ROW;

    let started = Instant::now();
    let target = BaselineTarget::new(KEY, "v1");
    let login = server.open_baseline(&target, "loader").await.expect("open");
    let load = format!(
        "CREATE TABLE events (id bigint PRIMARY KEY, payload text NOT NULL);
         INSERT INTO events SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, {rows}) g;
"
    );
    server
        .load_sql(&login, &load)
        .await
        .expect("load the baseline");
    // (A statement of its own: VACUUM refuses a transaction block, which several are.)
    let vacuum = "VACUUM ANALYZE events";
    server.load_sql(&login, vacuum).await.expect("vacuum");
    let size = database_size(&postgres, &target.database).await;
    println!(
        "baseline: {rows} rows, {:.0} MiB (pg_database_size), loaded in {:.1} s",
        size as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    let dump = tempfile::NamedTempFile::new().expect("dump file");
    let dumped = Instant::now();
    run_tool(&postgres, "pg_dump", &login, &["-Fc", "-f"], dump.path());
    server.seal_baseline(&target).await.expect("seal");
    println!(
        "dump (pg_dump -Fc): {:.0} MiB in {:.1} s",
        std::fs::metadata(dump.path()).map(|m| m.len()).unwrap_or(0) as f64 / 1048576.0,
        dumped.elapsed().as_secs_f64()
    );

    side_by_side(&postgres, &server, &target, dump.path(), rows, rounds).await;
    all_at_once(&postgres, &server, &target, rows, at_once).await;
}

/// Alternates a restore and a branch, `rounds` times; prints each and the medians' ratio.
async fn side_by_side(
    postgres: &LocalPostgres,
    server: &DatabaseServer,
    target: &BaselineTarget,
    dump: &Path,
    rows: u64,
    rounds: usize,
) {
    let mut restores = Vec::new();
    let mut branches = Vec::new();
    for round in 0..rounds {
        let restored = format!("restore_{round}");
        checkpoint(postgres).await;
        let started = Instant::now();
        server
            .execute_as_admin(&format!("CREATE DATABASE {restored}"))
            .await
            .expect("create the empty database");
        let admin = postgres.admin_address("bench");
        let as_admin = BaselineLogin {
            host: admin.host.clone(),
            port: admin.port,
            database: restored.clone(),
            user: admin.admin_user.clone(),
            password: admin.admin_password.clone(),
        };
        run_tool(
            postgres,
            "pg_restore",
            &as_admin,
            &["--no-owner", "--no-acl", "--jobs", "2"],
            dump,
        );
        let restore = started.elapsed();
        assert_rows(
            postgres,
            &restored,
            &as_admin.user,
            &as_admin.password,
            rows,
        )
        .await;
        server
            .execute_as_admin(&format!("DROP DATABASE {restored} WITH (FORCE)"))
            .await
            .expect("drop");

        let name = names::branch(&format!("side-by-side-{round}"), "events");
        checkpoint(postgres).await;
        let made = server.branch(&name, target, "pw").await.expect("branch");
        let Branched::Made { took } = made else {
            panic!("round {round}: {made:?}")
        };
        assert_rows(postgres, &name, &name, "pw", rows).await;
        server.drop_branch(&name).await.expect("drop the branch");
        println!(
            "round {}: restore {:.2} s, branch {:.2} s",
            round + 1,
            restore.as_secs_f64(),
            took.as_secs_f64()
        );
        restores.push(restore);
        branches.push(took);
    }
    let (restore, branch) = (median(&mut restores), median(&mut branches));
    println!(
        "median of {rounds}: restore {:.2} s, branch {:.2} s: branching takes {:.3}x the restore ({:.1}x faster)",
        restore.as_secs_f64(),
        branch.as_secs_f64(),
        branch.as_secs_f64() / restore.as_secs_f64(),
        restore.as_secs_f64() / branch.as_secs_f64()
    );
}

/// `count` branches asked at once; prints the wall time and each branch's own time.
async fn all_at_once(
    postgres: &LocalPostgres,
    server: &DatabaseServer,
    target: &BaselineTarget,
    rows: u64,
    count: usize,
) {
    checkpoint(postgres).await;
    let started = Instant::now();
    let names: Vec<String> = (0..count)
        .map(|i| names::branch(&format!("at-once-{i}"), "events"))
        .collect();
    let made =
        futures::future::join_all(names.iter().map(|name| async move {
            (server.branch(name, target, "pw").await, started.elapsed())
        }))
        .await;
    let wall = started.elapsed();
    let mut ready_after: Vec<Duration> = made
        .into_iter()
        .map(|(result, after)| {
            result.expect("branch");
            after
        })
        .collect();
    for name in &names {
        assert_rows(postgres, name, name, "pw", rows).await;
        server.drop_branch(name).await.expect("drop");
    }
    ready_after.sort();
    let limits = server.limits();
    println!(
        "{count} branches asked at once ({} at a time): all ready in {:.2} s; each ready after p50 {:.2} s, max {:.2} s",
        limits.concurrent_operations,
        wall.as_secs_f64(),
        ready_after[ready_after.len() / 2].as_secs_f64(),
        ready_after[ready_after.len() - 1].as_secs_f64()
    );
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Runs `pg_dump` or `pg_restore` of the installed PostgreSQL against `login`'s database.
fn run_tool(
    postgres: &LocalPostgres,
    tool: &str,
    login: &BaselineLogin,
    args: &[&str],
    file: &Path,
) {
    let status = Command::new(postgres.bin().join(tool))
        .args(["-h", &login.host, "-p", &login.port.to_string()])
        .args(["-U", &login.user, "-d", &login.database])
        .args(args)
        .arg(file)
        .env("PGPASSWORD", &login.password)
        .status()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(status.success(), "{tool} failed: {status}");
}

async fn assert_rows(
    postgres: &LocalPostgres,
    database: &str,
    user: &str,
    password: &str,
    rows: u64,
) {
    let address = postgres.superuser_address();
    let client = connect(&address, database, user, password)
        .await
        .unwrap_or_else(|e| panic!("{user} logs in to {database}: {e}"));
    let row = client
        .query_one("SELECT count(*) FROM events", &[])
        .await
        .expect("count");
    let counted: i64 = row.get(0);
    assert_eq!(counted as u64, rows, "{database} holds the baseline's rows");
}

/// Writes out what the step before left dirty, so that no timed step pays for another's
/// writes (a file copy checkpoints, and would flush what a restore just wrote).
async fn checkpoint(postgres: &LocalPostgres) {
    let client = superuser_of(postgres).await;
    client
        .batch_execute("CHECKPOINT")
        .await
        .expect("checkpoint");
}

async fn database_size(postgres: &LocalPostgres, database: &str) -> i64 {
    superuser_of(postgres)
        .await
        .query_one("SELECT pg_database_size($1)", &[&database])
        .await
        .expect("size")
        .get(0)
}
