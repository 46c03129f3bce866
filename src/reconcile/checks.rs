//! The checks step (pure): whether a new head commit may deploy yet: not when the intake
//! recorded it as skipped (`spec.skip`: `[skip preview]`, path filters), and not before its
//! CI passed when its template waits for it (`triggers.waitForChecks`). The results come from
//! check deliveries, which the webhook intake records in `spec.checks` (see
//! `webhook::checks`); nothing here asks the forge.
//!
//! While the head is held back the commit deployed before keeps running: the pipeline
//! reconciles that commit (so its health stays current) and says in `status.waiting` what the
//! head waits for. A commit whose deploy has begun is never held back again, so a check
//! re-run does not take a deployed commit away.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::model::crd::{
    CheckState, PreviewEnvironment, PreviewTemplate, WaitForChecks, WaitingCommit, WaitingReason,
};
use crate::model::durations::template_duration;

/// How long a commit waits for its checks when the template does not say.
pub const DEFAULT_TIMEOUT: TimeDelta = TimeDelta::hours(1);

/// At most this many check names are listed in a message.
const LISTED: usize = 5;

/// Whether the head commit may deploy.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    Open,
    Held(Held),
}

/// A head commit held back: what the status says, and when to look again (the timeout), if
/// waiting can still end by itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub commit: WaitingCommit,
    pub recheck: Option<Duration>,
}

/// Whether `environment`'s head commit may deploy at `now`, or is held back and why.
pub fn admission(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    now: DateTime<Utc>,
) -> Admission {
    let head = &environment.spec.source.head_sha;
    let status = environment.status.clone().unwrap_or_default();
    let waived = environment.spec.deploy_without_checks.as_deref() == Some(head.as_str());
    if waived || status.has_started(head) {
        return Admission::Open;
    }
    let since = status.waiting_since(head).unwrap_or(now);
    let short: String = head.chars().take(7).collect();
    if let Some(skip) = environment.spec.skip.as_ref().filter(|s| &s.sha == head) {
        return Admission::Held(Held {
            commit: WaitingCommit {
                sha: head.clone(),
                reason: WaitingReason::Skipped,
                message: format!("No preview for commit `{short}`: {}.", skip.reason),
                since,
            },
            recheck: None,
        });
    }
    let Some(wait) = &template.spec.triggers.wait_for_checks else {
        return Admission::Open;
    };
    let held = |reason: WaitingReason, message: String, recheck| {
        Admission::Held(Held {
            commit: WaitingCommit {
                sha: head.clone(),
                reason,
                message,
                since,
            },
            recheck,
        })
    };
    let Some(timeout) = timeout_of(wait) else {
        let message = format!(
            "The template's triggers.waitForChecks.timeout {:?} is not a duration like 45m or 2h: commit `{short}` is not deployed.",
            wait.timeout.as_deref().unwrap_or_default()
        );
        return held(WaitingReason::ChecksFailed, message, None);
    };
    let results = results(environment, wait);
    let failed = listed(&results, |state| state == Some(CheckState::Failure), false);
    if !failed.is_empty() {
        let message = format!(
            "Commit `{short}` is not deployed: CI reported a failure of {failed}. Push a fix or re-run the check, or comment `/preview deploy` to deploy it anyway."
        );
        return held(WaitingReason::ChecksFailed, message, None);
    }
    if !results.is_empty() && results.iter().all(|(_, s)| *s == Some(CheckState::Success)) {
        return Admission::Open;
    }
    let waiting_for = if results.is_empty() {
        "the commit's checks (none reported yet)".to_string()
    } else {
        listed(&results, |state| state != Some(CheckState::Success), true)
    };
    let deadline = since + timeout;
    if now >= deadline {
        let message = format!(
            "Commit `{short}` is not deployed: gave up after {} waiting for {waiting_for}. A late success still deploys it; comment `/preview deploy` to deploy it now.",
            minutes(timeout)
        );
        return held(WaitingReason::ChecksTimedOut, message, None);
    }
    let message = format!("Commit `{short}` deploys once CI passes: waiting for {waiting_for}.");
    let recheck = (deadline - now).to_std().ok();
    held(WaitingReason::AwaitingChecks, message, recheck)
}

fn timeout_of(wait: &WaitForChecks) -> Option<TimeDelta> {
    match &wait.timeout {
        None => Some(DEFAULT_TIMEOUT),
        Some(text) => template_duration(Some(text)),
    }
}

/// The state of each check the head waits for (`None`: not reported yet). With no names, every
/// check reported for the head.
fn results(
    environment: &PreviewEnvironment,
    wait: &WaitForChecks,
) -> Vec<(String, Option<CheckState>)> {
    let head = &environment.spec.source.head_sha;
    let of_head = |name: &str| {
        environment
            .spec
            .checks
            .get(name)
            .filter(|r| r.sha.eq_ignore_ascii_case(head))
            .map(|r| r.state)
    };
    if wait.names.is_empty() {
        return environment
            .spec
            .checks
            .keys()
            .filter_map(|name| of_head(name).map(|state| (name.clone(), Some(state))))
            .collect();
    }
    wait.names
        .iter()
        .map(|name| (name.clone(), of_head(name)))
        .collect()
}

/// The checks whose state matches, as `` `build` (running), `lint` (not reported yet) ``
/// (without the states: `` `build`, `lint` ``).
fn listed(
    results: &[(String, Option<CheckState>)],
    matches: impl Fn(Option<CheckState>) -> bool,
    with_state: bool,
) -> String {
    let chosen: Vec<String> = results
        .iter()
        .filter(|(_, state)| matches(*state))
        .map(|(name, state)| {
            let state = match state {
                None => "not reported yet",
                Some(CheckState::Pending) => "running",
                Some(CheckState::Success) => "passed",
                Some(CheckState::Failure) => "failed",
            };
            match with_state {
                true => format!("`{}` ({state})", shown(name)),
                false => format!("`{}`", shown(name)),
            }
        })
        .collect();
    let mut text = chosen
        .iter()
        .take(LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if chosen.len() > LISTED {
        text.push_str(&format!(" and {} more", chosen.len() - LISTED));
    }
    text
}

/// A check name as shown in a code span of the PR comment: in "every check" mode names come
/// from whoever wrote the CI workflow, so no backtick or line break may end the span.
fn shown(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control() && *c != '`')
        .take(64)
        .collect()
}

fn minutes(delta: TimeDelta) -> String {
    match delta.num_minutes() {
        m if m % 60 == 0 => format!("{}h", m / 60),
        m => format!("{m}m"),
    }
}

#[cfg(test)]
mod tests;
