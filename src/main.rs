use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use previewd::config::{Cli, Command, RunArgs, SandboxArgs};
use previewd::sandbox::playground::{self, Playground};
use previewd::sandbox::{self, Sandbox, StderrProgress};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let quiet = matches!(&cli.command, Command::Sandbox(args) if args.demo);
    previewd::telemetry::init(cli.log_format, quiet);
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
    let client = sandbox.control_plane().client().await?;
    let listener = bind(args.listen).await?;
    let webhook_base = format!(
        "http://{}",
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );
    let playground = Playground::set_up(
        &client,
        sandbox.kubeconfig_path(),
        sandbox.control_plane().dir(),
        &webhook_base,
    )
    .await?;
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let config = previewd::service::ServiceConfig {
        client: client.clone(),
        controller: args.controller.controller_config(),
        sweep_interval: args.controller.sweep_interval,
        max_body_bytes: args.webhooks.webhook_max_body_bytes,
        // One previewd per sandbox: nobody to elect against.
        lease: None,
        shutdown_grace: std::time::Duration::from_secs(5),
    };
    let service = tokio::spawn(previewd::service::run(config, listener, shutdown));
    wait_until_ready(&webhook_base).await?;
    print_facts(&playground, &sandbox, started.elapsed(), args.demo);
    if let Some(path) = &args.info_file {
        let info = serde_json::to_string_pretty(&playground.facts).unwrap_or_default();
        std::fs::write(path, format!("{info}\n")).map_err(|e| previewd::Error::Io {
            context: format!("writing {}", path.display()),
            source: e,
        })?;
    }
    let outcome = if args.demo {
        let outcome = sandbox::demo::play(&client, &playground, &webhook_base).await;
        if let Ok(timings) = &outcome {
            println!(
                "demo done: opened → Ready {:.1} s, synchronize → Ready {:.1} s, closed → deleted {:.1} s; the forge stand-in received {} comments and statuses",
                timings.opened_to_ready.as_secs_f64(),
                timings.synchronize_to_ready.as_secs_f64(),
                timings.closed_to_gone.as_secs_f64(),
                playground.forge.received().len()
            );
        }
        outcome.map(|_| ())
    } else {
        let mut forge_events = playground.forge.subscribe();
        let mut signals = previewd::service::shutdown_on_signals();
        loop {
            tokio::select! {
                received = forge_events.recv() => match received {
                    Ok(received) => println!("[forge] {}", received.to_string().trim_end()),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                },
                _ = signals.wait_for(|stop| *stop) => break,
            }
        }
        Ok(())
    };
    eprintln!("[sandbox] stopping");
    let _ = stop.send(true);
    let _ = service.await;
    drop(playground);
    drop(sandbox);
    outcome.map_err(previewd::Error::from)
}

/// Waits until previewd's /readyz answers 200 (its caches are synced).
async fn wait_until_ready(webhook_base: &str) -> Result<(), previewd::Error> {
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let ready = http
            .get(format!("{webhook_base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(previewd::Error::Config(
                "previewd's webhook server was not ready within 60 s".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The block a person needs: where everything is and a delivery to paste.
fn print_facts(playground: &Playground, sandbox: &Sandbox, took: std::time::Duration, demo: bool) {
    let facts = &playground.facts;
    let kubeconfig = &facts.kubeconfig;
    println!("previewd sandbox is ready ({:.1} s)", took.as_secs_f64());
    println!("  kubeconfig:      {kubeconfig}");
    println!("  nodes:           {}", sandbox.node_names().join(", "));
    println!(
        "  forge API:       {} (a stand-in for GitHub and GitLab; prints what previewd sends)",
        facts.forge_api_url
    );
    println!(
        "  templates:       {ns}/{gh} (GitHub {ghr}), {ns}/{gl} (GitLab {glr})",
        ns = playground::NAMESPACE,
        gh = playground::GITHUB_TEMPLATE,
        ghr = playground::GITHUB_REPOSITORY,
        gl = playground::GITLAB_TEMPLATE,
        glr = playground::GITLAB_REPOSITORY
    );
    println!("  GitHub webhook:  {}", facts.github_webhook_url);
    println!("  GitHub secret:   {}", facts.github_webhook_secret);
    println!("  GitLab webhook:  {}", facts.gitlab_webhook_url);
    println!("  GitLab token:    {}", facts.gitlab_webhook_token);
    if demo {
        return;
    }
    println!("  open a PR (paste in another terminal):");
    println!("    {}", playground.github_curl());
    println!("  open a GitLab MR:");
    println!("    {}", playground.gitlab_curl());
    println!("  watch:           KUBECONFIG={kubeconfig} kubectl get previewenvironments -w");
    println!("Press Ctrl-C to stop; everything the sandbox started stops with it.");
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
