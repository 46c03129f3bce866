//! The hub's look at each registered cluster, every `look_interval`: connect (again, when its
//! kubeconfig Secret changed: a rotated credential is used from the next look), ask its API
//! server one small list of previewd's records, and write what was seen into the cluster's
//! status, only when that changes.
//!
//! Unreachable means unknown: a cluster that stops answering is said unreachable only after
//! `unreachable_grace`, and then only gets no new environments. Its environments are never
//! removed for it; they keep their last seen status, and say that their cluster does not
//! answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use sha2::{Digest, Sha256};

use super::hub::{Hub, Target};
use crate::cluster::secrets::SecretReader;
use crate::cluster::target_client::target_client;
use crate::model::crd::{PreviewCluster, PreviewClusterStatus, PreviewEnvironment};
use crate::reconcile::context::Context;

/// How long one look may wait for a cluster's answer.
const LOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// Looks at every registered cluster, for as long as it is polled; when placement is off,
/// never does anything (and never ends, like the looks).
pub async fn look_after_clusters(context: Arc<Context>) {
    let Some(credentials) = context.hub.config.credentials_namespace.clone() else {
        return std::future::pending().await;
    };
    let secrets = SecretReader::for_cluster_credentials(context.client.clone());
    let mut memory = Looked::default();
    loop {
        look_at_all(&context, &secrets, &credentials, &mut memory).await;
        tokio::time::sleep(context.hub.config.look_interval).await;
    }
}

/// What the looks remember between rounds: since when each failing cluster has failed, and
/// which clusters have metric series.
#[derive(Default)]
struct Looked {
    failing_since: HashMap<String, DateTime<Utc>>,
    with_series: Vec<String>,
}

/// One round: every registered cluster looked at, its status and gauges set; connections and
/// series of clusters no longer registered dropped.
async fn look_at_all(
    context: &Context,
    secrets: &SecretReader,
    credentials: &str,
    memory: &mut Looked,
) {
    let clusters = context.hub.clusters.state();
    let names: Vec<String> = clusters.iter().map(|c| c.name_any()).collect();
    context.hub.drop_targets_except(&names);
    memory.failing_since.retain(|name, _| names.contains(name));
    for gone in memory.with_series.iter().filter(|n| !names.contains(n)) {
        context.metrics.forget_cluster(gone);
    }
    memory.with_series = names;
    for cluster in clusters {
        let look = look_at(&cluster, &context.hub, secrets, credentials).await;
        let name = cluster.name_any();
        let since = match &look {
            Ok(()) => {
                memory.failing_since.remove(&name);
                None
            }
            Err(_) => Some(
                *memory
                    .failing_since
                    .entry(name.clone())
                    .or_insert_with(Utc::now),
            ),
        };
        let placed = placed_on(context, &name);
        let grace = context.hub.config.unreachable_grace;
        let previous = cluster.status.as_ref();
        let seen = next_status(previous, &look, placed, since, grace, Utc::now());
        let capacity = cluster.spec.capacity;
        context
            .metrics
            .see_cluster(&name, seen.reachable, placed, capacity);
        say(context, &cluster, seen).await;
    }
}

