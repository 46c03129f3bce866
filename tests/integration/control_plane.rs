//! The foundation, tested against a real kube-apiserver: previewd's CRDs, the released
//! Online Boutique (gRPC probes, ports without a protocol), Jobs through the node simulator, namespace deletion, and load.

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate};
use previewd::sandbox::node_simulator::ANNOTATION_FAIL;
use serde_json::json;
use support::{eventually, in_namespace};

fn environment(name: &str) -> PreviewEnvironment {
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1",
        "kind": "PreviewEnvironment",
        "metadata": {"name": name},
        "spec": {
            "template": "hello-world",
            "source": {"repository": "Codertocat/Hello-World", "branch": "changes", "pullRequest": 2,
                       "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821", "author": "Codertocat"}
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn crds_install_and_an_environment_round_trips_with_its_status() {
    in_namespace("crd-round-trip", |client, ns| async move {
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let template: PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": "hello-world"},
            "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                     "manifests": {"inline": [{"name": "cm.yaml", "template": "kind: ConfigMap"}]},
                     "values": {"replicas": 2, "nested": {"any": ["shape"]}}}
        }))
        .unwrap();
        let created = templates
            .create(&PostParams::default(), &template)
            .await
            .expect("create template");
        assert_eq!(
            created.spec.values["nested"],
            json!({"any": ["shape"]}),
            "free-form values survive"
        );
        assert!(
            created.spec.triggers.pull_requests,
            "defaults come from the schema"
        );

        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let created = environments
            .create(&PostParams::default(), &environment("hello-pr-2"))
            .await
            .unwrap();
        assert_eq!(created.spec.source.pull_request, Some(2));
        assert!(created.status.is_none());

        let status = PreviewEnvironmentStatus {
            phase: Phase::Ready,
            namespace: Some("preview-hello-pr-2".into()),
            url: Some("https://pr-2.preview.example.com".into()),
            deployed_sha: Some(created.spec.source.head_sha.clone()),
            observed_generation: created.metadata.generation,
            ..Default::default()
        };
        let patched = environments
            .patch_status(
                "hello-pr-2",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("status subresource accepts the status");
        assert_eq!(patched.status.as_ref().unwrap().phase, Phase::Ready);

        // The status subresource is separate: a spec write leaves the status alone, and a
        // status write left the spec alone.
        let spec_patch = json!({"spec": {"sleep": true}, "status": {"phase": "Degraded"}});
        let after = environments
            .patch(
                "hello-pr-2",
                &PatchParams::default(),
                &Patch::Merge(spec_patch),
            )
            .await
            .unwrap();
        assert!(after.spec.sleep);
        assert_eq!(
            after.status.unwrap().phase,
            Phase::Ready,
            "status is only written through /status"
        );

        let read = environments.get("hello-pr-2").await.unwrap();
        assert_eq!(
            read.status.unwrap().url.as_deref(),
            Some("https://pr-2.preview.example.com")
        );

        // kubectl shows the printer columns and the short name works.
        let output = std::process::Command::new(support::tools::kubectl())
            .env("KUBECONFIG", &support::shared().kubeconfig_path)
            .args(["get", "penv", "-n", &ns])
            .output()
            .expect("run kubectl");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "kubectl failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let header: Vec<&str> = text
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header,
            ["NAME", "BRANCH", "PR", "PHASE", "URL", "AGE"],
            "kubectl printed:\n{text}"
        );
        let row: Vec<&str> = text
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            &row[..5],
            [
                "hello-pr-2",
                "changes",
                "2",
                "Ready",
                "https://pr-2.preview.example.com"
            ]
        );
    })
    .await;
}

/// The Online Boutique fixture, as released: current Kubernetes takes it unchanged.
fn online_boutique() -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(support::fixture("apps/online-boutique.yaml")).expect("fixture");
    let objects = support::yaml_documents(&text);
    assert!(
        text.contains("grpc:"),
        "the fixture uses gRPC probes, which Kubernetes serves since 1.24"
    );
    objects
}

#[tokio::test]
async fn online_boutique_applies_and_all_twelve_deployments_become_available() {
    in_namespace("online-boutique", |client, ns| async move {
        let objects = online_boutique();
        assert_eq!(objects.len(), 35);
        let started = Instant::now();
        support::apply_all(&client, &ns, &objects).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let available = eventually("12 Deployments Available", Duration::from_secs(60), || {
            let deployments = deployments.clone();
            async move {
                let list = deployments.list(&ListParams::default()).await.ok()?;
                let available = list
                    .items
                    .iter()
                    .filter(|d| condition_true(d, "Available"))
                    .count();
                (list.items.len() == 12 && available == 12).then_some(available)
            }
        })
        .await;
        eprintln!(
            "online boutique: {available} Deployments Available {:.1} s after the first apply",
            started.elapsed().as_secs_f64()
        );
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        assert_eq!(
            services
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            12
        );
    })
    .await;
}

fn condition_true(deployment: &Deployment, type_: &str) -> bool {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn job(name: &str, fail: bool) -> serde_json::Value {
    let annotations = if fail {
        json!({ ANNOTATION_FAIL: "true" })
    } else {
        json!({})
    };
    json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "seed", "image": "postgres:16", "command": ["psql", "-f", "/seed.sql"]}]}
            }
        }
    })
}

