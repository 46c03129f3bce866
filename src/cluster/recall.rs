//! What previewd last applied, recalled from the cluster after a restart or a leader change.
//!
//! The applier's skip cache lives in memory; a new process starts with it empty. Rather than
//! re-sending every object of every environment (thousands of writes against an API server
//! that other teams share), each applied object carries the hash of the manifest it was applied
//! from ([`ANNOTATION_APPLIED`]). On a cache miss an object is taken as applied, and its cache
//! entry seeded from what is observed, when:
//!
//! 1. it exists, and its annotation names the hash of the manifest about to be sent; and
//! 2. no other field manager owns a field the manifest sets: a hand edit (`kubectl edit`,
//!    `patch`, `apply`) takes ownership of what it changed, so it shows in `managedFields`
//!    even when it happened while no previewd was running. Fields others add beside
//!    previewd's (a Deployment's revision annotation, a ServiceAccount's token list, status)
//!    do not count.
//!
//! Either failing means the object is applied, as before: the check can only save writes,
//! never skip a repair. A template cannot forge the record (the annotation is set after
//! rendering, over whatever the manifest says); someone who edits the annotation by hand owns
//! it, which counts as an edit. The one edit this cannot see is one made under previewd's own
//! field manager name, which only a writer that impersonates previewd makes.

use serde_json::{Map, Value};

use crate::model::metadata::{ANNOTATION_APPLIED, FIELD_MANAGER_RECONCILE};

/// `manifest` with the annotation naming `manifest_hash`: the form that is sent.
pub fn annotated(manifest: &Value, manifest_hash: &str) -> Value {
    let mut sent = manifest.clone();
    if let Some(metadata) = sent.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if !annotations.is_object() {
            *annotations = Value::Object(Map::new());
        }
        annotations[ANNOTATION_APPLIED] = Value::String(manifest_hash.to_string());
    }
    sent
}

/// The field sets (`fieldsV1`) that managers other than previewd's reconciler own in `object`,
/// without `status` (never in a manifest). Empty sets are left out; most objects have none.
pub fn foreign_fields(object: &Value) -> Vec<Value> {
    let Some(entries) = object["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|entry| entry["manager"].as_str() != Some(FIELD_MANAGER_RECONCILE))
        .filter(|entry| entry["subresource"].as_str().unwrap_or_default().is_empty())
        .filter_map(|entry| {
            let mut fields = entry.get("fieldsV1")?.as_object()?.clone();
            fields.remove("f:status");
            (!fields.is_empty()).then_some(Value::Object(fields))
        })
        .collect()
}

/// Whether the object as observed (`content`, without bookkeeping; `foreign` its other
/// managers' fields) is what applying `sent`, from the manifest hashed `manifest_hash`, left.
pub fn applied_unchanged(
    content: &Value,
    foreign: &[Value],
    sent: &Value,
    manifest_hash: &str,
) -> bool {
    let recorded = content["metadata"]["annotations"][ANNOTATION_APPLIED].as_str();
    recorded == Some(manifest_hash) && !foreign.iter().any(|fields| touches(fields, sent))
}

/// Whether the field set `fields` (the `fieldsV1` form: `f:<name>` for a map key; `k:`, `v:`
/// and `i:` for list members; `.` for the map itself) includes a field that `shape` sets. A
/// list or a value that `shape` sets and `fields` reaches into counts as touched.
pub fn touches(fields: &Value, shape: &Value) -> bool {
    let (Some(fields), Value::Object(shape)) = (fields.as_object(), shape) else {
        return fields.as_object().is_some();
    };
    fields.iter().any(|(key, sub_fields)| {
        if key == "." {
            return false;
        }
        match key.strip_prefix("f:") {
            Some(name) => shape
                .get(name)
                .is_some_and(|sub_shape| touches(sub_fields, sub_shape)),
            // A list member where the manifest has a map: not previewd's form; count it.
            None => true,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "labels": {"app": "web"}},
               "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "web", "image": "web:1"}]}}}})
    }

    #[test]
    fn the_sent_form_names_the_manifest_and_keeps_its_annotations() {
        let mut manifest = deployment();
        manifest["metadata"]["annotations"] = json!({"team": "shop"});
        let sent = annotated(&manifest, "abc");
        assert_eq!(
            sent["metadata"]["annotations"],
            json!({"team": "shop", ANNOTATION_APPLIED: "abc"})
        );
    }

    #[test]
    fn a_template_cannot_forge_the_record_of_what_was_applied() {
        let mut manifest = deployment();
        manifest["metadata"]["annotations"] = json!({ANNOTATION_APPLIED: "forged"});
        let sent = annotated(&manifest, "abc");
        assert_eq!(sent["metadata"]["annotations"][ANNOTATION_APPLIED], "abc");
        // Nor by a non-object annotations field.
        manifest["metadata"]["annotations"] = json!("not a map");
        let sent = annotated(&manifest, "abc");
        assert_eq!(
            sent["metadata"]["annotations"],
            json!({ANNOTATION_APPLIED: "abc"})
        );
    }

    #[test]
    fn fields_controllers_add_beside_previewds_do_not_count() {
        let sent = annotated(&deployment(), "abc");
        let revision = json!({"f:metadata": {"f:annotations": {".": {}, "f:deployment.kubernetes.io/revision": {}}}});
        let token_list = json!({"f:secrets": {".": {}, "k:{\"name\":\"app-token\"}": {}}});
        let status = json!({"f:status": {"f:replicas": {}}});
        for fields in [revision, token_list, status] {
            assert!(!touches(&fields, &sent), "{fields}");
        }
    }

    #[test]
    fn a_hand_edit_of_a_field_previewd_sets_counts() {
        let sent = annotated(&deployment(), "abc");
        let replicas = json!({"f:spec": {"f:replicas": {}}});
        let image = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {"f:image": {}}}}}}});
        let label = json!({"f:metadata": {"f:labels": {"f:app": {}}}});
        for fields in [replicas, image, label] {
            assert!(touches(&fields, &sent), "{fields}");
        }
    }

    #[test]
    fn only_an_unedited_object_from_the_same_manifest_is_taken_as_applied() {
        let sent = annotated(&deployment(), "abc");
        let observed = sent.clone();
        assert!(applied_unchanged(&observed, &[], &sent, "abc"));
        assert!(!applied_unchanged(&observed, &[], &sent, "def"));
        assert!(!applied_unchanged(&deployment(), &[], &sent, "abc"));
        let edit = json!({"f:spec": {"f:replicas": {}}});
        assert!(!applied_unchanged(&observed, &[edit], &sent, "abc"));
    }

    #[test]
    fn foreign_fields_leave_out_previewd_and_status_only_entries() {
        let object = json!({"metadata": {"managedFields": [
            {"manager": "previewd", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:status": {"f:replicas": {}}}},
            {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
        ]}});
        assert_eq!(
            foreign_fields(&object),
            vec![json!({"f:spec": {"f:replicas": {}}})]
        );
    }
}
