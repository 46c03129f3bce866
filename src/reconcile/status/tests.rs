//! The status step from small YAML fixtures and hand-made health, without an API server.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::*;
use crate::plan::render::RenderedObject;
use crate::plan::test_support::{WEB_ENVIRONMENT, environment};

fn at(text: &str) -> DateTime<Utc> {
    text.parse().expect("a time")
}

fn object(kind: &str, name: &str, wave: i32, seed: Option<&str>) -> RenderedObject {
    RenderedObject {
        manifest: "web.yaml".into(),
        wave,
        seed: seed.map(str::to_string),
        object: json!({"apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" },
                       "kind": kind, "metadata": {"name": name}}),
    }
}

#[test]
fn a_failed_seed_degrades_the_environment_and_later_waves_wait() {
    let seed = object("Job", "seed-db-1a2b3c", 0, Some("db"));
    let web = object("Deployment", "web", 1, None);
    let mut progress = Progress::default();
    progress.add_wave(
        0,
        &[&seed],
        &[Health::Failed("BackoffLimitExceeded".into())],
    );
    assert!(!progress.may_continue(), "wave 1 is not applied");
    progress.add_wave(
        1,
        &[&web],
        &[Health::Progressing("waiting for wave 0".into())],
    );
    assert_eq!(progress.phase, Phase::Degraded);
    assert_eq!(progress.condition.reason.as_str(), "SeedFailed");
    assert_eq!(
        progress.condition.message,
        "seed Job seed-db-1a2b3c failed: BackoffLimitExceeded"
    );
    assert_eq!(progress.seeds[0].state, "Failed");
    assert_eq!(progress.resources[0].name, "web");
    assert_eq!(progress.resources[0].state, "Progressing");
}

#[test]
fn the_first_object_still_rolling_out_names_its_wave() {
    let seed = object("Job", "seed-db-1a2b3c", 0, Some("db"));
    let web = object("Deployment", "web", 1, None);
    let mut progress = Progress::default();
    progress.add_wave(0, &[&seed], &[Health::Progressing("running".into())]);
    assert_eq!(progress.phase, Phase::Seeding);
    let mut progress = Progress::default();
    progress.add_wave(0, &[&seed], &[Health::Ready]);
    progress.add_wave(1, &[&web], &[Health::Progressing("1 of 2 ready".into())]);
    assert_eq!(progress.phase, Phase::Deploying);
    assert_eq!(
        progress.condition.message,
        "waiting for wave 1: Deployment web (1 of 2 ready)"
    );
    assert_eq!(progress.seeds[0].state, "Succeeded");
}

#[test]
fn becoming_ready_times_the_commit_from_its_push_and_records_the_deployed_sha() {
    let environment = environment(WEB_ENVIRONMENT);
    let now = at("2026-11-22T10:00:04.5Z");
    let placement = Placement {
        namespace: "preview-team-a-web-pr-2-abc123",
        url: "https://feature-login.preview.example.com",
        host: "feature-login.preview.example.com",
        extra_hosts: &[],
        routes: &[],
    };
    let status = progress_status(&environment, Progress::default(), placement, None, now);
    assert_eq!(status.phase, Phase::Ready);
    assert_eq!(
        status.deployed_sha.as_deref(),
        Some("ec26c3e57ca3a959ca5aad62de7213c562f8c821")
    );
    assert_eq!(status.observed_generation, Some(3));
    let timings = status.timings.expect("timings");
    assert_eq!(timings.requested_at, at("2026-11-22T10:00:00Z"));
    assert_eq!(timings.ready_at, Some(now));
    assert_eq!(timings.seconds_to_ready, Some(4.5));
    assert_eq!(status.conditions[0].status, "True");
    assert_eq!(status.conditions[0].last_transition_time, now);
}

#[test]
fn a_commit_already_ready_keeps_its_time_and_its_condition_keeps_its_transition() {
    let mut environment = environment(WEB_ENVIRONMENT);
    let first = at("2026-11-22T10:00:03Z");
    let placement = || Placement {
        namespace: "preview-x",
        url: "https://x",
        host: "x",
        extra_hosts: &[],
        routes: &[],
    };
    environment.status = Some(progress_status(
        &environment,
        Progress::default(),
        placement(),
        None,
        first,
    ));
    let later = at("2026-11-22T11:00:00Z");
    let again = progress_status(&environment, Progress::default(), placement(), None, later);
    assert_eq!(again.timings.and_then(|t| t.ready_at), Some(first));
    assert_eq!(again.conditions[0].last_transition_time, first);
}

