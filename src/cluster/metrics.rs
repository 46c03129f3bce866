//! The cluster layer's metrics: what previewd sends to the Kubernetes API. Every write request,
//! whichever layer makes it, is counted here, so that "previewd wrote nothing" can be checked
//! from one counter.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts, Registry};

/// The write operations counted under `previewd_write_requests_total{operation}`.
pub const WRITE_OPERATIONS: [&str; 18] = [
    "apply",
    "create",
    "delete",
    "status",
    "finalizer",
    "event",
    "intake_apply",
    "intake_delete",
    "intake_wake",
    "intake_check",
    "sleep",
    "gate_wake",
    "traffic",
    "command",
    "queue_displace",
    "placement",
    "target_record",
    "cluster_status",
];

/// One layer's metrics: what it exports, and (given) how it registers them.
pub trait MetricSet {
    /// Every collector of the set, for registration and for listing the names.
    fn collectors(&self) -> Vec<Box<dyn Collector>>;

    fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        self.collectors()
            .into_iter()
            .try_for_each(|c| registry.register(c))
    }
}

#[derive(Clone)]
pub struct ClusterMetrics {
    /// Server-side applies sent, and skipped because nothing changed.
    pub applies: IntCounterVec,
    /// Every write request previewd sends to the API server, by operation.
    pub writes: IntCounterVec,
    /// How each write sent through the writer ended, by operation and result (`ok`, `error`,
    /// `timeout`).
    pub write_results: IntCounterVec,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for ClusterMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.applies.clone()),
            Box::new(self.writes.clone()),
            Box::new(self.write_results.clone()),
        ]
    }
}

impl ClusterMetrics {
    pub fn new() -> Self {
        Self {
            applies: IntCounterVec::new(
                Opts::new(
                    "previewd_apply_requests_total",
                    "Server-side applies, sent or skipped by the apply cache",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            writes: IntCounterVec::new(
                Opts::new(
                    "previewd_write_requests_total",
                    "Write requests sent to the Kubernetes API",
                ),
                &["operation"],
            )
            .expect("valid metric"),
            write_results: IntCounterVec::new(
                Opts::new(
                    "previewd_write_results_total",
                    "How write requests to the Kubernetes API ended",
                ),
                &["operation", "result"],
            )
            .expect("valid metric"),
        }
    }

    /// Counts one write request of `operation` (one of [`WRITE_OPERATIONS`]).
    pub fn write(&self, operation: &'static str) {
        self.writes.with_label_values(&[operation]).inc();
    }

    /// Counts how a write of `operation` ended.
    pub fn write_result(&self, operation: &'static str, result: &'static str) {
        self.write_results
            .with_label_values(&[operation, result])
            .inc();
    }

    /// All write requests so far.
    pub fn total_writes(&self) -> u64 {
        WRITE_OPERATIONS
            .iter()
            .map(|op| self.writes.with_label_values(&[op]).get())
            .sum()
    }
}

/// A counter with one label whose values are all known in advance: each starts at 0, so that
/// `rate()` and alerts see a zero rather than no series before the first increment.
pub fn counter_at_zero(opts: Opts, label: &str, values: &[&str]) -> IntCounterVec {
    let counter = IntCounterVec::new(opts, &[label]).expect("valid metric");
    for value in values {
        counter.with_label_values(&[*value]);
    }
    counter
}
