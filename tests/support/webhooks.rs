//! The webhook harness shared by the webhook and lifecycle tests: wiremock stand-ins for the
//! GitHub and GitLab APIs, a controller with the webhook server in front of it, signed fixture
//! deliveries and waits on environments.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use previewd::forge::github;
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::reconcile::Context;
use previewd::runtime::metrics::Metrics;
use previewd::webhook::server;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{eventually, fixture};

/// A GitHub API that accepts previewd's calls: no comment exists yet, a new one gets id 4242,
/// a deployment gets id 77.
pub async fn github_forge() -> MockServer {
    let server = MockServer::start().await;
    mount_github_api(&server).await;
    server
}

/// The answers of [`github_forge`], on an existing server (one that misbehaved until now).
pub async fn mount_github_api(server: &MockServer) {
    let ok = |status: u16, body: Value| {
        ResponseTemplate::new(status)
            .set_body_json(body)
            .insert_header("x-ratelimit-remaining", "4990")
    };
    // A PR's comments as GitHub lists them: someone else's comment, an ETag, a Link header.
    Mock::given(method("GET"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/issues/\d+/comments$"))
        .respond_with(
            ok(200, json!([{"id": 101, "body": "Looks good to me", "user": {"login": "octocat", "type": "User"}}]))
                .insert_header("etag", "\"comments-v1\"")
                .insert_header("link", "<https://api.github.com/repositories/1/issues/2/comments?page=1>; rel=\"last\""),
        )
        .mount(server)
        .await;
    // The user previewd's token belongs to: its own comments are that user's.
    Mock::given(method("GET"))
        .and(path("/user"))
        .respond_with(ok(
            200,
            json!({"login": "previewd-bot", "id": 900, "type": "User"}),
        ))
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/issues/\d+/comments$"))
        .respond_with(ok(201, json!({"id": 4242})))
        .mount(server)
        .await;
    Mock::given(method("PATCH"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/issues/comments/\d+$"))
        .respond_with(ok(200, json!({"id": 4242})))
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/deployments$"))
        .respond_with(ok(201, json!({"id": 77})))
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/deployments/\d+/statuses$"))
        .respond_with(ok(201, json!({"id": 1})))
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/repos/[^/]+/[^/]+/statuses/[0-9a-f]+$"))
        .respond_with(ok(201, json!({"id": 1})))
        .mount(server)
        .await;
}

/// A GitLab API (v4) that accepts previewd's calls: a new note gets id 99.
pub async fn gitlab_forge() -> MockServer {
    let server = MockServer::start().await;
    mount_gitlab_api(&server).await;
    server
}

/// Mounts the GitLab API answers of [`gitlab_forge`] on `server`.
pub async fn mount_gitlab_api(server: &MockServer) {
    let ok = |status: u16, body: Value| {
        ResponseTemplate::new(status)
            .set_body_json(body)
            .insert_header("ratelimit-remaining", "1990")
    };
    Mock::given(method("GET"))
        .and(path_regex(r"^/api/v4/user$"))
        .respond_with(ok(200, json!({"id": 1, "username": "previewd"})))
        .mount(server)
        .await;
    // An MR's notes as GitLab lists them: someone else's note, with the paging headers.
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/api/v4/projects/[^/]+/merge_requests/\d+/notes$",
        ))
        .respond_with(
            ok(200, json!([{"id": 7, "body": "LGTM", "author": {"id": 5, "username": "reviewer"}, "system": false}]))
                .insert_header("x-page", "1")
                .insert_header("x-total-pages", "1"),
        )
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(
            r"^/api/v4/projects/[^/]+/merge_requests/\d+/notes$",
        ))
        .respond_with(ok(201, json!({"id": 99, "body": ""})))
        .mount(server)
        .await;
    Mock::given(method("PUT"))
        .and(path_regex(
            r"^/api/v4/projects/[^/]+/merge_requests/\d+/notes/\d+$",
        ))
        .respond_with(ok(200, json!({"id": 99, "body": ""})))
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/api/v4/projects/[^/]+/statuses/[0-9a-f]+$"))
        .respond_with(ok(201, json!({"id": 1})))
        .mount(server)
        .await;
    // Environments: none exists yet, a new one gets id 5; deployments get id 7.
    let environments = r"^/api/v4/projects/[^/]+/environments";
    for (verb, pattern, status, body) in [
        ("GET", format!("{environments}$"), 200, json!([])),
        (
            "POST",
            format!("{environments}$"),
            201,
            json!({"id": 5, "name": "preview/x"}),
        ),
        (
            "PUT",
            format!(r"{environments}/\d+$"),
            200,
            json!({"id": 5}),
        ),
        (
            "POST",
            format!(r"{environments}/\d+/stop$"),
            200,
            json!({"id": 5}),
        ),
        (
            "POST",
            r"^/api/v4/projects/[^/]+/deployments$".to_string(),
            201,
            json!({"id": 7}),
        ),
        (
            "PUT",
            r"^/api/v4/projects/[^/]+/deployments/\d+$".to_string(),
            200,
            json!({"id": 7}),
        ),
    ] {
        Mock::given(method(verb))
            .and(path_regex(pattern))
            .respond_with(ok(status, body))
            .mount(server)
            .await;
    }
}

/// How many `verb` requests the forge received whose path ends with `path_end` and whose body
/// contains `needle`.
pub async fn sent(forge: &MockServer, verb: &str, path_end: &str, needle: &str) -> usize {
    forge
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.method.as_str() == verb && r.url.path().ends_with(path_end))
        .filter(|r| String::from_utf8_lossy(&r.body).contains(needle))
        .count()
}

