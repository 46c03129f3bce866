//! The Helm chart for real: `charts/previewd` linted (strict) and rendered by the real `helm`
//! (of the pinned version, see `support::tools`), its values schema
//! refusing bad values, the rendered objects applied to the control plane, and previewd run as
//! the chart's ServiceAccount (impersonation, so the chart's RBAC and nothing else decides what
//! it may do) through a whole lifecycle of the web-postgres example: opened → Ready (database,
//! seed Job, web app, ResourceQuota, LimitRange, NetworkPolicy) → a new commit → Ready →
//! closed → namespace deleted. A missing RBAC rule fails this test.
//!
//! PR deliveries are `github/pull_request.opened.json`, `synchronize.json` and `closed.json`;
//! the synchronize copy gets a new head SHA (the fixture's equals opened's).

use crate::support;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use previewd::model::crd::{PreviewEnvironment, PreviewTemplate};
use serde_json::{Value, json};
use support::process::PreviewdProcess;
use support::webhooks::*;
use support::{apply_all, in_namespace, yaml_documents};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/previewd");
const EXAMPLE: &str = include_str!("../../templates/web-postgres/template.yaml");

/// Values that `helm lint --strict` must pass besides the defaults: every optional part on.
fn everything_on() -> Value {
    json!({
        "ingress": {"enabled": true, "className": "nginx", "tls": [{"secretName": "t", "hosts": ["previewd.example.com"]}]},
        "serviceMonitor": {"enabled": true},
        "traffic": {"prometheusUrl": "http://prometheus.monitoring:9090",
                    "query": "sum(increase(nginx_ingress_controller_requests{host=\"{{ host }}\"}[10m]))"},
        "wakeGate": {"enabled": true, "ingress": {"enabled": true, "className": "nginx"},
                     "httpRoute": {"enabled": true, "parentRefs": [{"name": "previews", "namespace": "gateway-system"}]}},
        "watchNamespace": "apps",
        "rbac": {"bindableClusterRoles": ["view"], "secretNamespaces": ["apps", "team-b"]},
        "placement": {"enabled": true, "lookInterval": "5s", "unreachableGrace": "1m"},
        "databases": {"enabled": true},
    })
}

/// Values the chart's schema must refuse, by case.
fn bad_values() -> Vec<(&'static str, Value)> {
    vec![
        ("zero_replicas", json!({"replicaCount": 0})),
        ("unknown_key", json!({"replicas": 2})),
        (
            "bad_duration",
            json!({"controller": {"leaseDuration": "fifteen seconds"}}),
        ),
        (
            "bad_log_format",
            json!({"controller": {"logFormat": "xml"}}),
        ),
        // Kinds are listed in templateKinds / extraTemplateKinds, each whole and spelled as the API does.
        (
            "template_resources",
            json!({"rbac": {"templateResources": [{"apiGroup": "", "resources": ["nodes"]}]}}),
        ),
        (
            "template_kind_wildcard",
            json!({"extraTemplateKinds": [{"group": "", "kind": "Node", "resource": "*"}]}),
        ),
        (
            "template_kind_without_resource",
            json!({"extraTemplateKinds": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]}),
        ),
        (
            "bad_secret_namespace",
            json!({"rbac": {"secretNamespaces": ["Kube System"]}}),
        ),
        // The gate's route is the URL domain's wildcard: one exact host would take a neighbour's.
        (
            "wake_gate_exact_host",
            json!({"wakeGate": {"ingress": {"host": "app.example.com"}}}),
        ),
        (
            "wake_gate_on_the_webhook_port",
            json!({"wakeGate": {"port": 8080}}),
        ),
        (
            "price_not_a_number",
            json!({"prices": {"perCoreHour": "cheap"}}),
        ),
        // Less than one report's requests: no report could ever go out.
        (
            "forge_content_below_one_report",
            json!({"forgeContent": {"perMinute": 4}}),
        ),
        (
            "hub_access_for_a_node",
            json!({"hubAccess": {"subjects": [{"kind": "Node", "name": "worker-1"}]}}),
        ),
        (
            "traffic_query_without_the_host",
            json!({"traffic": {"prometheusUrl": "http://prometheus:9090", "query": "sum(requests)"}}),
        ),
    ]
}

