//! The content policy as an allow-list (issue 34), against the real API server: what a pull
//! request's manifests may create, class by class, tried as a hostile PR author would. Each
//! test here failed on main before the class it names was closed.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::model::grants::{OperatorPolicy, RoleGrants};
use previewd::reconcile::ControllerConfig;
use serde_json::{Value, json};
use support::{eventually, in_namespace, wait_for_phase};

/// A template of `manifest` (inline) with `policy`, and its environment `pr-7`, reconciled by a
/// controller confined to `namespace` with the default configuration. Returns the controller.
pub(crate) async fn deploy(
    client: &kube::Client,
    namespace: &str,
    manifest: &str,
    policy: Value,
) -> support::Running {
    let running = support::start_controller_with(
        client,
        ControllerConfig {
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
    )
    .await;
    create_template_and_environment(client, namespace, manifest, policy).await;
    running
}

/// [`deploy`] under what the operator allows (`operator`), waiting until `pr-7` is Ready:
/// the controller, and the namespace it deployed to.
async fn deploy_ready_under(
    client: &kube::Client,
    namespace: &str,
    manifest: &str,
    operator: OperatorPolicy,
) -> (support::Running, String) {
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        operator_policy: operator,
        ..Default::default()
    };
    let running = support::start_controller_with(client, config).await;
    create_template_and_environment(client, namespace, manifest, json!({})).await;
    let api = environments(client, namespace);
    let ready = wait_for_phase(&api, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
    (running, ready.status.unwrap().namespace.unwrap())
}

/// The template `app` of `manifest` with `policy`, and its environment `pr-7`.
pub(crate) async fn create_template_and_environment(
    client: &kube::Client,
    namespace: &str,
    manifest: &str,
    policy: Value,
) {
    let app = support::apps::InlineApp {
        template: "app",
        manifest,
        policy,
        environment: "pr-7",
        pull_request: 7,
        branch: "evil",
    };
    support::apps::create_inline(client, namespace, app).await;
}

/// The namespace of environment `pr-7` once it is Ready.
async fn ready_namespace(client: &kube::Client, namespace: &str) -> String {
    let ready = wait_for_phase(
        &environments(client, namespace),
        "pr-7",
        Phase::Ready,
        Duration::from_secs(60),
    )
    .await;
    ready.status.unwrap().namespace.unwrap()
}

fn environments(client: &kube::Client, namespace: &str) -> Api<PreviewEnvironment> {
    Api::namespaced(client.clone(), namespace)
}

/// The message of the environment's `Ready` condition once it is `PolicyRejected`.
async fn refusal(client: &kube::Client, namespace: &str) -> String {
    let api = environments(client, namespace);
    eventually(
        "pr-7 refused by the policy",
        Duration::from_secs(60),
        || async {
            let status = api.get("pr-7").await.ok()?.status?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (ready.reason == "PolicyRejected").then(|| ready.message.clone())
        },
    )
    .await
}

/// Whether any namespace was created for `pr-7` of the test's `namespace` (a refused render
/// applies nothing, not even the namespace).
async fn environment_namespaces(client: &kube::Client, namespace: &str) -> usize {
    let selector =
        format!("previewd.dev/environment=pr-7,previewd.dev/environment-namespace={namespace}");
    Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .len()
}

/// Waits until `pr-7` is refused by the policy, checks that the refusal names each of
/// `named`, and that nothing was applied, not even the namespace.
pub(crate) async fn assert_refused_naming(client: &kube::Client, namespace: &str, named: &[&str]) {
    let message = refusal(client, namespace).await;
    for named in named {
        assert!(message.contains(named), "{named:?} not in: {message}");
    }
    assert_eq!(
        environment_namespaces(client, namespace).await,
        0,
        "nothing was applied"
    );
}

/// In a namespace of its own (`test_name`), the template of `manifest` and its environment
/// under the default policy are refused naming each of `named`, and nothing is applied.
pub(crate) async fn refused_naming_in(test_name: &str, manifest: &str, named: &[&str]) {
    in_namespace(test_name, |client, ns| async move {
        let _running = deploy(&client, &ns, manifest, json!({})).await;
        assert_refused_naming(&client, &ns, named).await;
    })
    .await;
}

/// The HTTP status of a refused call; `None` when it was allowed.
fn refused_with<T>(result: Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(other) => panic!("not an answer of the API server: {other}"),
    }
}

