//! Forge API clients: octocrab for GitHub, the `gitlab` crate for GitLab, behind one
//! [`ForgeClient`] with the few calls previewd makes (find/create/edit its comment, commit
//! status, GitHub deployment status).
//!
//! Every client has a [`Gate`]: after a rate-limit answer (403/429 with `Retry-After` or an
//! exhausted `X-RateLimit-Remaining`) or a run of failures (5xx, transport errors) it refuses
//! calls locally until the wait is over, so an outage or a spent budget is not hammered. The
//! remaining budget from the forge's headers is exported as
//! `previewd_forge_rate_limit_remaining`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::comment::CommitState;
use crate::forge::metrics::ForgeMetrics;
use crate::model::crd::ForgeKind;

#[derive(Debug, thiserror::Error)]
pub enum ForgeApiError {
    #[error("{operation}: the forge answered {status}: {message}")]
    Http {
        operation: &'static str,
        status: u16,
        message: String,
    },
    #[error("{operation}: rate-limited by the forge; next call in {wait:?}")]
    RateLimited {
        operation: &'static str,
        wait: Duration,
    },
    #[error("{operation}: not sent, the forge failed recently; next call in {wait:?}")]
    BackingOff {
        operation: &'static str,
        wait: Duration,
    },
    #[error("{operation}: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },
    #[error("the forge API URL {0:?} is not a valid URL")]
    BadUrl(String),
}

/// Refuses calls while a rate limit or a failure backoff is running.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    not_before: Option<Instant>,
    rate_limited: bool,
    failures: u32,
}

/// Longest wait after failures.
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(300);

/// The longest previewd waits for a forge's answer. A forge that accepts connections and never
/// answers must not hold a reconcile (and the environment's status) hostage; after a timeout
/// the gate backs off like after any failure.
pub const FORGE_TIMEOUT: Duration = Duration::from_secs(10);
const FORGE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Gate {
    fn check(&self, operation: &'static str) -> Result<(), ForgeApiError> {
        let state = self.state.lock().expect("gate");
        match state.not_before {
            Some(at) if at > Instant::now() => {
                let wait = at - Instant::now();
                Err(if state.rate_limited {
                    ForgeApiError::RateLimited { operation, wait }
                } else {
                    ForgeApiError::BackingOff { operation, wait }
                })
            }
            _ => Ok(()),
        }
    }

    fn success(&self) {
        let mut state = self.state.lock().expect("gate");
        state.failures = 0;
        state.not_before = None;
    }

    fn failure(&self) {
        let mut state = self.state.lock().expect("gate");
        state.failures += 1;
        let wait = Duration::from_secs(1u64 << state.failures.min(9)).min(MAX_FAILURE_BACKOFF);
        state.not_before = Some(Instant::now() + wait);
        state.rate_limited = false;
    }

    fn rate_limited(&self, wait: Duration) {
        let mut state = self.state.lock().expect("gate");
        state.not_before = Some(Instant::now() + wait);
        state.rate_limited = true;
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// How long a rate-limited answer asks us to wait: `Retry-After`, else until
/// `X-RateLimit-Reset` (epoch seconds), else a minute.
fn rate_limit_wait(headers: &HeaderMap) -> Duration {
    if let Some(seconds) = header_u64(headers, "retry-after") {
        return Duration::from_secs(seconds);
    }
    let reset = header_u64(headers, "x-ratelimit-reset").or(header_u64(headers, "ratelimit-reset"));
    if let Some(reset) = reset {
        let now = chrono::Utc::now().timestamp().max(0) as u64;
        return Duration::from_secs(reset.saturating_sub(now).max(1));
    }
    Duration::from_secs(60)
}

/// Reads the budget headers of any answer; true if the answer is a rate-limit refusal.
fn observe_rate_limit(
    forge: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    metrics: &ForgeMetrics,
    gate: &Gate,
) -> bool {
    let remaining =
        header_u64(headers, "x-ratelimit-remaining").or(header_u64(headers, "ratelimit-remaining"));
    if let Some(remaining) = remaining {
        metrics
            .rate_limit_remaining
            .with_label_values(&[forge])
            .set(remaining as i64);
    }
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN
            && (remaining == Some(0) || headers.contains_key("retry-after")));
    if limited {
        gate.rate_limited(rate_limit_wait(headers));
    }
    limited
}

/// A client for one forge API URL and token.
pub enum ForgeClient {
    Github(GithubApi),
    Gitlab(GitlabApi),
}

/// A GitHub deployment status word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeploymentState {
    InProgress,
    Success,
    Failure,
    Inactive,
}

