//! What previewd changes in the template's workloads before applying them (pure): the replica
//! count while the environment sleeps and after it wakes, CronJobs suspended while it sleeps,
//! and the restart annotation of `/preview deploy`.
//!
//! Sleep scales every workload to zero (Deployments, StatefulSets, ReplicaSets,
//! ReplicationControllers), suspends every CronJob, and remembers, per `Kind/name`, how many replicas it had
//! (in `status.replicasBeforeSleep`). Waking gives a workload its template's replica count when
//! the template sets one (the template stays the truth), else the remembered count. A workload
//! whose count previewd restored keeps it on later applies, since dropping the field would let
//! the API server default it to 1.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::kinds::group_of;
use crate::model::pod_kinds::{Sleep, pod_kind};
use crate::plan::render::RenderedObject;

/// Pod-template annotation that `/preview deploy` changes, so every workload rolls out anew.
pub const ANNOTATION_REDEPLOY: &str = "previewd.dev/redeploy";

/// `Deployment/web` for everything built in that runs pods by a replica count (the kinds whose
/// sleep is [`Sleep::Replicas`], at their version: an `apps/v1` Deployment, StatefulSet or
/// ReplicaSet, a `v1` ReplicationController); `None` for anything else.
pub fn workload_key(object: &Value) -> Option<String> {
    let kind = object["kind"].as_str()?;
    let api_version = object["apiVersion"].as_str()?;
    let is_workload =
        sleep_of(api_version, kind, true) == Some(Sleep::Replicas) && object["spec"].is_object();
    is_workload.then(|| {
        format!(
            "{kind}/{}",
            object["metadata"]["name"].as_str().unwrap_or("")
        )
    })
}

/// Adjusts the workloads of `objects` for the environment's state and returns the replica
/// counts to remember in the status.
///
/// * `sleeping`: every workload gets `replicas: 0`; the count remembered for it is the one
///   remembered before (it was asleep already), else its live count (`live_replicas`, when
///   above zero), else its template's, else 1.
/// * awake: a workload whose template sets no replica count gets the remembered one.
/// * `redeploy`: the token of the last `/preview deploy`, written into every pod template.
pub fn prepare(
    objects: &mut [RenderedObject],
    sleeping: bool,
    remembered: &BTreeMap<String, i32>,
    live_replicas: impl Fn(&Value) -> Option<i32>,
    redeploy: Option<&str>,
) -> BTreeMap<String, i32> {
    let mut remember = BTreeMap::new();
    for rendered in objects.iter_mut() {
        if sleeping && is_suspended_asleep(&rendered.object) {
            // Suspended while asleep; on waking the manifest no longer sets the field, so the
            // template's own value (or the default, not suspended) comes back.
            rendered.object["spec"]["suspend"] = Value::Bool(true);
        }
        let Some(key) = workload_key(&rendered.object) else {
            continue;
        };
        let template_replicas = rendered.object["spec"]["replicas"]
            .as_i64()
            .and_then(|n| i32::try_from(n).ok());
        if sleeping {
            let before = remembered
                .get(&key)
                .copied()
                .or_else(|| live_replicas(&rendered.object).filter(|n| *n > 0))
                .or(template_replicas)
                .unwrap_or(1);
            remember.insert(key, before);
            rendered.object["spec"]["replicas"] = Value::from(0);
        } else if template_replicas.is_none()
            && let Some(before) = remembered.get(&key)
        {
            remember.insert(key, *before);
            rendered.object["spec"]["replicas"] = Value::from(*before);
        }
        if let Some(token) = redeploy {
            mark_redeploy(&mut rendered.object, token);
        }
    }
    remember
}

