//! Labels a controller reads (pure). Like an annotation, a label key with a DNS-named prefix is
//! the interface of a controller: `sidecar.istio.io/inject: "false"` or
//! `istio.io/dataplane-mode: none` take a pod out of a mesh that enforces every team's egress
//! and mTLS, `istio.io/use-waypoint` and `istio.io/rev` pick a proxy or control plane other
//! teams run, `kuma.io/sidecar-injection` does the same for Kuma, and keys under
//! `kubernetes.io/` and `k8s.io/` are read by Kubernetes' own components (kube-proxy's
//! `service.kubernetes.io/service-proxy-name`, the EndpointSlice controller's
//! `endpointslice.kubernetes.io/managed-by`). previewd reads labels too: its watches find the
//! objects it manages by `app.kubernetes.io/managed-by=previewd` and route a change to the
//! environment its `previewd.dev/environment` labels name, so a CronJob's job template
//! carrying them would make Jobs previewd counts as another environment's.
//!
//! So label keys with a DNS-named prefix pass only when named: Kubernetes' recommended
//! `app.kubernetes.io/*` labels (but `managed-by` saying `previewd`) and Helm's `helm.sh/*`,
//! which no controller acts on, and the operator's (`--object-labels`, the chart's
//! `objectLabels`). previewd's own labels on the object itself are the ones it stamped after
//! rendering, so they pass there. Keys without a DNS-named prefix (`app`, `tier`) are the
//! application's own and pass. Some shared tools do read plain labels across namespaces (a
//! NetworkPolicy that selects pods of every namespace, which the guard rail's default-deny
//! egress keeps the environment's pods from reaching; Grafana's sidecar collecting ConfigMaps
//! labelled `grafana_dashboard` from every namespace): an operator who runs such a tool scopes
//! it to the namespaces it serves, as docs/security.md says.

use serde_json::Value;

use super::annotations::{Place, controller_key, names};
use crate::model::metadata::{
    LABEL_ENVIRONMENT, LABEL_ENVIRONMENT_NAMESPACE, LABEL_MANAGED_BY, LABEL_SEED, LABEL_TEMPLATE,
    prefix_in_domain,
};

/// Label keys no controller acts on beyond the object itself. `prefix/*` names every key of
/// the prefix.
pub const INERT_LABELS: &[&str] = &["app.kubernetes.io/*", "helm.sh/*"];

/// The labels previewd stamps on every object it renders (and on seed Jobs), after the
/// template and the pull request have had their say: their values are previewd's own.
const STAMPED: &[&str] = &[
    LABEL_MANAGED_BY,
    LABEL_ENVIRONMENT,
    LABEL_ENVIRONMENT_NAMESPACE,
    LABEL_TEMPLATE,
    LABEL_SEED,
];

/// Why `key` (with `value`) may not be set at `place`, if it may not: previewd's own labels
/// on metadata that becomes another object's, and controller keys nobody named.
fn refusal(key: &str, value: &Value, place: Place, allowed: &[String]) -> Option<String> {
    if place == Place::Object && STAMPED.contains(&key) {
        return None;
    }
    if key == LABEL_MANAGED_BY && value.as_str() == Some("previewd") || key_of_previewd(key) {
        return Some(format!(
            "has {key:?}, which previewd's own watches read to find the objects it manages: only previewd sets it"
        ));
    }
    let prefix = controller_key(key)?;
    let named = |entry: &&str| names(entry, key);
    if INERT_LABELS.iter().any(named) || allowed.iter().any(|entry| names(entry, key)) {
        return None;
    }
    Some(format!(
        "has {key:?}, which configures a controller of {prefix} that other teams share too: only labels this previewd allows (--object-labels; the chart's objectLabels)"
    ))
}

/// Whether `key` is one of previewd's own (`previewd.dev/` and its sub-domains).
fn key_of_previewd(key: &str) -> bool {
    controller_key(key).is_some_and(|prefix| prefix_in_domain(prefix, "previewd.dev"))
}

/// The labels of `metadata` (at `place`) that a controller reads and nobody allowed: one
/// sentence each.
pub fn check(metadata: &Value, place: Place, allowed: &[String]) -> Vec<String> {
    let Some(labels) = metadata["labels"].as_object() else {
        return Vec::new();
    };
    labels
        .iter()
        .filter_map(|(key, value)| refusal(key, value, place, allowed))
        .map(|reason| format!("{place}.labels {reason}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const POD_TEMPLATE: Place = Place::PodTemplate { in_job: false };

    #[test]
    fn mesh_and_kubernetes_labels_pass_only_when_named() {
        let metadata = json!({"labels": {
            "app": "web",
            "app.kubernetes.io/name": "web",
            "app.kubernetes.io/managed-by": "Helm",
            "helm.sh/chart": "web-1.0.0",
            "sidecar.istio.io/inject": "false",
            "istio.io/dataplane-mode": "none",
            "service.kubernetes.io/service-proxy-name": "elsewhere",
        }});
        let found = check(&metadata, POD_TEMPLATE, &[]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found
                .iter()
                .all(|f| f.starts_with("spec.template.metadata.labels has"))
        );
        assert!(
            found
                .iter()
                .any(|f| f.contains("\"sidecar.istio.io/inject\"")
                    && f.contains("sidecar.istio.io that other teams share")
                    && f.contains("--object-labels"))
        );
        let operator = vec![
            "sidecar.istio.io/inject".to_string(),
            "istio.io/*".to_string(),
        ];
        let found = check(&metadata, POD_TEMPLATE, &operator);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("service.kubernetes.io/service-proxy-name"));
    }

    #[test]
    fn previewds_own_labels_pass_only_where_previewd_stamped_them() {
        let forged = json!({"labels": {
            "app.kubernetes.io/managed-by": "previewd",
            "previewd.dev/environment": "pr-1",
            "previewd.dev/environment-namespace": "other-team",
            "test.previewd.dev/x": "y",
        }});
        let in_job = Place::JobTemplate;
        let found = check(&forged, in_job, &["previewd.dev/*".to_string()]);
        assert_eq!(
            found.len(),
            4,
            "the operator cannot hand previewd's own out: {found:?}"
        );
        assert!(found.iter().all(|f| f.contains("only previewd sets it")));
        // On the object itself previewd stamped them over whatever the template said.
        let stamped = json!({"labels": {
            "app.kubernetes.io/managed-by": "previewd",
            "previewd.dev/environment": "pr-1",
            "previewd.dev/seed": "load",
        }});
        assert!(check(&stamped, Place::Object, &[]).is_empty());
        let unstamped = json!({"labels": {"previewd.dev/environment-uid": "x"}});
        assert_eq!(check(&unstamped, Place::Object, &[]).len(), 1);
    }
}
