//! Annotations a controller reads (pure). A key with a DNS-named prefix (`getambassador.io/config`,
//! `sidecar.istio.io/userVolume`, `vault.hashicorp.com/agent-inject-secret-db`,
//! `external-dns.alpha.kubernetes.io/hostname`) is the interface of a controller that serves
//! every team: through it a pull request could route another host to itself, mount a host path
//! into a sidecar, read any secret an injector's role can read, publish a DNS name, or step out
//! of the mesh. So such keys pass only when named: the built-in inert ones
//! ([`INERT_ANNOTATIONS`]) and the operator's (`--object-annotations`, the chart's
//! `objectAnnotations`). Keys without a DNS-named prefix (`checksum/config`, `description`)
//! are the application's own and pass. Ingresses have their own, stricter list
//! ([`super::ingress`]).
//!
//! Checked on every object's metadata and on the metadata inside it that becomes another
//! object's: pod templates, a CronJob's job template, volume claim templates (where
//! `volume.beta.kubernetes.io/storage-class: ""` would bind an existing volume), and the
//! Secrets a cert-manager Certificate (`spec.secretTemplate`) or an ExternalSecret
//! (`spec.target.template.metadata`) writes, which a secret reflector's annotations would copy
//! into other namespaces.

use serde_json::Value;

/// Keys no controller acts on beyond the object itself, or whose values another rule checks.
/// `prefix/*` names every key of the prefix.
pub const INERT_ANNOTATIONS: &[&str] = &[
    // previewd's own (waves, seeds), its sandbox's pretend kubelet (how long a pod runs,
    // whether it fails), and Helm's hook bookkeeping: read by previewd only.
    "previewd.dev/*",
    "sandbox.previewd.dev/*",
    "helm.sh/*",
    "meta.helm.sh/*",
    // What kubectl and the API server write on objects they touch.
    "kubectl.kubernetes.io/*",
    "kubernetes.io/change-cause",
    "kubernetes.io/description",
    "deployment.kubernetes.io/revision",
    // Scrape hints: a metrics scraper reads the pod's own port and path.
    "prometheus.io/*",
    // Istio rewrites the pod's own probes through its sidecar (Online Boutique sets it).
    "sidecar.istio.io/rewriteAppHTTPProbers",
    // AppArmor and seccomp by annotation: their values are checked by `reach`.
    "container.apparmor.security.beta.kubernetes.io/*",
    "seccomp.security.alpha.kubernetes.io/*",
];

/// The cluster autoscaler's `safe-to-evict` saying `"true"` (the pod may go, as any pod): about
/// the pod itself. `"false"` keeps its node from scaling down for every team: refused unless
/// the operator names the key.
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

fn evictable(key: &str, value: &Value) -> bool {
    key == SAFE_TO_EVICT && value.as_str() == Some("true")
}

/// Whether `key` is named by `entry` (an exact key, or `prefix/*`).
pub(super) fn names(entry: &str, key: &str) -> bool {
    match entry.strip_suffix("/*") {
        Some(prefix) => key
            .split_once('/')
            .is_some_and(|(key_prefix, _)| key_prefix == prefix),
        None => entry == key,
    }
}

/// Whether `key` belongs to a controller: its prefix is a DNS name (has a dot).
pub(super) fn controller_key(key: &str) -> Option<&str> {
    key.split_once('/')
        .map(|(prefix, _)| prefix)
        .filter(|prefix| prefix.contains('.'))
}

/// The annotations of `metadata` (at `path`) that configure a controller and that neither the
/// built-in list nor `allowed` (the operator's) names: one sentence each.
pub fn check(metadata: &Value, path: &dyn std::fmt::Display, allowed: &[String]) -> Vec<String> {
    let Some(annotations) = metadata["annotations"].as_object() else {
        return Vec::new();
    };
    annotations
        .iter()
        .filter(|(key, value)| !evictable(key, value))
        .filter_map(|(key, _)| controller_key(key).map(|prefix| (key, prefix)))
        .filter(|(key, _)| {
            !INERT_ANNOTATIONS.iter().any(|entry| names(entry, key))
                && !allowed.iter().any(|entry| names(entry, key))
        })
        .map(|(key, prefix)| format!(
            "{path}.annotations has {key:?}, which configures a controller of {prefix} that other teams share too: only annotations this previewd allows (--object-annotations; the chart's objectAnnotations)"
        ))
        .collect()
}

/// Where a metadata is in its object, said only when a key is refused (most objects carry
/// no annotation: finding their metadata allocates nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Object,
    JobTemplate,
    /// A pod template's metadata: in a CronJob's job template, or in `spec.template`.
    PodTemplate {
        in_job: bool,
    },
    ClaimTemplate(usize),
    /// A cert-manager Certificate's `secretTemplate`: the labels and annotations of the Secret
    /// it writes.
    SecretTemplate,
    /// An ExternalSecret's `target.template.metadata`: the metadata of the Secret it writes.
    TargetTemplate,
    /// A pod's ephemeral volume's claim template: of a Pod itself, or of a pod template.
    EphemeralClaim {
        pod: Option<bool>,
        volume: usize,
    },
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pod_template = |in_job: bool| {
            if in_job {
                "spec.jobTemplate.spec.template"
            } else {
                "spec.template"
            }
        };
        match self {
            Place::Object => write!(f, "metadata"),
            Place::JobTemplate => write!(f, "spec.jobTemplate.metadata"),
            Place::PodTemplate { in_job } => write!(f, "{}.metadata", pod_template(*in_job)),
            Place::ClaimTemplate(i) => write!(f, "spec.volumeClaimTemplates[{i}].metadata"),
            Place::SecretTemplate => write!(f, "spec.secretTemplate"),
            Place::TargetTemplate => write!(f, "spec.target.template.metadata"),
            Place::EphemeralClaim { pod, volume } => {
                let spec = match pod {
                    None => "spec".to_string(),
                    Some(in_job) => format!("{}.spec", pod_template(*in_job)),
                };
                write!(
                    f,
                    "{spec}.volumes[{volume}].ephemeral.volumeClaimTemplate.metadata"
                )
            }
        }
    }
}

