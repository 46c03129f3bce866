use chrono::TimeZone;

use super::*;
use crate::model::crd::{CheckRecord, Timings};
use crate::plan::test_support::{WEB_ENVIRONMENT, WEB_TEMPLATE, environment, template};

const HEAD: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
const OLD: &str = "0000000000000000000000000000000000000001";

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 24, 12, 0, 0).unwrap()
}

fn waiting_template(names: &[&str], timeout: Option<&str>) -> PreviewTemplate {
    let mut template = template(WEB_TEMPLATE);
    template.spec.triggers.wait_for_checks = Some(WaitForChecks {
        names: names.iter().map(|n| n.to_string()).collect(),
        timeout: timeout.map(str::to_string),
    });
    template
}

/// The web environment at HEAD, with OLD deployed and these results recorded.
fn with_checks(results: &[(&str, &str, CheckState)]) -> PreviewEnvironment {
    let mut environment = environment(WEB_ENVIRONMENT);
    for (name, sha, state) in results {
        let record = CheckRecord {
            sha: sha.to_string(),
            state: *state,
        };
        environment.spec.checks.insert(name.to_string(), record);
    }
    let status = environment.status.get_or_insert_default();
    status.deployed_sha = Some(OLD.into());
    status.timings = Some(Timings {
        sha: OLD.into(),
        requested_at: now(),
        ready_at: Some(now()),
        seconds_to_ready: Some(1.0),
    });
    environment
}

fn held(admission: Admission) -> Held {
    match admission {
        Admission::Held(held) => held,
        Admission::Open => panic!("the commit is admitted"),
    }
}

use CheckState::{Failure, Pending, Success};

#[test]
fn a_template_without_checks_never_holds_a_commit() {
    let environment = with_checks(&[]);
    assert_eq!(
        admission(&environment, &template(WEB_TEMPLATE), now()),
        Admission::Open
    );
}

#[test]
fn the_head_waits_until_every_named_check_passed_for_it() {
    let template = waiting_template(&["build", "lint"], None);
    let waiting = held(admission(&with_checks(&[]), &template, now()));
    assert_eq!(waiting.commit.reason, WaitingReason::AwaitingChecks);
    assert_eq!(waiting.commit.sha, HEAD);
    assert_eq!(
        waiting.commit.message,
        "Commit `ec26c3e` deploys once CI passes: waiting for `build` (not reported yet), `lint` (not reported yet)."
    );
    assert_eq!(
        waiting.recheck,
        Some(Duration::from_secs(3600)),
        "the default timeout"
    );
    // A result of the previous commit does not count for the head.
    let stale = with_checks(&[("build", OLD, Success), ("lint", HEAD, Pending)]);
    let waiting = held(admission(&stale, &template, now()));
    assert!(
        waiting
            .commit
            .message
            .ends_with("`build` (not reported yet), `lint` (running)."),
        "{}",
        waiting.commit.message
    );
    let one_passed = with_checks(&[("build", HEAD, Success), ("lint", HEAD, Pending)]);
    let waiting = held(admission(&one_passed, &template, now()));
    assert!(
        waiting
            .commit
            .message
            .ends_with("waiting for `lint` (running)."),
        "{}",
        waiting.commit.message
    );
    let passed = with_checks(&[("build", HEAD, Success), ("lint", HEAD, Success)]);
    assert_eq!(admission(&passed, &template, now()), Admission::Open);
}

#[test]
fn a_failed_check_holds_the_commit_until_it_is_re_run_or_waived() {
    let template = waiting_template(&["build", "lint"], None);
    let failed = with_checks(&[("build", HEAD, Failure), ("lint", HEAD, Pending)]);
    let waiting = held(admission(&failed, &template, now()));
    assert_eq!(waiting.commit.reason, WaitingReason::ChecksFailed);
    assert!(waiting.commit.failed());
    assert!(
        waiting
            .commit
            .message
            .contains("CI reported a failure of `build`."),
        "{}",
        waiting.commit.message
    );
    assert_eq!(waiting.recheck, None);
    let mut waived = failed.clone();
    waived.spec.deploy_without_checks = Some(HEAD.into());
    assert_eq!(
        admission(&waived, &template, now()),
        Admission::Open,
        "/preview deploy"
    );
    let mut waived_before = failed;
    waived_before.spec.deploy_without_checks = Some(OLD.into());
    assert!(
        matches!(
            admission(&waived_before, &template, now()),
            Admission::Held(_)
        ),
        "a waiver is for one commit"
    );
}

