//! previewd as a running service: the webhook server on every replica; the controller and the
//! sweep on the one replica that leads (or always, without leader election); and the order of
//! a graceful shutdown.
//!
//! On shutdown (SIGTERM from the kubelet, Ctrl-C): the controller and the sweep stop, the
//! Lease is released so that a standby takes over at once, and the webhook server stops
//! accepting connections but answers the requests in flight (up to the grace period).
//!
//! If the controller stops by itself (a panic in a reconcile, its stream ending), the replica
//! does not stay up with nobody reconciling: `/readyz` turns red at once, the Lease is released
//! for a standby, the server drains, and [`run`] returns the error (the process exits 1 and
//! the kubelet restarts it).

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::caches::Caches;
use crate::cluster::client;
use crate::cluster::secrets::SecretReader;
use crate::engines::contain::{ContainmentMode, Support};
use crate::forge::access::WriteAccess;
use crate::forge::template_client::TemplateClients;
use crate::lifecycle::sweeper::Sweeper;
use crate::lifecycle::traffic::{TrafficRecorder, TrafficSource};
use crate::reconcile::ControllerConfig;
use crate::runtime::config::RunArgs;
use crate::runtime::error::Error;
use crate::runtime::leader::{LeaderElector, LeaseSettings, WorkStopped, work_stopped};
use crate::runtime::metrics::Metrics;
use crate::webhook::server::ServerState;

/// Everything a running previewd needs besides its listener.
pub struct ServiceConfig {
    pub client: kube::Client,
    pub controller: ControllerConfig,
    pub sweep_interval: Duration,
    /// What one delivery and one client may take of the webhook endpoint.
    pub deliveries: crate::webhook::server::DeliveryLimits,
    /// `None`: this process always reconciles (one replica, or the sandbox).
    pub lease: Option<Election>,
    /// How long in-flight webhook requests get once shutdown starts.
    pub shutdown_grace: Duration,
    /// The wake gate's listener (`--gate-listen`), if it runs.
    pub gate: Option<tokio::net::TcpListener>,
    /// Who may wake how much through the gate, and which proxies say who the client is.
    pub gate_clients: crate::gate::server::Clients,
    /// Where requests to environments' hosts are counted (`--traffic-*`), if anywhere.
    pub traffic: Option<TrafficSource>,
}

/// Leader election: the Lease, and a client of its own, so that a renewal never waits behind a
/// queue of applies in the main client (see [`crate::cluster::client`]).
pub struct Election {
    pub settings: LeaseSettings,
    pub client: kube::Client,
}

/// Runs until `shutdown` turns true and everything has stopped in order, or until the
/// controller stops by itself (then the error says why).
pub async fn run(
    config: ServiceConfig,
    listener: tokio::net::TcpListener,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::new());
    metrics
        .footprints
        .set_prices(config.controller.prices.as_ref());
    let (caches, cache_watches) = Caches::start(
        config.client.clone(),
        config.controller.namespace.as_deref(),
    );
    // The server asks the forge only about commands' authors' write access.
    let api_defaults = config.controller.forge_api_defaults.clone();
    let server_clients = TemplateClients::new(
        metrics.forge.clone(),
        Arc::new(SecretReader::new(config.client.clone())),
    );
    let write_access = WriteAccess::new(Arc::new(server_clients.with_api_defaults(api_defaults)));
    let gate = config.gate.map(|listener| {
        start_gate(
            listener,
            config.gate_clients.clone(),
            &config.client,
            &caches,
            &metrics,
            shutdown.clone(),
        )
    });
    let state = ServerState::new(
        config.client.clone(),
        caches,
        Arc::new(write_access),
        metrics.server(),
        config.deliveries.clone(),
    );
    state.say_containment(say_containment(
        &metrics,
        config.controller.engines.containment,
    ));
    let client = config.client.clone();
    let controller_config = config.controller.clone();
    let sweep_interval = config.sweep_interval;
    let term_metrics = metrics.clone();
    let traffic = config.traffic.clone();
    let term = move || {
        lead(
            client.clone(),
            controller_config.clone(),
            term_metrics.clone(),
            sweep_interval,
            traffic.clone(),
        )
    };
    let leading = Leading {
        work: term,
        lease: config.lease,
        metrics,
        shutdown_grace: config.shutdown_grace,
        gate,
    };
    let outcome = serve_and_lead(state, listener, shutdown, leading).await;
    drop(cache_watches);
    outcome
}