/// `helm lint --strict` of the chart with `values` (none: the defaults) passes: no warning and
/// no error. Returns what it printed.
fn lint(namespace: &str, values: Option<&Value>) -> String {
    let folder = tempfile::tempdir().unwrap();
    let mut args: Vec<std::ffi::OsString> = vec![
        "lint".into(),
        "--strict".into(),
        CHART.into(),
        "--namespace".into(),
        namespace.into(),
    ];
    if let Some(values) = values {
        args.extend([
            "--values".into(),
            support::tools::values_file(folder.path(), values).into(),
        ]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    support::tools::helm_ok(&args)
}

/// Helm's message when it refuses `values` for the chart (`None`: it rendered them).
fn refused_by_helm(values: &Value) -> Option<String> {
    let folder = tempfile::tempdir().unwrap();
    let file = support::tools::values_file(folder.path(), values);
    let output = support::tools::run_helm(&[
        "template".as_ref(),
        "schema-check".as_ref(),
        CHART.as_ref(),
        "--values".as_ref(),
        file.as_os_str(),
    ]);
    (!output.status.success()).then(|| String::from_utf8_lossy(&output.stderr).into_owned())
}

/// What Helm installs of the chart: its CRDs (`helm show crds`) and every rendered template
/// (`helm template`, hooks included, as an install applies them too).
fn rendered_by_helm(release: &str, namespace: &str, values: &Value) -> (Vec<Value>, Vec<Value>) {
    let folder = tempfile::tempdir().unwrap();
    let file = support::tools::values_file(folder.path(), values);
    let crds = support::tools::helm_ok(&["show".as_ref(), "crds".as_ref(), CHART.as_ref()]);
    let rendered = support::tools::helm_ok(&[
        "template".as_ref(),
        release.as_ref(),
        CHART.as_ref(),
        "--namespace".as_ref(),
        namespace.as_ref(),
        "--values".as_ref(),
        file.as_os_str(),
    ]);
    (yaml_documents(&crds), yaml_documents(&rendered))
}

/// The status code of a refused call (`None`: it was allowed).
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(other) => panic!("not an API answer: {other}"),
    }
}

/// Acting as the chart's ServiceAccount (`as_chart`): allowed to write in the environment
/// namespace `target` and to read the template's Secrets in `ns`; refused everywhere else:
/// `kube-system`, and `bystander`, a namespace previewd did not create (even though its
/// cluster role lets it create RoleBindings, the API server refuses one to a role it may not
/// bind). The admin `client` makes the bystander namespace.
async fn assert_confined_to_environments(
    client: &kube::Client,
    as_chart: &kube::Client,
    ns: &str,
    target: &str,
    bystander: &str,
) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": bystander}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let config_map = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    Api::<ConfigMap>::namespaced(client.clone(), bystander)
        .create(&PostParams::default(), &config_map("theirs"))
        .await
        .unwrap();
    let post = PostParams::default();
    let in_ns = |namespace: &str| Api::<ConfigMap>::namespaced(as_chart.clone(), namespace);

    // Allowed: its environment's namespace, and the Secret a template names.
    assert_eq!(
        refusal(in_ns(target).create(&post, &config_map("probe")).await),
        None
    );
    assert_eq!(
        refusal(
            Api::<Secret>::namespaced(as_chart.clone(), ns)
                .get("webhook")
                .await
        ),
        None
    );
    // Refused: writes in kube-system and in the bystander, Secrets anywhere else.
    for namespace in ["kube-system", bystander] {
        assert_eq!(
            refusal(in_ns(namespace).create(&post, &config_map("probe")).await),
            Some(403),
            "previewd may create a ConfigMap in {namespace}"
        );
        let secrets = Api::<Secret>::namespaced(as_chart.clone(), namespace);
        assert_eq!(
            refusal(secrets.list(&ListParams::default()).await),
            Some(403),
            "previewd may read Secrets in {namespace}"
        );
    }
    assert_eq!(
        refusal(
            in_ns(bystander)
                .delete("theirs", &DeleteParams::default())
                .await
        ),
        Some(403)
    );
    assert_eq!(
        refusal(
            Api::<Secret>::all(as_chart.clone())
                .list(&ListParams::default())
                .await
        ),
        Some(403),
        "previewd may list Secrets cluster-wide"
    );
    let take_over: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "take-over"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": bystander}],
    }))
    .unwrap();
    for namespace in [bystander, target] {
        assert_eq!(
            refusal(
                Api::<RoleBinding>::namespaced(as_chart.clone(), namespace)
                    .create(&post, &take_over)
                    .await
            ),
            Some(403),
            "previewd may bind cluster-admin in {namespace}"
        );
    }
}

