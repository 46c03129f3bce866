//! Every setting previewd has, parsed once from flags and environment variables. Nothing
//! else in previewd reads the environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "previewd",
    version,
    about = "Preview environments for every branch and pull request"
)]
pub struct Cli {
    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(
        long,
        env = "PREVIEWD_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller against a cluster: in-cluster config, else `--kubeconfig`, else the
    /// current kubeconfig context.
    Run(RunArgs),
    /// Run a real Kubernetes control plane with simulated nodes on this machine (no cluster
    /// needed), with previewd's CRDs installed, until Ctrl-C or SIGTERM.
    Sandbox(SandboxArgs),
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Only watch PreviewTemplates and PreviewEnvironments in this namespace (default: all).
    #[arg(long, env = "PREVIEWD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Server-side applies in flight at once within a wave.
    #[arg(long, env = "PREVIEWD_APPLY_CONCURRENCY", default_value_t = 16)]
    pub apply_concurrency: usize,
    /// How often every environment is reconciled with nothing having changed, e.g. `10m`. It
    /// compares with what the watches show and writes only if something drifted.
    #[arg(long, env = "PREVIEWD_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Also re-apply every object of an environment this often, sent even when the watch shows
    /// no drift (e.g. `24h`). Unset by default: it costs writes for environments that did not
    /// change, and the watch-based comparison already repairs drift in every field previewd sets.
    #[arg(long, env = "PREVIEWD_REAPPLY_INTERVAL", value_parser = parse_duration)]
    pub reapply_interval: Option<Duration>,
    /// How often the sweep removes environments whose PR is closed, whose branch is gone,
    /// that are idle or too old, and orphaned namespaces (also once at start-up).
    #[arg(long, env = "PREVIEWD_SWEEP_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// A template that renders more objects than this for one environment is refused, with
    /// the condition `TooManyObjects` on the environment.
    #[arg(long, env = "PREVIEWD_MAX_OBJECTS_PER_ENVIRONMENT", default_value_t = crate::controller::DEFAULT_MAX_OBJECTS)]
    pub max_objects_per_environment: usize,
}

impl ControllerArgs {
    pub fn controller_config(&self) -> crate::controller::ControllerConfig {
        crate::controller::ControllerConfig {
            namespace: self.watch_namespace.clone(),
            apply_concurrency: self.apply_concurrency.max(1),
            resync_interval: self.resync_interval,
            reapply_interval: self.reapply_interval,
            max_objects: self.max_objects_per_environment.max(1),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Path of a kubeconfig to use instead of the in-cluster or default configuration.
    #[arg(long, env = "PREVIEWD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the HTTP server (webhooks, /metrics, /healthz, /readyz).
    #[arg(long, env = "PREVIEWD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// On SIGTERM, how long in-flight webhook requests get to finish.
    #[arg(long, env = "PREVIEWD_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

/// Leader election: every replica serves webhooks, only the Lease holder reconciles and sweeps.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// Elect a leader through a Lease before reconciling. Turn off only when exactly one
    /// replica runs (two unelected replicas would both reconcile and sweep).
    #[arg(long, env = "PREVIEWD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the namespace previewd runs in, from the in-cluster
    /// service account or the kubeconfig context).
    #[arg(long, env = "PREVIEWD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    #[arg(long, env = "PREVIEWD_LEASE_NAME", default_value = "previewd-leader")]
    pub lease_name: String,
    /// How long a Lease nobody renews keeps the other replicas waiting: the longest a
    /// crashed leader's work is left undone. The leader renews every seventh of it.
    #[arg(long, env = "PREVIEWD_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// This replica's name in the Lease (default: host name, i.e. the pod name, and a random
    /// suffix).
    #[arg(long, env = "PREVIEWD_IDENTITY")]
    pub identity: Option<String>,
}

impl LeaderArgs {
    /// The Lease settings, or `None` when leader election is off.
    pub fn settings(&self, default_namespace: &str) -> Option<crate::leader::LeaseSettings> {
        self.leader_elect.then(|| {
            crate::leader::LeaseSettings::with_duration(
                self.lease_namespace
                    .clone()
                    .unwrap_or_else(|| default_namespace.to_string()),
                self.lease_name.clone(),
                self.identity
                    .clone()
                    .unwrap_or_else(crate::leader::default_identity),
                self.lease_duration.max(Duration::from_secs(2)),
            )
        })
    }
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Deliveries with a larger body are refused with 413. GitHub's pull_request deliveries
    /// are typically 20-40 KB; 2 MiB leaves room for pushes with many commits.
    #[arg(long, env = "PREVIEWD_WEBHOOK_MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub webhook_max_body_bytes: usize,
}

#[derive(Debug, Args)]
pub struct SandboxArgs {
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    /// Address of previewd's HTTP server in the sandbox (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Once everything is ready, write the sandbox's facts to this file as JSON (keys
    /// `kubeconfig`, `github_webhook_url`, `github_webhook_secret`, `gitlab_webhook_url`,
    /// `gitlab_webhook_token`, `forge_api_url`), for scripts.
    #[arg(long)]
    pub info_file: Option<PathBuf>,
    /// Play a pull request's life (opened, synchronize, closed) from the fixture deliveries,
    /// print what happens, then stop the sandbox and exit.
    #[arg(long)]
    pub demo: bool,
    /// Only install and build what the sandbox needs (cached), then exit.
    #[arg(long)]
    pub provision_only: bool,
    /// How many nodes to simulate.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Delay between a pod being scheduled and it running, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub pod_startup_ms: u64,
    /// Where the control-plane build is cached.
    #[arg(long, env = "PREVIEWD_CACHE_DIR", default_value_os_t = default_cache_dir())]
    pub cache_dir: PathBuf,
}

impl SandboxArgs {
    pub fn options(&self) -> crate::sandbox::SandboxOptions {
        crate::sandbox::SandboxOptions {
            cache_dir: self.cache_dir.clone(),
            nodes: crate::sandbox::NodeSimulatorConfig {
                nodes: self.nodes.max(1),
                startup_delay: Duration::from_millis(self.pod_startup_ms),
                ..Default::default()
            },
        }
    }
}

/// `$XDG_CACHE_HOME/previewd`, else `~/.cache/previewd`, else a folder in the temp dir.
pub fn default_cache_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("previewd");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache/previewd"),
        None => std::env::temp_dir().join("previewd-cache"),
    }
}

/// Parses `90s`, `10m`, `72h`, `14d` (or a plain number of seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 10m, 72h or 14d"))?;
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use s, m, h or d)"
            ));
        }
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("72h"), Ok(Duration::from_secs(259_200)));
        // Would overflow when multiplied out (a hostile `/preview extend`): an error.
        assert!(parse_duration("1000000000000000d").is_err());
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(1_209_600)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("m").is_err());
    }
}
