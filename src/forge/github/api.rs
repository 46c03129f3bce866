//! GitHub's REST API: the calls previewd makes (its comment, commit statuses, deployments,
//! repository files, collaborators' permission, the open pull requests and branches the sweep
//! lists), each through one send path that applies the backoff, reads the rate-limit headers,
//! counts the call, and uses conditional requests for lists (a `304` costs no rate limit).

use http_body_util::combinators::BoxBody;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use crate::forge::blobs::BlobCache;
use crate::forge::blobs::ReadAt;
use crate::forge::comment::CommitState;
use crate::forge::folders::{BlobSource, TreeFile, is_object_id, read_blobs, take_listing};
use crate::forge::metrics::ForgeMetrics;
use crate::forge::seam::AtPath;
use crate::forge::transport::{
    Backoff, FORGE_CONNECT_TIMEOUT, FORGE_TIMEOUT, ForgeApiError, error_summary,
    observe_rate_limit, rate_limit_wait,
};
use crate::forge::vocabulary::{CommentAuthor, DeploymentState};

/// The most pages of 100 previewd reads of one list (10,000 open PRs or branches); a longer
/// list is an error rather than a partial answer.
pub const MAX_LIST_PAGES: usize = 100;

/// The most of one GitHub answer previewd reads. The largest previewd asks for is a commit's
/// recursive tree listing, which GitHub cuts off at 7 MB; a template's `apiUrl` may name any
/// server, and an answer without a bound would be held whole in previewd's memory.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The most of one answer of `operation`: a recursive tree listing is cut off by GitHub at
/// 7 MB, and a blob is asked for only when the listing says it is at most 1 MiB (1.4 MiB as
/// base64 in JSON). A server that sends more is refused early, not at 16 MiB.
fn answer_limit(operation: &str) -> usize {
    match operation {
        "read_tree" => 8 << 20,
        "read_blob" => 2 << 20,
        _ => MAX_ANSWER_BYTES,
    }
}

/// How long an answer's body may take to arrive whole, once its headers have: a 7 MB tree
/// listing needs about 2 MB/s; a server dripping its answer is cut off.
const ANSWER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The body of an answer as text, refused as soon as it passes `limit` bytes (by its declared
/// length, or as it streams): never more than `limit` bytes are held.
pub(crate) async fn read_capped<B>(body: B, limit: usize) -> Result<String, String>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    let too_large =
        || format!("the forge's answer is larger than {limit} bytes; previewd reads no more of it");
    if body
        .size_hint()
        .exact()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(too_large());
    }
    let collected = http_body_util::Limited::new(body, limit).collect().await;
    match collected {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes.to_bytes()).into_owned()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(too_large())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// An answer as octocrab hands it over, before its body is read.
type GithubResponse = http::Response<BoxBody<bytes::Bytes, octocrab::Error>>;

/// One GitHub answer, past the shared checks.
struct GithubAnswer {
    not_modified: bool,
    etag: Option<String>,
    text: String,
}

