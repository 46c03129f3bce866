//! API errors in words for people: a condition or a PR comment says what the API server said,
//! never a Rust `Debug` dump of its `Status` (kube's own `Display` appends one).

/// `error` as a reader of a condition wants it: the API server's message, then its reason and
/// HTTP code (`the Deployment "web" is invalid: spec.selector: Required value (Invalid, HTTP
/// 422)`); any other error as it displays itself.
pub fn in_words(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            let message = status.message.trim();
            let message = if message.is_empty() {
                "no message"
            } else {
                message
            };
            match status.reason.trim() {
                "" => format!("{message} (HTTP {})", status.code),
                reason => format!("{message} ({reason}, HTTP {})", status.code),
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": reason, "message": message,
        }))
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn the_api_servers_words_with_reason_and_code_and_no_debug_dump() {
        let error = api_error(
            422,
            "Invalid",
            "Deployment.apps \"web\" is invalid: spec.selector: Required value",
        );
        let words = in_words(&error);
        assert_eq!(
            words,
            "Deployment.apps \"web\" is invalid: spec.selector: Required value (Invalid, HTTP 422)"
        );
        assert!(!error.to_string().is_empty());
        assert!(!words.contains("Status {"), "{words}");
    }

    #[test]
    fn an_empty_reason_or_message_still_reads() {
        assert_eq!(in_words(&api_error(500, "", "boom")), "boom (HTTP 500)");
        assert_eq!(
            in_words(&api_error(503, "ServiceUnavailable", "")),
            "no message (ServiceUnavailable, HTTP 503)"
        );
    }
}
