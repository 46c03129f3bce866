//! The gate's listener: plain HTTP/1.1 (TLS ends at the ingress controller or gateway in front
//! of it), a bounded number of connections, each with a time limit, and one answer per
//! request computed from memory. The only write is a wake, sent in the background at most once
//! per environment and [`WAKE_INTERVAL`](super::turns::WAKE_INTERVAL).

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderValue, Request, Response, header};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::runtime::reflector::Store;

use super::budget::{WakeBudget, WakeLimits, Waking};
use super::hosts::{Found, Holder, HostIndex, normalize};
use super::metrics::GateMetrics;
use super::page::{self, Answer};
use super::turns::WakeTurns;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::records;
use crate::cluster::writer::Writer;
use crate::model::clients::{ClientShares, client_address, default_trusted_proxies, is_trusted};
use crate::model::crd::PreviewEnvironment;

/// The largest request head read (hyper's smallest buffer limit); larger ones get a 431.
pub const MAX_HEAD_BYTES: usize = 8192;
/// How long a connection whose lifetime is up has to finish the answer in flight.
const GRACE: Duration = Duration::from_secs(2);

/// What one client may hold of the gate.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections open at once; beyond them a new one is closed at once (counted `busy`).
    /// Each holds hyper's buffers, at most [`MAX_HEAD_BYTES`].
    pub max_connections: usize,
    /// Connections one peer previewd does not trust as a proxy may hold of them; beyond them
    /// its next is closed at once (counted `busy_peer`). A trusted proxy (the ingress controller)
    /// carries everyone's requests and has no share of its own: behind it, a client holds a
    /// connection only while the gate answers from memory, since the proxy reads the whole
    /// head before it opens one.
    pub connections_per_peer: usize,
    /// The request head must arrive within this time.
    pub head_timeout: Duration,
    /// A connection is closed after this long, kept alive or not.
    pub connection_lifetime: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            connections_per_peer: 64,
            head_timeout: Duration::from_secs(5),
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// Wakes an environment, as the gate `seen` it; the cluster's record in previewd, a recording
/// in tests.
pub trait Waker: Send + Sync + 'static {
    fn wake<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        seen: &'a records::Seen<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<Woke, String>> + Send + 'a>>;
}

/// What a wake the API server answered came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The environment's record says it is awake.
    Written,
    /// The environment was removed before the wake reached it: nothing was woken.
    Gone,
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
        seen: &'a records::Seen<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<Woke, String>> + Send + 'a>> {
        Box::pin(async move {
            let now = chrono::Utc::now();
            let records = records::Records::new(&self.client, &self.writer);
            match records.wake_for_request(namespace, name, seen, now).await {
                Ok(true) => Ok(Woke::Written),
                Ok(false) => Ok(Woke::Gone),
                Err(error) => Err(error.to_string()),
            }
        })
    }
}

/// Who may wake how much (`--gate-wakes-per-client`, `--gate-wakes-in-all`,
/// `--gate-wake-window`) and whose word on the client's address counts
/// (`--gate-trusted-proxies`).
#[derive(Clone, Debug)]
pub struct Clients {
    pub wakes: WakeLimits,
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl Default for Clients {
    fn default() -> Self {
        Self {
            wakes: WakeLimits::default(),
            trusted_proxies: default_trusted_proxies(),
        }
    }
}

/// The gate: which environment holds which host, whose turn it is to be woken, who may still
/// wake one, and how.
pub struct Gate {
    index: HostIndex,
    turns: WakeTurns,
    budget: WakeBudget,
    trusted_proxies: Vec<ipnet::IpNet>,
    waker: Arc<dyn Waker>,
    metrics: GateMetrics,
}

impl Gate {
    pub fn new(
        environments: Store<PreviewEnvironment>,
        waker: Arc<dyn Waker>,
        metrics: GateMetrics,
        clients: Clients,
    ) -> Arc<Self> {
        Arc::new(Self {
            index: HostIndex::new(environments),
            turns: WakeTurns::default(),
            budget: WakeBudget::new(clients.wakes),
            trusted_proxies: clients.trusted_proxies,
            waker,
            metrics,
        })
    }

