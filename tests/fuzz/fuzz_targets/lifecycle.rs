//! Lifecycle durations and times as a PR author or template author can write them: the
//! template's `idleTimeout` and `maxAge`, a `/preview extend <text>` comment, and any creation,
//! activity and keep-until time. Parsing, the expiry, the comment's effect and the sweep's
//! verdict never panic (no unchecked arithmetic on any of them), a parsed duration is exactly
//! number × unit, and an accepted extension never keeps an environment past its limit.
#![no_main]

use chrono::{DateTime, Datelike, TimeDelta, Utc};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use previewd::lifecycle::rules::{self, ForgeFacts};
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};
use previewd::model::{clock, durations};
use previewd::webhook::commands::{self, CommentCommand};
use serde_json::json;

#[derive(Arbitrary, Debug)]
struct Input {
    idle_timeout: String,
    max_age: String,
    extend: String,
    sleep_when_idle: bool,
    created: i64,
    last_activity: i64,
    keep_until: Option<i64>,
    now: i64,
    pull_request: Option<u64>,
    open: bool,
}

/// The duration `text` should parse to, in seconds, computed another way (in u128, saturating).
fn expected_seconds(text: &str) -> Option<u128> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let number: u128 = text[..digits].parse().ok()?;
    let unit = match &text[digits..] {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return None,
    };
    // Beyond u128 is beyond u64 too: any value above u64::MAX says "too large".
    Some(number.checked_mul(unit).unwrap_or(u128::MAX))
}

/// A time Kubernetes can hold: the API server accepts RFC 3339 timestamps only, whose year has
/// four digits (a year like -31783 never reaches previewd).
fn time(seconds: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(seconds, 0).filter(|t| (1..=9999).contains(&t.year()))
}

fuzz_target!(|input: Input| {
    for text in [&input.idle_timeout, &input.max_age, &input.extend] {
        match (durations::parse_duration(text), expected_seconds(text)) {
            (Ok(parsed), Some(expected)) => assert_eq!(u128::from(parsed.as_secs()), expected),
            (Ok(parsed), None) => panic!("{text:?} parsed as {parsed:?}"),
            (Err(_), Some(expected)) => assert!(expected > u128::from(u64::MAX), "{text:?}"),
            (Err(_), None) => {}
        }
    }
    let (Some(created), Some(active), Some(now)) =
        (time(input.created), time(input.last_activity), time(input.now))
    else {
        return;
    };
    let keep_until = input.keep_until.and_then(time);
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
        "metadata": {"name": "app", "namespace": "team"},
        "spec": {
            "forge": {"kind": "github", "repository": "o/r"},
            "manifests": {},
            "lifecycle": {
                "idleTimeout": input.idle_timeout,
                "maxAge": input.max_age,
                "idleAction": if input.sleep_when_idle { "Sleep" } else { "Delete" },
            },
        }
    }))
    .expect("a template");
    let mut environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": "app-pr-1", "namespace": "team", "creationTimestamp": created},
        "spec": {
            "template": "app",
            "source": {"repository": "o/r", "branch": "b", "headSha": "0".repeat(40),
                       "pullRequest": input.pull_request},
            "lastActivity": active,
            "keepUntil": keep_until,
        }
    }))
    .expect("an environment");

    let _ = clock::expires_at(&environment, &template);
    let facts = ForgeFacts {
        open_pull_requests: input.pull_request.filter(|_| input.open).into_iter().collect(),
        branches: ["b".to_string()].into(),
    };
    let _ = rules::judge(&environment, Some(&template), Some(&facts), now);
    let _ = rules::judge(&environment, Some(&template), None, now);

    let comment = format!("/preview extend {}", input.extend);
    if let Some(Ok(command)) = commands::parse(&comment) {
        let CommentCommand::Extend(_, delta) = &command else {
            panic!("{comment:?} parsed as {command:?}");
        };
        assert!(*delta > TimeDelta::zero() && *delta <= commands::MAX_EXTENSION);
        let _ = commands::effect(&command, &environment, &template, "someone", now);
        environment.spec.keep_until = now.checked_add_signed(*delta);
        let _ = clock::expires_at(&environment, &template);
    }
});
