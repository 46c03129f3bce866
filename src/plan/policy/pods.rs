//! The Kubernetes Pod Security Standards (pure), checked on every pod template a rendered object
//! carries, so that a manifest from a pull request cannot run a privileged pod, mount the
//! node's filesystem or join its network. The rules follow
//! <https://kubernetes.io/docs/concepts/security/pod-security-standards/>; clusters from 1.23
//! enforce the same level through the namespace label, older ones only through this check.

use serde_json::Value;

use crate::model::crd::PodSecurityLevel;
use crate::model::pod_kinds::pod_kind_named;

/// Capabilities the baseline level allows to add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls the baseline level allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types the baseline level allows.
const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume types the restricted level allows (and every level but `Privileged`, see
/// [`super::reach`]).
pub const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The pod template inside an object of `kind`: its metadata, its spec and the spec's path.
/// Every built-in kind that carries one ([`POD_KINDS`](crate::model::pod_kinds::POD_KINDS)).
pub fn pod_template<'a>(
    kind: &str,
    object: &'a Value,
) -> Option<(&'a Value, &'a Value, &'static str)> {
    let kind = pod_kind_named(kind)?;
    let template = kind.template.iter().fold(object, |at, key| &at[*key]);
    let spec = &template["spec"];
    spec.is_object()
        .then_some((&template["metadata"], spec, kind.spec_path))
}

/// What `spec` (at `path`) breaks of `level`: one sentence per rule, naming the field.
pub fn check(spec: &Value, path: &str, level: PodSecurityLevel) -> Vec<String> {
    let mut broken = Vec::new();
    if level == PodSecurityLevel::Privileged {
        return broken;
    }
    baseline_pod(spec, path, &mut broken);
    for (field, container) in containers(spec) {
        let at = format!("{path}.{field}");
        baseline_container(container, &at, &mut broken);
        if level == PodSecurityLevel::Restricted {
            restricted_container(spec, container, &at, &mut broken);
        }
    }
    if level == PodSecurityLevel::Restricted {
        restricted_volumes(spec, path, &mut broken);
    }
    broken
}

/// Every container with its field path (`containers[0]`, `initContainers[1]`, …).
fn containers(spec: &Value) -> Vec<(String, &Value)> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| {
            spec[*list]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(move |(i, c)| (format!("{list}[{i}]"), c))
        })
        .collect()
}

fn is_true(value: &Value) -> bool {
    value.as_bool() == Some(true)
}

fn baseline_pod(spec: &Value, path: &str, broken: &mut Vec<String>) {
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if is_true(&spec[host]) {
            broken.push(format!(
                "{path}.{host} is true: the node's namespaces are not for previews (baseline)"
            ));
        }
    }
    for (i, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        if !volume["hostPath"].is_null() {
            broken.push(format!(
                "{path}.volumes[{i}] mounts hostPath {}: the node's filesystem is not for previews (baseline)",
                volume["hostPath"]["path"]
            ));
        }
    }
    let security = &spec["securityContext"];
    for sysctl in security["sysctls"].as_array().into_iter().flatten() {
        let name = sysctl["name"].as_str().unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&name) {
            broken.push(format!(
                "{path}.securityContext.sysctls sets {name:?}, not one of the safe sysctls (baseline)"
            ));
        }
    }
    baseline_security_context(security, &format!("{path}.securityContext"), broken);
}

fn baseline_container(container: &Value, at: &str, broken: &mut Vec<String>) {
    let security = &container["securityContext"];
    if is_true(&security["privileged"]) {
        broken.push(format!(
            "{at}.securityContext.privileged is true (baseline)"
        ));
    }
    for added in security["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let capability = added.as_str().unwrap_or_default();
        let name = capability.trim_start_matches("CAP_");
        if !BASELINE_CAPABILITIES.contains(&name) {
            broken.push(format!(
                "{at}.securityContext.capabilities.add has {capability} (baseline allows only the default set)"
            ));
        }
    }
    let proc_mount = security["procMount"].as_str().unwrap_or("Default");
    if proc_mount != "Default" {
        broken.push(format!(
            "{at}.securityContext.procMount is {proc_mount} (baseline)"
        ));
    }
    for (i, port) in container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
            broken.push(format!("{at}.ports[{i}].hostPort is set (baseline)"));
        }
    }
    baseline_security_context(security, &format!("{at}.securityContext"), broken);
    probe_hosts(container, at, broken);
}

/// Probes and lifecycle hooks without a `host` (Pod Security Baseline since Kubernetes 1.34):
/// with one, the kubelet sends the request from the node's network to any address.
fn probe_hosts(container: &Value, at: &str, broken: &mut Vec<String>) {
    let handlers = [
        ("livenessProbe", &container["livenessProbe"]),
        ("readinessProbe", &container["readinessProbe"]),
        ("startupProbe", &container["startupProbe"]),
        ("lifecycle.postStart", &container["lifecycle"]["postStart"]),
        ("lifecycle.preStop", &container["lifecycle"]["preStop"]),
    ];
    for (name, handler) in handlers {
        for action in ["httpGet", "tcpSocket"] {
            let host = &handler[action]["host"];
            if host.as_str().is_none_or(|h| !h.is_empty()) && !host.is_null() {
                broken.push(format!(
                    "{at}.{name}.{action}.host is set: the kubelet would send it from the node's network (baseline)"
                ));
            }
        }
    }
}

