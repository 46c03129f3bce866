//! The operator's ceiling over what a template may widen (issue 53 §1), against the real API
//! server: a team's template that asks for privileged pods, previewd's own ClusterRole, another
//! team's Ingress host or namespace labels other teams select on is refused before anything of
//! it is applied, every field named with the ceiling; an operator may raise the ceiling, never
//! to previewd's own roles. On the code before the ceiling, the first template deployed.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use previewd::model::ceiling::TemplateCeiling;
use previewd::model::crd::{Phase, PodSecurityLevel, PreviewEnvironment, PreviewTemplate};
use previewd::model::grants::OperatorPolicy;
use previewd::reconcile::ControllerConfig;
use serde_json::{Value, json};
use support::{eventually, in_namespace, ready_reason, wait_for_phase};

const OWN_ROLE: &str = "previewd-environment";

/// A privileged pod that mounts the node's root: root on the node, under `Privileged`.
const ROOT_ON_THE_NODE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: root}\nspec:\n  \
    containers: [{name: c, image: busybox, securityContext: {privileged: true}, \
    volumeMounts: [{name: host, mountPath: /host}]}]\n  volumes: [{name: host, hostPath: {path: /}}]\n";

async fn controller(
    client: &kube::Client,
    namespace: &str,
    ceiling: TemplateCeiling,
) -> support::Running {
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        operator_policy: OperatorPolicy {
            ceiling,
            own_cluster_roles: vec![OWN_ROLE.into()],
            ..Default::default()
        },
        ..Default::default()
    };
    support::start_controller_with(client, config).await
}

/// Template `name` of [`ROOT_ON_THE_NODE`] with `policy` and `namespace` settings, and its
/// environment `<name>-pr-1`.
async fn create(client: &kube::Client, ns: &str, name: &str, policy: Value, namespace: Value) {
    create_of(client, ns, name, policy, namespace, ROOT_ON_THE_NODE).await;
}

/// Template `name` of `manifest` with `policy`, and its environment `<name>-pr-1`.
async fn create_with(client: &kube::Client, ns: &str, name: &str, policy: Value, manifest: &str) {
    create_of(client, ns, name, policy, json!({}), manifest).await;
}

async fn create_of(
    client: &kube::Client,
    ns: &str,
    name: &str,
    policy: Value,
    namespace: Value,
    manifest: &str,
) {
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": name},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "url": {"host": format!("{{{{ slug }}}}.{name}.example.com")},
                 "policy": policy, "namespace": namespace,
                 "manifests": {"inline": [{"name": "app.yaml", "template": manifest}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": format!("{name}-pr-1")},
        "spec": {"template": name, "source": {"repository": "Codertocat/Hello-World",
                 "branch": "feature", "pullRequest": 1, "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821"}}
    }))
    .unwrap();
    Api::<PreviewEnvironment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &environment)
        .await
        .unwrap();
}

/// The Ready condition's message once the environment is refused as beyond the ceiling, after
/// checking that nothing of it was applied (not even its namespace).
async fn beyond_the_ceiling(client: &kube::Client, ns: &str, environment: &str) -> String {
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), ns);
    let reason = "TemplateBeyondCeiling";
    let message = ready_reason(&environments, environment, reason, Duration::from_secs(60)).await;
    let selector =
        format!("previewd.dev/environment={environment},previewd.dev/environment-namespace={ns}");
    let created = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    assert!(
        created.items.is_empty(),
        "nothing is applied, not even the namespace"
    );
    message
}

#[tokio::test]
async fn a_template_cannot_widen_past_the_operators_ceiling() {
    in_namespace("ceiling-default", |client, ns| async move {
        let _running = controller(&client, &ns, TemplateCeiling::default()).await;
        let policy = json!({"podSecurity": "Privileged",
                            "allowedClusterRoles": [OWN_ROLE, "admin"],
                            "allowedIngressHosts": ["shop.other-team.example.com"]});
        let namespace = json!({"labels": {"team": "payments", "kubernetes.io/metadata.name": "kube-system"}});
        create(&client, &ns, "wide", policy, namespace).await;
        let said = beyond_the_ceiling(&client, &ns, "wide-pr-1").await;
        for named in [
            "policy.podSecurity Privileged is below the operator's ceiling Baseline",
            "policy.allowedClusterRoles lists \"previewd-environment\", one of previewd's own ClusterRoles",
            "policy.allowedClusterRoles lists \"admin\", beyond the operator's ceiling (none)",
            "policy.allowedIngressHosts lists \"shop.other-team.example.com\", outside the operator's ceiling (none)",
            "namespace.labels sets \"team\", beyond the operator's ceiling (none)",
            "namespace.labels sets \"kubernetes.io/metadata.name\", a Kubernetes key",
            "--template-ceiling",
        ] {
            assert!(said.contains(named), "{named:?} not in: {said}");
        }
        // The template itself says so, and says it no more once its author narrows it.
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let within = |status: &'static str| {
            let templates = templates.clone();
            async move {
                let template = templates.get("wide").await.ok()?;
                let conditions = template.status?.conditions;
                let condition = conditions.into_iter().find(|c| c.type_ == "WithinCeiling")?;
                (condition.status == status).then_some(condition.message)
            }
        };
        let on_template =
            eventually("WithinCeiling False", Duration::from_secs(30), || within("False")).await;
        assert!(on_template.contains("policy.podSecurity Privileged"), "{on_template}");
        let narrowed = json!({"spec": {"policy": {"podSecurity": "Baseline", "allowedClusterRoles": null,
                                                   "allowedIngressHosts": null},
                                       "namespace": {"labels": null}}});
        templates
            .patch("wide", &PatchParams::default(), &Patch::Merge(&narrowed))
            .await
            .unwrap();
        eventually("WithinCeiling True", Duration::from_secs(60), || within("True")).await;
    })
    .await;
}

