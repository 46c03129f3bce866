//! A local stand-in for the GitHub and GitLab APIs, for the sandbox: it answers the calls
//! previewd makes (PR comments and MR notes, commit statuses, GitHub deployments, GitLab
//! environments and deployments, GitHub App installation tokens, permission checks), remembers comments so that previewd finds and edits its own, and reports every
//! comment and status it receives (printed by the sandbox, rendered by the demo).
//!
//! GitHub paths (`/repos/...`) and GitLab paths (`/api/v4/...`) do not overlap, so one server
//! on one port serves both; a template's `forge.apiUrl` points at it.
//!
//! Deliveries can reach previewd through it ([`super::forge_relay`]); then it knows which pull
//! requests are open and which branches exist, and answers the sweep's lists of the
//! repositories it tracks from that (others: 503, so the sweep removes nothing for them).
//! Repository contents are served from [`Repositories`] ([`super::forge_contents`]): the
//! examples' chart and overlay, and the folders named with `--repository`; others are 404.
//! Every caller has write access, so anyone may use comment commands in the sandbox.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::SandboxError;
use super::forge_contents;
use super::forge_relay::{self, KnownState};
use super::repositories::Repositories;
use crate::forge::ForgeKind::{self, Github, Gitlab};

/// One thing previewd sent to the forge.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    /// A PR comment or MR note, created (`edited: false`) or edited, with its full text.
    Comment {
        forge: &'static str,
        repository: String,
        number: u64,
        edited: bool,
        body: String,
    },
    /// A commit status: state and description.
    CommitStatus {
        forge: &'static str,
        repository: String,
        sha: String,
        state: String,
        description: String,
    },
    /// A deployment status (GitHub: state and the environment URL; GitLab: a deployment's
    /// state, or `stopped` for its environment).
    DeploymentStatus {
        forge: &'static str,
        repository: String,
        state: String,
        url: String,
    },
}

impl std::fmt::Display for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Received::Comment {
                forge,
                repository,
                number,
                edited,
                body,
            } => {
                let (what, sign) = match *forge {
                    "gitlab" => ("MR note", '!'),
                    _ => ("PR comment", '#'),
                };
                let verb = if *edited { "edited" } else { "created" };
                writeln!(f, "{forge} {repository}{sign}{number}: {what} {verb}:")?;
                for line in body.lines() {
                    writeln!(f, "    | {line}")?;
                }
                Ok(())
            }
            Received::CommitStatus {
                forge,
                repository,
                sha,
                state,
                description,
            } => write!(
                f,
                "{forge} {repository}@{}: commit status {state}: {description}",
                sha.get(..7).unwrap_or(sha)
            ),
            Received::DeploymentStatus {
                forge,
                repository,
                state,
                url,
            } => write!(f, "{forge} {repository}: deployment {state} {url}"),
        }
    }
}

#[derive(Default)]
struct Records {
    next_id: u64,
    /// Comment id → (forge, repository, PR/MR number, body).
    comments: BTreeMap<u64, (&'static str, String, u64, String)>,
    received: Vec<Received>,
    /// Open PRs/MRs and branches, as the relayed deliveries told.
    known: KnownState,
}

struct Shared {
    records: Mutex<Records>,
    /// Every `Received`, to whoever listens (the sandbox prints, the demo renders).
    events: tokio::sync::broadcast::Sender<Received>,
    /// previewd's HTTP address, where deliveries are relayed (none: no relay).
    previewd: Option<String>,
    http: reqwest::Client,
    repositories: Arc<Repositories>,
}

/// The running stand-in. Stops when dropped.
pub struct ForgeStandIn {
    address: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ForgeStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ForgeStandIn {
    /// Listens on a free loopback port, relaying no deliveries and tracking no repository.
    pub async fn start() -> Result<Self, SandboxError> {
        Self::listen(None, Repositories::default()).await
    }

    /// Listens on a free loopback port, serving `repositories`, relaying no deliveries.
    pub async fn serving(repositories: Repositories) -> Result<Self, SandboxError> {
        Self::listen(None, repositories).await
    }

    /// Listens on a free loopback port and relays deliveries to previewd at `previewd_base`
    /// (`http://host:port`).
    pub async fn relaying_to(
        previewd_base: &str,
        repositories: Repositories,
    ) -> Result<Self, SandboxError> {
        Self::listen(Some(previewd_base.to_string()), repositories).await
    }

    async fn listen(
        previewd: Option<String>,
        repositories: Repositories,
    ) -> Result<Self, SandboxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SandboxError::Process(format!("forge stand-in: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| SandboxError::Process(format!("forge stand-in: {e}")))?;
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let shared = Arc::new(Shared {
            records: Mutex::new(Records {
                next_id: 1000,
                ..Default::default()
            }),
            events,
            previewd,
            http: reqwest::Client::new(),
            repositories: Arc::new(repositories),
        });
        let app = Router::new()
            .route("/hooks/{forge}", post(relay))
            // previewd's own body limit decides, not the relay's.
            .layer(DefaultBodyLimit::disable())
            .fallback(answer)
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            shared,
            task,
        })
    }

