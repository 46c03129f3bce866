//! The forges previewd listens to (GitHub, GitLab): webhook deliveries verified and parsed into
//! one typed [`ForgeEvent`], whatever forge sent them.
//!
//! Parsing is pure and forgiving: unknown fields are ignored, optional ones may be missing (the
//! same deliveries arrive with more fields over time). What matters to previewd is only the
//! current state of a pull/merge request or branch, so every "still open" action (opened,
//! synchronize, labeled, …) becomes the same [`EventKind::ChangeRequest`] snapshot.

pub mod access;
mod admission;
pub mod blobs;
pub mod budget;
pub mod client;
pub(crate) mod comment;
mod folders;
pub mod forges;
pub mod github;
pub mod gitlab;
mod json_path;
mod limits;
pub mod metrics;
pub mod report;
pub mod report_plan;
pub mod repository;
pub mod seam;
pub mod template_client;
mod transport;
mod vocabulary;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

pub use crate::model::crd::{CheckState, ForgeKind};

/// One verified delivery, forge-neutral.
#[derive(Clone, Debug, PartialEq)]
pub struct ForgeEvent {
    pub forge: ForgeKind,
    /// `owner/name` (GitHub) or the project's full path (GitLab).
    pub repository: String,
    pub kind: EventKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// A pull/merge request is open, in this state (opened, reopened, new commits, labels
    /// changed, draft toggled, edited).
    ChangeRequest(ChangeRequest),
    /// A pull/merge request was closed, merged or not.
    ChangeRequestClosed {
        number: u64,
        branch: String,
        merged: bool,
        /// When the forge says the request last changed (the close): a close older than the
        /// state the environment recorded (a reopen after it) is a replay, and deletes nothing.
        changed_at: Option<DateTime<Utc>>,
    },
    /// New commits on a branch (also the first push of a new branch).
    Push(Push),
    /// A branch was deleted.
    BranchDeleted { branch: String },
    /// A comment on a pull/merge request (comment commands).
    Comment(Comment),
    /// A CI result for a commit (a template may wait for it before deploying the commit).
    Check(CheckResult),
    /// The forge checks that the hook works.
    Ping,
    /// Something previewd does not act on; the reason is logged.
    Ignored(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChangeRequest {
    pub number: u64,
    /// The forge's word for what happened (`opened`, `synchronize`, `update`, …), for logs.
    pub action: String,
    /// The head (source) branch.
    pub branch: String,
    pub head_sha: String,
    pub author: Option<String>,
    pub draft: bool,
    /// The head branch lives in another repository (a fork).
    pub fork: bool,
    pub labels: Vec<String>,
    /// When the forge says the pull/merge request last changed (its own clock): orders
    /// deliveries that arrive out of order.
    pub changed_at: Option<DateTime<Utc>>,
    /// The head commit's message, where the delivery carries it (GitLab's `last_commit`;
    /// GitHub's `pull_request` delivery has none).
    pub head_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Push {
    pub branch: String,
    pub head_sha: String,
    pub author: Option<String>,
    /// When the forge received the push (GitHub's `repository.pushed_at`; GitLab sends none).
    pub changed_at: Option<DateTime<Utc>>,
    /// Every file the pushed commits added, modified or removed; `None` when the delivery does
    /// not list them all (a new or force-pushed branch, more commits than it lists).
    pub files: Option<Vec<String>>,
    /// The head commit's message, where the delivery carries it.
    pub head_message: Option<String>,
}

/// A commit of a push delivery (GitHub and GitLab name these fields alike).
#[derive(serde::Deserialize)]
pub(crate) struct PushedCommit {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub added: Vec<String>,
    #[serde(default)]
    pub modified: Vec<String>,
    #[serde(default)]
    pub removed: Vec<String>,
}

impl PushedCommit {
    pub fn file_lists(&self) -> [&[String]; 3] {
        [&self.added, &self.modified, &self.removed]
    }
}

/// The most changed files previewd reads from one push delivery; a push that changed more is
/// treated as "changed everything" (never skipped by path filters).
pub const MAX_PUSHED_FILES: usize = 3000;

/// The files of `commits` (each its added, modified and removed lists), once each, sorted;
/// `None` beyond [`MAX_PUSHED_FILES`].
pub fn pushed_files<'a>(commits: impl IntoIterator<Item = &'a [String]>) -> Option<Vec<String>> {
    let mut files = std::collections::BTreeSet::new();
    for list in commits {
        for file in list {
            files.insert(file.clone());
            if files.len() > MAX_PUSHED_FILES {
                return None;
            }
        }
    }
    Some(files.into_iter().collect())
}

/// A CI result for one commit: a GitHub check run, check suite or commit status; a GitLab
/// pipeline or job.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    pub sha: String,
    /// The name a template's `waitForChecks` uses: a check run's name, a commit status's
    /// context, a check suite's app slug; on GitLab `pipeline` or a job's name.
    pub name: String,
    pub state: CheckState,
}

/// A forge timestamp: RFC 3339 (`2019-05-15T15:20:33Z`), GitLab's `2013-12-03 17:23:34 UTC`,
/// or Unix seconds (GitHub's `pushed_at` in push deliveries). Anything else is `None`.
pub fn forge_time(value: &serde_json::Value) -> Option<DateTime<Utc>> {
    match value {
        serde_json::Value::Number(seconds) => DateTime::from_timestamp(seconds.as_i64()?, 0),
        serde_json::Value::String(text) => DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&Utc))
            .ok()
            .or_else(|| {
                chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S UTC")
                    .ok()
                    .map(|t| t.and_utc())
            }),
        _ => None,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Comment {
    /// The pull/merge request's number.
    pub number: u64,
    pub author: String,
    /// The author's numeric id (GitLab asks membership by id).
    pub author_id: Option<u64>,
    pub body: String,
}

/// A delivery's body as the type of its `event` (the event named in the error).
fn from_json<T: serde::de::DeserializeOwned>(event: &str, body: &[u8]) -> Result<T, ParseError> {
    serde_json::from_slice(body).map_err(|source| ParseError::Json {
        event: event.to_string(),
        source,
    })
}

/// Why a delivery could not be parsed (answered with 400).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("the body is not valid JSON for a {event} delivery: {source}")]
    Json {
        event: String,
        source: serde_json::Error,
    },
    #[error("the delivery has no {0}")]
    Missing(&'static str),
}

/// Why a delivery was not accepted as coming from the forge (answered with 401).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the delivery carries no {0} header")]
    Missing(&'static str),
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    #[error("the signature does not match the webhook secret")]
    Mismatch,
}

/// Equality of two secrets in time that does not depend on where they differ: both are hashed
/// to 32 bytes first, so their lengths do not show either.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A CI result as an event; one without a name or commit (`what`: the forge's word for it)
/// is ignored, never recorded under an empty key.
fn check_result(what: &str, check: CheckResult) -> EventKind {
    if check.name.is_empty() || check.sha.is_empty() {
        return EventKind::Ignored(format!("{what} without a name or commit"));
    }
    EventKind::Check(check)
}

/// A commit id of all zeros: the "after" of a branch deletion.
fn is_null_sha(sha: &str) -> bool {
    !sha.is_empty() && sha.bytes().all(|b| b == b'0')
}

/// `refs/heads/<branch>` → `<branch>`; tags and other refs → `None`.
fn branch_of_ref(reference: &str) -> Option<&str> {
    reference.strip_prefix("refs/heads/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_content_only() {
        assert!(secrets_equal(b"s3cret", b"s3cret"));
        assert!(!secrets_equal(b"s3cret", b"s3creT"));
        assert!(!secrets_equal(b"s3cret", b"s3cret "));
        assert!(!secrets_equal(b"", b"x"));
    }

    #[test]
    fn a_push_of_more_than_3000_files_has_no_file_list() {
        let files: Vec<String> = (0..3000).map(|n| format!("src/f{n}.rs")).collect();
        // A file two commits changed counts once: still 3,000, still listed.
        let twice = pushed_files([files.as_slice(), files.as_slice()]);
        assert_eq!(twice.map(|listed| listed.len()), Some(3000));
        // One more is "changed everything": no path filter can skip it.
        let one_more = vec!["README.md".to_string()];
        assert_eq!(pushed_files([files.as_slice(), one_more.as_slice()]), None);
    }

    #[test]
    fn refs_and_null_shas() {
        assert_eq!(branch_of_ref("refs/heads/feature/x"), Some("feature/x"));
        assert_eq!(branch_of_ref("refs/tags/v1"), None);
        assert!(is_null_sha("0000000000000000000000000000000000000000"));
        assert!(!is_null_sha("da1560886d4f094c3e6c9ef40349f7d38b5d27d7"));
    }
}
