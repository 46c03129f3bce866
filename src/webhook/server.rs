//! The HTTP server: `POST /webhooks/<forge>` (each forge's path, [`forges`]), `/metrics`, `/healthz`,
//! `/readyz`.
//!
//! A delivery is answered as soon as its environments are written (one API call each); the
//! controller does the deploying. In order:
//!
//! 0. more than [`MAX_DELIVERIES_IN_FLIGHT`] deliveries being handled, or more than
//!    `--webhook-deliveries-per-client` from this delivery's client address (the address a
//!    trusted proxy says it came from, as the wake gate counts it: `model::clients`): this one
//!    waits up to [`SLOW_CLIENT_TIMEOUT`] for its turn, then 503; a body that has not arrived
//!    within [`SLOW_CLIENT_TIMEOUT`]: 408. A slow or hostile client holds its own share of the
//!    turns at most, each briefly, so the forge's deliveries keep the rest;
//! 1. a body over the size limit: 413 (read to its end, up to [`MAX_DRAINED_BYTES`], so that
//!    the sender receives the answer rather than a reset connection);
//! 2. a body that is not JSON: 400;
//! 3. no `PreviewTemplate` for the delivery's repository, or
//! 4. a missing or wrong signature (checked against the webhook secret of each template of that
//!    repository, in constant time): 401 with one fixed body for both ([`NOT_ACCEPTED`]), so an
//!    outsider cannot tell which repositories previewd serves, nor learn a template's or a
//!    Secret's name; the log and the metric say which it was. The delivery then acts only for
//!    the templates whose own secret verified it;
//! 5. a delivery id already handled: 200, nothing written again;
//! 6. otherwise the event is parsed (400 if it does not fit its type), decided on and written:
//!    202 with what was done. An unknown event type is 202, ignored.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kube::{Client, ResourceExt};
use prometheus::{Encoder, TextEncoder};
use serde_json::json;
use tracing::Instrument;

use crate::cluster::caches::Caches;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::records::{Applied, Records};
use crate::cluster::secrets::{SecretError, SecretReader};
use crate::forge::access::WriteAccess;
use crate::forge::{EventKind, ForgeEvent, forges};
use crate::model::clients::{ClientShares, client_address, default_trusted_proxies};
use crate::model::crd::{ForgeKind, PreviewTemplate};
use crate::webhook::deliveries::DeliveryLog;
use crate::webhook::intake::{self, Decision};
use crate::webhook::metrics::WebhookMetrics;

/// Everything the handlers share.
pub struct ServerState {
    pub client: Client,
    /// Templates and environments as watched for this server (or shared with the controller).
    pub caches: Caches,
    pub secrets: SecretReader,
    pub metrics: ServerMetrics,
    pub max_body_bytes: usize,
    /// Whose word on a delivery's client counts, and how many turns one client may hold.
    trusted_proxies: Vec<ipnet::IpNet>,
    client_turns: Arc<ClientShares>,
    /// The forge gateway: comment commands ask it who may write.
    pub write_access: Arc<WriteAccess>,
    /// Answers given lately to commenters without write access.
    refusals: super::refusals::RefusalAnswers,
    deliveries: DeliveryLog,
    /// Writes commands make go through it (counted, within its timeout).
    writer: crate::cluster::writer::Writer,
    /// Turns for deliveries being handled (body read, checked, written).
    in_flight: tokio::sync::Semaphore,
    /// Set when the controller of this replica stopped by itself: not ready any more.
    controller_stopped: std::sync::atomic::AtomicBool,
    /// What the kernel keeps around the engines, said by `/readyz` (`engines::contain`).
    containment: std::sync::OnceLock<String>,
}

/// How many deliveries are handled at once; more wait for a turn. Bounds the memory bodies
/// take (this many times `--webhook-max-body-bytes`) and the load on the API server.
pub const MAX_DELIVERIES_IN_FLIGHT: usize = 64;

