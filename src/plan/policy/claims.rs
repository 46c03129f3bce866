//! PersistentVolumeClaims (pure), wherever a template puts one: as an object, in a
//! StatefulSet's `volumeClaimTemplates`, or in a pod's `ephemeral` volume. A claim may only ask
//! for a new volume from a storage class: one that names a volume (`volumeName`), selects
//! volumes by label (`selector`) or asks for no class at all (`storageClassName: ""`) binds an
//! existing PersistentVolume, whoever's data it holds, and one whose data source is in another
//! namespace (`dataSourceRef.namespace`) copies that namespace's data. And a claim on a class
//! that keeps its volumes (`reclaimPolicy: Retain`) leaves a volume behind every environment
//! removed ([`retained`]: the classes are the cluster's, so the pipeline asks for them).

use serde_json::Value;

use super::Violation;
use super::pods;
use crate::model::crd::PolicySpec;
use crate::plan::render::RenderedObject;

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

/// Every claim of `object` with where it is and the class it names (`None`: none, the
/// cluster's default): the object itself if a PersistentVolumeClaim, a StatefulSet's claim
/// templates, and a pod spec's ephemeral volumes.
pub fn classes_asked(object: &RenderedObject) -> Vec<(String, Option<&str>)> {
    fn class(spec: &Value) -> Option<&str> {
        spec["storageClassName"].as_str()
    }
    let value = &object.object;
    let mut asked = Vec::new();
    if object.kind() == "PersistentVolumeClaim" {
        asked.push(("spec".to_string(), class(&value["spec"])));
    }
    let templates = value["spec"]["volumeClaimTemplates"].as_array();
    for (i, template) in templates.into_iter().flatten().enumerate() {
        let at = format!("spec.volumeClaimTemplates[{i}].spec");
        asked.push((at, class(&template["spec"])));
    }
    if let Some((_, spec, path)) = pods::pod_template(object.kind(), value) {
        let volumes = spec["volumes"].as_array().into_iter().flatten();
        for (i, volume) in volumes.enumerate() {
            let claim = &volume["ephemeral"]["volumeClaimTemplate"]["spec"];
            if claim.is_object() {
                let at = format!("{path}.volumes[{i}].ephemeral.volumeClaimTemplate.spec");
                asked.push((at, class(claim)));
            }
        }
    }
    asked
}

/// Claims whose class keeps its volumes after the claim is gone. `retaining_class` says, for
/// the class a claim names (`None`: none), the class it gets if that one retains.
pub fn retained(
    objects: &[RenderedObject],
    retaining_class: impl Fn(Option<&str>) -> Option<String>,
) -> Vec<Violation> {
    let mut found = Vec::new();
    for object in objects {
        for (at, class) in classes_asked(object) {
            let Some(retaining) = retaining_class(class) else {
                continue;
            };
            let named = match class {
                Some(_) => format!("{at}.storageClassName {retaining:?}"),
                None => format!(
                    "{at} names no class, so it gets the cluster's default {retaining:?}, which"
                ),
            };
            found.push(Violation {
                manifest: object.manifest.clone(),
                kind: object.kind().to_string(),
                name: object.name().to_string(),
                reason: format!(
                    "{named} keeps its volumes after their claims are gone (reclaimPolicy: Retain): every environment removed would leave a volume and its disk behind; use a class that deletes them (--allow-retained-volumes lets them through)"
                ),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_on_a_retaining_class_are_found_wherever_they_are() {
        let rendered = |object: Value| RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object,
        };
        let objects = [
            rendered(
                json!({"kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
                            "spec": {"storageClassName": "kept"}}),
            ),
            rendered(
                json!({"kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {
                "volumeClaimTemplates": [{"spec": {"storageClassName": "standard"}}, {"spec": {}}],
                "template": {"spec": {"containers": [], "volumes": [{"name": "scratch",
                    "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "kept"}}}}]}}}}),
            ),
        ];
        let retaining = |class: Option<&str>| match class.unwrap_or("kept") {
            "kept" => Some("kept".to_string()),
            _ => None,
        };
        let found: Vec<String> = retained(&objects, retaining)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].contains("PersistentVolumeClaim/data (from app.yaml): spec.storageClassName \"kept\" keeps its volumes"));
        assert!(found[1].contains("spec.volumeClaimTemplates[1].spec names no class, so it gets the cluster's default \"kept\""));
        assert!(found[2].contains(
            "spec.template.spec.volumes[0].ephemeral.volumeClaimTemplate.spec.storageClassName"
        ));
        assert!(retained(&objects, |_| None).is_empty());
    }

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
