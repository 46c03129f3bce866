//! The reconcile's render and plan steps for one environment, with no cluster: what
//! `previewd render` shows a template author. The same steps as the controller's pipeline
//! (`resolve::manifests`, `renders::render_engines`, the isolated template render,
//! `plan::plan_rendered` with its limits and content policy), in the same order, given a
//! [`Renderer`] of the caller's. What needs the cluster is left out and said by the caller:
//! ConfigMap sources (refused here), the kinds the cluster serves, copied Secrets, and which
//! environment holds a URL host.

use super::error::Refusal;
use super::plan::{Limits, Plan, plan_rendered, render_failed, templates_request};
use super::renders;
use super::resolve;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::model::naming::environment_namespace;

pub use super::renders::renderer::{ForgeAccess, Renderer, RepositoryFiles};

/// The plan the controller would apply for `environment` of `template`, or its refusal (the
/// reason and message the environment's condition and PR comment would show).
pub async fn plan(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    renderer: &Renderer<'_>,
    limits: &Limits,
) -> Result<Plan, Refusal> {
    let namespace = environment_namespace(environment, &template.spec);
    let head_sha = &environment.spec.source.head_sha;
    let templates = resolve::manifests(template, head_sha, renderer, None).await?;
    let from_engines = renders::render_engines(environment, template, &namespace, renderer).await?;
    let request = templates_request(environment, template, templates, &namespace);
    let rendered = renders::isolated::render(request, template, renderer)
        .await?
        .templates()
        .map_err(render_failed)?;
    // Nothing runs yet: no replica count to remember.
    plan_rendered(
        environment,
        template,
        rendered,
        &from_engines,
        &namespace,
        limits,
        |_| None,
    )
}
