//! What every forge's client speaks of, whichever forge it talks to: who previewd is on the
//! forge, a deployment's state, a client's scope, and the reports the reporter plans
//! ([`super::report_plan`]) and each forge sends. The forge-neutral [`super::client`] and each
//! forge's API import it; it imports neither.

use super::comment::CommitState;

/// Who previewd is on the forge, to tell its own comments from copies: a comment anyone can
/// start with previewd's marker, and previewd must never adopt (and edit, and point its record
/// at) a comment a pull request's author wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommentAuthor {
    /// The user the token belongs to (`GET /user`, asked once per client).
    Token,
    /// A GitHub App: its comments carry `performed_via_github_app.id`.
    GithubApp(u64),
}

/// A scope no other client has: a client built outside `ForgeClients` shares nothing.
pub(crate) fn unshared_scope() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("unshared-{n}")
}

/// A GitHub deployment status word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeploymentState {
    InProgress,
    Success,
    Failure,
    Inactive,
}

/// A commit status, and the hash that records it was sent.
#[derive(Debug, PartialEq)]
pub struct StatusUpdate {
    pub commit: String,
    pub state: CommitState,
    /// `previewd/<template>`.
    pub context: String,
    pub url: String,
    pub description: String,
    /// What goes into the record once it is sent.
    pub sha: String,
}

/// The head's deployment (a new one for a new head) and its commit status.
#[derive(Debug, PartialEq)]
pub struct DeployUpdate {
    pub status: StatusUpdate,
    pub deployment_state: DeploymentState,
}

/// How the forge's own record of a removed environment ends: the id of what ends (a GitHub
/// deployment, a GitLab environment) and the one request ending it costs.
#[derive(Debug, PartialEq)]
pub struct Retire {
    pub id: u64,
    pub request: &'static str,
}