/// What one delivery and one client may take of the endpoint (`--webhook-max-body-bytes`,
/// `--webhook-deliveries-per-client`, `--webhook-trusted-proxies`).
#[derive(Clone, Debug)]
pub struct DeliveryLimits {
    pub max_body_bytes: usize,
    /// Turns one client address may hold of the [`MAX_DELIVERIES_IN_FLIGHT`].
    pub per_client: usize,
    /// Proxies whose `X-Forwarded-For` says who the client is.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

/// The default share of one client address: a quarter of the turns, so that holding them all
/// takes four addresses, while a forge's burst from one address still queues for its share.
pub const DEFAULT_DELIVERIES_PER_CLIENT: usize = MAX_DELIVERIES_IN_FLIGHT / 4;

impl DeliveryLimits {
    /// Bodies up to `max_body_bytes`; the default share per client and trusted proxies.
    pub fn with_max_body(max_body_bytes: usize) -> Self {
        Self {
            max_body_bytes,
            per_client: DEFAULT_DELIVERIES_PER_CLIENT,
            trusted_proxies: default_trusted_proxies(),
        }
    }
}

/// How long a delivery may wait for its turn, and how long its body may take to arrive.
pub const SLOW_CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The metrics the server writes to, and the registry it serves on `/metrics`.
#[derive(Clone)]
pub struct ServerMetrics {
    pub webhook: WebhookMetrics,
    /// Set from the cache at each scrape, like the environments by phase.
    pub footprints: crate::webhook::footprints::FootprintMetrics,
    /// Counts the intake's writes with everyone else's.
    pub writes: ClusterMetrics,
    pub registry: prometheus::Registry,
}

impl ServerState {
    pub fn new(
        client: Client,
        caches: Caches,
        write_access: Arc<WriteAccess>,
        metrics: ServerMetrics,
        limits: DeliveryLimits,
    ) -> Arc<Self> {
        let writer = crate::cluster::writer::Writer::new(metrics.writes.clone());
        Arc::new(Self {
            writer,
            secrets: SecretReader::new(client.clone()),
            client,
            caches,
            metrics,
            max_body_bytes: limits.max_body_bytes,
            trusted_proxies: limits.trusted_proxies,
            client_turns: ClientShares::new(limits.per_client),
            write_access,
            refusals: Default::default(),
            deliveries: DeliveryLog::default(),
            in_flight: tokio::sync::Semaphore::new(MAX_DELIVERIES_IN_FLIGHT),
            controller_stopped: std::sync::atomic::AtomicBool::new(false),
            containment: std::sync::OnceLock::new(),
        })
    }

    /// The engines' containment, one line, said by `/readyz` after its status.
    pub fn say_containment(&self, line: String) {
        let _ = self.containment.set(line);
    }

    /// The controller of this replica stopped by itself: `/readyz` answers 503 from now on.
    pub fn controller_stopped(&self) {
        self.controller_stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The router, for `serve` and for tests.
pub fn router(state: Arc<ServerState>) -> Router {
    let mut router = Router::new();
    for forge in forges::all() {
        let kind = forge.kind;
        let deliveries = move |State(state): State<Arc<ServerState>>, request: Request| async move {
            handle(&state, kind, request).await
        };
        router = router.route(forge.webhook.path, post(deliveries));
    }
    router
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves until `shutdown` completes, then stops accepting connections and lets in-flight
/// requests finish (a delivery being written is answered, not cut off). Readiness turns on
/// once the template and environment caches hold the cluster's state (before that, a delivery
/// could miss its template).
pub async fn serve(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(?address, "webhook server listening");
    // The peer's address is each delivery's client, or the proxy that says who is.
    let service = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn readyz(State(state): State<Arc<ServerState>>) -> Response {
    if state
        .controller_stopped
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        (StatusCode::SERVICE_UNAVAILABLE, "the controller stopped").into_response()
    } else if *state.caches.ready.borrow() {
        let containment = state
            .containment
            .get()
            .map(String::as_str)
            .unwrap_or_default();
        (StatusCode::OK, format!("ready\n{containment}")).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet").into_response()
    }
}

async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
    let metrics = &state.metrics;
    // One copy of the cache for both gauges, taken once per scrape.
    let environments = state.caches.environments.state();
    metrics
        .webhook
        .count_environments(environments.iter().map(|e| e.as_ref()));
    metrics
        .footprints
        .count(environments.iter().map(|e| e.as_ref()), chrono::Utc::now());
    let mut text = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&metrics.registry.gather(), &mut text) {
        tracing::warn!(error = %e, "could not encode the metrics");
    }
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// What a delivery came to: the HTTP answer and the metric outcome.
struct DeliveryAnswer {
    status: StatusCode,
    /// For the metric and the log (may say more than the body).
    outcome: &'static str,
    body: serde_json::Value,
    /// For the log only, when the body must not say it.
    detail: Option<String>,
}

/// The one answer to a delivery no template accepts, whether its repository is served or not.
pub const NOT_ACCEPTED: &str =
    "not accepted: no webhook secret or token of this previewd verifies this delivery";

/// The one answer to a verified delivery whose writes failed (the details go to the log).
pub const NOT_WRITTEN: &str = "previewd could not record this delivery; deliver it again later";

/// The one answer to a delivery whose secret could not be read.
pub const UNAVAILABLE: &str = "previewd could not read a webhook secret it needs to verify this delivery; deliver it again later";

impl DeliveryAnswer {
    fn new(status: StatusCode, outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            body: json!({ "outcome": outcome, "message": message.into() }),
            detail: None,
        }
    }

    /// 503 for a delivery no template could verify because a secret could not be read (the
    /// forge delivers it again): the answer names nothing; `detail` (the template, the Secret,
    /// previewd's identity) goes to the log only.
    fn unavailable(detail: String) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            outcome: "error",
            body: json!({ "outcome": "error", "message": UNAVAILABLE }),
            detail: Some(detail),
        }
    }

