//! The reconcile's render and plan steps for one environment, with no cluster: what
//! `previewd render` shows a template author. It is the pipeline's own step
//! (`pipeline::render_and_plan`: the repository's manifests, the engines, the isolated template
//! render, `plan::plan_rendered` with its limits and content policy), given a [`Renderer`] of
//! the caller's. What needs the cluster is left out and said by the caller: ConfigMap sources
//! (refused here), the kinds the cluster serves, copied Secrets, and which environment holds a
//! URL host.

use std::sync::Arc;

use super::error::Refusal;
use super::pipeline::render_and_plan;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::model::naming::environment_namespace;
use crate::plan::{Limits, Plan};

pub use super::renders::renderer::{ForgeAccess, Renderer, RepositoryFiles};

/// The plan the controller would apply for `environment` of `template`, or its refusal (the
/// reason and message the environment's condition and PR comment would show).
pub async fn plan(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    renderer: &Renderer<'_>,
    limits: Limits,
) -> Result<Plan, Refusal> {
    let namespace = environment_namespace(environment, &template.spec);
    let template = Arc::new(template.clone());
    // No cluster (a ConfigMap source is refused), and nothing runs yet: no replica count to
    // remember.
    render_and_plan(
        environment,
        &template,
        &namespace,
        renderer,
        None,
        limits,
        |_| None,
    )
    .await
}