    /// The URL to put in a template's `forge.apiUrl` (GitHub and GitLab alike).
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Where the forge named `forge` (`github`, `gitlab`) sends its deliveries: relayed to
    /// previewd's `/webhooks/{forge}`.
    pub fn hook_url(&self, forge: &str) -> String {
        format!("{}/hooks/{forge}", self.url())
    }

    /// Answers the lists of open PRs and branches of `repository` from the deliveries relayed.
    pub fn track(&self, forge: ForgeKind, repository: &str) {
        self.shared
            .records
            .lock()
            .expect("stand-in records")
            .known
            .track(forge, repository);
    }

    /// Learns what a delivery of `forge` says (open PRs, branches) without passing it on: the
    /// state the examples' environments are in before any delivery.
    pub fn learn(&self, forge: ForgeKind, event_type: &str, body: &str) {
        let mut records = self.shared.records.lock().expect("stand-in records");
        records.known.learn(forge, event_type, body.as_bytes());
    }

    /// Everything received from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Received> {
        self.shared.events.subscribe()
    }

    /// Everything received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.shared
            .records
            .lock()
            .expect("stand-in records")
            .received
            .clone()
    }
}

fn json_answer(status: StatusCode, body: Value) -> Response {
    // Rate-limit headers as the real forges send them, so the budget metric has a value.
    (
        status,
        [
            ("x-ratelimit-remaining", "4999"),
            ("ratelimit-remaining", "1999"),
        ],
        axum::Json(body),
    )
        .into_response()
}

/// A field of a JSON body or of a form-encoded one (the gitlab crate sends forms).
fn field(body: &[u8], name: &str) -> String {
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        return json[name].as_str().unwrap_or_default().to_string();
    }
    url::form_urlencoded::parse(body)
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// `POST /hooks/{forge}`: learns what the delivery says, then passes it on to previewd.
async fn relay(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (forge, Some(previewd)) = (
        match name.as_str() {
            "github" => Github,
            "gitlab" => Gitlab,
            _ => return json_answer(StatusCode::NOT_FOUND, json!({"message": "Not Found"})),
        },
        &shared.previewd,
    ) else {
        return json_answer(StatusCode::NOT_FOUND, json!({"message": "no relay"}));
    };
    let event_type = forge_relay::event_type(forge, &headers);
    shared
        .records
        .lock()
        .expect("stand-in records")
        .known
        .learn(forge, &event_type, &body);
    let url = format!("{previewd}/webhooks/{name}");
    forge_relay::pass_on(&shared.http, &url, &headers, body).await
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // GitLab project ids arrive URL-encoded (`gitlabhq%2Fgitlab-test`); split first, decode each.
    let segments: Vec<String> = uri
        .path()
        .trim_matches('/')
        .split('/')
        .map(|s| {
            // Percent-decoding via the form decoder: a path's `+` is literal, so escape it.
            url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let query = uri.query();
    let contents =
        forge_contents::answer(&shared.repositories, &method, &segments, query, &headers);
    if let Some(contents) = contents.await {
        return contents;
    }
    let page = forge_relay::requested_page(uri.query());
    let mut records = shared.records.lock().expect("stand-in records");
    let (status, answer, received) = route(&mut records, &method, &segments, page, &body);
    if let Some(received) = received {
        records.received.push(received.clone());
        let _ = shared.events.send(received);
    }
    json_answer(status, answer)
}

type Routed = (StatusCode, Value, Option<Received>);

fn route(records: &mut Records, method: &Method, path: &[&str], page: u64, body: &[u8]) -> Routed {
    match path {
        ["repos", owner, name, rest @ ..] => {
            let repository = format!("{owner}/{name}");
            github(records, method, &repository, rest, page, body)
        }
        ["api", "v4", rest @ ..] => gitlab(records, method, rest, page, body),
        ["app", "installations", _, "access_tokens"] if method == Method::POST => {
            installation_token(records)
        }
        _ => not_found(),
    }
}

/// A GitHub App installation token (for a template with `forge.githubApp`): a new one each
/// time, valid an hour. The stand-in does not check the App's JWT (it knows no App's key);
/// `tests/integration/forge_workflow.rs` does, with a key pair of its own.
fn installation_token(records: &mut Records) -> Routed {
    records.next_id += 1;
    let expires_at = chrono::Utc::now() + chrono::TimeDelta::hours(1);
    let token = json!({"token": format!("ghs_sandbox{}", records.next_id),
        "expires_at": expires_at.to_rfc3339()});
    (StatusCode::CREATED, token, None)
}

fn not_found() -> Routed {
    (StatusCode::NOT_FOUND, json!({"message": "Not Found"}), None)
}

/// A list the stand-in keeps (a tracked repository), or 503 for one it does not.
fn listed(list: Option<Value>) -> Routed {
    match list {
        Some(list) => (StatusCode::OK, list, None),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"message": "the sandbox forge stand-in does not track this repository's pull requests or branches"}),
            None,
        ),
    }
}

