//! Which environment holds a host, as the gate sees it: a snapshot of the environments cache,
//! keyed by the host each one holds (`status.host`), rebuilt at most once per
//! [`SNAPSHOT_MAX_AGE`]. A request looks its host up in the snapshot and nowhere else, so an
//! unknown host costs one hash lookup and never a request to the API server, and a flood of
//! requests costs at most one rebuild per interval, whatever their number.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;

use crate::model::crd::{Phase, PreviewEnvironment};
use crate::model::metadata::is_hub_record;

/// How stale the snapshot may be: a host starts to be answered at most this long after its
/// environment fell asleep (its routes are withdrawn only after that, by the reconcile).
pub const SNAPSHOT_MAX_AGE: Duration = Duration::from_secs(1);

/// The longest host name DNS allows.
const MAX_HOST_LENGTH: usize = 253;

/// What the gate knows of the environment that holds a host.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub namespace: String,
    pub name: String,
    /// Its team: the namespace of it and its template, whose part of the wake budget a wake
    /// spends.
    pub team: String,
    /// Its head commit (never shown: the wake records it, see `records::wake_for_request`).
    pub head: String,
    /// The version of it the gate saw: the wake applies only to that one.
    pub resource_version: String,
    /// `spec.sleep`: asleep or falling asleep; a request wakes it.
    pub asleep: bool,
    /// `metadata.generation`: the version of its spec (each sleep and wake is a new one).
    pub generation: i64,
    pub phase: Phase,
    /// While `Queued`: its place in the template's queue.
    pub queue_position: Option<u32>,
    /// How long its last wake took, if it woke before.
    pub last_wake_seconds: Option<f64>,
}

/// The host a request names (its `Host` header or URI authority), as environments hold hosts:
/// lower case, without a port or a final dot. `None` for anything that is not a DNS name
/// (an IP literal, characters no host has, too long): no environment holds it.
pub fn normalize(authority: &str) -> Option<String> {
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        Some(_) => return None,
        None => authority,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let valid = !host.is_empty()
        && host.len() <= MAX_HOST_LENGTH
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    valid.then(|| host.to_ascii_lowercase())
}

/// The hosts of `environments`, each to the one environment that holds it (of two that claim
/// one, the older, as the reconcile decides). Environments being deleted hold nothing: a
/// request must not wake what is going away.
pub fn holders<'a>(
    environments: impl IntoIterator<Item = &'a PreviewEnvironment>,
) -> HashMap<String, Holder> {
    let mut environments: Vec<&PreviewEnvironment> = environments.into_iter().collect();
    environments.sort_by(|a, b| a.age().cmp(&b.age()));
    let mut hosts = HashMap::new();
    for environment in environments {
        // A hub's record wakes through its hub (a push, `/preview wake`), not here.
        if environment.metadata.deletion_timestamp.is_some() || is_hub_record(environment) {
            continue;
        }
        let Some(status) = environment.status.as_ref() else {
            continue;
        };
        let Some(host) = status.host.as_deref().and_then(normalize) else {
            continue;
        };
        let namespace = environment.metadata.namespace.clone().unwrap_or_default();
        let holder = Holder {
            team: namespace.clone(),
            namespace,
            name: environment.metadata.name.clone().unwrap_or_default(),
            head: environment.spec.source.head_sha.clone(),
            resource_version: environment
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            asleep: environment.spec.sleep,
            generation: environment.metadata.generation.unwrap_or_default(),
            phase: status.phase,
            queue_position: status.queue_position,
            last_wake_seconds: status.last_wake_seconds,
        };
        // Two holders of one host cannot both deploy (the reconcile refuses the younger with
        // HostTaken, which may keep the host in its status); the older keeps it here too.
        hosts.entry(host).or_insert(holder);
    }
    hosts
}

struct Snapshot {
    built: Instant,
    hosts: HashMap<String, Holder>,
    /// Teams (namespaces) with a sleeping environment that holds a host: how many parts the
    /// wake budget in all is split into.
    teams_asleep: usize,
}

/// What the gate knows of a host: the environment that holds it, and how many teams have
/// sleeping environments now.
#[derive(Clone, Debug)]
pub struct Found {
    pub holder: Holder,
    pub teams_asleep: usize,
}

/// The teams of the sleeping holders among `hosts`.
fn teams_asleep(hosts: &HashMap<String, Holder>) -> usize {
    let asleep = hosts.values().filter(|holder| holder.asleep);
    let teams: std::collections::HashSet<&str> =
        asleep.map(|holder| holder.team.as_str()).collect();
    teams.len()
}

