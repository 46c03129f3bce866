//! The API server's own count of the requests it served (`apiserver_request_total` from its
//! `/metrics`), so that a test or benchmark counts writes where previewd cannot influence the
//! figure. The counter covers every client of the API server, so readers compare a before and
//! an after and look at the resources they care about. And its own time serving them
//! (`apiserver_request_duration_seconds`, [`RequestSeconds`]), to tell a wait on the API server
//! from previewd's own time.

use std::collections::BTreeMap;

use kube::Client;

/// One series of `apiserver_request_total`, without the labels that only split it further.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requests {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`, …
    pub verb: String,
    /// e.g. `configmaps`, `previewenvironments`, `leases`
    pub resource: String,
    /// e.g. `status`, or empty
    pub subresource: String,
}

impl Requests {
    /// Whether the request changes (or tries to change) stored state.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "POST"
                | "PUT"
                | "PATCH"
                | "APPLY"
                | "DELETE"
                | "DELETECOLLECTION"
                | "CREATE"
                | "UPDATE"
        )
    }

    /// A heartbeat every cluster writes whatever previewd does: Leases (previewd's, the
    /// controller manager's, the simulated nodes') and node status.
    pub fn is_heartbeat(&self) -> bool {
        self.resource == "leases" || self.resource == "nodes"
    }

    /// A write of the shape previewd's are: server-side applies and merge patches (`PATCH`, or
    /// `APPLY`), and any write to a PreviewEnvironment but a delete. The controller manager's
    /// background writes (creating what a new namespace gets, emptying a deleted one, status
    /// updates) are `POST`, `PUT` and `DELETE`; heartbeats are left out.
    pub fn is_previewd_shaped(&self) -> bool {
        let patch = matches!(self.verb.as_str(), "PATCH" | "APPLY") && !self.is_heartbeat();
        let environment = self.resource == "previewenvironments"
            && !matches!(self.verb.as_str(), "DELETE" | "DELETECOLLECTION");
        self.is_write() && (patch || environment)
    }
}

/// A reading of the counter: requests served so far, per (verb, resource, subresource).
#[derive(Clone, Debug, Default)]
pub struct RequestCounts(pub BTreeMap<Requests, u64>);

impl RequestCounts {
    /// What was served between `earlier` and `self`, series that did not move left out.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let mut moved = BTreeMap::new();
        for (key, count) in &self.0 {
            let before = earlier.0.get(key).copied().unwrap_or(0);
            if *count > before {
                moved.insert(key.clone(), count - before);
            }
        }
        RequestCounts(moved)
    }

    /// Write requests on the resources `include` accepts.
    pub fn writes(&self, include: impl Fn(&Requests) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| key.is_write() && include(key))
            .map(|(_, count)| count)
            .sum()
    }

    /// Requests with this verb on this resource (any subresource).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| key.verb == verb && key.resource == resource)
            .map(|(_, count)| count)
            .sum()
    }

    /// One line per moved series, for a failure message or a report.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(key, count)| {
                let subresource = if key.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", key.subresource)
                };
                format!("{} {}{subresource}: {count}", key.verb, key.resource)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Reads `apiserver_request_total` from the API server's `/metrics` (the admin identity may).
pub async fn request_counts(client: &Client) -> RequestCounts {
    parse(&metrics_text(client).await)
}

/// The API server's `/metrics`, as text.
async fn metrics_text(client: &Client) -> String {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a GET request");
    client
        .request_text(request)
        .await
        .expect("the API server's /metrics")
}

fn parse(text: &str) -> RequestCounts {
    let mut counts = BTreeMap::new();
    for (key, value) in series(text, "apiserver_request_total{") {
        *counts.entry(key).or_insert(0) += value as u64;
    }
    RequestCounts(counts)
}

/// Every series of the metric whose lines start with `prefix` (its name and `{`), by (verb,
/// resource, subresource), with its value; other labels are summed over by the caller.
fn series<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = (Requests, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(prefix)?;
        let (labels, value) = rest.rsplit_once("} ")?;
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_default()
                .to_string()
        };
        let key = Requests {
            verb: label("verb"),
            resource: label("resource"),
            subresource: label("subresource"),
        };
        Some((key, value.trim().parse().unwrap_or(0.0)))
    })
}

/// The API server's own time serving requests (`apiserver_request_duration_seconds`, from a
/// request's arrival to its answer: admission, validation, etcd): per (verb, resource,
/// subresource), the seconds in all and the requests.
#[derive(Clone, Debug, Default)]
pub struct RequestSeconds(pub BTreeMap<Requests, (f64, f64)>);

impl RequestSeconds {
    pub async fn read(client: &Client) -> Self {
        let text = metrics_text(client).await;
        let mut seconds: BTreeMap<Requests, (f64, f64)> = BTreeMap::new();
        for (key, sum) in series(&text, "apiserver_request_duration_seconds_sum{") {
            seconds.entry(key).or_default().0 += sum;
        }
        for (key, count) in series(&text, "apiserver_request_duration_seconds_count{") {
            seconds.entry(key).or_default().1 += count;
        }
        Self(seconds)
    }

    /// The mean in milliseconds of `verb` on `resource` (`resource/subresource`) between
    /// `earlier` and these, with how many; `None` if none was served.
    pub fn mean_ms_since(&self, earlier: &Self, verb: &str, resource: &str) -> Option<(f64, f64)> {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let key = Requests {
            verb: verb.into(),
            resource: resource.into(),
            subresource: subresource.into(),
        };
        let (sum, count) = self.0.get(&key).copied()?;
        let (sum_before, count_before) = earlier.0.get(&key).copied().unwrap_or_default();
        let served = count - count_before;
        (served >= 1.0).then(|| ((sum - sum_before) / served * 1000.0, served))
    }
}
