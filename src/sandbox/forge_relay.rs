//! The forge stand-in's webhook side: deliveries reach previewd through the stand-in
//! (`POST /hooks/github`, `POST /hooks/gitlab`, relayed unchanged to previewd's
//! `/webhooks/...`), and the stand-in keeps what they say, as a real forge knows its own state:
//! which pull/merge requests are open and which branches exist. It answers the sweep's lists
//! from that, so the sweep in the sandbox works as it does against GitHub and GitLab: a PR
//! closed with its delivery lost to previewd is still seen as closed.
//!
//! The state is learnt before the delivery is passed on (a forge changes its state, then sends
//! the hook), so a sweep running meanwhile never sees an environment whose PR it does not know.
//!
//! Only repositories the stand-in is told to track (the playground's) get lists; for others it
//! answers 503, and previewd's sweep removes nothing for forge reasons there. A delivery sent
//! to previewd directly, past the stand-in, teaches it nothing, so an environment made that way
//! in a tracked repository is removed by the next sweep as its PR is not open: send through
//! the hook URLs the sandbox prints.

use std::collections::{BTreeSet, HashMap, HashSet};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::forge::{EventKind, ForgeEvent, ForgeKind};

/// Open pull/merge requests and existing branches per repository, as the deliveries told.
#[derive(Debug, Default)]
pub struct KnownState {
    tracked: HashSet<(ForgeKind, String)>,
    open: HashMap<(ForgeKind, String), BTreeSet<u64>>,
    branches: HashMap<(ForgeKind, String), BTreeSet<String>>,
}

impl KnownState {
    /// From now on, answers `repository`'s lists (empty until a delivery says otherwise).
    pub fn track(&mut self, forge: ForgeKind, repository: &str) {
        self.tracked.insert((forge, repository.to_lowercase()));
    }

    /// Learns from one delivery of `forge` (`event_type` is its event header). A delivery
    /// previewd's parser refuses teaches nothing (previewd answers it 400 anyway).
    pub fn learn(&mut self, forge: ForgeKind, event_type: &str, body: &[u8]) {
        let parsed = (crate::forge::forges::forge(forge).webhook.parse)(event_type, body);
        if let Ok(event) = parsed {
            self.apply(&event);
        }
    }

    fn apply(&mut self, event: &ForgeEvent) {
        let key = (event.forge, event.repository.to_lowercase());
        match &event.kind {
            EventKind::ChangeRequest(change) => {
                self.open
                    .entry(key.clone())
                    .or_default()
                    .insert(change.number);
                if !change.fork {
                    self.branches
                        .entry(key)
                        .or_default()
                        .insert(change.branch.clone());
                }
            }
            EventKind::ChangeRequestClosed { number, .. } => {
                self.open.entry(key).or_default().remove(number);
            }
            EventKind::Push(push) => {
                self.branches
                    .entry(key)
                    .or_default()
                    .insert(push.branch.clone());
            }
            EventKind::BranchDeleted { branch } => {
                self.branches.entry(key).or_default().remove(branch);
            }
            EventKind::Comment(_)
            | EventKind::Check(_)
            | EventKind::Ping
            | EventKind::Ignored(_) => {}
        }
    }

    /// The open-PR list in the forge's own shape (GitHub `number`, GitLab `iid`); `None` for
    /// a repository not tracked. Everything is on page 1; later pages are empty, as the forge
    /// answers past the last page.
    pub fn open_list(&self, forge: ForgeKind, repository: &str, page: u64) -> Option<Value> {
        let key = (forge, repository.to_lowercase());
        if !self.tracked.contains(&key) {
            return None;
        }
        let field = match forge {
            ForgeKind::Github => "number",
            ForgeKind::Gitlab => "iid",
        };
        let items = self
            .open
            .get(&key)
            .filter(|_| page <= 1)
            .into_iter()
            .flatten()
            .map(|number| json!({ field: number }));
        Some(Value::Array(items.collect()))
    }

    /// The branch list (`name`), page 1 holding all; `None` for a repository not tracked.
    pub fn branch_list(&self, forge: ForgeKind, repository: &str, page: u64) -> Option<Value> {
        let key = (forge, repository.to_lowercase());
        if !self.tracked.contains(&key) {
            return None;
        }
        let items = self
            .branches
            .get(&key)
            .filter(|_| page <= 1)
            .into_iter()
            .flatten()
            .map(|name| json!({ "name": name }));
        Some(Value::Array(items.collect()))
    }
}

