//! GitLab's REST API through the `gitlab` crate: the same calls as GitHub's (its note on the
//! merge request, commit statuses, environments and deployments, repository files, members'
//! access level, the open merge requests and branches the sweep lists), each through [`GitlabApi::run`], which applies the
//! backoff and a timeout and counts the call.

use std::collections::HashSet;
use std::sync::Arc;

use gitlab::api::projects::deployments::{CreateDeployment, DeploymentStatus, EditDeployment};
use gitlab::api::projects::members::AllProjectMember;
use gitlab::api::projects::merge_requests::notes::{
    CreateMergeRequestNote, EditMergeRequestNote, MergeRequestNotes,
};
use gitlab::api::projects::merge_requests::{MergeRequestState, MergeRequestView, MergeRequests};
use gitlab::api::projects::repository::branches::Branches;
use gitlab::api::projects::repository::commits::{CommitStatusState, CreateCommitStatus};
use gitlab::api::users::CurrentUser;
use gitlab::api::{AsyncQuery, Endpoint, Pageable, Pagination};
use serde::de::DeserializeOwned;

use super::environments::{
    CreateEnvironment, EditEnvironmentUrl, EnvironmentsNamed, StopEnvironment,
};
use super::tree::TreeAt;
use crate::forge::blobs::BlobCache;
use crate::forge::blobs::ReadAt;
use crate::forge::comment::CommitState;
use crate::forge::folders::{BlobSource, TreeFile, read_blobs, take_listing};
use crate::forge::limits::{MAX_MANIFEST_FILE_BYTES, MAX_MANIFEST_FILES, check_manifest_count};
use crate::forge::metrics::ForgeMetrics;
use crate::forge::seam::{AtPath, Depth, Listing};
use crate::forge::transport::{
    Backoff, FORGE_CONNECT_TIMEOUT, FORGE_TIMEOUT, ForgeApiError, error_summary, observe_rate_limit,
};
use crate::forge::vocabulary::DeploymentState;

/// The transport under the gitlab crate's endpoints: previewd's own HTTP client, so that the
/// token header is never sent on a redirect (the crate's own client follows redirects with
/// every header), with a timeout on every call and rate-limit accounting around it.
struct ObservedGitlab {
    http: reqwest::Client,
    /// `<apiUrl>/api/v4/`.
    rest_url: url::Url,
    token: http::HeaderValue,
    backoff: Arc<Backoff>,
    metrics: ForgeMetrics,
}

/// A failed GitLab call, as the gitlab crate's endpoints report it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GitlabCallError(String);

/// A failed GitLab call: the HTTP status when GitLab answered (a 404 and a 503 call for
/// different things), and what it said.
struct GitlabFailure {
    status: Option<u16>,
    message: String,
}

impl<E: std::error::Error + Send + Sync + 'static> From<gitlab::api::ApiError<E>>
    for GitlabFailure
{
    fn from(error: gitlab::api::ApiError<E>) -> Self {
        use gitlab::api::ApiError;
        let status = match &error {
            ApiError::GitlabService { status, .. }
            | ApiError::GitlabWithStatus { status, .. }
            | ApiError::GitlabObjectWithStatus { status, .. }
            | ApiError::GitlabUnrecognizedWithStatus { status, .. } => Some(status.as_u16()),
            _ => None,
        };
        Self {
            status,
            message: error.to_string(),
        }
    }
}

impl gitlab::api::RestClient for ObservedGitlab {
    type Error = GitlabCallError;

    fn rest_endpoint(
        &self,
        endpoint: &str,
    ) -> Result<url::Url, gitlab::api::ApiError<Self::Error>> {
        Ok(self.rest_url.join(endpoint)?)
    }
}

