//! The gate's listener: plain HTTP/1.1 (TLS ends at the ingress controller or gateway in front
//! of it), a bounded number of connections, each with a time limit, and one answer per
//! request computed from memory. The only write is a wake, sent in the background at most once
//! per environment and [`WAKE_INTERVAL`](super::turns::WAKE_INTERVAL).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderValue, Request, Response, header};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::runtime::reflector::Store;

use super::hosts::{Holder, HostIndex, normalize};
use super::metrics::GateMetrics;
use super::page::{self, Answer};
use super::turns::WakeTurns;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::records;
use crate::cluster::writer::Writer;
use crate::model::crd::PreviewEnvironment;

/// Connections open at once; beyond them a new one is closed at once (and counted `busy`).
/// Each holds hyper's buffers, at most [`MAX_HEAD_BYTES`].
pub const MAX_CONNECTIONS: usize = 1024;
/// The request head must arrive within this time.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection is closed after this long, kept alive or not.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// The largest request head read (hyper's smallest buffer limit); larger ones get a 431.
pub const MAX_HEAD_BYTES: usize = 8192;

/// Wakes an environment; the cluster's record in previewd, a recording in tests.
pub trait Waker: Send + Sync + 'static {
    fn wake<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// Wakes environments by writing their record (`spec.sleep: false` and the activity), through
/// previewd's writer (a timeout, counted as `gate_wake`).
pub struct ClusterWaker {
    client: kube::Client,
    writer: Writer,
}

impl ClusterWaker {
    pub fn new(client: kube::Client, writes: ClusterMetrics) -> Self {
        Self {
            client,
            writer: Writer::new(writes),
        }
    }
}

impl Waker for ClusterWaker {
    fn wake<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let now = chrono::Utc::now();
            let request = records::wake_for_request(&self.client, namespace, name, now);
            match self.writer.write("gate_wake", request).await {
                Ok(_) => Ok(()),
                Err(error) => Err(error.to_string()),
            }
        })
    }
}

/// The gate: which environment holds which host, whose turn it is to be woken, and how.
pub struct Gate {
    index: HostIndex,
    turns: WakeTurns,
    waker: Arc<dyn Waker>,
    metrics: GateMetrics,
}

impl Gate {
    pub fn new(
        environments: Store<PreviewEnvironment>,
        waker: Arc<dyn Waker>,
        metrics: GateMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            index: HostIndex::new(environments),
            turns: WakeTurns::default(),
            waker,
            metrics,
        })
    }

    /// The answer to a request that names `authority` (its `Host`) and asks for HTML or not.
    /// A sleeping environment's host wakes it, in the background and only on its turn.
    pub fn answer(self: &Arc<Self>, authority: Option<&str>, wants_html: bool) -> Answer {
        let holder = authority
            .and_then(normalize)
            .and_then(|host| self.index.holder(&host));
        let Some(holder) = holder else {
            self.metrics.answered("unknown");
            return page::unknown();
        };
        let woke = holder.asleep
            && self
                .turns
                .take(&holder.namespace, &holder.name, Instant::now());
        if woke {
            self.wake_in_background(&holder);
        }
        self.metrics.answered(if woke { "woke" } else { "waiting" });
        page::waiting(&holder, wants_html)
    }

    fn wake_in_background(self: &Arc<Self>, holder: &Holder) {
        let gate = self.clone();
        let (namespace, name) = (holder.namespace.clone(), holder.name.clone());
        tokio::spawn(async move {
            match gate.waker.wake(&namespace, &name).await {
                Ok(()) => {
                    tracing::info!(environment = %name, %namespace, "a request wakes the environment")
                }
                Err(error) => {
                    tracing::warn!(environment = %name, %namespace, %error, "could not wake the environment; the next request tries again");
                    gate.turns.give_back(&namespace, &name);
                }
            }
        });
    }

    fn respond<B>(self: &Arc<Self>, request: &Request<B>) -> Response<Body> {
        let authority = request
            .headers()
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()));
        let wants_html = request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|accept| accept.to_str().ok())
            .any(|accept| accept.contains("text/html"));
        into_response(self.answer(authority, wants_html))
    }
}

fn into_response(answer: Answer) -> Response<Body> {
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = answer.status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(answer.content_type),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = answer.retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Serves until `shutdown` completes; then stops accepting (answers are computed from memory,
/// so nothing in flight needs waiting for).
pub async fn serve(
    gate: Arc<Gate>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let address = listener.local_addr().ok();
    tracing::info!(?address, "wake gate listening");
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, mostly: wait a little rather than spin.
                tracing::warn!(%error, "the wake gate could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            gate.metrics.answered("busy");
            continue;
        };
        let gate = gate.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request| {
                let response = gate.respond(&request);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
        });
    }
}
