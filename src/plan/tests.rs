//! The plan step from small YAML fixtures, without an API server.

use serde_json::Value;

use super::{Limits, Manifests, Plan, plan};
use super::{RefusalReason, Refused};
use crate::model::crd::PreviewEnvironment;
use crate::plan::test_support::{WEB_ENVIRONMENT, WEB_TEMPLATE, environment, template};

const NAMESPACE: &str = "preview-team-a-web-pr-2-abc123";

/// Plans the environment of [`WEB_ENVIRONMENT`] (adjusted by `adjust`) from `template_yaml`.
fn plan_web(
    template_yaml: &str,
    max_objects: usize,
    adjust: impl FnOnce(&mut PreviewEnvironment),
    live_replicas: impl Fn(&Value) -> Option<i32>,
) -> Result<Plan, Refused> {
    let template = template(template_yaml);
    let mut environment = environment(WEB_ENVIRONMENT);
    adjust(&mut environment);
    let manifests = Manifests {
        templates: template.spec.manifests.inline.clone(),
        rendered: Vec::new(),
    };
    plan(
        &environment,
        &template,
        &manifests,
        NAMESPACE,
        &Limits {
            max_objects,
            max_bytes: super::DEFAULT_MAX_BYTES,
            kinds: Default::default(),
            operator: Default::default(),
            gate_answers: false,
        },
        live_replicas,
    )
}

fn awake(_: &mut PreviewEnvironment) {}

fn no_live_replicas(_: &Value) -> Option<i32> {
    None
}

#[test]
fn a_template_becomes_labelled_objects_in_the_environments_namespace() {
    let plan =
        plan_web(WEB_TEMPLATE, 500, awake, no_live_replicas).expect("the web template plans");
    // The branch `feature/login` is not a DNS label as it is: its slug carries a hash, so that
    // the branch `feature-login` gets another host.
    assert_eq!(
        plan.url,
        "https://feature-login--cf177a026a20e1f8.preview.example.com"
    );
    let names: Vec<(&str, &str, i32)> = plan
        .objects
        .iter()
        .map(|o| (o.kind(), o.name(), o.wave))
        .collect();
    assert_eq!(
        names,
        [("ConfigMap", "settings", 0), ("Deployment", "web", 1)]
    );
    for object in &plan.objects {
        assert_eq!(object.object["metadata"]["namespace"], NAMESPACE);
        let labels = &object.object["metadata"]["labels"];
        assert_eq!(labels["previewd.dev/environment"], "web-pr-2");
        assert_eq!(labels["previewd.dev/environment-namespace"], "team-a");
        assert_eq!(labels["previewd.dev/template"], "web");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "previewd");
    }
    assert_eq!(plan.objects[0].object["data"]["sha"], "ec26c3e");
    assert_eq!(plan.labels["previewd.dev/environment"], "web-pr-2");
    assert!(
        plan.replicas_before_sleep.is_empty(),
        "awake: nothing to remember"
    );
}

#[test]
fn a_render_error_is_refused_with_the_manifest_and_line() {
    let broken = WEB_TEMPLATE.replace("{{ short_sha }}\", url", "{{ no_such_value }}\", url");
    let refusal =
        plan_web(&broken, 500, awake, no_live_replicas).expect_err("an undefined value is refused");
    assert_eq!(refusal.reason, RefusalReason::RenderFailed);
    assert!(
        refusal.message.starts_with("web.yaml line 4: "),
        "{}",
        refusal.message
    );
}

#[test]
fn more_objects_than_the_limit_are_refused_and_nothing_is_planned() {
    let refusal = plan_web(WEB_TEMPLATE, 1, awake, no_live_replicas)
        .expect_err("two objects are over a limit of one");
    assert_eq!(refusal.reason, RefusalReason::TooManyObjects);
    assert!(
        refusal
            .message
            .contains("renders 2 objects, more than the limit of 1")
    );
}

#[test]
fn the_guard_refuses_a_cluster_scoped_object_and_names_it() {
    let hostile = WEB_TEMPLATE.replace(
        "          ---\n          apiVersion: apps/v1",
        "          ---\n          apiVersion: rbac.authorization.k8s.io/v1\n          kind: ClusterRoleBinding\n          metadata: {name: take-over}\n          roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n          subjects: [{kind: ServiceAccount, name: default, namespace: team-a}]\n          ---\n          apiVersion: apps/v1",
    );
    let refusal = plan_web(&hostile, 500, awake, no_live_replicas)
        .expect_err("a ClusterRoleBinding is refused");
    assert_eq!(refusal.reason, RefusalReason::GuardRejected);
    assert!(
        refusal
            .message
            .contains("ClusterRoleBinding/take-over (from web.yaml)"),
        "{}",
        refusal.message
    );
}

#[test]
fn a_sleeping_environment_plans_zero_replicas_and_remembers_the_live_count() {
    let asleep = |environment: &mut PreviewEnvironment| environment.spec.sleep = true;
    let live = |object: &Value| (object["kind"] == "Deployment").then_some(3);
    let plan = plan_web(WEB_TEMPLATE, 500, asleep, live).expect("plans");
    assert_eq!(plan.objects[1].object["spec"]["replicas"], 0);
    assert_eq!(plan.replicas_before_sleep["Deployment/web"], 3);
}
