//! The webhook side's metrics: deliveries by forge, event and outcome, how long answering took,
//! and the environments by phase (set from the cache at each scrape).

use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts};

use crate::cluster::metrics::MetricSet;
use crate::model::crd::{Phase, PreviewEnvironment};

#[derive(Clone)]
pub struct WebhookMetrics {
    /// Webhook deliveries by forge, event (`pull_request`, `push`, `delete`, `comment`, `ping`,
    /// `tag_push`, `other`) and outcome (`accepted`, `unchanged`, `ignored`, `duplicate`, `pong`,
    /// `unauthorized`, `malformed`, `too_large`, `too_slow`, `busy`, `error`).
    pub deliveries: IntCounterVec,
    pub duration: HistogramVec,
    /// Environments by phase, as the cache holds them (set at each scrape).
    pub environments: IntGaugeVec,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for WebhookMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.deliveries.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.environments.clone()),
        ]
    }
}

impl WebhookMetrics {
    pub fn new() -> Self {
        Self {
            deliveries: IntCounterVec::new(
                Opts::new(
                    "previewd_webhook_deliveries_total",
                    "Webhook deliveries by outcome",
                ),
                &["forge", "event", "outcome"],
            )
            .expect("valid metric"),
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "previewd_webhook_duration_seconds",
                    "Time from a delivery's arrival to its answer",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ]),
                &["forge"],
            )
            .expect("valid metric"),
            environments: IntGaugeVec::new(
                Opts::new("previewd_environments", "Environments by phase"),
                &["phase"],
            )
            .expect("valid metric"),
        }
    }

    /// Sets the environments-by-phase gauge from the environments the cache holds.
    pub fn count_environments<'a>(
        &self,
        environments: impl IntoIterator<Item = &'a PreviewEnvironment>,
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
        for phase in Phase::ALL {
            self.environments
                .with_label_values(&[phase.as_str()])
                .set(counts.get(&phase).copied().unwrap_or(0));
        }
    }
}