    /// 401 with [`NOT_ACCEPTED`]; `outcome` and `detail` (names included) go to the metric
    /// and the log only.
    fn not_accepted(outcome: &'static str, detail: String) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            outcome,
            body: json!({ "outcome": "unauthorized", "message": NOT_ACCEPTED }),
            detail: Some(detail),
        }
    }
}

async fn handle(state: &ServerState, forge: ForgeKind, request: Request) -> Response {
    let started = std::time::Instant::now();
    let headers = request.headers().clone();
    let webhook = &forges::forge(forge).webhook;
    let event_type = header(&headers, webhook.event_header)
        .unwrap_or_default()
        .to_string();
    let delivery = header(&headers, webhook.delivery_header).map(str::to_string);
    let client = client_of(state, &request);
    let forge_label = forge.as_str();
    // One span per delivery: every line logged while handling it (intake, forge calls) carries
    // the delivery id, and the repository and environments once they are known.
    let span = tracing::info_span!(
        "delivery",
        forge = forge_label,
        event = %event_type,
        delivery = delivery.as_deref().unwrap_or("-"),
        repository = tracing::field::Empty,
        environments = tracing::field::Empty,
    );
    let answer = answer(
        state,
        client,
        forge,
        &headers,
        &event_type,
        delivery.as_deref(),
        request.into_body(),
    )
    .instrument(span.clone())
    .await;
    let _entered = span.enter();
    state
        .metrics
        .webhook
        .deliveries
        .with_label_values(&[
            forge_label,
            (webhook.event_label)(&event_type),
            answer.outcome,
        ])
        .inc();
    state
        .metrics
        .webhook
        .duration
        .with_label_values(&[forge_label])
        .observe(started.elapsed().as_secs_f64());
    let message = match &answer.detail {
        Some(detail) => detail.as_str(),
        None => answer.body["message"].as_str().unwrap_or_default(),
    };
    // A delivery for a repository nobody serves is routine (an organisation-wide hook).
    let refused = answer.outcome != "ignored";
    if refused && (answer.status.is_client_error() || answer.status.is_server_error()) {
        tracing::warn!(
            status = answer.status.as_u16(),
            outcome = answer.outcome,
            "webhook refused: {message}"
        );
    } else {
        tracing::info!(
            status = answer.status.as_u16(),
            outcome = answer.outcome,
            "webhook: {message}"
        );
    }
    (answer.status, axum::Json(answer.body)).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The address a delivery is counted under: the peer, or the client a trusted proxy names.
/// Without a peer (a router called in-process, as tests do) every delivery is one client.
fn client_of(state: &ServerState, request: &Request) -> IpAddr {
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |info| info.0.ip());
    client_address(peer, request.headers(), &state.trusted_proxies)
}

