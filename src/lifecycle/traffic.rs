//! Traffic as activity: an environment someone uses stays awake. Every `--traffic-interval`
//! the leader asks a Prometheus server how many requests each awake environment's host got
//! (`--traffic-query`, a PromQL template with `{{ host }}`, for the metrics an ingress
//! controller or gateway already exports), and records the ones that got any as active:
//! `spec.lastActivity` set to now, the clock the idle rule reads. One write per active
//! environment per interval at most, never one per request (the spec change makes a reconcile
//! that applies nothing and writes the status's `observedGeneration`); an environment whose
//! activity is already more recent than the interval is not asked about.
//!
//! Safe by construction: the host is previewd's record of it (`status.host`), and only a DNS
//! name (letters, digits, `-`, `.`) is put into a query; Prometheus' answer is read for numbers
//! only, and an unreachable or failing Prometheus records nothing (the environment may then
//! sleep as it would without traffic, and wakes on its next request).

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::Client;

use crate::cluster::caches::Caches;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::records::Records;
use crate::cluster::writer::Writer;
use crate::lifecycle::metrics::TrafficMetrics;
use crate::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::is_hub_record;

/// The placeholder a traffic query must hold.
pub const HOST_PLACEHOLDER: &str = "{{ host }}";
/// How many queries are in flight at once.
const QUERIES_IN_FLIGHT: usize = 8;
/// How long one query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to ask for traffic (`--traffic-prometheus-url`, `--traffic-query`,
/// `--traffic-interval`).
#[derive(Clone, Debug)]
pub struct TrafficSource {
    /// Prometheus' base URL, e.g. `http://prometheus.monitoring:9090`.
    pub prometheus: url::Url,
    /// PromQL with [`HOST_PLACEHOLDER`], e.g.
    /// `sum(increase(nginx_ingress_controller_requests{host="{{ host }}"}[10m]))`.
    pub query: String,
    pub interval: Duration,
}

impl TrafficSource {
    /// Checks the query names the host exactly once or more, and the URL is HTTP(S).
    pub fn new(prometheus: url::Url, query: String, interval: Duration) -> Result<Self, String> {
        if !query.contains(HOST_PLACEHOLDER) {
            return Err(format!(
                "--traffic-query must contain {HOST_PLACEHOLDER} where the environment's host goes, e.g. sum(increase(nginx_ingress_controller_requests{{host=\"{HOST_PLACEHOLDER}\"}}[10m]))"
            ));
        }
        if !matches!(prometheus.scheme(), "http" | "https") {
            return Err(format!(
                "--traffic-prometheus-url {prometheus} is not http(s)"
            ));
        }
        Ok(Self {
            prometheus,
            query,
            interval,
        })
    }

    /// The query for `host`, or `None` if `host` is not a plain DNS name (nothing else is
    /// ever put into PromQL).
    pub fn query_for(&self, host: &str) -> Option<String> {
        let plain = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        plain.then(|| self.query.replace(HOST_PLACEHOLDER, host))
    }
}

/// An environment to ask about: awake, holding a host, under an idle timeout, and not active
/// within the last interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    pub host: String,
}

/// The environments whose traffic is worth a query at `now` (pure).
pub fn candidates<'a>(
    environments: impl IntoIterator<Item = &'a PreviewEnvironment>,
    template_of: impl Fn(&PreviewEnvironment) -> Option<std::sync::Arc<PreviewTemplate>>,
    interval: Duration,
    now: DateTime<Utc>,
) -> Vec<Candidate> {
    let recent = chrono::TimeDelta::from_std(interval).unwrap_or(chrono::TimeDelta::MAX);
    environments
        .into_iter()
        .filter(|e| e.metadata.deletion_timestamp.is_none() && !e.spec.sleep)
        // A hub's record: its traffic is the hub's environment's to record.
        .filter(|e| !is_hub_record(e))
        .filter(|e| {
            e.spec
                .last_activity
                .is_none_or(|at| now.signed_duration_since(at) >= recent)
        })
        .filter(|e| template_of(e).is_some_and(|t| t.spec.lifecycle.idle_timeout.is_some()))
        .filter_map(|e| {
            let status = e.status.as_ref()?;
            let running = matches!(
                status.phase,
                Phase::Ready | Phase::Degraded | Phase::Deploying | Phase::Seeding
            );
            Some(Candidate {
                namespace: e.metadata.namespace.clone()?,
                name: e.metadata.name.clone()?,
                host: status.host.clone().filter(|_| running)?,
            })
        })
        .collect()
}

