//! Prometheus metrics. Labels are static categories only: never an environment, a branch or
//! an error message.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    /// Server-side applies sent, and skipped because nothing changed.
    pub applies: IntCounterVec,
    /// Every write request previewd sends to the API server, by operation.
    pub writes: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub reconcile_errors: IntCounterVec,
    /// Webhook deliveries by forge, event (`pull_request`, `push`, `delete`, `comment`, `ping`,
    /// `tag_push`, `other`) and outcome (`accepted`, `unchanged`, `ignored`, `duplicate`, `pong`,
    /// `unauthorized`, `malformed`, `too_large`, `error`).
    pub webhooks: IntCounterVec,
    pub webhook_duration: HistogramVec,
    /// Forge API calls by forge, operation and outcome (`ok`, `error`, `rate_limited`).
    pub forge_requests: IntCounterVec,
    /// The forge's remaining request budget, from its rate-limit headers.
    pub forge_rate_limit_remaining: IntGaugeVec,
    /// Environments and namespaces removed by the sweep, by reason.
    pub gc_deletions: IntCounterVec,
    /// Idle environments the sweep put to sleep.
    pub gc_sleeps: IntCounter,
    /// Environments by phase, as the controller's cache holds them (set at each scrape).
    pub environments: IntGaugeVec,
    /// Seconds from a commit's request (the push) to its environment being Ready.
    pub time_to_ready: Histogram,
    /// Seconds a seed Job ran, from its first sight running to success.
    pub seed_duration: Histogram,
    /// Seed Jobs that failed.
    pub seed_failures: IntCounter,
    /// 1 while this replica holds the leader Lease (reconciles and sweeps), else 0.
    pub leader: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let applies = IntCounterVec::new(
            Opts::new(
                "previewd_apply_requests_total",
                "Server-side applies, sent or skipped by the apply cache",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let writes = IntCounterVec::new(
            Opts::new(
                "previewd_write_requests_total",
                "Write requests sent to the Kubernetes API",
            ),
            &["operation"],
        )
        .expect("valid metric");
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "previewd_reconcile_duration_seconds",
                "Time spent in one reconcile",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["outcome"],
        )
        .expect("valid metric");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "previewd_reconcile_errors_total",
                "Reconcile errors by category",
            ),
            &["category"],
        )
        .expect("valid metric");
        let webhooks = IntCounterVec::new(
            Opts::new(
                "previewd_webhook_deliveries_total",
                "Webhook deliveries by outcome",
            ),
            &["forge", "event", "outcome"],
        )
        .expect("valid metric");
        let webhook_duration = HistogramVec::new(
            HistogramOpts::new(
                "previewd_webhook_duration_seconds",
                "Time from a delivery's arrival to its answer",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ]),
            &["forge"],
        )
        .expect("valid metric");
        let forge_requests = IntCounterVec::new(
            Opts::new("previewd_forge_requests_total", "Forge API requests"),
            &["forge", "operation", "outcome"],
        )
        .expect("valid metric");
        let forge_rate_limit_remaining = IntGaugeVec::new(
            Opts::new(
                "previewd_forge_rate_limit_remaining",
                "Requests left in the forge's rate-limit window, as its last answer said",
            ),
            &["forge"],
        )
        .expect("valid metric");
        let gc_deletions = IntCounterVec::new(
            Opts::new(
                "previewd_gc_deletions_total",
                "Removals by the sweep, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let gc_sleeps = IntCounter::new(
            "previewd_gc_sleeps_total",
            "Idle environments put to sleep by the sweep",
        )
        .expect("valid metric");
        let environments = IntGaugeVec::new(
            Opts::new("previewd_environments", "Environments by phase"),
            &["phase"],
        )
        .expect("valid metric");
        let time_to_ready = Histogram::with_opts(
            HistogramOpts::new(
                "previewd_time_to_ready_seconds",
                "Time from a commit's push to its environment being Ready",
            )
            .buckets(vec![
                1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
            ]),
        )
        .expect("valid metric");
        let seed_duration = Histogram::with_opts(
            HistogramOpts::new(
                "previewd_seed_duration_seconds",
                "Time a seed Job ran until it succeeded",
            )
            .buckets(vec![
                0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
            ]),
        )
        .expect("valid metric");
        let seed_failures =
            IntCounter::new("previewd_seed_failures_total", "Seed Jobs that failed")
                .expect("valid metric");
        let leader = IntGauge::new(
            "previewd_leader",
            "1 while this replica holds the leader Lease and reconciles, else 0",
        )
        .expect("valid metric");
        for collector in [
            Box::new(applies.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(writes.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(webhooks.clone()),
            Box::new(webhook_duration.clone()),
            Box::new(forge_requests.clone()),
            Box::new(forge_rate_limit_remaining.clone()),
            Box::new(gc_deletions.clone()),
            Box::new(gc_sleeps.clone()),
            Box::new(environments.clone()),
            Box::new(time_to_ready.clone()),
            Box::new(seed_duration.clone()),
            Box::new(seed_failures.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(collector).expect("metric registers once");
        }
        Self {
            registry,
            applies,
            writes,
            reconcile_duration,
            reconcile_errors,
            webhooks,
            webhook_duration,
            forge_requests,
            forge_rate_limit_remaining,
            gc_deletions,
            gc_sleeps,
            environments,
            time_to_ready,
            seed_duration,
            seed_failures,
            leader,
        }
    }

    /// Sets the environments-by-phase gauge from the environments the cache holds.
    pub fn count_environments<'a>(
        &self,
        environments: impl IntoIterator<Item = &'a crate::crd::PreviewEnvironment>,
    ) {
        let mut counts = std::collections::HashMap::new();
        for environment in environments {
            let phase = environment
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default();
            *counts.entry(phase).or_insert(0i64) += 1;
        }
        for phase in crate::crd::Phase::ALL {
            self.environments
                .with_label_values(&[phase.as_str()])
                .set(counts.get(&phase).copied().unwrap_or(0));
        }
    }

    /// Counts one write request of `operation` (`apply`, `delete`, `status`, `finalizer`,
    /// `event`, the webhook intake's `intake_apply`, `intake_delete`, `intake_wake`, and the
    /// sweep's `sleep`).
    pub fn write(&self, operation: &'static str) {
        self.writes.with_label_values(&[operation]).inc();
    }

    /// All write requests so far.
    pub fn total_writes(&self) -> u64 {
        [
            "apply",
            "delete",
            "status",
            "finalizer",
            "event",
            "intake_apply",
            "intake_delete",
            "intake_wake",
            "sleep",
        ]
        .iter()
        .map(|op| self.writes.with_label_values(&[op]).get())
        .sum()
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding");
        String::from_utf8(buffer).expect("metrics are UTF-8")
    }
}

#[cfg(test)]
mod tests {
    /// Every metric the Grafana dashboard queries is one previewd exports.
    #[test]
    fn the_dashboard_queries_only_metrics_that_exist() {
        let dashboard = include_str!("../docs/grafana-dashboard.json");
        let source = include_str!("metrics.rs");
        let json: serde_json::Value =
            serde_json::from_str(dashboard).expect("the dashboard is JSON");
        let mut queried = std::collections::BTreeSet::new();
        for panel in json["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("expr");
                for (start, _) in expr.match_indices("previewd_") {
                    let name: String = expr[start..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let base = ["_bucket", "_count", "_sum"]
                        .iter()
                        .find_map(|suffix| name.strip_suffix(suffix))
                        .unwrap_or(&name)
                        .to_string();
                    queried.insert(base);
                }
            }
        }
        assert!(
            queried.len() >= 14,
            "the dashboard covers the metrics: {queried:?}"
        );
        for name in &queried {
            assert!(
                source.contains(&format!("\"{name}\"")),
                "the dashboard queries {name}, which previewd does not export"
            );
        }
    }
}
