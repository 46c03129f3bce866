//! The gate's metrics: requests by answer, and how long its wakes take. Its wakes are writes,
//! counted with every other write (`previewd_write_requests_total{operation="gate_wake"}`).

use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts};

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
    /// `requests`' counter of each of [`ANSWERS`], in that order, looked up once: a label
    /// lookup per request hashes the label on the gate's busiest path.
    by_answer: Vec<IntCounter>,
    /// From the gate's answer to a request that wakes an environment to the API server's
    /// acceptance of the wake: the gate's own share of a wake.
    pub wake_seconds: Histogram,
}

impl Default for GateMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for GateMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.wake_seconds.clone()),
        ]
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
        let by_answer = ANSWERS
            .iter()
            .map(|answer| requests.with_label_values(&[answer]))
            .collect();
        let wake_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "previewd_gate_wake_seconds",
                "From the gate's answer to a request that wakes an environment to the API server's acceptance of the wake",
            )
            .buckets(vec![0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
        )
        .expect("valid metric");
        Self {
            requests,
            by_answer,
            wake_seconds,
        }
    }

    /// Counts a request answered `answer`, one of [`ANSWERS`].
    pub fn answered(&self, answer: &'static str) {
        match ANSWERS.iter().position(|known| *known == answer) {
            Some(index) => self.by_answer[index].inc(),
            None => self.requests.with_label_values(&[answer]).inc(),
        }
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