impl GithubAnswer {
    /// The answer as JSON (`Null` when it is none).
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

/// A tree listing with only the fields previewd reads. Parsed into these rather than a
/// `Value`, a listing near its 8 MiB limit costs about its own size in memory, not several
/// times it.
#[derive(serde::Deserialize)]
struct TreeListing {
    #[serde(default)]
    truncated: bool,
    tree: Vec<TreeEntry>,
}

/// `path`, `type` and `sha` are required: an answer of empty objects (`[{},{},…]`) is no
/// listing, and would cost far more as entries than as text.
#[derive(serde::Deserialize)]
struct TreeEntry {
    path: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    mode: String,
    sha: String,
    #[serde(default)]
    size: u64,
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
    /// The API URL, which keys what is kept in `blobs`.
    origin: String,
    /// Repository files by blob id, shared by every client of one [`super::super::client::ForgeClients`].
    blobs: Arc<BlobCache>,
    /// Whose reads these are ([`crate::forge::client::ForgeClient::scope`]).
    scope: String,
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
            origin: api_url.to_string(),
            blobs: Arc::default(),
            scope: crate::forge::vocabulary::unshared_scope(),
        })
    }

    /// This client, keeping repository files in `blobs` (shared with other clients).
    pub fn keeping_blobs_in(self, blobs: Arc<BlobCache>) -> Self {
        Self { blobs, ..self }
    }

    /// This client, reading for `scope` ([`crate::forge::client::ForgeClient::scope`]).
    pub fn scoped(self, scope: String) -> Self {
        Self { scope, ..self }
    }

    pub fn scope(&self) -> &str {
        &self.scope
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
        Ok(self.send(operation, method, path, body, None).await?.json())
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
        let answer = self
            .exchange(operation, method, path, body, if_none_match)
            .await;
        let outcome = match &answer {
            Ok(answer) if answer.not_modified => "not_modified",
            Ok(_) => "ok",
            Err(ForgeApiError::RateLimited { .. }) => "rate_limited",
            Err(_) => "error",
        };
        self.metrics
            .requests
            .with_label_values(&["github", operation, outcome])
            .inc();
        answer
    }

    /// One request and its answer, read and judged: the rate limit observed, the body read
    /// within its limits, the status turned into an error where it is one.
    async fn exchange(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_none_match: Option<&str>,
    ) -> Result<GithubAnswer, ForgeApiError> {
        let response = self
            .dispatch(operation, method, path, body, if_none_match)
            .await?;
        let status = response.status();
        let limited = ("github", self.budget.as_str());
        if observe_rate_limit(
            limited,
            status,
            response.headers(),
            &self.metrics,
            &self.backoff,
        ) {
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
        let text = self.read_text(operation, response).await?;
        self.judge(operation, status, text, etag)
    }

    /// Sends the request, within [`FORGE_TIMEOUT`] for the whole call: octocrab's timeouts are
    /// per read, and a server that sends a byte every few seconds would hold the call (and a
    /// reconcile) for ever.
    async fn dispatch(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_none_match: Option<&str>,
    ) -> Result<GithubResponse, ForgeApiError> {
        let call = async {
            match method {
                Method::POST => self.octocrab._post(path, body).await,
                Method::PATCH => self.octocrab._patch(path, body).await,
                _ => {
                    let mut headers = HeaderMap::new();
                    if let Some(value) = if_none_match.and_then(|etag| etag.parse().ok()) {
                        headers.insert(http::header::IF_NONE_MATCH, value);
                    }
                    self.octocrab._get_with_headers(path, Some(headers)).await
                }
            }
        };
        let sent = tokio::time::timeout(FORGE_TIMEOUT, call).await;
        let message = match sent {
            Ok(Ok(response)) => return Ok(response),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", FORGE_TIMEOUT.as_secs()),
        };
        self.backoff.failure();
        Err(ForgeApiError::Transport { operation, message })
    }

    /// The answer's body as text, at most [`answer_limit`] of it, whole within
    /// [`ANSWER_READ_TIMEOUT`].
    async fn read_text(
        &self,
        operation: &'static str,
        response: GithubResponse,
    ) -> Result<String, ForgeApiError> {
        let body = read_capped(response.into_body(), answer_limit(operation));
        let read = tokio::time::timeout(ANSWER_READ_TIMEOUT, body).await;
        let read = read.unwrap_or_else(|_| {
            let seconds = ANSWER_READ_TIMEOUT.as_secs();
            Err(format!(
                "the forge's answer did not arrive whole within {seconds} s"
            ))
        });
        read.map_err(|message| {
            self.backoff.failure();
            ForgeApiError::Transport { operation, message }
        })
    }

    /// What an answer of `status` with `text` comes to: GitHub's secondary limit (a 403 with
    /// only its message: wait at least a minute, as GitHub asks), an error, or the answer.
    fn judge(
        &self,
        operation: &'static str,
        status: StatusCode,
        text: String,
        etag: Option<String>,
    ) -> Result<GithubAnswer, ForgeApiError> {
        if status == StatusCode::FORBIDDEN && is_secondary_limit(&text) {
            let wait = std::time::Duration::from_secs(60);
            self.backoff.rate_limited(wait);
            return Err(ForgeApiError::RateLimited { operation, wait });
        }
        if !status.is_success() && status != StatusCode::NOT_MODIFIED {
            if status.is_server_error() {
                self.backoff.failure();
            }
            return Err(ForgeApiError::Http {
                operation,
                status: status.as_u16(),
                message: error_summary(&text),
            });
        }
        self.backoff.success();
        Ok(GithubAnswer {
            not_modified: status == StatusCode::NOT_MODIFIED,
            etag,
            text,
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
        let page = Arc::new(reduced(&answer.json(), fields));
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

    /// `files` of `repository`, from the blob cache or by `GET …/git/blobs/{id}`.
    pub(super) async fn read_blobs(
        &self,
        repository: &str,
        reader: &str,
        root: &str,
        files: Vec<TreeFile>,
    ) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError> {
        let source = BlobSource {
            cache: &self.blobs,
            metrics: &self.metrics,
            forge: "github",
            origin: &self.origin,
            repository,
            reader,
        };
        read_blobs(root, files, source, |file| async move {
            let blob = file.blob;
            let path = format!("/repos/{repository}/git/blobs/{blob}");
            let answer = self.request("read_blob", Method::GET, &path, None).await?;
            decode_base64_bytes(&answer).ok_or(ForgeApiError::Http {
                operation: "read_blob",
                status: 200,
                message: format!("blob {blob}: the content is not base64"),
            })
        })
        .await
    }

    /// What commit `sha` holds at `root`: one listing of the commit's whole tree. GitHub cuts
    /// a recursive listing off past 100,000 entries or 7 MB (`truncated`); then the folder's
    /// own tree is found one level at a time and listed alone (with every level below it when
    /// `below`).
    pub(super) async fn tree_at(
        &self,
        repository: &str,
        reader: &str,
        root: &str,
        sha: &str,
        below: bool,
    ) -> Result<AtPath, ForgeApiError> {
        let whole = self.tree(repository, reader, sha, true).await?;
        if !whole.truncated {
            return Ok(AtPath::under(&whole, root));
        }
        let segments: Vec<&str> = root.split('/').filter(|s| !s.is_empty()).collect();
        let mut tree = sha.to_string();
        for (depth, segment) in segments.iter().enumerate() {
            let level = self.tree(repository, reader, &tree, false).await?;
            let entry = level.tree.iter().find(|entry| entry.path == *segment);
            let Some(entry) = entry else {
                return Ok(AtPath::Missing);
            };
            match entry.kind.as_str() {
                "tree" if is_object_id(&entry.sha) => tree = entry.sha.clone(),
                "blob" if depth + 1 == segments.len() => {
                    return Ok(AtPath::under(&level, segment));
                }
                _ => return Ok(AtPath::Missing),
            }
        }
        let folder = self.tree(repository, reader, &tree, below).await?;
        if folder.truncated {
            return Err(ForgeApiError::ManifestsTooLarge {
                path: root.to_string(),
                problem: "more entries than GitHub lists in one tree; none was read".into(),
            });
        }
        Ok(AtPath::under(&folder, ""))
    }

    /// `GET /repos/{repository}/git/trees/{tree}` (a commit SHA names its root tree): one read
    /// of `reader`'s and the repository's hour.
    async fn tree(
        &self,
        repository: &str,
        reader: &str,
        tree: &str,
        recursive: bool,
    ) -> Result<TreeListing, ForgeApiError> {
        let at = ReadAt {
            origin: &self.origin,
            repository,
            reader,
        };
        let query = if recursive { "?recursive=1" } else { "" };
        take_listing(&self.blobs, at, &format!("{tree}{query}"))?;
        let path = format!("/repos/{repository}/git/trees/{tree}{query}");
        let answer = self
            .send("read_tree", Method::GET, &path, None, None)
            .await?;
        // An answer that is no tree (a body cut off, a proxy's page) says nothing about the
        // commit: an error to retry, never "not in the repository", which is kept.
        serde_json::from_str(&answer.text).map_err(|_| ForgeApiError::Transport {
            operation: "read_tree",
            message: format!("{path}: the answer is not a tree listing"),
        })
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

impl AtPath {
    /// What `listing` (a tree answer; paths relative to the tree listed) holds at `root` (`""`:
    /// the listed tree itself). Links and submodules are left out: previewd reads files only.
    fn under(listing: &TreeListing, root: &str) -> Self {
        let prefix = if root.is_empty() {
            String::new()
        } else {
            format!("{root}/")
        };
        let mut folder = root.is_empty();
        let mut files = Vec::new();
        for entry in &listing.tree {
            let path = entry.path.as_str();
            let regular =
                entry.kind == "blob" && matches!(entry.mode.as_str(), "100644" | "100755");
            if path == root {
                if regular {
                    let name = root.rsplit('/').next().unwrap_or(root);
                    return AtPath::File(tree_file(name, entry));
                }
                folder |= entry.kind == "tree";
            } else if let Some(relative) = path.strip_prefix(&prefix) {
                folder = true;
                if regular {
                    files.push(tree_file(relative, entry));
                }
            }
        }
        match folder {
            true => AtPath::Folder(files),
            false => AtPath::Missing,
        }
    }
}

/// Whether a 403's body is GitHub's "You have exceeded a secondary rate limit" (any case).
fn is_secondary_limit(body: &str) -> bool {
    error_summary(body)
        .to_ascii_lowercase()
        .contains("secondary rate limit")
}

fn tree_file(path: &str, entry: &TreeEntry) -> TreeFile {
    TreeFile {
        path: path.to_string(),
        blob: entry.sha.clone(),
        size: Some(entry.size),
    }
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
    use crate::forge::seam::{ForgeApi, Listing};

    /// A GitHub API that answers every POST with `201 {"id": 1}`, and a client of it.
    async fn accepting_github() -> (wiremock::MockServer, GithubApi) {
        // octocrab builds a TLS connector even for plain http: rustls needs its provider.
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(wiremock::ResponseTemplate::new(201).set_body_json(json!({"id": 1})))
            .mount(&server)
            .await;
        let api = accepting_github_at(&server);
        (server, api)
    }

    fn accepting_github_at(server: &wiremock::MockServer) -> GithubApi {
        let uri = server.uri();
        GithubApi::new(
            Some(uri.as_str()),
            "forge-token".into(),
            "token".into(),
            ForgeMetrics::default(),
        )
        .unwrap()
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

    #[test]
    fn a_commit_tree_gives_a_folders_regular_files_and_leaves_links_and_submodules_out() {
        let entry = |path: &str, kind: &str, mode: &str| json!({"path": path, "type": kind, "mode": mode, "sha": "a".repeat(40), "size": 7});
        let listing = json!({"tree": [
            entry("deploy", "tree", "040000"),
            entry("deploy/chart", "tree", "040000"),
            entry("deploy/chart/Chart.yaml", "blob", "100644"),
            entry("deploy/chart/run.sh", "blob", "100755"),
            entry("deploy/chart/templates/web.yaml", "blob", "100644"),
            // A link to a file outside the folder, and a submodule: never read.
            entry("deploy/chart/secrets.yaml", "blob", "120000"),
            entry("deploy/chart/vendor", "commit", "160000"),
            // Beside the folder, with a name that starts alike.
            entry("deploy/chart-old/Chart.yaml", "blob", "100644"),
        ]});
        let listing: TreeListing = serde_json::from_value(listing).unwrap();
        let AtPath::Folder(files) = AtPath::under(&listing, "deploy/chart") else {
            panic!("deploy/chart is a folder");
        };
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["Chart.yaml", "run.sh", "templates/web.yaml"]);
        assert_eq!(files[0].size, Some(7));
        assert!(matches!(
            AtPath::under(&listing, "deploy/chart/Chart.yaml"),
            AtPath::File(TreeFile { ref path, .. }) if path == "Chart.yaml"
        ));
        assert!(matches!(
            AtPath::under(&listing, "deploy/none"),
            AtPath::Missing
        ));
        assert!(matches!(
            AtPath::under(&listing, "deploy/chart/secrets.yaml"),
            AtPath::Missing
        ));
    }

    /// GitHub cuts a recursive listing off past 100,000 entries or 7 MB (`truncated`): the
    /// folder's own tree is then found one level at a time and listed alone, and its files
    /// read by blob id.
    #[tokio::test]
    async fn a_truncated_commit_tree_is_walked_down_to_the_folder() {
        use wiremock::matchers::{method, path, query_param};
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        let commit = "c".repeat(40);
        let (deploy, chart, blob) = ("d".repeat(40), "e".repeat(40), "f".repeat(40));
        let trees = [
            (commit.clone(), true, json!({"truncated": true, "tree": []})),
            (
                commit.clone(),
                false,
                json!({"truncated": false, "tree": [
                {"path": "deploy", "type": "tree", "mode": "040000", "sha": deploy}]}),
            ),
            (
                deploy.clone(),
                false,
                json!({"truncated": false, "tree": [
                {"path": "chart", "type": "tree", "mode": "040000", "sha": chart}]}),
            ),
            (
                chart.clone(),
                true,
                json!({"truncated": false, "tree": [
                {"path": "Chart.yaml", "type": "blob", "mode": "100644", "sha": blob, "size": 5}]}),
            ),
        ];
        for (tree, recursive, answer) in trees {
            let listed =
                Mock::given(method("GET")).and(path(format!("/repos/o/r/git/trees/{tree}")));
            let listed = match recursive {
                true => listed.and(query_param("recursive", "1")),
                false => listed.and(wiremock::matchers::query_param_is_missing("recursive")),
            };
            listed
                .respond_with(ResponseTemplate::new(200).set_body_json(answer))
                .mount(&server)
                .await;
        }
        let content = json!({"sha": blob, "size": 5, "encoding": "base64", "content": "bmFtZQo="});
        Mock::given(method("GET"))
            .and(path(format!("/repos/o/r/git/blobs/{blob}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(content))
            .mount(&server)
            .await;

        let files = api
            .read_folder(Listing::new("o/r", "deploy/chart", &commit, "test/pr-1"))
            .await
            .unwrap();

        assert_eq!(files, [("Chart.yaml".to_string(), b"name\n".to_vec())]);
    }

    /// Each tree listing spends a read of the environment's share too: a pull request pushing
    /// a commit after another reads at most 250 times an hour (its listings and its new
    /// files), and asks the forge nothing more; another of the repository still reads.
    #[tokio::test]
    async fn every_listing_spends_a_read_of_the_environments_share() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        let blob = "f".repeat(40);
        let listing = json!({"truncated": false, "tree": [
            {"path": "deploy/app.yaml", "type": "blob", "mode": "100644", "sha": blob, "size": 5}]});
        Mock::given(method("GET"))
            .and(path_regex("/git/trees/"))
            .respond_with(ResponseTemplate::new(200).set_body_json(listing))
            .mount(&server)
            .await;
        let content = json!({"sha": blob, "size": 5, "encoding": "base64", "content": "bmFtZQo="});
        Mock::given(method("GET"))
            .and(path_regex("/git/blobs/"))
            .respond_with(ResponseTemplate::new(200).set_body_json(content))
            .mount(&server)
            .await;
        let commit = |n: usize| format!("{n:040x}");
        // The first commit: a listing and the file; each later one: its listing alone.
        for n in 1..=249 {
            let read = api
                .read_manifests(Listing::new("o/r", "deploy", &commit(n), "team/busy"))
                .await;
            assert!(read.is_ok(), "commit {n}: {read:?}");
        }
        let refused = api
            .read_manifests(Listing::new("o/r", "deploy", &commit(250), "team/busy"))
            .await;
        assert!(
            matches!(refused, Err(ForgeApiError::ReadShare { reads: 1, .. })),
            "{refused:?}"
        );
        let sent = server.received_requests().await.unwrap_or_default();
        assert_eq!(
            sent.len(),
            250,
            "249 listings and one file, nothing for the refused commit"
        );
        let other = api
            .read_manifests(Listing::new("o/r", "deploy", &commit(251), "team/quiet"))
            .await;
        assert!(other.is_ok(), "{other:?}");
    }

    /// An answer that is no tree listing (a proxy's page, a body cut off) is an error to retry:
    /// never "not a folder" or "not in the repository", which are kept for the commit.
    #[tokio::test]
    async fn an_answer_that_is_no_tree_is_retried_not_taken_for_a_missing_folder() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        Mock::given(method("GET"))
            .and(path_regex("/git/trees/"))
            .respond_with(ResponseTemplate::new(200).set_body_string("<html>maintenance</html>"))
            .mount(&server)
            .await;
        let sha = "c".repeat(40);
        let folder = api
            .read_folder(Listing::new("o/r", "deploy/chart", &sha, "test/pr-1"))
            .await;
        assert!(
            matches!(folder, Err(ForgeApiError::Transport { .. })),
            "{folder:?}"
        );
        let manifests = api
            .read_manifests(Listing::new("o/r", "deploy", &sha, "test/pr-1"))
            .await;
        assert!(
            matches!(manifests, Err(ForgeApiError::Transport { .. })),
            "{manifests:?}"
        );
    }

    /// GitHub's secondary limits may answer 403 with only their message (no `Retry-After`, a
    /// budget left): that is a rate limit, waited out for a minute as GitHub asks, not a
    /// refusal of the request.
    #[tokio::test]
    async fn a_403_with_the_secondary_limit_message_alone_is_a_rate_limit_of_a_minute() {
        use wiremock::matchers::method;
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        let message = json!({"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."});
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(403).set_body_json(message))
            .with_priority(1)
            .mount(&server)
            .await;
        let sent = api
            .commit_status(
                "o/r",
                &"a".repeat(40),
                CommitState::Success,
                "previewd/web",
                "",
                "",
            )
            .await;
        let Err(ForgeApiError::RateLimited { wait, .. }) = sent else {
            panic!("not a rate limit: {sent:?}");
        };
        assert_eq!(wait, std::time::Duration::from_secs(60));
        let next = api
            .deployment_status("o/r", 1, DeploymentState::Success, "")
            .await;
        assert!(
            matches!(next, Err(ForgeApiError::RateLimited { .. })),
            "{next:?}"
        );
    }

    /// A server at a template's `apiUrl` answers a tree listing with more than 8 MiB (GitHub
    /// cuts one off at 7 MB): previewd stops reading and says so (the call fails and is
    /// retried later), never holding the answer whole, nor reading on to the 16 MiB of other
    /// answers.
    #[tokio::test]
    async fn a_tree_answer_over_8_mib_is_refused_while_it_streams() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        let huge = vec![b' '; (8 << 20) + 1];
        Mock::given(method("GET"))
            .and(path_regex("/git/trees/"))
            .respond_with(ResponseTemplate::new(200).set_body_bytes(huge))
            .mount(&server)
            .await;
        let read = api
            .read_folder(Listing::new(
                "o/r",
                "deploy/chart",
                &"c".repeat(40),
                "test/pr-1",
            ))
            .await;
        let Err(ForgeApiError::Transport { message, .. }) = read else {
            panic!("not refused: {read:?}");
        };
        assert!(message.contains("larger than 8388608 bytes"), "{message}");
    }

    /// A blob is asked for only when the listing says it is at most 1 MiB: an answer over
    /// 2 MiB (1 MiB as base64 in JSON is about 1.4 MiB) is refused as it streams. Any other
    /// answer stops at 16 MiB.
    #[tokio::test]
    async fn a_blob_answer_over_2_mib_and_any_answer_over_16_mib_are_refused_while_they_stream() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        let (server, api) = accepting_github().await;
        let blob = "b".repeat(40);
        let listing = json!({"truncated": false, "tree": [
            {"path": "deploy/app.yaml", "type": "blob", "mode": "100644", "sha": blob, "size": 5}]});
        for (path, body) in [
            ("/git/trees/", serde_json::to_vec(&listing).unwrap()),
            ("/git/blobs/", vec![b' '; (2 << 20) + 1]),
            ("/issues/2/comments", vec![b' '; MAX_ANSWER_BYTES + 1]),
        ] {
            Mock::given(method("GET"))
                .and(path_regex(path))
                .respond_with(ResponseTemplate::new(200).set_body_bytes(body))
                .mount(&server)
                .await;
        }
        let read = api
            .read_manifests(Listing::new("o/r", "deploy", &"c".repeat(40), "test/pr-1"))
            .await;
        let Err(ForgeApiError::Transport { message, .. }) = read else {
            panic!("the blob was not refused: {read:?}");
        };
        assert!(message.contains("larger than 2097152 bytes"), "{message}");
        // (A client of its own: the refusal above backs the first one off.)
        let api = accepting_github_at(&server);
        let listed = api.find_comment("o/r", 2, "<!-- previewd").await;
        let Err(ForgeApiError::Transport { message, .. }) = listed else {
            panic!("the list was not refused: {listed:?}");
        };
        assert!(message.contains("larger than 16777216 bytes"), "{message}");
    }
}