#[test]
fn every_check_mode_needs_at_least_one_and_all_of_them_passed() {
    let template = waiting_template(&[], None);
    let none = held(admission(&with_checks(&[]), &template, now()));
    assert!(
        none.commit
            .message
            .ends_with("waiting for the commit's checks (none reported yet).")
    );
    let running = with_checks(&[("pipeline", HEAD, Pending), ("old", OLD, Failure)]);
    assert_eq!(
        held(admission(&running, &template, now())).commit.reason,
        WaitingReason::AwaitingChecks
    );
    let passed = with_checks(&[("pipeline", HEAD, Success), ("old", OLD, Failure)]);
    assert_eq!(admission(&passed, &template, now()), Admission::Open);
}

#[test]
fn the_timeout_counts_from_when_the_commit_was_first_held() {
    let template = waiting_template(&["build"], Some("30m"));
    let mut environment = with_checks(&[("build", HEAD, Pending)]);
    let first = held(admission(&environment, &template, now()));
    assert_eq!(first.recheck, Some(Duration::from_secs(1800)));
    environment.status.as_mut().unwrap().waiting = Some(first.commit.clone());
    let later = now() + TimeDelta::minutes(20);
    assert_eq!(
        held(admission(&environment, &template, later)).recheck,
        Some(Duration::from_secs(600))
    );
    let timed_out = held(admission(
        &environment,
        &template,
        now() + TimeDelta::minutes(30),
    ));
    assert_eq!(timed_out.commit.reason, WaitingReason::ChecksTimedOut);
    assert_eq!(timed_out.commit.since, now());
    assert!(
        timed_out
            .commit
            .message
            .contains("gave up after 30m waiting for `build` (running)"),
        "{}",
        timed_out.commit.message
    );
    // A late success still deploys it.
    environment.spec.checks.get_mut("build").unwrap().state = Success;
    assert_eq!(
        admission(&environment, &template, now() + TimeDelta::hours(5)),
        Admission::Open
    );
}

#[test]
fn a_commit_whose_deploy_began_is_not_held_again_by_a_re_run() {
    let template = waiting_template(&["build"], None);
    let mut environment = with_checks(&[("build", HEAD, Pending)]);
    environment
        .status
        .as_mut()
        .unwrap()
        .timings
        .as_mut()
        .unwrap()
        .sha = HEAD.into();
    assert_eq!(admission(&environment, &template, now()), Admission::Open);
}

#[test]
fn a_bad_timeout_or_hostile_names_give_a_clear_message() {
    let bad = waiting_template(&["build"], Some("soon"));
    let waiting = held(admission(&with_checks(&[]), &bad, now()));
    assert_eq!(waiting.commit.reason, WaitingReason::ChecksFailed);
    assert!(
        waiting
            .commit
            .message
            .contains("triggers.waitForChecks.timeout \"soon\""),
        "{}",
        waiting.commit.message
    );
    // In "every check" mode the names come from the CI workflow: no backtick ends the code
    // span, no line break starts a new paragraph, and the list stays short.
    let every = waiting_template(&[], None);
    let mut results: Vec<(String, CheckState)> =
        (0..8).map(|n| (format!("job-{n}"), Pending)).collect();
    results.push(("a` [click](https://evil.example)\n# Title".into(), Pending));
    let results: Vec<(&str, &str, CheckState)> = results
        .iter()
        .map(|(n, s)| (n.as_str(), HEAD, *s))
        .collect();
    let message = held(admission(&with_checks(&results), &every, now()))
        .commit
        .message;
    assert!(message.contains("and 4 more"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(message.matches('`').count(), 2 + 2 * 5, "{message}");
}

#[test]
fn a_skipped_head_is_held_with_or_without_waiting_for_checks_until_deploy_is_asked() {
    let mut environment = with_checks(&[("build", HEAD, Success)]);
    environment.spec.skip = Some(crate::model::crd::SkippedCommit {
        sha: HEAD.into(),
        reason: "only `docs/` changed".into(),
    });
    for template in [template(WEB_TEMPLATE), waiting_template(&["build"], None)] {
        let skipped = held(admission(&environment, &template, now()));
        assert_eq!(skipped.commit.reason, WaitingReason::Skipped);
        assert!(skipped.commit.skipped() && !skipped.commit.failed());
        assert_eq!(
            skipped.commit.message,
            "No preview for commit `ec26c3e`: only `docs/` changed."
        );
        assert_eq!(skipped.recheck, None, "nothing to wait for");
    }
    // A skip recorded for another commit does not count; `/preview deploy` deploys anyway.
    let mut stale = environment.clone();
    stale.spec.skip.as_mut().unwrap().sha = OLD.into();
    assert_eq!(
        admission(&stale, &template(WEB_TEMPLATE), now()),
        Admission::Open
    );
    environment.spec.deploy_without_checks = Some(HEAD.into());
    assert_eq!(
        admission(&environment, &template(WEB_TEMPLATE), now()),
        Admission::Open
    );
}
