//! Leader election through a `coordination.k8s.io/v1` Lease, the same protocol client-go's
//! leader election uses, so `kubectl get lease` reads the way platform engineers expect.
//!
//! * A candidate tries to take the Lease every `retry_period`: when there is none, when it is
//!   released (no holder), or when its record has not changed for `lease_duration` as measured
//!   on this replica's own clock (no trust in the other replica's clock).
//! * The leader renews every `retry_period`. It steps down when the Lease was taken by someone
//!   else, or when it could not renew for `renew_deadline` (shorter than `lease_duration`, so
//!   it stops working before anyone else may start).
//! * On shutdown the leader releases the Lease (no holder, 1 s duration) so that a standby
//!   takes over at its next try instead of waiting out the lease.
//!
//! Every write is a `replace` carrying the `resourceVersion` that was read: two candidates
//! racing for an expired Lease cannot both win, the loser gets 409 Conflict.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::runtime::metrics::Metrics;

/// Where the Lease lives and how it is timed.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// Who this replica is, as written into `spec.holderIdentity`.
    pub identity: String,
    /// How long a Lease that nobody renews keeps others out.
    pub lease_duration: Duration,
    /// How long the leader keeps working without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews and a candidate tries.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// client-go's proportions (15 s / 10 s / 2 s), scaled from the lease duration.
    pub fn with_duration(
        namespace: String,
        name: String,
        identity: String,
        lease_duration: Duration,
    ) -> Self {
        Self {
            namespace,
            name,
            identity,
            lease_duration,
            renew_deadline: lease_duration.mul_f64(2.0 / 3.0),
            retry_period: (lease_duration / 7).max(Duration::from_millis(200)),
        }
    }
}

/// This replica's identity: the host name (the pod name in a cluster) and a random suffix, so
/// that a restarted pod with the same name is not mistaken for its predecessor.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "previewd".into());
    let mut suffix = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut suffix));
    format!("{host}_{}", hex::encode(suffix))
}

/// What one attempt on the Lease came to.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease (it took or renewed it).
    Holding,
    /// Someone else holds it and it has not expired.
    HeldByOther(String),
}

/// The Lease record last seen, and when this replica first saw it (its own clock).
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    seen_at: Instant,
}

pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<Observed>,
}

impl LeaderElector {
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
        }
    }

    /// Takes the Lease if it is free or expired, renews it if this replica holds it.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let seconds = self.settings.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.settings.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Holding),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Ok(Attempt::HeldByOther("(created concurrently)".into()))
                }
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
        if changed {
            self.observed = Some(Observed {
                holder: holder.clone(),
                renew_time: spec.renew_time.clone(),
                seen_at: Instant::now(),
            });
        }
        let held_by_me = holder.as_deref() == Some(self.settings.identity.as_str());
        if let Some(other) = &holder
            && !held_by_me
        {
            let their_duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(seconds).max(1) as u64);
            let seen_at = self
                .observed
                .as_ref()
                .map(|o| o.seen_at)
                .unwrap_or_else(Instant::now);
            if seen_at.elapsed() < their_duration {
                return Ok(Attempt::HeldByOther(other.clone()));
            }
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(self.settings.identity.clone());
        new_spec.lease_duration_seconds = Some(seconds);
        new_spec.renew_time = Some(now.clone());
        if !held_by_me {
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        // `replace` sends the resourceVersion we read: a concurrent change makes this a 409.
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Holding),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::HeldByOther(
                holder.unwrap_or_else(|| "(taken concurrently)".into()),
            )),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this replica holds it: no holder and a 1 s duration, so a standby
    /// takes over at its next try.
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        lease.spec = Some(spec);
        self.api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    /// Runs `work` whenever this replica leads, until `shutdown` turns true. `work` is started
    /// afresh at each term and dropped (cancelled) when the term ends; on shutdown the Lease is
    /// released. If `work` ends by itself while leading (a panic, or the controller's stream
    /// ending), this replica must not go on holding the Lease with nobody reconciling: it
    /// releases the Lease and returns the reason, for the process to stop.
    pub async fn run<W, F>(
        mut self,
        metrics: Arc<Metrics>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        work: W,
    ) -> Result<(), WorkStopped>
    where
        W: Fn() -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let retry = self.settings.retry_period;
        let mut last_holder: Option<String> = None;
        loop {
            // Candidate: try until the Lease is ours.
            loop {
                if *shutdown.borrow() {
                    return Ok(());
                }
                match self.try_acquire_or_renew().await {
                    Ok(Attempt::Holding) => break,
                    Ok(Attempt::HeldByOther(holder)) => {
                        if last_holder.as_ref() != Some(&holder) {
                            tracing::info!(leader = %holder, "standing by: another replica leads");
                            last_holder = Some(holder);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the leader Lease failed; retrying")
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = shutdown.changed() => {}
                }
            }
            last_holder = None;
            tracing::info!(identity = %self.settings.identity, lease = %self.settings.name, "leading: reconciling and sweeping");
            metrics.leader.set(1);
            let mut term = tokio::spawn(work());
            let outcome = self.lead(&mut shutdown, &mut term).await;
            // A handle whose task ended was consumed by `lead`; polling it again would panic.
            if !matches!(outcome, TermEnd::WorkStopped(_)) {
                term.abort();
                let _ = term.await;
            }
            metrics.leader.set(0);
            if outcome == TermEnd::LostLease {
                continue;
            }
            match self.release().await {
                Ok(()) => tracing::info!("released the leader Lease"),
                Err(e) => {
                    tracing::warn!(error = %e, "releasing the leader Lease failed; it expires on its own")
                }
            }
            return match outcome {
                TermEnd::WorkStopped(why) => Err(WorkStopped(why)),
                _ => Ok(()),
            };
        }
    }

    /// Renews while leading, until shutdown, a lost Lease, or the term's work ending.
    async fn lead(
        &mut self,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
        term: &mut tokio::task::JoinHandle<()>,
    ) -> TermEnd {
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.settings.retry_period) => {}
                _ = shutdown.changed() => {}
                ended = &mut *term => return TermEnd::WorkStopped(work_stopped(ended)),
            }
            if *shutdown.borrow() {
                return TermEnd::Shutdown;
            }
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Holding) => last_renewal = Instant::now(),
                Ok(Attempt::HeldByOther(holder)) => {
                    tracing::warn!(leader = %holder, "lost the leader Lease; stopping reconciles");
                    return TermEnd::LostLease;
                }
                Err(e) if last_renewal.elapsed() < self.settings.renew_deadline => {
                    tracing::warn!(error = %e, "renewing the leader Lease failed; retrying");
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not renew the leader Lease within the renew deadline; stopping reconciles");
                    return TermEnd::LostLease;
                }
            }
        }
    }
}

/// How a term as leader ended.
#[derive(Debug, PartialEq, Eq)]
enum TermEnd {
    Shutdown,
    LostLease,
    WorkStopped(String),
}

/// The leader's work (reconciling and sweeping) ended by itself: the process must stop.
#[derive(Debug, thiserror::Error)]
#[error("the controller stopped: {0}")]
pub struct WorkStopped(pub String);

/// Says how a work task ended (it never ends on its own when all is well).
pub fn work_stopped(ended: Result<(), tokio::task::JoinError>) -> String {
    let why = match ended {
        Ok(()) => "its loop ended".to_string(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            format!("it panicked: {message}")
        }
        Err(e) => format!("its task failed: {e}"),
    };
    tracing::error!("the controller stopped ({why}); giving up leadership and stopping");
    why
}