async fn answer(
    state: &ServerState,
    client: IpAddr,
    forge: ForgeKind,
    headers: &HeaderMap,
    event_type: &str,
    delivery: Option<&str>,
    body: Body,
) -> DeliveryAnswer {
    let waited = std::time::Instant::now();
    let busy = |whose: String| {
        DeliveryAnswer::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!("{whose} for {SLOW_CLIENT_TIMEOUT:?}; redeliver later"),
        )
    };
    // This client's share first: a client over it waits without holding one of everyone's.
    let Some(_share) = state
        .client_turns
        .take_within(client, SLOW_CLIENT_TIMEOUT)
        .await
    else {
        let per_client = state.client_turns.per_client();
        return busy(format!(
            "more than {per_client} deliveries at once from one client"
        ));
    };
    let left = SLOW_CLIENT_TIMEOUT.saturating_sub(waited.elapsed());
    let turn = tokio::time::timeout(left, state.in_flight.acquire()).await;
    let Ok(Ok(_turn)) = turn else {
        return busy(format!(
            "more than {MAX_DELIVERIES_IN_FLIGHT} deliveries at once"
        ));
    };
    match checked_event(state, forge, headers, event_type, body).await {
        Ok((event, templates)) => act_once(state, forge, delivery, &event, &templates).await,
        Err(answer) => answer,
    }
}

/// Checks 1 to 4 and the parse: the verified event and the templates of its repository, or
/// the answer that ends the delivery there.
async fn checked_event(
    state: &ServerState,
    forge: ForgeKind,
    headers: &HeaderMap,
    event_type: &str,
    body: Body,
) -> Result<(ForgeEvent, Vec<Arc<PreviewTemplate>>), DeliveryAnswer> {
    let malformed =
        |message: String| DeliveryAnswer::new(StatusCode::BAD_REQUEST, "malformed", message);
    let body = read_body(state, headers, body).await?;
    if event_type.is_empty() {
        return Err(malformed("no event type header".into()));
    }
    let webhook = &forges::forge(forge).webhook;
    let repository = webhook
        .repository_of(&body)
        .map_err(|e| malformed(e.to_string()))?
        .unwrap_or_default();
    tracing::Span::current().record("repository", repository.as_str());
    let templates = templates_of(state, forge, &repository);
    if templates.is_empty() {
        return Err(unserved(state, forge, headers, &body, &repository).await);
    }
    let templates = verify(state, forge, headers, &body, &templates).await?;
    let event = (webhook.parse)(event_type, &body).map_err(|e| malformed(e.to_string()))?;
    match &event.kind {
        EventKind::Ignored(reason) => Err(DeliveryAnswer::new(
            StatusCode::ACCEPTED,
            "ignored",
            reason.clone(),
        )),
        EventKind::Ping => Err(DeliveryAnswer::new(
            StatusCode::OK,
            "pong",
            "the hook works",
        )),
        _ => Ok((event, templates)),
    }
}

/// The most of an oversized body previewd reads (and drops) before it answers 413: GitHub sends
/// up to 25 MB. A sender still writing when previewd closes the connection gets a reset
/// instead of the answer; past this, it does.
pub const MAX_DRAINED_BYTES: usize = 32 << 20;

/// The body, at most `max_body_bytes`, arrived within [`SLOW_CLIENT_TIMEOUT`]. A body that
/// says it is longer than [`MAX_DRAINED_BYTES`] is refused before any of it is read.
async fn read_body(
    state: &ServerState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, DeliveryAnswer> {
    let too_large = || {
        DeliveryAnswer::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the body is over the limit of {} bytes",
                state.max_body_bytes
            ),
        )
    };
    let announced = header(headers, "content-length").and_then(|v| v.parse::<usize>().ok());
    if announced.is_some_and(|length| length > MAX_DRAINED_BYTES) {
        return Err(too_large());
    }
    let read = read_at_most(body, state.max_body_bytes);
    match tokio::time::timeout(SLOW_CLIENT_TIMEOUT, read).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(())) => Err(too_large()),
        Err(_) => Err(DeliveryAnswer::new(
            StatusCode::REQUEST_TIMEOUT,
            "too_slow",
            format!("the body did not arrive within {SLOW_CLIENT_TIMEOUT:?}"),
        )),
    }
}

/// The body when it holds at most `limit` bytes. A larger one is read on, and dropped, up to
/// [`MAX_DRAINED_BYTES`], so that its sender receives the 413 (never more than `limit` bytes
/// are kept); an error of the connection is the same refusal.
async fn read_at_most(body: Body, limit: usize) -> Result<axum::body::Bytes, ()> {
    use futures::StreamExt;
    let mut chunks = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen: usize = 0;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|_| ())?;
        seen = seen.saturating_add(chunk.len());
        if seen > MAX_DRAINED_BYTES {
            return Err(());
        }
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        } else if !kept.is_empty() {
            // Over the limit: nothing of it is kept while the rest is read.
            kept = Vec::new();
        }
    }
    if seen > limit {
        return Err(());
    }
    Ok(kept.into())
}

