//! What the templates see: the values a render gets for one environment (branch, commit, pull
//! request, namespace, host and URL, the template's extra values).

use kube::ResourceExt;

use super::render::{self, RenderContext, RenderError};
use crate::model::crd::{PreviewEnvironment, PreviewTemplateSpec};
use crate::model::naming;

/// The render values for `environment` deployed into `namespace`. The host is itself a template
/// (`url.host`), rendered with the other values.
pub fn render_context(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
    namespace: &str,
) -> Result<RenderContext, RenderError> {
    let source = &environment.spec.source;
    let mut context = RenderContext {
        name: environment.name_any(),
        branch: source.branch.clone(),
        slug: naming::unique_slug(&source.branch),
        sha: source.head_sha.clone(),
        short_sha: source.head_sha.chars().take(7).collect(),
        pr: source.pull_request,
        repository: source.repository.clone(),
        author: source.author.clone().unwrap_or_default(),
        namespace: namespace.to_string(),
        host: String::new(),
        url: String::new(),
        values: template.values.clone(),
    };
    context.host = match &template.url.host {
        Some(host) => render::render_string("url.host", host, &context)?,
        None => format!("{namespace}.preview.localhost"),
    };
    context.url = format!(
        "{}://{}",
        template.url.scheme.as_deref().unwrap_or("https"),
        context.host
    );
    Ok(context)
}