/// The kind the test adds through the chart's `extraTemplateKinds` value: HTTPRoute.
const ROUTE_GROUP: &str = "gateway.networking.k8s.io";
const ROUTES: &str = "httproutes";

/// Whether `as_chart` may `verb` HTTPRoutes in `namespace` ("" for cluster-wide), as the API
/// server's authorizer answers (SelfSubjectAccessReview; the CRD need not be installed).
async fn may_route(as_chart: &kube::Client, verb: &str, namespace: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let review: SelfSubjectAccessReview =
        serde_json::from_value(json!({"spec": {"resourceAttributes": {
            "group": ROUTE_GROUP, "resource": ROUTES, "verb": verb, "namespace": namespace,
        }}}))
        .unwrap();
    let answer = Api::<SelfSubjectAccessReview>::all(as_chart.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

/// The operator's extra kind is writable in the environment namespace, watchable cluster-wide
/// (previewd's watches), and writable nowhere else.
async fn assert_extra_kind_confined(as_chart: &kube::Client, target: &str, bystander: &str) {
    for verb in ["create", "patch", "delete"] {
        assert!(
            may_route(as_chart, verb, target).await,
            "{verb} in {target}"
        );
        for elsewhere in [bystander, "kube-system", ""] {
            assert!(
                !may_route(as_chart, verb, elsewhere).await,
                "previewd may {verb} HTTPRoutes in {elsewhere:?}"
            );
        }
    }
    assert!(may_route(as_chart, "watch", "").await, "watch HTTPRoutes");
}

/// previewd's own NetworkPolicy (issue 35 §1): every egress rule names its peers (no rule open
/// to every address), the API server only at its address, and HTTPS to public addresses never
/// reaches a private range (cloud metadata at 169.254.169.254, internal services): an engine
/// made to fetch an internal URL finds no way there.
/// What docs/security.md says of the one exception: rendered where the API server's address
/// cannot be read (`helm template` without `networkPolicy.apiServer.cidrs`), its ports are open
/// to every address, and that rule alone; every other rule keeps its peers.
fn assert_the_api_ports_open_to_every_address_when_no_address_is_known(namespace: &str) {
    let (_, rendered) = rendered_by_helm("no-address", namespace, &json!({}));
    let policy = rendered
        .iter()
        .find(|o| o["kind"] == "NetworkPolicy")
        .expect("the chart renders previewd's NetworkPolicy");
    let open: Vec<&Value> = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|rule| rule["to"].as_array().is_none_or(Vec::is_empty))
        .collect();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        open[0]["ports"],
        json!([{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}])
    );
}

