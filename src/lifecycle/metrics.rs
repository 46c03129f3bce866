//! The sweep's metrics: what it removed (by reason) and what it put to sleep.

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
