//! GitHub's REST API: the calls previewd makes (its comment, commit statuses, deployments,
//! repository files, collaborators' permission, the open pull requests and branches the sweep
//! lists), each through one send path that applies the backoff, reads the rate-limit headers,
//! counts the call, and uses conditional requests for lists (a `304` costs no rate limit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use crate::forge::client::{
    CommentAuthor, DeploymentState, check_listed_sizes, check_manifest_count, is_yaml,
};
use crate::forge::comment::CommitState;
use crate::forge::metrics::ForgeMetrics;
use crate::forge::transport::{
    Backoff, FORGE_CONNECT_TIMEOUT, FORGE_TIMEOUT, ForgeApiError, error_summary,
    observe_rate_limit, rate_limit_wait,
};

/// The most pages of 100 previewd reads of one list (10,000 open PRs or branches); a longer
/// list is an error rather than a partial answer.
pub const MAX_LIST_PAGES: usize = 100;

/// One GitHub answer, past the shared checks.
struct GithubAnswer {
    not_modified: bool,
    etag: Option<String>,
    json: Value,
}

/// A list page as kept for conditional requests: its ETag and its items reduced to the fields
/// the caller reads. Whole items would cost far more: a pull request as GitHub sends it is
/// about 25 KB of JSON (both repositories in full), and a repository with 1,000 open pull
/// requests would keep 1,000 of them, parsed, for as long as previewd runs.
type KeptPage = (String, Arc<Vec<Value>>);

/// GitHub's REST API through octocrab, with the shared accounting of every call.
pub struct GithubApi {
    octocrab: octocrab::Octocrab,
    backoff: Backoff,
    metrics: ForgeMetrics,
    /// Whose rate-limit budget this client spends (`token`, `installation-<id>`), for
    /// `previewd_forge_rate_limit_remaining`.
    budget: String,
    /// Last answer of each list page with its ETag: a `304 Not Modified` costs no rate limit.
    etags: Mutex<HashMap<String, KeptPage>>,
    /// Who previewd comments as, to know its own comments.
    author: CommentAuthor,
    /// The token's login, once asked (`GET /user`).
    own_login: tokio::sync::OnceCell<String>,
}