/// Class 1: a Role that grants what previewd holds (namespaces, pod creation, exec, tokens)
/// is refused by name, and none of it is applied. On main the environment became Ready and its
/// ServiceAccount could relabel its own namespace.
#[tokio::test]
async fn a_role_beyond_the_operators_role_rules_is_refused_and_nothing_is_applied() {
    const ESCAPE: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: escape}
rules:
- {apiGroups: [""], resources: [namespaces], verbs: [get, patch]}
- {apiGroups: [""], resources: [pods, pods/exec], verbs: [create]}
- {apiGroups: [""], resources: [secrets], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: escape}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: escape}
subjects: [{kind: ServiceAccount, name: app}]
"#;
    refused_naming_in(
        "policy-roles",
        ESCAPE,
        &[
            "Role/escape (from app.yaml): rules[0] grants get, patch on namespaces",
            "rules[1] grants create on pods; create on pods/exec",
            "rules[2] grants get, list on secrets",
            "--template-role-rules",
        ],
    )
    .await;
}

/// The default role rules, every one of them, as one Role of a template.
fn role_of_every_default_rule() -> String {
    let rules: Vec<Value> = RoleGrants::default()
        .iter()
        .map(|grant| serde_json::to_value(grant).unwrap())
        .collect();
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                      "metadata": {"name": "everything-allowed"}, "rules": rules});
    serde_yaml_ng::to_string(&role).unwrap()
}

/// Class 1, the proof by impersonation: a ServiceAccount that holds every Role the default
/// policy admits cannot patch its namespace, create a pod (which previewd's policy would not
/// see), read a Secret, grant itself more, or touch another namespace; it can read its pods.
#[tokio::test]
async fn a_service_account_with_every_role_the_default_admits_stays_in_its_namespace() {
    let manifest = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: app}}\n---\n{}---\n{}",
        role_of_every_default_rule(),
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: app}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: everything-allowed}\nsubjects: [{kind: ServiceAccount, name: app}]\n"
    );
    in_namespace("policy-impersonation", |client, ns| async move {
        let _running = deploy(&client, &ns, &manifest, json!({})).await;
        let target = ready_namespace(&client, &ns).await;
        let app = support::client_as_service_account(&target, "app").await;

        // The Role is in force: the application may read its own pods (RBAC is cached by the
        // API server's informers for a moment after the binding appears).
        let own_pods: Api<Pod> = Api::namespaced(app.clone(), &target);
        eventually("the Role to be in force", Duration::from_secs(30), || async {
            own_pods.list(&ListParams::default()).await.ok()
        })
        .await;

        let namespaces: Api<Namespace> = Api::all(app.clone());
        let relabel = json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        assert_eq!(
            refused_with(namespaces.patch(&target, &PatchParams::default(), &Patch::Merge(&relabel)).await),
            Some(403),
            "the namespace's labels are previewd's"
        );
        let privileged: Pod = serde_json::from_value(json!({
            "metadata": {"name": "root"},
            "spec": {"hostPID": true, "containers": [{"name": "c", "image": "busybox",
                     "securityContext": {"privileged": true}}]}
        }))
        .unwrap();
        assert_eq!(
            refused_with(own_pods.create(&PostParams::default(), &privileged).await),
            Some(403),
            "pods come from previewd's checked applies only"
        );
        let secrets: Api<Secret> = Api::namespaced(app.clone(), &target);
        assert_eq!(refused_with(secrets.list(&ListParams::default()).await), Some(403));
        let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(app.clone(), &target);
        let more: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({
            "metadata": {"name": "more"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
        }))
        .unwrap();
        assert_eq!(refused_with(roles.create(&PostParams::default(), &more).await), Some(403));
        let elsewhere: Api<ConfigMap> = Api::namespaced(app.clone(), &ns);
        assert_eq!(refused_with(elsewhere.list(&ListParams::default()).await), Some(403));
    })
    .await;
}

