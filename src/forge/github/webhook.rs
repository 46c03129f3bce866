//! GitHub webhook deliveries: `X-Hub-Signature-256` verification and parsing by
//! `X-GitHub-Event`.

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::forge::seam::WebhookDescriptor;

use crate::forge::{
    ChangeRequest, CheckResult, CheckState, Comment, EventKind, ForgeEvent, ForgeKind, ParseError,
    Push, PushedCommit, SignatureError, branch_of_ref, check_result, from_json, is_null_sha,
    pushed_files,
};

pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
pub const EVENT_HEADER: &str = "x-github-event";
pub const DELIVERY_HEADER: &str = "x-github-delivery";

/// How previewd receives GitHub's deliveries.
pub const WEBHOOK: WebhookDescriptor = WebhookDescriptor {
    path: "/webhooks/github",
    event_header: EVENT_HEADER,
    delivery_header: DELIVERY_HEADER,
    signature_header: SIGNATURE_HEADER,
    hashes_body: true,
    verify,
    parse,
    repository_field: &["repository", "full_name"],
    event_label,
};

/// The event header as a metric label: one of a fixed set.
fn event_label(event_type: &str) -> &'static str {
    match event_type {
        "pull_request" => "pull_request",
        "push" => "push",
        "delete" => "delete",
        "issue_comment" => "comment",
        "ping" => "ping",
        "check_run" | "check_suite" | "status" => "check",
        _ => "other",
    }
}

/// Checks `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>` in constant time.
pub fn verify(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing("X-Hub-Signature-256"))?;
    let hex_digest = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or(SignatureError::Malformed("X-Hub-Signature-256"))?;
    let expected =
        hex::decode(hex_digest).map_err(|_| SignatureError::Malformed("X-Hub-Signature-256"))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)
}

/// The header value GitHub would send for `body` signed with `secret` (tests, benchmarks, and
/// anyone replaying a delivery by hand).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[derive(Deserialize)]
struct Repository {
    full_name: String,
}

#[derive(Deserialize)]
struct User {
    login: String,
}

#[derive(Deserialize)]
struct Label {
    name: String,
}

#[derive(Deserialize)]
struct GitRef {
    #[serde(rename = "ref")]
    name: String,
    sha: String,
    /// `null` when the fork was deleted.
    #[serde(default)]
    repo: Option<Repository>,
}

#[derive(Deserialize)]
struct PullRequest {
    number: u64,
    #[serde(default)]
    draft: bool,
    #[serde(default)]
    merged: bool,
    head: GitRef,
    base: GitRef,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    labels: Vec<Label>,
    #[serde(default)]
    updated_at: serde_json::Value,
}

#[derive(Deserialize)]
struct PullRequestEvent {
    action: String,
    pull_request: PullRequest,
    repository: Repository,
}

#[derive(Deserialize)]
struct Pusher {
    name: String,
}

/// The repository of a push delivery: `pushed_at` is when GitHub received the push.
#[derive(Deserialize)]
struct PushedRepository {
    full_name: String,
    #[serde(default)]
    pushed_at: serde_json::Value,
}

#[derive(Deserialize)]
struct PushEvent {
    #[serde(rename = "ref")]
    reference: String,
    after: String,
    #[serde(default)]
    deleted: bool,
    repository: PushedRepository,
    #[serde(default)]
    pusher: Option<Pusher>,
    #[serde(default)]
    sender: Option<User>,
    /// A new branch: its commits are listed only in part (those not on another branch).
    #[serde(default)]
    created: bool,
    /// A force push: what it changed is not the sum of the listed commits.
    #[serde(default)]
    forced: bool,
    #[serde(default)]
    commits: Vec<PushedCommit>,
    #[serde(default)]
    head_commit: Option<PushedCommit>,
}

/// GitHub lists at most this many commits in a push delivery.
const MOST_LISTED_COMMITS: usize = 2048;

#[derive(Deserialize)]
struct DeleteEvent {
    #[serde(rename = "ref")]
    reference: String,
    ref_type: String,
    repository: Repository,
}