/// The number in a Prometheus `/api/v1/query` answer: the sum of a vector's samples, or a
/// scalar. `None` for an answer that is not a success or holds no number.
pub fn requests_in(answer: &serde_json::Value) -> Option<f64> {
    if answer["status"] != "success" {
        return None;
    }
    let data = &answer["data"];
    let number = |sample: &serde_json::Value| {
        sample[1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|n| n.is_finite())
    };
    match data["resultType"].as_str()? {
        "vector" => Some(
            data["result"]
                .as_array()?
                .iter()
                .filter_map(|series| number(&series["value"]))
                .sum(),
        ),
        "scalar" => number(&data["result"]),
        _ => None,
    }
}

/// What one round found.
#[derive(Clone, Debug, Default)]
pub struct TrafficReport {
    /// `namespace/name` of the environments that got requests (their activity was recorded).
    pub active: Vec<String>,
    /// Asked about, and got none.
    pub quiet: Vec<String>,
    /// The query or the write failed.
    pub failed: Vec<String>,
}

/// Asks Prometheus about each candidate and records the active ones.
pub struct TrafficRecorder {
    pub client: Client,
    pub caches: Caches,
    pub source: TrafficSource,
    pub metrics: TrafficMetrics,
    pub writes: ClusterMetrics,
    pub http: reqwest::Client,
}

/// How one candidate came out.
enum Outcome {
    Active,
    Quiet,
    Failed(String),
}

