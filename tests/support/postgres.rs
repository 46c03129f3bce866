//! A real PostgreSQL per test binary (Debian's `postgresql`, started by the sandbox's own
//! starter, `previewd::sandbox::postgres`), and ways to look at it from outside previewd.

use std::sync::OnceLock;

use previewd::database::{DatabaseServer, ServerAddress, ServerLimits};
use previewd::sandbox::postgres::{LocalPostgres, PostgresOptions};

/// The PostgreSQL every database test of this binary shares, started on first use. Tests
/// keep apart by naming their baselines and environments after themselves.
pub fn postgres() -> &'static LocalPostgres {
    static SHARED: OnceLock<LocalPostgres> = OnceLock::new();
    SHARED.get_or_init(|| start(PostgresOptions::default()))
}

/// A PostgreSQL of its own (a test that fills a server to its limit, a benchmark).
pub fn start(options: PostgresOptions) -> LocalPostgres {
    // On a thread with a runtime of its own: a test's runtime ends with the test, and the
    // server lives in a static.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(LocalPostgres::start(options))
    })
    .join()
    .expect("the PostgreSQL starter thread")
    .unwrap_or_else(|e| panic!("the test PostgreSQL did not start: {e}"))
}

/// previewd's server on the shared PostgreSQL, with `limits`.
pub fn server(limits: ServerLimits) -> DatabaseServer {
    postgres().server("test-postgres", limits)
}

/// A client logged in as `user` to `database` on the server at `address`.
pub async fn connect(
    address: &ServerAddress,
    database: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::Config::new()
        .host(&address.host)
        .port(address.port)
        .user(user)
        .password(password)
        .dbname(database)
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The superuser, on the `postgres` database of the shared server.
pub async fn superuser() -> tokio_postgres::Client {
    superuser_of(postgres()).await
}

/// The superuser of `server`, on its `postgres` database.
pub async fn superuser_of(server: &LocalPostgres) -> tokio_postgres::Client {
    let address = server.superuser_address();
    connect(
        &address,
        "postgres",
        &address.admin_user,
        &address.admin_password,
    )
    .await
    .expect("the superuser logs in")
}

/// Whether a database of this name exists, and a role of this name.
pub async fn database_and_role(name: &str) -> (bool, bool) {
    let client = superuser().await;
    let database = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .expect("catalogue")
        .is_some();
    let role = client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&name])
        .await
        .expect("catalogue")
        .is_some();
    (database, role)
}

/// The SQLSTATE of a failed statement or login (`""` for an error without one).
pub fn code(error: &tokio_postgres::Error) -> String {
    error
        .as_db_error()
        .map(|db| db.code().code().to_string())
        .unwrap_or_default()
}

/// Registers `postgres` as the `PreviewDatabaseServer` `name` for templates of `namespace`,
/// its admin Secret in `namespace` (the tests' previewd reads credentials there), with at
/// most `max_branches`.
pub async fn register_server(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    postgres: &LocalPostgres,
    max_branches: Option<u64>,
) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use previewd::model::crd::PreviewDatabaseServer;
    let admin = postgres.admin_address(name);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{name}-admin")},
        "type": previewd::cluster::secrets::DATABASE_CREDENTIAL_TYPE,
        "stringData": {"username": admin.admin_user, "password": admin.admin_password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut limits = serde_json::json!({});
    if let Some(max) = max_branches {
        limits["maxBranches"] = max.into();
    }
    let server: PreviewDatabaseServer = serde_json::from_value(serde_json::json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewDatabaseServer",
        "metadata": {"name": name},
        "spec": {"host": admin.host, "port": admin.port, "adminSecretRef": {"name": format!("{name}-admin")},
                 "egressCidrs": ["127.0.0.1/32"], "limits": limits, "templateNamespaces": [namespace]},
    }))
    .unwrap();
    Api::<PreviewDatabaseServer>::all(client.clone())
        .create(&PostParams::default(), &server)
        .await
        .unwrap();
}

/// Removes the `PreviewDatabaseServer` `name` (cluster-scoped: the namespace's deletion does
/// not take it).
pub async fn unregister_server(client: &kube::Client, name: &str) {
    use kube::api::{Api, DeleteParams};
    let _ = Api::<previewd::model::crd::PreviewDatabaseServer>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}
