//! The intake's decisions from the fixture deliveries, without an API server.

use super::*;
use crate::forge::github;
use crate::model::crd::{ForgeKind, PreviewTemplateSpec};

fn now() -> DateTime<Utc> {
    "2026-11-22T10:00:00Z".parse().unwrap()
}

fn template(name: &str, adjust: impl FnOnce(&mut PreviewTemplateSpec)) -> Arc<PreviewTemplate> {
    let mut spec = PreviewTemplateSpec::default();
    spec.forge.kind = ForgeKind::Github;
    spec.forge.repository = "Codertocat/Hello-World".into();
    adjust(&mut spec);
    let mut template = PreviewTemplate::new(name, spec);
    template.metadata.namespace = Some("previews".into());
    Arc::new(template)
}

fn github_event(event_type: &str, file: &str) -> ForgeEvent {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/github")
        .join(file);
    github::parse(event_type, &std::fs::read(path).unwrap()).unwrap()
}

fn change_request(adjust: impl FnOnce(&mut ChangeRequest)) -> ForgeEvent {
    let mut event = github_event("pull_request", "pull_request.opened.json");
    if let EventKind::ChangeRequest(change) = &mut event.kind {
        adjust(change);
    }
    event
}

fn applied(decisions: &[Decision]) -> Vec<&PreviewEnvironment> {
    decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Apply(e) => Some(e.as_ref()),
            Decision::Wake { .. } | Decision::Delete { .. } => None,
        })
        .collect()
}

#[test]
fn an_opened_pr_becomes_one_environment_per_matching_template() {
    let templates = [
        template("web", |_| {}),
        template("other-repo", |s| s.forge.repository = "someone/else".into()),
        template("on-gitlab", |s| s.forge.kind = ForgeKind::Gitlab),
    ];
    let decisions = decide(
        &github_event("pull_request", "pull_request.opened.json"),
        &templates,
        &[],
        now(),
    );
    let environments = applied(&decisions);
    assert_eq!(environments.len(), 1);
    let environment = environments[0];
    assert_eq!(environment.namespace().as_deref(), Some("previews"));
    assert!(environment.name_any().starts_with("web-pr-2-"));
    assert_eq!(environment.spec.template, "web");
    assert_eq!(environment.spec.source.pull_request, Some(2));
    assert_eq!(
        environment.spec.source.head_sha,
        "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
    );
    assert_eq!(environment.spec.last_activity, Some(now()));
    assert_eq!(
        environment
            .labels()
            .get(LABEL_PULL_REQUEST)
            .map(String::as_str),
        Some("2")
    );
}

#[test]
fn repository_names_match_case_insensitively() {
    let templates = [template("web", |s| {
        s.forge.repository = "codertocat/hello-world".into()
    })];
    let decisions = decide(
        &github_event("pull_request", "pull_request.opened.json"),
        &templates,
        &[],
        now(),
    );
    assert_eq!(applied(&decisions).len(), 1);
}

#[test]
fn closing_deletes_and_says_why() {
    let templates = [template("web", |_| {})];
    let decisions = decide(
        &github_event("pull_request", "pull_request.closed.json"),
        &templates,
        &[],
        now(),
    );
    let [Decision::Delete { name, reason, .. }] = decisions.as_slice() else {
        panic!("expected one delete, got {decisions:?}");
    };
    assert!(name.starts_with("web-pr-2-"));
    assert_eq!(reason.as_str(), "the pull request was closed");
}