#[async_trait::async_trait]
impl gitlab::api::AsyncClient for ObservedGitlab {
    async fn rest_async(
        &self,
        mut request: http::request::Builder,
        body: Vec<u8>,
    ) -> Result<http::Response<bytes::Bytes>, gitlab::api::ApiError<Self::Error>> {
        let failed = |e: &dyn std::fmt::Display| {
            gitlab::api::ApiError::client(GitlabCallError(e.to_string()))
        };
        if let Some(headers) = request.headers_mut() {
            headers.insert("PRIVATE-TOKEN", self.token.clone());
        }
        let request = request.body(body).map_err(|e| failed(&e))?;
        let request = reqwest::Request::try_from(request).map_err(|e| failed(&e))?;
        let answer = self.http.execute(request).await.map_err(|e| failed(&e))?;
        self.observe(&answer);
        let mut response = http::Response::builder().status(answer.status());
        if let Some(headers) = response.headers_mut() {
            headers.extend(answer.headers().clone());
        }
        let body = read_capped(answer, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| failed(&e))?;
        response.body(body).map_err(|e| failed(&e))
    }
}

impl ObservedGitlab {
    /// Reads the budget headers of `answer`; a rate-limit refusal pauses the client. GitLab
    /// counts requests per user: a project or personal token is one budget.
    fn observe(&self, answer: &reqwest::Response) {
        observe_rate_limit(
            ("gitlab", "token"),
            answer.status(),
            answer.headers(),
            &self.metrics,
            &self.backoff,
        );
    }

    /// `GET` of `endpoint` (below the API URL), of which at most `limit` bytes are read:
    /// `Ok(None)` when the answer is longer (by its declared length, or as it streams).
    async fn get_capped(
        &self,
        endpoint: &str,
        limit: usize,
    ) -> Result<Option<bytes::Bytes>, GitlabFailure> {
        let failed = |message: String| GitlabFailure {
            status: None,
            message,
        };
        let url = self
            .rest_url
            .join(endpoint)
            .map_err(|e| failed(e.to_string()))?;
        let answer = self
            .http
            .get(url)
            .header("PRIVATE-TOKEN", self.token.clone())
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        self.observe(&answer);
        let status = answer.status();
        if !status.is_success() {
            // What GitLab said, within a bound of its own.
            let said = read_capped(answer, 64 << 10).await.unwrap_or_default();
            return Err(GitlabFailure {
                status: Some(status.as_u16()),
                message: String::from_utf8_lossy(&said).into_owned(),
            });
        }
        match read_capped(answer, limit).await {
            Ok(body) => Ok(Some(body)),
            Err(CappedRead::TooLarge { .. }) => Ok(None),
            Err(other) => Err(failed(other.to_string())),
        }
    }
}

/// The most of one GitLab answer previewd reads. GitLab's tree gives no file sizes, so a file a
/// pull request committed (a manifest, a chart file) is known to be too large only as it is
/// read: without a bound, a multi-gigabyte file would be held whole in previewd's memory before
/// the per-file limit refused it. Far above any answer previewd needs (a 1 MiB file, a page of
/// 100 merge requests).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why an answer was not read whole.
#[derive(Debug, thiserror::Error)]
enum CappedRead {
    #[error("GitLab's answer is larger than {limit} bytes; previewd reads no more of it")]
    TooLarge { limit: usize },
    #[error("{0}")]
    Transport(String),
}

