//! What the gate answers (no I/O): the waiting page of an environment that is starting, or a
//! JSON answer with `Retry-After` for clients that do not ask for HTML; a plain 404 for a host
//! no environment holds. Every word comes from previewd's own record of the environment, never
//! from the request (no host, path or header is echoed), and what it shows is HTML-escaped.
//! The page is open to the internet, whose visitors may not see the repository: it says what
//! the preview is doing and nothing of which it is: no environment name (which holds a branch's
//! slug), pull request, branch, namespace, commit or repository.

use http::StatusCode;
use serde_json::json;

use super::hosts::Holder;
use crate::model::crd::Phase;

/// The estimate for an environment that never woke before.
const FIRST_WAKE_ESTIMATE_SECONDS: u64 = 30;
/// How often the waiting page asks again.
pub const REFRESH_SECONDS: u64 = 5;

/// An answer to send: status, `Retry-After` (seconds), content type and body.
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<u64>,
    pub content_type: &'static str,
    pub body: String,
}

/// The answer for a host no environment holds.
pub fn unknown() -> Answer {
    Answer {
        status: StatusCode::NOT_FOUND,
        retry_after: None,
        content_type: "text/plain; charset=utf-8",
        body: "No preview environment at this address.\n".into(),
    }
}

/// What the environment is doing, in a few words, and the seconds it may still take.
fn state(holder: &Holder) -> (String, Option<u64>) {
    let estimate = holder
        .last_wake_seconds
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s.ceil() as u64)
        .unwrap_or(FIRST_WAKE_ESTIMATE_SECONDS)
        .max(1);
    match (holder.phase, holder.queue_position) {
        (Phase::Queued, Some(position)) => (format!("queued, position {position}"), None),
        (Phase::Queued, None) => ("queued".into(), None),
        (Phase::Degraded, _) => (
            "not starting: it is degraded, see its pull request".into(),
            None,
        ),
        _ => (format!("starting, about {estimate} s"), Some(estimate)),
    }
}

/// How long a client over the wake budget is asked to wait before it asks again.
pub const OVER_BUDGET_RETRY_SECONDS: u64 = 60;

/// The waiting page of `holder`, as HTML when the client asks for it (`wants_html`, from its
/// `Accept` header), else as JSON.
pub fn waiting(holder: &Holder, wants_html: bool) -> Answer {
    let (state, estimate) = state(holder);
    render(&state, estimate, REFRESH_SECONDS, wants_html)
}

/// The answer to a request that would wake a sleeping environment beyond the wake budget
/// (`super::budget`): it stays asleep, and the client is asked to come back in a minute.
pub fn over_budget(wants_html: bool) -> Answer {
    let state = "asleep: too many previews were woken from here in the last minutes; it starts on a later visit";
    render(state, None, OVER_BUDGET_RETRY_SECONDS, wants_html)
}

/// `state` as JSON, or as a page that reloads itself every `retry_after` seconds.
fn render(state: &str, estimate: Option<u64>, retry_after: u64, wants_html: bool) -> Answer {
    if !wants_html {
        let body = json!({"state": state, "estimatedSeconds": estimate});
        return Answer {
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Some(retry_after),
            content_type: "application/json",
            body: format!("{body}\n"),
        };
    }
    let state = escape(state);
    let body = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"{retry_after}\">\
<title>Preview: {state}</title></head>\n<body style=\"font-family: sans-serif; margin: 3em\">\
<h1>Preview environment</h1><p><strong>{state}</strong>.</p>\
<p>This page reloads itself every {retry_after} s and shows the application once it is ready.</p>\
</body></html>\n"
    );
    Answer {
        status: StatusCode::SERVICE_UNAVAILABLE,
        retry_after: Some(retry_after),
        content_type: "text/html; charset=utf-8",
        body,
    }
}

/// `text` with the five characters that mean something in HTML replaced.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder() -> Holder {
        Holder {
            namespace: "team-payments".into(),
            name: "web-pr-2-1a2b3c".into(),
            team: "team-payments".into(),
            head: "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into(),
            resource_version: "7".into(),
            asleep: true,
            generation: 1,
            phase: Phase::Sleeping,
            queue_position: None,
            last_wake_seconds: Some(11.2),
        }
    }

    #[test]
    fn browsers_get_a_page_that_reloads_itself_and_says_how_long() {
        let answer = waiting(&holder(), true);
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.retry_after, Some(REFRESH_SECONDS));
        assert!(
            answer
                .body
                .contains("<meta http-equiv=\"refresh\" content=\"5\">")
        );
        assert!(
            answer.body.contains("starting, about 12 s"),
            "{}",
            answer.body
        );
    }

    #[test]
    fn the_page_names_nothing_of_the_environment_and_escapes_what_it_shows() {
        let mut branch = holder();
        branch.name = "web-feature-secret-launch-1a2b3c".into();
        for shown in [
            waiting(&branch, true).body,
            waiting(&branch, false).body,
            over_budget(true).body,
            over_budget(false).body,
        ] {
            for hidden in [
                "team-payments",
                "web-",
                "feature",
                "secret-launch",
                "1a2b3c",
                "#",
            ] {
                assert!(!shown.contains(hidden), "{hidden:?} in: {shown}");
            }
        }
        assert_eq!(
            escape("<img src=x onerror='a'>&"),
            "&lt;img src=x onerror=&#39;a&#39;&gt;&amp;"
        );
    }

    #[test]
    fn over_the_wake_budget_the_page_says_so_and_asks_again_in_a_minute() {
        let answer = over_budget(false);
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.retry_after, Some(OVER_BUDGET_RETRY_SECONDS));
        let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert!(
            body["state"]
                .as_str()
                .unwrap()
                .starts_with("asleep: too many previews")
        );
    }

    #[test]
    fn other_clients_get_json_and_retry_after() {
        let mut first = holder();
        first.last_wake_seconds = None;
        let answer = waiting(&first, false);
        assert_eq!(answer.content_type, "application/json");
        assert_eq!(answer.retry_after, Some(REFRESH_SECONDS));
        let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert!(body.get("environment").is_none() && body.get("pullRequest").is_none());
        assert_eq!(body["state"], "starting, about 30 s");
        assert_eq!(body["estimatedSeconds"], 30);
    }

    #[test]
    fn a_queued_environment_says_its_place_and_a_degraded_one_says_so() {
        let mut queued = holder();
        queued.phase = Phase::Queued;
        queued.queue_position = Some(3);
        assert!(waiting(&queued, true).body.contains("queued, position 3"));
        let mut degraded = holder();
        degraded.phase = Phase::Degraded;
        assert!(waiting(&degraded, true).body.contains("not starting"));
    }

    #[test]
    fn an_unknown_host_gets_a_404_that_names_nothing() {
        let answer = unknown();
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert!(!answer.body.contains("preview."));
    }
}