fn assert_egress_stays_out_of_private_ranges(rendered: &[Value]) {
    let policy = rendered
        .iter()
        .find(|o| o["kind"] == "NetworkPolicy")
        .expect("the chart renders previewd's NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let egress = policy["spec"]["egress"].as_array().unwrap();
    for rule in egress {
        let peers = rule["to"].as_array().map_or(0, Vec::len);
        assert!(peers > 0, "an egress rule open to every address: {rule}");
    }
    let blocks: Vec<&Value> = egress
        .iter()
        .flat_map(|r| r["to"].as_array().unwrap().iter())
        .filter_map(|peer| peer.get("ipBlock"))
        .collect();
    assert!(
        blocks.contains(&&json!({"cidr": "127.0.0.1/32"})),
        "{blocks:?}"
    );
    let public = blocks
        .iter()
        .find(|b| b["cidr"] == "0.0.0.0/0")
        .expect("HTTPS to public addresses");
    for private in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
    ] {
        assert!(
            public["except"]
                .as_array()
                .unwrap()
                .contains(&json!(private)),
            "{private} reachable: {public}"
        );
    }
}

#[tokio::test]
async fn the_chart_lints_renders_applies_and_its_rbac_carries_a_lifecycle() {
    in_namespace("chart", |client, ns| async move {
        // The release is named after the test namespace: ClusterRoles are cluster-wide.
        let release = ns.clone();
        let values = json!({
            "watchNamespace": ns,
            "controller": {"logLevel": "info"},
            // A kind a platform adds: previewd's guard and the chart's RBAC both follow it.
            "extraTemplateKinds": [{"group": ROUTE_GROUP, "kind": "HTTPRoute", "resource": ROUTES}],
            // The API server's address, as an operator who renders with `helm template` sets it.
            "networkPolicy": {"apiServer": {"cidrs": ["127.0.0.1/32"]}},
            // The webhook Ingress, and the wake gate behind the URL domain's wildcard Ingress.
            "ingress": {"enabled": true, "host": "previewd.example.com"},
            "wakeGate": {"enabled": true, "ingress": {"enabled": true, "host": "*.preview.example.com"}},
            // Prices: previewd as the chart configures it shows costs.
            "prices": {"perCoreHour": "0.04", "perGibHour": "0.005"},
            // The content budget, smaller than the default.
            "forgeContent": {"perMinute": 40, "perHour": 300},
            // As on a registered cluster: a hub may write previewd's records here.
            "hubAccess": {"subjects": [{"kind": "User", "name": "previewd-hub", "apiGroup": "rbac.authorization.k8s.io"}]},
        });
        for (case, values) in [("defaults", None), ("everything on", Some(everything_on()))] {
            let said = lint(&ns, values.as_ref());
            assert!(
                said.contains("0 chart(s) failed") && !said.contains("[WARNING]"),
                "helm lint --strict ({case}):\n{said}"
            );
        }
        for (case, bad) in bad_values() {
            let refused = refused_by_helm(&bad);
            assert!(
                refused.as_deref().is_some_and(|m| m.contains("schema")),
                "the values schema accepted {case}: {refused:?}"
            );
        }

        // Apply what Helm would install: CRDs first, then every rendered template.
        let (crds, rendered) = rendered_by_helm(&release, &ns, &values);
        assert_eq!(crds.len(), 4, "the four CRDs are in the chart");
        apply_all(&client, &ns, &crds).await;
        let kinds: Vec<&str> = rendered
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        for kind in [
            "Deployment",
            "Service",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ] {
            assert!(
                kinds.contains(&kind),
                "the chart renders a {kind}: {kinds:?}"
            );
        }
        // The hub's access: previewd's records in the watched namespace, nothing else.
        let hub_role = rendered
            .iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == format!("{release}-previewd-hub-records"))
            .expect("the hub's Role");
        assert_eq!(hub_role["metadata"]["namespace"], json!(ns));
        assert_eq!(hub_role["rules"], json!(previewd::model::rbac::hub_record_rules()));
        assert_egress_stays_out_of_private_ranges(&rendered);
        assert_the_api_ports_open_to_every_address_when_no_address_is_known(&ns);
        assert_gate_routed(&rendered, &release);
        apply_all(&client, &ns, &rendered).await;
        let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(container["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
        assert_eq!(pod["securityContext"]["fsGroup"], 65532);
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        // The webhook Ingress exposes the two webhook paths and nothing else.
        let ingress = rendered
            .iter()
            .find(|o| o["kind"] == "Ingress" && o["metadata"]["name"] == format!("{release}-previewd"))
            .expect("the webhook Ingress");
        let paths: Vec<&Value> = ingress["spec"]["rules"][0]["http"]["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["path"])
            .collect();
        assert_eq!(paths, [&json!("/webhooks/github"), &json!("/webhooks/gitlab")]);
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");

        // previewd as the chart's ServiceAccount, configured by the chart's environment.
        let account = pod["serviceAccountName"].as_str().unwrap();
        let user = format!("system:serviceaccount:{ns}:{account}");
        let groups = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".to_string(),
        ];
        let scratch = tempfile::tempdir().unwrap();
        let kubeconfig = support::impersonating_kubeconfig(&user, &groups, scratch.path());
        let as_chart = previewd::cluster::client::from_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        )
        .await
        .unwrap();
        // The identity is really confined: nothing cluster-scoped beyond namespaces and CRDs.
        let nodes = Api::<Node>::all(as_chart.clone())
            .list(&ListParams::default())
            .await;
        assert!(
            matches!(nodes, Err(kube::Error::Api(ref s)) if s.code == 403),
            "the chart's identity may list nodes: {nodes:?}"
        );
        let env: Vec<(String, String)> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let value = match e["value"].as_str() {
                    Some(value) => value.to_string(),
                    // The downward API's metadata.namespace.
                    None => ns.clone(),
                };
                (e["name"].as_str().unwrap().to_string(), value)
            })
            // Tests listen on a free loopback port, given on the command line.
            .filter(|(name, _)| name != "PREVIEWD_LISTEN")
            // The gate too, on a free loopback port (read back from its log line).
            .map(|(name, value)| match name.as_str() {
                "PREVIEWD_GATE_LISTEN" => (name, "127.0.0.1:0".to_string()),
                _ => (name, value),
            })
            .collect();
        assert!(env.iter().any(|(name, _)| name == "PREVIEWD_GATE_LISTEN"));
        assert!(env.contains(&("PREVIEWD_PRICE_PER_CORE_HOUR".into(), "0.04".into())));
        assert!(env.contains(&("PREVIEWD_FORGE_CONTENT_PER_MINUTE".into(), "40".into())));
        assert!(env.contains(&("PREVIEWD_FORGE_CONTENT_PER_HOUR".into(), "300".into())));

        // The web-postgres example, served by wiremock as GitHub.
        let forge = github_forge().await;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "webhook"},
            "stringData": {"secret": SECRET, "token": "forge-token-for-tests"}
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let mut template: Value = serde_yaml_ng::from_str(EXAMPLE).unwrap();
        template["metadata"]["namespace"] = json!(ns);
        template["spec"]["forge"]["apiUrl"] = json!(forge.uri());
        template["spec"]["forge"]["webhookSecretRef"] = json!({"name": "webhook", "key": "secret"});
        template["spec"]["forge"]["tokenSecretRef"] = json!({"name": "webhook", "key": "token"});
        let template: PreviewTemplate = serde_json::from_value(template).unwrap();
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();

        let previewd = PreviewdProcess::start("as-chart", &kubeconfig, &[], &env, scratch.path());
        let http = reqwest::Client::new();
        previewd.wait_ready(&http).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        previewd
            .send(
                &http,
                "pull_request",
                "chart-open",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        let name = environment_of_pr(&environments, 2).await;
        let opened_sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let ready = wait_ready_with_sha(&environments, &name, opened_sha).await;
        let target = ready.status.unwrap().namespace.unwrap();

        // While the environment runs: previewd writes in its namespace, and nowhere else.
        let bystander = format!("{ns}-bystander");
        assert_confined_to_environments(&client, &as_chart, &ns, &target, &bystander).await;
        assert_extra_kind_confined(&as_chart, &target, &bystander).await;

        let mut synchronize = json_fixture("github/pull_request.synchronize.json");
        let new_sha = "1f2e3d4c5b6a79881726354453627180f9e8d7c6";
        synchronize["pull_request"]["head"]["sha"] = json!(new_sha);
        previewd
            .send(
                &http,
                "pull_request",
                "chart-sync",
                synchronize.to_string().as_bytes(),
            )
            .await;
        wait_ready_with_sha(&environments, &name, new_sha).await;
        woken_through_the_gate(&previewd, &environments, &name).await;

        previewd
            .send(
                &http,
                "pull_request",
                "chart-close",
                &github_fixture("pull_request.closed.json"),
            )
            .await;
        wait_gone(&client, &environments, &name, &target).await;

        let denied: Vec<String> = previewd
            .log_lines()
            .into_iter()
            .filter(|line| line.contains("forbidden") || line.contains("Forbidden"))
            .collect();
        assert!(
            denied.is_empty(),
            "previewd was refused something under the chart's RBAC: {denied:#?}"
        );
        assert_eq!(
            previewd.metric(&http, "previewd_leader").await,
            Some(1.0),
            "it took the Lease in its namespace"
        );

        // Cluster-scoped leftovers of this release.
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let role_name = format!("{release}-previewd");
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&role_name, &DeleteParams::default())
            .await;
        for role in [role_name.clone(), format!("{role_name}-environment")] {
            let _ = Api::<ClusterRole>::all(client.clone())
                .delete(&role, &DeleteParams::default())
                .await;
        }
        let _ = Api::<Namespace>::all(client.clone())
            .delete(&bystander, &DeleteParams::default())
            .await;
    })
    .await;
}