fn push_annotated<'a>(found: &mut Vec<(&'a Value, Place)>, metadata: &'a Value, place: Place) {
    let filled = |field: &str| {
        metadata[field]
            .as_object()
            .is_some_and(|map| !map.is_empty())
    };
    if filled("annotations") || filled("labels") {
        found.push((metadata, place));
    }
}

/// Every metadata of `object` that becomes an object's and carries annotations or labels, with
/// its place: the object's own, its pod template's, a CronJob's job template's, and volume
/// claim templates'.
pub fn metadata_of(object: &Value) -> Vec<(&Value, Place)> {
    let mut found = Vec::new();
    let mut add = |metadata, place| push_annotated(&mut found, metadata, place);
    let spec = &object["spec"];
    add(&object["metadata"], Place::Object);
    let job_template = &spec["jobTemplate"];
    let in_job = job_template.is_object();
    let pod_template = if in_job {
        add(&job_template["metadata"], Place::JobTemplate);
        &job_template["spec"]["template"]
    } else {
        &spec["template"]
    };
    add(&pod_template["metadata"], Place::PodTemplate { in_job });
    let claims = spec["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten();
    for (i, claim) in claims.enumerate() {
        add(&claim["metadata"], Place::ClaimTemplate(i));
    }
    let (pod_spec, pod) = if object["kind"] == "Pod" {
        (spec, None)
    } else {
        (&pod_template["spec"], Some(in_job))
    };
    let volumes = pod_spec["volumes"].as_array().into_iter().flatten();
    for (volume, entry) in volumes.enumerate() {
        let claim = &entry["ephemeral"]["volumeClaimTemplate"];
        add(&claim["metadata"], Place::EphemeralClaim { pod, volume });
    }
    // The Secrets that cert-manager and external-secrets write carry these.
    add(&spec["secretTemplate"], Place::SecretTemplate);
    add(
        &spec["target"]["template"]["metadata"],
        Place::TargetTemplate,
    );
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn controller_annotations_pass_only_when_named() {
        let metadata = json!({"annotations": {
            "getambassador.io/config": "---\nkind: Mapping\nhost: www.example.com",
            "checksum/config": "abc",
            "prometheus.io/scrape": "true",
            "previewd.dev/wave": "1",
            "sandbox.previewd.dev/run-seconds": "3",
            "konghq.com/plugins": "x",
        }});
        let found = check(&metadata, &"metadata", &[]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("\"getambassador.io/config\"")
                && found[0].contains("getambassador.io that other teams share")
        );
        assert!(
            found[1].contains("konghq.com/plugins") && found[1].contains("--object-annotations")
        );
        let operator = vec![
            "konghq.com/*".to_string(),
            "getambassador.io/config".to_string(),
        ];
        assert!(check(&metadata, &"metadata", &operator).is_empty());
        // A prefix entry names its own prefix only, not a longer one that ends the same.
        assert!(!names("konghq.com/*", "evilkonghq.com/plugins"));
        assert!(!names("konghq.com/*", "konghq.com.evil.io/plugins"));
    }

    #[test]
    fn every_metadata_that_becomes_an_object_is_found() {
        let annotated = json!({"annotations": {"k": "v"}});
        let cron = json!({"kind": "CronJob", "metadata": annotated, "spec": {"jobTemplate": {"metadata": annotated, "spec": {"template": {
            "metadata": annotated, "spec": {"volumes": [{"name": "s", "ephemeral": {"volumeClaimTemplate": {"metadata": annotated}}}]}}}}}});
        let paths: Vec<String> = metadata_of(&cron)
            .into_iter()
            .map(|(_, p)| p.to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "metadata",
                "spec.jobTemplate.metadata",
                "spec.jobTemplate.spec.template.metadata",
                "spec.jobTemplate.spec.template.spec.volumes[0].ephemeral.volumeClaimTemplate.metadata",
            ]
        );
        let set = json!({"kind": "StatefulSet", "spec": {"template": {"metadata": annotated}, "volumeClaimTemplates": [{"metadata": {}}, {"metadata": annotated}]}});
        let paths: Vec<String> = metadata_of(&set)
            .into_iter()
            .map(|(_, p)| p.to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "spec.template.metadata",
                "spec.volumeClaimTemplates[1].metadata"
            ],
            "only annotated ones"
        );
        let certificate = json!({"kind": "Certificate", "spec": {"secretTemplate": annotated}});
        let external = json!({"kind": "ExternalSecret", "spec": {"target": {"template": {"metadata": annotated}}}});
        let paths = |object: &Value| -> Vec<String> {
            metadata_of(object)
                .into_iter()
                .map(|(_, p)| p.to_string())
                .collect()
        };
        assert_eq!(paths(&certificate), ["spec.secretTemplate"]);
        assert_eq!(paths(&external), ["spec.target.template.metadata"]);
        let pod = json!({"kind": "Pod", "spec": {"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"metadata": annotated}}}]}});
        let paths: Vec<String> = metadata_of(&pod)
            .into_iter()
            .map(|(_, p)| p.to_string())
            .collect();
        assert_eq!(
            paths,
            ["spec.volumes[0].ephemeral.volumeClaimTemplate.metadata"]
        );
    }
}