#[derive(Deserialize)]
struct Issue {
    number: u64,
    /// Present only when the issue is a pull request.
    #[serde(default)]
    pull_request: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct IssueComment {
    body: String,
    user: User,
}

#[derive(Deserialize)]
struct IssueCommentEvent {
    action: String,
    issue: Issue,
    comment: IssueComment,
    repository: Repository,
}

/// A GitHub App's check run or suite (`check_run`, `check_suite`).
#[derive(Deserialize)]
struct CheckRun {
    #[serde(default)]
    name: String,
    head_sha: String,
    status: String,
    #[serde(default)]
    conclusion: Option<String>,
    #[serde(default)]
    app: Option<App>,
}

/// The app behind a check suite. Older deliveries carry its `name` only.
#[derive(Deserialize)]
struct App {
    #[serde(default)]
    slug: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct CheckRunEvent {
    check_run: CheckRun,
    repository: Repository,
}

#[derive(Deserialize)]
struct CheckSuiteEvent {
    check_suite: CheckRun,
    repository: Repository,
}

/// A commit status (`status`), as CI services without a GitHub App report.
#[derive(Deserialize)]
struct StatusEvent {
    sha: String,
    context: String,
    state: String,
    repository: Repository,
}

#[derive(Deserialize)]
struct AnyEvent {
    #[serde(default)]
    repository: Option<Repository>,
}

fn event(repository: Repository, kind: EventKind) -> ForgeEvent {
    ForgeEvent {
        forge: ForgeKind::Github,
        repository: repository.full_name,
        kind,
    }
}

/// Parses a verified delivery of type `event_type` (the `X-GitHub-Event` header).
pub fn parse(event_type: &str, body: &[u8]) -> Result<ForgeEvent, ParseError> {
    match event_type {
        "pull_request" => parse_pull_request(body),
        "push" => parse_push(body),
        "delete" => {
            let delivery: DeleteEvent = from_json(event_type, body)?;
            let kind = if delivery.ref_type == "branch" {
                EventKind::BranchDeleted {
                    branch: delivery.reference,
                }
            } else {
                EventKind::Ignored(format!("deletion of a {}", delivery.ref_type))
            };
            Ok(event(delivery.repository, kind))
        }
        "issue_comment" => {
            let delivery: IssueCommentEvent = from_json(event_type, body)?;
            let kind = if delivery.issue.pull_request.is_none() {
                EventKind::Ignored("a comment on an issue, not on a pull request".into())
            } else if delivery.action != "created" {
                EventKind::Ignored(format!("comment {}", delivery.action))
            } else {
                EventKind::Comment(Comment {
                    number: delivery.issue.number,
                    author: delivery.comment.user.login,
                    author_id: None,
                    body: delivery.comment.body,
                })
            };
            Ok(event(delivery.repository, kind))
        }
        "check_run" => {
            let delivery: CheckRunEvent = from_json(event_type, body)?;
            let run = delivery.check_run;
            let state = check_state(&run.status, run.conclusion.as_deref());
            Ok(event(
                delivery.repository,
                check(run.head_sha, run.name, state),
            ))
        }
        "check_suite" => {
            let delivery: CheckSuiteEvent = from_json(event_type, body)?;
            let suite = delivery.check_suite;
            let state = check_state(&suite.status, suite.conclusion.as_deref());
            let name = suite.app.and_then(|app| app.slug.or(app.name));
            let name = name.unwrap_or_default();
            Ok(event(
                delivery.repository,
                check(suite.head_sha, name, state),
            ))
        }
        "status" => {
            let delivery: StatusEvent = from_json(event_type, body)?;
            let state = match delivery.state.as_str() {
                "success" => CheckState::Success,
                "failure" | "error" => CheckState::Failure,
                _ => CheckState::Pending,
            };
            let kind = check(delivery.sha, delivery.context, state);
            Ok(event(delivery.repository, kind))
        }
        "ping" => {
            let delivery: AnyEvent = from_json(event_type, body)?;
            Ok(ForgeEvent {
                forge: ForgeKind::Github,
                repository: delivery.repository.map(|r| r.full_name).unwrap_or_default(),
                kind: EventKind::Ping,
            })
        }
        other => {
            let delivery: AnyEvent = from_json(other, body)?;
            Ok(ForgeEvent {
                forge: ForgeKind::Github,
                repository: delivery.repository.map(|r| r.full_name).unwrap_or_default(),
                kind: EventKind::Ignored(format!("event {other:?}")),
            })
        }
    }
}

fn check(sha: String, name: String, state: CheckState) -> EventKind {
    check_result("a check", CheckResult { sha, name, state })
}

/// A check run's or suite's state: pending until `completed`, then by its conclusion.
/// `neutral` and `skipped` pass, as GitHub's branch protection counts them.
fn check_state(status: &str, conclusion: Option<&str>) -> CheckState {
    match (status, conclusion) {
        ("completed", Some("success" | "neutral" | "skipped")) => CheckState::Success,
        ("completed", _) => CheckState::Failure,
        _ => CheckState::Pending,
    }
}

fn parse_pull_request(body: &[u8]) -> Result<ForgeEvent, ParseError> {
    let delivery: PullRequestEvent = from_json("pull_request", body)?;
    let pr = delivery.pull_request;
    let kind = match delivery.action.as_str() {
        "closed" => EventKind::ChangeRequestClosed {
            number: pr.number,
            branch: pr.head.name,
            merged: pr.merged,
            changed_at: crate::forge::forge_time(&pr.updated_at),
        },
        "opened" | "reopened" | "synchronize" | "ready_for_review" | "converted_to_draft"
        | "labeled" | "unlabeled" | "edited" => {
            let base = pr.base.repo.as_ref().map(|r| r.full_name.as_str());
            let head = pr.head.repo.as_ref().map(|r| r.full_name.as_str());
            EventKind::ChangeRequest(ChangeRequest {
                number: pr.number,
                action: delivery.action.clone(),
                fork: head.is_none() || head != base,
                branch: pr.head.name,
                head_sha: pr.head.sha,
                author: pr.user.map(|u| u.login),
                draft: pr.draft,
                labels: pr.labels.into_iter().map(|l| l.name).collect(),
                changed_at: crate::forge::forge_time(&pr.updated_at),
                // GitHub's pull_request delivery carries no commit message; the push delivery
                // of the same commit does.
                head_message: None,
            })
        }
        other => EventKind::Ignored(format!("pull_request action {other:?}")),
    };
    Ok(event(delivery.repository, kind))
}

fn parse_push(body: &[u8]) -> Result<ForgeEvent, ParseError> {
    let delivery: PushEvent = from_json("push", body)?;
    let kind = match branch_of_ref(&delivery.reference) {
        None => EventKind::Ignored(format!("push to {}", delivery.reference)),
        Some(branch) if delivery.deleted || is_null_sha(&delivery.after) => {
            EventKind::BranchDeleted {
                branch: branch.to_string(),
            }
        }
        Some(branch) => {
            let complete = !delivery.created
                && !delivery.forced
                && !delivery.commits.is_empty()
                && delivery.commits.len() < MOST_LISTED_COMMITS;
            let lists = delivery.commits.iter().flat_map(PushedCommit::file_lists);
            EventKind::Push(Push {
                branch: branch.to_string(),
                head_sha: delivery.after.clone(),
                author: delivery
                    .sender
                    .map(|s| s.login)
                    .or(delivery.pusher.map(|p| p.name)),
                changed_at: crate::forge::forge_time(&delivery.repository.pushed_at),
                files: complete.then(|| pushed_files(lists)).flatten(),
                head_message: delivery.head_commit.map(|c| c.message),
            })
        }
    };
    let repository = Repository {
        full_name: delivery.repository.full_name,
    };
    Ok(event(repository, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/github")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn kind(event_type: &str, file: &str) -> EventKind {
        let event = parse(event_type, &fixture(file)).unwrap();
        assert_eq!(event.repository, "Codertocat/Hello-World");
        event.kind
    }

    #[test]
    fn signatures_are_checked_over_the_exact_bytes() {
        let body = fixture("pull_request.opened.json");
        let header = sign(b"webhook-secret", &body);
        assert_eq!(verify(b"webhook-secret", &body, Some(&header)), Ok(()));
        assert_eq!(
            verify(b"other-secret", &body, Some(&header)),
            Err(SignatureError::Mismatch)
        );
        let mut changed = body.clone();
        changed.push(b' ');
        assert_eq!(
            verify(b"webhook-secret", &changed, Some(&header)),
            Err(SignatureError::Mismatch)
        );
        assert!(matches!(
            verify(b"webhook-secret", &body, None),
            Err(SignatureError::Missing(_))
        ));
        assert!(matches!(
            verify(b"webhook-secret", &body, Some("sha1=abc")),
            Err(SignatureError::Malformed(_))
        ));
        assert!(matches!(
            verify(b"webhook-secret", &body, Some("sha256=zz")),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn pull_request_opened_is_a_snapshot_of_the_open_pr() {
        let EventKind::ChangeRequest(pr) = kind("pull_request", "pull_request.opened.json") else {
            panic!("expected a change request");
        };
        assert_eq!(pr.number, 2);
        assert_eq!(pr.branch, "changes");
        assert_eq!(pr.head_sha, "ec26c3e57ca3a959ca5aad62de7213c562f8c821");
        assert_eq!(pr.author.as_deref(), Some("Codertocat"));
        assert!(!pr.fork && !pr.draft);
        assert_eq!(pr.labels, vec!["bug".to_string()]);
    }

    #[test]
    fn every_open_pr_action_is_a_change_request() {
        for file in [
            "pull_request.reopened.json",
            "pull_request.synchronize.json",
            "pull_request.labeled.json",
        ] {
            assert!(
                matches!(kind("pull_request", file), EventKind::ChangeRequest(_)),
                "{file}"
            );
        }
    }

    #[test]
    fn closed_says_whether_it_was_merged() {
        assert_eq!(
            kind("pull_request", "pull_request.closed.json"),
            EventKind::ChangeRequestClosed {
                number: 2,
                branch: "changes".into(),
                merged: false,
                changed_at: Some("2019-05-15T15:21:18Z".parse().unwrap()),
            }
        );
        // The fixture was closed without merging; flip `merged` in a copy for the merged case.
        let mut merged: serde_json::Value =
            serde_json::from_slice(&fixture("pull_request.closed.json")).unwrap();
        merged["pull_request"]["merged"] = true.into();
        let event = parse("pull_request", merged.to_string().as_bytes()).unwrap();
        assert!(matches!(
            event.kind,
            EventKind::ChangeRequestClosed { merged: true, .. }
        ));
    }

    #[test]
    fn pushes_tags_and_deletions() {
        assert_eq!(
            kind("push", "push.with-new-branch.json"),
            EventKind::Push(Push {
                branch: "master".into(),
                head_sha: "6113728f27ae82c7b1a177c8d03f9e96e0adf246".into(),
                author: Some("Codertocat".into()),
                changed_at: crate::forge::forge_time(&serde_json::json!(1557933657)),
                // A new branch: its files are not all listed.
                files: None,
                head_message: Some("Initial commit".into()),
            })
        );
        assert!(matches!(kind("push", "push.json"), EventKind::Ignored(_)));
        assert!(matches!(
            kind("delete", "delete.json"),
            EventKind::Ignored(_)
        ));
        // The same delivery for a branch (the fixture deletes a tag): the branch is gone.
        let mut branch: serde_json::Value =
            serde_json::from_slice(&fixture("delete.json")).unwrap();
        branch["ref_type"] = "branch".into();
        branch["ref"] = "feature/login".into();
        let event = parse("delete", branch.to_string().as_bytes()).unwrap();
        assert_eq!(
            event.kind,
            EventKind::BranchDeleted {
                branch: "feature/login".into()
            }
        );
        let mut deleted: serde_json::Value =
            serde_json::from_slice(&fixture("push.with-new-branch.json")).unwrap();
        deleted["deleted"] = true.into();
        deleted["after"] = "0000000000000000000000000000000000000000".into();
        let event = parse("push", deleted.to_string().as_bytes()).unwrap();
        assert_eq!(
            event.kind,
            EventKind::BranchDeleted {
                branch: "master".into()
            }
        );
    }

    /// The files of `push.with-new-branch.json` made a push to an existing branch
    /// (`created: false`), then changed by `adjust`.
    fn pushed_files_of(adjust: impl FnOnce(&mut serde_json::Value)) -> Option<Vec<String>> {
        let mut delivery: serde_json::Value =
            serde_json::from_slice(&fixture("push.with-new-branch.json")).unwrap();
        delivery["created"] = false.into();
        adjust(&mut delivery);
        match parse("push", delivery.to_string().as_bytes()).unwrap().kind {
            EventKind::Push(push) => push.files,
            other => panic!("expected a push, got {other:?}"),
        }
    }

    #[test]
    fn a_forced_push_has_no_file_list_so_path_filters_cannot_skip_it() {
        // Not forced, the same push lists its file: the flag alone makes the list unknown.
        assert_eq!(pushed_files_of(|_| {}), Some(vec!["README.md".to_string()]));
        assert_eq!(pushed_files_of(|d| d["forced"] = true.into()), None);
    }

    #[test]
    fn a_push_of_more_than_3000_files_has_no_file_list() {
        let commit = |first: usize, count: usize| {
            let added: Vec<String> = (first..first + count)
                .map(|n| format!("src/f{n}.rs"))
                .collect();
            serde_json::json!({"id": format!("{first:040x}"), "message": "many files",
                "added": added, "modified": [], "removed": []})
        };
        let listed = pushed_files_of(|d| d["commits"] = serde_json::json!([commit(0, 3000)]));
        assert_eq!(listed.map(|files| files.len()), Some(3000));
        assert_eq!(
            pushed_files_of(|d| d["commits"] = serde_json::json!([commit(0, 3001)])),
            None
        );
        // Counted over the whole push, not per commit.
        let split = serde_json::json!([commit(0, 1500), commit(1500, 1501)]);
        assert_eq!(pushed_files_of(|d| d["commits"] = split), None);
    }

    #[test]
    fn a_push_listing_2048_commits_may_hold_more_so_has_no_file_list() {
        // GitHub lists at most 2,048 commits: a delivery with that many may leave some out.
        let commits = |count: usize| -> serde_json::Value {
            (0..count)
                .map(|n| {
                    serde_json::json!({"id": format!("{n:040x}"), "message": "m",
                        "added": [], "modified": ["src/main.rs"], "removed": []})
                })
                .collect::<Vec<_>>()
                .into()
        };
        assert_eq!(
            pushed_files_of(|d| d["commits"] = commits(2047)),
            Some(vec!["src/main.rs".to_string()])
        );
        assert_eq!(pushed_files_of(|d| d["commits"] = commits(2048)), None);
    }

    #[test]
    fn comments_only_on_pull_requests_ping_and_unknown_events() {
        assert!(matches!(
            kind("issue_comment", "issue_comment.created.json"),
            EventKind::Ignored(_)
        ));
        // The ping fixture is a hook of Octocoders/Hello-World.
        let ping = parse("ping", &fixture("ping.json")).unwrap();
        assert_eq!(
            (ping.repository.as_str(), ping.kind),
            ("Octocoders/Hello-World", EventKind::Ping)
        );
        let event = parse("create", &fixture("create.json")).unwrap();
        assert!(matches!(event.kind, EventKind::Ignored(_)));
    }

    #[test]
    fn extra_fields_are_ignored_and_optional_ones_may_be_missing() {
        let mut delivery: serde_json::Value =
            serde_json::from_slice(&fixture("pull_request.opened.json")).unwrap();
        delivery["enterprise"] = serde_json::json!({"id": 1, "slug": "acme"});
        delivery["pull_request"]["auto_merge_strategy_2030"] = "squash".into();
        let pr = delivery["pull_request"].as_object_mut().unwrap();
        pr.remove("draft");
        pr.remove("labels");
        pr.remove("user");
        delivery["pull_request"]["head"]["repo"] = serde_json::Value::Null;
        let EventKind::ChangeRequest(pr) = parse("pull_request", delivery.to_string().as_bytes())
            .unwrap()
            .kind
        else {
            panic!("expected a change request");
        };
        assert!(!pr.draft && pr.labels.is_empty() && pr.author.is_none());
        assert!(
            pr.fork,
            "a PR whose head repository is gone counts as a fork"
        );
    }

    #[test]
    fn malformed_bodies_are_parse_errors() {
        assert!(parse("pull_request", b"{\"action\": ").is_err());
        assert!(parse("pull_request", b"{\"action\": \"opened\"}").is_err());
    }

    /// Check deliveries, trimmed to the fields previewd reads plus their neighbours, in the
    /// shape of GitHub's "Webhook events and payloads" (`check_run`, `check_suite`, `status`);
    /// the fixtures in ../shared have none.
    fn check_delivery(event_type: &str, status: &str, conclusion: Option<&str>) -> EventKind {
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let run = serde_json::json!({"id": 4, "head_sha": sha, "name": "build", "status": status,
            "conclusion": conclusion, "app": {"id": 1, "slug": "github-actions"},
            "pull_requests": [{"number": 2}]});
        let body = match event_type {
            "check_run" => serde_json::json!({"action": "completed", "check_run": run,
                "repository": {"full_name": "Codertocat/Hello-World"}, "sender": {"login": "x"}}),
            "check_suite" => serde_json::json!({"action": "completed", "check_suite": run,
                "repository": {"full_name": "Codertocat/Hello-World"}}),
            _ => serde_json::json!({"id": 1, "sha": sha, "context": "ci/circleci: test",
                "state": status, "description": "", "target_url": null,
                "repository": {"full_name": "Codertocat/Hello-World"}}),
        };
        parse(event_type, body.to_string().as_bytes()).unwrap().kind
    }

    #[test]
    fn check_runs_suites_and_statuses_become_check_results() {
        let result = |name: &str, state| {
            EventKind::Check(CheckResult {
                sha: "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into(),
                name: name.into(),
                state,
            })
        };
        use CheckState::{Failure, Pending, Success};
        let runs = [
            ("queued", None, Pending),
            ("in_progress", None, Pending),
            ("completed", Some("success"), Success),
            ("completed", Some("skipped"), Success),
            ("completed", Some("neutral"), Success),
            ("completed", Some("failure"), Failure),
            ("completed", Some("timed_out"), Failure),
            ("completed", Some("cancelled"), Failure),
            ("completed", Some("action_required"), Failure),
        ];
        for (status, conclusion, state) in runs {
            let kind = check_delivery("check_run", status, conclusion);
            assert_eq!(kind, result("build", state), "{status} {conclusion:?}");
        }
        let suite = check_delivery("check_suite", "completed", Some("success"));
        assert_eq!(suite, result("github-actions", Success));
        for (state, expected) in [
            ("pending", Pending),
            ("success", Success),
            ("failure", Failure),
            ("error", Failure),
        ] {
            let kind = check_delivery("status", state, None);
            assert_eq!(kind, result("ci/circleci: test", expected), "{state}");
        }
        let nameless = serde_json::json!({"check_run": {"head_sha": "abc", "name": "",
            "status": "completed"}, "repository": {"full_name": "o/r"}});
        let kind = parse("check_run", nameless.to_string().as_bytes())
            .unwrap()
            .kind;
        assert!(matches!(kind, EventKind::Ignored(_)), "{kind:?}");
        assert!(
            parse("check_run", b"{\"check_run\": 1}").is_err(),
            "malformed: a 400"
        );
    }
}