    /// The answer to a request from `client` (asked only when a wake is due: most requests
    /// need not know) that names `authority` (its `Host`) and asks for HTML or not. A sleeping
    /// environment's host wakes it, in the background, only on its turn and within the
    /// client's and everyone's wake budget.
    pub fn answer(
        self: &Arc<Self>,
        authority: Option<&str>,
        wants_html: bool,
        client: impl FnOnce() -> IpAddr,
    ) -> Answer {
        let found = authority
            .and_then(normalize)
            .and_then(|host| self.index.holder(&host));
        let Some(Found {
            holder,
            teams_asleep,
        }) = found
        else {
            self.metrics.answered("unknown");
            return page::unknown();
        };
        let now = Instant::now();
        let turn = holder.asleep
            && self
                .turns
                .take(&holder.namespace, &holder.name, holder.generation, now);
        if !turn {
            self.metrics.answered("waiting");
            return page::waiting(&holder, wants_html);
        }
        let client = client();
        let waking = Waking {
            client,
            team: &holder.team,
            teams_asleep,
        };
        if let Err(over) = self.budget.spend(waking, now) {
            // Not this client's wake to cause: the environment's turn stays for another.
            self.turns.give_back(&holder.namespace, &holder.name);
            self.metrics.over_budget(over);
            return page::over_budget(wants_html);
        }
        self.wake_in_background(&holder, client, now);
        self.metrics.answered("woke");
        page::waiting(&holder, wants_html)
    }

    fn wake_in_background(self: &Arc<Self>, holder: &Holder, client: IpAddr, spent_at: Instant) {
        let gate = self.clone();
        let (namespace, name) = (holder.namespace.clone(), holder.name.clone());
        let (head, version) = (holder.head.clone(), holder.resource_version.clone());
        let team = holder.team.clone();
        tokio::spawn(async move {
            let seen = records::Seen {
                head: &head,
                resource_version: &version,
            };
            match gate.waker.wake(&namespace, &name, &seen).await {
                Ok(Woke::Written) => {
                    gate.metrics
                        .wake_seconds
                        .observe(spent_at.elapsed().as_secs_f64());
                    tracing::info!(environment = %name, %namespace, "a request wakes the environment")
                }
                Ok(Woke::Gone) => {
                    tracing::debug!(environment = %name, %namespace, "the environment was removed before the gate's wake reached it");
                    // Nothing was woken: neither a wake to time nor one the client spent. The
                    // turn is kept a moment (as after a failure), so that requests to the host
                    // before the cache drops it do not each send a wake that finds nothing.
                    gate.turns.failed(&namespace, &name, Instant::now());
                    gate.budget.give_back(client, &team, spent_at);
                }
                Err(error) => {
                    tracing::warn!(environment = %name, %namespace, %error, "could not wake the environment; a request in a few seconds tries again");
                    gate.turns.failed(&namespace, &name, Instant::now());
                    // A wake that was not written costs the client nothing.
                    gate.budget.give_back(client, &team, spent_at);
                }
            }
        });
    }