#[test]
fn drafts_labels_and_forks_follow_the_triggers() {
    let existing_env = |templates: &[Arc<PreviewTemplate>]| -> Vec<Arc<PreviewEnvironment>> {
        applied(&decide(&change_request(|_| {}), templates, &[], now()))
            .into_iter()
            .map(|e| Arc::new(e.clone()))
            .collect()
    };
    // Drafts off (default): a draft gets nothing; converting to draft deletes.
    let templates = [template("web", |_| {})];
    let draft = change_request(|c| c.draft = true);
    assert!(decide(&draft, &templates, &[], now()).is_empty());
    let existing = existing_env(&templates);
    assert!(matches!(
        decide(&draft, &templates, &existing, now()).as_slice(),
        [Decision::Delete { .. }]
    ));
    // Drafts on.
    let templates = [template("web", |s| s.triggers.draft_pull_requests = true)];
    assert_eq!(applied(&decide(&draft, &templates, &[], now())).len(), 1);
    // A required label.
    let templates = [template("web", |s| {
        s.triggers.required_label = Some("preview".into())
    })];
    assert!(decide(&change_request(|_| {}), &templates, &[], now()).is_empty());
    let labeled = change_request(|c| c.labels.push("preview".into()));
    assert_eq!(applied(&decide(&labeled, &templates, &[], now())).len(), 1);
    // Forks: denied by default; allowed, or recorded to wait for approval (the
    // controller holds it until `/preview approve`), when the template says so.
    let fork = change_request(|c| c.fork = true);
    assert!(decide(&fork, &[template("web", |_| {})], &[], now()).is_empty());
    for policy in [ForkPolicy::Allow, ForkPolicy::RequireApproval] {
        let templates = [template("web", |s| s.triggers.fork_policy = policy)];
        let decisions = decide(&fork, &templates, &[], now());
        let environments = applied(&decisions);
        assert_eq!(environments.len(), 1);
        assert!(environments[0].spec.source.fork);
        assert_eq!(environments[0].spec.approved_sha, None);
    }
    // PRs off.
    let off = [template("web", |s| s.triggers.pull_requests = false)];
    assert!(decide(&change_request(|_| {}), &off, &[], now()).is_empty());
}

#[test]
fn a_push_to_a_pr_branch_updates_that_environment_only() {
    let templates = [template("web", |s| s.triggers.branches = vec!["*".into()])];
    let pr_env: Vec<Arc<PreviewEnvironment>> =
        applied(&decide(&change_request(|_| {}), &templates, &[], now()))
            .into_iter()
            .map(|e| Arc::new(e.clone()))
            .collect();
    let push = ForgeEvent {
        forge: ForgeKind::Github,
        repository: "Codertocat/Hello-World".into(),
        kind: EventKind::Push(Push {
            branch: "changes".into(),
            head_sha: "feedbeef".into(),
            author: None,
            changed_at: None,
            files: None,
            head_message: None,
        }),
    };
    let decisions = decide(&push, &templates, &pr_env, now());
    let environments = applied(&decisions);
    assert_eq!(
        environments.len(),
        1,
        "no second environment for the branch"
    );
    assert_eq!(environments[0].name_any(), pr_env[0].name_any());
    assert_eq!(environments[0].spec.source.head_sha, "feedbeef");
    assert_eq!(environments[0].spec.source.pull_request, Some(2));
}

#[test]
fn an_older_delivery_never_replaces_a_newer_head() {
    let templates = [template("web", |_| {})];
    let at = |minute: u32| Some(now() - chrono::TimeDelta::minutes(60 - i64::from(minute)));
    let newer = change_request(|c| {
        c.head_sha = "newer".into();
        c.changed_at = at(30);
    });
    let decisions = decide(&newer, &templates, &[], now());
    let current: Vec<Arc<PreviewEnvironment>> = applied(&decisions)
        .into_iter()
        .map(|e| Arc::new(e.clone()))
        .collect();
    let older = change_request(|c| {
        c.head_sha = "older".into();
        c.changed_at = at(10);
    });
    assert!(
        decide(&older, &templates, &current, now()).is_empty(),
        "the older snapshot is dropped"
    );
    let later = change_request(|c| {
        c.head_sha = "later".into();
        c.changed_at = at(40);
    });
    assert_eq!(
        applied(&decide(&later, &templates, &current, now()))[0]
            .spec
            .source
            .head_sha,
        "later"
    );
    // Without timestamps nothing can be told: arrival order decides.
    let untimed = change_request(|c| {
        c.head_sha = "untimed".into();
        c.changed_at = None;
    });
    assert_eq!(
        applied(&decide(&untimed, &templates, &current, now())).len(),
        1
    );
}

