//! GitHub App authentication: organisations install previewd as a GitHub App instead of giving
//! it a person's token. The App's private key signs a short JWT (RS256, 9 minutes); with it
//! previewd finds the App's installation on the template's repository and asks for an
//! installation token limited to that one repository. Tokens are kept until 5 minutes before
//! GitHub's `expires_at`, so a busy repository costs one token request an hour.
//!
//! Every request goes only to the template's API URL (https, or http to this machine), with
//! redirects off; the key, the JWT and the tokens are never logged.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Digest;

use crate::forge::metrics::ForgeMetrics;
use crate::forge::transport::{
    FORGE_CONNECT_TIMEOUT, FORGE_TIMEOUT, ForgeApiError, check_api_url, error_summary,
};

/// A token is renewed this long before GitHub says it expires (they last an hour).
pub const RENEW_BEFORE: TimeDelta = TimeDelta::minutes(5);

/// The JWT's lifetime: GitHub accepts at most 10 minutes; its `iat` is set a minute back to
/// allow for clock drift, as GitHub recommends.
const JWT_LIFETIME: TimeDelta = TimeDelta::minutes(9);

/// (API URL, App id, repository in lower case, SHA-256 of the private key). The key is part of
/// it: App ids are public, and a template naming another team's App id and repository with a
/// key of its own must get nothing that team's key obtained, never a cached token.
type RepositoryKey = (String, u64, String, [u8; 32]);

/// A repository's token and when GitHub says it expires.
type Tokens = HashMap<RepositoryKey, (AppToken, DateTime<Utc>)>;

/// An installation token, and the installation whose rate limit it spends.
#[derive(Clone)]
pub struct AppToken {
    pub token: String,
    pub installation: u64,
}

/// Never the token itself, so that no log line or panic message carries it.
impl std::fmt::Debug for AppToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppToken")
            .field("token", &"<redacted>")
            .field("installation", &self.installation)
            .finish()
    }
}

/// Installation tokens of GitHub Apps, per repository, minted on demand and kept until shortly
/// before they expire.
pub struct AppTokens {
    /// `None` if the HTTP client could not be built (then every token request says so).
    http: Option<reqwest::Client>,
    metrics: ForgeMetrics,
    /// Installation id of each repository (an App installation does not move).
    installations: Mutex<HashMap<RepositoryKey, u64>>,
    tokens: Mutex<Tokens>,
}

#[derive(Serialize)]
struct Claims {
    iat: i64,
    exp: i64,
    iss: String,
}

#[derive(Deserialize)]
struct Installation {
    id: u64,
}

#[derive(Deserialize)]
struct InstallationToken {
    token: String,
    expires_at: DateTime<Utc>,
}