    fn respond<B>(self: &Arc<Self>, request: &Request<B>, peer: IpAddr) -> Response<Body> {
        // An absolute request target's authority wins over `Host` (RFC 9112, 3.2.2).
        let authority = request.uri().authority().map(|a| a.as_str()).or_else(|| {
            let host = request.headers().get(header::HOST)?;
            host.to_str().ok()
        });
        let wants_html = request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|accept| accept.to_str().ok())
            .any(|accept| accept.contains("text/html"));
        let client = || client_address(peer, request.headers(), &self.trusted_proxies);
        into_response(self.answer(authority, wants_html, client))
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
    serve_within(gate, listener, Bounds::default(), shutdown).await
}

/// [`serve`] within `bounds`.
pub async fn serve_within(
    gate: Arc<Gate>,
    listener: tokio::net::TcpListener,
    bounds: Bounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let address = listener.local_addr().ok();
    tracing::info!(?address, "wake gate listening");
    let connections = Arc::new(tokio::sync::Semaphore::new(bounds.max_connections));
    let peer_shares = ClientShares::new(bounds.connections_per_peer);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip()),
            Err(error) => {
                // Out of file descriptors, mostly: wait a little rather than spin.
                tracing::warn!(%error, "the wake gate could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer_share = if is_trusted(peer, &gate.trusted_proxies) {
            None
        } else {
            let Some(share) = peer_shares.try_take(peer) else {
                gate.metrics.answered("busy_peer");
                continue;
            };
            Some(share)
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            gate.metrics.answered("busy");
            continue;
        };
        let gate = gate.clone();
        tokio::spawn(async move {
            let _held = (permit, peer_share);
            let service = service_fn(move |request| {
                let response = gate.respond(&request, peer);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(bounds.head_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            if tokio::time::timeout(bounds.connection_lifetime, connection.as_mut())
                .await
                .is_err()
            {
                // Its time is up: the answer in flight is finished and the connection closed
                // (not cut mid-answer, which a proxy in front would turn into a 502).
                connection.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(GRACE, connection).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts wakes; wakes nothing.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Waker for Counting {
        fn wake<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: &'a records::Seen<'a>,
        ) -> Pin<Box<dyn Future<Output = Result<Woke, String>> + Send + 'a>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Woke::Written) })
        }
    }

    /// A gate over an empty cache (every host unknown), within `bounds`.
    async fn gate_within(bounds: Bounds) -> (std::net::SocketAddr, Arc<Counting>, GateMetrics) {
        gate_for(bounds, Clients::default()).await
    }

    /// [`gate_within`], with `clients`' trusted proxies.
    async fn gate_for(
        bounds: Bounds,
        clients: Clients,
    ) -> (std::net::SocketAddr, Arc<Counting>, GateMetrics) {
        let (store, _writer) = kube::runtime::reflector::store::<PreviewEnvironment>();
        let waker = Arc::new(Counting::default());
        let metrics = GateMetrics::new();
        let gate = Gate::new(store, waker.clone(), metrics.clone(), clients);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve_within(gate, listener, bounds, std::future::pending()));
        (address, waker, metrics)
    }

    /// Reads what the gate sends until it closes the connection, or `None` after `wait`.
    async fn read_until_closed(
        stream: &mut tokio::net::TcpStream,
        wait: Duration,
    ) -> Option<String> {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(wait, stream.read_to_end(&mut answer)).await;
        read.ok()
            .map(|_| String::from_utf8_lossy(&answer).to_string())
    }

    #[tokio::test]
    async fn an_unknown_host_gets_a_404_and_wakes_nothing() {
        let (address, waker, metrics) = gate_within(Bounds::default()).await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request =
            "GET / HTTP/1.1\r\nHost: nobody.preview.example.com\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
        assert!(
            !answer.contains("nobody"),
            "the host is not echoed: {answer}"
        );
        assert_eq!(waker.0.load(Ordering::SeqCst), 0);
        assert_eq!(metrics.requests.with_label_values(&["unknown"]).get(), 1);
    }

    #[tokio::test]
    async fn connections_beyond_the_bound_are_closed_at_once() {
        let bounds = Bounds {
            max_connections: 2,
            ..Bounds::default()
        };
        let (address, _, metrics) = gate_within(bounds).await;
        let _held: Vec<tokio::net::TcpStream> = vec![
            tokio::net::TcpStream::connect(address).await.unwrap(),
            tokio::net::TcpStream::connect(address).await.unwrap(),
        ];
        let mut third = tokio::net::TcpStream::connect(address).await.unwrap();
        let closed = read_until_closed(&mut third, Duration::from_secs(2)).await;
        assert_eq!(closed.as_deref(), Some(""), "closed without an answer");
        assert_eq!(metrics.requests.with_label_values(&["busy"]).get(), 1);
    }

    /// Connects to `address` from `local` (any of 127.0.0.0/8 on Linux's loopback).
    #[cfg(target_os = "linux")]
    async fn connect_from(local: [u8; 4], address: std::net::SocketAddr) -> tokio::net::TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind((std::net::Ipv4Addr::from(local), 0).into())
            .unwrap();
        socket.connect(address).await.unwrap()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_peer_holds_its_share_of_the_connections_and_a_trusted_proxy_more() {
        let bounds = Bounds {
            max_connections: 10,
            connections_per_peer: 2,
            ..Bounds::default()
        };
        // Straight from the internet: nobody is trusted to speak for others.
        let direct = Clients {
            trusted_proxies: Vec::new(),
            ..Clients::default()
        };
        let (address, _, metrics) = gate_for(bounds, direct).await;
        let _held = [
            connect_from([127, 0, 0, 2], address).await,
            connect_from([127, 0, 0, 2], address).await,
        ];
        let mut third = connect_from([127, 0, 0, 2], address).await;
        let closed = read_until_closed(&mut third, Duration::from_secs(2)).await;
        assert_eq!(closed.as_deref(), Some(""), "closed without an answer");
        assert_eq!(metrics.requests.with_label_values(&["busy_peer"]).get(), 1);
        let mut other = connect_from([127, 0, 0, 3], address).await;
        other
            .write_all(b"GET / HTTP/1.1\r\nHost: x.example.com\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(&mut other, Duration::from_secs(2)).await;
        assert!(
            answer.unwrap_or_default().starts_with("HTTP/1.1 404"),
            "another peer is served"
        );

        // The ingress controller (trusted, loopback by default) carries everyone's requests.
        let (address, _, metrics) = gate_for(bounds, Clients::default()).await;
        let mut proxied = Vec::new();
        for _ in 0..3 {
            proxied.push(connect_from([127, 0, 0, 2], address).await);
        }
        let last = proxied.last_mut().unwrap();
        last.write_all(b"GET / HTTP/1.1\r\nHost: x.example.com\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_closed(last, Duration::from_secs(2)).await;
        assert!(
            answer.unwrap_or_default().starts_with("HTTP/1.1 404"),
            "served"
        );
        assert_eq!(metrics.requests.with_label_values(&["busy_peer"]).get(), 0);
    }

    #[tokio::test]
    async fn a_client_that_sends_no_head_is_cut_off_and_one_that_stays_is_too() {
        let bounds = Bounds {
            head_timeout: Duration::from_millis(300),
            connection_lifetime: Duration::from_secs(1),
            ..Bounds::default()
        };
        let (address, _, _) = gate_within(bounds).await;
        let mut silent = tokio::net::TcpStream::connect(address).await.unwrap();
        assert!(
            read_until_closed(&mut silent, Duration::from_secs(3))
                .await
                .is_some(),
            "a connection without a request head is closed"
        );
        // A slow head, a byte at a time: the lifetime ends it even if each byte comes in time.
        let mut trickle = tokio::net::TcpStream::connect(address).await.unwrap();
        let started = Instant::now();
        for byte in b"GET / HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain(b"a".repeat(100).iter())
        {
            if trickle.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "cut off while trickling"
        );
    }

    /// A client that keeps its connection busy with one quick request after another (each head
    /// well within its time) is still cut off when the connection's lifetime is up, after the
    /// answer in flight. Without the lifetime it would hold its connection for ever.
    #[tokio::test]
    async fn a_connection_kept_busy_is_closed_when_its_lifetime_is_up() {
        let bounds = Bounds {
            head_timeout: Duration::from_secs(30),
            connection_lifetime: Duration::from_secs(1),
            ..Bounds::default()
        };
        let (address, _, metrics) = gate_within(bounds).await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let started = Instant::now();
        let request = "GET / HTTP/1.1\r\nHost: nobody.example.com\r\n\r\n";
        let mut buffer = vec![0u8; 4096];
        let closed_after = loop {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still open after 10 s"
            );
            if stream.write_all(request.as_bytes()).await.is_err() {
                break started.elapsed();
            }
            match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break started.elapsed(),
                Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(_) => panic!("no answer within 5 s"),
            }
        };
        assert!(
            closed_after >= Duration::from_millis(900),
            "closed at {closed_after:?}, before its lifetime"
        );
        let answered = metrics.requests.with_label_values(&["unknown"]).get();
        assert!(answered >= 5, "answered {answered} requests on it before");
    }

    #[tokio::test]
    async fn an_oversized_head_is_refused() {
        let (address, _, _) = gate_within(Bounds::default()).await;
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let huge = format!(
            "GET / HTTP/1.1\r\nHost: a.example.com\r\nX-Big: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES * 2)
        );
        let _ = stream.write_all(huge.as_bytes()).await;
        let answer = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .expect("the connection is closed, not left hanging");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
    }
}