/// The second wall: Pod Security Admission, enforced by the API server itself on the label
/// previewd sets on every environment namespace (`pod-security.kubernetes.io/enforce: baseline`
/// by default). A privileged pod created directly in the namespace, by a cluster admin whose
/// RBAC allows everything and bypassing previewd's own policy, is refused by the API server;
/// a baseline pod in the same namespace is admitted, so the refusal is the pod's, not the
/// caller's. Without the label (or on a server without Pod Security Admission, such as the
/// 1.20 sandbox this suite used to run on) the privileged pod is created.
#[tokio::test]
async fn pod_security_admission_refuses_a_privileged_pod_that_bypasses_previewd() {
    const APP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {k: v}\n";
    in_namespace("policy-pod-security", |client, ns| async move {
        let _running = deploy(&client, &ns, APP, json!({})).await;
        let target = ready_namespace(&client, &ns).await;
        let labels = Api::<Namespace>::all(client.clone())
            .get(&target)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some("baseline")
        );

        let pods: Api<Pod> = Api::namespaced(client.clone(), &target);
        let pod = |name: &str, privileged: bool| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                         "securityContext": {"privileged": privileged}}]}
            }))
            .unwrap()
        };
        let refused = pods
            .create(&PostParams::default(), &pod("root", true))
            .await;
        match refused {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    status.message.contains("violates PodSecurity \"baseline:"),
                    "refused by Pod Security Admission: {}",
                    status.message
                );
            }
            other => panic!("a privileged pod was admitted into {target}: {other:?}"),
        }
        pods.create(&PostParams::default(), &pod("plain", false))
            .await
            .expect("a baseline pod is admitted");
    })
    .await;
}

/// Class 2: a template NetworkPolicy that opens the namespace (egress to any address, ingress
/// from every namespace) or takes the guard rail's name is refused by path; on main both were
/// applied, and the second replaced the default-deny policy.
#[tokio::test]
async fn network_policies_that_undo_the_guard_rail_are_refused() {
    const OPENING: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: out}
spec:
  podSelector: {}
  policyTypes: [Egress, Ingress]
  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0}}]}]
  ingress: [{from: [{namespaceSelector: {}}]}, {ports: [{port: 80, protocol: TCP}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: previewd-default-deny}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {}}]}]
"#;
    refused_naming_in("policy-network", OPENING, &["NetworkPolicy/out (from app.yaml): spec.egress[0].to[0] names ipBlock",
            "spec.ingress[0].from[0] names namespaceSelector",
            "spec.ingress[1] has no from, which allows every peer",
            "policy.allowNetworkPeersOutside",
            "NetworkPolicy/previewd-default-deny (from app.yaml): names starting with \"previewd-\" are previewd's own"]).await;
}

/// Class 2, the guard rail itself: port 53 leaves the namespace only towards the cluster's DNS
/// (on main: to any address, a tunnel out), and a template's own NetworkPolicy between its pods
/// still deploys.
#[tokio::test]
async fn the_guard_rails_dns_exception_reaches_the_clusters_dns_only() {
    const INSIDE: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: 5432, protocol: TCP}]}]
"#;
    in_namespace("policy-dns", |client, ns| async move {
        let _running = deploy(&client, &ns, INSIDE, json!({})).await;
        let target = ready_namespace(&client, &ns).await;
        let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
            Api::namespaced(client.clone(), &target);
        let guard_rail = serde_json::to_value(policies.get("previewd-default-deny").await.unwrap())
            .unwrap();
        let egress = guard_rail["spec"]["egress"].as_array().unwrap();
        let dns: Vec<&Value> = egress
            .iter()
            .filter(|rule| rule["ports"].as_array().is_some_and(|ports| ports.iter().any(|p| p["port"] == 53)))
            .collect();
        assert_eq!(dns.len(), 1, "{egress:?}");
        assert_eq!(
            dns[0]["to"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]),
            "port 53 to the cluster's DNS, not to any address"
        );
        assert!(
            egress.iter().all(|rule| rule["to"].as_array().is_some_and(|to| !to.is_empty())),
            "no egress rule of the guard rail allows every peer: {egress:?}"
        );
        policies.get("db").await.expect("the template's own policy between its pods deploys");
    })
    .await;
}