#[test]
fn a_refusal_keeps_the_previous_status_and_says_why() {
    let mut environment = environment(WEB_ENVIRONMENT);
    let routes = [ingress_route()];
    let placement = Placement {
        namespace: "preview-x",
        url: "https://x",
        host: "x",
        extra_hosts: &[],
        routes: &routes,
    };
    let now = at("2026-11-22T10:00:03Z");
    environment.status = Some(progress_status(
        &environment,
        progress_with_ingress("Ready"),
        placement,
        None,
        now,
    ));
    let refused = refused_status(
        &environment,
        crate::reconcile::error::RefusalReason::GuardRejected,
        "ClusterRoleBinding/x (from web.yaml): cluster-scoped",
        Some("preview-x"),
        at("2026-11-22T10:05:00Z"),
    );
    assert_eq!(refused.phase, Phase::Degraded);
    assert_eq!(
        refused.url.as_deref(),
        Some("https://x"),
        "the previous commit's URL stays"
    );
    assert_eq!(refused.conditions[0].reason, "GuardRejected");
    assert_eq!(refused.conditions[0].status, "False");
    assert_eq!(
        refused.deployed_sha.as_deref(),
        Some("ec26c3e57ca3a959ca5aad62de7213c562f8c821"),
        "the previous commit keeps running"
    );
}

#[test]
fn merge_patches_clear_what_the_new_status_leaves_out() {
    let old = json!({"phase": "Queued", "queuePosition": 1,
                     "timings": {"sha": "a", "readyAt": "2026-11-22T10:00:00Z"}});
    let new = json!({"phase": "Deploying", "timings": {"sha": "b"}});
    assert_eq!(
        merge_patch(&old, &new),
        json!({"phase": "Deploying", "queuePosition": null,
               "timings": {"sha": "b", "readyAt": null}})
    );
}

fn ingress_route() -> Route {
    Route {
        kind: "Ingress".into(),
        name: "web".into(),
    }
}

fn progress_with_ingress(state: &str) -> Progress {
    Progress {
        resources: vec![ResourceStatus {
            api_version: "networking.k8s.io/v1".into(),
            kind: "Ingress".into(),
            name: "web".into(),
            wave: 0,
            state: state.into(),
            message: None,
        }],
        ..Progress::default()
    }
}

#[test]
fn the_url_is_reported_only_once_a_healthy_object_routes_its_host() {
    let environment = environment(WEB_ENVIRONMENT);
    let now = at("2026-11-22T10:00:04Z");
    let routes = [ingress_route()];
    let placement = |routes| Placement {
        namespace: "preview-x",
        url: "https://pr-2.preview.example.com",
        host: "pr-2.preview.example.com",
        extra_hosts: &[],
        routes,
    };
    let status = |progress, routes| {
        progress_status(&environment, progress, placement(routes), None, now).url
    };
    assert_eq!(
        status(progress_with_ingress("Ready"), &routes[..]),
        Some("https://pr-2.preview.example.com".into())
    );
    assert_eq!(
        status(progress_with_ingress("Progressing"), &routes[..]),
        None
    );
    assert_eq!(
        status(progress_with_ingress("Ready"), &[]),
        None,
        "nothing routes it"
    );
}

#[test]
fn an_environment_woken_into_the_queue_is_still_waking_and_its_wake_is_timed_once_ready() {
    let mut woken = environment(WEB_ENVIRONMENT);
    woken.spec.sleep = false;
    woken.spec.last_activity = Some(at("2026-11-26T10:00:00Z"));
    woken.status = Some(PreviewEnvironmentStatus {
        phase: Phase::Sleeping,
        ..Default::default()
    });
    let queued = held_status(
        &woken,
        Phase::Queued,
        ReadyReason::Queued,
        "waiting for a slot",
        None,
        at("2026-11-26T10:00:05Z"),
    );
    assert_eq!(
        queued.waking_since,
        Some(at("2026-11-26T10:00:00Z")),
        "woken at its activity"
    );
    // Later, Ready: the wake is timed from when it was woken, and it is no longer waking.
    woken.status = Some(queued);
    let mut ready = PreviewEnvironmentStatus {
        phase: Phase::Ready,
        ..Default::default()
    };
    record_waking(&woken, &mut ready, at("2026-11-26T10:01:00Z"));
    assert_eq!(ready.waking_since, None);
    assert_eq!(ready.last_wake_seconds, Some(60.0));
    // Asleep again: nothing is waking.
    woken.spec.sleep = true;
    let asleep = held_status(
        &woken,
        Phase::Sleeping,
        ProgressReason::Sleeping.into(),
        "asleep",
        None,
        at("2026-11-26T11:00:00Z"),
    );
    assert_eq!(asleep.waking_since, None);
}