/// Writes the redeploy token into the workload's pod template. Each level is checked to be an
/// object first: assigning into a JSON string or number by index panics. (The policy has
/// refused a workload whose pod template is not an object already; this only guards.)
fn mark_redeploy(object: &mut Value, token: &str) {
    let Some(template) = object
        .get_mut("spec")
        .and_then(|spec| spec.get_mut("template"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let metadata = template
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(annotations) = annotations.as_object_mut() {
        annotations.insert(ANNOTATION_REDEPLOY.to_string(), Value::from(token));
    }
}

/// A kind whose sleep suspends it (a CronJob), of any version of its group.
fn is_suspended_asleep(object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    sleep_of(api_version, kind, false) == Some(Sleep::Suspend) && object["spec"].is_object()
}

/// How sleep holds `kind` at `api_version` (`exact`: only at the version the table names).
fn sleep_of(api_version: &str, kind: &str, exact: bool) -> Option<Sleep> {
    let listed = pod_kind(group_of(api_version), kind)?;
    (!exact || listed.api_version == api_version).then_some(listed.sleep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: &str, name: &str, replicas: Option<i64>) -> RenderedObject {
        let mut spec = json!({"template": {"spec": {"containers": []}}});
        if let Some(n) = replicas {
            spec["replicas"] = json!(n);
        }
        RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object: json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}),
        }
    }

    fn config_map() -> RenderedObject {
        RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        }
    }

    fn replicas(objects: &[RenderedObject]) -> Vec<Option<i64>> {
        objects
            .iter()
            .map(|o| o.object["spec"]["replicas"].as_i64())
            .collect()
    }

    #[test]
    fn sleep_scales_to_zero_and_remembers_live_then_template_counts() {
        let mut objects = vec![
            object("Deployment", "web", Some(2)),
            object("StatefulSet", "db", None),
            object("Deployment", "worker", None),
            config_map(),
        ];
        // `web` was scaled to 3 by hand; `db` runs 1; `worker` is not observed yet.
        let live = |o: &Value| match o["metadata"]["name"].as_str() {
            Some("web") => Some(3),
            Some("db") => Some(1),
            _ => None,
        };
        let remembered = prepare(&mut objects, true, &BTreeMap::new(), live, None);
        assert_eq!(replicas(&objects), [Some(0), Some(0), Some(0), None]);
        assert_eq!(
            remembered,
            BTreeMap::from([
                ("Deployment/web".to_string(), 3),
                ("StatefulSet/db".to_string(), 1),
                ("Deployment/worker".to_string(), 1),
            ])
        );
        // Asleep already: live counts are 0 now, the remembered ones stay.
        let mut again = vec![object("Deployment", "web", Some(2))];
        let kept = prepare(&mut again, true, &remembered, |_| Some(0), None);
        assert_eq!(kept["Deployment/web"], 3);
    }

    #[test]
    fn waking_restores_remembered_counts_where_the_template_sets_none() {
        let remembered = BTreeMap::from([
            ("Deployment/web".to_string(), 3),
            ("StatefulSet/db".to_string(), 2),
        ]);
        let mut objects = vec![
            object("Deployment", "web", Some(2)),
            object("StatefulSet", "db", None),
        ];
        let kept = prepare(&mut objects, false, &remembered, |_| None, None);
        assert_eq!(replicas(&objects), [Some(2), Some(2)], "the template wins");
        assert_eq!(kept, BTreeMap::from([("StatefulSet/db".to_string(), 2)]));
    }

    #[test]
    fn sleep_stops_everything_that_runs_pods_by_count_or_schedule() {
        let rendered = |api_version: &str, kind: &str, spec: Value| RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object: json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": spec}),
        };
        let template = json!({"template": {"spec": {"containers": []}}});
        let mut objects = vec![
            rendered("apps/v1", "ReplicaSet", template.clone()),
            rendered("v1", "ReplicationController", template.clone()),
            rendered(
                "batch/v1",
                "CronJob",
                json!({"schedule": "* * * * *", "jobTemplate": {}}),
            ),
            rendered("example.com/v1", "CronJob", json!({"schedule": "x"})),
        ];
        let remembered = prepare(&mut objects, true, &BTreeMap::new(), |_| Some(2), None);
        assert_eq!(objects[0].object["spec"]["replicas"], 0);
        assert_eq!(objects[1].object["spec"]["replicas"], 0);
        assert_eq!(objects[2].object["spec"]["suspend"], true);
        assert_eq!(
            objects[3].object["spec"]["suspend"],
            Value::Null,
            "not batch's"
        );
        assert_eq!(remembered.len(), 2, "{remembered:?}");
        let mut awake = vec![rendered(
            "batch/v1",
            "CronJob",
            json!({"schedule": "* * * * *"}),
        )];
        prepare(&mut awake, false, &remembered, |_| None, None);
        assert_eq!(
            awake[0].object["spec"]["suspend"],
            Value::Null,
            "the template's own value"
        );
    }

    #[test]
    fn redeploy_marks_every_pod_template_and_nothing_else() {
        let mut objects = vec![object("Deployment", "web", None), config_map()];
        prepare(
            &mut objects,
            false,
            &BTreeMap::new(),
            |_| None,
            Some("2026-11-22T10:00:00Z"),
        );
        assert_eq!(
            objects[0].object["spec"]["template"]["metadata"]["annotations"][ANNOTATION_REDEPLOY],
            "2026-11-22T10:00:00Z"
        );
        assert_eq!(objects[0].object["spec"]["replicas"], Value::Null);
        assert!(objects[1].object.get("spec").is_none());
    }
}