impl AppTokens {
    pub fn new(metrics: ForgeMetrics) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(FORGE_CONNECT_TIMEOUT)
            .timeout(FORGE_TIMEOUT)
            .user_agent(concat!("previewd/", env!("CARGO_PKG_VERSION")))
            .build();
        if let Err(e) = &http {
            tracing::error!(error = %e, "no HTTP client for GitHub App tokens");
        }
        Self {
            http: http.ok(),
            metrics,
            installations: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// An installation token of App `app_id` (private key `key`, PEM) for `repository`
    /// (`owner/name`), from the cache while it has more than [`RENEW_BEFORE`] left.
    pub async fn token(
        &self,
        api_url: Option<&str>,
        app_id: u64,
        key: &[u8],
        repository: &str,
    ) -> Result<AppToken, ForgeApiError> {
        let api_url = api_url
            .unwrap_or("https://api.github.com")
            .trim_end_matches('/');
        check_api_url(api_url)?;
        if !is_plain_repository(repository) {
            return Err(ForgeApiError::Transport {
                operation: "app_installation",
                message: format!(
                    "{repository:?} is not a GitHub repository name (owner/name): no App token is asked for it"
                ),
            });
        }
        let key_digest: [u8; 32] = sha2::Sha256::digest(key).into();
        let cache_key = (
            api_url.to_string(),
            app_id,
            repository.to_lowercase(),
            key_digest,
        );
        let now = Utc::now();
        if let Some((token, expires_at)) = self.cached(&cache_key)
            && expires_at - RENEW_BEFORE > now
        {
            return Ok(token);
        }
        let jwt = app_jwt(app_id, key, now)?;
        let installation = self
            .installation(api_url, &jwt, repository, &cache_key)
            .await?;
        let name = repository.rsplit('/').next().unwrap_or(repository);
        let path = format!("{api_url}/app/installations/{installation}/access_tokens");
        let body = json!({"repositories": [name]});
        let minted: InstallationToken = match self.call("app_token", &path, &jwt, Some(body)).await
        {
            Ok(minted) => minted,
            Err(e) => {
                // The App may have been uninstalled and installed again (a new id).
                self.lock_installations().remove(&cache_key);
                return Err(e);
            }
        };
        let token = AppToken {
            token: minted.token,
            installation,
        };
        self.lock_tokens()
            .insert(cache_key, (token.clone(), minted.expires_at));
        Ok(token)
    }

    fn cached(&self, key: &RepositoryKey) -> Option<(AppToken, DateTime<Utc>)> {
        self.lock_tokens().get(key).cloned()
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, Tokens> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_installations(&self) -> std::sync::MutexGuard<'_, HashMap<RepositoryKey, u64>> {
        self.installations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The App's installation on the repository (`GET /repos/{owner}/{repo}/installation`),
    /// asked once per repository.
    async fn installation(
        &self,
        api_url: &str,
        jwt: &str,
        repository: &str,
        key: &RepositoryKey,
    ) -> Result<u64, ForgeApiError> {
        if let Some(id) = self.lock_installations().get(key) {
            return Ok(*id);
        }
        let path = format!("{api_url}/repos/{repository}/installation");
        let found: Installation = self.call("app_installation", &path, jwt, None).await?;
        self.lock_installations().insert(key.clone(), found.id);
        Ok(found.id)
    }

    /// One call authenticated as the App (GET, or POST with `body`), counted like every forge
    /// call.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        operation: &'static str,
        url: &str,
        jwt: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ForgeApiError> {
        let Some(http) = &self.http else {
            return Err(ForgeApiError::Transport {
                operation,
                message: "previewd could not build its HTTP client".into(),
            });
        };
        let request = match &body {
            Some(body) => http.post(url).json(body),
            None => http.get(url),
        };
        let sent = request
            .bearer_auth(jwt)
            .header("accept", "application/vnd.github+json")
            .send()
            .await;
        let outcome = |label: &str| {
            self.metrics
                .requests
                .with_label_values(&["github", operation, label])
                .inc();
        };
        let response = sent.map_err(|e| {
            outcome("error");
            ForgeApiError::Transport {
                operation,
                message: e.without_url().to_string(),
            }
        })?;
        let status = response.status();
        // An installation and a token are a few hundred bytes; whatever the server at `apiUrl`
        // sends, no more than 1 MiB of it is read.
        let body = http::Response::from(response).into_body();
        let text = super::api::read_capped(body, 1 << 20)
            .await
            .map_err(|message| {
                outcome("error");
                ForgeApiError::Transport { operation, message }
            })?;
        if !status.is_success() {
            outcome("error");
            return Err(ForgeApiError::Http {
                operation,
                status: status.as_u16(),
                message: error_summary(&text),
            });
        }
        outcome("ok");
        serde_json::from_str(&text).map_err(|e| ForgeApiError::Transport {
            operation,
            message: format!("GitHub's answer is not what its API documents: {e}"),
        })
    }
}

/// `owner/name` of letters, digits, `-`, `_` and `.` (GitHub's own rule), neither part `.` or
/// `..`: the name goes into a request path that carries the App's JWT, so it may not reach any
/// other endpoint.
fn is_plain_repository(repository: &str) -> bool {
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(repository.split_once('/'), Some((owner, name)) if plain(owner) && plain(name))
}

/// The App's JWT at `now`, signed with `key` (an RSA private key in PEM, as GitHub hands it
/// out). A key that is not one is said without any of its content.
pub fn app_jwt(app_id: u64, key: &[u8], now: DateTime<Utc>) -> Result<String, ForgeApiError> {
    let bad_key = |_| ForgeApiError::Transport {
        operation: "app_jwt",
        message: "the GitHub App private key is not an RSA private key in PEM form".into(),
    };
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(key).map_err(bad_key)?;
    let claims = jwt_claims(app_id, now);
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    jsonwebtoken::encode(&header, &claims, &key).map_err(bad_key)
}

/// The claims of the App's JWT at `now`: issued a minute back (GitHub's advice for clock
/// drift), expiring [`JWT_LIFETIME`] after that, issuer the App id. Apart from [`app_jwt`] so
/// that these times can be checked without an RSA key.
fn jwt_claims(app_id: u64, now: DateTime<Utc>) -> Claims {
    let issued = now - TimeDelta::minutes(1);
    Claims {
        iat: issued.timestamp(),
        exp: (issued + JWT_LIFETIME).timestamp(),
        iss: app_id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_is_not_one_is_refused_without_repeating_it() {
        let secret = b"-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END RSA PRIVATE KEY-----\n";
        let error = app_jwt(1, secret, Utc::now()).unwrap_err().to_string();
        assert!(error.contains("not an RSA private key"), "{error}");
        assert!(!error.contains("c2VjcmV0"), "{error}");
        assert!(app_jwt(1, b"", Utc::now()).is_err());
    }

    /// The JWT's times as docs/forges.md promises them: issued a minute back for clock drift,
    /// valid 9 minutes from then, so it ends 8 minutes after `now`, inside GitHub's 10-minute
    /// limit. The numbers are written out rather than taken from `JWT_LIFETIME`, so that a
    /// change of the constant fails here.
    #[test]
    fn the_app_jwt_is_issued_a_minute_back_and_lives_nine_minutes() {
        let now = DateTime::from_timestamp(1_714_564_800, 0).unwrap();
        let claims = jwt_claims(31337, now);
        assert_eq!(claims.iat, now.timestamp() - 60, "issued a minute back");
        assert_eq!(claims.exp, claims.iat + 9 * 60, "valid 9 minutes");
        assert!(
            claims.exp - now.timestamp() < 10 * 60,
            "GitHub refuses more than 10 minutes"
        );
        assert_eq!(claims.iss, "31337", "issued by the App id");
    }

    #[test]
    fn only_plain_repository_names_reach_a_request_path() {
        for good in ["Codertocat/Hello-World", "o/r.js", "a-b/c_d"] {
            assert!(is_plain_repository(good), "{good}");
        }
        for bad in [
            "o",
            "o/r/x",
            "../app/installations",
            "o/..",
            "o/r?x=1",
            "o/r#",
            "/r",
            "o/",
        ] {
            assert!(!is_plain_repository(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn tokens_go_only_to_https_or_this_machine() {
        let tokens = AppTokens::new(ForgeMetrics::default());
        let plain = tokens
            .token(Some("http://forge.example"), 1, b"", "o/r")
            .await
            .unwrap_err();
        assert!(matches!(plain, ForgeApiError::InsecureUrl(_)), "{plain}");
    }

    /// The server at a template's `apiUrl` answers the installation lookup with 2 MiB: previewd
    /// reads no more than 1 MiB of it and fails the call, holding nothing more.
    #[tokio::test]
    async fn an_answer_over_1_mib_to_an_app_call_is_refused() {
        use wiremock::matchers::method;
        use wiremock::{Mock, ResponseTemplate};
        crate::install_crypto_provider();
        let key = std::process::Command::new("openssl")
            .args(["genrsa", "2048"])
            .output()
            .unwrap();
        assert!(key.status.success(), "openssl genrsa: {key:?}");
        let server = wiremock::MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(200).set_body_bytes(vec![b' '; 2 << 20]))
            .mount(&server)
            .await;
        let tokens = AppTokens::new(ForgeMetrics::default());
        let uri = server.uri();
        let refused = tokens.token(Some(&uri), 1, &key.stdout, "o/r").await;
        let Err(ForgeApiError::Transport { message, .. }) = refused else {
            panic!("not refused: {refused:?}");
        };
        assert!(message.contains("larger than 1048576 bytes"), "{message}");
    }

    /// An RSA private key (PEM), new each call.
    fn new_key() -> Vec<u8> {
        let key = std::process::Command::new("openssl")
            .args(["genrsa", "2048"])
            .output()
            .unwrap();
        assert!(key.status.success(), "openssl genrsa: {key:?}");
        key.stdout
    }

    /// App ids are public: another team's template naming the same App id and repository,
    /// with a key of its own, must not be handed the token the App's real key obtained. Its
    /// call goes to GitHub with its own JWT (which GitHub refuses; this double answers
    /// anything, so the test counts the token requests).
    #[tokio::test]
    async fn a_cached_token_is_only_for_the_key_that_obtained_it() {
        use wiremock::matchers::{method, path};
        use wiremock::{Mock, ResponseTemplate};
        crate::install_crypto_provider();
        let server = wiremock::MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/repos/o/r/installation"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": 42})))
            .mount(&server)
            .await;
        let expires_at = (Utc::now() + TimeDelta::hours(1)).to_rfc3339();
        Mock::given(method("POST"))
            .and(path("/app/installations/42/access_tokens"))
            .respond_with(
                ResponseTemplate::new(201)
                    .set_body_json(json!({"token": "ghs_owners", "expires_at": expires_at})),
            )
            .mount(&server)
            .await;
        let tokens = AppTokens::new(ForgeMetrics::default());
        let uri = server.uri();
        let (owners, intruders) = (new_key(), new_key());
        let token = tokens.token(Some(&uri), 7, &owners, "o/r").await.unwrap();
        assert_eq!(token.token, "ghs_owners");
        tokens.token(Some(&uri), 7, &owners, "o/r").await.unwrap();
        let asked = || async {
            let received = server.received_requests().await.unwrap_or_default();
            received
                .iter()
                .filter(|r| r.method.as_str() == "POST")
                .count()
        };
        assert_eq!(
            asked().await,
            1,
            "the owner's second call is served from the cache"
        );

        tokens
            .token(Some(&uri), 7, &intruders, "o/r")
            .await
            .unwrap();

        assert_eq!(asked().await, 2, "another key asked GitHub itself");
    }
}