/// A fork's pull request from its own `main` does not take over the base repository's `main`:
/// a push there updates (or creates) the branch environment and leaves the fork's alone, and
/// deleting the base's branch does not delete it.
/// A `closed` delivery replayed after the pull request was reopened (its time is older than
/// the reopen the environment recorded) deletes nothing; a close newer than the environment
/// does.
#[test]
fn a_replayed_close_does_not_delete_a_reopened_environment() {
    let templates = [template("web", |_| {})];
    let reopened = github_event("pull_request", "pull_request.reopened.json");
    let closed = github_event("pull_request", "pull_request.closed.json");
    let environment = |event: &ForgeEvent| -> Vec<Arc<PreviewEnvironment>> {
        applied(&decide(event, &templates, &[], now()))
            .into_iter()
            .map(|e| Arc::new(e.clone()))
            .collect()
    };
    // The fixtures: reopened at 15:20:33, closed at 15:21:18. The close is newer: it deletes.
    let open = environment(&reopened);
    assert_eq!(open.len(), 1);
    let deletes = |existing: &[Arc<PreviewEnvironment>]| {
        decide(&closed, &templates, existing, now())
            .iter()
            .filter(|d| matches!(d, Decision::Delete { .. }))
            .count()
    };
    assert_eq!(deletes(&open), 1);
    // Reopened again after that close: the old close, replayed, deletes nothing.
    let reopened_later = change_request(|c| {
        c.changed_at = Some("2019-05-15T15:30:00Z".parse().unwrap());
    });
    let open_again = environment(&reopened_later);
    assert_eq!(deletes(&open_again), 0);
}

#[test]
fn a_fork_branch_named_like_a_base_branch_does_not_follow_its_pushes() {
    let templates = [template("web", |s| {
        s.triggers.branches = vec!["main".into()];
        s.triggers.fork_policy = crate::model::crd::ForkPolicy::Allow;
    })];
    let fork_pr: Vec<Arc<PreviewEnvironment>> = applied(&decide(
        &change_request(|c| {
            c.fork = true;
            c.branch = "main".into();
        }),
        &templates,
        &[],
        now(),
    ))
    .into_iter()
    .map(|e| Arc::new(e.clone()))
    .collect();
    assert_eq!(fork_pr.len(), 1);
    let base = |kind| ForgeEvent {
        forge: ForgeKind::Github,
        repository: "Codertocat/Hello-World".into(),
        kind,
    };
    let push = base(EventKind::Push(Push {
        branch: "main".into(),
        head_sha: "feedbeef".into(),
        author: None,
        changed_at: None,
        files: None,
        head_message: None,
    }));
    let decisions = decide(&push, &templates, &fork_pr, now());
    let environments = applied(&decisions);
    assert_eq!(environments.len(), 1, "{decisions:?}");
    assert_eq!(
        environments[0].spec.source.pull_request, None,
        "the branch environment"
    );
    assert_ne!(environments[0].name_any(), fork_pr[0].name_any());
    let deleted = base(EventKind::BranchDeleted {
        branch: "main".into(),
    });
    let decisions = decide(&deleted, &templates, &fork_pr, now());
    assert!(
        decisions
            .iter()
            .all(|d| !matches!(d, Decision::Delete { name, .. } if *name == fork_pr[0].name_any())),
        "{decisions:?}"
    );
}

