//! The sandbox's ingress controller: the part of one that previewd's wake gate meets.
//!
//! A cluster's ingress controller routes a host by the Ingress rules it finds, an exact host
//! before a wildcard, and the operator's wildcard route for the URL domain sends every host
//! that nothing else routes to previewd's wake gate. This one does the same with the sandbox's
//! real Ingress objects (read from the API server at each request) and sends a host no Ingress
//! routes to the gate previewd runs in the sandbox. There are no containers in the sandbox (see
//! `node_simulator`), so for a host an Ingress routes it answers on the app's behalf: 200 when
//! the backend Service has a ready endpoint, 503 when it has none, as ingress-nginx answers a
//! Service without endpoints.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::SandboxError;

struct Routing {
    client: kube::Client,
    gate: SocketAddr,
    http: reqwest::Client,
}

/// The running ingress; it stops when dropped.
pub struct SandboxIngress {
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SandboxIngress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SandboxIngress {
    /// Listens on a free loopback port; hosts no Ingress routes go to `gate`.
    pub async fn start(client: kube::Client, gate: SocketAddr) -> Result<Self, SandboxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SandboxError::Process(format!("the sandbox ingress: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| SandboxError::Process(format!("the sandbox ingress: {e}")))?;
        let routing = Arc::new(Routing {
            client,
            gate,
            http: reqwest::Client::new(),
        });
        let router = Router::new().fallback(route).with_state(routing);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { address, task })
    }
}

/// Which Service an Ingress rule sends `host` and `path` to.
#[derive(Debug, PartialEq)]
struct Backend {
    namespace: String,
    service: String,
}

async fn route(State(routing): State<Arc<Routing>>, request: Request) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.split(':').next().unwrap_or_default().to_ascii_lowercase())
        .unwrap_or_default();
    let path = request.uri().path().to_string();
    let ingresses = match Api::<Ingress>::all(routing.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            return (StatusCode::BAD_GATEWAY, format!("sandbox ingress: {e}\n")).into_response();
        }
    };
    match backend_for(&ingresses, &host, &path) {
        Some(backend) => app(&routing, &backend).await,
        None => to_gate(&routing, request).await,
    }
}

/// The backend of the most specific rule for `host`: an exact host before a `*.` wildcard, the
/// longest path prefix within it.
fn backend_for(ingresses: &[Ingress], host: &str, path: &str) -> Option<Backend> {
    let mut best: Option<(bool, usize, Backend)> = None;
    for ingress in ingresses {
        let namespace = ingress.metadata.namespace.clone().unwrap_or_default();
        let rules = ingress.spec.as_ref().and_then(|s| s.rules.as_ref());
        for rule in rules.into_iter().flatten() {
            let pattern = rule
                .host
                .as_deref()
                .unwrap_or_default()
                .to_ascii_lowercase();
            let exact = pattern == host;
            let wildcard = pattern.strip_prefix("*.").is_some_and(|domain| {
                host.split_once('.')
                    .is_some_and(|(label, rest)| !label.is_empty() && rest == domain)
            });
            if !exact && !wildcard {
                continue;
            }
            let paths = rule
                .http
                .as_ref()
                .map(|h| h.paths.as_slice())
                .unwrap_or_default();
            for candidate in paths {
                let prefix = candidate.path.as_deref().unwrap_or("/");
                let Some(service) = candidate.backend.service.as_ref() else {
                    continue;
                };
                if !path.starts_with(prefix) {
                    continue;
                }
                let better = match &best {
                    None => true,
                    Some((best_exact, best_length, _)) => {
                        (exact, prefix.len()) > (*best_exact, *best_length)
                    }
                };
                if better {
                    let backend = Backend {
                        namespace: namespace.clone(),
                        service: service.name.clone(),
                    };
                    best = Some((exact, prefix.len(), backend));
                }
            }
        }
    }
    best.map(|(_, _, backend)| backend)
}

/// The app's answer, given for its pods: whether its Service has a ready endpoint.
async fn app(routing: &Routing, backend: &Backend) -> Response {
    let gvk = GroupVersionKind::gvk("", "v1", "Endpoints");
    let endpoints: Api<DynamicObject> = Api::namespaced_with(
        routing.client.clone(),
        &backend.namespace,
        &ApiResource::from_gvk(&gvk),
    );
    let ready = match endpoints.get_opt(&backend.service).await {
        Ok(Some(found)) => found.data["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|subset| subset["addresses"].as_array())
            .map(Vec::len)
            .sum(),
        Ok(None) => 0,
        Err(e) => {
            return (StatusCode::BAD_GATEWAY, format!("sandbox ingress: {e}\n")).into_response();
        }
    };
    let service = format!("{}/{}", backend.namespace, backend.service);
    if ready == 0 {
        let said = format!("sandbox ingress: Service {service} has no ready endpoint\n");
        return (StatusCode::SERVICE_UNAVAILABLE, said).into_response();
    }
    let said = format!(
        "sandbox app: Service {service}, {ready} ready endpoint(s) (the sandbox runs no containers; a cluster's ingress controller would pass this request to one of them)\n"
    );
    (StatusCode::OK, said).into_response()
}

/// Passes the request to previewd's wake gate, as the wildcard route would.
async fn to_gate(routing: &Routing, request: Request) -> Response {
    let url = format!("http://{}{}", routing.gate, request.uri().path());
    let mut forwarded = routing.http.get(url);
    for name in [header::HOST, header::ACCEPT] {
        if let Some(value) = request.headers().get(&name) {
            forwarded = forwarded.header(name, value);
        }
    }
    let answer = match forwarded.send().await {
        Ok(answer) => answer,
        Err(e) => {
            return (
                StatusCode::BAD_GATEWAY,
                format!("sandbox ingress: the gate: {e}\n"),
            )
                .into_response();
        }
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for name in [
        header::CONTENT_TYPE,
        header::RETRY_AFTER,
        header::CACHE_CONTROL,
    ] {
        if let Some(value) = answer.headers().get(&name) {
            response = response.header(name, value);
        }
    }
    let body = answer.bytes().await.unwrap_or_default();
    response
        .body(axum::body::Body::from(body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress(namespace: &str, host: &str, paths: &[(&str, &str)]) -> Ingress {
        let paths: Vec<serde_json::Value> = paths
            .iter()
            .map(|(path, service)| {
                serde_json::json!({"path": path, "pathType": "Prefix",
                "backend": {"service": {"name": service, "port": {"number": 80}}}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"rules": [{"host": host, "http": {"paths": paths}}]}
        }))
        .unwrap()
    }

    #[test]
    fn an_exact_host_wins_over_a_wildcard_and_the_longest_path_within_it() {
        let ingresses = [
            ingress("previewd", "*.preview.example.com", &[("/", "gate")]),
            ingress(
                "env-a",
                "a.preview.example.com",
                &[("/", "web"), ("/api", "api")],
            ),
        ];
        let backend = |host, path| {
            backend_for(&ingresses, host, path).map(|b| format!("{}/{}", b.namespace, b.service))
        };
        assert_eq!(
            backend("a.preview.example.com", "/"),
            Some("env-a/web".into())
        );
        assert_eq!(
            backend("a.preview.example.com", "/api/x"),
            Some("env-a/api".into())
        );
        assert_eq!(
            backend("b.preview.example.com", "/"),
            Some("previewd/gate".into())
        );
        assert_eq!(backend("x.b.preview.example.com", "/"), None);
        assert_eq!(backend("example.org", "/"), None);
    }
}
