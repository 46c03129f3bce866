//! previewd's controller with its wake gate answering (`--gate-listen`), and the gate itself on
//! a loopback port, for the gate's tests and benchmark.

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use previewd::gate::metrics::GateMetrics;
use previewd::gate::server::{Gate, Waker};
use previewd::reconcile::ControllerConfig;

/// The controller for `namespace`, with the gate answering for sleeping hosts and the kinds of
/// `extra_kinds` allowed.
pub async fn controller(
    client: &Client,
    namespace: &str,
    extra_kinds: &[serde_json::Value],
) -> super::Running {
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        template_kinds: super::template_kinds_and(extra_kinds),
        gate_answers: true,
        // The route tests' template attaches to this Gateway of another namespace.
        operator_policy: previewd::model::grants::OperatorPolicy {
            ceiling: previewd::model::ceiling::TemplateCeiling {
                gateways: vec!["gateway-system/previews".into()],
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    super::start_controller_with(client, config).await
}

/// The gate over `running`'s environments, waking with `waker`, on a free loopback port; its
/// address and metrics.
pub async fn serve(running: &super::Running, waker: Arc<dyn Waker>) -> (SocketAddr, GateMetrics) {
    let metrics = GateMetrics::new();
    let gate = Gate::new(
        running.caches.environments.clone(),
        waker,
        metrics.clone(),
        Default::default(),
    );
    (listen(gate).await, metrics)
}

/// `gate` serving on a free loopback port until the test ends.
pub async fn listen(gate: Arc<Gate>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(previewd::gate::server::serve(
        gate,
        listener,
        std::future::pending(),
    ));
    address
}
