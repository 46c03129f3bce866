//! The documented rewrite that lets manifests written for current Kubernetes run on the 1.20
//! sandbox control plane. It is applied by the sandbox and the tests only; previewd itself
//! sends manifests as the template renders them.
//!
//! Two differences matter for real applications such as the Online Boutique fixture:
//! * gRPC probes (`livenessProbe.grpc`, GA in 1.27) do not exist in 1.20: each becomes a TCP
//!   probe on the same port, which checks that the server listens, as near as 1.20 gets;
//! * under server-side apply, 1.20 requires `protocol` on every container and service port (it
//!   is part of the list's merge key): each port without one gets the default, `TCP`.

use serde_json::{Map, Value};

/// Rewrites one object (any kind) in place; returns how many changes it made.
pub fn adapt_for_1_20(object: &mut Value) -> usize {
    let mut changes = 0;
    walk(object, None, &mut changes);
    changes
}

fn walk(value: &mut Value, key: Option<&str>, changes: &mut usize) {
    match value {
        Value::Object(map) => {
            if key.is_some_and(|k| k.ends_with("Probe")) {
                grpc_probe_to_tcp(map, changes);
            }
            for (child_key, child) in map.iter_mut() {
                walk(child, Some(child_key), changes);
            }
        }
        Value::Array(items) => {
            let is_port_list = key == Some("ports");
            for item in items.iter_mut() {
                if is_port_list && let Value::Object(port) = item {
                    add_default_protocol(port, changes);
                }
                walk(item, None, changes);
            }
        }
        _ => {}
    }
}

fn grpc_probe_to_tcp(probe: &mut Map<String, Value>, changes: &mut usize) {
    if let Some(grpc) = probe.remove("grpc") {
        let port = grpc.get("port").cloned().unwrap_or(Value::Null);
        probe.insert("tcpSocket".into(), serde_json::json!({ "port": port }));
        *changes += 1;
    }
}

fn add_default_protocol(port: &mut Map<String, Value>, changes: &mut usize) {
    let is_port = port.contains_key("containerPort") || port.contains_key("port");
    if is_port && !port.contains_key("protocol") {
        port.insert("protocol".into(), Value::String("TCP".into()));
        *changes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn grpc_probes_become_tcp_probes_on_the_same_port() {
        let mut deployment = json!({"spec": {"template": {"spec": {"containers": [{
            "name": "server",
            "ports": [{"containerPort": 9555}],
            "readinessProbe": {"grpc": {"port": 9555}, "periodSeconds": 5},
            "livenessProbe": {"grpc": {"port": 9555}}
        }]}}}});
        assert_eq!(adapt_for_1_20(&mut deployment), 3);
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["readinessProbe"],
            json!({"tcpSocket": {"port": 9555}, "periodSeconds": 5})
        );
        assert_eq!(
            container["livenessProbe"],
            json!({"tcpSocket": {"port": 9555}})
        );
        assert_eq!(container["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn explicit_protocols_and_http_probes_are_left_alone() {
        let mut service = json!({"spec": {"ports": [{"port": 53, "protocol": "UDP"}]},
            "x": {"livenessProbe": {"httpGet": {"path": "/", "port": 8080}}}});
        let before = service.clone();
        assert_eq!(adapt_for_1_20(&mut service), 0);
        assert_eq!(service, before);
    }
}