#[test]
fn branch_pushes_follow_the_globs_and_deletions_remove_them() {
    let templates = [template("web", |s| {
        s.triggers.branches = vec!["release/*".into()]
    })];
    let push = |branch: &str| ForgeEvent {
        forge: ForgeKind::Github,
        repository: "Codertocat/Hello-World".into(),
        kind: EventKind::Push(Push {
            branch: branch.into(),
            head_sha: "abc".into(),
            author: Some("a".into()),
            changed_at: None,
            files: None,
            head_message: None,
        }),
    };
    assert!(decide(&push("main"), &templates, &[], now()).is_empty());
    let decisions = decide(&push("release/1.2"), &templates, &[], now());
    let environment = applied(&decisions)[0].clone();
    assert_eq!(environment.spec.source.pull_request, None);
    assert_eq!(environment.spec.source.branch, "release/1.2");
    let deleted = ForgeEvent {
        forge: ForgeKind::Github,
        repository: "Codertocat/Hello-World".into(),
        kind: EventKind::BranchDeleted {
            branch: "release/1.2".into(),
        },
    };
    let decisions = decide(
        &deleted,
        &templates,
        &[Arc::new(environment.clone())],
        now(),
    );
    let [
        Decision::Delete {
            namespace,
            name,
            reason,
        },
    ] = decisions.as_slice()
    else {
        panic!("expected one delete, got {decisions:?}");
    };
    assert_eq!(
        (namespace.as_str(), name.clone(), reason.as_str()),
        ("previews", environment.name_any(), "the branch was deleted")
    );
}

#[test]
fn pings_comments_and_ignored_events_change_nothing() {
    let templates = [template("web", |_| {})];
    for event in [
        github_event("ping", "ping.json"),
        github_event("push", "push.json"),
        github_event("issue_comment", "issue_comment.created.json"),
    ] {
        assert!(
            decide(&event, &templates, &[], now()).is_empty(),
            "{event:?}"
        );
    }
}

#[test]
fn a_burst_of_identical_deliveries_writes_once_a_minute() {
    let templates = [template("web", |_| {})];
    let event = change_request(|_| {});
    let existing: Vec<Arc<PreviewEnvironment>> = applied(&decide(&event, &templates, &[], now()))
        .into_iter()
        .map(|e| Arc::new(e.clone()))
        .collect();
    let soon = now() + chrono::TimeDelta::seconds(30);
    assert!(
        decide(&event, &templates, &existing, soon).is_empty(),
        "nothing new within a minute"
    );
    // The same delivery again later (a replay with a new delivery id, a redelivery): the
    // forge's time of the change is the same, so it says nothing new and refreshes nothing.
    let later = now() + chrono::TimeDelta::hours(3);
    assert!(
        decide(&event, &templates, &existing, later).is_empty(),
        "a replay changes nothing"
    );
    // Without the forge's time (GitLab's push), identical deliveries count as activity once a
    // minute.
    let mut untimed: Vec<Arc<PreviewEnvironment>> = existing.clone();
    Arc::make_mut(&mut untimed[0]).spec.source.changed_at = None;
    let untimed_event = change_request(|c| c.changed_at = None);
    assert_eq!(
        applied(&decide(&untimed_event, &templates, &untimed, later)).len(),
        1,
        "activity refreshed after a minute"
    );
    let new_commit = change_request(|c| c.head_sha = "feedbeef".into());
    assert_eq!(
        applied(&decide(&new_commit, &templates, &existing, soon)).len(),
        1,
        "a new commit is written at once"
    );
}

#[test]
fn a_new_commit_wakes_a_sleeping_environment_and_a_redelivery_does_not() {
    let templates = [template("web", |_| {})];
    let event = change_request(|_| {});
    let mut sleeping = applied(&decide(&event, &templates, &[], now()))[0].clone();
    sleeping.spec.sleep = true;
    let existing = [Arc::new(sleeping.clone())];
    let later = now() + chrono::TimeDelta::minutes(5);
    let woke = |decisions: &[Decision]| {
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Wake { name, .. } if *name == sleeping.name_any()))
    };
    assert!(!woke(&decide(&event, &templates, &existing, later)));
    let new_commit = change_request(|c| c.head_sha = "feedbeef".into());
    assert!(woke(&decide(&new_commit, &templates, &existing, later)));
}

