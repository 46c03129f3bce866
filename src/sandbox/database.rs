//! The sandbox's database server: a PostgreSQL of its own when one is installed (Debian's
//! `postgresql`), registered as the `PreviewDatabaseServer` `sandbox-postgres`, with the
//! GitHub example (`hello-world`) asking for the database `orders` on it, so that the demo's
//! pull request gets its own branch of a 1,000-row baseline. Without PostgreSQL the sandbox
//! says so and runs as before.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::playground::{GITHUB_TEMPLATE, NAMESPACE};
use super::postgres::{LocalPostgres, PostgresOptions};
use crate::cluster::secrets::DATABASE_CREDENTIAL_TYPE;
use crate::model::crd::{PreviewDatabaseServer, PreviewEnvironment, PreviewTemplate};
use crate::reconcile::ControllerConfig;

const SERVER: &str = "sandbox-postgres";
const FIELD_MANAGER: &str = "previewd-sandbox";
const BASELINE: &str = "CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL);
INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 1000) g;";

/// The running server; stopped when dropped.
pub struct SandboxDatabase {
    _postgres: LocalPostgres,
}

/// Starts PostgreSQL when installed and has the GitHub example ask for a database on it,
/// turning databases on in `controller`; says what it did either way.
pub async fn set_up(
    client: &kube::Client,
    controller: &mut ControllerConfig,
) -> Option<SandboxDatabase> {
    if LocalPostgres::installed().is_none() {
        println!(
            "[sandbox] Database: none (PostgreSQL is not installed; `apt-get install postgresql` gives the demo's environment a database of its own)"
        );
        return None;
    }
    let started = match LocalPostgres::start(PostgresOptions::default()).await {
        Ok(postgres) => postgres,
        Err(e) => {
            println!("[sandbox] Database: none (PostgreSQL did not start: {e})");
            return None;
        }
    };
    if let Err(e) = register(client, &started).await {
        println!("[sandbox] Database: none (registering it failed: {e})");
        return None;
    }
    println!(
        "[sandbox] Database: PostgreSQL on 127.0.0.1:{}, registered as PreviewDatabaseServer {SERVER}; template {GITHUB_TEMPLATE} asks for the database orders",
        started.port()
    );
    controller.databases.credentials_namespace = Some(NAMESPACE.to_string());
    Some(SandboxDatabase { _postgres: started })
}

/// The admin Secret, the server, the baseline's ConfigMap and the template's database.
async fn register(client: &kube::Client, postgres: &LocalPostgres) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let admin = postgres.admin_address(SERVER);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sandbox-postgres-admin"},
        "type": DATABASE_CREDENTIAL_TYPE,
        "stringData": {"username": admin.admin_user, "password": admin.admin_password},
    });
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .patch("sandbox-postgres-admin", &params, &Patch::Apply(&secret))
        .await?;
    let server = json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewDatabaseServer",
        "metadata": {"name": SERVER},
        "spec": {"host": admin.host, "port": admin.port,
                 "adminSecretRef": {"name": "sandbox-postgres-admin"},
                 "egressCidrs": ["127.0.0.1/32"], "templateNamespaces": [NAMESPACE]},
    });
    Api::<PreviewDatabaseServer>::all(client.clone())
        .patch(SERVER, &params, &Patch::Apply(&server))
        .await?;
    let baseline = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-baseline"},
        "data": {"orders.sql": BASELINE},
    });
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .patch("orders-baseline", &params, &Patch::Apply(&baseline))
        .await?;
    let database = json!({
        "spec": {"databases": [{"name": "orders", "server": SERVER,
                                "baseline": {"sqlConfigMap": "orders-baseline"}}]}
    });
    Api::<PreviewTemplate>::namespaced(client.clone(), NAMESPACE)
        .patch(
            GITHUB_TEMPLATE,
            &PatchParams::default(),
            &Patch::Merge(&database),
        )
        .await?;
    Ok(())
}

/// One line per database of `environment`: its state, how long its branch took, and how many
/// rows its own login reads there (through the Secret previewd put into its namespace).
pub async fn describe(client: &kube::Client, environment: &PreviewEnvironment) -> Vec<String> {
    let Some(status) = &environment.status else {
        return Vec::new();
    };
    let namespace = status.namespace.clone().unwrap_or_default();
    let mut lines = Vec::new();
    for database in &status.databases {
        let took = database
            .branched_in_ms
            .map(|ms| {
                format!(
                    ", branched from its baseline in {:.2} s",
                    ms as f64 / 1000.0
                )
            })
            .unwrap_or_default();
        let rows = rows_seen(client, &namespace, &format!("database-{}", database.name)).await;
        lines.push(format!(
            "DATABASE: {} {}{took}; {rows}",
            database.name, database.state
        ));
    }
    lines
}

/// What the environment's own login reads in its branch.
async fn rows_seen(client: &kube::Client, namespace: &str, name: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Ok(Some(secret)) = secrets.get_opt(name).await else {
        return format!("no Secret {namespace}/{name}");
    };
    let data = secret.data.unwrap_or_default();
    let key = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .unwrap_or_default()
    };
    let mut config = tokio_postgres::Config::new();
    config
        .host(key("host"))
        .port(key("port").parse().unwrap_or(5432))
        .user(key("username"))
        .password(key("password"))
        .dbname(key("database"));
    let counted = async {
        let (db, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let row = db.query_one("SELECT count(*) FROM orders", &[]).await?;
        Ok::<i64, tokio_postgres::Error>(row.get(0))
    };
    match counted.await {
        Ok(rows) => {
            format!("its own login (Secret {namespace}/{name}) reads {rows} rows of orders")
        }
        Err(e) => format!("its own login could not read orders: {e}"),
    }
}
