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
    let shutdown = previewd::service::shutdown_on_signals();
    let config = previewd::service::ServiceConfig {
        client,
        controller: args.controller.controller_config(),
        sweep_interval: args.controller.sweep_interval,
        max_body_bytes: args.webhooks.webhook_max_body_bytes,
        // One previewd per sandbox: nobody to elect against.
        lease: None,
        shutdown_grace: std::time::Duration::from_secs(5),
    };
    previewd::service::run(config, listener, shutdown).await;
    eprintln!("[sandbox] stopping");
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
    let lease = args.leader.settings(client.default_namespace());
    tracing::info!(
        leader_election = lease.is_some(),
        identity = lease.as_ref().map(|l| l.identity.as_str()).unwrap_or("-"),
        "previewd controller starting"
    );
    let listener = bind(args.listen).await?;
    let config = previewd::service::ServiceConfig {
        client,
        controller: args.controller.controller_config(),
        sweep_interval: args.controller.sweep_interval,
        max_body_bytes: args.webhooks.webhook_max_body_bytes,
        lease,
        shutdown_grace: args.shutdown_grace,
    };
    previewd::service::run(config, listener, previewd::service::shutdown_on_signals()).await;
    tracing::info!("previewd stopped");
    Ok(())
}