/// The leader's work and how it is run.
pub struct Leading<W> {
    /// Starts one term of work (the controller, the sweep); it never ends while all is well.
    pub work: W,
    /// `None`: this process always leads.
    pub lease: Option<Election>,
    pub metrics: Arc<Metrics>,
    /// How long in-flight webhook requests get once the server stops.
    pub shutdown_grace: Duration,
    /// The wake gate's task, if it runs (it stops on shutdown).
    pub gate: Option<tokio::task::JoinHandle<()>>,
}

/// Serves webhooks on `listener` and leads (under the Lease, or always) until `shutdown`, or
/// until the work stops by itself: then `state` answers `/readyz` with 503 from that moment,
/// the server drains, and the error says why the work stopped.
pub async fn serve_and_lead<W, F>(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    shutdown: tokio::sync::watch::Receiver<bool>,
    leading: Leading<W>,
) -> Result<(), Error>
where
    W: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    // The server stops on shutdown, or when the controller has failed.
    let (stop_server, server_stop) = tokio::sync::watch::channel(false);
    let server_shutdown = {
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                _ = wait_for(shutdown) => {}
                _ = wait_for(server_stop) => {}
            }
        }
    };
    let server = tokio::spawn(crate::webhook::server::serve(
        state.clone(),
        listener,
        server_shutdown,
    ));

    let Leading {
        work,
        lease,
        metrics,
        shutdown_grace,
        gate,
    } = leading;
    let outcome = match lease {
        Some(Election { settings, client }) => {
            LeaderElector::new(client, settings)
                .run(metrics.clone(), shutdown.clone(), work)
                .await
        }
        None => run_without_election(&metrics, shutdown.clone(), work).await,
    };
    if outcome.is_err() {
        state.controller_stopped();
        let _ = stop_server.send(true);
    }

    // The controller has stopped (and the Lease is released); let the server drain.
    match tokio::time::timeout(shutdown_grace, server).await {
        Ok(Ok(Ok(()))) => tracing::info!("webhook server drained"),
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "the webhook server failed"),
        Ok(Err(e)) => tracing::error!(error = %e, "the webhook server task failed"),
        Err(_) => tracing::warn!(
            grace = ?shutdown_grace,
            "webhook requests still in flight after the grace period; stopping anyway"
        ),
    }
    if let Some(gate) = gate {
        // The gate stops on shutdown; a controller that stopped by itself must not leave the
        // process waiting for a shutdown that never comes.
        if outcome.is_err() {
            gate.abort();
        }
        let _ = gate.await;
    }
    outcome.map_err(|stopped| Error::ControllerStopped(stopped.0))
}

/// Starts the wake gate on every replica (like the webhook server, it reads the caches and
/// writes only the environment's record); it stops on shutdown.
fn start_gate(
    listener: tokio::net::TcpListener,
    clients: crate::gate::server::Clients,
    client: &kube::Client,
    caches: &Caches,
    metrics: &Metrics,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let waker = crate::gate::server::ClusterWaker::new(client.clone(), metrics.cluster.clone());
    let gate = crate::gate::server::Gate::new(
        caches.environments.clone(),
        Arc::new(waker),
        metrics.gate.clone(),
        clients,
    );
    tokio::spawn(crate::gate::server::serve(
        gate,
        listener,
        wait_for(shutdown),
    ))
}

/// Without leader election this replica always leads: the work runs until shutdown, and its
/// ending earlier is the same failure as under a Lease.
async fn run_without_election<W, F>(
    metrics: &Metrics,
    shutdown: tokio::sync::watch::Receiver<bool>,
    work: W,
) -> Result<(), WorkStopped>
where
    W: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    metrics.leader.set(1);
    let mut term = tokio::spawn(work());
    let outcome = tokio::select! {
        _ = wait_for(shutdown) => Ok(()),
        ended = &mut term => Err(WorkStopped(work_stopped(ended))),
    };
    if outcome.is_ok() {
        // Still running: cancel it and wait until it has stopped.
        term.abort();
        let _ = term.await;
    }
    metrics.leader.set(0);
    outcome
}

