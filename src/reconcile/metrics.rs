//! The reconciler's metrics, and the observations one reconcile adds to them (recorded only
//! once its status is written, so that a retried write does not count twice).

use std::time::{Duration, Instant};

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
};

use super::error::ERROR_CATEGORIES;
use crate::cluster::metrics::{MetricSet, counter_at_zero};
use crate::model::crd::PreviewEnvironmentStatus;

/// How long the start of a running seed is remembered (for its duration metric).
const SEED_MEMORY: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone)]
pub struct ReconcileMetrics {
    pub reconcile_duration: HistogramVec,
    /// Seconds each step of a reconcile took (`step`: [`STEPS`]): where a reconcile's time
    /// goes, previewd's own work (render, plan) apart from its waits on the API server and the
    /// forge.
    pub step_duration: HistogramVec,
    pub reconcile_errors: IntCounterVec,
    /// Seconds from a commit's request (the push) to its environment being Ready.
    pub time_to_ready: Histogram,
    /// Seconds a seed Job ran, from its first sight running to success.
    pub seed_duration: Histogram,
    /// Seed Jobs that failed.
    pub seed_failures: IntCounter,
    /// Engine renders by engine (`helm`, `kustomize`, `templates`: previewd's own render in a
    /// child process) and outcome (`rendered`, `cached`: nothing ran, `failed`).
    pub engine_renders: IntCounterVec,
    /// Removed environments whose namespace terminated past the grace period, said once each.
    pub namespace_holds: IntCounter,
    /// 1 for each wall the kernel keeps around the engines (`files`: Landlock, `network`:
    /// seccomp), 0 for one it does not (`engines::contain`).
    pub engine_containment: IntGaugeVec,
    /// Per registered cluster (`cluster`): 1 while it answers, 0 once it has not for the
    /// grace period (`PreviewCluster` status `reachable`).
    pub cluster_reachable: IntGaugeVec,
    /// Per registered cluster: environments placed on it, and its capacity.
    pub cluster_environments: IntGaugeVec,
    pub cluster_capacity: IntGaugeVec,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("valid metric")
}

impl MetricSet for ReconcileMetrics {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reconcile_duration.clone()),
            Box::new(self.step_duration.clone()),
            Box::new(self.reconcile_errors.clone()),
            Box::new(self.time_to_ready.clone()),
            Box::new(self.seed_duration.clone()),
            Box::new(self.seed_failures.clone()),
            Box::new(self.engine_renders.clone()),
            Box::new(self.engine_containment.clone()),
            Box::new(self.namespace_holds.clone()),
            Box::new(self.cluster_reachable.clone()),
            Box::new(self.cluster_environments.clone()),
            Box::new(self.cluster_capacity.clone()),
        ]
    }
}

/// The steps [`ReconcileMetrics::step_duration`] times, in the order a reconcile takes them:
/// reading the environment afresh when the cache may lack previewd's last status write, the
/// render and plan, the checks before anything is applied (hosts, copied secrets, kinds
/// served, storage classes), claiming the namespace, the applies (namespace, access, secrets,
/// databases, guard rails, waves), the prune, telling the forge, and writing the status.
pub const STEPS: [&str; 9] = [
    "read", "render", "checks", "claim", "apply", "prune", "report", "status", "event",
];

/// `previewd_reconcile_step_seconds`, from half a millisecond (a render read back by digest)
/// to ten seconds (a forge that answers slowly).
fn step_duration() -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(
            "previewd_reconcile_step_seconds",
            "Time one step of a reconcile took, by step",
        )
        .buckets(vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]),
        &["step"],
    )
    .expect("valid metric")
}

impl ReconcileMetrics {
    /// Runs `step`, timed as `name` (one of [`STEPS`]).
    pub async fn timed<T>(
        &self,
        name: &'static str,
        step: impl std::future::Future<Output = T>,
    ) -> T {
        debug_assert!(STEPS.contains(&name), "{name} is not among STEPS");
        let started = Instant::now();
        let output = step.await;
        self.step_duration
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
        output
    }
}

