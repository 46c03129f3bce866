//! GitLab webhook deliveries: `X-Gitlab-Token` verification and parsing by `X-Gitlab-Event`.

use serde::Deserialize;

use crate::forge::seam::WebhookDescriptor;

use crate::forge::{
    ChangeRequest, CheckResult, CheckState, Comment, EventKind, ForgeEvent, ForgeKind, ParseError,
    Push, PushedCommit, SignatureError, branch_of_ref, check_result, from_json, is_null_sha,
    pushed_files, secrets_equal,
};

pub const TOKEN_HEADER: &str = "x-gitlab-token";
pub const EVENT_HEADER: &str = "x-gitlab-event";
pub const DELIVERY_HEADER: &str = "x-gitlab-event-uuid";

/// How previewd receives GitLab's deliveries. The token is the secret itself: nothing of the
/// body is hashed.
pub const WEBHOOK: WebhookDescriptor = WebhookDescriptor {
    path: "/webhooks/gitlab",
    event_header: EVENT_HEADER,
    delivery_header: DELIVERY_HEADER,
    signature_header: TOKEN_HEADER,
    hashes_body: false,
    verify: |secret, _body, header| verify(secret, header),
    parse,
    repository_field: &["project", "path_with_namespace"],
    event_label,
};

/// The event header as a metric label: one of a fixed set.
fn event_label(event_type: &str) -> &'static str {
    match event_type {
        "Merge Request Hook" => "pull_request",
        "Push Hook" => "push",
        "Note Hook" => "comment",
        "Pipeline Hook" | "Job Hook" => "check",
        "Tag Push Hook" => "tag_push",
        _ => "other",
    }
}

