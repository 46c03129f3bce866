//! Objects that would hold cluster resources past their environment (pure): what a pull request
//! adds must let previewd remove the environment and let the cluster drain its nodes.
//!
//! * A finalizer (on any object, or on a pod template, whose pods inherit it) that nothing in
//!   the environment removes keeps the namespace `Terminating` and the environment's record
//!   forever: volumes leak and the pull request cannot reopen. Finalizers are left to the
//!   controllers that add them.
//! * A PodDisruptionBudget over pods Kubernetes cannot count as replicas (a Job's, a CronJob's,
//!   a bare Pod) allows zero disruptions, whatever it says: it stalls every node drain.
//! * `terminationGracePeriodSeconds` near 2^31 keeps a sleeping or destroyed environment's pods
//!   running: at most the operator's `--max-termination-grace-period` (default 300 s,
//!   `model::grants::DEFAULT_MAX_GRACE_SECONDS`).
//! * Owner references are the garbage collector's: one with `blockOwnerDeletion` holds its
//!   owner's foreground deletion (a Node, another namespace's object), and one whose owner does
//!   not exist makes the collector delete the object, which previewd applies again, without
//!   end. Controllers set their own (a ReplicaSet's on its pods); a template never needs one.

use serde_json::Value;

use super::Violation;
use super::pods;
use crate::model::pod_kinds::{Sleep, pod_kind_named};
use crate::plan::render::RenderedObject;

/// The finalizers `object` or its pod template carries: one sentence each.
pub fn finalizers(kind: &str, object: &Value) -> Vec<String> {
    let mut held = Vec::new();
    let mut said = |at: &str, metadata: &Value| {
        if let Some(list) = metadata["finalizers"].as_array().filter(|l| !l.is_empty()) {
            held.push(format!(
                "{at}.finalizers holds {}: a finalizer that no controller of the environment removes keeps its namespace Terminating and the environment's record forever; leave finalizers to the controllers that add them",
                Value::Array(list.clone())
            ));
        }
    };
    said("metadata", &object["metadata"]);
    if let Some((metadata, _, path)) = pods::pod_template(kind, object)
        && kind != "Pod"
    {
        let at = path.trim_end_matches(".spec");
        said(&format!("{at}.metadata"), metadata);
    }
    held
}

/// The owner references `object` declares itself.
pub fn owner_references(object: &Value) -> Vec<String> {
    let owners = &object["metadata"]["ownerReferences"];
    if owners.as_array().is_some_and(Vec::is_empty) || owners.is_null() {
        return Vec::new();
    }
    vec![format!(
        "metadata.ownerReferences names {owners}: an owner reference holds its owner's deletion (blockOwnerDeletion) or, when the owner is not there, has the garbage collector delete the object previewd applies again, without end; leave owner references to the controllers that set them"
    )]
}

/// A pod spec's grace period beyond `max_seconds`.
pub fn grace_period(spec: &Value, path: &str, max_seconds: u64) -> Vec<String> {
    let grace = &spec["terminationGracePeriodSeconds"];
    let beyond = match grace {
        Value::Null => false,
        Value::Number(n) => n.as_u64().is_none_or(|seconds| seconds > max_seconds),
        _ => true,
    };
    if !beyond {
        return Vec::new();
    }
    vec![format!(
        "{path}.terminationGracePeriodSeconds is {grace}: its pods would keep running that long after the environment sleeps or is removed; at most {max_seconds} (--max-termination-grace-period)"
    )]
}

