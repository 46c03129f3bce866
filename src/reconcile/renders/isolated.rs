//! Templates rendered where their memory is bounded (see `engines::worker`): a render request
//! previewd has not seen runs in a child process under the engines' memory and time limits;
//! one that fitted there before renders here, on a blocking thread, as it renders the same.
//! Counted as `previewd_engine_renders_total{engine="templates"}` (`cached`: no child ran).

use serde_json::Value;

use super::{engine_refusal, turn_owner};
use crate::engines::EngineError;
use crate::engines::worker::Known;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::reconcile::context::Context;
use crate::reconcile::error::Refusal;
use crate::reconcile::plan::render::holds_templates;
use crate::reconcile::plan::render_failed;
use crate::reconcile::plan::request::{self, RenderJob, RenderOutput, RenderRequest};
use crate::reconcile::plan::values::facts;

/// What a failure says it was doing.
const RENDERING: &str = "rendering the templates";

/// Renders `request` for `template`, in a child process unless its outcome is known.
pub async fn render(
    request: RenderRequest,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<RenderOutput, Refusal> {
    let (input, key) = request.encode().map_err(render_failed)?;
    let engines = &context.engines;
    match engines.known(&key) {
        Some(Known::Fits) => {
            count(context, "cached");
            return in_process(request).await;
        }
        Some(Known::Overgrew(said)) => {
            count(context, "cached");
            return Err(engine_refusal(RENDERING, EngineError::Run(said)));
        }
        None => {}
    }
    let owner = turn_owner(template);
    let answer = engines.render_isolated(&owner, key, input).await;
    count(context, if answer.is_ok() { "rendered" } else { "failed" });
    let answer = answer.map_err(|error| engine_refusal(RENDERING, error))?;
    request::decode(answer.as_bytes()).map_err(render_failed)
}

/// Every template string of `value` rendered with `environment`'s facts; a field's name is
/// where it is, for errors (`helm.values`).
pub async fn render_strings(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    value: Value,
    context: &Context,
) -> Result<Value, Refusal> {
    if !holds_templates(&value) {
        return Ok(value);
    }
    let request = RenderRequest {
        facts: facts(environment, &template.spec, namespace),
        url: template.spec.url.clone(),
        job: RenderJob::Strings(value),
    };
    render(request, template, context)
        .await?
        .strings()
        .map_err(render_failed)
}

/// A request known to fit, rendered on a blocking thread (it may take up to its fuel).
async fn in_process(request: RenderRequest) -> Result<RenderOutput, Refusal> {
    match tokio::task::spawn_blocking(move || request.render()).await {
        Ok(rendered) => rendered.map_err(render_failed),
        Err(stopped) => Err(Refusal::new(
            "RenderFailed",
            format!("rendering stopped unexpectedly, a bug in previewd: {stopped}"),
        )),
    }
}

fn count(context: &Context, outcome: &str) {
    context
        .metrics
        .engine_renders
        .with_label_values(&["templates", outcome])
        .inc();
}