#[tokio::test]
async fn an_operator_may_raise_the_ceiling_but_never_to_previewds_own_roles() {
    in_namespace("ceiling-raised", |client, ns| async move {
        let ceiling = TemplateCeiling {
            pod_security: PodSecurityLevel::Privileged,
            cluster_roles: vec![OWN_ROLE.into(), "view".into()],
            ..Default::default()
        };
        let _running = controller(&client, &ns, ceiling).await;
        create(
            &client,
            &ns,
            "privileged",
            json!({"podSecurity": "Privileged"}),
            json!({}),
        )
        .await;
        let policy =
            json!({"podSecurity": "Privileged", "allowedClusterRoles": [OWN_ROLE, "view"]});
        create(&client, &ns, "binding", policy, json!({})).await;
        let said = beyond_the_ceiling(&client, &ns, "binding-pr-1").await;
        assert!(
            said.contains("one of previewd's own ClusterRoles"),
            "{said}"
        );
        assert!(
            !said.contains("\"view\""),
            "the ceiling lets view through: {said}"
        );
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        wait_for_phase(
            &environments,
            "privileged-pr-1",
            Phase::Ready,
            Duration::from_secs(90),
        )
        .await;
    })
    .await;
}

/// An extra Ingress host a template lists (within the operator's ceiling) is claimed like the
/// URL host: the first environment that routes it holds it (`status.extraHosts`), and another
/// team's environment that routes the same host is refused `HostTaken`, nothing applied. On the
/// code before, both deployed an Ingress for it and the controller merged them.
#[tokio::test]
async fn an_extra_ingress_host_is_one_environments_at_a_time() {
    in_namespace("ceiling-hosts", |client, ns| async move {
        let ceiling = TemplateCeiling {
            ingress_hosts: vec!["status.example.com".into()],
            ..Default::default()
        };
        let _running = controller(&client, &ns, ceiling).await;
        let ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: status}\nspec:\n  rules: [{host: status.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]\n";
        let policy = json!({"allowedIngressHosts": ["status.example.com"]});
        create_with(&client, &ns, "first", policy.clone(), ingress).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        eventually("first holds the host", Duration::from_secs(60), || async {
            let status = environments.get("first-pr-1").await.ok()?.status?;
            (status.extra_hosts == ["status.example.com"]).then_some(())
        })
        .await;
        create_with(&client, &ns, "second", policy, ingress).await;
        let said =
            ready_reason(&environments, "second-pr-1", "HostTaken", Duration::from_secs(60)).await;
        assert!(
            said.contains("\"status.example.com\" is held by environment") && said.contains("first-pr-1"),
            "{said}"
        );
    })
    .await;
}

/// A template's `resourceQuota` is capped by the ceiling (by default the default quota's values)
/// and changes values over the default quota, never drops one: a quota of 500 pods is refused,
/// naming the field and the ceiling; a quota that names only `pods` still bounds CPU, memory,
/// the node's disk and load balancers. On the code before, the first was applied as asked and
/// the second replaced the default whole (the Online Boutique example's `pods: "40"` left its
/// environments without any bound on CPU, memory or disk).
#[tokio::test]
async fn a_templates_quota_stays_under_the_ceiling_and_keeps_the_defaults_bounds() {
    in_namespace("ceiling-quota", |client, ns| async move {
        let _running = controller(&client, &ns, TemplateCeiling::default()).await;
        let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: preview}\n";
        let wide = json!({"resourceQuota": {"pods": "500", "limits.ephemeral-storage": "1Ti"}});
        create_of(&client, &ns, "wide", json!({}), wide, config_map).await;
        let said = beyond_the_ceiling(&client, &ns, "wide-pr-1").await;
        for named in [
            "namespace.resourceQuota.pods asks for 500, beyond the operator's ceiling 50",
            "namespace.resourceQuota.limits.ephemeral-storage asks for 1Ti, beyond the operator's ceiling 40Gi",
        ] {
            assert!(said.contains(named), "{named:?} not in: {said}");
        }
        let partial = json!({"resourceQuota": {"pods": "40"}});
        create_of(&client, &ns, "partial", json!({}), partial, config_map).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let ready = wait_for_phase(&environments, "partial-pr-1", Phase::Ready, Duration::from_secs(60)).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let quota = Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), &target)
            .get("previewd-quota")
            .await
            .unwrap();
        let hard = quota.spec.unwrap().hard.unwrap_or_default();
        let held = |resource: &str| hard.get(resource).map(|q| q.0.clone());
        assert_eq!(held("pods").as_deref(), Some("40"));
        for (resource, quantity) in [
            ("requests.cpu", "8"),
            ("requests.memory", "16Gi"),
            ("requests.ephemeral-storage", "20Gi"),
            ("limits.ephemeral-storage", "40Gi"),
            ("services.loadbalancers", "0"),
        ] {
            assert_eq!(held(resource).as_deref(), Some(quantity), "{resource} in {hard:?}");
        }
    })
    .await;
}