/// The text of the last comment created or edited (GitHub `body`, GitLab `body` form or JSON).
pub async fn last_comment_text(forge: &MockServer) -> Option<String> {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .rev()
        .filter(|r| {
            r.method.as_str() != "GET"
                && (r.url.path().contains("/comments") || r.url.path().contains("/notes"))
        })
        .find_map(|r| {
            let raw = String::from_utf8_lossy(&r.body).into_owned();
            if let Ok(json) = serde_json::from_str::<Value>(&raw) {
                return json["body"].as_str().map(str::to_string);
            }
            url::form_urlencoded::parse(raw.as_bytes())
                .find(|(k, _)| k == "body")
                .map(|(_, v)| v.into_owned())
        })
}

pub const SECRET: &str = "it-is-a-secret-to-everybody";

/// POSTs a GitHub delivery to the previewd at `base`: (status, JSON answer).
pub async fn post_github(
    http: &reqwest::Client,
    base: &str,
    event: &str,
    delivery: &str,
    body: &[u8],
    signature: Option<String>,
) -> (u16, Value) {
    let mut request = http
        .post(format!("{base}/webhooks/github"))
        .header("X-GitHub-Event", event)
        .header("X-GitHub-Delivery", delivery)
        .header("Content-Type", "application/json")
        .body(body.to_vec());
    if let Some(signature) = signature {
        request = request.header("X-Hub-Signature-256", signature);
    }
    let response = request.send().await.expect("send the delivery");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// POSTs a GitLab delivery with `token` to the previewd at `base`: (status, JSON answer).
pub async fn post_gitlab(
    http: &reqwest::Client,
    base: &str,
    event: &str,
    delivery: &str,
    body: &[u8],
    token: &str,
) -> (u16, Value) {
    let response = http
        .post(format!("{base}/webhooks/gitlab"))
        .header("X-Gitlab-Event", event)
        .header("X-Gitlab-Event-UUID", delivery)
        .header("X-Gitlab-Token", token)
        .body(body.to_vec())
        .send()
        .await
        .expect("send the delivery");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A controller and the webhook server for one test namespace, on a free loopback port.
pub struct Harness {
    pub base: String,
    pub http: reqwest::Client,
    pub environments: Api<PreviewEnvironment>,
    pub context: Arc<Context>,
    pub metrics: Arc<Metrics>,
}

impl Harness {
    pub async fn start(client: &Client, namespace: &str, max_body_bytes: usize) -> Self {
        let config = previewd::reconcile::ControllerConfig {
            namespace: Some(namespace.to_string()),
            ..Default::default()
        };
        Self::start_with(client, config, max_body_bytes).await
    }

    /// [`Harness::start`] with the controller's `config` (its `namespace` is the one watched).
    pub async fn start_with(
        client: &Client,
        config: previewd::reconcile::ControllerConfig,
        max_body_bytes: usize,
    ) -> Self {
        let namespace = config.namespace.clone().unwrap_or_default();
        let namespace = namespace.as_str();
        let running = super::start_controller_with(client, config).await;
        let state = running.server_state(client, max_body_bytes);
        let super::Running { context, metrics } = running;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(server::serve(
            state.clone(),
            listener,
            std::future::pending(),
        ));
        let http = reqwest::Client::new();
        // Ready once the template and environment caches are synced.
        wait_until_ready(&http, &base).await;
        Self {
            base,
            http,
            environments: Api::namespaced(client.clone(), namespace),
            context,
            metrics,
        }
    }

    pub async fn github(
        &self,
        event: &str,
        delivery: &str,
        body: &[u8],
        signature: Option<String>,
    ) -> (u16, Value) {
        post_github(&self.http, &self.base, event, delivery, body, signature).await
    }

    /// Sends `body` signed with the right secret.
    pub async fn signed(&self, event: &str, delivery: &str, body: &[u8]) -> (u16, Value) {
        self.github(
            event,
            delivery,
            body,
            Some(github::sign(SECRET.as_bytes(), body)),
        )
        .await
    }

    pub async fn gitlab(
        &self,
        event: &str,
        delivery: &str,
        body: &[u8],
        token: &str,
    ) -> (u16, Value) {
        post_gitlab(&self.http, &self.base, event, delivery, body, token).await
    }

    /// Delivers PR `number` opened at head `sha` (signed, see [`opened_for`]), expects 202, and
    /// returns the name of the environment the intake wrote for it.
    pub async fn open_pull_request(&self, number: u64, sha: &str) -> String {
        let body = opened_for(number, sha);
        let (status, answer) = self
            .signed("pull_request", &format!("open-{number}-{sha}"), &body)
            .await;
        assert_eq!(status, 202, "{answer}");
        environment_of_pr(&self.environments, number).await
    }

    /// Given the answer to a delivery that opens the first environment of the test: expects 202,
    /// and waits until that environment is Ready at `sha`. Returns its name and its state then.
    pub async fn ready_after(
        &self,
        (status, answer): (u16, Value),
        sha: &str,
    ) -> (String, PreviewEnvironment) {
        assert_eq!(status, 202, "{answer}");
        let name = self
            .environment_names()
            .await
            .pop()
            .expect("an environment");
        let ready = wait_ready_with_sha(&self.environments, &name, sha).await;
        (name, ready)
    }

    /// Patches an annotation of environment `name` and waits until the controller has finished
    /// a reconcile since: proof that it looked, for checks that something did not happen.
    pub async fn poke_and_wait_for_a_reconcile(&self, name: &str, poke: u32) {
        let reconciles =
            |text: String| metric_sum(&text, "previewd_reconcile_duration_seconds_count");
        let before = reconciles(self.metrics().await);
        let annotation =
            json!({"metadata": {"annotations": {"test.previewd.dev/poke": poke.to_string()}}});
        self.environments
            .patch(name, &PatchParams::default(), &Patch::Merge(annotation))
            .await
            .expect("poke the environment");
        eventually(
            "a reconcile after the poke",
            Duration::from_secs(30),
            || async { (reconciles(self.metrics().await) > before).then_some(()) },
        )
        .await;
    }

    /// A sweeper sharing this harness's caches and metrics, for `namespace`.
    pub fn sweeper(
        &self,
        client: &Client,
        namespace: &str,
    ) -> previewd::lifecycle::sweeper::Sweeper {
        super::sweeper_of(&self.context, &self.metrics, client, namespace)
    }

    /// The text `GET /metrics` answers.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn environment_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .environments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|e| e.name_any())
            .collect();
        names.sort();
        names
    }
}

/// The webhook secret and a small template (one ConfigMap showing the SHA) for `repository`;
/// with `forge_api`, also a token and the forge API URL, so previewd reports there.
pub async fn install_template(
    client: &Client,
    namespace: &str,
    forge: &str,
    repository: &str,
    forge_api: Option<&str>,
) {
    install_template_with(
        client,
        namespace,
        forge,
        repository,
        forge_api,
        json!({}),
        CONFIG_MAP_APP,
    )
    .await;
}

/// The manifest of the default test application: one ConfigMap showing the SHA.
pub const CONFIG_MAP_APP: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ sha }}\"\n";

