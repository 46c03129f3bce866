//! Helm charts against a real kube-apiserver, rendered by the real Helm engine (see
//! `support::helm`): the web-chart example is read from the repository at the environment's
//! commit (a forge double serves the contents API), deployed with its values and per-commit
//! image tag, its pre-install hook before it and its seed after it; the objects are Helm's own;
//! a reconcile of the same commit renders nothing; a chart that fails to render, carries CRDs
//! or a cluster-scoped object leaves the previous commit running and says why.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use kube::{Client, ResourceExt};
use previewd::engines::EngineConfig;
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::reconcile::ControllerConfig;
use serde_json::{Value, json};
use support::apps::example;
use support::{Running, eventually, in_namespace, wait_for_phase};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

const REPOSITORY: &str = "Codertocat/Hello-World";
const CHART_PATH: &str = "deploy/chart";
const FIRST: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";

/// A CustomResourceDefinition as charts carry them in `crds/`.
const GIZMO_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gizmos, singular: gizmo, kind: Gizmo}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

fn example_chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/web-chart/chart")
}

/// Every file under `root`, as (path relative to it, bytes), sorted.
fn files_of(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                folders.push(entry);
            } else {
                let relative = entry.strip_prefix(root).unwrap().display().to_string();
                files.push((relative, std::fs::read(&entry).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// Serves `files` as folder [`CHART_PATH`] of the repository at commit `sha`, the way GitHub's
/// contents API lists folders and returns files.
async fn serve_chart(forge: &MockServer, sha: &str, files: &[(String, Vec<u8>)]) {
    use base64::Engine;
    use std::collections::BTreeMap;
    let mut listings: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    listings.insert(CHART_PATH.into(), Vec::new());
    for (relative, bytes) in files {
        let full = format!("{CHART_PATH}/{relative}");
        // Each folder on the way lists the next one down.
        let parts: Vec<&str> = full.split('/').collect();
        for depth in 2..parts.len() {
            let folder = parts[..depth].join("/");
            let child = parts[..=depth].join("/");
            let entry = if depth + 1 == parts.len() {
                json!({"type": "file", "name": parts[depth], "path": child, "size": bytes.len()})
            } else {
                json!({"type": "dir", "name": parts[depth], "path": child})
            };
            let listing = listings.entry(folder).or_default();
            if !listing.contains(&entry) {
                listing.push(entry);
            }
        }
        let file = json!({"type": "file", "path": full, "size": bytes.len(), "encoding": "base64",
            "content": base64::engine::general_purpose::STANDARD.encode(bytes)});
        Mock::given(method("GET"))
            .and(path(format!("/repos/{REPOSITORY}/contents/{full}")))
            .and(query_param("ref", sha))
            .respond_with(ResponseTemplate::new(200).set_body_json(file))
            .mount(forge)
            .await;
    }
    for (folder, listing) in listings {
        Mock::given(method("GET"))
            .and(path(format!("/repos/{REPOSITORY}/contents/{folder}")))
            .and(query_param("ref", sha))
            .respond_with(ResponseTemplate::new(200).set_body_json(listing))
            .mount(forge)
            .await;
    }
}

/// The example's chart with `path` replaced by `text` (or added).
fn chart_with(path: &str, text: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = files_of(&example_chart())
        .into_iter()
        .filter(|(p, _)| p != path)
        .collect();
    files.push((path.to_string(), text.as_bytes().to_vec()));
    files.sort();
    files
}

async fn start_controller(client: &Client, namespace: &str) -> Running {
    support::start_controller_with(
        client,
        ControllerConfig {
            namespace: Some(namespace.to_string()),
            engines: EngineConfig {
                helm: support::helm::template_command(),
                timeout: Duration::from_secs(60),
            },
            ..Default::default()
        },
    )
    .await
}

/// The web-chart example in `namespace`, reading its chart from `forge`.
async fn install_example(
    client: &Client,
    namespace: &str,
    forge: &MockServer,
) -> PreviewEnvironment {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let token = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "forge-token"},
        "stringData": {"token": "test-token"}});
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(token).unwrap(),
        )
        .await
        .unwrap();
    let (mut template, environment) = example("web-chart");
    template.spec.forge.api_url = Some(forge.uri());
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), namespace);
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    environments
        .create(&PostParams::default(), &environment)
        .await
        .unwrap()
}

fn renders(running: &Running, outcome: &str) -> u64 {
    running
        .metrics
        .reconcile
        .chart_renders
        .with_label_values(&["helm", outcome])
        .get()
}

