//! All of previewd's Prometheus metrics in one registry. Each layer defines its own small set
//! (`cluster`, `forge`, `webhook`, `lifecycle`, `reconcile`) and registers it here; the
//! components of a layer are handed only their layer's set. Labels are static categories only:
//! never an environment, a branch or an error message.

use prometheus::core::Collector;
use prometheus::{Encoder, IntGauge, Registry, TextEncoder};

use crate::cluster::metrics::{ClusterMetrics, MetricSet};
use crate::forge::metrics::ForgeMetrics;
use crate::gate::metrics::GateMetrics;
use crate::lifecycle::metrics::{SweepMetrics, TrafficMetrics};
use crate::reconcile::ControllerMetrics;
use crate::reconcile::metrics::ReconcileMetrics;
use crate::webhook::footprints::FootprintMetrics;
use crate::webhook::metrics::WebhookMetrics;
use crate::webhook::server::ServerMetrics;

pub struct Metrics {
    pub registry: Registry,
    pub cluster: ClusterMetrics,
    pub forge: ForgeMetrics,
    pub webhook: WebhookMetrics,
    pub sweep: SweepMetrics,
    pub reconcile: ReconcileMetrics,
    pub gate: GateMetrics,
    pub traffic: TrafficMetrics,
    pub footprints: FootprintMetrics,
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
        let metrics = Self {
            registry: Registry::new(),
            cluster: ClusterMetrics::new(),
            forge: ForgeMetrics::new(),
            webhook: WebhookMetrics::new(),
            sweep: SweepMetrics::new(),
            reconcile: ReconcileMetrics::new(),
            gate: GateMetrics::new(),
            traffic: TrafficMetrics::new(),
            footprints: FootprintMetrics::new(),
            leader: IntGauge::new(
                "previewd_leader",
                "1 while this replica holds the leader Lease and reconciles, else 0",
            )
            .expect("valid metric"),
        };
        for collector in metrics.collectors() {
            metrics
                .registry
                .register(collector)
                .expect("each metric registers once");
        }
        metrics
    }

    /// Every collector of every layer.
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        let mut all = self.cluster.collectors();
        all.extend(self.forge.collectors());
        all.extend(self.webhook.collectors());
        all.extend(self.sweep.collectors());
        all.extend(self.reconcile.collectors());
        all.extend(self.gate.collectors());
        all.extend(self.traffic.collectors());
        all.extend(self.footprints.collectors());
        all.push(Box::new(self.leader.clone()));
        all
    }

    /// The names of every metric previewd exports.
    pub fn names(&self) -> Vec<String> {
        self.collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
            .collect()
    }

    /// What the controller writes to.
    pub fn controller(&self) -> ControllerMetrics {
        ControllerMetrics {
            reconcile: self.reconcile.clone(),
            cluster: self.cluster.clone(),
            forge: self.forge.clone(),
        }
    }

    /// What the webhook server writes to and serves.
    pub fn server(&self) -> ServerMetrics {
        ServerMetrics {
            webhook: self.webhook.clone(),
            footprints: self.footprints.clone(),
            writes: self.cluster.clone(),
            registry: self.registry.clone(),
        }
    }

    /// All write requests so far.
    pub fn total_writes(&self) -> u64 {
        self.cluster.total_writes()
    }

    /// The text exposition format, for `/metrics`.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::warn!(error = %e, "could not encode the metrics");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    /// Every metric the Grafana dashboard queries is one previewd exports (read from the
    /// registry's own descriptions, not from source text).
    #[test]
    fn the_dashboard_queries_only_metrics_that_exist() {
        let dashboard = include_str!("../../docs/grafana-dashboard.json");
        let exported = Metrics::new().names();
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
                exported.contains(name),
                "the dashboard queries {name}, which previewd does not export"
            );
        }
    }
}
