//! Building Kubernetes clients: `previewd run` (from a kubeconfig or in the cluster), the
//! sandbox and the tests all connect the same way.
//!
//! Every client has a bound on the requests it has in flight ([`limited`]). kube's client speaks
//! HTTP/1.1, one request per connection at a time: without a bound, each request that finds no
//! idle connection opens a new TLS connection, and idle ones are kept for 90 s. While 400
//! environments were being created previewd held 1,135 connections to the API server, which was
//! most of previewd's memory and a cost to an API server that other teams share. A bounded
//! client queues the rest, in order, on a few dozen connections.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower::retry::RetryLayer;

/// Requests one client has in flight at once unless `--api-concurrency` says otherwise. A watch
/// counts only until its answer starts; its stream then no longer holds a place.
pub const DEFAULT_API_CONCURRENCY: usize = 32;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("no Kubernetes configuration found: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
}

/// The connection settings of the current context of `kubeconfig`.
pub async fn config_from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Config, ClientError> {
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(ClientError::Kubeconfig)
}

/// The in-cluster configuration, else the default kubeconfig.
pub async fn inferred_config() -> Result<kube::Config, ClientError> {
    kube::Config::infer().await.map_err(ClientError::Infer)
}

/// A client for the current context of `kubeconfig`, with the default bound.
pub async fn from_kubeconfig(kubeconfig: Kubeconfig) -> Result<kube::Client, ClientError> {
    limited(
        config_from_kubeconfig(kubeconfig).await?,
        DEFAULT_API_CONCURRENCY,
    )
}

/// A client with at most `in_flight` requests waiting for their answer at once (at least 1);
/// the others wait their turn in order.
///
/// The stack is kube's own (`ClientBuilder::try_from`: base URI, credentials, extra headers,
/// timeouts, retries of 429 and 5xx answers) over a connector that sets `TCP_NODELAY`, which
/// kube's does not. Without it, the first request on a new TLS connection is held back by
/// Nagle's algorithm until the API server acknowledges the handshake's last flight, and Linux
/// delays that acknowledgement by 40 ms: the wake gate's write on a connection opened for it
/// took 45 to 54 ms against 6 to 20 ms with `TCP_NODELAY` (docs/performance.md, "The wake
/// gate"). kube's builder also notes when an exec plugin's client certificate expires
/// (`Client::valid_until`); previewd never reads it, so this stack leaves it out.
pub fn limited(config: kube::Config, in_flight: usize) -> Result<kube::Client, ClientError> {
    // kube's builder refuses a proxy its features cannot speak (previewd builds it with none);
    // this one must not connect past it silently either.
    if let Some(proxy) = &config.proxy_url {
        return Err(ClientError::Client(kube::Error::ProxyProtocolDisabled {
            proxy_url: Box::new(proxy.clone()),
            protocol_feature: "kube/http-proxy",
        }));
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = config
        .rustls_https_connector_with_connector(tcp)
        .map_err(ClientError::Client)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(in_flight.max(1)))
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer().map_err(ClientError::Client)?)
        .layer(config.extra_headers_layer().map_err(ClientError::Client)?)
        .map_request(log_request)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
}