/// The first place where `live` lacks something of `expected` (every field Helm rendered must
/// be in the live object with the same value; the API server adds defaults beside them).
fn missing_from(live: &Value, expected: &Value, at: &str) -> Option<String> {
    match (expected, live) {
        (Value::Object(fields), Value::Object(live_fields)) => {
            fields.iter().find_map(|(k, v)| match live_fields.get(k) {
                Some(l) => missing_from(l, v, &format!("{at}.{k}")),
                None => Some(format!("{at}.{k}")),
            })
        }
        (Value::Array(items), Value::Array(live_items)) if items.len() == live_items.len() => items
            .iter()
            .zip(live_items)
            .enumerate()
            .find_map(|(i, (e, l))| missing_from(l, e, &format!("{at}[{i}]"))),
        _ if expected == live => None,
        _ => Some(format!("{at}: expected {expected}, found {live}")),
    }
}

/// Every object Helm's install action makes of the chart is in `target` as Helm made it.
async fn assert_same_objects_as_helm(client: &Client, target: &str, release: &str, values: &Value) {
    let expected = support::helm::install_manifest(&example_chart(), release, target, values);
    assert_eq!(
        expected.len(),
        4,
        "ConfigMap, Deployment, Ingress and Service: {expected:#?}"
    );
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for object in expected {
        let (group_version, kind) = (
            object["apiVersion"].as_str().unwrap(),
            object["kind"].as_str().unwrap(),
        );
        let name = object["metadata"]["name"].as_str().unwrap();
        let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
        let (resource, _) = discovery
            .resolve_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind))
            .unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), target, &resource);
        let live = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if let Some(difference) = missing_from(&live, &object, kind) {
            panic!("{kind} {name} is not as Helm renders it: {difference}");
        }
    }
}

async fn set_head(client: &Client, namespace: &str, name: &str, sha: &str) {
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"spec": {"source": {"headSha": sha}}});
    environments
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Waits until the environment says `reason`, and returns its message.
async fn refused_with(client: &Client, namespace: &str, name: &str, reason: &str) -> String {
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    eventually(
        &format!("condition {reason}"),
        Duration::from_secs(60),
        || async {
            let environment = environments.get(name).await.ok()?;
            let status = environment.status?;
            status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.reason == reason)
                .map(|c| c.message.clone())
        },
    )
    .await
}

async fn image_of(client: &Client, target: &str) -> String {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), target);
    let deployment = deployments.get("web-chart-pr-2-web").await.unwrap();
    deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

