//! Templates rendered where their memory is bounded (see `engines::worker`): every render
//! request runs in a child process under a memory and time limit, never in previewd's own
//! process; what the child answered is kept by the request's digest, so an unchanged commit
//! runs no child. Counted as `previewd_engine_renders_total{engine="templates"}` (`cached`: no
//! child ran).

use serde_json::Value;

use super::renderer::Renderer;
use super::{engine_refusal, turn_owner};
use crate::engines::EngineError;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::plan::render::holds_templates;
use crate::plan::render_failed;
use crate::plan::request::{self, RenderJob, RenderOutput, RenderRequest};
use crate::plan::values::facts;
use crate::reconcile::error::Refusal;

/// Renders `request` for `template` in a child process (or takes what a child answered for
/// the same request before).
pub async fn render(
    request: RenderRequest,
    template: &PreviewTemplate,
    renderer: &Renderer<'_>,
) -> Result<RenderOutput, Refusal> {
    let (input, key) = request.encode().map_err(render_failed)?;
    let answered = renderer
        .engines
        .render_isolated(&turn_owner(template), key, input)
        .await;
    let outcome = match &answered {
        Ok(answer) if answer.cached => "cached",
        Ok(_) => "rendered",
        // No child ran: the failure is the one a child met before.
        Err(EngineError::SaidBefore(_)) => "cached",
        Err(_) => "failed",
    };
    renderer
        .renders
        .with_label_values(&["templates", outcome])
        .inc();
    let answer = answered.map_err(|error| engine_refusal("rendering the templates", error))?;
    Ok(request::decode(answer.text.as_bytes()).map_err(render_failed)?)
}

/// Every template string of `value` rendered with `environment`'s facts; a field's name is
/// where it is, for errors (`helm.values`).
pub async fn render_strings(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    value: Value,
    renderer: &Renderer<'_>,
) -> Result<Value, Refusal> {
    if !holds_templates(&value) {
        return Ok(value);
    }
    let request = RenderRequest {
        facts: facts(environment, &template.spec, namespace),
        url: template.spec.url.clone(),
        job: RenderJob::Strings(value),
    };
    let rendered = render(request, template, renderer).await?;
    Ok(rendered.strings().map_err(render_failed)?)
}