impl ForgeClient {
    /// The id of the comment on PR/MR `number` whose text starts with `marker`.
    pub async fn find_comment(
        &self,
        repository: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.find_comment(repository, number, marker).await,
            ForgeClient::Gitlab(api) => api.find_comment(repository, number, marker).await,
        }
    }

    pub async fn create_comment(
        &self,
        repository: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.create_comment(repository, number, body).await,
            ForgeClient::Gitlab(api) => api.create_comment(repository, number, body).await,
        }
    }

    pub async fn edit_comment(
        &self,
        repository: &str,
        number: u64,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.edit_comment(repository, id, body).await,
            ForgeClient::Gitlab(api) => api.edit_comment(repository, number, id, body).await,
        }
    }

    /// The YAML files (`.yaml`, `.yml`) directly in folder `path` of the repository at commit
    /// `sha`, as (file name, text), sorted by name; `path` may also name one file.
    pub async fn read_manifests(
        &self,
        repository: &str,
        path: &str,
        sha: &str,
    ) -> Result<Vec<(String, String)>, ForgeApiError> {
        let mut files = match self {
            ForgeClient::Github(api) => api.read_manifests(repository, path, sha).await?,
            ForgeClient::Gitlab(api) => api.read_manifests(repository, path, sha).await?,
        };
        files.sort();
        Ok(files)
    }

    /// Numbers of the open pull/merge requests of `repository` (one list call per page).
    pub async fn open_pull_requests(
        &self,
        repository: &str,
    ) -> Result<HashSet<u64>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                let pages = api
                    .list_all(
                        "list_pull_requests",
                        &format!("/repos/{repository}/pulls?state=open"),
                    )
                    .await?;
                Ok(pages
                    .iter()
                    .filter_map(|pr| pr["number"].as_u64())
                    .collect())
            }
            ForgeClient::Gitlab(api) => api.open_merge_requests(repository).await,
        }
    }

    /// Names of the branches of `repository` (one list call per page).
    pub async fn branches(&self, repository: &str) -> Result<HashSet<String>, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                let pages = api
                    .list_all("list_branches", &format!("/repos/{repository}/branches"))
                    .await?;
                Ok(pages
                    .iter()
                    .filter_map(|b| b["name"].as_str().map(str::to_string))
                    .collect())
            }
            ForgeClient::Gitlab(api) => api.branches(repository).await,
        }
    }

    /// Whether `user` (GitLab: the user with id `user_id`) may write to `repository`: GitHub
    /// `write`, `maintain` or `admin`; GitLab Developer (30) or above. Not a member: `false`.
    pub async fn write_access(
        &self,
        repository: &str,
        user: &str,
        user_id: Option<u64>,
    ) -> Result<bool, ForgeApiError> {
        match self {
            ForgeClient::Github(api) => api.write_access(repository, user).await,
            ForgeClient::Gitlab(api) => match user_id {
                Some(id) => api.write_access(repository, id).await,
                None => Ok(false),
            },
        }
    }

    pub async fn commit_status(
        &self,
        repository: &str,
        sha: &str,
        state: CommitState,
        context: &str,
        target_url: &str,
        description: &str,
    ) -> Result<(), ForgeApiError> {
        match self {
            ForgeClient::Github(api) => {
                api.commit_status(repository, sha, state, context, target_url, description)
                    .await
            }
            ForgeClient::Gitlab(api) => {
                api.commit_status(repository, sha, state, context, target_url, description)
                    .await
            }
        }
    }
}