/// The chart's wake gate: its own Service (only the gate's port), the wildcard Ingress to it,
/// the container port and previewd's NetworkPolicy letting it in.
fn assert_gate_routed(rendered: &[Value], release: &str) {
    let gate = format!("{release}-previewd-gate");
    let named = |kind: &str| {
        rendered
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == gate.as_str())
            .unwrap_or_else(|| panic!("the chart renders {kind}/{gate}"))
    };
    let service = named("Service");
    assert_eq!(service["spec"]["ports"].as_array().unwrap().len(), 1);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "gate");
    let rule = &named("Ingress")["spec"]["rules"][0];
    assert_eq!(rule["host"], "*.preview.example.com");
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"]["name"],
        gate.as_str()
    );
    let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let ports = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"];
    assert!(
        ports
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "gate" && p["containerPort"] == 8081)
    );
    let policy = rendered
        .iter()
        .find(|o| o["kind"] == "NetworkPolicy")
        .unwrap();
    let open: Vec<&Value> = policy["spec"]["ingress"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["port"])
        .collect();
    assert_eq!(open, [&json!(8080), &json!(8081)]);
}

/// Under the chart's RBAC: asleep, a request to the gate wakes the environment again.
async fn woken_through_the_gate(
    previewd: &PreviewdProcess,
    environments: &Api<PreviewEnvironment>,
    name: &str,
) {
    use kube::api::{Patch, PatchParams};
    use previewd::model::crd::Phase;
    let gate = support::eventually(
        "the gate's address in the log",
        std::time::Duration::from_secs(10),
        || async {
            let line = previewd
                .log_lines()
                .into_iter()
                .find(|l| l.contains("wake gate listening"))?;
            let at = line.find("127.0.0.1:")?;
            let port: String = line[at + 10..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Some(format!("127.0.0.1:{port}"))
        },
    )
    .await;
    environments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sleep": true}})),
        )
        .await
        .unwrap();
    let asleep = support::wait_for_phase(
        environments,
        name,
        Phase::Sleeping,
        std::time::Duration::from_secs(60),
    )
    .await;
    let host = asleep.status.unwrap().host.unwrap();
    let answer = reqwest::Client::new()
        .get(format!("http://{gate}/"))
        .header("Host", host)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 503, "the waiting page");
    let awake = support::wait_for_phase(
        environments,
        name,
        Phase::Ready,
        std::time::Duration::from_secs(60),
    )
    .await;
    assert!(
        !awake.spec.sleep,
        "woken by the request, under the chart's RBAC"
    );
}