fn comments_of(records: &Records, forge: &str, repository: &str, number: u64) -> Value {
    Value::Array(
        records
            .comments
            .iter()
            .filter(|(_, (f, r, n, _))| *f == forge && r == repository && *n == number)
            .map(|(id, (_, _, _, body))| json!({"id": id, "body": body}))
            .collect(),
    )
}

fn create_comment(
    records: &mut Records,
    forge: &'static str,
    repository: &str,
    number: u64,
    body: String,
) -> Routed {
    records.next_id += 1;
    let id = records.next_id;
    records
        .comments
        .insert(id, (forge, repository.to_string(), number, body.clone()));
    let received = Received::Comment {
        forge,
        repository: repository.to_string(),
        number,
        edited: false,
        body: body.clone(),
    };
    (
        StatusCode::CREATED,
        json!({"id": id, "body": body}),
        Some(received),
    )
}

fn edit_comment(records: &mut Records, id: u64, body: String) -> Routed {
    let Some((forge, repository, number, text)) = records.comments.get_mut(&id) else {
        return not_found();
    };
    *text = body.clone();
    let received = Received::Comment {
        forge,
        repository: repository.clone(),
        number: *number,
        edited: true,
        body: body.clone(),
    };
    (
        StatusCode::OK,
        json!({"id": id, "body": body}),
        Some(received),
    )
}

fn github(
    records: &mut Records,
    method: &Method,
    repository: &str,
    rest: &[&str],
    page: u64,
    body: &[u8],
) -> Routed {
    let number = |text: &str| text.parse::<u64>().ok();
    match (method.as_str(), rest) {
        ("GET", ["issues", n, "comments"]) => match number(n) {
            Some(n) => (
                StatusCode::OK,
                comments_of(records, "github", repository, n),
                None,
            ),
            None => not_found(),
        },
        ("POST", ["issues", n, "comments"]) => match number(n) {
            Some(n) => create_comment(records, "github", repository, n, field(body, "body")),
            None => not_found(),
        },
        ("PATCH", ["issues", "comments", id]) => match number(id) {
            Some(id) => edit_comment(records, id, field(body, "body")),
            None => not_found(),
        },
        ("POST", ["statuses", sha]) => (
            StatusCode::CREATED,
            json!({"id": 1}),
            Some(Received::CommitStatus {
                forge: "github",
                repository: repository.to_string(),
                sha: sha.to_string(),
                state: field(body, "state"),
                description: field(body, "description"),
            }),
        ),
        ("POST", ["deployments"]) => {
            records.next_id += 1;
            (StatusCode::CREATED, json!({"id": records.next_id}), None)
        }
        ("POST", ["deployments", _, "statuses"]) => (
            StatusCode::CREATED,
            json!({"id": 1}),
            Some(Received::DeploymentStatus {
                forge: "github",
                repository: repository.to_string(),
                state: field(body, "state"),
                url: field(body, "environment_url"),
            }),
        ),
        ("GET", ["installation"]) => (StatusCode::OK, json!({"id": 1}), None),
        ("GET", ["collaborators", _, "permission"]) => (
            StatusCode::OK,
            json!({"permission": "admin", "role_name": "admin"}),
            None,
        ),
        ("GET", ["pulls"]) => listed(records.known.open_list(Github, repository, page)),
        ("GET", ["branches"]) => listed(records.known.branch_list(Github, repository, page)),
        _ => not_found(),
    }
}

