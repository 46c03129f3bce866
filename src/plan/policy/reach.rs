//! What a pod reaches beyond its own namespace that the Pod Security Standards leave open
//! (pure), checked on every pod template at every level but `Privileged`:
//!
//! * volumes: only the types named (the restricted level's list by default: configMap, csi,
//!   downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret). The kubelet
//!   mounts the others from the node's network with the node's identity (nfs, iscsi, rbd,
//!   cephfs, glusterfs, flexVolume, …) or clones a URL onto the node (gitRepo);
//! * scheduling: no `nodeName` (it skips the scheduler and every taint), and priority classes,
//!   runtime classes and tolerations only as the template names them: a high priority class
//!   evicts other tenants' pods, a runtime class picks another sandbox, and a toleration of
//!   every taint lands on nodes set apart (the control plane's, another team's);
//! * the AppArmor and seccomp annotations older clusters read: only the runtime's default or a
//!   profile on the node, never `unconfined`.

use serde_json::Value;

use super::pods::RESTRICTED_VOLUMES;
use crate::model::crd::PolicySpec;

/// Tolerations Kubernetes itself gives every pod (the DefaultTolerationSeconds admission):
/// a template may spell them out.
const DEFAULT_TOLERATION_KEYS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What `spec` (at `path`, with the pod template's `metadata`) reaches that `policy` does not
/// allow: one sentence per field.
pub fn check(metadata: &Value, spec: &Value, path: &str, policy: &PolicySpec) -> Vec<String> {
    let mut broken = volumes(spec, path, policy);
    broken.extend(scheduling(spec, path, policy));
    broken.extend(annotations(metadata));
    broken
}

fn volumes(spec: &Value, path: &str, policy: &PolicySpec) -> Vec<String> {
    let mut broken = Vec::new();
    for (i, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        for kind in volume
            .as_object()
            .into_iter()
            .flat_map(|v| v.keys())
            .filter(|k| *k != "name")
        {
            let allowed = RESTRICTED_VOLUMES.contains(&kind.as_str())
                || policy.allowed_volume_types.iter().any(|t| t == kind);
            if kind == "csi" {
                broken.extend(csi_driver(
                    &volume["csi"],
                    &format!("{path}.volumes[{i}]"),
                    policy,
                ));
            } else if !allowed && kind != "hostPath" {
                broken.push(format!(
                    "{path}.volumes[{i}] is a {kind} volume, which the node mounts for the pod: only {} unless the template's policy.allowedVolumeTypes lists it",
                    RESTRICTED_VOLUMES.join(", ")
                ));
            }
        }
    }
    broken
}

/// An inline CSI volume is mounted by its driver with the node's identity, and drivers that
/// support inline volumes include network shares (NFS, SMB): only drivers the template names.
fn csi_driver(csi: &Value, at: &str, policy: &PolicySpec) -> Option<String> {
    let driver = csi["driver"].as_str().unwrap_or_default();
    (!policy.allowed_csi_drivers.iter().any(|d| d == driver)).then(|| {
        format!(
            "{at} is an inline csi volume of driver {driver:?}, which mounts with the node's identity: only drivers the template's policy.allowedCsiDrivers lists"
        )
    })
}

fn scheduling(spec: &Value, path: &str, policy: &PolicySpec) -> Vec<String> {
    let mut broken = Vec::new();
    if spec["nodeName"].as_str().is_some_and(|n| !n.is_empty()) {
        broken.push(format!(
            "{path}.nodeName is set: it places the pod past the scheduler and every taint; use a nodeSelector"
        ));
    }
    for (field, allowed, list) in [
        (
            "priorityClassName",
            &policy.allowed_priority_classes,
            "policy.allowedPriorityClasses",
        ),
        (
            "runtimeClassName",
            &policy.allowed_runtime_classes,
            "policy.allowedRuntimeClasses",
        ),
    ] {
        if let Some(name) = spec[field].as_str()
            && !allowed.iter().any(|a| a == name)
        {
            broken.push(format!(
                "{path}.{field} is {name:?}: only the classes the template's {list} lists"
            ));
        }
    }
    for (i, toleration) in spec["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let key = toleration["key"].as_str().unwrap_or_default();
        let allowed = DEFAULT_TOLERATION_KEYS.contains(&key)
            || policy.allowed_toleration_keys.iter().any(|k| k == key);
        if key.is_empty() {
            broken.push(format!(
                "{path}.tolerations[{i}] has no key, so it tolerates every taint: name the taint's key, which the template's policy.allowedTolerationKeys must list"
            ));
        } else if !allowed {
            broken.push(format!(
                "{path}.tolerations[{i}] tolerates {key:?}: only taints the template's policy.allowedTolerationKeys lists"
            ));
        }
    }
    broken
}

/// The beta annotations through which clusters before 1.30 (AppArmor) and 1.19 (seccomp) read
/// a pod's profiles: `unconfined` there undoes what the securityContext checks hold.
fn annotations(metadata: &Value) -> Vec<String> {
    metadata["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            key.starts_with("container.apparmor.security.beta.kubernetes.io/")
                || key.starts_with("seccomp.security.alpha.kubernetes.io/")
                || key.starts_with("container.seccomp.security.alpha.kubernetes.io/")
        })
        .map(|(key, value)| (key, value.as_str().unwrap_or_default()))
        .filter(|(_, value)| {
            !(*value == "runtime/default"
                || *value == "docker/default"
                || value.starts_with("localhost/"))
        })
        .map(|(key, value)| {
            format!(
                "annotation {key} is {value}: only runtime/default or a localhost/ profile (baseline)"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn found(metadata: Value, spec: Value, policy: &PolicySpec) -> Vec<String> {
        check(&metadata, &spec, "spec", policy)
    }

    #[test]
    fn an_ordinary_pod_reaches_nothing() {
        let ordinary = json!({
            "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "configMap": {"name": "c"}},
                        {"name": "c", "persistentVolumeClaim": {"claimName": "db"}}, {"name": "d", "projected": {"sources": []}}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "containers": [{"name": "web", "image": "nginx"}]
        });
        let annotated = json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/web": "runtime/default"}});
        assert_eq!(
            found(annotated, ordinary, &PolicySpec::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn volumes_the_node_mounts_are_refused_unless_named() {
        for kind in [
            "nfs",
            "iscsi",
            "rbd",
            "cephfs",
            "glusterfs",
            "flexVolume",
            "gitRepo",
            "fc",
            "cinder",
        ] {
            let spec = json!({"volumes": [{"name": "v", kind: {}}], "containers": []});
            let refused = found(json!({}), spec.clone(), &PolicySpec::default());
            assert_eq!(refused.len(), 1, "{kind}: {refused:?}");
            assert!(
                refused[0].contains(&format!("spec.volumes[0] is a {kind} volume")),
                "{refused:?}"
            );
            let allowing = PolicySpec {
                allowed_volume_types: vec![kind.to_string()],
                ..Default::default()
            };
            assert!(found(json!({}), spec, &allowing).is_empty(), "{kind}");
        }
    }

    #[test]
    fn inline_csi_volumes_need_a_named_driver() {
        let spec = json!({"volumes": [{"name": "share", "csi": {"driver": "nfs.csi.k8s.io",
            "volumeAttributes": {"server": "10.0.0.5", "share": "/team-b"}}}], "containers": []});
        let refused = found(json!({}), spec.clone(), &PolicySpec::default());
        assert!(
            refused[0].contains("driver \"nfs.csi.k8s.io\""),
            "{refused:?}"
        );
        let allowing = PolicySpec {
            allowed_csi_drivers: vec!["secrets-store.csi.k8s.io".into()],
            ..Default::default()
        };
        assert_eq!(found(json!({}), spec, &allowing).len(), 1, "another driver");
        let secrets = json!({"volumes": [{"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io"}}], "containers": []});
        assert!(found(json!({}), secrets, &allowing).is_empty());
    }

    #[test]
    fn scheduling_that_reaches_other_tenants_is_refused_unless_named() {
        let spec = json!({
            "nodeName": "control-plane-1",
            "priorityClassName": "system-node-critical",
            "runtimeClassName": "unsandboxed",
            "tolerations": [{"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            "containers": []
        });
        let refused = found(json!({}), spec.clone(), &PolicySpec::default());
        for field in [
            "spec.nodeName is set",
            "spec.priorityClassName is \"system-node-critical\"",
            "spec.runtimeClassName is \"unsandboxed\"",
            "spec.tolerations[0] has no key, so it tolerates every taint",
            "spec.tolerations[1] tolerates \"node-role.kubernetes.io/control-plane\"",
        ] {
            assert!(
                refused.iter().any(|r| r.contains(field)),
                "{field} not in {refused:#?}"
            );
        }
        let allowing = PolicySpec {
            allowed_priority_classes: vec!["system-node-critical".into()],
            allowed_runtime_classes: vec!["unsandboxed".into()],
            allowed_toleration_keys: vec!["node-role.kubernetes.io/control-plane".into()],
            ..Default::default()
        };
        let left = found(json!({}), spec, &allowing);
        assert_eq!(
            left.len(),
            2,
            "nodeName and the keyless toleration stay refused: {left:?}"
        );
    }

    #[test]
    fn unconfined_profiles_by_annotation_are_refused() {
        let metadata = json!({"annotations": {
            "container.apparmor.security.beta.kubernetes.io/web": "unconfined",
            "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
            "container.seccomp.security.alpha.kubernetes.io/web": "localhost/profiles/web.json",
        }});
        let refused = found(metadata, json!({"containers": []}), &PolicySpec::default());
        assert_eq!(refused.len(), 2, "{refused:?}");
    }
}