/// The body of `answer`, refused as soon as it passes `limit` bytes (by its declared length, or
/// while it streams): never more than `limit` bytes are held.
async fn read_capped(
    mut answer: reqwest::Response,
    limit: usize,
) -> Result<bytes::Bytes, CappedRead> {
    if answer
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(CappedRead::TooLarge { limit });
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = answer
        .chunk()
        .await
        .map_err(|e| CappedRead::Transport(e.to_string()))?
    {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(CappedRead::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

pub struct GitlabApi {
    client: ObservedGitlab,
    backoff: Arc<Backoff>,
    metrics: ForgeMetrics,
    /// The id of the user the token belongs to, once asked (`GET /user`): previewd's own
    /// notes are that user's.
    own_user: tokio::sync::OnceCell<u64>,
    /// Repository files by blob id, shared by every client of one
    /// [`crate::forge::client::ForgeClients`].
    blobs: Arc<BlobCache>,
    /// Whose reads these are ([`crate::forge::client::ForgeClient::scope`]).
    scope: String,
}

#[derive(serde::Deserialize)]
struct Note {
    id: u64,
    #[serde(default)]
    body: String,
    author: Option<UserId>,
}

#[derive(serde::Deserialize)]
struct UserId {
    id: u64,
}

impl GitlabApi {
    /// A client for `api_url` (GitLab.com by default). Makes no call: a wrong token shows on
    /// the first one.
    pub async fn connect(
        api_url: Option<&str>,
        token: String,
        metrics: ForgeMetrics,
    ) -> Result<Self, ForgeApiError> {
        let api_url = api_url.unwrap_or("https://gitlab.com");
        let bad_url = || ForgeApiError::BadUrl(api_url.to_string());
        let base = url::Url::parse(api_url).map_err(|_| bad_url())?;
        if base.host_str().is_none() {
            return Err(bad_url());
        }
        let rest_url = base.join("/api/v4/").map_err(|_| bad_url())?;
        let mut token =
            http::HeaderValue::from_str(&token).map_err(|_| ForgeApiError::Transport {
                operation: "build client",
                message: "the GitLab token holds characters an HTTP header cannot carry".into(),
            })?;
        token.set_sensitive(true);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(FORGE_CONNECT_TIMEOUT)
            .timeout(FORGE_TIMEOUT)
            .user_agent(concat!("previewd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ForgeApiError::Transport {
                operation: "build client",
                message: e.to_string(),
            })?;
        let backoff = Arc::new(Backoff::default());
        Ok(Self {
            client: ObservedGitlab {
                http,
                rest_url,
                token,
                backoff: backoff.clone(),
                metrics: metrics.clone(),
            },
            backoff,
            metrics,
            own_user: tokio::sync::OnceCell::new(),
            blobs: Arc::default(),
            scope: crate::forge::vocabulary::unshared_scope(),
        })
    }

    /// The id of the user the token belongs to.
    async fn own_user(&self) -> Result<u64, ForgeApiError> {
        let id = self.own_user.get_or_try_init(|| async {
            let endpoint = built("own_user", CurrentUser::builder().build())?;
            let user: UserId = self.query("own_user", endpoint).await?;
            Ok::<u64, ForgeApiError>(user.id)
        });
        id.await.copied()
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

    async fn run<T, F, Fut>(&self, operation: &'static str, call: F) -> Result<T, ForgeApiError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<T, GitlabFailure>>,
    {
        self.backoff.check(operation)?;
        // The gitlab crate's HTTP client has no timeout of its own.
        let result = match tokio::time::timeout(FORGE_TIMEOUT, call()).await {
            Ok(result) => result,
            Err(_) => Err(GitlabFailure {
                status: None,
                message: format!("no answer within {} s", FORGE_TIMEOUT.as_secs()),
            }),
        };
        // A rate-limit answer set the backoff while it was observed (`observe_rate_limit`).
        // (This answer's own status: a sibling call's 429 sets the same backoff.)
        let limited = match (&result, self.backoff.check(operation)) {
            (Err(failure), Err(limited @ ForgeApiError::RateLimited { .. }))
                if failure.status == Some(429) =>
            {
                Some(limited)
            }
            _ => None,
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(_) if limited.is_some() => "rate_limited",
            Err(_) => "error",
        };
        self.metrics
            .requests
            .with_label_values(&["gitlab", operation, outcome])
            .inc();
        match result {
            Ok(value) => {
                self.backoff.success();
                Ok(value)
            }
            // Said as such, so the content budget pauses too, as for GitHub.
            Err(_) if let Some(limited) = limited => Err(limited),
            Err(failure) => {
                // A refusal (4xx) is about that request, not about GitLab's health: only
                // failures back off, as for GitHub.
                let refused = failure.status.is_some_and(|status| status < 500);
                if outcome == "error" && !refused {
                    self.backoff.failure();
                }
                let message = error_summary(&failure.message);
                Err(match failure.status {
                    Some(status) => ForgeApiError::Http {
                        operation,
                        status,
                        message,
                    },
                    None => ForgeApiError::Transport { operation, message },
                })
            }
        }
    }

    /// One query, its answer deserialized.
    async fn query<T, E>(&self, operation: &'static str, endpoint: E) -> Result<T, ForgeApiError>
    where
        E: Endpoint + Sync,
        T: DeserializeOwned + Send + 'static,
    {
        self.run(operation, || async {
            endpoint
                .query_async(&self.client)
                .await
                .map_err(GitlabFailure::from)
        })
        .await
    }

    /// Every item of a paged list, up to `pagination`.
    async fn list<T, E>(
        &self,
        operation: &'static str,
        endpoint: E,
        pagination: Pagination,
    ) -> Result<Vec<T>, ForgeApiError>
    where
        E: Endpoint + Pageable + Sync,
        T: DeserializeOwned + Send + 'static,
    {
        self.run(operation, || async {
            gitlab::api::paged(endpoint, pagination)
                .query_async(&self.client)
                .await
                .map_err(GitlabFailure::from)
        })
        .await
    }

    /// One query whose answer is not needed.
    async fn send<E: Endpoint + Sync>(
        &self,
        operation: &'static str,
        endpoint: E,
    ) -> Result<(), ForgeApiError> {
        self.run(operation, || async {
            gitlab::api::ignore(endpoint)
                .query_async(&self.client)
                .await
                .map_err(GitlabFailure::from)
        })
        .await
    }

    pub(crate) async fn find_comment(
        &self,
        project: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<u64>, ForgeApiError> {
        let endpoint = MergeRequestNotes::builder()
            .project(project)
            .merge_request(number)
            .build();
        let endpoint = built("list_comments", endpoint)?;
        let notes: Vec<Note> = self
            .list("list_comments", endpoint, Pagination::Limit(1000))
            .await?;
        if !notes.iter().any(|n| n.body.starts_with(marker)) {
            return Ok(None);
        }
        // Anyone can start a note with previewd's marker: only the token's user's count.
        let own = self.own_user().await?;
        Ok(notes
            .into_iter()
            .find(|n| n.body.starts_with(marker) && n.author.as_ref().is_some_and(|a| a.id == own))
            .map(|n| n.id))
    }

    pub(crate) async fn create_comment(
        &self,
        project: &str,
        number: u64,
        body: &str,
    ) -> Result<u64, ForgeApiError> {
        let endpoint = CreateMergeRequestNote::builder()
            .project(project)
            .merge_request(number)
            .body(body)
            .build();
        let endpoint = built("create_comment", endpoint)?;
        let note: Note = self.query("create_comment", endpoint).await?;
        Ok(note.id)
    }

    pub(crate) async fn edit_comment(
        &self,
        project: &str,
        number: u64,
        id: u64,
        body: &str,
    ) -> Result<(), ForgeApiError> {
        let endpoint = EditMergeRequestNote::builder()
            .project(project)
            .merge_request(number)
            .note(id)
            .body(body)
            .build();
        self.send("edit_comment", built("edit_comment", endpoint)?)
            .await
    }

    /// What `at.sha` holds at `at.path`. GitLab lists a file's path as an empty folder: one
    /// level down, an empty listing is looked for as a file in its parent folder (a
    /// template's manifests may name one file; a chart or overlay is always a folder).
    pub(super) async fn at_path(
        &self,
        at: Listing<'_>,
        depth: Depth,
    ) -> Result<AtPath, ForgeApiError> {
        let (project, reader, root, sha) = (at.repository, at.reader, at.path, at.sha);
        let recursive = depth == Depth::Every;
        let entries = self.tree(project, reader, root, sha, recursive).await?;
        if !entries.is_empty() {
            let files = entries
                .into_iter()
                .filter(|e| e.is_file())
                .map(|e| {
                    // One level: a file's own name, whatever spelling of the folder GitLab
                    // resolved (`./deploy`, `deploy//app`); below it, the path under the folder.
                    let relative = match recursive {
                        false => e.name.clone(),
                        true => {
                            let below = e.path.strip_prefix(root).unwrap_or(&e.path);
                            below.trim_start_matches('/').to_string()
                        }
                    };
                    e.named(relative)
                })
                .collect();
            return Ok(AtPath::Folder(files));
        }
        if recursive {
            return Ok(AtPath::Missing);
        }
        let (parent, name) = root.rsplit_once('/').unwrap_or(("", root));
        let siblings = self.tree(project, reader, parent, sha, false).await?;
        let file = siblings.into_iter().find(|e| e.name == name && e.is_file());
        Ok(match file {
            Some(file) => AtPath::File(file.named(name.to_string())),
            None => AtPath::Missing,
        })
    }

    /// The entries of folder `path` at commit `sha` (every level below it when `recursive`).
    /// A listing cut off at its limit is refused, not read in part: 800 entries below a folder
    /// (folders count too), 1,000 in one level (of which only the YAML files are read).
    async fn tree(
        &self,
        project: &str,
        reader: &str,
        path: &str,
        sha: &str,
        recursive: bool,
    ) -> Result<Vec<TreeEntry>, ForgeApiError> {
        const MOST_ENTRIES: usize = 4 * MAX_MANIFEST_FILES;
        const MOST_IN_ONE_LEVEL: usize = 1000;
        let most = if recursive {
            MOST_ENTRIES
        } else {
            MOST_IN_ONE_LEVEL + 1
        };
        let tree = TreeAt {
            project,
            path,
            sha,
            recursive,
        };
        // One read of `reader`'s and the project's hour, taken first; the pages past the first
        // (100 entries each) are counted once listed.
        let at = ReadAt {
            origin: self.client.rest_url.as_str(),
            repository: project,
            reader,
        };
        take_listing(&self.blobs, at, &format!("{sha}:{path}:{recursive}"))?;
        let entries: Vec<TreeEntry> = self
            .list("read_tree", tree, Pagination::Limit(most))
            .await?;
        let more_pages = entries.len().saturating_sub(1) / 100;
        self.blobs
            .record_reads(at, more_pages, std::time::Instant::now());
        if recursive && entries.len() >= MOST_ENTRIES {
            check_manifest_count(path, entries.len())?;
        }
        if !recursive && entries.len() > MOST_IN_ONE_LEVEL {
            return Err(ForgeApiError::ManifestsTooLarge {
                path: path.to_string(),
                problem: format!(
                    "more than {MOST_IN_ONE_LEVEL} entries in one folder; none was read"
                ),
            });
        }
        Ok(entries)
    }

    /// `files` of `project`, from the blob cache or by `GET …/repository/blobs/{id}/raw`, of
    /// which no more than the per-file limit is read.
    pub(super) async fn read_blobs(
        &self,
        project: &str,
        reader: &str,
        root: &str,
        files: Vec<TreeFile>,
    ) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError> {
        let origin = self.client.rest_url.as_str();
        let source = BlobSource {
            cache: &self.blobs,
            metrics: &self.metrics,
            forge: "gitlab",
            origin,
            repository: project,
            reader,
        };
        read_blobs(root, files, source, |file| async move {
            let project = gitlab::api::common::NameOrId::from(project);
            let endpoint = format!("projects/{project}/repository/blobs/{}/raw", file.blob);
            let limit = MAX_MANIFEST_FILE_BYTES;
            let read = self
                .run("read_blob", || self.client.get_capped(&endpoint, limit))
                .await?;
            read.map(|bytes| bytes.to_vec()).ok_or_else(|| ForgeApiError::ManifestsTooLarge {
                path: file.path.clone(),
                problem: format!(
                    "more than the limit of {limit} bytes per manifest file; previewd read no more of it"
                ),
            })
        })
        .await
    }

    /// Whether the user with id `user_id` is a Developer (30) or above in the project (or a
    /// group above it).
    pub(crate) async fn write_access(
        &self,
        project: &str,
        user_id: u64,
    ) -> Result<bool, ForgeApiError> {
        #[derive(serde::Deserialize)]
        struct Member {
            access_level: u64,
        }
        const DEVELOPER: u64 = 30;
        let endpoint = AllProjectMember::builder()
            .project(project)
            .user(user_id)
            .build();
        let endpoint = built("get_permission", endpoint)?;
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
                    Err(e) => Err(GitlabFailure::from(e)),
                }
            })
            .await?;
        Ok(member.is_some_and(|m| m.access_level >= DEVELOPER))
    }

    pub(crate) async fn open_merge_requests(
        &self,
        project: &str,
    ) -> Result<HashSet<u64>, ForgeApiError> {
        #[derive(serde::Deserialize)]
        struct MergeRequest {
            iid: u64,
        }
        // `view=simple`: only ids, title and state, the cheapest form of the list (GitLab
        // documents no conditional requests for its REST lists), 100 per page.
        let endpoint = MergeRequests::builder()
            .project(project)
            .state(MergeRequestState::Opened)
            .view(MergeRequestView::Simple)
            .build();
        let endpoint = built("list_pull_requests", endpoint)?;
        let open: Vec<MergeRequest> = self
            .list("list_pull_requests", endpoint, Pagination::All)
            .await?;
        Ok(open.into_iter().map(|mr| mr.iid).collect())
    }

    pub(crate) async fn branches(&self, project: &str) -> Result<HashSet<String>, ForgeApiError> {
        #[derive(serde::Deserialize)]
        struct Branch {
            name: String,
        }
        let endpoint = built(
            "list_branches",
            Branches::builder().project(project).build(),
        )?;
        let branches: Vec<Branch> = self
            .list("list_branches", endpoint, Pagination::All)
            .await?;
        Ok(branches.into_iter().map(|b| b.name).collect())
    }

    pub(crate) async fn commit_status(
        &self,
        project: &str,
        sha: &str,
        state: CommitState,
        context: &str,
        target_url: &str,
        description: &str,
    ) -> Result<(), ForgeApiError> {
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
            .build();
        self.send("commit_status", built("commit_status", endpoint)?)
            .await
    }

    /// The id of the GitLab environment `name`, created (tier `development`) if it does not
    /// exist yet; an existing one gets `external_url` when it is known. Looked up first so
    /// that a restart, or a second replica, never makes a second one.
    pub(crate) async fn environment(
        &self,
        project: &str,
        name: &str,
        external_url: &str,
    ) -> Result<u64, ForgeApiError> {
        #[derive(serde::Deserialize)]
        struct Environment {
            id: u64,
            #[serde(default)]
            name: String,
        }
        let named = EnvironmentsNamed { project, name };
        let found: Vec<Environment> = self.query("find_environment", named).await?;
        if let Some(existing) = found.into_iter().find(|e| e.name == name) {
            if !external_url.is_empty() {
                self.environment_url(project, existing.id, external_url)
                    .await?;
            }
            return Ok(existing.id);
        }
        let create = CreateEnvironment {
            project,
            name,
            external_url,
        };
        let created: Environment = self.query("create_environment", create).await?;
        Ok(created.id)
    }

    pub(crate) async fn environment_url(
        &self,
        project: &str,
        id: u64,
        external_url: &str,
    ) -> Result<(), ForgeApiError> {
        let edit = EditEnvironmentUrl {
            project,
            id,
            external_url,
        };
        self.send("edit_environment", edit).await
    }

    /// Stops environment `id`: GitLab shows it under *Stopped* and the merge request widget
    /// no longer offers *View app*.
    pub(crate) async fn stop_environment(
        &self,
        project: &str,
        id: u64,
    ) -> Result<(), ForgeApiError> {
        self.send("stop_environment", StopEnvironment { project, id })
            .await
    }

    /// A deployment of `sha` (on branch `reference`) to environment `name`; returns its id.
    pub(crate) async fn create_deployment(
        &self,
        project: &str,
        name: &str,
        sha: &str,
        reference: &str,
        state: DeploymentState,
    ) -> Result<u64, ForgeApiError> {
        #[derive(serde::Deserialize)]
        struct Deployment {
            id: u64,
        }
        let endpoint = CreateDeployment::builder()
            .project(project)
            .environment(name)
            .sha(sha)
            .ref_(reference)
            .tag(false)
            .status(deployment_status(state))
            .build();
        let endpoint = built("create_deployment", endpoint)?;
        let created: Deployment = self.query("create_deployment", endpoint).await?;
        Ok(created.id)
    }

    pub(crate) async fn deployment_status(
        &self,
        project: &str,
        id: u64,
        state: DeploymentState,
    ) -> Result<(), ForgeApiError> {
        let endpoint = EditDeployment::builder()
            .project(project)
            .deployment_id(id)
            .status(deployment_status(state))
            .build();
        self.send("deployment_status", built("deployment_status", endpoint)?)
            .await
    }
}

/// GitLab's deployment status for previewd's state (GitLab has no `inactive`: an environment
/// that is gone is stopped instead).
fn deployment_status(state: DeploymentState) -> DeploymentStatus {
    match state {
        DeploymentState::InProgress => DeploymentStatus::Running,
        DeploymentState::Success => DeploymentStatus::Success,
        DeploymentState::Failure => DeploymentStatus::Failed,
        DeploymentState::Inactive => DeploymentStatus::Canceled,
    }
}

/// An endpoint builder's result as the operation's result (a builder fails only on a missing
/// field, which would be a bug here, but it must not panic).
fn built<T, E: std::fmt::Display>(
    operation: &'static str,
    result: Result<T, E>,
) -> Result<T, ForgeApiError> {
    result.map_err(|e| ForgeApiError::Transport {
        operation,
        message: e.to_string(),
    })
}

/// An entry of GitLab's repository tree.
#[derive(serde::Deserialize)]
struct TreeEntry {
    /// The blob id of a file.
    id: String,
    name: String,
    path: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    mode: String,
}

impl TreeEntry {
    /// A regular file (links and submodules are left out: previewd reads files only).
    fn is_file(&self) -> bool {
        self.kind == "blob" && matches!(self.mode.as_str(), "100644" | "100755")
    }

    fn named(self, path: String) -> TreeFile {
        TreeFile {
            path,
            blob: self.id,
            size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::seam::{ForgeApi, Listing};

    #[tokio::test]
    async fn a_commit_status_carries_the_environment_url_as_target_url() {
        // previewd's HTTP client is built with rustls, which needs its provider chosen.
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(
                wiremock::ResponseTemplate::new(201).set_body_json(serde_json::json!({"id": 1})),
            )
            .mount(&server)
            .await;
        let uri = server.uri();
        let api = GitlabApi::connect(
            Some(uri.as_str()),
            "glpat-test".into(),
            ForgeMetrics::default(),
        )
        .await
        .unwrap();
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let environment_url = "https://mr-1.preview.example.com";
        api.commit_status(
            "group/app",
            sha,
            CommitState::Success,
            "previewd/web",
            environment_url,
            "Preview environment ready",
        )
        .await
        .unwrap();
        let received = server.received_requests().await.unwrap_or_default();
        let [request] = received.as_slice() else {
            panic!("one commit status: {received:?}");
        };
        let path = request.url.path();
        assert!(path.ends_with(&format!("/statuses/{sha}")), "{path}");
        // GitLab takes the status as a form.
        let form: std::collections::HashMap<String, String> =
            url::form_urlencoded::parse(&request.body)
                .into_owned()
                .collect();
        assert_eq!(
            form.get("target_url").map(String::as_str),
            Some(environment_url)
        );
        assert_eq!(form.get("state").map(String::as_str), Some("success"));
        assert_eq!(form.get("name").map(String::as_str), Some("previewd/web"));
    }

    /// A pull request commits a huge manifest into `repositoryPath` on GitLab, whose tree gives
    /// no sizes. previewd stops reading a file past the per-file limit and says so, never
    /// holding it whole (before, every GitLab answer was read to its end): a file of 16 MiB
    /// and one of 2 MiB are both refused as too large.
    /// A folder named another way than GitLab answers with (`./deploy`): its files are read by
    /// their own names, as before the listing was shared; naming them by the path under the
    /// folder as asked left every file out of the manifests.
    #[tokio::test]
    async fn a_folder_spelled_another_way_is_read_by_its_files_names() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        let blob = "a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba";
        let tree = serde_json::json!([
            {"id": blob, "name": "app.yaml", "type": "blob", "path": "deploy/app.yaml", "mode": "100644"}
        ]);
        Mock::given(method("GET"))
            .and(path_regex("/repository/tree$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(tree))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(format!("/repository/blobs/{blob}/raw$")))
            .respond_with(ResponseTemplate::new(200).set_body_string("kind: ConfigMap\n"))
            .mount(&server)
            .await;
        let metrics = ForgeMetrics::default();
        let uri = server.uri();
        let api = GitlabApi::connect(Some(&uri), "glpat-test".into(), metrics);
        let api = api.await.unwrap();
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let read = api
            .read_manifests(Listing::new("group/app", "./deploy", sha, "test/pr-1"))
            .await
            .unwrap();
        assert_eq!(
            read,
            vec![("app.yaml".to_string(), "kind: ConfigMap\n".to_string())]
        );
    }

    #[tokio::test]
    async fn a_huge_file_on_gitlab_is_refused_while_it_streams_not_held_whole() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        let tree = serde_json::json!([
            {"id": "a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba", "name": "app.yaml", "type": "blob", "path": "deploy/app.yaml", "mode": "100644"}
        ]);
        Mock::given(method("GET"))
            .and(path_regex("/repository/tree$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(tree))
            .mount(&server)
            .await;
        let huge = vec![b'x'; MAX_ANSWER_BYTES + 1];
        Mock::given(method("GET"))
            .and(path_regex(
                "/repository/blobs/a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba/raw$",
            ))
            .respond_with(ResponseTemplate::new(200).set_body_bytes(huge))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        let large = vec![b'x'; 2 << 20];
        Mock::given(method("GET"))
            .and(path_regex(
                "/repository/blobs/a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba/raw$",
            ))
            .respond_with(ResponseTemplate::new(200).set_body_bytes(large))
            .mount(&server)
            .await;
        // A client each read: a failed read makes a client back off from GitLab for a while.
        let uri = server.uri();
        let refused_read = || async {
            let metrics = ForgeMetrics::default();
            let api = GitlabApi::connect(Some(uri.as_str()), "glpat-test".into(), metrics);
            let api = api.await.unwrap();
            let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
            api.read_manifests(Listing::new("group/app", "deploy", sha, "test/pr-1"))
                .await
                .unwrap_err()
        };
        for size in ["16 MiB", "2 MiB"] {
            let refused = refused_read().await;
            assert!(
                matches!(refused, ForgeApiError::ManifestsTooLarge { .. })
                    && refused.to_string().contains("previewd read no more of it"),
                "{size}: {refused}"
            );
        }
    }

    /// A folder of more than 1,000 entries (GitLab lists them 100 a page) is refused, not read
    /// in part: applying the YAML files of the first 1,000 only would deploy half an app.
    #[tokio::test]
    async fn a_folder_of_more_than_1000_entries_is_refused_not_read_in_part() {
        use wiremock::matchers::{method, path_regex};
        use wiremock::{Mock, ResponseTemplate};
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        // 1,000 files that are no manifests, then the one manifest: cut off at 1,000, the
        // folder would look empty of manifests and deploy nothing.
        let name = |i: usize| match i {
            1000 => "app.yaml".to_string(),
            _ => format!("asset-{i}.txt"),
        };
        let entries: Vec<_> = (0..1001)
            .map(|i| {
                serde_json::json!({"id": format!("{i:040x}"), "name": name(i),
                    "type": "blob", "path": format!("deploy/{}", name(i)), "mode": "100644"})
            })
            .collect();
        Mock::given(method("GET"))
            .and(path_regex("/repository/tree$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(entries))
            .mount(&server)
            .await;
        let uri = server.uri();
        let api = GitlabApi::connect(Some(&uri), "glpat-test".into(), Default::default());
        let api = api.await.unwrap();
        let read = api
            .read_manifests(Listing::new("group/app", "deploy", "c0ffee", "test/pr-1"))
            .await;
        let Err(ForgeApiError::ManifestsTooLarge { problem, .. }) = read else {
            panic!("not refused: {read:?}");
        };
        assert!(problem.contains("more than 1000 entries"), "{problem}");
        // The listing's 11 pages of 100 spent 11 of the environment's 250 reads of the hour.
        let at = crate::forge::blobs::ReadAt {
            origin: api.client.rest_url.as_str(),
            repository: "group/app",
            reader: "test/pr-1",
        };
        let now = std::time::Instant::now();
        assert!(api.blobs.take_reads(at, 239, now).is_ok());
        assert!(api.blobs.take_reads(at, 1, now).is_err(), "250 spent");
    }
}