fn gitlab(records: &mut Records, method: &Method, rest: &[&str], page: u64, body: &[u8]) -> Routed {
    let number = |text: &str| text.parse::<u64>().ok();
    match (method.as_str(), rest) {
        ("GET", ["user"]) => (
            StatusCode::OK,
            json!({"id": 1, "username": "previewd-sandbox"}),
            None,
        ),
        ("GET", ["projects", project, "merge_requests", n, "notes"]) => match number(n) {
            Some(n) => (
                StatusCode::OK,
                comments_of(records, "gitlab", project, n),
                None,
            ),
            None => not_found(),
        },
        ("POST", ["projects", project, "merge_requests", n, "notes"]) => match number(n) {
            Some(n) => create_comment(records, "gitlab", project, n, field(body, "body")),
            None => not_found(),
        },
        ("PUT", ["projects", _, "merge_requests", _, "notes", id]) => match number(id) {
            Some(id) => edit_comment(records, id, field(body, "body")),
            None => not_found(),
        },
        ("POST", ["projects", project, "statuses", sha]) => (
            StatusCode::CREATED,
            json!({"id": 1}),
            Some(Received::CommitStatus {
                forge: "gitlab",
                repository: project.to_string(),
                sha: sha.to_string(),
                state: field(body, "state"),
                description: field(body, "description"),
            }),
        ),
        ("GET", ["projects", _, "members", "all", _]) => (
            StatusCode::OK,
            json!({"id": 1, "username": "anyone", "access_level": 40}),
            None,
        ),
        ("GET", ["projects", _, "environments"]) => (StatusCode::OK, json!([]), None),
        ("POST", ["projects", _, "environments"]) => {
            records.next_id += 1;
            let name = field(body, "name");
            (
                StatusCode::CREATED,
                json!({"id": records.next_id, "name": name}),
                None,
            )
        }
        ("PUT", ["projects", _, "environments", _]) => (StatusCode::OK, json!({"id": 1}), None),
        ("POST", ["projects", project, "environments", _, "stop"]) => {
            gitlab_deployment(project, "stopped", String::new())
        }
        ("POST", ["projects", project, "deployments"]) => {
            records.next_id += 1;
            let mut routed = gitlab_deployment(project, &field(body, "status"), field(body, "sha"));
            routed.1 = json!({"id": records.next_id});
            routed
        }
        ("PUT", ["projects", project, "deployments", _]) => {
            gitlab_deployment(project, &field(body, "status"), String::new())
        }
        ("GET", ["projects", project, "merge_requests"]) => {
            listed(records.known.open_list(Gitlab, project, page))
        }
        ("GET", ["projects", project, "repository", "branches"]) => {
            listed(records.known.branch_list(Gitlab, project, page))
        }
        _ => not_found(),
    }
}

