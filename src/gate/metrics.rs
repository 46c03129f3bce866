//! The gate's metrics: requests by answer. Its wakes are writes, counted with every other
//! write (`previewd_writes_total{operation="gate_wake"}`).

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts};

use crate::cluster::metrics::MetricSet;

/// What the gate answered: `woke` (a sleeping environment's host: it is being woken),
/// `waiting` (a host whose environment is already starting), `unknown` (no environment holds
/// the host: 404), `busy` (a connection over the bound of connections, closed at once).
pub const ANSWERS: [&str; 4] = ["woke", "waiting", "unknown", "busy"];

#[derive(Clone)]
pub struct GateMetrics {
    pub requests: IntCounterVec,
}

impl Default for GateMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for GateMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![Box::new(self.requests.clone())]
    }
}

impl GateMetrics {
    pub fn new() -> Self {
        let requests = IntCounterVec::new(
            Opts::new(
                "previewd_gate_requests_total",
                "Requests to the wake gate by answer",
            ),
            &["answer"],
        )
        .expect("valid metric");
        for answer in ANSWERS {
            requests.with_label_values(&[answer]);
        }
        Self { requests }
    }

    pub fn answered(&self, answer: &'static str) {
        self.requests.with_label_values(&[answer]).inc();
    }
}
