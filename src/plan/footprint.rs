//! What the environment's pods request while awake (pure), from the objects previewd applies:
//! each workload's pod template times its replica count (asleep: the count it wakes to), each
//! bare Pod once. A container that requests nothing is counted with what the namespace's
//! LimitRange gives it, as the API server admits it; a container with a limit but no request
//! requests its limit. A pod requests the larger of its containers' sum and its largest init
//! container. Jobs and CronJobs (seeds, schedules) run for a while and stop, and are left out.

use std::collections::BTreeMap;

use serde_json::Value;

use super::render::RenderedObject;
use super::workloads::workload_key;
use crate::model::footprint::Requests;
use crate::model::quantity;

/// What a container that requests nothing is given: `(cpu, memory)` quantities.
pub type ContainerDefaults = (Option<String>, Option<String>);

/// The requests of `objects` while awake. `asleep_counts` are the replica counts workloads wake
/// to (`status.replicasBeforeSleep`), used when `asleep`.
pub fn requested(
    objects: &[RenderedObject],
    defaults: &ContainerDefaults,
    asleep: bool,
    asleep_counts: &BTreeMap<String, i32>,
) -> Requests {
    let mut total = Requests::default();
    for rendered in objects {
        let object = &rendered.object;
        let (pod, count) = match workload_key(object) {
            Some(key) => {
                let declared = object["spec"]["replicas"].as_i64().unwrap_or(1);
                let count = match asleep {
                    true => asleep_counts.get(&key).map_or(declared, |n| i64::from(*n)),
                    false => declared,
                };
                (&object["spec"]["template"]["spec"], count)
            }
            None if object["apiVersion"] == "v1" && object["kind"] == "Pod" => (&object["spec"], 1),
            None => continue,
        };
        let count = u64::try_from(count).unwrap_or(0);
        let per_pod = pod_requests(pod, defaults);
        total.cpu_millicores = total
            .cpu_millicores
            .saturating_add(per_pod.cpu_millicores.saturating_mul(count));
        total.memory_bytes = total
            .memory_bytes
            .saturating_add(per_pod.memory_bytes.saturating_mul(count));
    }
    total
}

/// One pod's requests: its containers' sum, or its largest init container if that is larger.
fn pod_requests(pod: &Value, defaults: &ContainerDefaults) -> Requests {
    let containers = |field: &str| -> Vec<Requests> {
        pod[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|container| container_requests(container, defaults))
            .collect()
    };
    let running = containers("containers");
    let init = containers("initContainers");
    let sum = |pick: fn(&Requests) -> u64| running.iter().map(pick).fold(0u64, u64::saturating_add);
    let max = |pick: fn(&Requests) -> u64| init.iter().map(pick).max().unwrap_or(0);
    Requests {
        cpu_millicores: sum(|r| r.cpu_millicores).max(max(|r| r.cpu_millicores)),
        memory_bytes: sum(|r| r.memory_bytes).max(max(|r| r.memory_bytes)),
    }
}

fn container_requests(container: &Value, defaults: &ContainerDefaults) -> Requests {
    let resources = &container["resources"];
    // A quantity is a string, or a YAML number (`cpu: 2`) that reached us as a JSON number.
    let text = |value: &Value| match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let read = |resource: &str, default: &Option<String>, parse: fn(&str) -> Option<u64>| {
        text(&resources["requests"][resource])
            .or_else(|| text(&resources["limits"][resource]))
            .and_then(|q| parse(&q))
            // What previewd cannot read, it counts as the default rather than as nothing.
            .or_else(|| default.as_deref().and_then(parse))
            .unwrap_or(0)
    };
    Requests {
        cpu_millicores: read("cpu", &defaults.0, quantity::millis),
        memory_bytes: read("memory", &defaults.1, quantity::units),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(object: Value) -> RenderedObject {
        RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object,
        }
    }

    fn defaults() -> ContainerDefaults {
        (Some("50m".into()), Some("64Mi".into()))
    }

    fn app() -> Vec<RenderedObject> {
        vec![
            object(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"replicas": 2, "template": {"spec": {
                    "initContainers": [{"name": "migrate", "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
                    "containers": [
                        {"name": "web", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
                        {"name": "sidecar"}]}}}}),
            ),
            object(
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "db", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}}}}),
            ),
            object(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug"},
                "spec": {"containers": [{"name": "debug", "resources": {"requests": {"cpu": 0.1, "memory": 33554432}}}]}}),
            ),
            object(
                json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "seed"},
                "spec": {"template": {"spec": {"containers": [{"name": "seed", "resources": {"requests": {"cpu": "4"}}}]}}}}),
            ),
            object(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "config"}}),
            ),
        ]
    }

    #[test]
    fn pods_request_what_the_api_server_would_admit_them_with() {
        let requests = requested(&app(), &defaults(), false, &BTreeMap::new());
        // web: 2 x max(250m + 50m (sidecar's default), init 1) = 2 x 1000m; memory 2 x (256 + 64) Mi.
        // db: its limits as requests, 1 replica; debug: 0.1 and 33554432 written as YAML
        // numbers (100m, 32Mi); the Job is left out.
        assert_eq!(requests.cpu_millicores, 2000 + 500 + 100);
        assert_eq!(requests.memory_bytes, (2 * 320 + 1024 + 32) << 20);
    }

    #[test]
    fn asleep_the_footprint_is_what_the_workloads_wake_to() {
        let mut objects = app();
        objects[0].object["spec"]["replicas"] = json!(0);
        objects[1].object["spec"]["replicas"] = json!(0);
        let counts = BTreeMap::from([
            ("Deployment/web".to_string(), 3),
            ("StatefulSet/db".to_string(), 1),
        ]);
        let requests = requested(&objects, &defaults(), true, &counts);
        assert_eq!(requests.cpu_millicores, 3000 + 500 + 100);
    }
}
