//! Arbitrary bytes as a webhook delivery: both forges' parsers, the repository lookup that
//! picks the secret, and signature checking. None of them may panic; a signature made from the
//! input's own bytes never verifies unless it is the real HMAC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use previewd::model::crd::ForgeKind;
use previewd::forge::{github, gitlab};

const EVENTS: [&str; 9] = [
    "pull_request",
    "push",
    "delete",
    "issue_comment",
    "ping",
    "Merge Request Hook",
    "Note Hook",
    "Push Hook",
    "other",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let event = EVENTS[selector as usize % EVENTS.len()];
    let _ = github::parse(event, body);
    let _ = gitlab::parse(event, body);
    let _ = previewd::forge::forges::forge(ForgeKind::Github).webhook.repository_of(body);
    let _ = previewd::forge::forges::forge(ForgeKind::Gitlab).webhook.repository_of(body);

    let secret = b"fuzz-secret";
    let claimed = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
    if claimed != github::sign(secret, body) {
        assert!(github::verify(secret, body, Some(&claimed)).is_err());
    }
    if claimed != "fuzz-secret" {
        assert!(gitlab::verify(secret, Some(&claimed)).is_err());
    }
});