/// `previewd_engine_renders_total`, every series at 0 from the start (for `rate()` and alerts).
fn engine_renders() -> IntCounterVec {
    let counter = IntCounterVec::new(
        Opts::new(
            "previewd_engine_renders_total",
            "Helm chart renders, Kustomize builds and template renders in a child process by engine and outcome (rendered, cached: nothing ran, failed)",
        ),
        &["engine", "outcome"],
    )
    .expect("valid metric");
    for engine in ["helm", "kustomize", "templates"] {
        for outcome in ["rendered", "cached", "failed"] {
            counter.with_label_values(&[engine, outcome]);
        }
    }
    counter
}

/// `previewd_engine_containment`, both walls at 0 until previewd's start-up says what holds
/// (`runtime::service`): a scrape before then shows the series, not nothing.
fn engine_containment() -> IntGaugeVec {
    let gauge = IntGaugeVec::new(
        Opts::new(
            "previewd_engine_containment",
            "1 for each wall the kernel keeps around Helm, Kustomize and the render workers (files: Landlock, network: seccomp), 0 for one it does not",
        ),
        &["wall"],
    )
    .expect("valid metric");
    for wall in ["files", "network"] {
        gauge.with_label_values(&[wall]).set(0);
    }
    gauge
}

impl ReconcileMetrics {
    /// Sets `previewd_engine_containment` to the walls that hold under `mode`.
    pub fn set_containment(
        &self,
        support: crate::engines::contain::Support,
        mode: crate::engines::contain::ContainmentMode,
    ) {
        let on = mode != crate::engines::contain::ContainmentMode::Off;
        for (wall, holds) in [("files", support.files()), ("network", support.network())] {
            self.engine_containment
                .with_label_values(&[wall])
                .set(i64::from(on && holds));
        }
    }

    pub fn new() -> Self {
        Self {
            reconcile_duration: HistogramVec::new(
                HistogramOpts::new(
                    "previewd_reconcile_duration_seconds",
                    "Time spent in one reconcile",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["outcome"],
            )
            .expect("valid metric"),
            step_duration: step_duration(),
            reconcile_errors: counter_at_zero(
                Opts::new(
                    "previewd_reconcile_errors_total",
                    "Reconcile errors by category",
                ),
                "category",
                &ERROR_CATEGORIES,
            ),
            time_to_ready: histogram(
                "previewd_time_to_ready_seconds",
                "Time from a commit's push to its environment being Ready",
                &[
                    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                ],
            ),
            seed_duration: histogram(
                "previewd_seed_duration_seconds",
                "Time a seed Job ran until it succeeded",
                &[
                    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                ],
            ),
            seed_failures: IntCounter::new("previewd_seed_failures_total", "Seed Jobs that failed")
                .expect("valid metric"),
            engine_renders: engine_renders(),
            namespace_holds: IntCounter::new(
                "previewd_namespace_holds_total",
                "Removed environments whose namespace was still terminating after the grace period (--namespace-hold-grace): something holds it, said on the environment",
            )
            .expect("valid metric"),
            engine_containment: engine_containment(),
            cluster_reachable: cluster_gauge(
                "previewd_cluster_reachable",
                "Per registered cluster: 1 while its API server answers, 0 once it has not for the grace period (it then gets no new environments; its own are kept)",
            ),
            cluster_environments: cluster_gauge(
                "previewd_cluster_environments",
                "Environments placed on each registered cluster",
            ),
            cluster_capacity: cluster_gauge(
                "previewd_cluster_capacity",
                "Environments each registered cluster takes at most",
            ),
        }
    }
}

fn cluster_gauge(name: &str, help: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &["cluster"]).expect("valid metric")
}

impl ReconcileMetrics {
    /// Sets the gauges of registered cluster `name` from what its last look saw.
    pub fn see_cluster(&self, name: &str, reachable: bool, placed: u32, capacity: u32) {
        let gauge = |vec: &IntGaugeVec, value: i64| vec.with_label_values(&[name]).set(value);
        gauge(&self.cluster_reachable, i64::from(reachable));
        gauge(&self.cluster_environments, i64::from(placed));
        gauge(&self.cluster_capacity, i64::from(capacity));
    }

    /// Drops the series of a cluster no longer registered.
    pub fn forget_cluster(&self, name: &str) {
        for vec in [
            &self.cluster_reachable,
            &self.cluster_environments,
            &self.cluster_capacity,
        ] {
            let _ = vec.remove_label_values(&[name]);
        }
    }
}

