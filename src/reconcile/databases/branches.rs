//! Each database of the template as the environment's branch, its connection Secret and the
//! egress to its server.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
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
/// How long a baseline's SQL may run: a statement that never ends (`pg_sleep`) must not hold
/// a reconcile forever.
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one branch may take (a copy of a large baseline on a busy disk).
const BRANCH_TIMEOUT: Duration = Duration::from_secs(600);

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
    if template.spec.databases.is_empty() {
        return Ok(planned);
    }
    distinct_names(&template.spec.databases)?;
    let on = context.databases.config.credentials_namespace.is_some();
    if on && !context.databases.listed().await {
        let why = "the registered database servers are not listed yet".to_string();
        return Err(Stop::Failed(ReconcileError::Database(why)));
    }
    for wanted in &template.spec.databases {
        let server = registered(wanted, template, context)?;
        planned.egress.push(egress_rule(&server, &wanted.name)?);
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

/// Two databases of one name would share one branch, each with its own password.
fn distinct_names(databases: &[TemplateDatabase]) -> Result<(), Refusal> {
    let mut seen = std::collections::BTreeSet::new();
    match databases.iter().find(|d| !seen.insert(d.name.as_str())) {
        None => Ok(()),
        Some(twice) => Err(Refusal::new(
            RefusalReason::RenderFailed,
            format!(
                "spec.databases names {:?} twice; nothing was applied",
                twice.name
            ),
        )),
    }
}

/// The NetworkPolicy egress rule to the server: its addresses, its port, nothing else. A
/// server without addresses, or with one that is no CIDR, is refused: an empty `to` would
/// let the port through to every address.
fn egress_rule(server: &PreviewDatabaseServer, database: &str) -> Result<Value, Refusal> {
    let cidrs = &server.spec.egress_cidrs;
    let valid = |cidr: &String| cidr.parse::<ipnet::IpNet>().is_ok();
    if cidrs.is_empty() || !cidrs.iter().all(valid) {
        return Err(unavailable(
            format!(
                "spec.databases {database}: PreviewDatabaseServer {:?} lists no egressCidrs, or one that is not a CIDR ({}): the environment's network cannot be opened to it alone; nothing was applied",
                server.metadata.name.as_deref().unwrap_or_default(),
                cidrs.join(", ")
            ),
            None,
        ));
    }
    let to: Vec<Value> = cidrs
        .iter()
        .map(|cidr| json!({"ipBlock": {"cidr": cidr}}))
        .collect();
    Ok(json!({"to": to, "ports": [{"protocol": "TCP", "port": server.spec.port}]}))
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
        status.databases.iter().find(|d| {
            d.name == wanted.name
                && d.server == wanted.server
                && d.branch == branch
                && d.state == READY
        })
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
    if let Some(made) = made
        && connection.branch_ready(&branch).await.unwrap_or(false)
    {
        // Made, and only its Secret is lost: a new password, no new copy.
        let password = new_password()?;
        let set = connection.set_password(&branch, &password).await;
        set.map_err(|e| refused_by_server(wanted, e))?;
        return Ok((made.clone(), password));
    }
    let baseline = sealed_baseline(&connection, template, wanted, context).await?;
    let password = match password {
        Some(password) => password,
        None => new_password()?,
    };
    let branching = connection.branch(&branch, &baseline, &password);
    let branched = tokio::time::timeout(BRANCH_TIMEOUT, branching)
        .await
        .map_err(|_| timed_out(wanted, "the branch", BRANCH_TIMEOUT))?
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
    let refresh = refresh_period(wanted)?;
    let version = baseline_version(&sql, refresh, Utc::now());
    let key = BaselineKey {
        template_namespace: &namespace,
        template_name: &template.name_any(),
        database: &wanted.name,
    };
    let target = BaselineTarget::new(key, &version);
    let failed = |message: String| {
        Stop::Refused(Refusal::new(
            RefusalReason::DatabaseBaselineFailed,
            format!(
                "spec.databases {}: the baseline SQL of ConfigMap {namespace}/{} failed: {message}; nothing was applied (it is loaded again once the ConfigMap changes)",
                wanted.name, wanted.baseline.sql_config_map
            ),
        ))
    };
    if let Some(message) = context.databases.failed_load(&target.database) {
        return Err(failed(message));
    }
    // Another reconcile loading it: this one holds no slot waiting, and comes back later.
    let lock = context.databases.load_lock(&target.database);
    let Ok(_loading) = lock.try_lock() else {
        let why = format!("the baseline of {} is being loaded", wanted.name);
        return Err(Stop::Failed(ReconcileError::Database(why)));
    };
    let in_words = |e: DatabaseError| refused_by_server(wanted, e);
    if server.baseline_sealed(&target).await.map_err(in_words)? {
        return Ok(target);
    }
    let password = new_password()?;
    let login = server.open_baseline(&target, &password).await;
    let login = login.map_err(in_words)?;
    match load(server, &target, &login, &sql).await {
        Loaded::Done => {}
        Loaded::Failed(message) => {
            context
                .databases
                .note_failed_load(&target.database, message.clone());
            return Err(failed(message));
        }
        Loaded::Interrupted(error) => return Err(in_words(error)),
    }
    server.seal_baseline(&target).await.map_err(in_words)?;
    Ok(target)
}

/// The shortest `baseline.refreshEvery`: each period loads the whole SQL again on the shared
/// server, and a template must not make that its every branch.
const SHORTEST_REFRESH: Duration = Duration::from_secs(3_600);

/// `baseline.refreshEvery`, when set, checked against [`SHORTEST_REFRESH`].
fn refresh_period(wanted: &TemplateDatabase) -> Result<Option<Duration>, Refusal> {
    let Some(text) = wanted.baseline.refresh_every.as_deref() else {
        return Ok(None);
    };
    let refused = |why: String| {
        Refusal::new(
            RefusalReason::RenderFailed,
            format!(
                "spec.databases {}: baseline.refreshEvery {why}; nothing was applied",
                wanted.name
            ),
        )
    };
    let period = crate::model::durations::parse_duration(text).map_err(refused)?;
    if period < SHORTEST_REFRESH {
        return Err(refused(format!("{text:?} is shorter than 1h")));
    }
    Ok(Some(period))
}

/// The baseline version: the SQL's digest, and with a refresh period the number of the
/// period `now` falls in (counted from the Unix epoch, so every replica and restart agrees).
fn baseline_version(sql: &str, refresh: Option<Duration>, now: DateTime<Utc>) -> String {
    let digest = hex::encode(Sha256::digest(sql.as_bytes()));
    let Some(period) = refresh else {
        return digest;
    };
    let seconds = u64::try_from(now.timestamp()).unwrap_or(0);
    let number = seconds.checked_div(period.as_secs()).unwrap_or(0);
    format!("{digest}@{number}")
}

/// How a load ended.
enum Loaded {
    Done,
    /// The SQL failed or ran past its time: the same SQL fails again.
    Failed(String),
    /// The server went away meanwhile: tried again.
    Interrupted(DatabaseError),
}

/// Runs the baseline's SQL as its role, for [`LOAD_TIMEOUT`] at most.
async fn load(
    server: &DatabaseServer,
    target: &BaselineTarget,
    login: &crate::database::BaselineLogin,
    sql: &str,
) -> Loaded {
    match tokio::time::timeout(LOAD_TIMEOUT, server.load_sql(login, sql)).await {
        Ok(Ok(())) => Loaded::Done,
        Ok(Err(e @ DatabaseError::Unreachable { .. })) => Loaded::Interrupted(e),
        Ok(Err(e)) => Loaded::Failed(e.to_string()),
        Err(_) => {
            // Its statement may still run on the server: its sessions end with it.
            let _ = server.end_sessions_of_role(&target.role).await;
            let minutes = LOAD_TIMEOUT.as_secs() / 60;
            Loaded::Failed(format!("it did not finish within {minutes} min"))
        }
    }
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

fn new_password() -> Result<String, Refusal> {
    secrets::random_text(PASSWORD_LENGTH)
        .map_err(|e| unavailable(format!("no randomness from the system: {e}"), None))
}

fn timed_out(wanted: &TemplateDatabase, what: &str, after: Duration) -> Stop {
    let message = format!(
        "spec.databases {} on server {}: {what} did not finish within {} s",
        wanted.name,
        wanted.server,
        after.as_secs()
    );
    unavailable(format!("{message}; tried again"), Some(message)).into()
}

/// `DatabaseUnavailable`, tried again with backoff when `retry` says why.
fn unavailable(message: String, retry: Option<String>) -> Refusal {
    Refusal {
        retry: retry.map(|why| Box::new(ReconcileError::Database(why))),
        ..Refusal::new(RefusalReason::DatabaseUnavailable, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::DatabaseBaseline;

    fn server(cidrs: &[&str]) -> PreviewDatabaseServer {
        let mut server = PreviewDatabaseServer::new("shared-pg", Default::default());
        server.spec.port = 5432;
        server.spec.egress_cidrs = cidrs.iter().map(|c| c.to_string()).collect();
        server
    }

    #[test]
    fn the_egress_opens_the_servers_addresses_on_its_port_and_nothing_without_them() {
        let rule = egress_rule(&server(&["10.0.40.12/32", "fd00::12/128"]), "orders").unwrap();
        assert_eq!(
            rule,
            json!({"to": [{"ipBlock": {"cidr": "10.0.40.12/32"}}, {"ipBlock": {"cidr": "fd00::12/128"}}],
                   "ports": [{"protocol": "TCP", "port": 5432}]})
        );
        // An empty `to` would let the port through to every address.
        for refused in [&[][..], &["10.0.40.12"][..], &["0.0.0.0/0 ; x"][..]] {
            let refusal = egress_rule(&server(refused), "orders").unwrap_err();
            assert_eq!(
                refusal.reason,
                RefusalReason::DatabaseUnavailable,
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_refreshed_baseline_is_a_new_version_each_period_and_the_same_within_one() {
        let at = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
        let day = Some(Duration::from_secs(86_400));
        let morning = baseline_version("SELECT 1", day, at("2026-11-28T08:00:00Z"));
        let evening = baseline_version("SELECT 1", day, at("2026-11-28T23:59:59Z"));
        let next_day = baseline_version("SELECT 1", day, at("2026-11-29T00:00:00Z"));
        assert_eq!(morning, evening);
        assert_ne!(evening, next_day);
        assert_ne!(
            morning,
            baseline_version("SELECT 2", day, at("2026-11-28T08:00:00Z"))
        );
        // Without a period only the SQL names the version.
        let never = baseline_version("SELECT 1", None, at("2026-11-28T08:00:00Z"));
        assert_eq!(
            never,
            baseline_version("SELECT 1", None, at("2030-01-01T00:00:00Z"))
        );
    }

    #[test]
    fn a_refresh_period_under_an_hour_or_not_a_duration_is_refused() {
        let every = |text: &str| TemplateDatabase {
            name: "orders".into(),
            baseline: DatabaseBaseline {
                sql_config_map: "orders-baseline".into(),
                refresh_every: Some(text.into()),
            },
            ..Default::default()
        };
        assert_eq!(
            refresh_period(&every("24h")).unwrap(),
            Some(Duration::from_secs(86_400))
        );
        for refused in ["59m", "1s", "0", "daily", "99999999999999999999d"] {
            let refusal = refresh_period(&every(refused)).unwrap_err();
            assert_eq!(refusal.reason, RefusalReason::RenderFailed, "{refused}");
            assert!(refusal.message.contains("refreshEvery"), "{refused}");
        }
        assert_eq!(refresh_period(&TemplateDatabase::default()).unwrap(), None);
    }

    #[test]
    fn a_database_named_twice_or_outside_a_dns_label_is_refused() {
        let database = |name: &str| TemplateDatabase {
            name: name.into(),
            ..Default::default()
        };
        assert!(distinct_names(&[database("orders"), database("users")]).is_ok());
        assert!(distinct_names(&[database("orders"), database("orders")]).is_err());
        for bad in [
            "",
            "Orders",
            "a_b",
            "-a",
            "a-",
            &"a".repeat(31),
            "x\"; DROP",
        ] {
            assert!(valid_name(bad).is_err(), "{bad:?}");
        }
        assert!(valid_name("orders-2").is_ok());
    }
}
