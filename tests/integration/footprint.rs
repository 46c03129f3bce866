//! The footprint against a real kube-apiserver, with the GitHub API served by wiremock: what the
//! status and the PR comment say an environment requests is what its pods were admitted with
//! (the LimitRange's default for a container that requests nothing included), its cost is
//! shown with the operator's prices, and sleeping shows what it saved.

use crate::support;

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use previewd::model::crd::{Phase, PreviewEnvironment};
use previewd::model::footprint::{Prices, say_bytes, say_cores};
use previewd::model::quantity;
use previewd::reconcile::ControllerConfig;
use serde_json::json;
use support::webhooks::*;
use support::{in_namespace, wait_for_phase};

/// Two replicas of a web container that requests 250m and 256Mi, beside a sidecar that
/// requests nothing (the LimitRange gives it 50m and 64Mi).
const APP: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: registry.example/web:1
          resources: {requests: {cpu: 250m, memory: 256Mi}}
        - name: sidecar
          image: registry.example/sidecar:1
";

/// What the environment's running pods request, as the API server admitted them.
async fn pods_request(client: &kube::Client, namespace: &str) -> (u64, u64) {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut total = (0, 0);
    for pod in pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        for container in &pod.spec.as_ref().unwrap().containers {
            let requests = container
                .resources
                .as_ref()
                .and_then(|r| r.requests.clone())
                .unwrap_or_default();
            total.0 += quantity::millis(&requests["cpu"].0).unwrap();
            total.1 += quantity::units(&requests["memory"].0).unwrap();
        }
    }
    total
}

#[tokio::test]
async fn the_comment_shows_what_the_pods_request_and_their_cost() {
    in_namespace("footprint", |client, ns| async move {
        let forge = github_forge().await;
        install_template_with(&client, &ns, "github", "Codertocat/Hello-World", Some(&forge.uri()), json!({}), APP).await;
        let prices = Prices { per_core_hour: 0.04, per_gib_hour: 0.005, currency: "$".into() };
        let config = ControllerConfig { namespace: Some(ns.clone()), prices: Some(prices.clone()), ..Default::default() };
        let _running = support::start_controller_with(&client, config).await;
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": "pr-2"},
            "spec": {"template": "app-github", "source": {"repository": "Codertocat/Hello-World", "branch": "changes", "pullRequest": 2, "headSha": "abc1234"}}
        }))
        .unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&PostParams::default(), &environment).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-2", Phase::Ready, Duration::from_secs(60)).await;
        let status = ready.status.unwrap();
        let target = status.namespace.unwrap();

        let (cpu, memory) = support::eventually("both pods running", Duration::from_secs(30), || async {
            let pods = Api::<Pod>::namespaced(client.clone(), &target).list(&ListParams::default()).await.ok()?;
            (pods.items.len() == 2).then_some(())?;
            Some(pods_request(&client, &target).await)
        })
        .await;
        assert_eq!((cpu, memory), (600, 640 << 20), "2 x (250m + 50m, 256Mi + 64Mi) as admitted");
        let footprint = status.footprint.unwrap();
        assert_eq!((footprint.cpu_millicores, footprint.memory_bytes), (cpu, memory), "the status says what the pods request");
        let hourly = prices.cost(cpu as f64 / 1000.0, memory as f64 / f64::from(1u32 << 30));
        let said = format!("{} and {} requested while awake, ≈ ${hourly:.2} an hour", say_cores(cpu), say_bytes(memory));
        assert_eq!(said, "0.6 cores and 640 MiB requested while awake, ≈ $0.03 an hour");
        comment_says(&forge, &format!("{ns}/pr-2"), &said).await;

        // Asleep: the pods go, the footprint keeps what the environment wakes to, and the
        // comment says how long it was awake and what it cost so far.
        let started = Utc::now();
        environments.patch("pr-2", &PatchParams::default(), &Patch::Merge(json!({"spec": {"sleep": true}}))).await.unwrap();
        let asleep = wait_for_phase(&environments, "pr-2", Phase::Sleeping, Duration::from_secs(60)).await;
        let footprint = asleep.status.unwrap().footprint.unwrap();
        assert!(footprint.asleep && footprint.since >= started - chrono::TimeDelta::seconds(1));
        assert_eq!((footprint.cpu_millicores, footprint.memory_bytes), (600, 640 << 20));
        assert!(footprint.awake_seconds < 120, "awake while the test ran: {footprint:?}");
        comment_says(&forge, &format!("{ns}/pr-2"), "asleep 0 min, saved ≈ $0.00").await;
    })
    .await;
}