fn job_condition(job: &Job) -> Option<(String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn a_job_completes_and_a_job_asking_to_fail_ends_failed() {
    in_namespace("jobs", |client, ns| async move {
        support::apply_all(
            &client,
            &ns,
            &[job("seed-ok", false), job("seed-broken", true)],
        )
        .await;
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        for (name, expected) in [("seed-ok", "Complete"), ("seed-broken", "Failed")] {
            let (outcome, reason) = eventually(
                &format!("Job {name} to finish"),
                Duration::from_secs(60),
                || {
                    let jobs = jobs.clone();
                    async move { jobs.get(name).await.ok().as_ref().and_then(job_condition) }
                },
            )
            .await;
            assert_eq!(outcome, expected, "{name} ended {outcome} ({reason})");
        }
        let broken = jobs.get("seed-broken").await.unwrap();
        assert_eq!(broken.status.unwrap().failed, Some(1));
    })
    .await;
}

#[tokio::test]
async fn deleting_a_namespace_removes_everything_in_it() {
    let client = support::client().await;
    let ns = support::create_namespace(&client, "delete-namespace").await;
    // The first two services of the app, each with its Deployment, Services and ServiceAccount.
    let objects: Vec<serde_json::Value> = online_boutique().into_iter().take(7).collect();
    support::apply_all(&client, &ns, &objects).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    eventually("pods running", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running >= 2).then_some(())
        }
    })
    .await;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &Default::default()).await.unwrap();
    eventually("the namespace to be gone", Duration::from_secs(90), || {
        let namespaces = namespaces.clone();
        let ns = ns.clone();
        async move { matches!(namespaces.get_opt(&ns).await, Ok(None)).then_some(()) }
    })
    .await;
    let left: Vec<String> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .map(|p| p.name_any())
        .collect();
    assert!(left.is_empty(), "pods left behind: {left:?}");
}

#[tokio::test]
async fn the_apiserver_survives_two_thousand_applies_and_lists_from_sixteen_clients() {
    in_namespace("load", |client, ns| async move {
        const CLIENTS: usize = 16;
        const OPERATIONS: usize = 2_000;
        let before = support::apiserver::request_counts(&client).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for worker in 0..CLIENTS {
            // A client each: separate connections, as separate controllers would have.
            let client = support::client().await;
            let ns = ns.clone();
            tasks.push(tokio::spawn(async move { load_worker(client, &ns, worker, OPERATIONS / CLIENTS).await }));
        }
        for task in tasks {
            task.await.expect("worker panicked");
        }
        let elapsed = started.elapsed();
        // The API server's own count: every apply and list reached it (other tests of this
        // binary may add to the counter, never take away).
        let served = support::apiserver::request_counts(&client).await.since(&before);
        let (applies, lists) = (served.count("APPLY", "configmaps") + served.count("PATCH", "configmaps"), served.count("LIST", "configmaps"));
        eprintln!("load: {applies} applies + {lists} lists (half pretty-printed) from {CLIENTS} clients in {:.1} s, counted by the API server",
            elapsed.as_secs_f64());
        assert!(applies >= OPERATIONS as u64, "the API server served {applies} of {OPERATIONS} applies");
        assert!(lists >= OPERATIONS as u64, "the API server served {lists} of {OPERATIONS} lists");

        if let Some(pid) = support::shared().apiserver_pid {
            assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "kube-apiserver (pid {pid}) exited under load");
        }
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let kept = configmaps.list(&ListParams::default().labels("load=true")).await.unwrap().items;
        assert_eq!(kept.len(), CLIENTS * 25, "each worker keeps 25 ConfigMaps, re-applied in turn");
        // Every ConfigMap holds its worker's last write to it: no update was lost.
        let per_worker = OPERATIONS / CLIENTS;
        for configmap in kept {
            let name = configmap.name_any();
            let slot: usize = name.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap();
            let last = (0..per_worker).filter(|i| i % 25 == slot).max().unwrap();
            let round = configmap.data.unwrap_or_default().remove("round");
            assert_eq!(round, Some(last.to_string()), "{name} holds its last write");
        }
    })
    .await;
}

/// Applies `operations` ConfigMaps (cycling over 25 names, so most are updates with changed data)
/// and lists them as often, every other list pretty-printed: the encoding path where the 1.20
/// apiserver, built with an unsafe reflect2, once crashed; kept as a load test.
async fn load_worker(client: Client, ns: &str, worker: usize, operations: usize) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let params = PatchParams::apply("previewd-load-test").force();
    for i in 0..operations {
        let name = format!("load-{worker}-{}", i % 25);
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"load": "true", "worker": worker.to_string()}},
            "data": {"round": i.to_string(), "a": "x".repeat(64), "b": "y", "c": "z"}});
        configmaps
            .patch(&name, &params, &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
        let pretty = if i % 2 == 0 { "&pretty=true" } else { "" };
        let uri =
            format!("/api/v1/namespaces/{ns}/configmaps?labelSelector=worker%3D{worker}{pretty}");
        let request = http::Request::get(uri).body(Vec::new()).unwrap();
        let text = client
            .request_text(request)
            .await
            .unwrap_or_else(|e| panic!("list: {e}"));
        assert!(text.contains("\"items\""), "a list came back");
    }
}