/// Class 3: an Ingress is the environment's host and nothing more. A config snippet for the
/// shared controller, a catch-all `defaultBackend`, a class the template did not name and
/// another environment's host (a sibling in the same domain) are refused by field; on main all
/// four were applied.
#[tokio::test]
async fn an_ingress_beyond_its_own_host_is_refused() {
    const GREEDY: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  annotations:
    nginx.ingress.kubernetes.io/configuration-snippet: "more_set_headers 'X: y';"
spec:
  ingressClassName: internet-facing
  defaultBackend: {service: {name: web, port: {number: 80}}}
  rules:
  - host: "{{ host }}"
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - host: "neighbour.preview.localhost"
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#;
    refused_naming_in("policy-ingress", GREEDY, &["Ingress/web (from app.yaml): metadata.annotations has \"nginx.ingress.kubernetes.io/configuration-snippet\"",
            "--ingress-annotations",
            "spec.defaultBackend would receive the traffic of every host",
            "spec.ingressClassName is \"internet-facing\"",
            "host \"neighbour.preview.localhost\" is not the environment's URL host"]).await;
}

/// Class 3, beyond Ingresses: annotations through which a Service or a pod configures a
/// controller other teams share (an API gateway's route to another host, external-dns, a mesh
/// sidecar mounting the node's root, a secret injector) are refused by key and path, nothing
/// applied; the same keys pass once the operator names them, and reach the API server. On main
/// every one was applied.
#[tokio::test]
async fn annotations_that_configure_shared_controllers_are_refused() {
    const ANNOTATED: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: api
  annotations:
    getambassador.io/config: "kind: Mapping\nname: steal\nhostname: www.example.com\nprefix: /\nservice: api"
    external-dns.alpha.kubernetes.io/hostname: www.example.com
    checksum/config: "abc"
spec:
  selector: {app: api}
  ports: [{port: 80, protocol: TCP}]
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  annotations: {prometheus.io/scrape: "true"}
data: {mode: preview}
"#;
    const INJECTED: &str = r#"---
apiVersion: batch/v1
kind: Job
metadata: {name: migrate}
spec:
  template:
    metadata:
      annotations:
        sidecar.istio.io/userVolume: '[{"name":"root","hostPath":{"path":"/"}}]'
        vault.hashicorp.com/agent-inject-secret-db: secret/data/payments/db
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: busybox}]
"#;
    let hostile = format!("{ANNOTATED}{INJECTED}");
    refused_naming_in("policy-annotations", &hostile, &["Service/api (from app.yaml): metadata.annotations has \"getambassador.io/config\"",
            "metadata.annotations has \"external-dns.alpha.kubernetes.io/hostname\"",
            "Job/migrate (from app.yaml): spec.template.metadata.annotations has \"sidecar.istio.io/userVolume\"",
            "spec.template.metadata.annotations has \"vault.hashicorp.com/agent-inject-secret-db\"",
            "--object-annotations"]).await;
    in_namespace("policy-annotations-allowed", |client, ns| async move {
        let operator = OperatorPolicy {
            object_annotations: vec![
                "getambassador.io/*".into(),
                "external-dns.alpha.kubernetes.io/hostname".into(),
            ],
            ..Default::default()
        };
        let (_running, target) = deploy_ready_under(&client, &ns, ANNOTATED, operator).await;
        let service =
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &target)
                .get("api")
                .await
                .unwrap();
        let annotations = service.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("external-dns.alpha.kubernetes.io/hostname")
                .map(String::as_str),
            Some("www.example.com"),
            "what the operator names is applied as written"
        );
    })
    .await;
}

/// Class 3, labels: keys a shared controller reads on a pod template (Istio's injection and
/// ambient data plane switched off: the pod leaves the mesh that enforces every team's egress)
/// and previewd's own labels on a CronJob's job template (its Jobs would reach previewd's
/// watches as another environment's) are refused by key and path, nothing applied; the mesh
/// key passes once the operator names it, and reaches the API server. On main every one was
/// applied.
#[tokio::test]
async fn labels_that_configure_shared_controllers_are_refused() {
    const MESHLESS: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web, app.kubernetes.io/name: web, sidecar.istio.io/inject: "false"}
    spec:
      containers: [{name: web, image: nginx, resources: {requests: {cpu: 10m, memory: 16Mi}}}]
"#;
    const FORGED: &str = r#"---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ambient}