/// An Ingress that routes the environment's host to a Service `app` (the URL is reported once
/// one is in place).
pub const INGRESS_FOR_HOST: &str = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: app\nspec:\n  rules:\n  - host: \"{{ host }}\"\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service: {name: app, port: {number: 80}}\n";

/// [`install_template`] with more spec fields (`lifecycle`, `triggers`, merged into the spec)
/// and another manifest.
pub async fn install_template_with(
    client: &Client,
    namespace: &str,
    forge: &str,
    repository: &str,
    forge_api: Option<&str>,
    spec_extra: Value,
    manifest: &str,
) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "webhook"},
        "stringData": {"secret": SECRET, "token": "forge-token-for-tests"}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let _ = secrets.create(&PostParams::default(), &secret).await;
    let mut template = json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
        "metadata": {"name": format!("app-{forge}")},
        "spec": {
            "forge": {"kind": forge, "repository": repository,
                      "webhookSecretRef": {"name": "webhook", "key": "secret"},
                      "apiUrl": forge_api,
                      "tokenSecretRef": forge_api.map(|_| json!({"name": "webhook", "key": "token"}))},
            "manifests": {"inline": [{"name": "app.yaml", "template": manifest}]}
        }
    });
    for (key, value) in spec_extra.as_object().cloned().unwrap_or_default() {
        template["spec"][key] = value;
    }
    let template: PreviewTemplate = serde_json::from_value(template).unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

