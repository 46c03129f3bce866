//! What every forge call shares, whichever forge it goes to: the error type, the timeouts, and
//! the [`Backoff`] that stops calling a forge that rate-limits or fails.
//!
//! After a rate-limit answer (403/429 with `Retry-After` or an exhausted
//! `X-RateLimit-Remaining`) or a run of failures (5xx, transport errors, timeouts) the backoff
//! refuses calls locally until the wait is over, so an outage or a spent budget is not
//! hammered. The remaining budget from the forge's headers is exported as
//! `previewd_forge_rate_limit_remaining`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};

use super::metrics::ForgeMetrics;

#[derive(Clone, Debug, thiserror::Error)]
pub enum ForgeApiError {
    #[error("{operation}: the forge answered {status}: {message}")]
    Http {
        operation: &'static str,
        status: u16,
        message: String,
    },
    #[error("{operation}: rate-limited by the forge; next call in {wait:?}")]
    RateLimited {
        operation: &'static str,
        wait: Duration,
    },
    #[error("{operation}: not sent, the forge failed recently; next call in {wait:?}")]
    BackingOff {
        operation: &'static str,
        wait: Duration,
    },
    #[error("{operation}: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },
    #[error("the forge API URL {0:?} is not a valid URL")]
    BadUrl(String),
    /// Plain HTTP to another machine would send the token in clear text.
    #[error(
        "the forge API URL {0:?} is plain HTTP to another machine: the token is only sent over https (or http to this machine)"
    )]
    InsecureUrl(String),
    /// A list longer than previewd reads: acting on part of it (say, deleting every
    /// environment whose PR is not on the first pages) would be wrong.
    #[error(
        "{operation}: the list has more than {pages} pages; previewd does not act on part of a list"
    )]
    Incomplete {
        operation: &'static str,
        pages: usize,
    },
    /// Repository manifests beyond previewd's limits ([`crate::forge::repository`]): a pull
    /// request must not make previewd download or hold an unbounded amount.
    #[error("{path}: {problem}")]
    ManifestsTooLarge { path: String, problem: String },
    /// A chart `path` names a file, or nothing: a commit never changes, so it is not retried.
    #[error("{path} is not a folder at this commit (a chart is a folder with Chart.yaml)")]
    NotAFolder { path: String },
    /// The content budget of the installation, token or instance is spent
    /// ([`super::budget`]): the report waits its turn, and is asked for again after `wait`.
    #[error("not sent yet: the forge's content budget is spent; this report's turn is in {wait:?}")]
    ContentBudget { wait: Duration },
    /// The environment's or the repository's reads of the forge this hour are spent
    /// ([`super::blobs`]): the commit is read again after `wait`; the one deployed before keeps
    /// running meanwhile.
    #[error(
        "{reads} reads of {repository} not made yet: this environment's or the repository's share of previewd's reads of the forge is spent this hour; next read in {wait:?}"
    )]
    ReadShare {
        repository: String,
        reads: usize,
        wait: Duration,
    },
    /// Nothing at `path` at this commit: a commit never changes, so it is not retried.
    #[error("{path} is not in the repository at this commit")]
    NotInRepository { path: String },
}

/// What of a forge's error answer previewd repeats (in conditions, logs and the public PR
/// comment): the API's own `message` when the body is the forge's JSON, else the first line of
/// plain text; never HTML (a proxy's or load balancer's error page can name internal hosts),
/// never more than 200 characters, no control characters.
pub(crate) fn error_summary(body: &str) -> String {
    const MAX: usize = 200;
    let text = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(json) => json["message"].as_str().unwrap_or_default().to_string(),
        Err(_) if body.trim_start().starts_with('<') => String::new(),
        Err(_) => body.lines().next().unwrap_or_default().to_string(),
    };
    let clean: String = text.chars().filter(|c| !c.is_control()).take(MAX).collect();
    if clean.trim().is_empty() {
        "(the forge's answer is not shown)".to_string()
    } else {
        clean
    }
}

