//! A database per environment: `PreviewDatabaseServer`, a PostgreSQL server the operator lets
//! previewd create databases on (cluster-scoped, like `PreviewCluster`: no team's namespace
//! can name one), what a template asks for (`spec.databases`) and what an environment holds
//! (`status.databases`). The steps are in `src/database/` and `reconcile/databases.rs`; why
//! they are safe is in docs/security.md ("A database per environment").

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A PostgreSQL server previewd may make baselines and branches on.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "previewd.dev",
    version = "v1alpha1",
    kind = "PreviewDatabaseServer",
    shortname = "pdbserver",
    category = "previewd",
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".spec.host"}"#,
    printcolumn = r#"{"name":"Max","type":"integer","jsonPath":".spec.limits.maxBranches"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PreviewDatabaseServerSpec {
    /// The server's address as previewd and the environments' pods reach it.
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// A Secret of previewd's own namespace, of type `previewd.dev/database-admin`, with the
    /// keys `username` and `password` of a role with `CREATEDB` and `CREATEROLE` (no
    /// superuser). Never read for a template nor copied into an environment.
    pub admin_secret_ref: AdminSecretRef,
    /// The addresses (CIDRs) the server answers on: an environment with a database may reach
    /// them on `port`, and nothing else of the network beyond what its template allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_cidrs: Vec<String>,
    #[serde(default)]
    pub limits: DatabaseServerLimits,
    /// The namespaces whose templates may ask for databases here; `*` for all. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub template_namespaces: Vec<String>,
}

fn default_port() -> u16 {
    5432
}

impl PreviewDatabaseServerSpec {
    /// Whether templates of `namespace` may ask for databases on this server.
    pub fn admits(&self, namespace: &str) -> bool {
        self.template_namespaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == namespace)
    }
}

/// The admin credential's Secret (in previewd's namespace).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct AdminSecretRef {
    pub name: String,
}

/// What one server takes at most; unset: previewd's defaults.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseServerLimits {
    /// Branches (environments' databases) on the server at once (default 100). A new
    /// environment past it waits, `Queued`, with its position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_branches: Option<u64>,
    /// Branch, drop and baseline operations at once (default 4, at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_operations: Option<u32>,
    /// Connections each environment's role may hold (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_role: Option<u32>,
}

/// A database a template asks for, in each of its environments.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateDatabase {
    /// The database's name in this template (lowercase letters, digits and `-`, at most 30).
    pub name: String,
    /// The `PreviewDatabaseServer` to branch on.
    pub server: String,
    /// The rows every environment starts from.
    pub baseline: DatabaseBaseline,
    /// The environment's Secret with the connection details (`host`, `port`, `database`,
    /// `username`, `password`, `url`); default `database-<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
}

impl TemplateDatabase {
    pub fn secret_name(&self) -> String {
        self.secret_name
            .clone()
            .unwrap_or_else(|| format!("database-{}", self.name))
    }
}

/// Where a baseline's rows come from.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseBaseline {
    /// A ConfigMap of the template's namespace whose values are SQL, run in key order as the
    /// baseline's own role (never previewd's admin). A changed ConfigMap is a new baseline
    /// version: new environments branch from it, running ones keep their rows.
    pub sql_config_map: String,
    /// Loads the baseline again this often even when its SQL is unchanged (e.g. `24h`, at least
    /// `1h`), for SQL that reads the clock or other sources: periods count from the Unix epoch
    /// (`24h` turns at 00:00 UTC), and the first environment branched in a new period loads it.
    /// Environments already running keep their branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_every: Option<String>,
}

/// An environment's database, as previewd last made or saw it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// The template's name for it.
    pub name: String,
    pub server: String,
    /// The branch (the PostgreSQL database and role) previewd made; dropped with the
    /// environment.
    pub branch: String,
    /// `Ready`, `Queued` (the server holds its limit) or `Unreachable`.
    pub state: String,
    /// The baseline version it was branched from (the SQL's digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// How long the branch took, in milliseconds (from previewd's turn on the server to the
    /// finished branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branched_in_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
