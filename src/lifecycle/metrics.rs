//! The sweep's metrics: what it removed (by reason) and what it put to sleep; and the traffic
//! recorder's: how its questions to Prometheus came out.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, Opts};

use super::rules::Reason;
use crate::cluster::metrics::{MetricSet, counter_at_zero};

#[derive(Clone)]
pub struct SweepMetrics {
    /// Environments and namespaces removed by the sweep, by reason.
    pub deletions: IntCounterVec,
    /// Idle environments the sweep put to sleep.
    pub sleeps: IntCounter,
}

impl Default for SweepMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for SweepMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.deletions.clone()),
            Box::new(self.sleeps.clone()),
        ]
    }
}

/// What the traffic recorder learnt, per environment asked about.
#[derive(Clone)]
pub struct TrafficMetrics {
    /// `active` (requests: activity recorded), `quiet` (none), `error` (no answer).
    pub queries: IntCounterVec,
}

impl Default for TrafficMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for TrafficMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![Box::new(self.queries.clone())]
    }
}

impl TrafficMetrics {
    pub fn new() -> Self {
        Self {
            queries: counter_at_zero(
                Opts::new(
                    "previewd_traffic_queries_total",
                    "Questions to Prometheus about an environment's requests, by outcome",
                ),
                "outcome",
                &["active", "quiet", "error"],
            ),
        }
    }

    pub fn asked(&self, outcome: &'static str) {
        self.queries.with_label_values(&[outcome]).inc();
    }
}

impl SweepMetrics {
    pub fn new() -> Self {
        Self {
            deletions: counter_at_zero(
                Opts::new(
                    "previewd_gc_deletions_total",
                    "Removals by the sweep, by reason",
                ),
                "reason",
                &Reason::ALL.map(Reason::label),
            ),
            sleeps: IntCounter::new(
                "previewd_gc_sleeps_total",
                "Idle environments put to sleep by the sweep",
            )
            .expect("valid metric"),
        }
    }
}
