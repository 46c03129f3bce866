//! The template's own condition `WithinCeiling` (`status.conditions` of the PreviewTemplate):
//! its author sees there, not only on each environment, that the template asks for more than
//! the operator's ceiling, and which fields. Written only when it changes: `False` with the
//! fields when a render is refused for it, back to `True` once a render passes the ceiling
//! (a template that never went beyond it gets no condition, and no write).

use chrono::Utc;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::context::Context;
use super::error::ReconcileError;
use crate::model::crd::{Condition, PreviewTemplate};
use crate::model::metadata::FIELD_MANAGER_RECONCILE;

pub const CONDITION: &str = "WithinCeiling";

/// Says on `template` that it is beyond the ceiling (`message` names the fields), or, with
/// `None`, that it no longer is (only if it said otherwise before).
pub async fn say_ceiling(
    template: &PreviewTemplate,
    beyond: Option<&str>,
    context: &Context,
) -> Result<(), ReconcileError> {
    let previous = template
        .status
        .as_ref()
        .and_then(|status| status.conditions.iter().find(|c| c.type_ == CONDITION));
    let (status, reason, message) = match beyond {
        Some(message) => ("False", "BeyondCeiling", message.to_string()),
        None if previous.is_some_and(|c| c.status == "False") => (
            "True",
            "WithinCeiling",
            "the template asks for nothing beyond the operator's ceiling".to_string(),
        ),
        None => return Ok(()),
    };
    if previous.is_some_and(|c| c.status == status && c.message == message) {
        return Ok(());
    }
    let condition = Condition {
        type_: CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Utc::now(),
    };
    let templates: Api<PreviewTemplate> = Api::namespaced(
        context.client.clone(),
        &template.namespace().unwrap_or_default(),
    );
    let patch = Patch::Merge(json!({"status": {"conditions": [condition]}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_RECONCILE.into()),
        ..Default::default()
    };
    let name = template.name_any();
    let write = templates.patch_status(&name, &params, &patch);
    context
        .writer
        .write("status", write)
        .await
        .map(|_| ())
        .map_err(ReconcileError::Status)
}
