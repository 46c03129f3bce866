//! The flags of `previewd sandbox`: the controller's and webhook server's own (shared with
//! `previewd run`), and the sandbox's (nodes, cache, demo).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::SandboxError;
use super::repositories::Repositories;
use crate::runtime::config::{ControllerArgs, WebhookArgs};

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
    /// Serve a repository of one's own through the forge stand-in: `owner/name=PATH`, a git
    /// checkout (its commits and branches are the forge's SHAs and branches) or a plain folder
    /// (what is in it, at any SHA). Repeatable. A template with `forge.repository: owner/name`
    /// then reads its chart, overlay or manifests from there (docs/getting-started.md).
    #[arg(long = "repository", value_name = "OWNER/NAME=PATH")]
    pub repositories: Vec<String>,
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
    /// The repositories the forge stand-in serves: the examples, and each `--repository`.
    pub fn repositories(&self) -> Result<Repositories, SandboxError> {
        let mut repositories = Repositories::default();
        for named in &self.repositories {
            let Some((name, path)) = named.split_once('=') else {
                return Err(SandboxError::Process(format!(
                    "--repository {named:?}: expected OWNER/NAME=PATH"
                )));
            };
            repositories.add(name, std::path::Path::new(path))?;
        }
        Ok(repositories)
    }

    pub fn options(&self) -> super::SandboxOptions {
        super::SandboxOptions {
            cache_dir: self.cache_dir.clone(),
            nodes: super::NodeSimulatorConfig {
                nodes: self.nodes.max(1),
                startup_delay: Duration::from_millis(self.pod_startup_ms),
                ..Default::default()
            },
            audit_writes: false,
        }
    }
}

/// The cache folder `--cache-dir` would hold without the flag: `PREVIEWD_CACHE_DIR` when set,
/// else [`default_cache_dir`] (for callers that are not `previewd sandbox`, such as the tests).
pub fn cache_dir_from_environment() -> PathBuf {
    std::env::var_os("PREVIEWD_CACHE_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(default_cache_dir)
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
