//! What a pull request adds may not hold cluster resources past its environment (issue 53 §2),
//! against the real API server: a finalizer nothing removes, a disruption budget over a Job's
//! pods, a grace period of 68 years, an autoscaler annotation that pins a node, a probe the
//! kubelet would send from the node's network, and a pod that asks for more of the node's disk
//! than the default quota holds. Each is refused and nothing is applied (the quota: by the API
//! server, through the guard rail previewd creates); on the code before, each deployed.

use crate::support;

use std::time::Duration;

use kube::api::Api;
use previewd::model::crd::PreviewEnvironment;
use serde_json::json;
use support::{in_namespace, ready_reason};

use super::content_policy::{assert_refused_naming, deploy, refused_naming_in};

#[tokio::test]
async fn a_finalizer_on_any_object_or_pod_template_is_refused() {
    const HELD: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, finalizers: [example.com/never]}\ndata: {a: b}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}, finalizers: [example.com/never]}\n    spec: {containers: [{name: web, image: nginx}]}\n";
    refused_naming_in(
        "holding-finalizers",
        HELD,
        &[
            "ConfigMap/held (from app.yaml): metadata.finalizers holds [\"example.com/never\"]",
            "Deployment/web (from app.yaml): spec.template.metadata.finalizers holds",
        ],
    )
    .await;
}

/// An owner reference a pull request declares: to a Node with `blockOwnerDeletion` (holding
/// the node's foreground deletion), or to an owner that is not there (the garbage collector
/// deletes the ConfigMap, previewd applies it again, without end). On the code before, both
/// were applied.
#[tokio::test]
async fn an_owner_reference_a_pull_request_declares_is_refused() {
    const OWNED: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  ownerReferences: [{apiVersion: v1, kind: Node, name: node-1, uid: 6b7c1f0e-0000-4000-8000-000000000001, blockOwnerDeletion: true}]\ndata: {a: b}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: orphan\n  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: gone, uid: 6b7c1f0e-0000-4000-8000-000000000002}]\ndata: {a: b}\n";
    refused_naming_in(
        "holding-owners",
        OWNED,
        &[
            "ConfigMap/owned (from app.yaml): metadata.ownerReferences names",
            "ConfigMap/orphan (from app.yaml): metadata.ownerReferences names",
            "leave owner references to the controllers that set them",
        ],
    )
    .await;
}

/// A claim on a storage class that keeps its volumes (`reclaimPolicy: Retain`) would leave a
/// volume behind every environment removed: refused, naming the claim and the class, nothing
/// applied. A claim on a class that deletes its volumes deploys. On the code before, both
/// were applied. (Neither class is the cluster's default: other tests' claims must not see it.)
#[tokio::test]
async fn a_claim_on_a_class_that_keeps_its_volumes_is_refused() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::{DeleteParams, PostParams};
    in_namespace("holding-retained", |client, ns| async move {
        let classes: Api<StorageClass> = Api::all(client.clone());
        let (kept, deleted) = (format!("kept-{ns}"), format!("deleted-{ns}"));
        for (name, policy) in [(&kept, "Retain"), (&deleted, "Delete")] {
            let class: StorageClass = serde_json::from_value(json!({
                "metadata": {"name": name}, "provisioner": "example.com/disk", "reclaimPolicy": policy
            }))
            .unwrap();
            classes.create(&PostParams::default(), &class).await.unwrap();
        }
        let claim = |class: &str| format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: data}}\nspec: {{storageClassName: {class}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n");
        {
            let _running = deploy(&client, &ns, &claim(&kept), json!({})).await;
            let said = format!("PersistentVolumeClaim/data (from app.yaml): spec.storageClassName \"{kept}\" keeps its volumes after their claims are gone");
            assert_refused_naming(&client, &ns, &[&said, "--allow-retained-volumes"]).await;
        }
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.delete("pr-7", &DeleteParams::default()).await.unwrap();
        support::eventually("pr-7 gone", Duration::from_secs(30), || async {
            environments.get_opt("pr-7").await.unwrap().is_none().then_some(())
        })
        .await;
        Api::<previewd::model::crd::PreviewTemplate>::namespaced(client.clone(), &ns)
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        let _running = deploy(&client, &ns, &claim(&deleted), json!({})).await;
        let applied = support::eventually("the claim applied", Duration::from_secs(60), || async {
            let target = environments.get("pr-7").await.ok()?.status?.namespace?;
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), &target).get_opt("data").await.ok()?
        })
        .await;
        assert_eq!(applied.spec.unwrap().storage_class_name.as_deref(), Some(deleted.as_str()));
        for name in [&kept, &deleted] {
            classes.delete(name, &DeleteParams::default()).await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn a_disruption_budget_over_a_jobs_pods_is_refused() {
    const BUDGET: &str = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: migrate}\nspec:\n  template:\n    metadata: {labels: {app: migrate}}\n    spec: {restartPolicy: Never, containers: [{name: m, image: busybox}]}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: migrate}\nspec:\n  maxUnavailable: 1\n  selector: {matchLabels: {app: migrate}}\n";
    refused_naming_in("holding-budget", BUDGET, &["PodDisruptionBudget/migrate (from app.yaml): spec.selector may match the pods of Job \"migrate\"",
            "stalls every node drain"]).await;
}