/// The rules that apply to the pod's and each container's securityContext alike.
fn baseline_security_context(security: &Value, at: &str, broken: &mut Vec<String>) {
    if security["seccompProfile"]["type"].as_str() == Some("Unconfined") {
        broken.push(format!("{at}.seccompProfile.type is Unconfined (baseline)"));
    }
    if let Some(kind) = security["appArmorProfile"]["type"].as_str()
        && kind == "Unconfined"
    {
        broken.push(format!(
            "{at}.appArmorProfile.type is Unconfined (baseline)"
        ));
    }
    let selinux = &security["seLinuxOptions"];
    if let Some(kind) = selinux["type"].as_str()
        && !kind.is_empty()
        && !SELINUX_TYPES.contains(&kind)
    {
        broken.push(format!("{at}.seLinuxOptions.type is {kind} (baseline)"));
    }
    for field in ["user", "role"] {
        if selinux[field].as_str().is_some_and(|v| !v.is_empty()) {
            broken.push(format!("{at}.seLinuxOptions.{field} is set (baseline)"));
        }
    }
    if is_true(&security["windowsOptions"]["hostProcess"]) {
        broken.push(format!(
            "{at}.windowsOptions.hostProcess is true (baseline)"
        ));
    }
}

fn restricted_container(spec: &Value, container: &Value, at: &str, broken: &mut Vec<String>) {
    let security = &container["securityContext"];
    let pod_security = &spec["securityContext"];
    if security["allowPrivilegeEscalation"].as_bool() != Some(false) {
        broken.push(format!(
            "{at}.securityContext.allowPrivilegeEscalation must be false (restricted)"
        ));
    }
    let non_root = security["runAsNonRoot"]
        .as_bool()
        .or(pod_security["runAsNonRoot"].as_bool());
    if non_root != Some(true) {
        broken.push(format!(
            "{at}: runAsNonRoot must be true, on the container or the pod (restricted)"
        ));
    }
    if security["runAsUser"].as_i64() == Some(0) || pod_security["runAsUser"].as_i64() == Some(0) {
        broken.push(format!("{at}: runAsUser is 0 (restricted)"));
    }
    let seccomp = security["seccompProfile"]["type"]
        .as_str()
        .or(pod_security["seccompProfile"]["type"].as_str());
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        broken.push(format!(
            "{at}: seccompProfile.type must be RuntimeDefault or Localhost, on the container or the pod (restricted)"
        ));
    }
    let capabilities = &security["capabilities"];
    let drops_all = capabilities["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL")));
    if !drops_all {
        broken.push(format!(
            "{at}.securityContext.capabilities.drop must include ALL (restricted)"
        ));
    }
    for added in capabilities["add"].as_array().into_iter().flatten() {
        if added.as_str() != Some("NET_BIND_SERVICE") {
            broken.push(format!(
                "{at}.securityContext.capabilities.add has {added} (restricted allows only NET_BIND_SERVICE)"
            ));
        }
    }
}

fn restricted_volumes(spec: &Value, path: &str, broken: &mut Vec<String>) {
    for (i, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let kinds: Vec<&String> = volume
            .as_object()
            .into_iter()
            .flat_map(|v| v.keys())
            .filter(|k| *k != "name")
            .collect();
        for kind in kinds {
            if !RESTRICTED_VOLUMES.contains(&kind.as_str()) {
                broken.push(format!(
                    "{path}.volumes[{i}] is a {kind} volume (restricted)"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn broken(spec: Value, level: PodSecurityLevel) -> Vec<String> {
        check(&spec, "spec", level)
    }

    #[test]
    fn baseline_refuses_what_reaches_the_node() {
        let hostile = json!({
            "hostNetwork": true, "hostPID": true, "hostIPC": true,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
            "containers": [{
                "name": "x", "image": "busybox",
                "ports": [{"containerPort": 80, "hostPort": 80}],
                "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]},
                                    "seccompProfile": {"type": "Unconfined"}}
            }]
        });
        let found = broken(hostile.clone(), PodSecurityLevel::Baseline);
        for field in [
            "spec.hostNetwork",
            "spec.hostPID",
            "spec.hostIPC",
            "spec.volumes[0] mounts hostPath \"/\"",
            "kernel.msgmax",
            "spec.containers[0].securityContext.privileged",
            "capabilities.add has SYS_ADMIN",
            "spec.containers[0].ports[0].hostPort",
            "seccompProfile.type is Unconfined",
        ] {
            assert!(
                found.iter().any(|f| f.contains(field)),
                "{field} not in {found:#?}"
            );
        }
        assert!(!found.iter().any(|f| f.contains("CHOWN")), "{found:#?}");
        assert!(broken(hostile, PodSecurityLevel::Privileged).is_empty());
    }

    #[test]
    fn an_ordinary_pod_meets_baseline_and_restricted_asks_for_more() {
        let ordinary = json!({
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "db", "persistentVolumeClaim": {"claimName": "db"}}],
            "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 8080}]}]
        });
        assert!(broken(ordinary.clone(), PodSecurityLevel::Baseline).is_empty());
        let restricted = broken(ordinary, PodSecurityLevel::Restricted);
        assert_eq!(restricted.len(), 4, "{restricted:#?}");
        let hardened = json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "web", "image": "nginx",
                            "securityContext": {"allowPrivilegeEscalation": false,
                                                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]
        });
        assert_eq!(
            broken(hardened, PodSecurityLevel::Restricted),
            Vec::<String>::new()
        );
    }

    #[test]
    fn pod_templates_are_found_in_every_workload_kind() {
        let spec = json!({"containers": []});
        for (kind, object) in [
            ("Pod", json!({"spec": spec})),
            ("Deployment", json!({"spec": {"template": {"spec": spec}}})),
            (
                "ReplicationController",
                json!({"spec": {"template": {"spec": spec}}}),
            ),
            ("Job", json!({"spec": {"template": {"spec": spec}}})),
            (
                "CronJob",
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}),
            ),
        ] {
            assert!(pod_template(kind, &object).is_some(), "{kind}");
        }
        assert!(pod_template("ConfigMap", &json!({"data": {}})).is_none());
    }
}
