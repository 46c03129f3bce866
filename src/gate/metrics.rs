//! The gate's metrics: requests by answer. Its wakes are writes, counted with every other
//! write (`previewd_write_requests_total{operation="gate_wake"}`).

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts};

use crate::cluster::metrics::MetricSet;

/// What the gate answered: `woke` (a sleeping environment's host: it is being woken),
/// `waiting` (a host whose environment is already starting), `unknown` (no environment holds
/// the host: 404), `busy` (a connection over the bound of connections, closed at once),
/// `busy_peer` (one over the connections of one peer that is not a trusted proxy),
/// `over_client_budget`, `over_team_share` and `over_budget` (a sleeping environment's
/// host, left asleep: the client, the environments of its team, or all clients together,
/// woke as many as the wake budget allows).
pub const ANSWERS: [&str; 8] = [
    "woke",
    "waiting",
    "unknown",
    "busy",
    "busy_peer",
    "over_client_budget",
    "over_team_share",
    "over_budget",
];

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

    /// A wake refused by the wake budget.
    pub fn over_budget(&self, over: super::budget::OverBudget) {
        self.answered(match over {
            super::budget::OverBudget::Client => "over_client_budget",
            super::budget::OverBudget::Team => "over_team_share",
            super::budget::OverBudget::InAll => "over_budget",
        });
    }
}
