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
    /// Run a real Kubernetes control plane with simulated nodes on this machine (no cluster
    /// needed), with previewd's CRDs installed, until Ctrl-C or SIGTERM.
    Sandbox(SandboxArgs),
}

#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Write `{"kubeconfig": "<path>"}` to this file once the control plane is ready.
    #[arg(long)]
    pub info_file: Option<PathBuf>,
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
