//! Environments placed on registered clusters, with two real control planes: the shared one
//! (which is also the hub's) and a second sandbox of this test's own. A previewd runs on each
//! as the agent, watching only its records' namespace; the hub reaches each with a kubeconfig
//! that may touch nothing but previewd's records in that namespace.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use previewd::cluster::records::{Deleter, Records};
use previewd::cluster::writer::Writer;
use previewd::model::crd::{Phase, PreviewCluster, PreviewEnvironment, PreviewTemplate};
use previewd::reconcile::remote::{PlacementConfig, record_placement};
use serde_json::json;

use crate::support::clusters::{acting_as, records_access, register};
use crate::support::{self, eventually};

const WAIT: Duration = Duration::from_secs(90);

async fn create_environment(hub: &Client, ns: &str, number: u64) {
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": format!("app-pr-{number}")},
        "spec": {"template": "app", "source": {"repository": "Codertocat/Hello-World",
                 "branch": format!("change-{number}"), "pullRequest": number,
                 "headSha": format!("{number:040x}")}}
    }))
    .unwrap();
    Api::<PreviewEnvironment>::namespaced(hub.clone(), ns)
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
}

/// Waits until `check` holds for the hub's environment `name`; returns it.
async fn environment_when(
    environments: &Api<PreviewEnvironment>,
    name: &str,
    what: &str,
    check: impl Fn(&PreviewEnvironment) -> bool,
) -> PreviewEnvironment {
    eventually(what, WAIT, || async {
        environments
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(|e| check(e))
    })
    .await
}

fn placed_on(environment: &PreviewEnvironment) -> Option<&str> {
    previewd::reconcile::remote::placed_on(environment)
}

/// The record on a target that stands for the hub's environment `name`.
async fn record_of(records: &Api<PreviewEnvironment>, name: &str) -> Option<PreviewEnvironment> {
    let list = records.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .find(|r| r.labels().get("previewd.dev/hub-name").map(String::as_str) == Some(name))
}

fn ready_message(environment: &PreviewEnvironment) -> String {
    let status = environment.status.clone().unwrap_or_default();
    let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready");
    ready.map(|c| c.message).unwrap_or_default()
}

fn ready_on(environment: &PreviewEnvironment, cluster: &str) -> bool {
    let status = environment.status.clone().unwrap_or_default();
    status.phase == Phase::Ready
        && status
            .cluster
            .is_some_and(|c| c.name == cluster && c.reachable)
}

async fn cluster_reachable(hub: &Client, name: &str, reachable: bool) {
    let clusters: Api<PreviewCluster> = Api::all(hub.clone());
    eventually(
        &format!("cluster {name} reachable: {reachable}"),
        WAIT,
        || async {
            let cluster = clusters.get_opt(name).await.ok().flatten()?;
            (cluster.status?.reachable == reachable).then_some(())
        },
    )
    .await
}