pub fn github_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture(&format!("github/{name}"))).unwrap()
}

pub fn json_fixture(path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(path)).unwrap()).unwrap()
}

pub async fn wait_ready_with_sha(
    environments: &Api<PreviewEnvironment>,
    name: &str,
    sha: &str,
) -> PreviewEnvironment {
    eventually(
        &format!("{name} Ready at {sha}"),
        Duration::from_secs(60),
        || {
            let (environments, name, sha) =
                (environments.clone(), name.to_string(), sha.to_string());
            async move {
                let environment = environments.get_opt(&name).await.ok()??;
                let status = environment.status.as_ref()?;
                (status.phase == Phase::Ready && status.deployed_sha.as_deref() == Some(&sha))
                    .then_some(environment)
            }
        },
    )
    .await
}

pub async fn wait_gone(
    client: &Client,
    environments: &Api<PreviewEnvironment>,
    name: &str,
    namespace: &str,
) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    eventually(
        &format!("{name} and namespace {namespace} to be deleted"),
        Duration::from_secs(60),
        || {
            let (environments, namespaces, name, namespace) = (
                environments.clone(),
                namespaces.clone(),
                name.to_string(),
                namespace.to_string(),
            );
            async move {
                let environment_gone = environments.get_opt(&name).await.ok()?.is_none();
                let namespace_gone = namespaces.get_opt(&namespace).await.ok()?.is_none();
                (environment_gone && namespace_gone).then_some(())
            }
        },
    )
    .await;
}

/// Waits until the namespace of environment `name` is gone, then asserts that its record is
/// still there, being removed: a removal while the forge fails (the record waits for it).
pub async fn wait_namespace_gone_record_waiting(
    client: &Client,
    environments: &Api<PreviewEnvironment>,
    name: &str,
    namespace: &str,
) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    eventually("the namespace to go", Duration::from_secs(60), || async {
        let gone = namespaces.get_opt(namespace).await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    let waiting = environments.get_opt(name).await.unwrap();
    assert!(
        waiting.is_some_and(|e| e.metadata.deletion_timestamp.is_some()),
        "the record waits for the forge"
    );
}

/// The name of the environment of PR `number`, once the intake has written it.
pub async fn environment_of_pr(environments: &Api<PreviewEnvironment>, number: u64) -> String {
    eventually(
        &format!("the environment of PR {number}"),
        Duration::from_secs(20),
        || async {
            environments
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.spec.source.pull_request == Some(number))
                .map(|e| kube::ResourceExt::name_any(&e))
        },
    )
    .await
}

