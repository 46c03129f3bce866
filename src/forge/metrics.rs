//! The forge layer's metrics: API calls by forge, operation and outcome, and the rate-limit
//! budget the forge reports.

use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts};

use crate::cluster::metrics::MetricSet;
use crate::model::crd::ForgeKind;

#[derive(Clone)]
pub struct ForgeMetrics {
    /// Forge API calls by forge, operation and outcome (`ok`, `error`, `rate_limited`, …).
    pub requests: IntCounterVec,
    /// The forge's remaining request budget, from its rate-limit headers, by forge and budget:
    /// `token` for a personal or project token, `installation-<id>` for each GitHub App
    /// installation (GitHub counts an App's requests per installation).
    pub rate_limit_remaining: IntGaugeVec,
    /// Repository files by forge and outcome: `read` (fetched by blob id) or `kept` (the
    /// blob cache had that content: no request).
    pub blobs: IntCounterVec,
    /// Content-creating requests (comments, commit statuses, deployments and their statuses,
    /// GitLab environments) by forge, kind and outcome: `sent` (let through by the content
    /// budget) or `superseded` (held back, then replaced by a newer report: never sent).
    pub content_requests: IntCounterVec,
    /// How long a report the content budget held back waited before it went out, by forge.
    pub content_wait: HistogramVec,
}

/// The kinds of content-creating requests previewd sends.
pub const CONTENT_KINDS: [&str; 5] = [
    "comment",
    "commit_status",
    "deployment",
    "deployment_status",
    "environment",
];

impl Default for ForgeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for ForgeMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.rate_limit_remaining.clone()),
            Box::new(self.blobs.clone()),
            Box::new(self.content_requests.clone()),
            Box::new(self.content_wait.clone()),
        ]
    }
}

impl ForgeMetrics {
    pub fn new() -> Self {
        let metrics = Self::without_series();
        // Every series of the blob counter from the start: /metrics shows what the docs name
        // before the first repository read.
        for forge in ForgeKind::ALL.map(ForgeKind::as_str) {
            for outcome in ["read", "kept"] {
                metrics.blobs.with_label_values(&[forge, outcome]);
            }
            for kind in CONTENT_KINDS {
                for outcome in ["sent", "superseded"] {
                    let labels = [forge, kind, outcome];
                    metrics.content_requests.with_label_values(&labels);
                }
            }
            metrics.content_wait.with_label_values(&[forge]);
        }
        metrics
    }

    fn without_series() -> Self {
        Self {
            requests: IntCounterVec::new(
                Opts::new("previewd_forge_requests_total", "Forge API requests"),
                &["forge", "operation", "outcome"],
            )
            .expect("valid metric"),
            rate_limit_remaining: IntGaugeVec::new(
                Opts::new(
                    "previewd_forge_rate_limit_remaining",
                    "Requests left in the forge's rate-limit window, as its last answer said",
                ),
                &["forge", "budget"],
            )
            .expect("valid metric"),
            blobs: IntCounterVec::new(
                Opts::new(
                    "previewd_forge_blobs_total",
                    "Repository files, read from the forge by blob id or kept from an earlier read",
                ),
                &["forge", "outcome"],
            )
            .expect("valid metric"),
            content_requests: IntCounterVec::new(
                Opts::new(
                    "previewd_forge_content_requests_total",
                    "Content-creating forge requests, sent or superseded before they were sent",
                ),
                &["forge", "kind", "outcome"],
            )
            .expect("valid metric"),
            content_wait: HistogramVec::new(
                HistogramOpts::new(
                    "previewd_forge_content_budget_wait_seconds",
                    "How long a report held back by the content budget waited before it went out",
                )
                .buckets(vec![
                    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0,
                ]),
                &["forge"],
            )
            .expect("valid metric"),
        }
    }
}