/// Whether the token may be sent to `api_url`: https, or http to this machine only (a local
/// test forge or a port-forward). Anything else would put the token on the wire in clear text.
pub(crate) fn check_api_url(api_url: &str) -> Result<(), ForgeApiError> {
    let url = url::Url::parse(api_url).map_err(|_| ForgeApiError::BadUrl(api_url.to_string()))?;
    let local = match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(ForgeApiError::BadUrl(api_url.to_string())),
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" if local => Ok(()),
        "http" => Err(ForgeApiError::InsecureUrl(api_url.to_string())),
        _ => Err(ForgeApiError::BadUrl(api_url.to_string())),
    }
}

/// Refuses calls while a rate limit or a failure backoff is running.
#[derive(Default)]
pub(crate) struct Backoff {
    state: Mutex<BackoffState>,
}

#[derive(Default)]
struct BackoffState {
    not_before: Option<Instant>,
    rate_limited: bool,
    failures: u32,
}

/// Longest wait after failures.
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(300);

/// The longest previewd waits for a forge's answer. A forge that accepts connections and never
/// answers must not hold a reconcile (and the environment's status) hostage; after a timeout
/// it backs off as after any failure.
pub const FORGE_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const FORGE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Backoff {
    /// The state, even if a thread panicked holding it (it is a few numbers, always valid).
    fn lock(&self) -> std::sync::MutexGuard<'_, BackoffState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn check(&self, operation: &'static str) -> Result<(), ForgeApiError> {
        let state = self.lock();
        match state.not_before {
            Some(at) if at > Instant::now() => {
                let wait = at - Instant::now();
                Err(if state.rate_limited {
                    ForgeApiError::RateLimited { operation, wait }
                } else {
                    ForgeApiError::BackingOff { operation, wait }
                })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn success(&self) {
        let mut state = self.lock();
        state.failures = 0;
        state.not_before = None;
    }

    pub(crate) fn failure(&self) {
        let mut state = self.lock();
        state.failures = state.failures.saturating_add(1);
        let wait = Duration::from_secs(1u64 << state.failures.min(9)).min(MAX_FAILURE_BACKOFF);
        state.not_before = Some(Instant::now() + wait);
        state.rate_limited = false;
    }

    pub(crate) fn rate_limited(&self, wait: Duration) {
        let mut state = self.lock();
        state.not_before = Instant::now().checked_add(wait.min(MAX_RATE_LIMIT_WAIT));
        state.rate_limited = true;
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The longest a rate limit can make previewd wait: GitHub's and GitLab's limits reset within
/// the hour. A forge (or a man in the middle) asking for longer gets an hour; a wait of 2^64
/// seconds would overflow the clock and panic.
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(3_600);

/// How long a rate-limited answer asks us to wait: `Retry-After`, else until
/// `X-RateLimit-Reset` (epoch seconds), else a minute; at most [`MAX_RATE_LIMIT_WAIT`].
pub(crate) fn rate_limit_wait(headers: &HeaderMap) -> Duration {
    let asked = if let Some(seconds) = header_u64(headers, "retry-after") {
        Duration::from_secs(seconds)
    } else if let Some(reset) =
        header_u64(headers, "x-ratelimit-reset").or(header_u64(headers, "ratelimit-reset"))
    {
        let now = u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
        Duration::from_secs(reset.saturating_sub(now).max(1))
    } else {
        Duration::from_secs(60)
    };
    asked.min(MAX_RATE_LIMIT_WAIT)
}

/// Reads the budget headers of any answer; true if the answer is a rate-limit refusal.
pub(crate) fn observe_rate_limit(
    (forge, budget): (&str, &str),
    status: StatusCode,
    headers: &HeaderMap,
    metrics: &ForgeMetrics,
    backoff: &Backoff,
) -> bool {
    let remaining =
        header_u64(headers, "x-ratelimit-remaining").or(header_u64(headers, "ratelimit-remaining"));
    if let Some(remaining) = remaining {
        metrics
            .rate_limit_remaining
            .with_label_values(&[forge, budget])
            .set(remaining as i64);
    }
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN
            && (remaining == Some(0) || headers.contains_key("retry-after")));
    if limited {
        backoff.rate_limited(rate_limit_wait(headers));
    }
    limited
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_backs_off_after_failures_and_waits_out_rate_limits() {
        let backoff = Backoff::default();
        assert!(backoff.check("x").is_ok());
        backoff.failure();
        assert!(matches!(
            backoff.check("x"),
            Err(ForgeApiError::BackingOff { .. })
        ));
        backoff.success();
        assert!(backoff.check("x").is_ok());
        backoff.rate_limited(Duration::from_secs(30));
        let Err(ForgeApiError::RateLimited { wait, .. }) = backoff.check("x") else {
            panic!("expected a rate-limit refusal");
        };
        assert!(wait > Duration::from_secs(28));
    }

    #[test]
    fn rate_limit_answers_are_recognised_and_their_budget_exported() {
        let metrics = ForgeMetrics::new();
        let backoff = Backoff::default();
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining", "4999".parse().unwrap());
        assert!(!observe_rate_limit(
            ("github", "installation-7"),
            StatusCode::OK,
            &headers,
            &metrics,
            &backoff
        ));
        assert_eq!(
            metrics
                .rate_limit_remaining
                .with_label_values(&["github", "installation-7"])
                .get(),
            4999
        );
        headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
        headers.insert("retry-after", "120".parse().unwrap());
        assert!(observe_rate_limit(
            ("github", "installation-7"),
            StatusCode::FORBIDDEN,
            &headers,
            &metrics,
            &backoff
        ));
        assert!(matches!(
            backoff.check("x"),
            Err(ForgeApiError::RateLimited { .. })
        ));
        // A plain 403 (no permission) is not a rate limit.
        let backoff = Backoff::default();
        assert!(!observe_rate_limit(
            ("github", "installation-7"),
            StatusCode::FORBIDDEN,
            &HeaderMap::new(),
            &metrics,
            &backoff
        ));
        assert!(backoff.check("x").is_ok());
    }

    #[test]
    fn a_huge_or_garbled_retry_after_waits_an_hour_at_most() {
        let metrics = ForgeMetrics::new();
        for value in ["18446744073709551615", "99999999999", "-1", "soon"] {
            let mut headers = HeaderMap::new();
            headers.insert("retry-after", value.parse().unwrap());
            assert!(rate_limit_wait(&headers) <= MAX_RATE_LIMIT_WAIT, "{value}");
            let backoff = Backoff::default();
            observe_rate_limit(
                ("github", "token"),
                StatusCode::TOO_MANY_REQUESTS,
                &headers,
                &metrics,
                &backoff,
            );
            match backoff.check("x") {
                Err(ForgeApiError::RateLimited { wait, .. }) => {
                    assert!(wait <= MAX_RATE_LIMIT_WAIT, "{value}: {wait:?}")
                }
                other => panic!("{value}: not rate limited: {other:?}"),
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-reset", "18446744073709551615".parse().unwrap());
        assert_eq!(rate_limit_wait(&headers), MAX_RATE_LIMIT_WAIT);
    }

    #[test]
    fn the_token_goes_over_https_or_to_this_machine_only() {
        for fine in [
            "https://api.github.com",
            "https://gitlab.example.com:8443/",
            "http://127.0.0.1:8080",
            "http://localhost:3000",
            "http://[::1]:9000",
        ] {
            assert!(check_api_url(fine).is_ok(), "{fine}");
        }
        for insecure in [
            "http://gitlab.example.com",
            "http://10.0.0.5",
            "http://127.0.0.1.evil.com",
        ] {
            assert!(
                matches!(check_api_url(insecure), Err(ForgeApiError::InsecureUrl(_))),
                "{insecure}"
            );
        }
        for bad in ["ftp://x", "not a url", "file:///etc/passwd"] {
            assert!(check_api_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forge_error_bodies_are_summarised_never_repeated_whole() {
        assert_eq!(
            error_summary(r#"{"message":"Not Found","documentation_url":"x"}"#),
            "Not Found"
        );
        let page = "<html><body>502 from lb-internal-7.corp.example:8443</body></html>";
        assert_eq!(error_summary(page), "(the forge's answer is not shown)");
        let long = format!("first line {}\nsecond line", "x".repeat(500));
        let summary = error_summary(&long);
        assert_eq!(summary.chars().count(), 200);
        assert!(!summary.contains("second line"));
        assert_eq!(error_summary("bad\u{7}bell"), "badbell");
        assert_eq!(error_summary(""), "(the forge's answer is not shown)");
    }
}
