//! YAML from a pull request is never expanded in previewd's own process, and an input that
//! exhausts a render worker or an engine is set aside (issue 52). A real `previewd run`
//! process renders three templates whose repository holds an alias bomb (about 100 KB of
//! YAML whose aliases copy one long list thousands of times, hundreds of MiB once expanded):
//! as a repository manifest, in a Kustomize overlay's kustomization, and in a Helm chart's
//! `crds/`. Each environment says RenderFailed with the memory limit it met; previewd's
//! resident memory stays within 100 MiB of where it started; another template's environment
//! reaches Ready meanwhile; and after a SIGKILL the next previewd renders none of them again
//! (`status.quarantine`), until the commit changes.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use serde_json::json;
use support::apps::example;
use support::contents::{files_of, serve_folders};
use support::process::PreviewdProcess;
use support::{eventually, in_namespace, wait_for_phase};
use wiremock::MockServer;

const REPOSITORY: &str = "Codertocat/Hello-World";
const FIRST: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";

/// A list of 2,000 strings anchored once and copied 3,000 times: 6 million strings to a
/// parser that expands aliases (serde_yaml_ng's limit counts the 3,000 jumps, not what each
/// copies), from `prefix` (the fields that make the file what it is) and about 100 KB.
fn alias_bomb(prefix: &str) -> String {
    let long: Vec<String> = (0..2_000).map(|i| format!("item-{i:08}")).collect();
    let copies = vec!["*long"; 3_000].join(", ");
    format!(
        "{prefix}anchor: &long [{}]\ncopies: [{copies}]\n",
        long.join(", ")
    )
}

fn example_folder(name: &str, folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("templates")
        .join(name)
        .join(folder)
}

/// The repository at [`FIRST`]: a manifests folder, an overlay and a chart, each with a bomb,
/// and the web-chart example's chart as it is.
async fn serve_repository(forge: &MockServer) {
    let manifests = [(
        "bomb.yaml".to_string(),
        alias_bomb("# apiVersion: v1\n").into_bytes(),
    )];
    let overlay = [(
        "kustomization.yaml".to_string(),
        alias_bomb("resources: []\n").into_bytes(),
    )];
    let mut chart = files_of(&example_folder("web-chart", "chart"));
    chart.push((
        "crds/bomb.yaml".to_string(),
        alias_bomb("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
            .into_bytes(),
    ));
    let good_chart = files_of(&example_folder("web-chart", "chart"));
    let folders = [
        ("deploy/manifests", &manifests[..]),
        ("deploy/overlay", &overlay[..]),
        ("deploy/bomb-chart", &chart[..]),
        ("deploy/chart", &good_chart[..]),
    ];
    serve_folders(forge, REPOSITORY, FIRST, &folders).await;
}

/// Template `name`, the web-chart example reading the repository from `forge` with its
/// manifests taken from `manifests` (a field of `spec.manifests`), and its environment
/// `<name>-pr-<number>`.
async fn create(
    client: &Client,
    ns: &str,
    forge: &MockServer,
    name: &str,
    number: u64,
    manifests: serde_json::Value,
) {
    let (template, environment) = example("web-chart");
    let mut template = serde_json::to_value(template).unwrap();
    template["metadata"]["name"] = json!(name);
    template["spec"]["forge"]["apiUrl"] = json!(forge.uri());
    template["spec"]["seeds"] = json!([]);
    // A chart keeps the example's values (the image tag its templates require).
    match manifests["helm"]["chart"]["path"].as_str() {
        Some(chart) => template["spec"]["manifests"]["helm"]["chart"]["path"] = json!(chart),
        None => template["spec"]["manifests"] = manifests,
    }
    let template: PreviewTemplate = serde_json::from_value(template).unwrap();
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), ns);
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let mut environment = environment;
    environment.metadata.name = Some(format!("{name}-pr-{number}"));
    environment.spec.template = name.into();
    environment.spec.source.branch = format!("branch-{number}");
    environment.spec.source.pull_request = Some(number);
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), ns);
    environments
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
}

/// A `previewd run` of `namespace` with the pinned engines.
fn previewd(namespace: &str, name: &str, logs: &Path) -> PreviewdProcess {
    let helm = support::tools::helm().display().to_string();
    let kubectl = support::tools::kubectl().display().to_string();
    PreviewdProcess::start(
        name,
        &support::shared().kubeconfig_path,
        &[
            "--watch-namespace",
            namespace,
            "--leader-elect",
            "false",
            "--helm",
            &helm,
            "--kubectl",
            &kubectl,
        ],
        &[],
        logs,
    )
}

