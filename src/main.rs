//! The `previewd` command line: parses the flags and hands over to the runtime (`run`) or the
//! sandbox (`sandbox`). Nothing else lives here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use previewd::runtime::config::{LogFormat, RunArgs};
use previewd::sandbox::cli::SandboxArgs;

#[derive(Debug, Parser)]
#[command(
    name = "previewd",
    version,
    about = "Preview environments for every branch and pull request"
)]
struct Cli {
    /// Log format: `text` for people, `json` for log pipelines.
    #[arg(
        long,
        env = "PREVIEWD_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller against a cluster: in-cluster config, else `--kubeconfig`, else the
    /// current kubeconfig context.
    Run(RunArgs),
    /// Run a real Kubernetes control plane with simulated nodes on this machine (no cluster
    /// needed), with previewd's CRDs installed, until Ctrl-C or SIGTERM.
    Sandbox(SandboxArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let quiet = matches!(&cli.command, Command::Sandbox(args) if args.demo);
    previewd::runtime::telemetry::init(cli.log_format, quiet);
    previewd::install_crypto_provider();
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("previewd: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), Box<dyn std::error::Error>> = runtime.block_on(async {
        match cli.command {
            Command::Sandbox(args) => Ok(previewd::sandbox::session::run(args).await?),
            Command::Run(args) => Ok(previewd::runtime::service::run_controller(args).await?),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("previewd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// tokio's multi-threaded runtime, with its pool of blocking threads bounded by the cores. The
/// plan step and template rendering run there (CPU work that must not stall the async workers);
/// by default tokio starts up to 512 such threads, and when every environment reconciles at
/// once (a restart, a failover) it started dozens, each with its own malloc arena, which
/// doubled previewd's memory for no gain on a machine with two cores.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(cores.saturating_mul(2).max(4))
        .build()
}