#[tokio::test]
async fn a_grace_period_beyond_the_operators_cap_is_refused() {
    const LONG: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {terminationGracePeriodSeconds: 2147483647, containers: [{name: web, image: nginx}]}\n";
    refused_naming_in(
        "holding-grace",
        LONG,
        &[
            "spec.template.spec.terminationGracePeriodSeconds is 2147483647",
            "at most 300 (--max-termination-grace-period)",
        ],
    )
    .await;
}

#[tokio::test]
async fn an_autoscaler_annotation_that_pins_a_node_is_refused() {
    const PINNED: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}, annotations: {cluster-autoscaler.kubernetes.io/safe-to-evict: \"false\"}}\n    spec: {containers: [{name: web, image: nginx}]}\n";
    refused_naming_in(
        "holding-evict",
        PINNED,
        &["has \"cluster-autoscaler.kubernetes.io/safe-to-evict\", which configures a controller"],
    )
    .await;
}

#[tokio::test]
async fn a_probe_sent_from_the_nodes_network_is_refused() {
    const PROBE: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: web\n        image: nginx\n        livenessProbe: {httpGet: {host: 169.254.169.254, path: /latest/meta-data, port: 80}}\n        lifecycle: {preStop: {tcpSocket: {host: 10.0.0.1, port: 6443}}}\n";
    refused_naming_in(
        "holding-probe",
        PROBE,
        &[
            "spec.template.spec.containers[0].livenessProbe.httpGet.host is set",
            "spec.template.spec.containers[0].lifecycle.preStop.tcpSocket.host is set",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_default_quota_bounds_the_nodes_disk_a_preview_may_take() {
    const DISK: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: disk}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources: {requests: {ephemeral-storage: 1Gi}, limits: {ephemeral-storage: 1Ti}}\n";
    in_namespace("holding-disk", |client, ns| async move {
        let _running = deploy(&client, &ns, DISK, json!({})).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let said = ready_reason(
            &environments,
            "pr-7",
            "ApplyRefused",
            Duration::from_secs(60),
        )
        .await;
        assert!(
            said.contains("exceeded quota") && said.contains("limits.ephemeral-storage"),
            "{said}"
        );
    })
    .await;
}

/// What the quota does not count is bounded too: ServiceAccounts (no quota of the default
/// counts them), each with 200 KB of annotations, 9 MB in all, are refused by the default
/// `--max-bytes-per-environment` (8 MiB), with nothing applied. On the code before, all 45
/// were created.
#[tokio::test]
async fn objects_the_quota_does_not_count_are_bounded_by_bytes() {
    in_namespace("holding-bytes", |client, ns| async move {
        let _running = support::start_controller_with(
            &client,
            previewd::reconcile::ControllerConfig {
                namespace: Some(ns.clone()),
                ..Default::default()
            },
        )
        .await;
        // Three manifests of 15 each: every manifest stays within the 4 MiB render limit.
        let manifest = |part: usize| {
            json!({"name": format!("accounts-{part}.yaml"), "template": format!(
                "{{% for i in range(15) %}}---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa-{part}-{{{{ i }}}}\n  annotations:\n    note: \"{{{{ 'x' * 200000 }}}}\"\n{{% endfor %}}"
            )})
        };
        let template: previewd::model::crd::PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "app"},
            "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                     "url": {"host": "{{ slug }}.bytes.example.com"},
                     "manifests": {"inline": [manifest(0), manifest(1), manifest(2)]}}
        }))
        .unwrap();
        Api::<previewd::model::crd::PreviewTemplate>::namespaced(client.clone(), &ns)
            .create(&Default::default(), &template)
            .await
            .unwrap();
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": "pr-7"},
            "spec": {"template": "app", "source": {"repository": "Codertocat/Hello-World",
                     "branch": "evil", "pullRequest": 7, "headSha": "abc1234"}}
        }))
        .unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&Default::default(), &environment).await.unwrap();
        let said =
            ready_reason(&environments, "pr-7", "TooManyObjects", Duration::from_secs(60)).await;
        assert!(
            said.contains("more than the limit of 8388608 per environment (--max-bytes-per-environment)"),
            "{said}"
        );
        let selector =
            format!("previewd.dev/environment=pr-7,previewd.dev/environment-namespace={ns}");
        let created = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap();
        assert!(created.items.is_empty(), "nothing applied, not even the namespace");
    })
    .await;
}

