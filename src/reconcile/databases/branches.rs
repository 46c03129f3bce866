//! Each database of the template as the environment's branch, its connection Secret and the
//! egress to its server.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::Utc;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::super::context::Context;
use super::super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use super::super::secrets;
use crate::database::names::{self, BaselineKey};
use crate::database::{BaselineTarget, Branched, DatabaseError, DatabaseServer};
use crate::model::crd::{
    DatabaseStatus, PreviewDatabaseServer, PreviewEnvironment, PreviewTemplate, TemplateDatabase,
};
use crate::plan::Plan;

/// `status.databases[].state` of a branch that is made.
pub(super) const READY: &str = "Ready";

/// The length of the passwords previewd gives environments' roles.
const PASSWORD_LENGTH: u32 = 32;

/// What the step adds besides the Secrets: the egress rules to the servers and the
/// databases' status.
#[derive(Debug, Default)]
pub struct PlannedDatabases {
    pub egress: Vec<Value>,
    pub statuses: Vec<DatabaseStatus>,
}

/// Plans (and, when needed, branches) every database the template asks for.
pub async fn add_databases(
    plan: &mut Plan,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<PlannedDatabases, Stop> {
    let mut planned = PlannedDatabases::default();
    for wanted in &template.spec.databases {
        let server = registered(wanted, template, context)?;
        planned.egress.push(egress_rule(&server));
        let (status, password) =
            branch_of(plan, environment, template, wanted, &server, context).await?;
        let secret = connection_secret(plan, wanted, &server, &status.branch, &password);
        secrets::add(plan, secrets::secret_object(plan, secret))?;
        planned.statuses.push(status);
    }
    Ok(planned)
}

/// The server `wanted` names, registered and admitting the template's namespace.
fn registered(
    wanted: &TemplateDatabase,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<std::sync::Arc<PreviewDatabaseServer>, Refusal> {
    let namespace = template.namespace().unwrap_or_default();
    valid_name(&wanted.name)?;
    if context.databases.config.credentials_namespace.is_none() {
        return Err(unavailable(
            format!(
                "spec.databases {}: databases are off in this previewd (its chart's databases.enabled); nothing was applied",
                wanted.name
            ),
            None,
        ));
    }
    match context.databases.server(&wanted.server) {
        Some(server) if server.spec.admits(&namespace) => Ok(server),
        _ => Err(unavailable(
            format!(
                "spec.databases {}: no PreviewDatabaseServer {:?} admits templates of namespace {namespace:?} (its spec.templateNamespaces); nothing was applied",
                wanted.name, wanted.server
            ),
            None,
        )),
    }
}

/// A database's name in a template: a DNS label of at most 30 characters (it names the
/// default Secret, `database-<name>`).
fn valid_name(name: &str) -> Result<(), Refusal> {
    let fine = !name.is_empty()
        && name.len() <= 30
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if fine {
        return Ok(());
    }
    Err(Refusal::new(
        RefusalReason::RenderFailed,
        format!(
            "spec.databases {name:?}: a name is lowercase letters, digits and '-', at most 30; nothing was applied"
        ),
    ))
}

/// The NetworkPolicy egress rule to the server: its addresses, its port, nothing else.
fn egress_rule(server: &PreviewDatabaseServer) -> Value {
    let to: Vec<Value> = server
        .spec
        .egress_cidrs
        .iter()
        .map(|cidr| json!({"ipBlock": {"cidr": cidr}}))
        .collect();
    json!({"to": to, "ports": [{"protocol": "TCP", "port": server.spec.port}]})
}

/// The branch's status and its role's password: kept from the status and the Secret when the
/// branch is made; made now otherwise.
async fn branch_of(
    plan: &Plan,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    wanted: &TemplateDatabase,
    server: &PreviewDatabaseServer,
    context: &Context,
) -> Result<(DatabaseStatus, String), Stop> {
    let uid = environment.metadata.uid.as_deref().unwrap_or_default();
    let branch = names::branch(uid, &wanted.name);
    let existing = secrets::current_data(plan, &wanted.secret_name(), context).await?;
    let password = existing
        .get("password")
        .and_then(|value| BASE64.decode(value).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let made = environment.status.as_ref().and_then(|status| {
        status
            .databases
            .iter()
            .find(|d| d.name == wanted.name && d.branch == branch && d.state == READY)
    });
    if let (Some(made), Some(password)) = (made, &password) {
        return Ok((made.clone(), password.clone()));
    }
    let connection = context
        .databases
        .connect(&context.client, &wanted.server, &server.spec)
        .await
        .map_err(|message| {
            unavailable(
                format!("spec.databases {}: {message}", wanted.name),
                Some(message.clone()),
            )
        })?;
    let baseline = sealed_baseline(&connection, template, wanted, context).await?;
    let password = match password {
        Some(password) => password,
        None => secrets::random_text(PASSWORD_LENGTH)
            .map_err(|e| unavailable(format!("no randomness from the system: {e}"), None))?,
    };
    let branched = connection
        .branch(&branch, &baseline, &password)
        .await
        .map_err(|e| refused_by_server(wanted, e))?;
    let took = match branched {
        Branched::Made { took } => Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX)),
        Branched::Present => made.and_then(|m| m.branched_in_ms),
    };
    let status = DatabaseStatus {
        name: wanted.name.clone(),
        server: wanted.server.clone(),
        branch,
        state: READY.into(),
        baseline: Some(baseline.database.clone()),
        branched_in_ms: took,
        since: Some(Utc::now()),
        message: None,
    };
    Ok((status, password))
}

/// The baseline's current version, loaded and sealed once (the SQL's digest names it).
async fn sealed_baseline(
    server: &DatabaseServer,
    template: &PreviewTemplate,
    wanted: &TemplateDatabase,
    context: &Context,
) -> Result<BaselineTarget, Stop> {
    let namespace = template.namespace().unwrap_or_default();
    let sql = baseline_sql(&namespace, wanted, context).await?;
    let version = hex::encode(Sha256::digest(sql.as_bytes()));
    let key = BaselineKey {
        template_namespace: &namespace,
        template_name: &template.name_any(),
        database: &wanted.name,
    };
    let target = BaselineTarget::new(key, &version);
    let lock = context.databases.load_lock(&target.database);
    let _loading = lock.lock().await;
    let in_words = |e: DatabaseError| refused_by_server(wanted, e);
    if server.baseline_sealed(&target).await.map_err(in_words)? {
        return Ok(target);
    }
    let password = secrets::random_text(PASSWORD_LENGTH)
        .map_err(|e| unavailable(format!("no randomness from the system: {e}"), None))?;
    let login = server
        .open_baseline(&target, &password)
        .await
        .map_err(in_words)?;
    if let Err(e) = server.load_sql(&login, &sql).await {
        return Err(Stop::Refused(Refusal::new(
            RefusalReason::DatabaseBaselineFailed,
            format!(
                "spec.databases {}: the baseline SQL of ConfigMap {namespace}/{} failed: {e}; nothing was applied (the template's authors mend the SQL; it is tried again when the environment is next reconciled)",
                wanted.name, wanted.baseline.sql_config_map
            ),
        )));
    }
    server.seal_baseline(&target).await.map_err(in_words)?;
    Ok(target)
}

/// The baseline's SQL: the ConfigMap's values in key order.
async fn baseline_sql(
    namespace: &str,
    wanted: &TemplateDatabase,
    context: &Context,
) -> Result<String, Stop> {
    let name = &wanted.baseline.sql_config_map;
    let config_maps: Api<ConfigMap> = Api::namespaced(context.client.clone(), namespace);
    let config_map = config_maps.get_opt(name).await.map_err(|e| {
        Stop::Failed(ReconcileError::Database(format!(
            "reading ConfigMap {namespace}/{name}: {e}"
        )))
    })?;
    let Some(data) = config_map.and_then(|c| c.data) else {
        return Err(Stop::Refused(Refusal::new(
            RefusalReason::DatabaseBaselineFailed,
            format!(
                "spec.databases {}: the baseline's ConfigMap {namespace}/{name} does not exist or holds no data; nothing was applied",
                wanted.name
            ),
        )));
    };
    let ordered: BTreeMap<String, String> = data.into_iter().collect();
    Ok(ordered.into_values().collect::<Vec<_>>().join("\n"))
}

/// The environment's Secret: how its pods log in to their branch.
fn connection_secret(
    plan: &Plan,
    wanted: &TemplateDatabase,
    server: &PreviewDatabaseServer,
    branch: &str,
    password: &str,
) -> Value {
    let host = &server.spec.host;
    let port = server.spec.port;
    let url = format!("postgresql://{branch}:{password}@{host}:{port}/{branch}");
    let data: BTreeMap<&str, String> = [
        ("host", host.clone()),
        ("port", port.to_string()),
        ("database", branch.to_string()),
        ("username", branch.to_string()),
        ("password", password.to_string()),
        ("url", url),
    ]
    .into_iter()
    .map(|(key, value)| (key, BASE64.encode(value)))
    .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": wanted.secret_name(), "namespace": plan.namespace, "labels": plan.labels},
        "data": data,
    })
}

/// The refusal for what the server answered: a full server queues the environment; anything
/// else is said and tried again with backoff, the environment's branch (if any) kept.
fn refused_by_server(wanted: &TemplateDatabase, error: DatabaseError) -> Stop {
    let message = format!(
        "spec.databases {} on server {}: {error}",
        wanted.name, wanted.server
    );
    match error {
        DatabaseError::Full { .. } => Stop::Refused(Refusal {
            retry: Some(Box::new(ReconcileError::Database(message.clone()))),
            ..Refusal::new(
                RefusalReason::DatabaseServerFull,
                format!("{message}; this environment waits for a branch to be removed"),
            )
        }),
        _ => unavailable(
            format!("{message}; nothing was applied, and a branch already made is kept"),
            Some(message),
        )
        .into(),
    }
}

/// `DatabaseUnavailable`, tried again with backoff when `retry` says why.
fn unavailable(message: String, retry: Option<String>) -> Refusal {
    Refusal {
        retry: retry.map(|why| Box::new(ReconcileError::Database(why))),
        ..Refusal::new(RefusalReason::DatabaseUnavailable, message)
    }
}