/// GitLab sends the webhook secret itself; it is compared in constant time.
pub fn verify(secret: &[u8], header: Option<&str>) -> Result<(), SignatureError> {
    let token = header.ok_or(SignatureError::Missing("X-Gitlab-Token"))?;
    if secrets_equal(secret, token.as_bytes()) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[derive(Deserialize)]
struct Project {
    path_with_namespace: String,
}

#[derive(Deserialize)]
struct User {
    username: String,
    #[serde(default)]
    id: Option<u64>,
}

#[derive(Deserialize)]
struct Label {
    title: String,
}

#[derive(Deserialize)]
struct Commit {
    id: String,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct MergeRequestAttributes {
    iid: u64,
    source_branch: String,
    #[serde(default)]
    source_project_id: Option<u64>,
    #[serde(default)]
    target_project_id: Option<u64>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    last_commit: Option<Commit>,
    #[serde(default)]
    draft: bool,
    #[serde(default)]
    work_in_progress: bool,
    #[serde(default)]
    labels: Vec<Label>,
    #[serde(default)]
    updated_at: serde_json::Value,
}

#[derive(Deserialize)]
struct MergeRequestEvent {
    project: Project,
    #[serde(default)]
    user: Option<User>,
    object_attributes: MergeRequestAttributes,
}

#[derive(Deserialize)]
struct PushEvent {
    #[serde(rename = "ref")]
    reference: String,
    after: String,
    #[serde(default)]
    checkout_sha: Option<String>,
    #[serde(default)]
    user_username: Option<String>,
    project: Project,
    /// `before`: all zeros for a new branch, whose commits are not all listed.
    #[serde(default)]
    before: String,
    /// At most 20, the newest last.
    #[serde(default)]
    commits: Vec<PushedCommit>,
    #[serde(default)]
    total_commits_count: usize,
}

#[derive(Deserialize)]
struct NoteAttributes {
    note: String,
    noteable_type: String,
}

#[derive(Deserialize)]
struct NotedMergeRequest {
    iid: u64,
}

#[derive(Deserialize)]
struct NoteEvent {
    project: Project,
    user: User,
    object_attributes: NoteAttributes,
    #[serde(default)]
    merge_request: Option<NotedMergeRequest>,
}

#[derive(Deserialize)]
struct PipelineAttributes {
    sha: String,
    status: String,
}

/// A pipeline's state change (`Pipeline Hook`), named `pipeline` for `waitForChecks`.
#[derive(Deserialize)]
struct PipelineEvent {
    project: Project,
    object_attributes: PipelineAttributes,
}

/// A job's state change (`Job Hook`), named by the job.
#[derive(Deserialize)]
struct JobEvent {
    project: Project,
    sha: String,
    build_name: String,
    build_status: String,
    #[serde(default)]
    build_allow_failure: bool,
}

#[derive(Deserialize)]
struct AnyEvent {
    #[serde(default)]
    project: Option<Project>,
}

fn event(project: Project, kind: EventKind) -> ForgeEvent {
    ForgeEvent {
        forge: ForgeKind::Gitlab,
        repository: project.path_with_namespace,
        kind,
    }
}

/// Parses a verified delivery of type `event_type` (the `X-Gitlab-Event` header).
pub fn parse(event_type: &str, body: &[u8]) -> Result<ForgeEvent, ParseError> {
    match event_type {
        "Merge Request Hook" => parse_merge_request(body),
        "Push Hook" => {
            let delivery: PushEvent = from_json(event_type, body)?;
            let kind = match branch_of_ref(&delivery.reference) {
                None => EventKind::Ignored(format!("push to {}", delivery.reference)),
                Some(branch) if is_null_sha(&delivery.after) => EventKind::BranchDeleted {
                    branch: branch.to_string(),
                },
                Some(branch) => {
                    let head_sha = delivery.checkout_sha.unwrap_or(delivery.after);
                    let complete = !is_null_sha(&delivery.before)
                        && !delivery.commits.is_empty()
                        && delivery.total_commits_count <= delivery.commits.len();
                    let lists = delivery.commits.iter().flat_map(PushedCommit::file_lists);
                    let files = complete.then(|| pushed_files(lists)).flatten();
                    let head = delivery.commits.iter().find(|c| c.id == head_sha);
                    EventKind::Push(Push {
                        branch: branch.to_string(),
                        head_message: head.map(|c| c.message.clone()),
                        head_sha,
                        author: delivery.user_username,
                        // GitLab's push deliveries say when the commits were authored, not
                        // when they were pushed: no order can be told from them.
                        changed_at: None,
                        files,
                    })
                }
            };
            Ok(event(delivery.project, kind))
        }
        "Pipeline Hook" => {
            let delivery: PipelineEvent = from_json(event_type, body)?;
            let attributes = delivery.object_attributes;
            let state = check_state(&attributes.status, false);
            Ok(event(
                delivery.project,
                check(attributes.sha, "pipeline".into(), state),
            ))
        }
        "Job Hook" => {
            let delivery: JobEvent = from_json(event_type, body)?;
            let state = check_state(&delivery.build_status, delivery.build_allow_failure);
            let kind = check(delivery.sha, delivery.build_name, state);
            Ok(event(delivery.project, kind))
        }
        "Note Hook" => {
            let delivery: NoteEvent = from_json(event_type, body)?;
            let kind = match (
                delivery.object_attributes.noteable_type.as_str(),
                delivery.merge_request,
            ) {
                ("MergeRequest", Some(merge_request)) => EventKind::Comment(Comment {
                    number: merge_request.iid,
                    author: delivery.user.username,
                    author_id: delivery.user.id,
                    body: delivery.object_attributes.note,
                }),
                (other, _) => EventKind::Ignored(format!("a note on a {other}")),
            };
            Ok(event(delivery.project, kind))
        }
        other => {
            let delivery: AnyEvent = from_json(other, body)?;
            Ok(ForgeEvent {
                forge: ForgeKind::Gitlab,
                repository: delivery
                    .project
                    .map(|p| p.path_with_namespace)
                    .unwrap_or_default(),
                kind: EventKind::Ignored(format!("event {other:?}")),
            })
        }
    }
}

fn check(sha: String, name: String, state: CheckState) -> EventKind {
    check_result("a pipeline or job", CheckResult { sha, name, state })
}

/// A pipeline's or job's status in previewd's three states. `skipped` passes (as GitLab's
/// "pipelines must succeed" counts it); `manual` waits for someone to start it; a job that
/// may fail (`allow_failure`) never fails the commit.
fn check_state(status: &str, allow_failure: bool) -> CheckState {
    match status {
        "success" | "skipped" => CheckState::Success,
        "failed" | "canceled" if allow_failure => CheckState::Success,
        "failed" | "canceled" => CheckState::Failure,
        _ => CheckState::Pending,
    }
}

fn parse_merge_request(body: &[u8]) -> Result<ForgeEvent, ParseError> {
    let delivery: MergeRequestEvent = from_json("Merge Request Hook", body)?;
    let mr = delivery.object_attributes;
    // Older GitLab versions send no `action`; the state then says enough.
    let action = mr
        .action
        .clone()
        .or_else(|| {
            mr.state
                .clone()
                .map(|s| if s == "opened" { "open".into() } else { s })
        })
        .unwrap_or_default();
    let kind = match action.as_str() {
        "close" | "closed" | "merge" | "merged" => EventKind::ChangeRequestClosed {
            number: mr.iid,
            branch: mr.source_branch,
            merged: action.starts_with("merge"),
            changed_at: crate::forge::forge_time(&mr.updated_at),
        },
        "open" | "reopen" | "update" => {
            let last_commit = mr
                .last_commit
                .ok_or(ParseError::Missing("object_attributes.last_commit.id"))?;
            let (head_sha, head_message) = (last_commit.id, last_commit.message);
            EventKind::ChangeRequest(ChangeRequest {
                number: mr.iid,
                action: action.clone(),
                branch: mr.source_branch,
                head_sha,
                author: delivery.user.map(|u| u.username),
                draft: mr.draft || mr.work_in_progress,
                fork: matches!((mr.source_project_id, mr.target_project_id), (Some(s), Some(t)) if s != t),
                labels: mr.labels.into_iter().map(|l| l.title).collect(),
                changed_at: crate::forge::forge_time(&mr.updated_at),
                head_message,
            })
        }
        other => EventKind::Ignored(format!("merge request action {other:?}")),
    };
    Ok(event(delivery.project, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/gitlab")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn the_token_is_compared_whole() {
        assert_eq!(verify(b"tok", Some("tok")), Ok(()));
        assert_eq!(verify(b"tok", Some("tok2")), Err(SignatureError::Mismatch));
        assert!(matches!(
            verify(b"tok", None),
            Err(SignatureError::Missing(_))
        ));
    }

    #[test]
    fn merge_request_open_update_close_merge() {
        let event = parse("Merge Request Hook", &fixture("merge_request.json")).unwrap();
        assert_eq!(event.forge, ForgeKind::Gitlab);
        assert_eq!(event.repository, "gitlabhq/gitlab-test");
        assert_eq!(
            event.kind,
            EventKind::ChangeRequest(ChangeRequest {
                number: 1,
                action: "open".into(),
                branch: "ms-viewport".into(),
                head_sha: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7".into(),
                author: Some("user1".into()),
                draft: false,
                fork: false,
                labels: vec!["API".into()],
                changed_at: crate::forge::forge_time(&serde_json::json!("2013-12-03T17:23:34Z")),
                head_message: Some("fixed readme".into()),
            })
        );
        let mut delivery: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request.json")).unwrap();
        for (action, expected_merged) in [
            ("close", Some(false)),
            ("merge", Some(true)),
            ("update", None),
        ] {
            delivery["object_attributes"]["action"] = action.into();
            let kind = parse("Merge Request Hook", delivery.to_string().as_bytes())
                .unwrap()
                .kind;
            match (kind, expected_merged) {
                (EventKind::ChangeRequestClosed { merged, .. }, Some(expected)) => {
                    assert_eq!(merged, expected)
                }
                (EventKind::ChangeRequest(_), None) => {}
                (kind, _) => panic!("{action}: unexpected {kind:?}"),
            }
        }
        delivery["object_attributes"]["action"] = "approved".into();
        let kind = parse("Merge Request Hook", delivery.to_string().as_bytes())
            .unwrap()
            .kind;
        assert!(matches!(kind, EventKind::Ignored(_)));
    }

    #[test]
    fn pushes_branch_deletions_notes_and_tags() {
        let event = parse("Push Hook", &fixture("push.json")).unwrap();
        assert_eq!(event.repository, "mike/diaspora");
        assert_eq!(
            event.kind,
            EventKind::Push(Push {
                branch: "master".into(),
                head_sha: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7".into(),
                author: Some("jsmith".into()),
                changed_at: None,
                // 4 commits pushed, 2 listed: the files are not all known.
                files: None,
                head_message: Some("fixed readme\n".into()),
            })
        );
        let mut deleted: serde_json::Value = serde_json::from_slice(&fixture("push.json")).unwrap();
        deleted["after"] = "0000000000000000000000000000000000000000".into();
        deleted["checkout_sha"] = serde_json::Value::Null;
        assert_eq!(
            parse("Push Hook", deleted.to_string().as_bytes())
                .unwrap()
                .kind,
            EventKind::BranchDeleted {
                branch: "master".into()
            }
        );
        let note = parse("Note Hook", &fixture("note_merge_request.json")).unwrap();
        assert_eq!(note.repository, "gitlab-org/gitlab-test");
        assert!(matches!(
            note.kind,
            EventKind::Comment(Comment { number: 1, .. })
        ));
        let tag = parse("Tag Push Hook", &fixture("tag_push.json")).unwrap();
        assert!(matches!(tag.kind, EventKind::Ignored(_)));
    }

    #[test]
    fn forks_and_drafts() {
        let mut delivery: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request.json")).unwrap();
        delivery["object_attributes"]["source_project_id"] = 99.into();
        delivery["object_attributes"]["draft"] = true.into();
        let EventKind::ChangeRequest(mr) =
            parse("Merge Request Hook", delivery.to_string().as_bytes())
                .unwrap()
                .kind
        else {
            panic!("expected a change request");
        };
        assert!(mr.fork && mr.draft);
    }

    /// Pipeline and job deliveries, trimmed, in the shape of GitLab's "Webhook events"
    /// documentation (Pipeline events, Job events); the fixtures in ../shared have none.
    #[test]
    fn pipelines_and_jobs_become_check_results() {
        let sha = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
        let project = serde_json::json!({"id": 1, "path_with_namespace": "gitlabhq/gitlab-test"});
        let pipeline = |status: &str| {
            let body = serde_json::json!({"object_kind": "pipeline", "object_attributes":
                {"id": 31, "ref": "master", "sha": sha, "status": status, "stages": ["build"]},
                "project": project, "merge_request": null, "builds": []});
            parse("Pipeline Hook", body.to_string().as_bytes())
                .unwrap()
                .kind
        };
        let job = |status: &str, allow_failure: bool| {
            let body = serde_json::json!({"object_kind": "build", "ref": "main", "sha": sha,
                "build_id": 1977, "build_name": "test", "build_stage": "test",
                "build_status": status, "build_allow_failure": allow_failure,
                "project_id": 1, "project": project});
            parse("Job Hook", body.to_string().as_bytes()).unwrap().kind
        };
        let result = |name: &str, state| {
            EventKind::Check(CheckResult {
                sha: sha.into(),
                name: name.into(),
                state,
            })
        };
        use CheckState::{Failure, Pending, Success};
        for (status, state) in [
            ("running", Pending),
            ("manual", Pending),
            ("success", Success),
            ("skipped", Success),
            ("failed", Failure),
            ("canceled", Failure),
        ] {
            assert_eq!(pipeline(status), result("pipeline", state), "{status}");
        }
        assert_eq!(job("failed", false), result("test", Failure));
        assert_eq!(
            job("failed", true),
            result("test", Success),
            "allowed to fail"
        );
        assert_eq!(job("pending", false), result("test", Pending));
        assert!(parse("Pipeline Hook", b"{}").is_err(), "malformed: a 400");
    }
}