/// Removal never waits silently: a namespace something holds (here a finalizer added by hand,
/// which no controller removes) is said on the environment (`NamespaceHeld`, with what the
/// namespace's own conditions name), once in `previewd_namespace_holds_total`, and the record
/// goes once the namespace does. On the code before, the environment said `Deleting` forever.
#[tokio::test]
async fn a_namespace_held_past_the_grace_period_is_said_and_counted() {
    const APP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {a: b}\n";
    in_namespace("holding-removal", |client, ns| async move {
        let config = previewd::reconcile::ControllerConfig {
            namespace: Some(ns.clone()),
            namespace_hold_grace: Duration::from_secs(1),
            ..Default::default()
        };
        let running = support::start_controller_with(&client, config).await;
        super::content_policy::create_template_and_environment(&client, &ns, APP, json!({})).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let ready = support::wait_for_phase(
            &environments,
            "pr-7",
            previewd::model::crd::Phase::Ready,
            Duration::from_secs(60),
        )
        .await;
        let target = ready.status.unwrap().namespace.unwrap();
        let held = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "held", "finalizers": ["example.com/never"]}});
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &target);
        maps.create(&Default::default(), &serde_json::from_value(held).unwrap())
            .await
            .unwrap();
        environments
            .delete("pr-7", &Default::default())
            .await
            .unwrap();
        // First what previewd sees (the namespace's conditions may name nothing yet), then
        // what Kubernetes' namespace controller names.
        let said = support::eventually("the finalizer named", Duration::from_secs(90), || async {
            let message = ready_reason(
                &environments,
                "pr-7",
                "NamespaceHeld",
                Duration::from_secs(90),
            )
            .await;
            message.contains("example.com/never").then_some(message)
        })
        .await;
        assert!(said.contains(&target), "{said}");
        assert_eq!(running.metrics.reconcile.namespace_holds.get(), 1);
        let release = json!({"metadata": {"finalizers": null}});
        maps.patch(
            "held",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&release),
        )
        .await
        .unwrap();
        support::eventually(
            "the record goes with its namespace",
            Duration::from_secs(90),
            || async {
                environments
                    .get_opt("pr-7")
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            },
        )
        .await;
        assert_eq!(
            running.metrics.reconcile.namespace_holds.get(),
            1,
            "said once"
        );
    })
    .await;
}