/// `VmRSS` or `VmHWM` (the peak) of process `pid`, in bytes.
fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The Ready condition's message once its reason is `reason`.
async fn said(environments: &Api<PreviewEnvironment>, name: &str, reason: &str) -> String {
    support::ready_reason(environments, name, reason, Duration::from_secs(120)).await
}

const BOMBS: [&str; 3] = ["manifest-pr-2", "overlay-pr-3", "crds-pr-4"];

#[tokio::test]
async fn an_alias_bomb_is_expanded_only_in_a_worker_and_set_aside_across_a_restart() {
    in_namespace("alias-bomb", |client, ns| async move {
        let forge = MockServer::start().await;
        serve_repository(&forge).await;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
        let token = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "forge-token"},
            "stringData": {"token": "test-token"}});
        secrets.create(&PostParams::default(), &serde_json::from_value(token).unwrap()).await.unwrap();
        let logs = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let first = previewd(&ns, "first", logs.path());
        first.wait_ready(&http).await;
        let baseline = memory_of(first.child.id(), "VmRSS:");
        // What the kernel keeps around the engines is said by /readyz and the metrics.
        let readyz = http.get(format!("{}/readyz", first.base)).send().await.unwrap();
        let readyz = readyz.text().await.unwrap();
        assert!(
            readyz.contains("engines contained (required): files: Landlock ABI")
                && readyz.contains("network: seccomp refuses every socket"),
            "{readyz}"
        );
        for wall in ["files", "network"] {
            let series = format!("previewd_engine_containment{{wall=\"{wall}\"}}");
            assert_eq!(first.metric(&http, &series).await, Some(1.0), "{series}");
        }

        create(&client, &ns, &forge, "manifest", 2, json!({"repositoryPath": "deploy/manifests"})).await;
        create(&client, &ns, &forge, "overlay", 3, json!({"kustomize": {"path": "deploy/overlay"}})).await;
        create(&client, &ns, &forge, "crds", 4, json!({"helm": {"chart": {"path": "deploy/bomb-chart"}}})).await;
        create(&client, &ns, &forge, "quick", 5, json!({"helm": {"chart": {"path": "deploy/chart"}}})).await;

        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        for name in BOMBS {
            let message = said(&environments, name, "RenderFailed").await;
            assert!(
                message.contains("needed more than") && message.contains("set aside"),
                "{name}: {message}"
            );
            let quarantine = environments.get(name).await.unwrap().status.unwrap().quarantine;
            assert_eq!(quarantine.map(|q| q.commit), Some(FIRST.to_string()), "{name}");
        }
        wait_for_phase(&environments, "quick-pr-5", Phase::Ready, Duration::from_secs(120)).await;
        let peak = memory_of(first.child.id(), "VmHWM:");
        assert!(
            peak < baseline + (100 << 20),
            "previewd grew from {} MiB to a peak of {} MiB",
            baseline >> 20,
            peak >> 20
        );
        drop(first);

        // The next previewd (a restart, or the standby after a failover) renders none of them.
        let second = previewd(&ns, "second", logs.path());
        second.wait_ready(&http).await;
        let poke = json!({"metadata": {"annotations": {"test.previewd.dev/poke": "1"}}});
        for name in BOMBS {
            environments.patch(name, &PatchParams::default(), &Patch::Merge(&poke)).await.unwrap();
        }
        let reconciled = "previewd_reconcile_duration_seconds_count";
        eventually("the second previewd reconciled every environment", Duration::from_secs(60), || async {
            let count = second.metric_total(&http, reconciled).await?;
            (count >= 4.0).then_some(())
        })
        .await;
        // A set-aside commit rendered again would fail again: none did.
        let metrics = second.metrics_text(&http).await.unwrap();
        let failed: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("previewd_engine_renders_total") && l.contains("outcome=\"failed\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(failed, 0.0, "a set-aside commit was rendered again:\n{metrics}");
        for name in BOMBS {
            let message = said(&environments, name, "RenderFailed").await;
            assert!(message.contains("set aside"), "{name}: {message}");
        }
    })
    .await;
}
