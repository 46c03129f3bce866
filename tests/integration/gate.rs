//! The wake gate against a real kube-apiserver: a sleeping environment's routes are withdrawn,
//! a request with its host gets the waiting page and wakes it (once, however many requests
//! come), its routes come back once it is Ready, and a host no environment holds gets a 404
//! without a wake. Through an Ingress and through a Gateway API HTTPRoute (the test plays the
//! Gateway). No push, no comment: only HTTP requests to the gate.

use crate::reconcile::{crd_in, install_crds};
use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use previewd::gate::server::{ClusterWaker, Waker, Woke};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use serde_json::{Value, json};
use support::{eventually, in_namespace, wait_for_phase};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATEWAY_API: &str = "gateway.networking.k8s.io";

/// A Deployment and its Service, and `route` (an Ingress or HTTPRoute for `{{ host }}`).
fn app(route: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: web, image: registry.example/web:1}}]\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {{app: web}}\n  ports: [{{port: 80}}]\n---\n{route}"
    )
}

const INGRESS: &str = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\nspec:\n  rules:\n    - host: \"{{ host }}\"\n      http:\n        paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]\n";

const HTTP_ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: web\nspec:\n  parentRefs: [{name: previews, namespace: gateway-system}]\n  hostnames: [\"{{ host }}\"]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n";

/// The cluster's waker, counting the wakes it sends.
struct CountingWaker {
    inner: ClusterWaker,
    wakes: AtomicUsize,
}

impl Waker for CountingWaker {
    fn wake<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        seen: &'a previewd::cluster::records::Seen<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Woke, String>> + Send + 'a>>
    {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.inner.wake(namespace, name, seen)
    }
}

/// A raw HTTP/1.1 GET with `host`: status, headers (lower-case names) and body.
async fn get(
    gate: std::net::SocketAddr,
    host: &str,
    accept: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = tokio::net::TcpStream::connect(gate).await.unwrap();
    let request = format!(
        "GET /cart?x=%3Cb%3Eecho HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\nX-Echo: <b>echo</b>\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// previewd's controller with the gate answering (`--gate-listen`), the gate itself on a
/// loopback port, and the waker it wakes with.
async fn controller_and_gate(
    client: &Client,
    namespace: &str,
    extra_kinds: &[Value],
) -> (support::Running, std::net::SocketAddr, Arc<CountingWaker>) {
    let running = support::gate::controller(client, namespace, extra_kinds).await;
    let waker = Arc::new(CountingWaker {
        inner: ClusterWaker::new(client.clone(), running.metrics.cluster.clone()),
        wakes: AtomicUsize::new(0),
    });
    let (address, _) = support::gate::serve(&running, waker.clone()).await;
    (running, address, waker)
}

async fn create(client: &Client, namespace: &str, manifest: &str, policy: Value) {
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "web"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "url": {"host": "{{ slug }}.gate.example.com"}, "policy": policy,
                 "manifests": {"inline": [{"name": "app.yaml", "template": manifest}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": "pr-2"},
        "spec": {"template": "web", "source": {"repository": "Codertocat/Hello-World",
                 "branch": "feature/<b>", "pullRequest": 2, "headSha": "abc1234"}}
    }))
    .unwrap();
    Api::<PreviewEnvironment>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
}

/// The environment's route `kind`/web in its namespace, as an API.
fn routes(client: &Client, namespace: &str, group: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// Puts pr-2 to sleep and waits until its route is gone; returns its host.
async fn asleep(environments: &Api<PreviewEnvironment>, route: &Api<DynamicObject>) -> String {
    let patch = json!({"spec": {"sleep": true}});
    environments
        .patch("pr-2", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let asleep = wait_for_phase(
        environments,
        "pr-2",
        Phase::Sleeping,
        Duration::from_secs(60),
    )
    .await;
    let status = asleep.status.unwrap();
    let host = status.host.clone().unwrap();
    assert!(host.ends_with(".gate.example.com"), "{host}");
    assert_eq!(
        status.url,
        Some(format!("https://{host}")),
        "asleep, the URL leads to the gate"
    );
    eventually("the route withdrawn", Duration::from_secs(30), || async {
        route.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    status.host.unwrap()
}

/// Requests `host` at the gate until the environment is Ready again: the first answers are the
/// waiting page, and `waker` wakes it exactly once.
async fn woken_by_requests(
    gate: std::net::SocketAddr,
    host: &str,
    environments: &Api<PreviewEnvironment>,
    waker: &CountingWaker,
) {
    let before = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let (status, headers, body) = get(gate, host, "text/html,application/xhtml+xml").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(header(&headers, "retry-after"), Some("5"));
    assert!(body.contains("<meta http-equiv=\"refresh\""), "{body}");
    assert!(body.contains("Preview environment"), "{body}");
    assert!(
        !body.contains("pr-2") && !body.contains("pull request"),
        "the page names nothing of the environment: {body}"
    );
    assert!(body.contains("starting, about"), "{body}");
    assert!(
        !body.contains("<b>"),
        "nothing of the request or the branch is echoed as HTML: {body}"
    );
    // A flood of requests meanwhile: one wake.
    let flood: Vec<_> = (0..50).map(|_| get(gate, host, "*/*")).collect();
    for (status, headers, body) in futures::future::join_all(flood).await {
        assert_eq!(status, 503);
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert!(body.contains("\"state\":\"starting, about"), "{body}");
        assert!(!body.contains("pr-2"), "the answer names nothing: {body}");
    }
    let ready = wait_for_phase(environments, "pr-2", Phase::Ready, Duration::from_secs(60)).await;
    assert_eq!(
        waker.wakes.load(Ordering::SeqCst),
        1,
        "51 requests, one wake"
    );
    assert!(!ready.spec.sleep);
    assert!(
        ready.spec.last_activity.is_some_and(|at| at >= before),
        "the request counts as activity"
    );
    // Who woke it shows in its record: the gate, under a field manager of its own.
    let managers = support::field_managers(&ready);
    assert!(managers.contains(&"previewd-gate"), "{managers:?}");
    let status = ready.status.unwrap();
    assert_eq!(status.waking_since, None);
    assert!(
        status.last_wake_seconds.is_some_and(|s| s > 0.0),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_request_wakes_a_sleeping_environment_and_its_ingress_returns_once_it_is_ready() {
    in_namespace("gate-ingress", |client, ns| async move {
        let (_running, gate, waker) = controller_and_gate(&client, &ns, &[]).await;
        create(&client, &ns, &app(INGRESS), json!({})).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let ready =
            wait_for_phase(&environments, "pr-2", Phase::Ready, Duration::from_secs(60)).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let ingress = routes(&client, &target, "networking.k8s.io", "Ingress");
        let host = asleep(&environments, &ingress).await;

        // A host nobody holds: 404, and nothing is woken.
        let (status, _, body) = get(gate, "pr-9.gate.example.com", "text/html").await;
        assert_eq!(status, 404, "{body}");
        let (status, _, _) = get(gate, "pr-2.gate.example.com.attacker.example", "*/*").await;
        assert_eq!(status, 404);
        assert_eq!(waker.wakes.load(Ordering::SeqCst), 0);

        woken_by_requests(gate, &host.to_uppercase(), &environments, &waker).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &target);
        let web = deployments.get("web").await.unwrap();
        assert_eq!(web.spec.unwrap().replicas, Some(2));
        assert_eq!(
            web.status.unwrap().available_replicas,
            Some(2),
            "Ready means its pods are available"
        );
        let back = ingress.get("web").await.unwrap();
        assert_eq!(
            back.data["spec"]["rules"][0]["host"],
            json!(host),
            "the Ingress is back"
        );
    })
    .await;
}

#[tokio::test]
async fn a_request_wakes_a_sleeping_environment_behind_an_http_route() {
    in_namespace("gate-route", |client, ns| async move {
        install_crds(
            &client,
            &[crd_in(GATEWAY_API, "httproutes", "HTTPRoute", "Namespaced")],
        )
        .await;
        let kind = json!({"group": GATEWAY_API, "kind": "HTTPRoute", "resource": "httproutes"});
        let (_running, gate, waker) = controller_and_gate(&client, &ns, &[kind]).await;
        create(
            &client,
            &ns,
            &app(HTTP_ROUTE),
            json!({"allowedGateways": ["gateway-system/previews"]}),
        )
        .await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        // The test plays the Gateway: it accepts every route it sees, new or re-created.
        let target = eventually("the namespace", Duration::from_secs(60), || async {
            environments.get("pr-2").await.ok()?.status?.namespace
        })
        .await;
        let route = routes(&client, &target, GATEWAY_API, "HTTPRoute");
        let gateway = tokio::spawn(accept_routes(route.clone()));
        wait_for_phase(&environments, "pr-2", Phase::Ready, Duration::from_secs(60)).await;
        let host = asleep(&environments, &route).await;
        woken_by_requests(gate, &host, &environments, &waker).await;
        let back = route.get("web").await.unwrap();
        assert_eq!(
            back.data["spec"]["hostnames"],
            json!([host]),
            "the HTTPRoute is back"
        );
        gateway.abort();
    })
    .await;
}

/// Marks every `web` route the Gateway has not accepted yet as accepted, until aborted.
async fn accept_routes(routes: Api<DynamicObject>) {
    loop {
        if let Ok(Some(route)) = routes.get_opt("web").await
            && route.data["status"]["parents"].is_null()
        {
            let accepted = json!({"status": {"parents": [{"parentRef": {"name": "previews"}, "controllerName": "example.com/gateway",
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                    "observedGeneration": route.metadata.generation, "lastTransitionTime": "2026-11-26T10:00:00Z"}]}]}});
            let _ = routes
                .patch_status("web", &PatchParams::default(), &Patch::Merge(accepted))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Counts the wakes it is asked for and writes nothing: the budget's test looks at who may
/// wake, not at the wake.
#[derive(Default)]
struct Tally(AtomicUsize);

impl Waker for Tally {
    fn wake<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
        _seen: &'a previewd::cluster::records::Seen<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Woke, String>> + Send + 'a>>
    {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(Woke::Written) })
    }
}

/// A GET of `host` at the gate, through a proxy that says the client is `client`: the status
/// and the body.
async fn get_for(gate: std::net::SocketAddr, host: &str, client: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(gate).await.unwrap();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nX-Forwarded-For: {client}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// Sleeping environments `pr-1` … `pr-N`, each holding `pr-N.budget.example.com`, written
/// straight to the API server (no controller: only the gate reads them).
async fn sleeping_environments(client: &Client, namespace: &str, count: u64) {
    sleeping_of(client, namespace, "web", "pr", count).await
}

/// `count` sleeping environments of `template`, named `{prefix}-{n}`, each holding host
/// `{prefix}-{n}.budget.example.com`.
async fn sleeping_of(client: &Client, namespace: &str, template: &str, prefix: &str, count: u64) {
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    for n in 1..=count {
        let name = format!("{prefix}-{n}");
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
            "metadata": {"name": name, "labels": {"previewd.test/namespace": namespace}},
            "spec": {"template": template, "sleep": true, "source": {"repository": "org/web",
                     "branch": format!("feature-{n}"), "pullRequest": n,
                     "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821"}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &environment)
            .await
            .unwrap();
        let status =
            json!({"status": {"phase": "Sleeping", "host": format!("{name}.budget.example.com")}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

/// Anyone who can reach preview hosts could wake every sleeping environment (each costs its
/// pods until it sleeps again): one client address wakes at most its share, all clients
/// together at most the budget in all, and a request beyond either gets a page that says so
/// and wakes nothing. The client is who the trusted proxy (here: loopback) says it is; with no
/// proxy trusted, the header is ignored and every request is the peer's. On the code before,
/// every one of the hosts was woken.
#[tokio::test]
async fn a_client_wakes_no_more_than_its_share_and_all_clients_no_more_than_the_budget() {
    use previewd::gate::budget::WakeLimits;
    use previewd::gate::server::{Clients, Gate};
    in_namespace("gate-budget", |client, ns| async move {
        sleeping_environments(&client, &ns, 6).await;
        let (caches, _watches) =
            previewd::cluster::caches::Caches::start(client.clone(), Some(&ns));
        caches.wait_until_ready().await;
        let gate_with = |trusted_proxies| {
            let tally = Arc::new(Tally::default());
            let wakes = WakeLimits {
                per_client: 2,
                in_all: 3,
                window: Duration::from_secs(600),
            };
            let metrics = previewd::gate::metrics::GateMetrics::new();
            let gate = Gate::new(
                caches.environments.clone(),
                tally.clone(),
                metrics,
                Clients {
                    wakes,
                    trusted_proxies,
                },
            );
            (gate, tally)
        };
        let (gate, tally) = gate_with(Clients::default().trusted_proxies);
        let address = support::gate::listen(gate).await;
        let host = |n: u32| format!("pr-{n}.budget.example.com");
        let one = "203.0.113.7";
        for n in 1..=2 {
            let (status, body) =
                eventually("the host is known", Duration::from_secs(10), || async {
                    let (status, body) = get_for(address, &host(n), one).await;
                    (status == 503).then_some((status, body))
                })
                .await;
            assert!(body.contains("starting"), "{status} {body}");
        }
        let (_, refused) = get_for(address, &host(3), one).await;
        assert!(
            refused.contains("too many previews were woken"),
            "{refused}"
        );
        // Another client has a share of its own, until all clients together spent the budget.
        let (_, other) = get_for(address, &host(3), "198.51.100.4").await;
        assert!(other.contains("starting"), "{other}");
        let (_, beyond) = get_for(address, &host(4), "192.0.2.55").await;
        assert!(
            beyond.contains("too many previews were woken"),
            "all clients: {beyond}"
        );
        assert_eq!(
            tally.0.load(Ordering::SeqCst),
            3,
            "two wakes by one client, one by another"
        );
        // Without a trusted proxy the header is anyone's word: every request is loopback's.
        let (gate, tally) = gate_with(Vec::new());
        let address = support::gate::listen(gate).await;
        for (n, claimed) in [(4, "192.0.2.1"), (5, "192.0.2.2"), (6, "192.0.2.3")] {
            eventually("the host is known", Duration::from_secs(10), || async {
                let (status, _) = get_for(address, &host(n), claimed).await;
                (status == 503).then_some(())
            })
            .await;
        }
        assert_eq!(
            tally.0.load(Ordering::SeqCst),
            2,
            "one client's share, whatever it claims"
        );
    })
    .await;
}

/// Removes the environment just before the cluster's waker writes its wake: the wake finds it
/// gone, as when a pull request is closed between the gate's answer and its write.
struct RemovingWaker {
    inner: ClusterWaker,
    client: Client,
}

impl Waker for RemovingWaker {
    fn wake<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        seen: &'a previewd::cluster::records::Seen<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Woke, String>> + Send + 'a>>
    {
        Box::pin(async move {
            let api: Api<PreviewEnvironment> = Api::namespaced(self.client.clone(), namespace);
            api.delete(name, &Default::default()).await.unwrap();
            self.inner.wake(namespace, name, seen).await
        })
    }
}

/// A wake that finds its environment removed woke nothing: it is not timed as a wake
/// (`previewd_gate_wake_seconds`), and the client's share of wakes is given back. On the code
/// before, the gate timed it and logged "a request wakes the environment", and the client's
/// second request was refused for a wake that never happened.
#[tokio::test]
async fn a_wake_that_finds_its_environment_removed_is_neither_timed_nor_spent() {
    use previewd::gate::budget::WakeLimits;
    use previewd::gate::server::{Clients, Gate};
    in_namespace("gate-gone", |client, ns| async move {
        sleeping_environments(&client, &ns, 2).await;
        let (caches, _watches) =
            previewd::cluster::caches::Caches::start(client.clone(), Some(&ns));
        caches.wait_until_ready().await;
        let metrics = previewd::gate::metrics::GateMetrics::new();
        let waker = RemovingWaker {
            inner: ClusterWaker::new(client.clone(), Default::default()),
            client: client.clone(),
        };
        let clients = Clients {
            wakes: WakeLimits {
                per_client: 1,
                in_all: 10,
                window: Duration::from_secs(600),
            },
            ..Clients::default()
        };
        let gate = Gate::new(
            caches.environments.clone(),
            Arc::new(waker),
            metrics.clone(),
            clients,
        );
        let address = support::gate::listen(gate).await;
        let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        // The client's share is one wake: its second host wakes only once the first wake,
        // which found nothing to wake, was given back.
        for n in 1..=2 {
            let host = format!("pr-{n}.budget.example.com");
            eventually("the client may wake", Duration::from_secs(10), || async {
                let (status, body) = get_for(address, &host, "203.0.113.7").await;
                (status == 503 && body.contains("starting")).then_some(())
            })
            .await;
            eventually("the wake removed it", Duration::from_secs(10), || async {
                api.get_opt(&format!("pr-{n}"))
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            })
            .await;
        }
        // The last wake's answer comes after the removal: a moment for the gate to hear it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            metrics.wake_seconds.get_sample_count(),
            0,
            "no wake was written"
        );
    })
    .await;
}

/// The budget in all is every team's: a flood from many addresses on one team's hosts wakes
/// that team's part of it (the budget divided by the teams, the namespaces, with sleeping
/// environments) and leaves the other team's visitors theirs; a second template of the first
/// team buys it no second part. On the code before, the flood spent the whole budget on the
/// first team's hosts and the second team's visitor woke nothing.
#[tokio::test]
async fn a_flood_on_one_teams_hosts_leaves_the_other_teams_their_part_of_the_wakes() {
    in_namespace("gate-team-web", |_, web| async move {
        in_namespace("gate-team-api", |client, api| async move {
            sleeping_of(&client, &web, "web", "web", 4).await;
            sleeping_of(&client, &web, "web-two", "two", 2).await;
            sleeping_of(&client, &api, "api", "api", 2).await;
            flood_one_team(&client, &[&web, &api]).await;
        })
        .await;
    })
    .await;
}

/// Floods every host of the first team (of `namespaces`) from addresses of their own, then
/// visits the second team's hosts.
async fn flood_one_team(client: &Client, namespaces: &[&str]) {
    use previewd::gate::budget::WakeLimits;
    use previewd::gate::server::{Clients, Gate};
    let (store, _watches) = environments_of(client, namespaces).await;
    let tally = Arc::new(Tally::default());
    let wakes = WakeLimits {
        per_client: 10,
        in_all: 4,
        window: Duration::from_secs(600),
    };
    let clients = Clients {
        wakes,
        ..Clients::default()
    };
    let metrics = previewd::gate::metrics::GateMetrics::new();
    let gate = Gate::new(store, tally.clone(), metrics.clone(), clients);
    let address = support::gate::listen(gate).await;
    let host = |prefix: &str, n: u32| format!("{prefix}-{n}.budget.example.com");
    let first_team = (1..=4)
        .map(|n| host("web", n))
        .chain((1..=2).map(|n| host("two", n)));
    let mut woken = 0;
    for (n, first_team_host) in first_team.enumerate() {
        let flooder = format!("203.0.113.{n}");
        let body = eventually("the host is known", Duration::from_secs(10), || async {
            let (status, body) = get_for(address, &first_team_host, &flooder).await;
            (status == 503).then_some(body)
        })
        .await;
        woken += usize::from(body.contains("starting"));
    }
    assert_eq!(woken, 2, "the first team's part: 4 wakes in 2 parts");
    let refused = metrics.requests.with_label_values(&["over_team_share"]);
    assert_eq!(refused.get(), 4);
    for n in 1..=2 {
        let (_, body) = get_for(address, &host("api", n), "198.51.100.9").await;
        assert!(
            body.contains("starting"),
            "the other team's visitor wakes: {body}"
        );
    }
    assert_eq!(tally.0.load(Ordering::SeqCst), 4);
}

/// The PreviewEnvironments of `namespaces`, as a watch of the real API server keeps them (one
/// cache per namespace would give the gate only one).
async fn environments_of(
    client: &Client,
    namespaces: &[&str],
) -> (
    kube::runtime::reflector::Store<PreviewEnvironment>,
    tokio::task::JoinHandle<()>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let all: Api<PreviewEnvironment> = Api::all(client.clone());
    let selector = format!("previewd.test/namespace in ({})", namespaces.join(","));
    let watch = watcher(all, watcher::Config::default().labels(&selector));
    let task = tokio::spawn(
        reflector(writer, watch)
            .applied_objects()
            .for_each(|_| async {}),
    );
    store.wait_until_ready().await.unwrap();
    (store, task)
}
