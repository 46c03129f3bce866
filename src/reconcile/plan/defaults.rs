//! Kubernetes' own defaults that server-side apply needs before the API server fills them in:
//! a port's `protocol` is part of the key of a Service's `spec.ports` and of a container's
//! `ports`, and some API servers (1.20's, the sandbox's, among them) refuse an applied list
//! element without it ("associative list with keys has an element that omits key field
//! \"protocol\""), as `kubectl apply --server-side` fails there too. Charts and manifests rarely write `protocol: TCP`, since
//! client-side apply never needed it; previewd writes Kubernetes' default (`TCP`) where a port
//! names none, so they deploy on every supported version. Nothing is changed that the API
//! server would not have set itself.

use serde_json::Value;

use super::render::RenderedObject;

/// Kubernetes' default protocol of a port.
pub const DEFAULT_PROTOCOL: &str = "TCP";

/// Gives every port of every Service and every container of every workload a protocol, where it
/// names none.
pub fn fill(objects: &mut [RenderedObject]) {
    for rendered in objects {
        let kind = rendered.kind().to_string();
        if kind == "Service" {
            name_protocols(rendered.object.pointer_mut("/spec/ports"));
        }
        let Some(path) = pod_spec_pointer(&kind) else {
            continue;
        };
        let Some(spec) = rendered.object.pointer_mut(path) else {
            continue;
        };
        for field in ["containers", "initContainers"] {
            let containers = spec.get_mut(field).and_then(Value::as_array_mut);
            for container in containers.into_iter().flatten() {
                name_protocols(container.get_mut("ports"));
            }
        }
    }
}

/// Where the pod spec of a workload of `kind` is.
fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some("/spec/template/spec"),
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

fn name_protocols(ports: Option<&mut Value>) {
    let Some(ports) = ports.and_then(Value::as_array_mut) else {
        return;
    };
    for port in ports.iter_mut().filter_map(Value::as_object_mut) {
        port.entry("protocol")
            .or_insert_with(|| Value::String(DEFAULT_PROTOCOL.into()));
    }
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
    fn ports_without_a_protocol_get_kubernetes_default_and_others_keep_theirs() {
        let mut objects = vec![
            rendered(
                json!({"kind": "Service", "spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}}),
            ),
            rendered(
                json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {
                "initContainers": [{"name": "i", "ports": [{"containerPort": 1}]}],
                "containers": [{"name": "c", "ports": [{"containerPort": 8080}]}]}}}}}}),
            ),
            // Shapes the API server will refuse are left for it to say so, never a panic.
            rendered(json!({"kind": "Deployment", "spec": "nonsense"})),
            rendered(json!({"kind": "Service", "spec": {"ports": ["x", 1]}})),
            rendered(json!({"kind": "ConfigMap", "data": {"ports": "[]"}})),
        ];
        fill(&mut objects);
        assert_eq!(
            objects[0].object["spec"]["ports"],
            json!([{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}])
        );
        let pod = &objects[1].object["spec"]["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(pod["initContainers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(objects[2].object["spec"], "nonsense");
        assert_eq!(objects[3].object["spec"]["ports"], json!(["x", 1]));
        assert_eq!(objects[4].object["data"], json!({"ports": "[]"}));
    }
}
