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
    Run(Box<RunArgs>),
    /// Run a real Kubernetes control plane with simulated nodes on this machine (no cluster
    /// needed), with previewd's CRDs installed, until Ctrl-C or SIGTERM.
    Sandbox(Box<SandboxArgs>),
    /// Print what previewd would apply for one environment of a template, wave by wave, with
    /// the policy's verdict; no cluster needed. Exits 1 when the template would be refused.
    Render(previewd::sandbox::dry_run::RenderArgs),
    /// Render template requests read on standard input (JSON, each behind its length as a
    /// little-endian u32) and answer each the same way: the child process the controller
    /// renders untrusted templates in, under a memory limit.
    #[command(name = "render-worker", hide = true)]
    RenderWorker,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::RenderWorker) {
        return render_worker();
    }
    let quiet = matches!(&cli.command, Command::Sandbox(args) if args.demo)
        || matches!(cli.command, Command::Render(_));
    previewd::runtime::telemetry::init(cli.log_format, quiet);
    previewd::install_crypto_provider();
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("previewd: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<bool, Box<dyn std::error::Error>> = runtime.block_on(async {
        match cli.command {
            Command::Sandbox(args) => Ok(previewd::sandbox::session::run(*args)
                .await
                .map(|()| true)?),
            Command::Run(args) => Ok(previewd::runtime::service::run_controller(*args)
                .await
                .map(|()| true)?),
            Command::Render(args) => Ok(previewd::sandbox::dry_run::run(args).await?),
            Command::RenderWorker => Ok(true),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // A refusal, already said.
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("previewd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The render child: no logging, no runtime, no network; requests from standard input, one at
/// a time, answers to standard output, until standard input closes.
fn render_worker() -> ExitCode {
    use std::io::{Read, Write};
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    loop {
        let mut header = [0u8; 4];
        match input.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("previewd render-worker: reading a request: {e}");
                return ExitCode::FAILURE;
            }
        }
        let length = u32::from_le_bytes(header) as usize;
        let mut request = vec![0; length];
        if let Err(e) = input.read_exact(&mut request) {
            eprintln!("previewd render-worker: reading a request: {e}");
            return ExitCode::FAILURE;
        }
        let answer = previewd::plan::request::serve(&request);
        let Ok(answer_length) = u32::try_from(answer.len()) else {
            eprintln!(
                "previewd render-worker: an answer of {} bytes",
                answer.len()
            );
            return ExitCode::FAILURE;
        };
        let written = output
            .write_all(&answer_length.to_le_bytes())
            .and_then(|()| output.write_all(&answer))
            .and_then(|()| output.flush());
        if let Err(e) = written {
            eprintln!("previewd render-worker: writing an answer: {e}");
            return ExitCode::FAILURE;
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
