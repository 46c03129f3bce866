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
    let listener = bind(args.listen).await?;
    println!(
        "  webhooks:   http://{}/webhooks/github and /webhooks/gitlab",
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );
    let services = tokio::spawn(run_services(
        client,
        args.controller.controller_config(),
        args.controller.sweep_interval,
        args.webhooks.webhook_max_body_bytes,
        listener,
    ));
    wait_for_shutdown_signal().await;
    eprintln!("[sandbox] stopping");
    services.abort();
    drop(sandbox);
    Ok(())
}

async fn bind(address: std::net::SocketAddr) -> Result<tokio::net::TcpListener, previewd::Error> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| previewd::Error::Io {
            context: format!("listening on {address}"),
            source: e,
        })
}

/// The controller and the HTTP server, sharing one set of caches and metrics. Returns when
/// either stops (neither does on its own).
async fn run_services(
    client: kube::Client,
    config: previewd::controller::ControllerConfig,
    sweep_interval: std::time::Duration,
    max_body_bytes: usize,
    listener: tokio::net::TcpListener,
) {
    let metrics = Arc::new(previewd::metrics::Metrics::new());
    let (context_tx, context_rx) = tokio::sync::oneshot::channel();
    let controller =
        previewd::controller::run(client.clone(), config, metrics.clone(), Some(context_tx));
    tokio::pin!(controller);
    let context = tokio::select! {
        _ = &mut controller => return,
        context = context_rx => match context {
            Ok(context) => context,
            Err(_) => return,
        },
    };
    let sweeper = previewd::sweep::Sweeper {
        client: client.clone(),
        templates: context.templates.clone(),
        environments: context.environments.clone(),
        metrics: metrics.clone(),
        caches_ready: context.caches_ready.clone(),
        watch_namespace: context.config.namespace.clone(),
    };
    let sweep_context = context.clone();
    tokio::spawn(async move { sweeper.run(&sweep_context.reporter, sweep_interval).await });
    let state = previewd::server::ServerState::new(client, &context, metrics, max_body_bytes);
    tokio::select! {
        _ = controller => {}
        result = previewd::server::serve(state, listener) => {
            if let Err(e) = result {
                tracing::error!(error = %e, "the HTTP server stopped");
            }
        }
    }
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
    let listener = bind(args.listen).await?;
    tokio::select! {
        _ = run_services(client, args.controller.controller_config(), args.controller.sweep_interval, args.webhooks.webhook_max_body_bytes, listener) => {}
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
