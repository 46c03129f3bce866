//! One `previewd sandbox` session: the control plane, previewd itself (the same service as
//! `previewd run`, without leader election), the playground of example templates and the forge
//! stand-in, then the demo or an interactive wait, and an orderly stop.

use std::sync::Arc;

use super::cli::SandboxArgs;
use super::ingress::SandboxIngress;
use super::playground::{self, Playground};
use super::{Sandbox, SandboxError, StderrProgress, demo, helm, provision};
use crate::forge::client::ApiDefaults;
use crate::model::crd::ForgeKind;

/// `previewd sandbox`: starts the control plane, previewd and the playground; plays the demo
/// or waits for Ctrl-C; stops everything it started.
pub async fn run(args: SandboxArgs) -> Result<(), SandboxError> {
    if args.provision_only {
        return provision_only(&args).await;
    }
    let progress = Arc::new(StderrProgress);
    let started = std::time::Instant::now();
    let repositories = args.repositories()?;
    let served = repositories.describe();
    let mut controller = args.controller.controller_config();
    let helm = helm::bring(&controller.engines.helm, &args.cache_dir).await;
    if let Ok((program, _)) = &helm {
        controller.engines.helm = program.clone();
    }
    let sandbox = Sandbox::start(args.options(), progress).await?;
    // The default kubectl is the one built with the control plane, of its version.
    if controller.engines.kubectl == std::path::Path::new("kubectl") {
        controller.engines.kubectl = sandbox.control_plane().binaries().kubectl.clone();
    }
    let client = sandbox.control_plane().client().await?;
    let listeners = Listeners::bind(args.listen).await?;
    let webhook_base = listeners.webhook_base.clone();
    let gate_address = listeners.gate_address;
    controller.gate_answers = true;
    let mut playground = Playground::set_up(
        &client,
        sandbox.kubeconfig_path(),
        sandbox.control_plane().dir(),
        &webhook_base,
        repositories,
    )
    .await?;
    let _database = super::database::set_up(&client, &mut controller).await;
    let binaries = sandbox.control_plane().binaries();
    playground.facts.kubectl = binaries.kubectl.display().to_string();
    playground.facts.kubernetes_version = binaries.kubernetes.clone();
    controller.forge_api_defaults = stand_in_defaults(&playground);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let config = crate::runtime::service::ServiceConfig {
        client: client.clone(),
        controller,
        sweep_interval: args.controller.sweep_interval,
        deliveries: args.webhooks.limits(),
        // One previewd per sandbox: nobody to elect against.
        lease: None,
        shutdown_grace: std::time::Duration::from_secs(5),
        gate: Some(listeners.gate),
        gate_clients: Default::default(),
        traffic: None,
    };
    let webhooks = listeners.webhooks;
    let service = tokio::spawn(crate::runtime::service::run(config, webhooks, shutdown));
    wait_until_ready(&webhook_base).await?;
    let ingress = SandboxIngress::start(client.clone(), gate_address).await?;
    playground.facts.ingress_url = format!("http://{}", ingress.address);
    let served = Served {
        helm: match &helm {
            Ok((_, said)) => said.clone(),
            Err(e) => format!("none, charts will not render ({e})"),
        },
        repositories: served,
    };
    print_facts(&playground, &sandbox, &served, started.elapsed(), args.demo);
    write_info(&playground, args.info_file.as_deref())?;
    let outcome = if args.demo {
        play_demo(&client, &playground, helm.is_ok()).await
    } else {
        show_forge_until_stopped(&playground).await;
        Ok(())
    };
    eprintln!("[sandbox] stopping");
    let _ = stop.send(true);
    if let Ok(Err(e)) = service.await {
        eprintln!("[sandbox] previewd stopped with an error: {e}");
    }
    drop(ingress);
    drop(playground);
    drop(sandbox);
    outcome
}

/// Templates that name no API URL (the examples in templates/) talk to the forge stand-in.
fn stand_in_defaults(playground: &Playground) -> ApiDefaults {
    let stand_in = playground.facts.forge_api_url.clone();
    ForgeKind::ALL
        .into_iter()
        .fold(ApiDefaults::default(), |defaults, kind| {
            defaults.with(kind, stand_in.clone())
        })
}

/// Writes the sandbox's facts (URLs, secrets, kubeconfig) as JSON to `path`, if asked
/// (`--info-file`).
fn write_info(playground: &Playground, path: Option<&std::path::Path>) -> Result<(), SandboxError> {
    let Some(path) = path else {
        return Ok(());
    };
    let info = serde_json::to_string_pretty(&playground.facts).unwrap_or_default();
    std::fs::write(path, format!("{info}\n")).map_err(|e| SandboxError::io(path, e))
}