async fn wait_for(mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// One term as leader: the controller, the sweep every `sweep_interval` and the traffic
/// recorder, until cancelled. What a replica runs while it holds the Lease; the tests of the
/// sweep's and the recorder's loops run it as previewd does.
pub async fn lead(
    client: kube::Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    sweep_interval: Duration,
    traffic: Option<TrafficSource>,
) {
    let (context_tx, context_rx) = tokio::sync::oneshot::channel();
    let controller = crate::reconcile::run(
        client.clone(),
        config,
        metrics.controller(),
        Some(context_tx),
    );
    tokio::pin!(controller);
    let context = tokio::select! {
        _ = &mut controller => return,
        context = context_rx => match context {
            Ok(context) => context,
            Err(_) => return,
        },
    };
    let recorder = traffic.map(|source| TrafficRecorder {
        client: client.clone(),
        caches: context.caches.clone(),
        source,
        metrics: metrics.traffic.clone(),
        writes: metrics.cluster.clone(),
        http: reqwest::Client::new(),
    });
    let traffic = async move {
        match recorder {
            Some(recorder) => recorder.run().await,
            None => std::future::pending().await,
        }
    };
    let sweeper = Sweeper {
        client,
        caches: context.caches.clone(),
        metrics: metrics.sweep.clone(),
        writes: metrics.cluster.clone(),
        watch_namespace: context.config.namespace.clone(),
    };
    tokio::select! {
        _ = controller => {}
        _ = sweeper.run(context.reporter.clients(), sweep_interval) => {}
        _ = traffic => {}
    }
}

/// Binds the HTTP server's address.
pub async fn bind(address: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| Error::Io {
            context: format!("listening on {address}"),
            source: e,
        })
}

/// `previewd run`: connects to the cluster, listens, and serves until SIGTERM or Ctrl-C.
pub async fn run_controller(args: RunArgs) -> Result<(), Error> {
    let connection = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
            client::config_from_kubeconfig(kubeconfig).await?
        }
        None => client::inferred_config().await?,
    };
    let client = client::limited(connection.clone(), args.api_concurrency)?;
    crate::cluster::installed_crds::check_delivery_order(&client)
        .await
        .map_err(Error::Config)?;
    let lease = match args.leader.settings(client.default_namespace()) {
        Some(settings) => Some(Election {
            settings,
            client: client::limited(connection, 2)?,
        }),
        None => None,
    };
    tracing::info!(
        leader_election = lease.is_some(),
        identity = lease
            .as_ref()
            .map(|l| l.settings.identity.as_str())
            .unwrap_or("-"),
        api_concurrency = args.api_concurrency,
        "previewd controller starting"
    );
    let listener = bind(args.listen).await?;
    let gate = match args.gate_listen {
        Some(address) => Some(bind(address).await?),
        None => None,
    };
    let mut controller = args.controller.controller_config();
    controller.gate_answers = gate.is_some();
    let traffic = args.traffic.source().map_err(Error::Config)?;
    let config = ServiceConfig {
        client,
        controller,
        gate,
        gate_clients: args.gate.clients(),
        traffic,
        sweep_interval: args.controller.sweep_interval,
        deliveries: args.webhooks.limits(),
        lease,
        shutdown_grace: args.shutdown_grace,
    };
    run(config, listener, shutdown_on_signals()).await?;
    tracing::info!("previewd stopped");
    Ok(())
}

/// A shutdown flag that turns true on SIGTERM or Ctrl-C.
pub fn shutdown_on_signals() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = match signal(SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(e) => {
                tracing::error!(error = %e, "could not install the SIGTERM handler; only Ctrl-C stops previewd");
                let _ = tokio::signal::ctrl_c().await;
                let _ = tx.send(true);
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutdown signal received");
        let _ = tx.send(true);
    });
    rx
}

/// Logs what the kernel keeps around the engines, sets `previewd_engine_containment`, and
/// returns the line `/readyz` repeats. A wall missing is a warning (an error when the mode
/// requires it: no engine will run).
fn say_containment(metrics: &Metrics, mode: ContainmentMode) -> String {
    let support = Support::probe();
    metrics.reconcile.set_containment(support, mode);
    let line = support.describe(mode);
    let whole = support.files() && support.network();
    match mode {
        ContainmentMode::Off => tracing::warn!("{line}"),
        _ if whole => tracing::info!("{line}"),
        ContainmentMode::Required => tracing::error!(
            "{line}: no Helm chart or Kustomize overlay will render on this node (--engine-containment=required)"
        ),
        ContainmentMode::BestEffort => tracing::warn!("{line}"),
    }
    line
}
