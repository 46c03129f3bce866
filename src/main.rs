use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use previewd::config::{Cli, Command, RunArgs, SandboxArgs};
use previewd::sandbox::{self, Sandbox, StderrProgress};

fn main() -> ExitCode {
    let cli = Cli::parse();
    previewd::telemetry::init(cli.log_format);
    previewd::install_crypto_provider();
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Sandbox(args) => run_sandbox(args).await,
            Command::Run(args) => run_controller(args).await,
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

async fn run_sandbox(args: SandboxArgs) -> Result<(), previewd::Error> {
    let progress = Arc::new(StderrProgress);
    if args.provision_only {
        let cache_dir = args.cache_dir.clone();
        let binaries = tokio::task::spawn_blocking(move || {
            sandbox::provision::ensure_binaries(&cache_dir, &StderrProgress)
        })
        .await
        .map_err(|e| previewd::Error::Config(format!("provisioning task: {e}")))??;
        println!("control-plane binaries ready in {}", binaries.dir.display());
        return Ok(());
    }
    let started = std::time::Instant::now();
    let sandbox = Sandbox::start(args.options(), progress).await?;
    let kubeconfig = sandbox.kubeconfig_path().display().to_string();
    println!(
        "previewd sandbox is ready ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!("  kubeconfig: {kubeconfig}");
    println!("  nodes:      {}", sandbox.node_names().join(", "));
    println!("  try:        KUBECONFIG={kubeconfig} kubectl get nodes,crds,previewenvironments -A");
    println!(
        "  controller: previewd is reconciling PreviewEnvironments (try: kubectl apply -f templates/web-postgres/)"
    );
    println!("Press Ctrl-C to stop; everything the sandbox started stops with it.");
    if let Some(path) = &args.info_file {
        let info = serde_json::json!({ "kubeconfig": kubeconfig });
        std::fs::write(path, format!("{info}\n")).map_err(|e| previewd::Error::Io {
            context: format!("writing {}", path.display()),
            source: e,
        })?;
    }
    let client = sandbox.control_plane().client().await?;
    let controller = tokio::spawn(previewd::controller::run(
        client,
        args.controller.controller_config(),
        Arc::new(previewd::metrics::Metrics::new()),
        None,
    ));
    wait_for_shutdown_signal().await;
    eprintln!("[sandbox] stopping");
    controller.abort();
    drop(sandbox);
    Ok(())
}

async fn run_controller(args: RunArgs) -> Result<(), previewd::Error> {
    let client = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| previewd::Error::Config(format!("reading {}: {e}", path.display())))?;
            sandbox::control_plane::client_from_kubeconfig(kubeconfig).await?
        }
        None => kube::Client::try_default().await.map_err(|e| {
            previewd::Error::Config(format!("no Kubernetes configuration found: {e}"))
        })?,
    };
    tracing::info!("previewd controller starting");
    let metrics = Arc::new(previewd::metrics::Metrics::new());
    tokio::select! {
        _ = previewd::controller::run(client, args.controller.controller_config(), metrics, None) => {}
        _ = wait_for_shutdown_signal() => tracing::info!("shutting down"),
    }
    Ok(())
}

async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