#[tokio::test]
async fn a_helm_chart_from_the_repository_is_deployed_per_commit_with_its_hook_before_and_seed_after()
 {
    in_namespace("helm-chart", |client, ns| async move {
        let forge = MockServer::start().await;
        serve_chart(&forge, FIRST, &files_of(&example_chart())).await;
        let running = start_controller(&client, &ns).await;
        let environment = install_example(&client, &ns, &forge).await;
        let name = environment.name_any();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let ready = wait_for_phase(&environments, &name, Phase::Ready, Duration::from_secs(120)).await;
        let target = ready.status.unwrap().namespace.unwrap();

        // The template's values and the commit's image tag, passed the Helm way.
        assert_eq!(image_of(&client, &target).await, format!("ghcr.io/codertocat/hello-world:{FIRST}"));
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
        let settings = config_maps.get("web-chart-pr-2-web").await.unwrap();
        assert_eq!(settings.data.unwrap()["GREETING"], "Preview of changes");
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &target);
        let ingress = ingresses.get("web-chart-pr-2-web").await.unwrap();
        let host = ingress.spec.unwrap().rules.unwrap()[0].host.clone();
        assert_eq!(host.as_deref(), Some("changes.preview.example.com"));

        // The pre-install hook ran to completion before the chart's objects were created, the
        // seed after them; the test hook was left out.
        let jobs: Api<Job> = Api::namespaced(client.clone(), &target);
        let job_of = |seed: &'static str| {
            let jobs = jobs.clone();
            async move {
                let listed = jobs.list(&ListParams::default().labels(&format!("previewd.dev/seed={seed}"))).await.unwrap();
                assert_eq!(listed.items.len(), 1, "one {seed} Job");
                listed.items.into_iter().next().unwrap()
            }
        };
        let migrate = job_of("web-chart-pr-2-web-migrate").await;
        let seed = job_of("sample-data").await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &target);
        let app = deployments.get("web-chart-pr-2-web").await.unwrap();
        let migrated = migrate.status.unwrap().completion_time.expect("the hook Job completed").0;
        let app_created = app.metadata.creation_timestamp.unwrap().0;
        assert!(migrated <= app_created, "the hook finished ({migrated}) before the app was created ({app_created})");
        assert!(seed.metadata.creation_timestamp.unwrap().0 >= app_created, "the seed comes after the chart");
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &target);
        assert!(pods.get_opt("web-chart-pr-2-web-test").await.unwrap().is_none(), "no test hook");

        // Same objects as Helm's own install makes, for the same chart, release and values.
        let values = json!({"image": {"tag": FIRST}, "greeting": "Preview of changes",
            "ingress": {"host": "changes.preview.example.com"}});
        assert_same_objects_as_helm(&client, &target, &name, &values).await;

        // Reconciles of the same commit run no Helm.
        let rendered = renders(&running, "rendered");
        assert_eq!(rendered, 1, "one render for the commit");
        for poke in 0..3 {
            let cached = renders(&running, "cached");
            let annotation = json!({"metadata": {"annotations": {"test.previewd.dev/poke": poke.to_string()}}});
            environments.patch(&name, &PatchParams::default(), &Patch::Merge(annotation)).await.unwrap();
            eventually("a reconcile after the poke", Duration::from_secs(30), || async {
                (renders(&running, "cached") > cached).then_some(())
            })
            .await;
        }
        assert_eq!(renders(&running, "rendered"), 1, "the same commit rendered nothing more");

        // A commit whose chart does not render: Helm's message, the first commit keeps running.
        let broken = "2222222222222222222222222222222222222222";
        let missing_key = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\ndata:\n  db: {{ .Values.database.host }}\n";
        serve_chart(&forge, broken, &chart_with("templates/extra.yaml", missing_key)).await;
        set_head(&client, &ns, &name, broken).await;
        let message = refused_with(&client, &ns, &name, "RenderFailed").await;
        assert!(message.contains("templates/extra.yaml") && message.contains("database"), "{message}");
        assert_eq!(image_of(&client, &target).await, format!("ghcr.io/codertocat/hello-world:{FIRST}"));

        // A chart with a CRD: refused, with what to do; no CRD is created.
        let with_crd = "3333333333333333333333333333333333333333";
        serve_chart(&forge, with_crd, &chart_with("crds/gizmos.yaml", GIZMO_CRD)).await;
        set_head(&client, &ns, &name, with_crd).await;
        let message = refused_with(&client, &ns, &name, "CRDsNotInstalled").await;
        assert!(message.contains("gizmos.example.com (web/crds/gizmos.yaml)"), "{message}");
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
        assert!(crds.get_opt("gizmos.example.com").await.unwrap().is_none());

        // A chart with a cluster-scoped object: refused by the guard.
        let cluster_wide = "4444444444444444444444444444444444444444";
        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {{ .Release.Name }}-everything\nrules:\n- apiGroups: ['*']\n  resources: ['*']\n  verbs: ['*']\n";
        serve_chart(&forge, cluster_wide, &chart_with("templates/role.yaml", role)).await;
        set_head(&client, &ns, &name, cluster_wide).await;
        let message = refused_with(&client, &ns, &name, "GuardRejected").await;
        assert!(message.contains("ClusterRole"), "{message}");
        assert_eq!(image_of(&client, &target).await, format!("ghcr.io/codertocat/hello-world:{FIRST}"));

        // A chart that prints more than the render limit: stopped, said, nothing applied.
        let flood = "6666666666666666666666666666666666666666";
        let huge = "# {{ range until 300000 }}twenty characters..{{ end }}\n";
        serve_chart(&forge, flood, &chart_with("templates/flood.yaml", huge)).await;
        set_head(&client, &ns, &name, flood).await;
        let message = refused_with(&client, &ns, &name, "RenderFailed").await;
        assert!(message.contains("printed more than 4194304 bytes"), "{message}");
        assert_eq!(image_of(&client, &target).await, format!("ghcr.io/codertocat/hello-world:{FIRST}"));

        // A good commit again: deployed, its hook run again for its new image.
        let fixed = "5555555555555555555555555555555555555555";
        serve_chart(&forge, fixed, &files_of(&example_chart())).await;
        set_head(&client, &ns, &name, fixed).await;
        eventually("the fixed commit deployed", Duration::from_secs(120), || async {
            let image = image_of(&client, &target).await;
            (image.ends_with(fixed)).then_some(())
        })
        .await;
        wait_for_phase(&environments, &name, Phase::Ready, Duration::from_secs(120)).await;
    })
    .await;
}