spec:
  selector: {matchLabels: {app: ambient}}
  template:
    metadata:
      labels: {app: ambient, istio.io/dataplane-mode: none}
    spec:
      containers: [{name: web, image: nginx}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: report}
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    metadata:
      labels: {app.kubernetes.io/managed-by: previewd, previewd.dev/environment: pr-1, previewd.dev/environment-namespace: payments}
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: report, image: busybox}]
"#;
    let hostile = format!("{MESHLESS}{FORGED}");
    refused_naming_in("policy-labels", &hostile, &["Deployment/web (from app.yaml): spec.template.metadata.labels has \"sidecar.istio.io/inject\"",
            "Deployment/ambient (from app.yaml): spec.template.metadata.labels has \"istio.io/dataplane-mode\"",
            "CronJob/report (from app.yaml): spec.jobTemplate.metadata.labels has \"app.kubernetes.io/managed-by\", which previewd's own watches read",
            "spec.jobTemplate.metadata.labels has \"previewd.dev/environment\"",
            "--object-labels"]).await;
    in_namespace("policy-labels-allowed", |client, ns| async move {
        let operator = OperatorPolicy {
            object_labels: vec!["sidecar.istio.io/inject".into()],
            ..Default::default()
        };
        let (_running, target) = deploy_ready_under(&client, &ns, MESHLESS, operator).await;
        let web =
            Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &target)
                .get("web")
                .await
                .unwrap();
        let labels = web
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap_or_default();
        assert_eq!(
            labels.get("sidecar.istio.io/inject").map(String::as_str),
            Some("false"),
            "what the operator names is applied as written"
        );
    })
    .await;
}

/// Class 4: pods that meet the baseline text and still reach beyond the namespace: a volume
/// the node mounts from the network, a pod placed on a node by name past every taint, a
/// priority class that evicts other tenants, a toleration of every taint, AppArmor switched off
/// by annotation (the form older clusters read), a ReplicationController's pod template, and a
/// claim bound to an existing volume by name. Each refused by path; on main all were applied.
#[tokio::test]
async fn pods_that_reach_other_tenants_nodes_or_volumes_are_refused() {
    const REACHING: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {container.apparmor.security.beta.kubernetes.io/web: unconfined}
    spec:
      nodeName: control-plane-1
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      volumes: [{name: share, nfs: {server: 10.0.0.5, path: /exports}}]
      containers: [{name: web, image: nginx, volumeMounts: [{name: share, mountPath: /data}]}]
---
apiVersion: v1
kind: ReplicationController
metadata: {name: legacy}
spec:
  replicas: 1
  selector: {app: legacy}
  template:
    metadata: {labels: {app: legacy}}
    spec:
      hostNetwork: true
      containers: [{name: legacy, image: nginx}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  volumeName: team-b-database
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
"#;
    in_namespace("policy-pods", |client, ns| async move {
        let _running = support::start_controller_with(
            &client,
            ControllerConfig {
                namespace: Some(ns.clone()),
                template_kinds: support::template_kinds_and(&[json!(
                    {"group": "", "kind": "ReplicationController", "resource": "replicationcontrollers"}
                )]),
                ..Default::default()
            },
        )
        .await;
        create_template_and_environment(&client, &ns, REACHING, json!({})).await;
        assert_refused_naming(&client, &ns, &[
            "Deployment/web (from app.yaml): spec.template.spec.volumes[0] is a nfs volume",
            "spec.template.spec.nodeName is set",
            "spec.template.spec.priorityClassName is \"system-node-critical\"",
            "spec.template.spec.tolerations[0] has no key, so it tolerates every taint",
            "annotation container.apparmor.security.beta.kubernetes.io/web is unconfined",
            "ReplicationController/legacy (from app.yaml): spec.template.spec.hostNetwork is true",
            "PersistentVolumeClaim/data (from app.yaml): spec.volumeName binds an existing PersistentVolume",
        ])
        .await;
    })
    .await;
}

/// Class 5: a kind the operator allows but previewd has no rules for is refused unless the
/// operator declares it inert, and the kinds the chart suggests have rules of their own: an
/// ExternalSecret may not read a cluster-wide store, a Certificate may not be a CA signed by a
/// ClusterIssuer, a route may not attach to another namespace's Gateway. On main each was
/// passed to the API server.
#[tokio::test]
async fn an_operators_kind_without_a_policy_is_refused_and_the_suggested_ones_have_rules() {
    const OPERATOR_KINDS: &str = r#"apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
---
apiVersion: external-secrets.io/v1beta1
kind: ExternalSecret
metadata: {name: db}
spec:
  secretStoreRef: {name: vault, kind: ClusterSecretStore}
  target: {name: db}
  dataFrom: [{extract: {key: production/db}}]
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: ca}
spec:
  isCA: true
  secretName: ca
  dnsNames: ["{{ host }}"]
  issuerRef: {name: corporate-root, kind: ClusterIssuer}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web}