#[test]
fn globs() {
    assert!(glob_matches("feature/*", "feature/login/x"));
    assert!(glob_matches("*", "anything"));
    assert!(glob_matches("v?", "v1"));
    assert!(!glob_matches("feature/*", "main"));
    assert!(!glob_matches("v?", "v10"));
    // A glob with many `*` against a long branch name: no backtracking blow-up.
    let started = std::time::Instant::now();
    assert!(!glob_matches(
        &format!("{}b", "*a".repeat(60)),
        &"a".repeat(250)
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

/// A push to PR 2's branch `changes` with the head `sha`, these files and this message.
fn push_to_pr_branch(sha: &str, files: Option<&[&str]>, message: &str) -> ForgeEvent {
    ForgeEvent {
        forge: ForgeKind::Github,
        repository: "Codertocat/Hello-World".into(),
        kind: EventKind::Push(Push {
            branch: "changes".into(),
            head_sha: sha.into(),
            author: None,
            changed_at: None,
            files: files.map(|f| f.iter().map(|s| s.to_string()).collect()),
            head_message: Some(message.into()),
        }),
    }
}

#[test]
fn a_push_that_changed_only_left_out_files_records_a_skip_that_a_silent_delivery_keeps() {
    let templates = [template("web", |s| {
        s.triggers.ignore_paths = vec!["docs/**".into()]
    })];
    let opened = decide(&change_request(|_| {}), &templates, &[], now());
    let pr_env: Vec<Arc<PreviewEnvironment>> = applied(&opened)
        .into_iter()
        .map(|e| Arc::new(e.clone()))
        .collect();
    assert_eq!(
        pr_env[0].spec.skip, None,
        "GitHub's pull_request delivery says nothing"
    );

    let docs = push_to_pr_branch("d0c5", Some(&["docs/guide.md"]), "Explain setup");
    let decisions = decide(&docs, &templates, &pr_env, now());
    let skipped = applied(&decisions)[0].clone();
    let skip = skipped.spec.skip.clone().unwrap();
    assert_eq!(
        (skip.sha.as_str(), skip.reason.as_str()),
        ("d0c5", "only `docs/` changed")
    );

    // The pull_request delivery of the same commit (no files, no message) keeps the skip.
    let recorded = [Arc::new(skipped.clone())];
    let synchronize = change_request(|c| c.head_sha = "d0c5".into());
    let kept = decide(&synchronize, &templates, &recorded, now());
    assert_eq!(applied(&kept)[0].spec.skip, Some(skip));

    // A push that changes code clears it; `[skip preview]` skips whatever changed.
    let code = push_to_pr_branch("c0de", Some(&["src/main.rs"]), "Fix it");
    assert_eq!(
        applied(&decide(&code, &templates, &recorded, now()))[0]
            .spec
            .skip,
        None
    );
    let marked = push_to_pr_branch("5c1p", None, "WIP [skip preview]");
    let decisions = decide(&marked, &templates, &recorded, now());
    let reason = applied(&decisions)[0].spec.skip.clone().unwrap().reason;
    assert_eq!(reason, "its message says `[skip preview]`");
}

#[test]
fn the_skip_label_removes_the_environment_and_creates_none() {
    let templates = [template("web", |s| {
        s.triggers.skip_label = Some("no-preview".into())
    })];
    let labelled = change_request(|c| c.labels.push("no-preview".into()));
    assert!(decide(&labelled, &templates, &[], now()).is_empty());
    let opened = decide(&change_request(|_| {}), &templates, &[], now());
    let existing: Vec<Arc<PreviewEnvironment>> = applied(&opened)
        .into_iter()
        .map(|e| Arc::new(e.clone()))
        .collect();
    let decisions = decide(&labelled, &templates, &existing, now());
    assert!(matches!(
        decisions.as_slice(),
        [Decision::Delete {
            reason: DeletionReason::SkipLabel,
            ..
        }]
    ));
}