fn is_yaml(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

/// GitHub's contents API returns base64 with line breaks.
fn decode_base64_content(file: &Value) -> Option<String> {
    use base64::Engine;
    let content: String = file["content"]
        .as_str()?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content)
        .ok()?;
    String::from_utf8(bytes).ok()
}

// ---------------------------------------------------------------------------------------------
// GitHub
// ---------------------------------------------------------------------------------------------

/// One GitHub answer, past the shared checks.
struct GithubAnswer {
    not_modified: bool,
    etag: Option<String>,
    json: Value,
}

pub struct GithubApi {
    octocrab: octocrab::Octocrab,
    gate: Gate,
    metrics: ForgeMetrics,
    /// Last answer of each list URL with its ETag: a `304 Not Modified` costs no rate limit.
    etags: Mutex<HashMap<String, (String, Value)>>,
}

impl GithubApi {
    pub fn new(
        api_url: Option<&str>,
        token: String,
        metrics: ForgeMetrics,
    ) -> Result<Self, ForgeApiError> {
        let api_url = api_url.unwrap_or("https://api.github.com");
        let octocrab = octocrab::Octocrab::builder()
            .base_uri(api_url)
            .map_err(|_| ForgeApiError::BadUrl(api_url.to_string()))?
            .personal_token(token)
            .set_connect_timeout(Some(FORGE_CONNECT_TIMEOUT))
            .set_read_timeout(Some(FORGE_TIMEOUT))
            .set_write_timeout(Some(FORGE_TIMEOUT))
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "build client",
                message: e.to_string(),
            })?;
        Ok(Self {
            octocrab,
            gate: Gate::default(),
            metrics,
            etags: Mutex::new(HashMap::new()),
        })
    }

    async fn request(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ForgeApiError> {
        Ok(self.send(operation, method, path, body, None).await?.json)
    }

    /// Sends one request with the accounting every call shares: the gate, the rate-limit
    /// headers, the metric, and errors for anything but 2xx and `304 Not Modified`.
    async fn send(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_none_match: Option<&str>,
    ) -> Result<GithubAnswer, ForgeApiError> {
        self.gate.check(operation)?;
        let count = |outcome: &str| {
            self.metrics
                .requests
                .with_label_values(&["github", operation, outcome])
                .inc();
        };
        let sent = match method {
            Method::POST => self.octocrab._post(path, body).await,
            Method::PATCH => self.octocrab._patch(path, body).await,
            _ => {
                let mut headers = HeaderMap::new();
                if let Some(value) = if_none_match.and_then(|etag| etag.parse().ok()) {
                    headers.insert(http::header::IF_NONE_MATCH, value);
                }
                self.octocrab._get_with_headers(path, Some(headers)).await
            }
        };
        let response = sent.map_err(|e| {
            self.gate.failure();
            count("error");
            ForgeApiError::Transport {
                operation,
                message: e.to_string(),
            }
        })?;
        let status = response.status();
        if observe_rate_limit(
            "github",
            status,
            response.headers(),
            &self.metrics,
            &self.gate,
        ) {
            count("rate_limited");
            return Err(ForgeApiError::RateLimited {
                operation,
                wait: rate_limit_wait(response.headers()),
            });
        }
        let etag = response
            .headers()
            .get(http::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = self
            .octocrab
            .body_to_string(response)
            .await
            .unwrap_or_default();
        if !status.is_success() && status != StatusCode::NOT_MODIFIED {
            if status.is_server_error() {
                self.gate.failure();
            }
            count("error");
            return Err(ForgeApiError::Http {
                operation,
                status: status.as_u16(),
                message: text.chars().take(300).collect(),
            });
        }
        self.gate.success();
        count(if status == StatusCode::NOT_MODIFIED {
            "not_modified"
        } else {
            "ok"
        });
        Ok(GithubAnswer {
            not_modified: status == StatusCode::NOT_MODIFIED,
            etag,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
        })
    }

    /// A conditional GET (`If-None-Match` with the ETag of the last answer): an unchanged
    /// answer is a `304`, which costs no rate limit.
    async fn get_conditional(
        &self,
        operation: &'static str,
        path: &str,
    ) -> Result<Value, ForgeApiError> {
        let cached = self.etags.lock().expect("etags").get(path).cloned();
        let etag = cached.as_ref().map(|(etag, _)| etag.as_str());
        let answer = self.send(operation, Method::GET, path, None, etag).await?;
        if answer.not_modified
            && let Some((_, value)) = cached
        {
            return Ok(value);
        }
        if let Some(etag) = answer.etag {
            self.etags
                .lock()
                .expect("etags")
                .insert(path.to_string(), (etag, answer.json.clone()));
        }
        Ok(answer.json)
    }

    /// Every item of a paginated list (100 per page, conditional requests, at most 50 pages).
    async fn list_all(
        &self,
        operation: &'static str,
        path: &str,
    ) -> Result<Vec<Value>, ForgeApiError> {
        let mut items = Vec::new();
        for page in 1..=50 {
            let separator = if path.contains('?') { '&' } else { '?' };
            let answer = self
                .get_conditional(
                    operation,
                    &format!("{path}{separator}per_page=100&page={page}"),
                )
                .await?;
            let batch = answer.as_array().cloned().unwrap_or_default();
            let full = batch.len() == 100;
            items.extend(batch);
            if !full {
                break;
            }
        }
        Ok(items)
    }

    async fn find_comment(
        &self,
        repository: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        // Bounded: 10 pages of 100 comments; previewd's comment is among the first anyway.
        for page in 1..=10 {
            let path =
                format!("/repos/{repository}/issues/{number}/comments?per_page=100&page={page}");
            let comments = self
                .request("list_comments", Method::GET, &path, None)
                .await?;
            let comments = comments.as_array().cloned().unwrap_or_default();
            if let Some(found) = comments
                .iter()
                .find(|c| c["body"].as_str().is_some_and(|b| b.starts_with(marker)))
            {
                return Ok(found["id"].as_u64());
            }
            if comments.len() < 100 {
                break;
            }
        }
        Ok(None)
    }

    async fn create_comment(
        &self,
        repository: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        let path = format!("/repos/{repository}/issues/{number}/comments");
        let created = self
            .request(
                "create_comment",
                Method::POST,
                &path,
                Some(&json!({ "body": body })),
            )
            .await?;
        created["id"].as_u64().ok_or(ForgeApiError::Http {
            operation: "create_comment",
            status: 200,
            message: "the answer has no comment id".into(),
        })
    }

    async fn edit_comment(
        &self,
        repository: &str,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        let path = format!("/repos/{repository}/issues/comments/{id}");
        self.request(
            "edit_comment",
            Method::PATCH,
            &path,
            Some(&json!({ "body": body })),
        )
        .await
        .map(|_| ())
    }

    async fn commit_status(
        &self,
        repository: &str,
        sha: &str,
        state: CommitState,
        context: &str,
        target_url: &str,
        description: &str,
    ) -> Result<(), ForgeApiError> {
        let state = match state {
            CommitState::Pending | CommitState::Running => "pending",
            CommitState::Success => "success",
            CommitState::Failure => "failure",
        };
        let path = format!("/repos/{repository}/statuses/{sha}");
        let body = json!({ "state": state, "target_url": target_url, "description": description, "context": context });
        self.request("commit_status", Method::POST, &path, Some(&body))
            .await
            .map(|_| ())
    }

    async fn read_manifests(
        &self,
        repository: &str,
        path: &str,
        sha: &str,
    ) -> Result<Vec<(String, String)>, ForgeApiError> {
        let path = path.trim_matches('/');
        let listing = self
            .request(
                "read_manifests",
                Method::GET,
                &format!("/repos/{repository}/contents/{path}?ref={sha}"),
                None,
            )
            .await?;
        // A folder lists its entries; a file comes back as one object with its content.
        let entries = match listing {
            Value::Array(entries) => entries,
            file => vec![file],
        };
        let mut files = Vec::new();
        for entry in entries
            .iter()
            .filter(|e| e["type"] == "file" && is_yaml(e["name"].as_str().unwrap_or_default()))
        {
            let name = entry["name"].as_str().unwrap_or_default().to_string();
            let file = if entry.get("content").is_some() {
                entry.clone()
            } else {
                let file_path = entry["path"].as_str().unwrap_or_default();
                self.request(
                    "read_manifests",
                    Method::GET,
                    &format!("/repos/{repository}/contents/{file_path}?ref={sha}"),
                    None,
                )
                .await?
            };
            files.push((
                name,
                decode_base64_content(&file).ok_or(ForgeApiError::Http {
                    operation: "read_manifests",
                    status: 200,
                    message: format!("{path}: the file content is not base64"),
                })?,
            ));
        }
        Ok(files)
    }

    async fn write_access(&self, repository: &str, user: &str) -> Result<bool, ForgeApiError> {
        // Logins are letters, digits and hyphens (apps add `[bot]`); anything else is not a
        // GitHub user and must not reach the URL.
        let plausible = !user.is_empty()
            && user.len() <= 64
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '[' | ']'));
        if !plausible {
            return Ok(false);
        }
        let path = format!("/repos/{repository}/collaborators/{user}/permission");
        match self
            .request("get_permission", Method::GET, &path, None)
            .await
        {
            Ok(answer) => Ok(matches!(
                answer["permission"].as_str(),
                Some("admin" | "maintain" | "write")
            )),
            Err(ForgeApiError::Http { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a Deployment of `sha` to `environment`; returns its id.
    pub async fn create_deployment(
        &self,
        repository: &str,
        sha: &str,
        environment: &str,
    ) -> Result<u64, ForgeApiError> {
        let path = format!("/repos/{repository}/deployments");
        let body = json!({
            "ref": sha, "environment": environment, "auto_merge": false, "required_contexts": [],
            "transient_environment": true, "production_environment": false,
            "description": "preview environment by previewd",
        });
        let created = self
            .request("create_deployment", Method::POST, &path, Some(&body))
            .await?;
        created["id"].as_u64().ok_or(ForgeApiError::Http {
            operation: "create_deployment",
            status: 200,
            message: "the answer has no deployment id".into(),
        })
    }

    pub async fn deployment_status(
        &self,
        repository: &str,
        deployment: u64,
        state: DeploymentState,
        environment_url: &str,
    ) -> Result<(), ForgeApiError> {
        let state = match state {
            DeploymentState::InProgress => "in_progress",
            DeploymentState::Success => "success",
            DeploymentState::Failure => "failure",
            DeploymentState::Inactive => "inactive",
        };
        let path = format!("/repos/{repository}/deployments/{deployment}/statuses");
        let body =
            json!({ "state": state, "environment_url": environment_url, "auto_inactive": true });
        self.request("deployment_status", Method::POST, &path, Some(&body))
            .await
            .map(|_| ())
    }
}

// ---------------------------------------------------------------------------------------------
// GitLab
// ---------------------------------------------------------------------------------------------

/// The gitlab crate's client with previewd's rate-limit accounting around every call.
struct ObservedGitlab {
    inner: gitlab::AsyncGitlab,
    gate: Arc<Gate>,
    metrics: ForgeMetrics,
}

impl gitlab::api::RestClient for ObservedGitlab {
    type Error = gitlab::RestError;

    fn rest_endpoint(
        &self,
        endpoint: &str,
    ) -> Result<url::Url, gitlab::api::ApiError<Self::Error>> {
        self.inner.rest_endpoint(endpoint)
    }
}

#[async_trait::async_trait]
impl gitlab::api::AsyncClient for ObservedGitlab {
    async fn rest_async(
        &self,
        request: http::request::Builder,
        body: Vec<u8>,
    ) -> Result<http::Response<bytes::Bytes>, gitlab::api::ApiError<Self::Error>> {
        let response = self.inner.rest_async(request, body).await?;
        observe_rate_limit(
            "gitlab",
            response.status(),
            response.headers(),
            &self.metrics,
            &self.gate,
        );
        Ok(response)
    }
}

pub struct GitlabApi {
    client: ObservedGitlab,
    gate: Arc<Gate>,
    metrics: ForgeMetrics,
}

#[derive(serde::Deserialize)]
struct Note {
    id: u64,
    #[serde(default)]
    body: String,
}

impl GitlabApi {
    /// Connects (GitLab's client checks the token with one `GET /user`).
    pub async fn connect(
        api_url: Option<&str>,
        token: String,
        metrics: ForgeMetrics,
    ) -> Result<Self, ForgeApiError> {
        let api_url = api_url.unwrap_or("https://gitlab.com");
        let url =
            url::Url::parse(api_url).map_err(|_| ForgeApiError::BadUrl(api_url.to_string()))?;
        let host = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_string(),
            (None, _) => return Err(ForgeApiError::BadUrl(api_url.to_string())),
        };
        let mut builder = gitlab::GitlabBuilder::new(host, token);
        if url.scheme() == "http" {
            builder.insecure();
        }
        let inner = tokio::time::timeout(FORGE_TIMEOUT, builder.build_async())
            .await
            .map_err(|_| ForgeApiError::Transport {
                operation: "connect",
                message: format!("no answer within {} s", FORGE_TIMEOUT.as_secs()),
            })?
            .map_err(|e| ForgeApiError::Transport {
                operation: "connect",
                message: e.to_string(),
            })?;
        let gate = Arc::new(Gate::default());
        Ok(Self {
            client: ObservedGitlab {
                inner,
                gate: gate.clone(),
                metrics: metrics.clone(),
            },
            gate,
            metrics,
        })
    }

    async fn run<T, F, Fut>(&self, operation: &'static str, call: F) -> Result<T, ForgeApiError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        self.gate.check(operation)?;
        // The gitlab crate's HTTP client has no timeout of its own.
        let result = match tokio::time::timeout(FORGE_TIMEOUT, call()).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {} s", FORGE_TIMEOUT.as_secs())),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(_) if self.gate.check(operation).is_err() => "rate_limited",
            Err(_) => "error",
        };
        self.metrics
            .requests
            .with_label_values(&["gitlab", operation, outcome])
            .inc();
        match result {
            Ok(value) => {
                self.gate.success();
                Ok(value)
            }
            Err(message) => {
                if outcome == "error" {
                    self.gate.failure();
                }
                Err(ForgeApiError::Transport { operation, message })
            }
        }
    }

    async fn find_comment(
        &self,
        project: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::merge_requests::notes::MergeRequestNotes;
        let endpoint = MergeRequestNotes::builder()
            .project(project)
            .merge_request(number)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "list_comments",
                message: e.to_string(),
            })?;
        let notes: Vec<Note> = self
            .run("list_comments", || async {
                gitlab::api::paged(endpoint, gitlab::api::Pagination::Limit(1000))
                    .query_async(&self.client)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        Ok(notes
            .into_iter()
            .find(|n| n.body.starts_with(marker))
            .map(|n| n.id))
    }

    async fn create_comment(
        &self,
        project: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::merge_requests::notes::CreateMergeRequestNote;
        let endpoint = CreateMergeRequestNote::builder()
            .project(project)
            .merge_request(number)
            .body(body)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "create_comment",
                message: e.to_string(),
            })?;
        let note: Note = self
            .run("create_comment", || async {
                endpoint
                    .query_async(&self.client)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        Ok(note.id)
    }

    async fn edit_comment(
        &self,
        project: &str,
        number: u64,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::merge_requests::notes::EditMergeRequestNote;
        let endpoint = EditMergeRequestNote::builder()
            .project(project)
            .merge_request(number)
            .note(id)
            .body(body)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "edit_comment",
                message: e.to_string(),
            })?;
        self.run("edit_comment", || async {
            gitlab::api::ignore(endpoint)
                .query_async(&self.client)
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn read_manifests(
        &self,
        project: &str,
        path: &str,
        sha: &str,
    ) -> Result<Vec<(String, String)>, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::repository::Tree;
        use gitlab::api::projects::repository::files::FileRaw;
        #[derive(serde::Deserialize)]
        struct Entry {
            name: String,
            path: String,
            #[serde(rename = "type")]
            kind: String,
        }
        let path = path.trim_matches('/');
        let tree = Tree::builder()
            .project(project)
            .path(path)
            .ref_(sha)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "read_manifests",
                message: e.to_string(),
            })?;
        let entries: Vec<Entry> = self
            .run("read_manifests", || async {
                gitlab::api::paged(tree, gitlab::api::Pagination::Limit(1000))
                    .query_async(&self.client)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        // An empty tree: `path` may be one file.
        let files: Vec<(String, String)> = if entries.is_empty() {
            vec![(
                path.rsplit('/').next().unwrap_or(path).to_string(),
                path.to_string(),
            )]
        } else {
            entries
                .into_iter()
                .filter(|e| e.kind == "blob" && is_yaml(&e.name))
                .map(|e| (e.name, e.path))
                .collect()
        };
        let mut out = Vec::new();
        for (name, file_path) in files {
            let raw = FileRaw::builder()
                .project(project)
                .file_path(file_path.as_str())
                .ref_(sha)
                .build()
                .map_err(|e| ForgeApiError::Transport {
                    operation: "read_manifests",
                    message: e.to_string(),
                })?;
            let bytes: Vec<u8> = self
                .run("read_manifests", || async {
                    gitlab::api::raw(raw)
                        .query_async(&self.client)
                        .await
                        .map_err(|e| e.to_string())
                })
                .await?;
            out.push((name, String::from_utf8_lossy(&bytes).into_owned()));
        }
        Ok(out)
    }

    async fn write_access(&self, project: &str, user_id: u64) -> Result<bool, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::members::AllProjectMember;
        #[derive(serde::Deserialize)]
        struct Member {
            access_level: u64,
        }
        const DEVELOPER: u64 = 30;
        let endpoint = AllProjectMember::builder()
            .project(project)
            .user(user_id)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "get_permission",
                message: e.to_string(),
            })?;
        let member: Option<Member> = self
            .run("get_permission", || async {
                match endpoint.query_async(&self.client).await {
                    Ok(member) => Ok(Some(member)),
                    // Not a member of the project (or of a group above it).
                    Err(
                        gitlab::api::ApiError::GitlabWithStatus { status, .. }
                        | gitlab::api::ApiError::GitlabObjectWithStatus { status, .. }
                        | gitlab::api::ApiError::GitlabUnrecognizedWithStatus { status, .. },
                    ) if status == http::StatusCode::NOT_FOUND => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        Ok(member.is_some_and(|m| m.access_level >= DEVELOPER))
    }

    async fn open_merge_requests(&self, project: &str) -> Result<HashSet<u64>, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::merge_requests::{MergeRequestState, MergeRequests};
        #[derive(serde::Deserialize)]
        struct MergeRequest {
            iid: u64,
        }
        let endpoint = MergeRequests::builder()
            .project(project)
            .state(MergeRequestState::Opened)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "list_pull_requests",
                message: e.to_string(),
            })?;
        let open: Vec<MergeRequest> = self
            .run("list_pull_requests", || async {
                gitlab::api::paged(endpoint, gitlab::api::Pagination::All)
                    .query_async(&self.client)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        Ok(open.into_iter().map(|mr| mr.iid).collect())
    }

    async fn branches(&self, project: &str) -> Result<HashSet<String>, ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::repository::branches::Branches;
        #[derive(serde::Deserialize)]
        struct Branch {
            name: String,
        }
        let endpoint =
            Branches::builder()
                .project(project)
                .build()
                .map_err(|e| ForgeApiError::Transport {
                    operation: "list_branches",
                    message: e.to_string(),
                })?;
        let branches: Vec<Branch> = self
            .run("list_branches", || async {
                gitlab::api::paged(endpoint, gitlab::api::Pagination::All)
                    .query_async(&self.client)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        Ok(branches.into_iter().map(|b| b.name).collect())
    }

    async fn commit_status(
        &self,
        project: &str,
        sha: &str,
        state: CommitState,
        context: &str,
        target_url: &str,
        description: &str,
    ) -> Result<(), ForgeApiError> {
        use gitlab::api::AsyncQuery;
        use gitlab::api::projects::repository::commits::{CommitStatusState, CreateCommitStatus};
        let state = match state {
            CommitState::Pending => CommitStatusState::Pending,
            CommitState::Running => CommitStatusState::Running,
            CommitState::Success => CommitStatusState::Success,
            CommitState::Failure => CommitStatusState::Failed,
        };
        let endpoint = CreateCommitStatus::builder()
            .project(project)
            .commit(sha)
            .state(state)
            .name(context)
            .target_url(target_url)
            .description(description)
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "commit_status",
                message: e.to_string(),
            })?;
        self.run("commit_status", || async {
            gitlab::api::ignore(endpoint)
                .query_async(&self.client)
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// One client per forge URL and token
// ---------------------------------------------------------------------------------------------

type ClientKey = (ForgeKind, String, [u8; 32]);

/// Clients by (forge, API URL, token), built on first use and kept: their gates and connection
/// pools must outlive one reconcile.
pub struct ForgeClients {
    metrics: ForgeMetrics,
    clients: tokio::sync::Mutex<HashMap<ClientKey, Arc<ForgeClient>>>,
}

impl ForgeClients {
    pub fn new(metrics: ForgeMetrics) -> Self {
        Self {
            metrics,
            clients: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    pub async fn get(
        &self,
        kind: ForgeKind,
        api_url: Option<&str>,
        token: &[u8],
    ) -> Result<Arc<ForgeClient>, ForgeApiError> {
        let key = (
            kind,
            api_url.unwrap_or_default().to_string(),
            Sha256::digest(token).into(),
        );
        let mut clients = self.clients.lock().await;
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let token = String::from_utf8_lossy(token).into_owned();
        let client = Arc::new(match kind {
            ForgeKind::Github => {
                ForgeClient::Github(GithubApi::new(api_url, token, self.metrics.clone())?)
            }
            ForgeKind::Gitlab => {
                ForgeClient::Gitlab(GitlabApi::connect(api_url, token, self.metrics.clone()).await?)
            }
        });
        clients.insert(key, client.clone());
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_backs_off_after_failures_and_waits_out_rate_limits() {
        let gate = Gate::default();
        assert!(gate.check("x").is_ok());
        gate.failure();
        assert!(matches!(
            gate.check("x"),
            Err(ForgeApiError::BackingOff { .. })
        ));
        gate.success();
        assert!(gate.check("x").is_ok());
        gate.rate_limited(Duration::from_secs(30));
        let Err(ForgeApiError::RateLimited { wait, .. }) = gate.check("x") else {
            panic!("expected a rate-limit refusal");
        };
        assert!(wait > Duration::from_secs(28));
    }

    #[test]
    fn rate_limit_answers_are_recognised_and_their_budget_exported() {
        let metrics = ForgeMetrics::new();
        let gate = Gate::default();
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining", "4999".parse().unwrap());
        assert!(!observe_rate_limit(
            "github",
            StatusCode::OK,
            &headers,
            &metrics,
            &gate
        ));
        assert_eq!(
            metrics
                .rate_limit_remaining
                .with_label_values(&["github"])
                .get(),
            4999
        );
        headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
        headers.insert("retry-after", "120".parse().unwrap());
        assert!(observe_rate_limit(
            "github",
            StatusCode::FORBIDDEN,
            &headers,
            &metrics,
            &gate
        ));
        assert!(matches!(
            gate.check("x"),
            Err(ForgeApiError::RateLimited { .. })
        ));
        // A plain 403 (no permission) is not a rate limit.
        let gate = Gate::default();
        assert!(!observe_rate_limit(
            "github",
            StatusCode::FORBIDDEN,
            &HeaderMap::new(),
            &metrics,
            &gate
        ));
        assert!(gate.check("x").is_ok());
    }
}