spec:
  parentRefs: [{name: internal, namespace: payments}]
  hostnames: ["{{ host }}"]
  rules: [{backendRefs: [{name: web, port: 80}]}]
"#;
    in_namespace("policy-kinds", |client, ns| async move {
        let extra: Vec<Value> = [
            ("example.com", "Widget", "widgets"),
            ("external-secrets.io", "ExternalSecret", "externalsecrets"),
            ("cert-manager.io", "Certificate", "certificates"),
            ("gateway.networking.k8s.io", "HTTPRoute", "httproutes"),
        ]
        .into_iter()
        .map(|(group, kind, resource)| json!({"group": group, "kind": kind, "resource": resource}))
        .collect();
        let template_kinds = support::template_kinds_and(&extra);
        let _running = support::start_controller_with(
            &client,
            ControllerConfig {
                namespace: Some(ns.clone()),
                template_kinds,
                ..Default::default()
            },
        )
        .await;
        create_template_and_environment(&client, &ns, OPERATOR_KINDS, json!({})).await;
        assert_refused_naming(&client, &ns, &[
            "Widget/w (from app.yaml): previewd has no content policy for kind Widget of group \"example.com\"",
            "inert: true",
            "ExternalSecret/db (from app.yaml): spec.secretStoreRef is ClusterSecretStore \"vault\"",
            "Certificate/ca (from app.yaml): spec.issuerRef is ClusterIssuer \"corporate-root\"",
            "spec.isCA is true",
            "HTTPRoute/web (from app.yaml): spec.parentRefs[0] attaches to payments/internal",
        ])
        .await;
    })
    .await;
}

/// Class 6: the default guard rails hold resources, not only object counts (CPU and memory
/// requests, Jobs and CronJobs; a LimitRange gives a container that says nothing a request, so
/// the quota counts it), and a sleeping environment runs nothing: its CronJob is suspended
/// until it wakes. On main the quota counted objects only, there was no default LimitRange,
/// and a sleeping environment's CronJob kept starting Jobs.
#[tokio::test]
async fn the_default_guard_rails_hold_resources_and_sleep_stops_cron_jobs() {
    const APP: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: report}
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: report, image: busybox}]
"#;
    in_namespace("policy-resources", |client, ns| async move {
        let _running = deploy(&client, &ns, APP, json!({})).await;
        let api = environments(&client, &ns);
        let ready = wait_for_phase(&api, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let target = ready.status.unwrap().namespace.unwrap();

        let quota =
            Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), &target)
                .get("previewd-quota")
                .await
                .unwrap();
        let hard = quota.spec.unwrap().hard.unwrap();
        for held in [
            "requests.cpu",
            "requests.memory",
            "count/jobs.batch",
            "count/cronjobs.batch",
        ] {
            assert!(hard.contains_key(held), "{held} not in the quota: {hard:?}");
        }
        // The pod says nothing about resources; the LimitRange gave it a request the quota counts.
        let pods = Api::<Pod>::namespaced(client.clone(), &target)
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        let requests =
            serde_json::to_value(&pods.items[0].spec.as_ref().unwrap().containers[0].resources)
                .unwrap();
        assert_eq!(
            requests["requests"],
            json!({"cpu": "50m", "memory": "64Mi", "ephemeral-storage": "64Mi"}),
            "{requests}"
        );

        let cron_jobs: Api<kube::api::DynamicObject> = Api::namespaced_with(
            client.clone(),
            &target,
            &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                "batch", "v1", "CronJob",
            )),
        );
        let suspended = |expected: bool| {
            let cron_jobs = cron_jobs.clone();
            async move {
                let job = cron_jobs.get("report").await.ok()?;
                (job.data["spec"]["suspend"].as_bool().unwrap_or(false) == expected).then_some(())
            }
        };
        assert!(suspended(false).await.is_some(), "awake: the CronJob runs");
        api.patch(
            "pr-7",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sleep": true}})),
        )
        .await
        .unwrap();
        wait_for_phase(&api, "pr-7", Phase::Sleeping, Duration::from_secs(60)).await;
        assert!(
            suspended(true).await.is_some(),
            "asleep: the CronJob is suspended"
        );
        api.patch(
            "pr-7",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sleep": false}})),
        )
        .await
        .unwrap();
        wait_for_phase(&api, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        eventually("the CronJob to run again", Duration::from_secs(30), || {
            suspended(false)
        })
        .await;
    })
    .await;
}