impl TrafficRecorder {
    /// Asks every interval, until the future is dropped.
    pub async fn run(self) {
        self.caches.wait_until_ready().await;
        let mut ticker = tokio::time::interval(self.source.interval);
        // A round slower than the interval is followed by the next one, not by a burst.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let report = self.record(Utc::now()).await;
            tracing::info!(
                active = report.active.len(),
                quiet = report.quiet.len(),
                failed = report.failed.len(),
                "traffic recorded"
            );
        }
    }

    /// One round at `now`.
    pub async fn record(&self, now: DateTime<Utc>) -> TrafficReport {
        let environments = self.caches.environments.state();
        let template_of = |e: &PreviewEnvironment| {
            self.caches
                .template(e.metadata.namespace.as_deref()?, &e.spec.template)
        };
        let asked = candidates(
            // A hub's records: their traffic is the hub's environment's to record.
            environments
                .iter()
                .map(|e| &**e)
                .filter(|e| !is_hub_record(e)),
            template_of,
            self.source.interval,
            now,
        );
        let outcomes: Vec<(Candidate, Outcome)> = futures::stream::iter(asked)
            .map(|candidate| async move {
                let outcome = self.one(&candidate, now).await;
                (candidate, outcome)
            })
            .buffer_unordered(QUERIES_IN_FLIGHT)
            .collect()
            .await;
        let mut report = TrafficReport::default();
        let mut first_error = None;
        for (candidate, outcome) in outcomes {
            let name = format!("{}/{}", candidate.namespace, candidate.name);
            match outcome {
                Outcome::Active => report.active.push(name),
                Outcome::Quiet => report.quiet.push(name),
                Outcome::Failed(error) => {
                    first_error.get_or_insert((name.clone(), error));
                    report.failed.push(name);
                }
            }
        }
        // One line per round, not one per environment: a Prometheus outage fails them all.
        if let Some((environment, error)) = first_error {
            tracing::warn!(failed = report.failed.len(), %environment, %error, "could not learn the traffic of some environments; they count as quiet this round");
        }
        report
    }

    async fn one(&self, candidate: &Candidate, now: DateTime<Utc>) -> Outcome {
        let Some(query) = self.source.query_for(&candidate.host) else {
            self.metrics.asked("error");
            return Outcome::Failed(format!("{:?} is not a host name", candidate.host));
        };
        let requests = match self.ask(&query).await {
            Ok(requests) => requests,
            Err(error) => {
                self.metrics.asked("error");
                return Outcome::Failed(error);
            }
        };
        if requests <= 0.0 {
            self.metrics.asked("quiet");
            return Outcome::Quiet;
        }
        self.metrics.asked("active");
        let writer = Writer::new(self.writes.clone());
        let records = Records::new(&self.client, &writer);
        let (namespace, name) = (&candidate.namespace, &candidate.name);
        match records.note_activity(namespace, name, now).await {
            Ok(_) => Outcome::Active,
            Err(error) => Outcome::Failed(error.to_string()),
        }
    }

    /// The number of requests `query` says.
    async fn ask(&self, query: &str) -> Result<f64, String> {
        let mut url = self.source.prometheus.clone();
        url.path_segments_mut()
            .map_err(|_| "the Prometheus URL cannot have a path".to_string())?
            .pop_if_empty()
            .extend(["api", "v1", "query"]);
        url.query_pairs_mut().append_pair("query", query);
        let answer = self
            .http
            .get(url)
            .timeout(QUERY_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("asking Prometheus: {e}"))?;
        let status = answer.status();
        let body: serde_json::Value = answer
            .json()
            .await
            .map_err(|e| format!("Prometheus answered {status} with no JSON: {e}"))?;
        requests_in(&body).ok_or_else(|| {
            let error = body["error"].as_str().unwrap_or("no number in the answer");
            format!(
                "Prometheus answered {status}: {}",
                error.chars().take(200).collect::<String>()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewEnvironmentStatus;
    use serde_json::json;

    fn source() -> TrafficSource {
        TrafficSource::new(
            "http://prometheus:9090".parse().unwrap(),
            "sum(increase(requests{host=\"{{ host }}\"}[10m]))".into(),
            Duration::from_secs(300),
        )
        .unwrap()
    }

    #[test]
    fn a_query_without_the_host_or_a_url_that_is_not_http_is_refused() {
        let url: url::Url = "http://prometheus:9090".parse().unwrap();
        assert!(TrafficSource::new(url, "sum(requests)".into(), Duration::from_secs(60)).is_err());
        let file: url::Url = "file:///etc/passwd".parse().unwrap();
        assert!(TrafficSource::new(file, "{{ host }}".into(), Duration::from_secs(60)).is_err());
    }

    #[test]
    fn only_a_dns_name_is_put_into_the_query() {
        let source = source();
        assert_eq!(
            source.query_for("pr-2.preview.example.com").as_deref(),
            Some("sum(increase(requests{host=\"pr-2.preview.example.com\"}[10m]))")
        );
        for hostile in ["a\"}) or vector(1e9) or sum({x=\"", "a b", "", "a{b}"] {
            assert_eq!(source.query_for(hostile), None, "{hostile}");
        }
    }

    #[test]
    fn prometheus_answers_are_read_for_numbers_only() {
        let vector = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"host": "a"}, "value": [1.0, "3.5"]},
            {"metric": {"host": "a"}, "value": [1.0, "2"]}]}});
        assert_eq!(requests_in(&vector), Some(5.5));
        let empty = json!({"status": "success", "data": {"resultType": "vector", "result": []}});
        assert_eq!(requests_in(&empty), Some(0.0));
        let scalar =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "7"]}});
        assert_eq!(requests_in(&scalar), Some(7.0));
        let nan =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "NaN"]}});
        assert_eq!(requests_in(&nan), None);
        let error = json!({"status": "error", "error": "parse error"});
        assert_eq!(requests_in(&error), None);
        assert_eq!(requests_in(&json!("not an answer")), None);
    }

    fn environment(name: &str, sleep: bool, active_minutes_ago: i64) -> PreviewEnvironment {
        let mut e = PreviewEnvironment::new(name, Default::default());
        e.metadata.namespace = Some("previews".into());
        e.spec.template = "web".into();
        e.spec.sleep = sleep;
        e.spec.last_activity = Some(now() - chrono::TimeDelta::minutes(active_minutes_ago));
        e.status = Some(PreviewEnvironmentStatus {
            phase: if sleep { Phase::Sleeping } else { Phase::Ready },
            host: Some(format!("{name}.preview.example.com")),
            ..Default::default()
        });
        e
    }

    fn now() -> DateTime<Utc> {
        "2026-11-26T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn only_awake_environments_under_an_idle_timeout_not_active_lately_are_asked_about() {
        let mut template = PreviewTemplate::new("web", Default::default());
        template.spec.lifecycle.idle_timeout = Some("1h".into());
        let template = std::sync::Arc::new(template);
        let environments = [
            environment("quiet", false, 30),
            environment("busy", false, 2),
            environment("asleep", true, 120),
        ];
        let with_timeout = |_: &PreviewEnvironment| Some(template.clone());
        let asked = candidates(&environments, with_timeout, Duration::from_secs(300), now());
        let names: Vec<&str> = asked.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["quiet"]);
        // A hub's record is the hub's to ask about.
        let mut record = environment("quiet", false, 30);
        record.metadata.labels = Some(
            [(
                crate::model::metadata::LABEL_HUB_NAMESPACE.to_string(),
                "team-a".to_string(),
            )]
            .into(),
        );
        assert!(candidates([&record], with_timeout, Duration::from_secs(300), now()).is_empty());
        assert_eq!(asked[0].host, "quiet.preview.example.com");
        let without = |_: &PreviewEnvironment| {
            Some(std::sync::Arc::new(PreviewTemplate::new(
                "web",
                Default::default(),
            )))
        };
        assert!(candidates(&environments, without, Duration::from_secs(300), now()).is_empty());
    }
}