/// How many distinct webhook secrets a delivery for a repository no template serves is checked
/// against: each is a Secret read (cached) and, on GitHub, an HMAC over the whole body (up to
/// 2 MiB), for a sender not known yet.
const MAX_SECRETS_FOR_UNSERVED: usize = 16;

/// The answer to a delivery for a repository no template serves. A GitLab group hook (and a
/// GitHub organization hook) sends every project's events with one secret, and GitLab disables
/// a hook after four refusals in a row: a delivery one of this previewd's own secrets verifies
/// is accepted and ignored (202). Any other gets the one refusal every unverified delivery gets,
/// whether its repository is served or not.
async fn unserved(
    state: &ServerState,
    forge: ForgeKind,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
    repository: &str,
) -> DeliveryAnswer {
    let mut holders = secret_holders(state, forge);
    holders.truncate(MAX_SECRETS_FOR_UNSERVED);
    match verify(state, forge, headers, body, &holders).await {
        Ok(_) => DeliveryAnswer::new(
            StatusCode::ACCEPTED,
            "ignored",
            "no preview environment is made for this repository",
        ),
        // A Secret that cannot be read (503 on a served repository) answers 401 here: a
        // template whose Secret previewd may not read must not tell served repositories from
        // others.
        Err(answer) => DeliveryAnswer::not_accepted(
            "ignored",
            format!(
                "no PreviewTemplate serves repository {repository:?}, and no secret of this previewd verifies the delivery ({})",
                answer.detail.unwrap_or_default()
            ),
        ),
    }
}

/// One template of `forge` per webhook secret (namespace, Secret and key), in a fixed order:
/// the secrets a delivery of this forge may be signed with.
fn secret_holders(state: &ServerState, forge: ForgeKind) -> Vec<Arc<PreviewTemplate>> {
    let mut holders: Vec<Arc<PreviewTemplate>> = state
        .caches
        .templates
        .state()
        .into_iter()
        .filter(|t| t.spec.forge.kind == forge && t.spec.forge.webhook_secret_ref.is_some())
        .collect();
    let secret_of = |t: &PreviewTemplate| {
        let reference = t.spec.forge.webhook_secret_ref.clone().unwrap_or_default();
        (t.namespace(), reference.name, reference.key)
    };
    holders.sort_by_key(|t| (secret_of(t), t.name_any()));
    holders.dedup_by_key(|t| secret_of(t));
    holders
}

/// The templates of `forge` for `repository` (GitHub and GitLab names compare without case).
fn templates_of(
    state: &ServerState,
    forge: ForgeKind,
    repository: &str,
) -> Vec<Arc<PreviewTemplate>> {
    state
        .caches
        .templates
        .state()
        .into_iter()
        .filter(|t| {
            t.spec.forge.kind == forge && t.spec.forge.repository.eq_ignore_ascii_case(repository)
        })
        .collect()
}

/// Check 5 and the writes: a delivery id already handled changes nothing twice; one whose
/// writes failed is forgotten, so that a redelivery is handled.
async fn act_once(
    state: &ServerState,
    forge: ForgeKind,
    delivery: Option<&str>,
    event: &ForgeEvent,
    templates: &[Arc<PreviewTemplate>],
) -> DeliveryAnswer {
    let delivery_key = delivery.map(|d| format!("{}/{d}", forge.as_str()));
    if let Some(key) = &delivery_key
        && !state.deliveries.begin(key)
    {
        return DeliveryAnswer::new(
            StatusCode::OK,
            "duplicate",
            "this delivery was already handled",
        );
    }
    match act(state, event, templates).await {
        Ok(Acted { lines, .. }) if lines.is_empty() => DeliveryAnswer::new(
            StatusCode::ACCEPTED,
            "unchanged",
            "nothing to change: the environments already say this",
        ),
        Ok(Acted {
            lines: done,
            redeliver: true,
        }) => {
            // The forge shows the delivery as failed, and a redelivery is not a duplicate.
            if let Some(key) = &delivery_key {
                state.deliveries.forget(key);
            }
            tracing::Span::current().record("environments", done.join(", "));
            let mut answer =
                DeliveryAnswer::new(StatusCode::CONFLICT, "being_removed", done.join("; "));
            answer.body["environments"] = json!(done);
            answer
        }
        Ok(Acted { lines: done, .. }) => {
            tracing::Span::current().record("environments", done.join(", "));
            let mut answer = DeliveryAnswer::new(StatusCode::ACCEPTED, "accepted", done.join("; "));
            answer.body["environments"] = json!(done);
            answer
        }
        Err(e) => {
            if let Some(key) = &delivery_key {
                state.deliveries.forget(key);
            }
            // The API server's words name previewd's identity and the objects: the log's.
            let mut answer =
                DeliveryAnswer::new(StatusCode::SERVICE_UNAVAILABLE, "error", NOT_WRITTEN);
            answer.detail = Some(format!("writing the environment failed: {e}"));
            answer
        }
    }
}