/// `pull_request.opened.json` as PR `number` on branch `pr-<number>` (changed in a copy).
pub fn opened_for(number: u64, sha: &str) -> Vec<u8> {
    let mut delivery = json_fixture("github/pull_request.opened.json");
    delivery["number"] = number.into();
    delivery["pull_request"]["number"] = number.into();
    delivery["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
    delivery["pull_request"]["head"]["sha"] = sha.into();
    delivery.to_string().into_bytes()
}

/// PR `number` at `head`, changed by the forge at `changed` (`pull_request.updated_at`, which
/// orders deliveries): `opened.json` for `change` 0, else `synchronize.json`, in a copy on branch
/// `pr-<number>`.
pub fn pull_request_change(
    number: u64,
    change: u64,
    head: &str,
    changed: chrono::DateTime<chrono::Utc>,
) -> Vec<u8> {
    let file = if change == 0 {
        "github/pull_request.opened.json"
    } else {
        "github/pull_request.synchronize.json"
    };
    let mut body = json_fixture(file);
    body["number"] = number.into();
    body["pull_request"]["number"] = number.into();
    body["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
    body["pull_request"]["head"]["sha"] = head.into();
    body["pull_request"]["updated_at"] = changed.format("%Y-%m-%dT%H:%M:%SZ").to_string().into();
    body.to_string().into_bytes()
}

/// The sum of every series of metric `name` (all label values) in a `/metrics` text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The value of one series (`name{label="value",…}` exactly as Prometheus text writes it, or a
/// bare name) in a `/metrics` text.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// The repository of the GitHub fixtures.
pub const GITHUB_REPOSITORY: &str = "Codertocat/Hello-World";

/// Answers the collaborator-permission question: `maintainer` may write, `stranger` may read,
/// `nobody` is not a collaborator (404).
pub async fn with_permissions(forge: &MockServer) {
    for (user, status, body) in [
        (
            "maintainer",
            200,
            json!({"permission": "write", "role_name": "write"}),
        ),
        (
            "stranger",
            200,
            json!({"permission": "read", "role_name": "read"}),
        ),
        ("nobody", 404, json!({"message": "Not Found"})),
    ] {
        Mock::given(method("GET"))
            .and(path(format!(
                "/repos/{GITHUB_REPOSITORY}/collaborators/{user}/permission"
            )))
            .respond_with(ResponseTemplate::new(status).set_body_json(body))
            .mount(forge)
            .await;
    }
}

/// A comment by `user` saying `body` on pull request `number` (see the module docs).
pub fn comment_on(number: u64, user: &str, body: &str) -> Vec<u8> {
    let mut delivery = json_fixture("github/issue_comment.created.json");
    delivery["issue"]["number"] = number.into();
    delivery["issue"]["pull_request"] = json!({
        "url": format!("https://api.github.com/repos/{GITHUB_REPOSITORY}/pulls/{number}")
    });
    delivery["comment"]["user"]["login"] = user.into();
    delivery["comment"]["body"] = body.into();
    delivery.to_string().into_bytes()
}

/// Waits until some comment text previewd sent for PR `number` (created or edited) contains
/// `needle`.
pub async fn comment_says(forge: &MockServer, environment: &str, needle: &str) {
    let marker = "previewd:environment=";
    eventually(
        &format!("the PR comment of {environment} to say {needle:?}"),
        Duration::from_secs(30),
        || async {
            let requests = forge.received_requests().await.unwrap_or_default();
            requests
                .iter()
                .filter(|r| r.method.as_str() != "GET" && r.url.path().contains("/comments"))
                .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .filter_map(|b| b["body"].as_str().map(str::to_string))
                .any(|text| {
                    text.contains(marker) && text.contains(environment) && text.contains(needle)
                })
                .then_some(())
        },
    )
    .await
}

/// Waits until the server at `base` answers `/readyz` with a success (its caches are synced).
pub async fn wait_until_ready(http: &reqwest::Client, base: &str) {
    eventually(
        &format!("{base} to be ready"),
        Duration::from_secs(30),
        || {
            let (http, url) = (http.clone(), format!("{base}/readyz"));
            async move {
                http.get(url)
                    .send()
                    .await
                    .ok()?
                    .status()
                    .is_success()
                    .then_some(())
            }
        },
    )
    .await;
}
