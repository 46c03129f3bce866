//! PersistentVolumeClaims (pure), wherever a template puts one: as an object, in a
//! StatefulSet's `volumeClaimTemplates`, or in a pod's `ephemeral` volume. A claim may only ask
//! for a new volume from a storage class: one that names a volume (`volumeName`), selects
//! volumes by label (`selector`) or asks for no class at all (`storageClassName: ""`) binds an
//! existing PersistentVolume, whoever's data it holds, and one whose data source is in another
//! namespace (`dataSourceRef.namespace`) copies that namespace's data.

use serde_json::Value;

use crate::model::crd::PolicySpec;

const HOW_TO_ALLOW: &str = "let the claim be provisioned from a storage class, or set the template's policy.allowExistingVolumes";

/// What the claim spec at `at` binds beyond a new volume.
pub fn claim(spec: &Value, at: &str, policy: &PolicySpec) -> Vec<String> {
    let mut broken = Vec::new();
    if !spec["dataSourceRef"]["namespace"].is_null() {
        broken.push(format!(
            "{at}.dataSourceRef.namespace copies data from another namespace: only sources of the environment's namespace"
        ));
    }
    if policy.allow_existing_volumes {
        return broken;
    }
    if spec["volumeName"]
        .as_str()
        .is_some_and(|name| !name.is_empty())
    {
        broken.push(format!(
            "{at}.volumeName binds an existing PersistentVolume: {HOW_TO_ALLOW}"
        ));
    }
    if !spec["selector"].is_null() {
        broken.push(format!(
            "{at}.selector binds existing PersistentVolumes by label: {HOW_TO_ALLOW}"
        ));
    }
    if spec["storageClassName"].as_str() == Some("") {
        broken.push(format!(
            "{at}.storageClassName is empty, which binds any existing PersistentVolume without a class: {HOW_TO_ALLOW}"
        ));
    }
    broken
}

/// The claims inside a StatefulSet (`volumeClaimTemplates`) and a pod spec's `ephemeral`
/// volumes (`spec_path` is the pod spec's path).
pub fn embedded(
    object: &Value,
    pod_spec: &Value,
    spec_path: &str,
    policy: &PolicySpec,
) -> Vec<String> {
    let mut broken = Vec::new();
    for (i, template) in object["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        broken.extend(claim(
            &template["spec"],
            &format!("spec.volumeClaimTemplates[{i}].spec"),
            policy,
        ));
    }
    for (i, volume) in pod_spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let template = &volume["ephemeral"]["volumeClaimTemplate"]["spec"];
        if !template.is_null() {
            let at = format!("{spec_path}.volumes[{i}].ephemeral.volumeClaimTemplate.spec");
            broken.extend(claim(template, &at, policy));
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_provisioned_claim_passes() {
        let spec = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                          "resources": {"requests": {"storage": "1Gi"}}});
        assert!(claim(&spec, "spec", &PolicySpec::default()).is_empty());
    }

    #[test]
    fn every_way_to_bind_an_existing_volume_is_refused() {
        let spec = json!({"volumeName": "payments-db", "selector": {"matchLabels": {"team": "payments"}},
                          "storageClassName": "", "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db", "namespace": "payments"}});
        let found = claim(&spec, "spec", &PolicySpec::default());
        assert_eq!(found.len(), 4, "{found:?}");
        let allowing = PolicySpec {
            allow_existing_volumes: true,
            ..Default::default()
        };
        let left = claim(&spec, "spec", &allowing);
        assert_eq!(
            left.len(),
            1,
            "another namespace's data stays refused: {left:?}"
        );
    }

    #[test]
    fn embedded_claims_are_checked_too() {
        let statefulset = json!({"spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"volumeName": "payments-db"}}]}});
        let pod = json!({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": ""}}}}]});
        let found = embedded(
            &statefulset,
            &pod,
            "spec.template.spec",
            &PolicySpec::default(),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("spec.volumeClaimTemplates[0].spec.volumeName"));
        assert!(found[1].starts_with(
            "spec.template.spec.volumes[0].ephemeral.volumeClaimTemplate.spec.storageClassName"
        ));
    }
}