/// What one reconcile's progress adds to the metrics.
#[derive(Default)]
pub struct Observations {
    pub seconds_to_ready: Option<f64>,
    pub seed_durations: Vec<f64>,
    pub seed_failures: u64,
}

/// Drops the seed starts remembered for [`SEED_MEMORY`] or longer at `now` (a clock of its
/// own, so that a test need not wait a day).
fn forget_old_seeds(started: &mut std::collections::HashMap<String, Instant>, now: Instant) {
    started.retain(|_, at| now.saturating_duration_since(*at) < SEED_MEMORY);
}

impl Observations {
    /// Compares the status about to be written with the previous one: a commit that just
    /// became Ready, seeds that just succeeded (timed from when previewd first saw them
    /// running, `started`: the reconciler's memory of running seed Jobs) or failed.
    pub fn between(
        previous: &PreviewEnvironmentStatus,
        status: &PreviewEnvironmentStatus,
        started: &mut std::collections::HashMap<String, Instant>,
    ) -> Self {
        let mut observations = Observations::default();
        let was_ready = |sha: &str| {
            previous
                .timings
                .as_ref()
                .is_some_and(|t| t.sha == sha && t.ready_at.is_some())
        };
        if let Some(timings) = &status.timings
            && timings.ready_at.is_some()
            && !was_ready(&timings.sha)
        {
            observations.seconds_to_ready = timings.seconds_to_ready;
        }
        let namespace = status.namespace.clone().unwrap_or_default();
        for seed in &status.seeds {
            let key = format!("{namespace}/{}", seed.job);
            let before = previous
                .seeds
                .iter()
                .find(|s| s.job == seed.job)
                .map(|s| s.state.as_str());
            match seed.state.as_str() {
                // A seed whose environment went before it finished is never removed below:
                // starts older than a day are forgotten whenever a new one is remembered.
                "Running" if !started.contains_key(&key) => {
                    forget_old_seeds(started, Instant::now());
                    started.insert(key, Instant::now());
                }
                "Running" => {}
                "Succeeded" if before != Some("Succeeded") => {
                    if let Some(at) = started.remove(&key) {
                        observations.seed_durations.push(at.elapsed().as_secs_f64());
                    }
                }
                "Failed" if before != Some("Failed") => {
                    started.remove(&key);
                    observations.seed_failures += 1;
                }
                _ => {}
            }
        }
        observations
    }

    pub fn record(&self, metrics: &ReconcileMetrics) {
        if let Some(seconds) = self.seconds_to_ready {
            metrics.time_to_ready.observe(seconds);
        }
        for seconds in &self.seed_durations {
            metrics.seed_duration.observe(*seconds);
        }
        metrics.seed_failures.inc_by(self.seed_failures);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::crd::SeedStatus;

    #[test]
    fn seed_start_times_are_kept_for_a_day_at_most() {
        // docs/security.md ("seed start times (a day)"): a seed whose environment went before
        // it finished is never removed by its outcome, so only its age bounds this memory.
        // The clock is passed in: 25 hours later is `start + 25 h`, not a day of waiting.
        let start = Instant::now();
        let hour = Duration::from_secs(3600);
        let mut started = HashMap::from([
            ("team/twenty-five-hours".to_string(), start),
            ("team/exactly-a-day".to_string(), start + hour),
            ("team/twenty-three-hours".to_string(), start + 2 * hour),
        ]);
        forget_old_seeds(&mut started, start + 25 * hour);
        let kept: Vec<&str> = started.keys().map(String::as_str).collect();
        assert_eq!(kept, ["team/twenty-three-hours"]);
    }

    #[test]
    fn a_seed_younger_than_a_day_is_kept_when_another_is_remembered() {
        // The pruning runs each time a new running seed is remembered; it must not drop the
        // starts still waiting for their seed to succeed (their duration would be lost).
        let previous = PreviewEnvironmentStatus::default();
        let mut started = HashMap::from([("team/older".to_string(), Instant::now())]);
        let running = SeedStatus {
            name: "db".into(),
            job: "newer".into(),
            state: "Running".into(),
            message: None,
        };
        let status = PreviewEnvironmentStatus {
            namespace: Some("team".into()),
            seeds: vec![running],
            ..Default::default()
        };
        Observations::between(&previous, &status, &mut started);
        let mut kept: Vec<&str> = started.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["team/newer", "team/older"]);
    }
}