/// Connects to `cluster` (again, if its kubeconfig changed) and asks for one record.
async fn look_at(
    cluster: &PreviewCluster,
    hub: &Hub,
    secrets: &SecretReader,
    credentials_namespace: &str,
) -> Result<(), String> {
    let reference = &cluster.spec.kubeconfig_secret_ref;
    let kubeconfig = secrets
        .get(credentials_namespace, reference)
        .await
        .map_err(|e| e.to_string())?;
    let kubeconfig = String::from_utf8(kubeconfig)
        .map_err(|_| format!("Secret {}: the kubeconfig is not UTF-8", reference.name))?;
    let built_from = hex::encode(Sha256::digest(
        format!("{}\n{kubeconfig}", cluster.spec.namespace).as_bytes(),
    ));
    let name = cluster.name_any();
    let target = match hub.target(&name) {
        Some(target) if target.built_from == built_from => target,
        _ => {
            let client = target_client(&kubeconfig).await?;
            let namespace = &cluster.spec.namespace;
            let target = Arc::new(Target::start(
                client,
                namespace,
                built_from,
                hub.trigger.clone(),
            ));
            hub.keep_target(&name, target.clone());
            target
        }
    };
    let records: Api<PreviewEnvironment> =
        Api::namespaced(target.client.clone(), &target.namespace);
    match tokio::time::timeout(
        LOOK_TIMEOUT,
        records.list_metadata(&ListParams::default().limit(1)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(crate::cluster::errors::in_words(&e)),
        Err(_) => Err(format!("no answer within {LOOK_TIMEOUT:?}")),
    }
}

/// Environments placed on cluster `name`, as the hub's cache shows them.
fn placed_on(context: &Context, name: &str) -> u32 {
    let placed = context
        .caches
        .environments
        .state()
        .iter()
        .filter(|e| super::placed_on(e) == Some(name))
        .count();
    u32::try_from(placed).unwrap_or(u32::MAX)
}

/// The cluster's status after a look. A cluster that answered before is said unreachable only
/// once it has failed for `grace` (`failing_since` is its first failure in a row); one never
/// seen answering is unreachable from its first failure.
pub fn next_status(
    previous: Option<&PreviewClusterStatus>,
    look: &Result<(), String>,
    placed: u32,
    failing_since: Option<DateTime<Utc>>,
    grace: Duration,
    now: DateTime<Utc>,
) -> PreviewClusterStatus {
    let was_reachable = previous.is_some_and(|p| p.reachable);
    let kept_since = previous.and_then(|p| p.since);
    let (reachable, since, message) = match (look, failing_since) {
        (Ok(()), _) => (
            true,
            if was_reachable { kept_since } else { Some(now) },
            None,
        ),
        (Err(error), Some(first)) => {
            let failed_for = (now - first).to_std().unwrap_or_default();
            let said = previous.and_then(|p| p.message.clone());
            if was_reachable && failed_for < grace {
                (true, kept_since, said)
            } else if previous.is_some_and(|p| !p.reachable && p.since.is_some()) {
                // Said unreachable already: the first words stay (an error's text may change
                // from one look to the next, and each change would be a write).
                (false, kept_since, said.or_else(|| Some(error.clone())))
            } else {
                (false, Some(first), Some(error.clone()))
            }
        }
        (Err(error), None) => (false, Some(now), Some(error.clone())),
    };
    PreviewClusterStatus {
        reachable,
        since,
        message,
        environments: placed,
    }
}

/// Writes `seen` as the cluster's status if it differs; when its reachability changed, the
/// environments placed on it are reconciled (their status and comment say it).
async fn say(context: &Context, cluster: &PreviewCluster, seen: PreviewClusterStatus) {
    if cluster.status.as_ref() == Some(&seen) {
        return;
    }
    let name = cluster.name_any();
    let was_reachable = cluster.status.as_ref().is_some_and(|s| s.reachable);
    if was_reachable != seen.reachable {
        tracing::info!(cluster = %name, reachable = seen.reachable, message = ?seen.message, "a registered cluster's reachability changed");
    }
    let api: Api<PreviewCluster> = Api::all(context.client.clone());
    let body = serde_json::json!({"status": seen});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
    let write = api.patch_status(&name, &params, &patch);
    if let Err(e) = context.writer.write("cluster_status", write).await {
        tracing::warn!(cluster = %name, error = %e, "could not write a registered cluster's status; the next look tries again");
        return;
    }
    if was_reachable != seen.reachable {
        for environment in context.caches.environments.state() {
            if super::placed_on(&environment) == Some(name.as_str()) {
                let _ = context.hub.trigger.send(ObjectRef::from_obj(&*environment));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn a_cluster_that_answered_is_unreachable_only_after_the_grace() {
        let answering = next_status(None, &Ok(()), 3, None, GRACE, at(0));
        assert!(answering.reachable);
        assert_eq!(answering.since, Some(at(0)));
        let failed: Result<(), String> = Err("connection refused".into());
        let within = next_status(Some(&answering), &failed, 3, Some(at(10)), GRACE, at(30));
        assert_eq!(within, answering, "20 s of failures change nothing");
        let beyond = next_status(Some(&within), &failed, 3, Some(at(10)), GRACE, at(40));
        assert!(!beyond.reachable);
        assert_eq!(beyond.since, Some(at(10)));
        assert_eq!(beyond.message.as_deref(), Some("connection refused"));
        // Still failing, in other words: nothing new to write.
        let other: Result<(), String> = Err("i/o timeout".into());
        let later = next_status(Some(&beyond), &other, 3, Some(at(10)), GRACE, at(45));
        assert_eq!(later, beyond);
        let back = next_status(Some(&beyond), &Ok(()), 3, None, GRACE, at(50));
        assert!(back.reachable);
        assert_eq!(back.since, Some(at(50)));
        assert_eq!(back.message, None);
        // At rest: the same look again writes nothing new.
        assert_eq!(
            next_status(Some(&back), &Ok(()), 3, None, GRACE, at(60)),
            back
        );
    }

    #[test]
    fn a_cluster_never_seen_answering_is_unreachable_at_once() {
        let failed: Result<(), String> = Err("Secret previewd/eu: not found".into());
        let status = next_status(None, &failed, 0, Some(at(0)), GRACE, at(0));
        assert!(!status.reachable);
    }
}
