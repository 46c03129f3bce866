//! The forge layer's metrics: API calls by forge, operation and outcome, and the rate-limit
//! budget the forge reports.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use crate::cluster::metrics::MetricSet;

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
}

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
        ]
    }
}

impl ForgeMetrics {
    pub fn new() -> Self {
        let metrics = Self::without_series();
        // Every series of the blob counter from the start: /metrics shows what the docs name
        // before the first repository read.
        for forge in ["github", "gitlab"] {
            for outcome in ["read", "kept"] {
                metrics.blobs.with_label_values(&[forge, outcome]);
            }
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
        }
    }
}