/// Budgets whose selector may match pods sleep does not scale (a Job, a CronJob, a bare Pod of
/// the render: the kinds whose sleep is not [`Sleep::Replicas`]).
pub fn budgets_over_unscalable(objects: &[RenderedObject]) -> Vec<Violation> {
    let unscalable: Vec<(&RenderedObject, &Value)> = objects
        .iter()
        .filter(|o| pod_kind_named(o.kind()).is_some_and(|k| k.sleep != Sleep::Replicas))
        .filter_map(|o| {
            let (metadata, _, _) = pods::pod_template(o.kind(), &o.object)?;
            Some((o, &metadata["labels"]))
        })
        .collect();
    objects
        .iter()
        .filter(|o| o.kind() == "PodDisruptionBudget")
        .filter_map(|budget| {
            let selector = &budget.object["spec"]["selector"];
            let (pods, _) = unscalable.iter().find(|(_, labels)| selects(selector, labels))?;
            Some(Violation {
                manifest: budget.manifest.clone(),
                kind: budget.kind().to_string(),
                name: budget.name().to_string(),
                reason: format!(
                    "spec.selector may match the pods of {} {:?}, which Kubernetes cannot count as replicas, so the budget allows no disruption and stalls every node drain: select only a Deployment's or StatefulSet's pods",
                    pods.kind(),
                    pods.name()
                ),
            })
        })
        .collect()
}

/// Whether `selector` may select pods labelled `labels` (expressions: assumed to).
fn selects(selector: &Value, labels: &Value) -> bool {
    if !selector["matchExpressions"].is_null() {
        return true;
    }
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(key, value)| labels[key] == *value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rendered(object: Value) -> RenderedObject {
        RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object,
        }
    }

    #[test]
    fn finalizers_on_objects_and_pod_templates_are_named() {
        let map = json!({"metadata": {"name": "a", "finalizers": ["example.com/never"]}});
        assert_eq!(finalizers("ConfigMap", &map).len(), 1);
        let deployment = json!({"metadata": {"name": "web"}, "spec": {"template": {
            "metadata": {"finalizers": ["x/y"]}, "spec": {"containers": []}}}});
        let said = finalizers("Deployment", &deployment);
        assert!(
            said[0].starts_with("spec.template.metadata.finalizers"),
            "{said:?}"
        );
        assert!(finalizers("ConfigMap", &json!({"metadata": {"finalizers": []}})).is_empty());
    }

    #[test]
    fn owner_references_are_refused() {
        let owned = json!({"metadata": {"name": "a", "ownerReferences": [{"apiVersion": "v1",
            "kind": "Node", "name": "n1", "uid": "u", "blockOwnerDeletion": true}]}});
        let said = owner_references(&owned);
        assert!(
            said[0].contains("\"Node\"") && said[0].contains("blockOwnerDeletion"),
            "{said:?}"
        );
        assert!(owner_references(&json!({"metadata": {"ownerReferences": []}})).is_empty());
        assert!(owner_references(&json!({"metadata": {"name": "a"}})).is_empty());
        assert_eq!(
            owner_references(&json!({"metadata": {"ownerReferences": "x"}})).len(),
            1
        );
    }

    #[test]
    fn a_grace_period_is_capped() {
        assert!(
            grace_period(&json!({"terminationGracePeriodSeconds": 30}), "spec", 300).is_empty()
        );
        assert!(grace_period(&json!({}), "spec", 300).is_empty());
        for long in [json!(301), json!(2147483647), json!("30"), json!(-1)] {
            let spec = json!({"terminationGracePeriodSeconds": long});
            assert_eq!(grace_period(&spec, "spec", 300).len(), 1, "{long}");
        }
    }

    #[test]
    fn a_budget_over_a_jobs_pods_is_refused_and_one_over_a_deployments_passes() {
        let job = rendered(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate"},
            "spec": {"template": {"metadata": {"labels": {"app": "migrate"}}, "spec": {"containers": []}}}}),
        );
        let web = rendered(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}}),
        );
        let budget = |labels: Value| {
            rendered(
                json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "b"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}),
            )
        };
        let over_job = budget(json!({"app": "migrate"}));
        let said = budgets_over_unscalable(&[job.clone(), web.clone(), over_job]);
        assert_eq!(said.len(), 1);
        assert!(
            said[0].reason.contains("Job \"migrate\""),
            "{}",
            said[0].reason
        );
        assert!(budgets_over_unscalable(&[job, web, budget(json!({"app": "web"}))]).is_empty());
    }
}