/// The templates whose own webhook secret (GitHub) or token (GitLab) verifies the delivery:
/// it acts for those only. Two teams may serve one repository with two templates; one team's
/// secret must not let it close, approve or redeploy the other's environments.
///
/// None verifies: 401, or 503 if a secret could not be read from the API server (an outage,
/// not a missing Secret: the forge redelivers). A template whose secret cannot be read while
/// another's verifies misses the delivery (logged): one team's broken Secret must not hold
/// another team's deliveries.
async fn verify(
    state: &ServerState,
    forge: ForgeKind,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
    templates: &[Arc<PreviewTemplate>],
) -> Result<Vec<Arc<PreviewTemplate>>, DeliveryAnswer> {
    let mut last_error =
        String::from("no PreviewTemplate of this repository names a webhookSecretRef");
    let mut unavailable = None;
    let mut secrets = Vec::new();
    for template in templates {
        match secret_of(state, template).await {
            Ok(Some(secret)) => secrets.push((template.clone(), secret)),
            Ok(None) => {}
            Err(VerifyError::Unavailable(e)) => unavailable = Some(e),
            Err(VerifyError::Refused(e)) => last_error = e,
        }
    }
    let (verified, refused) = check_signatures(forge, headers, body, secrets).await;
    if let Some(error) = refused {
        last_error = error;
    }
    match (verified.is_empty(), unavailable) {
        (false, None) => Ok(verified),
        (false, Some(error)) => {
            tracing::warn!("a template misses this delivery: {error}");
            Ok(verified)
        }
        (true, Some(error)) => Err(DeliveryAnswer::unavailable(error)),
        (true, None) => Err(DeliveryAnswer::not_accepted("unauthorized", last_error)),
    }
}

/// Why a template did not verify a delivery.
enum VerifyError {
    /// Its secret could not be read from the API server (transient).
    Unavailable(String),
    /// Its secret is missing or does not match the signature or token.
    Refused(String),
}

/// `template`'s own webhook secret (`None`: it names none).
async fn secret_of(
    state: &ServerState,
    template: &PreviewTemplate,
) -> Result<Option<Vec<u8>>, VerifyError> {
    let Some(reference) = &template.spec.forge.webhook_secret_ref else {
        return Ok(None);
    };
    let namespace = template.namespace().unwrap_or_default();
    let secret = state
        .secrets
        .get(&namespace, reference)
        .await
        .map_err(|e| {
            let message = format!("PreviewTemplate {namespace}/{}: {e}", template.name_any());
            match e {
                SecretError::Api { .. } => VerifyError::Unavailable(message),
                _ => VerifyError::Refused(message),
            }
        })?;
    Ok(Some(secret))
}

/// Past this many bytes hashed (the body once per secret), the signatures are checked on a
/// blocking thread: an unserved delivery is checked against up to 16 secrets, 16 hashes of a
/// 2 MiB body take tens of milliseconds, and the runtime's threads serve everyone else.
const HASHED_ON_THE_RUNTIME: usize = 256 << 10;

/// The templates whose secret verifies the delivery, and why the last one that did not, did not.
async fn check_signatures(
    forge: ForgeKind,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
    secrets: Vec<(Arc<PreviewTemplate>, Vec<u8>)>,
) -> (Vec<Arc<PreviewTemplate>>, Option<String>) {
    let webhook = &forges::forge(forge).webhook;
    let signature = header(headers, webhook.signature_header).map(str::to_string);
    let hashed = match webhook.hashes_body {
        true => body.len().saturating_mul(secrets.len()),
        false => 0,
    };
    let verify = webhook.verify;
    let body = body.clone();
    let check = move || {
        let mut verified = Vec::new();
        let mut refused = None;
        for (template, secret) in secrets {
            let checked = verify(&secret, &body, signature.as_deref());
            match checked {
                Ok(()) => verified.push(template),
                Err(e) => refused = Some(e.to_string()),
            }
        }
        (verified, refused)
    };
    if hashed <= HASHED_ON_THE_RUNTIME {
        return check();
    }
    tokio::task::spawn_blocking(check)
        .await
        .unwrap_or_else(|e| {
            (
                Vec::new(),
                Some(format!("the signature check stopped: {e}")),
            )
        })
}