/// The page a list request asks for (`page=N`; none: 1).
pub fn requested_page(query: Option<&str>) -> u64 {
    query_parameter(query, "page")
        .and_then(|value| value.parse().ok())
        .unwrap_or(1)
}

/// A query parameter's value, decoded.
pub fn query_parameter(query: Option<&str>, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// The event header of a delivery from `forge`.
pub fn event_type(forge: ForgeKind, headers: &HeaderMap) -> String {
    let name = crate::forge::forges::forge(forge).webhook.event_header;
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Sends the delivery on to previewd's `webhook_url` with its headers, and gives back
/// previewd's answer as it came (status and body), so that whoever sent it sees previewd's
/// word. previewd unreachable: 502.
pub async fn pass_on(
    http: &reqwest::Client,
    webhook_url: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let mut request = http.post(webhook_url).body(body);
    for (name, value) in headers {
        // Hop-by-hop and length headers are the HTTP client's to set.
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            request = request.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(e) => {
            let message = format!("the stand-in could not reach previewd: {e}");
            return (
                StatusCode::BAD_GATEWAY,
                axum::Json(json!({"message": message})),
            )
                .into_response();
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let body = answer.bytes().await.unwrap_or_default();
    (status, [("content-type", content_type)], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENED: &str = include_str!("deliveries/github.pull_request.opened.json");
    const CLOSED: &str = include_str!("deliveries/github.pull_request.closed.json");
    const MERGE_REQUEST: &str = include_str!("deliveries/gitlab.merge_request.json");

    #[test]
    fn an_opened_pull_request_is_listed_until_its_closed_delivery() {
        let mut state = KnownState::default();
        let github = ForgeKind::Github;
        const REPOSITORY: &str = "Codertocat/Hello-World";
        state.learn(github, "pull_request", OPENED.as_bytes());
        assert_eq!(state.open_list(github, REPOSITORY, 1), None, "not tracked");
        state.track(github, REPOSITORY);
        let open = |state: &KnownState, page| state.open_list(github, REPOSITORY, page);
        assert_eq!(open(&state, 1), Some(json!([{"number": 2}])));
        assert_eq!(
            state.open_list(github, "codertocat/hello-world", 1),
            open(&state, 1),
            "repository names are compared without case"
        );
        let branches = state.branch_list(github, REPOSITORY, 1);
        assert_eq!(branches, Some(json!([{"name": "changes"}])));
        assert_eq!(open(&state, 2), Some(json!([])));
        state.learn(github, "pull_request", CLOSED.as_bytes());
        assert_eq!(open(&state, 1), Some(json!([])));
        // Closing a PR does not delete its branch.
        assert_eq!(state.branch_list(github, REPOSITORY, 1), branches);
    }

    #[test]
    fn gitlab_merge_requests_are_listed_by_iid_and_garbage_teaches_nothing() {
        let mut state = KnownState::default();
        let gitlab = ForgeKind::Gitlab;
        state.track(gitlab, "gitlabhq/gitlab-test");
        state.track(ForgeKind::Github, "gitlabhq/gitlab-test");
        state.learn(gitlab, "Merge Request Hook", b"{not json");
        state.learn(gitlab, "Merge Request Hook", MERGE_REQUEST.as_bytes());
        let listed = state.open_list(gitlab, "gitlabhq/gitlab-test", 1);
        let iids: Vec<u64> = listed
            .iter()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|mr| mr["iid"].as_u64())
            .collect();
        assert_eq!(iids.len(), 1, "{listed:?}");
        // The same path on GitHub is another repository.
        let on_github = state.open_list(ForgeKind::Github, "gitlabhq/gitlab-test", 1);
        assert_eq!(on_github, Some(json!([])));
    }

    #[test]
    fn pages_are_read_from_the_query() {
        assert_eq!(requested_page(None), 1);
        assert_eq!(requested_page(Some("state=open&per_page=100&page=3")), 3);
        assert_eq!(requested_page(Some("page=x")), 1);
    }
}
