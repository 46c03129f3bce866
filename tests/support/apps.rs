//! The repository's example applications as the tests deploy them.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams};
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};

/// `templates/<name>/`: the example's template and environment.
pub fn example(name: &str) -> (PreviewTemplate, PreviewEnvironment) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("templates")
        .join(name);
    let template =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("template.yaml")).unwrap())
            .unwrap();
    let environment =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("environment.yaml")).unwrap())
            .unwrap();
    (template, environment)
}

/// The Online Boutique example with a 4 s seed in wave 1 and a ConfigMap in wave 2: an apply
/// that is reliably in the middle (wave 2 waits for the seed) while the seed Job exists.
pub fn boutique_with_slow_seed() -> PreviewTemplate {
    let (mut template, _) = example("online-boutique");
    template.spec.manifests.inline.push(previewd::model::crd::InlineManifest {
        name: "after-seed.yaml".into(),
        template: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: after-seed\n  annotations:\n    previewd.dev/wave: \"2\"\ndata:\n  sha: \"{{ sha }}\"\n".into(),
    });
    template.spec.seeds.push(previewd::model::crd::SeedSpec {
        name: "catalog".into(),
        wave: 1,
        job: "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: catalog\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        sandbox.previewd.dev/run-seconds: \"4\"\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: load\n        image: busybox:1.36\n        args: [\"load-products\"]\n".into(),
    });
    template
}

/// How many Deployments, Services and ServiceAccounts previewd manages in `target`
/// (the Online Boutique has 12, 12 and 11).
pub async fn managed_counts(client: &Client, target: &str) -> (usize, usize, usize) {
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=previewd");
    let deployments = Api::<Deployment>::namespaced(client.clone(), target)
        .list(&lp)
        .await
        .unwrap()
        .items
        .len();
    let services = Api::<Service>::namespaced(client.clone(), target)
        .list(&lp)
        .await
        .unwrap()
        .items
        .len();
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), target)
        .list(&lp)
        .await
        .unwrap()
        .items
        .len();
    (deployments, services, accounts)
}

/// An inline template of one manifest, and a pull request's environment of it.
pub struct InlineApp<'a> {
    pub template: &'a str,
    pub manifest: &'a str,
    /// The template's `spec.policy` (`{}`: the defaults).
    pub policy: serde_json::Value,
    pub environment: &'a str,
    pub pull_request: u64,
    pub branch: &'a str,
}

/// Creates `app`'s template and environment in `namespace` (the repository
/// `Codertocat/Hello-World`, head `abc1234`).
pub async fn create_inline(client: &Client, namespace: &str, app: InlineApp<'_>) {
    use kube::api::PostParams;
    let template: PreviewTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": app.template},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "policy": app.policy,
                 "manifests": {"inline": [{"name": "app.yaml", "template": app.manifest}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environment: PreviewEnvironment = serde_json::from_value(serde_json::json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": app.environment},
        "spec": {"template": app.template, "source": {"repository": "Codertocat/Hello-World",
                 "branch": app.branch, "pullRequest": app.pull_request, "headSha": "abc1234"}}
    }))
    .unwrap();
    Api::<PreviewEnvironment>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
}