impl GithubApi {
    pub fn new(
        api_url: Option<&str>,
        token: String,
        budget: String,
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
            backoff: Backoff::default(),
            metrics,
            budget,
            etags: Mutex::new(HashMap::new()),
            author: CommentAuthor::Token,
            own_login: tokio::sync::OnceCell::new(),
        })
    }

    /// This client, commenting as `author`.
    pub fn commenting_as(self, author: CommentAuthor) -> Self {
        Self { author, ..self }
    }

    /// Whether `comment` (as GitHub lists it) was written by previewd: by its App, or by the
    /// user its token belongs to.
    async fn is_own(&self, comment: &Value) -> Result<bool, ForgeApiError> {
        Ok(match self.author {
            CommentAuthor::GithubApp(app_id) => {
                comment["performed_via_github_app"]["id"].as_u64() == Some(app_id)
            }
            CommentAuthor::Token => {
                let login = self
                    .own_login
                    .get_or_try_init(|| async {
                        let user = self.request("own_user", Method::GET, "/user", None).await?;
                        user["login"]
                            .as_str()
                            .map(str::to_string)
                            .ok_or(ForgeApiError::Http {
                                operation: "own_user",
                                status: 200,
                                message: "GET /user named no login".into(),
                            })
                    })
                    .await?;
                comment["user"]["login"]
                    .as_str()
                    .is_some_and(|author| author.eq_ignore_ascii_case(login))
            }
        })
    }

    /// The ETag cache, even if a thread panicked holding it (each entry is whole).
    fn etags(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeptPage>> {
        self.etags
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Sends one request with the accounting every call shares: the backoff, the rate-limit
    /// headers, the metric, and errors for anything but 2xx and `304 Not Modified`.
    async fn send(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_none_match: Option<&str>,
    ) -> Result<GithubAnswer, ForgeApiError> {
        self.backoff.check(operation)?;
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
            self.backoff.failure();
            count("error");
            ForgeApiError::Transport {
                operation,
                message: e.to_string(),
            }
        })?;
        let status = response.status();
        if observe_rate_limit(
            ("github", &self.budget),
            status,
            response.headers(),
            &self.metrics,
            &self.backoff,
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
                self.backoff.failure();
            }
            count("error");
            return Err(ForgeApiError::Http {
                operation,
                status: status.as_u16(),
                message: error_summary(&text),
            });
        }
        self.backoff.success();
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

    /// One list page by a conditional GET (`If-None-Match` with the ETag of the last answer):
    /// an unchanged page is a `304`, which costs no rate limit. Items keep only `fields`.
    async fn get_page(
        &self,
        operation: &'static str,
        path: &str,
        fields: &[&str],
    ) -> Result<Arc<Vec<Value>>, ForgeApiError> {
        let cached = self.etags().get(path).cloned();
        let etag = cached.as_ref().map(|(etag, _)| etag.as_str());
        let answer = self.send(operation, Method::GET, path, None, etag).await?;
        if answer.not_modified
            && let Some((_, page)) = cached
        {
            return Ok(page);
        }
        let page = Arc::new(reduced(&answer.json, fields));
        if let Some(etag) = answer.etag {
            self.etags().insert(path.to_string(), (etag, page.clone()));
        }
        Ok(page)
    }

    /// Every item of a paginated list (100 per page, conditional requests), each with only
    /// `fields`. A list longer than [`MAX_LIST_PAGES`] is an error, never cut off: the sweep
    /// decides from these lists.
    pub(crate) async fn list_all(
        &self,
        operation: &'static str,
        path: &str,
        fields: &[&str],
    ) -> Result<Vec<Value>, ForgeApiError> {
        let mut items = Vec::new();
        for page in 1..=MAX_LIST_PAGES {
            let separator = if path.contains('?') { '&' } else { '?' };
            let path = format!("{path}{separator}per_page=100&page={page}");
            let batch = self.get_page(operation, &path, fields).await?;
            items.extend(batch.iter().cloned());
            if batch.len() < 100 {
                return Ok(items);
            }
        }
        Err(ForgeApiError::Incomplete {
            operation,
            pages: MAX_LIST_PAGES,
        })
    }

    pub(crate) async fn find_comment(
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
            let marked = comments
                .iter()
                .filter(|c| c["body"].as_str().is_some_and(|b| b.starts_with(marker)));
            for comment in marked {
                if self.is_own(comment).await? {
                    return Ok(comment["id"].as_u64());
                }
            }
            if comments.len() < 100 {
                break;
            }
        }
        Ok(None)
    }

    pub(crate) async fn create_comment(
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

    pub(crate) async fn edit_comment(
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

    pub(crate) async fn commit_status(
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

    pub(crate) async fn read_manifests(
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
        let manifests: Vec<&Value> = entries
            .iter()
            .filter(|e| e["type"] == "file" && is_yaml(e["name"].as_str().unwrap_or_default()))
            .collect();
        // The listing gives every file's size: refuse before downloading anything.
        check_manifest_count(path, manifests.len())?;
        check_listed_sizes(path, manifests.iter().map(|entry| listed_size(entry, path)))?;
        let mut files = Vec::new();
        for entry in manifests {
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

    /// Every file under folder `path` at commit `sha`, as (path relative to the folder, bytes):
    /// one listing per folder, one read per file whose content the listing does not carry.
    /// Sizes are checked from the listings before any file is read.
    pub(crate) async fn read_folder(
        &self,
        repository: &str,
        path: &str,
        sha: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError> {
        let root = path.trim_matches('/');
        let mut folders = vec![root.to_string()];
        let mut entries = Vec::new();
        while let Some(folder) = folders.pop() {
            let listing = self.contents(&folder, repository, sha).await?;
            let Value::Array(listed) = listing else {
                return Err(not_a_folder(root));
            };
            for entry in listed {
                match entry["type"].as_str() {
                    Some("dir") => folders.push(entry["path"].as_str().unwrap_or_default().into()),
                    Some("file") => entries.push(entry),
                    _ => {}
                }
            }
            check_manifest_count(root, entries.len() + folders.len())?;
        }
        check_listed_sizes(root, entries.iter().map(|entry| listed_size(entry, root)))?;
        let mut files = Vec::new();
        for entry in entries {
            let file_path = entry["path"].as_str().unwrap_or_default().to_string();
            let file = self.contents(&file_path, repository, sha).await?;
            let bytes = decode_base64_bytes(&file).ok_or(ForgeApiError::Http {
                operation: "read_manifests",
                status: 200,
                message: format!("{file_path}: the file content is not base64"),
            })?;
            let relative = file_path
                .strip_prefix(root)
                .unwrap_or(&file_path)
                .trim_start_matches('/');
            files.push((relative.to_string(), bytes));
        }
        Ok(files)
    }

    async fn contents(
        &self,
        path: &str,
        repository: &str,
        sha: &str,
    ) -> Result<Value, ForgeApiError> {
        self.request(
            "read_manifests",
            Method::GET,
            &format!("/repos/{repository}/contents/{path}?ref={sha}"),
            None,
        )
        .await
    }

    pub(crate) async fn write_access(
        &self,
        repository: &str,
        user: &str,
    ) -> Result<bool, ForgeApiError> {
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

/// A listing entry's path (or `folder`) and the size the forge gives for it.
fn listed_size(entry: &Value, folder: &str) -> (String, u64) {
    let name = entry["path"].as_str().unwrap_or(folder).to_string();
    (name, entry["size"].as_u64().unwrap_or(0))
}

/// GitHub's contents API returns base64 with line breaks.
fn decode_base64_content(file: &Value) -> Option<String> {
    String::from_utf8(decode_base64_bytes(file)?).ok()
}

fn decode_base64_bytes(file: &Value) -> Option<Vec<u8>> {
    use base64::Engine;
    let content: String = file["content"]
        .as_str()?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(content)
        .ok()
}

fn not_a_folder(path: &str) -> ForgeApiError {
    ForgeApiError::NotAFolder {
        path: path.to_string(),
    }
}

/// The items of a list answer with only `fields` (an answer that is not a list has none).
fn reduced(answer: &Value, fields: &[&str]) -> Vec<Value> {
    let items = answer.as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .map(|item| {
            let kept = fields
                .iter()
                .filter_map(|field| Some((field.to_string(), item.get(*field)?.clone())));
            Value::Object(kept.collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GitHub API that answers every POST with `201 {"id": 1}`, and a client of it.
    async fn accepting_github() -> (wiremock::MockServer, GithubApi) {
        // octocrab builds a TLS connector even for plain http: rustls needs its provider.
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(wiremock::ResponseTemplate::new(201).set_body_json(json!({"id": 1})))
            .mount(&server)
            .await;
        let uri = server.uri();
        let api = GithubApi::new(
            Some(uri.as_str()),
            "forge-token".into(),
            "token".into(),
            ForgeMetrics::default(),
        )
        .unwrap();
        (server, api)
    }

    /// The JSON bodies `server` received, each checked to have gone to `path`.
    async fn bodies_sent_to(server: &wiremock::MockServer, path: &str) -> Vec<Value> {
        let received = server.received_requests().await.unwrap_or_default();
        received
            .iter()
            .map(|request| {
                assert_eq!(request.url.path(), path);
                request.body_json::<Value>().unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn deployment_statuses_name_their_state_and_carry_the_environment_url() {
        let (server, api) = accepting_github().await;
        let url = "https://pr-2.preview.example.com";
        for state in [
            DeploymentState::InProgress,
            DeploymentState::Success,
            DeploymentState::Failure,
            DeploymentState::Inactive,
        ] {
            api.deployment_status("Codertocat/Hello-World", 77, state, url)
                .await
                .unwrap();
        }
        let bodies = bodies_sent_to(
            &server,
            "/repos/Codertocat/Hello-World/deployments/77/statuses",
        )
        .await;
        let states: Vec<&str> = bodies
            .iter()
            .map(|body| body["state"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(states, ["in_progress", "success", "failure", "inactive"]);
        for body in &bodies {
            assert_eq!(body["environment_url"], url, "{body}");
        }
    }

    #[tokio::test]
    async fn a_successful_commit_status_says_success_with_its_context_and_url() {
        // A sleeping environment's status is `Success` (report_plan); GitHub must read `success`.
        let (server, api) = accepting_github().await;
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let url = "https://pr-2.preview.example.com";
        api.commit_status(
            "Codertocat/Hello-World",
            sha,
            CommitState::Success,
            "previewd/web",
            url,
            "Preview environment: Sleeping",
        )
        .await
        .unwrap();
        let path = format!("/repos/Codertocat/Hello-World/statuses/{sha}");
        let bodies = bodies_sent_to(&server, &path).await;
        let [body] = bodies.as_slice() else {
            panic!("one commit status: {bodies:?}");
        };
        assert_eq!(body["state"], "success", "{body}");
        assert_eq!(body["context"], "previewd/web", "{body}");
        assert_eq!(body["target_url"], url, "{body}");
    }

    #[test]
    fn a_kept_list_page_holds_only_the_fields_read_from_it() {
        let answer = json!([
            {"number": 7, "title": "Add search", "head": {"repo": {"full_name": "shop/web"}}},
            {"number": 9, "body": "x".repeat(10_000)},
            "not an object"
        ]);
        let page = reduced(&answer, &["number"]);
        assert_eq!(
            page,
            vec![json!({"number": 7}), json!({"number": 9}), json!({})]
        );
        assert!(reduced(&json!({"message": "Not Found"}), &["number"]).is_empty());
    }
}