/// A GitLab deployment's (or environment's) new state, as received; a new deployment names
/// its commit.
fn gitlab_deployment(project: &str, state: &str, sha: String) -> Routed {
    let state = match sha.get(..7) {
        Some(short) => format!("{state} of {short}"),
        None => state.to_string(),
    };
    let received = Received::DeploymentStatus {
        forge: "gitlab",
        repository: project.to_string(),
        state,
        url: String::new(),
    };
    (StatusCode::OK, json!({"id": 1}), Some(received))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(records: &mut Records, method: Method, path: &str, body: &str) -> Routed {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        route(records, &method, &segments, 1, body.as_bytes())
    }

    #[test]
    fn a_comment_is_created_found_and_edited_per_pull_request() {
        let mut records = Records::default();
        let (status, created, received) = call(
            &mut records,
            Method::POST,
            "/repos/o/r/issues/2/comments",
            r#"{"body":"hello"}"#,
        );
        assert_eq!(status, StatusCode::CREATED);
        assert!(matches!(
            received,
            Some(Received::Comment { edited: false, .. })
        ));
        let id = created["id"].as_u64().unwrap();
        let (_, listed, _) = call(
            &mut records,
            Method::GET,
            "/repos/o/r/issues/2/comments",
            "",
        );
        assert_eq!(listed, json!([{"id": id, "body": "hello"}]));
        let (_, other, _) = call(
            &mut records,
            Method::GET,
            "/repos/o/r/issues/3/comments",
            "",
        );
        assert_eq!(other, json!([]));
        let (status, _, received) = call(
            &mut records,
            Method::PATCH,
            &format!("/repos/o/r/issues/comments/{id}"),
            r#"{"body":"ready"}"#,
        );
        assert_eq!(status, StatusCode::OK);
        assert!(
            matches!(received, Some(Received::Comment { edited: true, ref body, .. }) if body == "ready")
        );
    }

    #[test]
    fn a_github_app_finds_its_installation_and_gets_a_new_token_each_time() {
        let mut records = Records::default();
        let (status, installation, _) =
            call(&mut records, Method::GET, "/repos/o/r/installation", "");
        assert_eq!((status, installation), (StatusCode::OK, json!({"id": 1})));
        let mint = |records: &mut Records| {
            let (status, token, _) = call(
                records,
                Method::POST,
                "/app/installations/1/access_tokens",
                r#"{"repositories":["r"]}"#,
            );
            assert_eq!(status, StatusCode::CREATED);
            assert!(token["expires_at"].as_str().is_some());
            token["token"].as_str().unwrap_or_default().to_string()
        };
        let first = mint(&mut records);
        assert!(first.starts_with("ghs_sandbox"), "{first}");
        assert_ne!(first, mint(&mut records));
    }

    #[test]
    fn gitlab_environments_and_deployments_are_answered_and_reported() {
        let mut records = Records::default();
        let at = |rest: &[&'static str]| {
            let mut segments = vec!["api", "v4", "projects", "g/p"];
            segments.extend_from_slice(rest);
            segments
        };
        let (status, none, _) = route(&mut records, &Method::GET, &at(&["environments"]), 1, b"");
        assert_eq!((status, none), (StatusCode::OK, json!([])));
        let body = b"name=preview%2Fns%2Fapp-mr-1&tier=development";
        let (status, created, _) =
            route(&mut records, &Method::POST, &at(&["environments"]), 1, body);
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(created["name"], "preview/ns/app-mr-1");
        let body = b"environment=preview%2Fns%2Fapp-mr-1&sha=da1560886d4f094c&status=running";
        let (_, deployment, received) =
            route(&mut records, &Method::POST, &at(&["deployments"]), 1, body);
        assert!(deployment["id"].as_u64().is_some());
        let said = received.map(|r| r.to_string()).unwrap_or_default();
        assert_eq!(said, "gitlab g/p: deployment running of da15608 ");
        let stop = at(&["environments", "1", "stop"]);
        let (_, _, received) = route(&mut records, &Method::POST, &stop, 1, b"");
        assert!(
            matches!(received, Some(Received::DeploymentStatus { ref state, .. }) if state == "stopped")
        );
    }

    #[test]
    fn gitlab_notes_take_form_bodies_and_lists_hold_what_deliveries_said() {
        let mut records = Records::default();
        let (status, _, received) = call(
            &mut records,
            Method::POST,
            "/api/v4/projects/g/p/merge_requests/1/notes",
            "",
        );
        // The project id is one (decoded) segment in real requests; two segments do not match.
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(received.is_none());
        let segments = [
            "api",
            "v4",
            "projects",
            "g/p",
            "merge_requests",
            "1",
            "notes",
        ];
        let (status, _, received) = route(
            &mut records,
            &Method::POST,
            &segments,
            1,
            b"body=Preview+ready",
        );
        assert_eq!(status, StatusCode::CREATED);
        assert!(
            matches!(received, Some(Received::Comment { ref body, .. }) if body == "Preview ready")
        );
        let (status, _, _) = call(&mut records, Method::GET, "/repos/o/r/pulls", "");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "not tracked");
        records.known.track(Gitlab, "gitlabhq/gitlab-test");
        records.known.learn(
            Gitlab,
            "Merge Request Hook",
            include_bytes!("deliveries/gitlab.merge_request.json"),
        );
        let listed = [
            "api",
            "v4",
            "projects",
            "gitlabhq/gitlab-test",
            "merge_requests",
        ];
        let (status, open, _) = route(&mut records, &Method::GET, &listed, 1, b"");
        assert_eq!((status, open), (StatusCode::OK, json!([{"iid": 1}])));
    }
}