/// Class 3, one host per environment: a pull request and a branch environment of the same
/// branch render the same URL host (`{{ slug }}`), and so does another template's environment
/// of that branch. The first to hold it keeps it; the others are refused with `HostTaken`,
/// naming the holder, and apply nothing; each deploys at once when the host is free, whichever
/// template it is of. On main both applied an Ingress for one host, and the ingress controller
/// merged their traffic; and another template's waited for the resync.
#[tokio::test]
async fn two_environments_never_hold_one_url_host() {
    const ROUTED: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  rules:
  - host: "{{ host }}"
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
"#;
    in_namespace("policy-one-host", |client, ns| async move {
        let _running = support::start_controller_with(
            &client,
            ControllerConfig {
                namespace: Some(ns.clone()),
                ..Default::default()
            },
        )
        .await;
        // Two templates that render the same host for a branch: "app" and another team's "other".
        for name in ["app", "other"] {
            let template: PreviewTemplate = serde_json::from_value(json!({
                "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": name},
                "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                         "url": {"host": "{{ slug }}.preview.example.com"},
                         "manifests": {"inline": [{"name": "app.yaml", "template": ROUTED}]}}
            }))
            .unwrap();
            Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &template)
                .await
                .unwrap();
        }
        let api = environments(&client, &ns);
        let environment_of = |name: &str, pull_request: Option<u64>| -> PreviewEnvironment {
            let template = if name.starts_with("other") { "other" } else { "app" };
            serde_json::from_value(json!({
                "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": name},
                "spec": {"template": template, "source": {"repository": "Codertocat/Hello-World", "branch": "feature-x",
                         "pullRequest": pull_request, "headSha": "abc1234"}}
            }))
            .unwrap()
        };
        api.create(&PostParams::default(), &environment_of("pr-7", Some(7))).await.unwrap();
        let first = wait_for_phase(&api, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        assert_eq!(
            first.status.unwrap().host.as_deref(),
            Some("feature-x.preview.example.com")
        );
        api.create(&PostParams::default(), &environment_of("branch-feature-x", None)).await.unwrap();
        let refused = eventually("the second environment refused", Duration::from_secs(60), || async {
            let status = api.get("branch-feature-x").await.ok()?.status?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (ready.reason == "HostTaken").then(|| (ready.message.clone(), status.host.clone()))
        })
        .await;
        assert!(
            refused.0.contains("\"feature-x.preview.example.com\" is held by environment") && refused.0.contains("/pr-7"),
            "{}",
            refused.0
        );
        assert_eq!(refused.1, None, "the refused one holds nothing");
        let selector = format!("previewd.dev/environment=branch-feature-x,previewd.dev/environment-namespace={ns}");
        let namespaces = Api::<Namespace>::all(client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        assert!(namespaces.items.is_empty(), "nothing applied for the second one");

        api.create(&PostParams::default(), &environment_of("other-feature-x", None)).await.unwrap();
        let host_taken = |name: &'static str| {
            let api = api.clone();
            async move {
                let status = api.get(name).await.ok()?.status?;
                status.conditions.iter().any(|c| c.reason == "HostTaken").then_some(())
            }
        };
        eventually("the other template's environment refused too", Duration::from_secs(60), || host_taken("other-feature-x")).await;

        // The holder goes: one of the two deploys at once, not at the next resync (10 minutes);
        // when that one goes too, the last one deploys at once, whichever template it is of.
        api.delete("pr-7", &Default::default()).await.unwrap();
        let mut waiting = vec!["branch-feature-x", "other-feature-x"];
        while !waiting.is_empty() {
            let ready = eventually("one of them Ready", Duration::from_secs(60), || {
                let (api, waiting) = (api.clone(), waiting.clone());
                async move {
                    for name in waiting {
                        let status = api.get(name).await.ok()?.status?;
                        if status.phase == Phase::Ready {
                            assert_eq!(status.host.as_deref(), Some("feature-x.preview.example.com"));
                            return Some(name);
                        }
                    }
                    None
                }
            })
            .await;
            waiting.retain(|name| *name != ready);
            api.delete(ready, &Default::default()).await.unwrap();
        }
    })
    .await;
}