/// What a delivery did: one line per environment written (or not, and why).
struct Acted {
    lines: Vec<String>,
    /// A change met an environment being removed and was not written: the delivery should
    /// come again once it is gone.
    redeliver: bool,
}

impl From<Vec<String>> for Acted {
    fn from(lines: Vec<String>) -> Self {
        Self {
            lines,
            redeliver: false,
        }
    }
}

/// Decides and writes.
async fn act(
    state: &ServerState,
    event: &ForgeEvent,
    templates: &[Arc<PreviewTemplate>],
) -> Result<Acted, kube::Error> {
    let environments = state.caches.environments.state();
    let records = Records::new(&state.client, &state.writer);
    if let EventKind::Comment(comment) = &event.kind {
        let commenters = super::commands::Commenters {
            write_access: &state.write_access,
            refusals: &state.refusals,
        };
        let lines = super::commands::handle(
            records,
            commenters,
            event,
            comment,
            templates,
            &environments,
            chrono::Utc::now(),
        )
        .await;
        return lines.map(Acted::from);
    }
    if let EventKind::Check(check) = &event.kind {
        let patches = super::checks::patches(check, templates, &environments);
        let done = super::checks::record(records, &patches).await?;
        return Ok(done.into());
    }
    let decisions = intake::decide(event, templates, &environments, chrono::Utc::now());
    let written = intake::execute(records, &decisions).await?;
    let redeliver = written.contains(&Applied::BeingRemoved);
    let lines = decisions
        .iter()
        .zip(written)
        .map(|(decision, written)| match (decision, written) {
            (Decision::Apply(e), Applied::Older) => format!(
                "not applied {}/{}: it already holds a newer change (a delivery out of order)",
                e.namespace().unwrap_or_default(),
                e.name_any()
            ),
            (Decision::Apply(e), Applied::BeingRemoved) => format!(
                "not kept {}/{}: it is still being removed, and the change goes with it; deliver again once it is gone",
                e.namespace().unwrap_or_default(),
                e.name_any()
            ),
            (Decision::Apply(e), Applied::Written) => format!(
                "applied {}/{}",
                e.namespace().unwrap_or_default(),
                e.name_any()
            ),
            (Decision::Wake { namespace, name }, _) => format!("woke {namespace}/{name}"),
            (
                Decision::Delete {
                    namespace,
                    name,
                    reason,
                },
                _,
            ) => format!("deleted {namespace}/{name} ({reason})"),
        })
        .collect();
    Ok(Acted { lines, redeliver })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// 16 secrets checked against a 2 MiB body (an unserved delivery's worst case) leave the
    /// runtime's thread to the other tasks meanwhile: a ticker on the same one-thread runtime
    /// keeps ticking while they are hashed. Hashed on the runtime, it would not tick once.
    #[tokio::test(flavor = "current_thread")]
    async fn large_signature_checks_leave_the_runtime_to_others() {
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let body = axum::body::Bytes::from(vec![b'x'; 2 << 20]);
        let mut headers = HeaderMap::new();
        let signature = crate::forge::github::sign(b"secret-15", &body);
        headers.insert(
            crate::forge::github::SIGNATURE_HEADER,
            signature.parse().unwrap(),
        );
        let template = Arc::new(PreviewTemplate::new("t", Default::default()));
        let secrets = (0..16)
            .map(|n| (template.clone(), format!("secret-{n}").into_bytes()))
            .collect();
        let before = ticks.load(Ordering::SeqCst);
        let (verified, _) = check_signatures(ForgeKind::Github, &headers, &body, secrets).await;
        let during = ticks.load(Ordering::SeqCst) - before;
        ticker.abort();
        assert_eq!(
            verified.len(),
            1,
            "the one secret that signed it verifies it"
        );
        assert!(during > 0, "the ticker was held up for the whole check");
    }
}