/// previewd's two listeners in the sandbox: the webhook server's, and the wake gate's on a
/// loopback port, reached through the sandbox's ingress.
struct Listeners {
    webhooks: tokio::net::TcpListener,
    webhook_base: String,
    gate: tokio::net::TcpListener,
    gate_address: std::net::SocketAddr,
}

impl Listeners {
    async fn bind(listen: std::net::SocketAddr) -> Result<Self, SandboxError> {
        let webhooks = crate::runtime::service::bind(listen).await?;
        let webhook_base = format!(
            "http://{}",
            webhooks
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default()
        );
        let gate = crate::runtime::service::bind(([127, 0, 0, 1], 0).into()).await?;
        let gate_address = gate
            .local_addr()
            .map_err(|e| SandboxError::Process(format!("the wake gate: {e}")))?;
        Ok(Self {
            webhooks,
            webhook_base,
            gate,
            gate_address,
        })
    }
}

/// What the sandbox serves besides the control plane, for its output.
struct Served {
    helm: String,
    repositories: Vec<String>,
}

/// `--provision-only`: installs and builds what the sandbox needs (cached), then stops.
async fn provision_only(args: &SandboxArgs) -> Result<(), SandboxError> {
    let cache_dir = args.cache_dir.clone();
    let binaries = tokio::task::spawn_blocking(move || {
        provision::ensure_binaries(&cache_dir, &StderrProgress)
    })
    .await
    .map_err(|e| SandboxError::Provision(format!("provisioning task: {e}")))??;
    println!(
        "Kubernetes {} ready: {}",
        binaries.kubernetes, binaries.origin
    );
    let (_, helm) = helm::bring(&args.controller.helm, &args.cache_dir).await?;
    println!("Helm: {helm}");
    Ok(())
}

/// `--demo`: a pull request's life, then the timings in one line.
async fn play_demo(
    client: &kube::Client,
    playground: &Playground,
    with_helm: bool,
) -> Result<(), SandboxError> {
    let timings = demo::play(client, playground, with_helm).await?;
    println!(
        "demo done: the examples' Helm chart and Kustomize overlay Ready {:.1} s, opened → Ready {:.1} s, synchronize → Ready {:.1} s, asleep, first request → the app {:.1} s, closed → deleted {:.1} s; the forge stand-in received {} comments and statuses",
        timings.examples_to_ready.as_secs_f64(),
        timings.opened_to_ready.as_secs_f64(),
        timings.synchronize_to_ready.as_secs_f64(),
        timings.request_to_app.as_secs_f64(),
        timings.closed_to_gone.as_secs_f64(),
        playground.forge.received().len()
    );
    Ok(())
}

/// Without `--demo`: prints what previewd sends the forge stand-in until Ctrl-C or SIGTERM.
async fn show_forge_until_stopped(playground: &Playground) {
    let mut forge_events = playground.forge.subscribe();
    let mut signals = crate::runtime::service::shutdown_on_signals();
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
}

/// Waits until previewd's /readyz answers 200 (its caches are synced).
async fn wait_until_ready(webhook_base: &str) -> Result<(), SandboxError> {
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
            return Err(SandboxError::Process(
                "previewd's webhook server was not ready within 60 s".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The block a person needs: where everything is and a delivery to paste.
fn print_facts(
    playground: &Playground,
    sandbox: &Sandbox,
    served: &Served,
    took: std::time::Duration,
    demo: bool,
) {
    let facts = &playground.facts;
    let kubeconfig = &facts.kubeconfig;
    println!("previewd sandbox is ready ({:.1} s)", took.as_secs_f64());
    println!(
        "  Kubernetes:      {} ({})",
        facts.kubernetes_version,
        sandbox.control_plane().binaries().origin
    );
    println!("  kubeconfig:      {kubeconfig}");
    println!("  kubectl:         {} (of the same release)", facts.kubectl);
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
    println!("  repositories:    {}", served.repositories.join(", "));
    println!("  Helm:            {}", served.helm);
    println!("  GitHub webhook:  {}", facts.github_webhook_url);
    println!("  GitHub secret:   {}", facts.github_webhook_secret);
    println!("  GitLab webhook:  {}", facts.gitlab_webhook_url);
    println!("  GitLab token:    {}", facts.gitlab_webhook_token);
    println!(
        "  ingress:         {} (routes by the cluster's Ingresses; a host none routes goes to previewd's wake gate)",
        facts.ingress_url
    );
    if demo {
        return;
    }
    println!("  open a PR (paste in another terminal):");
    println!("    {}", playground.github_curl());
    println!("  open a GitLab MR:");
    println!("    {}", playground.gitlab_curl());
    println!(
        "  watch:           KUBECONFIG={kubeconfig} {} get previewenvironments -w",
        facts.kubectl
    );
    println!(
        "  open an environment (a sleeping one wakes): curl -H 'Host: <status.host>' {}/",
        facts.ingress_url
    );
    println!("Press Ctrl-C to stop; everything the sandbox started stops with it.");
}