/// Each request's method and URL at debug level, as kube's own stack logs them (its
/// `TraceLayer`): what `RUST_LOG=debug` shows of previewd's API traffic. Never a header: the
/// credentials travel there.
fn log_request<B>(request: http::Request<B>) -> http::Request<B> {
    tracing::debug!(http.method = %request.method(), http.url = %request.uri(), "requesting");
    request
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{mpsc, oneshot};

    use super::*;

    /// A request the stand-in API server has read: its path, and what lets it be answered.
    type Arrival = (String, oneshot::Sender<()>);
    /// What happened, in order: the server's arrivals and the test's releases.
    type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    /// A stand-in API server on loopback that answers no request until the test says so: each
    /// request it reads is announced, in the order read, with the sender that releases it.
    /// The limit is `limited`'s own layer inside kube's client, so it is driven through HTTP
    /// rather than a tower stand-in (the layer is not built by a function of its own).
    async fn holding_api_server(log: Log) -> (SocketAddr, mpsc::UnboundedReceiver<Arrival>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (arrived, arrivals) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_held(stream, arrived.clone(), log.clone()));
            }
        });
        (address, arrivals)
    }

    /// Serves one connection: HTTP/1.1 GETs (no body), one at a time, kept alive, each
    /// answered `200 {}` once released.
    async fn serve_held(stream: TcpStream, arrived: mpsc::UnboundedSender<Arrival>, log: Log) {
        let mut stream = BufReader::new(stream);
        loop {
            let mut request_line = String::new();
            match stream.read_line(&mut request_line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            loop {
                let mut header = String::new();
                match stream.read_line(&mut header).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) if header == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let path = request_line.split(' ').nth(1).unwrap_or_default();
            log.lock().unwrap().push(format!("arrived {path}"));
            let (release, released) = oneshot::channel();
            if arrived.send((path.to_string(), release)).is_err() || released.await.is_err() {
                return;
            }
            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-length: 2\r\n\r\n{}";
            if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// The next request the server reads.
    async fn next_arrival(arrivals: &mut mpsc::UnboundedReceiver<Arrival>) -> Arrival {
        tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
            .await
            .ok()
            .flatten()
            .expect("a request reaches the server")
    }

    /// Whether each of this process's TCP connections to `server` has `TCP_NODELAY` set (read
    /// with getsockopt on the sockets of /proc/self/fd whose peer is `server`).
    fn nodelay_of_connections_to(server: SocketAddr) -> Vec<bool> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
            let name = entry.unwrap().file_name();
            let Ok(fd) = name.to_string_lossy().parse::<libc::c_int>() else {
                continue;
            };
            // SAFETY: both calls only write into the local buffers given with their lengths;
            // an fd that is no socket (or was closed meanwhile) makes them fail, nothing more.
            let mut peer: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let named = unsafe {
                libc::getpeername(fd, (&raw mut peer).cast::<libc::sockaddr>(), &mut length)
            };
            let is_server = named == 0
                && i32::from(peer.sin_family) == libc::AF_INET
                && u16::from_be(peer.sin_port) == server.port();
            if !is_server {
                continue;
            }
            let mut value: libc::c_int = 0;
            let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let read = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&raw mut value).cast::<libc::c_void>(),
                    &mut size,
                )
            };
            assert_eq!(read, 0, "getsockopt(TCP_NODELAY) on fd {fd}");
            found.push(value != 0);
        }
        found
    }

    #[tokio::test]
    async fn connections_to_the_api_server_send_at_once() {
        // Nagle's algorithm would hold the first request on a new TLS connection until the
        // server acknowledges the handshake, 40 ms later on Linux (docs/performance.md).
        crate::install_crypto_provider();
        let (address, mut arrivals) = holding_api_server(Log::default()).await;
        let config = kube::Config::new(format!("http://{address}").parse().unwrap());
        let client = limited(config, 2).unwrap();
        let asked = tokio::spawn(async move {
            let request = http::Request::get("/api").body(Vec::new()).unwrap();
            client.request_text(request).await
        });
        let (_, release) = next_arrival(&mut arrivals).await;
        assert_eq!(nodelay_of_connections_to(address), [true]);
        release.send(()).unwrap();
        assert_eq!(asked.await.unwrap().unwrap(), "{}");
    }

    #[test]
    fn a_kubeconfig_naming_a_proxy_is_refused_not_bypassed() {
        crate::install_crypto_provider();
        let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.internal:3128".parse().unwrap());
        let refused = limited(config, 2).err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("proxy.internal")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn a_request_past_the_limit_waits_for_one_to_finish_and_waiters_go_in_arrival_order() {
        // docs/security.md: "at most `--api-concurrency` API requests in flight, queued in
        // order of arrival". Two places, four requests: the third and fourth reach the server
        // only after a request before them was answered, the third (asked first) first. The
        // log of arrivals and releases shows it; no wait for something not to happen.
        crate::install_crypto_provider();
        let log = Log::default();
        let (address, mut arrivals) = holding_api_server(log.clone()).await;
        let config = kube::Config::new(format!("http://{address}").parse().unwrap());
        let client = limited(config, 2).unwrap();
        let get = |path: &'static str| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = http::Request::get(path).body(Vec::new()).unwrap();
                client.request_text(request).await
            })
        };
        let release = |(path, answer): Arrival| {
            log.lock().unwrap().push(format!("released {path}"));
            answer.send(()).unwrap();
        };

        let first = get("/first");
        let held_first = next_arrival(&mut arrivals).await;
        let second = get("/second");
        let held_second = next_arrival(&mut arrivals).await;
        let third = get("/third");
        // The third is queued before the fourth is asked for: that is their arrival order.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let fourth = get("/fourth");
        // Without the limit both would arrive now, before any release is logged.
        tokio::time::sleep(Duration::from_millis(50)).await;
        release(held_first);
        let held_third = next_arrival(&mut arrivals).await;
        release(held_second);
        let held_fourth = next_arrival(&mut arrivals).await;
        release(held_third);
        release(held_fourth);
        for request in [first, second, third, fourth] {
            assert_eq!(request.await.unwrap().unwrap(), "{}");
        }
        let order = [
            "arrived /first",
            "arrived /second",
            "released /first",
            "arrived /third",
            "released /second",
            "arrived /fourth",
            "released /third",
            "released /fourth",
        ];
        assert_eq!(*log.lock().unwrap(), order);
    }
}