/// The gate's view of which environment holds which host.
pub struct HostIndex {
    environments: Store<PreviewEnvironment>,
    snapshot: RwLock<Arc<Snapshot>>,
    rebuilding: Mutex<()>,
}

impl HostIndex {
    pub fn new(environments: Store<PreviewEnvironment>) -> Self {
        let empty = Snapshot {
            built: Instant::now()
                .checked_sub(SNAPSHOT_MAX_AGE * 2)
                .unwrap_or_else(Instant::now),
            hosts: HashMap::new(),
            teams_asleep: 0,
        };
        Self {
            environments,
            snapshot: RwLock::new(Arc::new(empty)),
            rebuilding: Mutex::new(()),
        }
    }

    /// The environment that holds `host` (already [`normalize`]d), if any.
    pub fn holder(&self, host: &str) -> Option<Found> {
        let snapshot = self.fresh();
        let holder = snapshot.hosts.get(host)?.clone();
        Some(Found {
            holder,
            teams_asleep: snapshot.teams_asleep,
        })
    }

    /// The snapshot, rebuilt first if it is older than [`SNAPSHOT_MAX_AGE`]. One request
    /// rebuilds; the others meanwhile answer from the one before.
    fn fresh(&self) -> Arc<Snapshot> {
        let current = self.current();
        if current.built.elapsed() < SNAPSHOT_MAX_AGE {
            return current;
        }
        let Ok(_turn) = self.rebuilding.try_lock() else {
            return current;
        };
        // A hub's records wake through their hub (a push, `/preview wake`), not here.
        let environments = self.environments.state();
        let hosts = holders(
            environments
                .iter()
                .map(|e| &**e)
                .filter(|e| !is_hub_record(e)),
        );
        let rebuilt = Arc::new(Snapshot {
            built: Instant::now(),
            teams_asleep: teams_asleep(&hosts),
            hosts,
        });
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = rebuilt.clone();
        rebuilt
    }

    fn current(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{PreviewEnvironmentSpec, PreviewEnvironmentStatus};

    fn environment(name: &str, host: &str, sleep: bool) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new(name, PreviewEnvironmentSpec::default());
        environment.metadata.namespace = Some("previews".into());
        environment.spec.sleep = sleep;
        environment.status = Some(PreviewEnvironmentStatus {
            phase: Phase::Sleeping,
            host: Some(host.into()),
            ..Default::default()
        });
        environment
    }

    #[test]
    fn a_hubs_record_holds_no_host_here() {
        let mut record = environment("app-pr-1", "app-pr-1.preview.example.com", true);
        assert_eq!(
            holders([&record]).len(),
            1,
            "as an environment of its own, it holds one"
        );
        record.metadata.labels = Some(
            [(
                crate::model::metadata::LABEL_HUB_NAMESPACE.to_string(),
                "team-a".to_string(),
            )]
            .into(),
        );
        assert!(holders([&record]).is_empty());
    }

    #[test]
    fn hosts_are_compared_as_dns_names_and_anything_else_is_no_host() {
        assert_eq!(
            normalize("PR-2.Preview.Example.com"),
            Some("pr-2.preview.example.com".into())
        );
        assert_eq!(
            normalize("pr-2.preview.example.com:8080"),
            Some("pr-2.preview.example.com".into())
        );
        assert_eq!(
            normalize("pr-2.preview.example.com."),
            Some("pr-2.preview.example.com".into())
        );
        for not_a_host in [
            "",
            ":80",
            "[::1]:80",
            "a.example.com:http",
            "a b.example.com",
            "a.example.com/x",
            "<script>.example.com",
            &"a".repeat(254),
        ] {
            assert_eq!(normalize(not_a_host), None, "{not_a_host:?}");
        }
    }

    #[test]
    fn each_host_leads_to_the_environment_that_holds_it_and_no_other() {
        let asleep = environment("pr-2", "PR-2.preview.example.com", true);
        let awake = environment("pr-3", "pr-3.preview.example.com", false);
        let mut going = environment("pr-4", "pr-4.preview.example.com", true);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let mut never_deployed = environment("pr-5", "", true);
        never_deployed.status = None;
        let hosts = holders([&asleep, &awake, &going, &never_deployed]);
        assert_eq!(hosts.len(), 2, "{hosts:?}");
        let holder = &hosts["pr-2.preview.example.com"];
        assert_eq!((holder.name.as_str(), holder.asleep), ("pr-2", true));
        assert!(!hosts["pr-3.preview.example.com"].asleep);
        assert!(
            !hosts.contains_key("pr-4.preview.example.com"),
            "being deleted"
        );
    }
}