#[tokio::test]
async fn environments_are_placed_by_room_kept_while_their_cluster_is_away_and_removed_where_they_run()
 {
    support::in_namespace("clusters-hub", |hub, ns| async move {
        // Cluster A: a namespace of the shared control plane; cluster B: a second one.
        let records_a = support::create_namespace(&hub, "clusters-records-a").await;
        let second = support::second();
        let remote = second.client().await;
        let records_b = support::create_namespace(&remote, "clusters-records-b").await;
        let user = format!("previewd-hub-{ns}");
        records_access(&hub, &records_a, &user).await;
        records_access(&remote, &records_b, &user).await;
        let (a, b) = (format!("{ns}-a"), format!("{ns}-b"));
        let shared_kubeconfig = &support::shared().kubeconfig_path;
        register(&hub, &ns, &a, acting_as(shared_kubeconfig, &user), &records_a, 1).await;
        register(&hub, &ns, &b, acting_as(&second.kubeconfig_path, &user), &records_b, 3).await;
        let template: PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": "app"},
            "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                     "placement": {"clusterSelector": {"previewd.dev/test": ns}},
                     "manifests": {"inline": [{"name": "app.yaml", "template":
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ sha }}\"\n"}]}}
        }))
        .unwrap();
        Api::<PreviewTemplate>::namespaced(hub.clone(), &ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();

        // The agents: previewd on each cluster, watching its records' namespace only.
        let _agent_a = support::start_controller(&hub, &records_a).await;
        let _agent_b = support::start_controller(&remote, &records_b).await;
        let config = previewd::reconcile::ControllerConfig {
            namespace: Some(ns.clone()),
            placement: PlacementConfig {
                credentials_namespace: Some(ns.clone()),
                look_interval: Duration::from_secs(1),
                // Long enough that a loaded machine's slow answer is not an absence.
                unreachable_grace: Duration::from_secs(8),
            },
            ..Default::default()
        };
        let running_hub = support::start_controller_with(&hub, config).await;
        let gauge = |name: &str, cluster: &str| {
            let series = format!("{name}{{cluster=\"{cluster}\"}}");
            support::webhooks::metric_value(&running_hub.metrics.render(), &series)
        };
        cluster_reachable(&hub, &a, true).await;
        cluster_reachable(&hub, &b, true).await;

        // By room: B (3) takes the first two, then A and B have one each: a tie goes by name.
        let environments: Api<PreviewEnvironment> = Api::namespaced(hub.clone(), &ns);
        let mut placements = Vec::new();
        for number in 1..=3 {
            create_environment(&hub, &ns, number).await;
            let name = format!("app-pr-{number}");
            let placed = environment_when(&environments, &name, "placed and Ready", |e| {
                placed_on(e).is_some_and(|cluster| ready_on(e, cluster))
            })
            .await;
            placements.push(placed_on(&placed).unwrap().to_string());
        }
        assert_eq!(placements, [b.clone(), b.clone(), a.clone()]);
        // Each ran where it was placed: the record there, deployed by that cluster's previewd.
        let on_b = Api::<PreviewEnvironment>::namespaced(remote.clone(), &records_b)
            .list(&Default::default())
            .await
            .unwrap();
        assert_eq!(on_b.items.len(), 2, "two records on B");
        for record in &on_b.items {
            let namespace = record.status.clone().unwrap().namespace.unwrap();
            let configmaps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
                remote.clone(),
                &namespace,
            );
            assert!(configmaps.get_opt("app").await.unwrap().is_some());
        }
        // At rest: the looks go on (one a second), and the hub writes nothing.
        let writes = || {
            let text = running_hub.metrics.render();
            text.lines()
                .filter(|l| l.starts_with("previewd_write_requests_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        // Settled first: the agents' last status writes (timings, observedGeneration) are
        // read back once; then nothing changes for 3 s running.
        let mut settled = writes();
        let mut still_since = std::time::Instant::now();
        while still_since.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = writes();
            if now != settled {
                (settled, still_since) = (now, std::time::Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(writes(), settled, "{}", running_hub.metrics.render());

        // A second placement of a placed environment (another replica, a stale copy) is a
        // conflict, not a second cluster.
        let writer = Writer::new(previewd::cluster::metrics::ClusterMetrics::default());
        let replaced = record_placement(&hub, &writer, &ns, "app-pr-1", "1", &a)
            .await
            .unwrap();
        assert!(!replaced);
        assert_eq!(placed_on(&environments.get("app-pr-1").await.unwrap()), Some(b.as_str()));
        let records = Records::new(&hub, &writer);

        // B taken away: its environments stay, say so, and the next one waits (A is full,
        // and B, with room, does not answer).
        second.kill_apiserver().await;
        cluster_reachable(&hub, &b, false).await;
        assert_eq!(gauge("previewd_cluster_reachable", &b), Some(0.0));
        assert_eq!(gauge("previewd_cluster_reachable", &a), Some(1.0));
        assert_eq!(gauge("previewd_cluster_environments", &b), Some(2.0));
        // Every per-cluster metric docs/operations.md promises is on the hub's /metrics.
        let operations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md");
        let documented =
            crate::webhooks::documented_metrics(&std::fs::read_to_string(operations).unwrap());
        let per_cluster: Vec<String> =
            documented.into_iter().filter(|n| n.starts_with("previewd_cluster_")).collect();
        assert_eq!(per_cluster.len(), 3, "{per_cluster:?}");
        for name in per_cluster {
            assert!(gauge(&name, &b).is_some(), "docs/operations.md promises {name}");
        }
        for name in ["app-pr-1", "app-pr-2"] {
            let kept = environment_when(&environments, name, "kept, its cluster silent", |e| {
                e.status
                    .as_ref()
                    .and_then(|s| s.cluster.as_ref())
                    .is_some_and(|c| !c.reachable && c.unreachable_since.is_some())
            })
            .await;
            assert!(kept.metadata.deletion_timestamp.is_none());
            assert_eq!(kept.status.unwrap().phase, Phase::Ready, "its last sight");
        }
        create_environment(&hub, &ns, 4).await;
        let waiting = environment_when(&environments, "app-pr-4", "queued", |e| {
            e.status.as_ref().is_some_and(|s| s.phase == Phase::Queued)
        })
        .await;
        assert_eq!(placed_on(&waiting), None);
        assert_eq!(waiting.status.unwrap().queue_position, Some(1));

        // Merged while B is away: the removal waits for B, and the hub keeps the record.
        records
            .delete_with_reason(&ns, "app-pr-2", "merged", Deleter::Intake)
            .await
            .unwrap();
        environment_when(&environments, "app-pr-2", "its removal waiting for B", |e| {
            ready_message(e).contains("Removal waits for cluster")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let waiting = environments.get_opt("app-pr-2").await.unwrap().expect("kept");
        assert!(ready_message(&waiting).contains("Removal waits for cluster"));

        // B back: the waiting one goes there (the one being removed still holds its place),
        // and the removal reaches B.
        second.start_apiserver().await;
        cluster_reachable(&hub, &b, true).await;
        assert_eq!(gauge("previewd_cluster_reachable", &b), Some(1.0));
        environment_when(&environments, "app-pr-4", "placed on B and Ready", |e| {
            placed_on(e) == Some(b.as_str()) && ready_on(e, &b)
        })
        .await;
        let on_b = Api::<PreviewEnvironment>::namespaced(remote.clone(), &records_b);
        eventually("app-pr-2 gone from the hub and from B", WAIT, || async {
            let hub_gone = environments.get_opt("app-pr-2").await.unwrap().is_none();
            (hub_gone && record_of(&on_b, "app-pr-2").await.is_none()).then_some(())
        })
        .await;

        // Merged: the removal reaches B before the hub's record goes. Its namespace on B is
        // held (a finalizer of the test's) so that the order shows.
        let removed = record_of(&on_b, "app-pr-1").await.expect("app-pr-1's record on B");
        let removed_namespace = removed.status.clone().unwrap().namespace.unwrap();
        let namespaces: Api<Namespace> = Api::all(remote.clone());
        let hold = json!({"metadata": {"finalizers": ["previewd.dev/test-hold"]}});
        namespaces
            .patch(&removed_namespace, &PatchParams::default(), &Patch::Merge(&hold))
            .await
            .unwrap();
        records
            .delete_with_reason(&ns, "app-pr-1", "merged", Deleter::Intake)
            .await
            .unwrap();
        environment_when(&environments, "app-pr-1", "being removed on B", |e| {
            ready_message(e).contains("Being removed on cluster")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            environments.get_opt("app-pr-1").await.unwrap().is_some(),
            "the hub keeps its record while B's namespace is still there"
        );
        let release = json!({"metadata": {"finalizers": null}});
        namespaces
            .patch(&removed_namespace, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .unwrap();
        eventually("the hub's record gone", WAIT, || async {
            environments.get_opt("app-pr-1").await.unwrap().is_none().then_some(())
        })
        .await;
        assert!(record_of(&on_b, "app-pr-1").await.is_none());
        assert!(namespaces.get_opt(&removed_namespace).await.unwrap().is_none());

        for cluster in [&a, &b] {
            let _ = Api::<PreviewCluster>::all(hub.clone())
                .delete(cluster, &DeleteParams::default())
                .await;
        }
    })
    .await;
}
