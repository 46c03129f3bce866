//! The environments' footprint by template, set from the cache at each scrape of `/metrics`:
//! what the awake ones request now, and the resource-hours requested and saved so far (see
//! `model::footprint`), with the operator's prices beside them so that a dashboard turns
//! resource-hours into cost.
//!
//! The `template` label (`namespace/name`) is the one label previewd sets from an object's
//! name: templates are written by the cluster's operators, a handful per team, and the issue
//! these metrics answer is "what does each template cost"; environments, branches and users
//! never become labels.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use prometheus::core::Collector;
use prometheus::{Gauge, GaugeVec, Opts};

use crate::cluster::metrics::MetricSet;
use crate::model::crd::PreviewEnvironment;
use crate::model::footprint::{Prices, totals};

#[derive(Clone)]
pub struct FootprintMetrics {
    /// CPU cores the awake environments of a template request now.
    pub cpu_cores: GaugeVec,
    /// Memory bytes the awake environments of a template request now.
    pub memory_bytes: GaugeVec,
    /// Core-hours and GiB-hours requested so far by a template's environments (those that exist).
    pub core_hours: GaugeVec,
    pub gib_hours: GaugeVec,
    /// Core-hours and GiB-hours sleeping spared them so far.
    pub saved_core_hours: GaugeVec,
    pub saved_gib_hours: GaugeVec,
    /// The operator's prices (0 when none are set).
    pub price_per_core_hour: Gauge,
    pub price_per_gib_hour: Gauge,
}

impl Default for FootprintMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricSet for FootprintMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        let mut all: Vec<Box<dyn Collector>> = self
            .by_template()
            .into_iter()
            .map(|g| Box::new(g.clone()) as Box<dyn Collector>)
            .collect();
        all.push(Box::new(self.price_per_core_hour.clone()));
        all.push(Box::new(self.price_per_gib_hour.clone()));
        all
    }
}

fn by_template(name: &str, help: &str) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), &["template"]).expect("valid metric")
}

impl FootprintMetrics {
    pub fn new() -> Self {
        Self {
            cpu_cores: by_template(
                "previewd_footprint_cpu_cores",
                "CPU cores the awake environments of a template request",
            ),
            memory_bytes: by_template(
                "previewd_footprint_memory_bytes",
                "Memory bytes the awake environments of a template request",
            ),
            core_hours: by_template(
                "previewd_footprint_core_hours",
                "Core-hours requested so far by a template's environments",
            ),
            gib_hours: by_template(
                "previewd_footprint_gib_hours",
                "GiB-hours requested so far by a template's environments",
            ),
            saved_core_hours: by_template(
                "previewd_footprint_saved_core_hours",
                "Core-hours sleeping spared a template's environments so far",
            ),
            saved_gib_hours: by_template(
                "previewd_footprint_saved_gib_hours",
                "GiB-hours sleeping spared a template's environments so far",
            ),
            price_per_core_hour: Gauge::new(
                "previewd_price_per_core_hour",
                "The operator's price of a core-hour (0: none set)",
            )
            .expect("valid metric"),
            price_per_gib_hour: Gauge::new(
                "previewd_price_per_gib_hour",
                "The operator's price of a GiB-hour (0: none set)",
            )
            .expect("valid metric"),
        }
    }

    fn by_template(&self) -> [&GaugeVec; 6] {
        [
            &self.cpu_cores,
            &self.memory_bytes,
            &self.core_hours,
            &self.gib_hours,
            &self.saved_core_hours,
            &self.saved_gib_hours,
        ]
    }

    /// Sets the prices (once, at start-up).
    pub fn set_prices(&self, prices: Option<&Prices>) {
        self.price_per_core_hour
            .set(prices.map_or(0.0, |p| p.per_core_hour));
        self.price_per_gib_hour
            .set(prices.map_or(0.0, |p| p.per_gib_hour));
    }

    /// Sets the gauges from `environments` at `now`; templates without environments drop out.
    pub fn count<'a>(
        &self,
        environments: impl IntoIterator<Item = &'a PreviewEnvironment>,
        now: DateTime<Utc>,
    ) {
        let mut sums: BTreeMap<String, [f64; 6]> = BTreeMap::new();
        for environment in environments {
            let Some(footprint) = environment
                .status
                .as_ref()
                .and_then(|s| s.footprint.as_ref())
            else {
                continue;
            };
            let template = format!(
                "{}/{}",
                environment
                    .metadata
                    .namespace
                    .as_deref()
                    .unwrap_or_default(),
                environment.spec.template
            );
            let so_far = totals(footprint, now);
            let awake = !footprint.asleep;
            let sum = sums.entry(template).or_default();
            let now_cores = if awake {
                footprint.cpu_millicores as f64 / 1000.0
            } else {
                0.0
            };
            let now_bytes = if awake {
                footprint.memory_bytes as f64
            } else {
                0.0
            };
            for (slot, value) in sum.iter_mut().zip([
                now_cores,
                now_bytes,
                so_far.core_hours,
                so_far.gib_hours,
                so_far.saved_core_hours,
                so_far.saved_gib_hours,
            ]) {
                *slot += value;
            }
        }
        for gauge in self.by_template() {
            gauge.reset();
        }
        for (template, values) in &sums {
            for (gauge, value) in self.by_template().into_iter().zip(values) {
                gauge.with_label_values(&[template.as_str()]).set(*value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewEnvironmentStatus;
    use crate::model::footprint::{REFRESH, Requests, account};

    fn environment(template: &str, asleep: bool) -> PreviewEnvironment {
        let mut e = PreviewEnvironment::new("e", Default::default());
        e.metadata.namespace = Some("previews".into());
        e.spec.template = template.into();
        let requests = Requests {
            cpu_millicores: 500,
            memory_bytes: 1 << 30,
        };
        let since = "2026-11-26T10:00:00Z".parse().unwrap();
        e.status = Some(PreviewEnvironmentStatus {
            footprint: Some(account(None, requests, asleep, since, REFRESH)),
            ..Default::default()
        });
        e
    }

    #[test]
    fn each_template_sums_its_environments_and_gone_templates_drop_out() {
        let metrics = FootprintMetrics::new();
        let now = "2026-11-26T12:00:00Z".parse().unwrap();
        let environments = [
            environment("web", false),
            environment("web", true),
            environment("api", false),
        ];
        metrics.count(&environments, now);
        let web = |g: &GaugeVec| g.with_label_values(&["previews/web"]).get();
        assert_eq!(
            web(&metrics.cpu_cores),
            0.5,
            "the sleeping one requests nothing now"
        );
        assert_eq!(web(&metrics.core_hours), 1.0, "0.5 cores for 2 h");
        assert_eq!(web(&metrics.saved_core_hours), 1.0);
        assert_eq!(web(&metrics.saved_gib_hours), 2.0);
        metrics.count(&environments[..1], now);
        assert_eq!(
            metrics.cpu_cores.collect()[0].get_metric().len(),
            1,
            "previews/api is gone"
        );
    }
}
