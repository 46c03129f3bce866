//! What the templates see: the values a render gets for one environment (branch, commit, pull
//! request, namespace, host and URL, the template's extra values).

use kube::ResourceExt;

use super::render::{self, RenderContext, RenderError};
use crate::model::crd::{PreviewEnvironment, PreviewTemplateSpec, UrlSpec};
use crate::model::naming;

/// The render values for `environment` deployed into `namespace`. The host is itself a template
/// (`url.host`), rendered with the other values.
pub fn render_context(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
    namespace: &str,
) -> Result<RenderContext, RenderError> {
    with_url(facts(environment, template, namespace), &template.url)
}

/// The render values without the host and URL (which are rendered from them, [`with_url`]).
pub fn facts(
    environment: &PreviewEnvironment,
    template: &PreviewTemplateSpec,
    namespace: &str,
) -> RenderContext {
    let source = &environment.spec.source;
    RenderContext {
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
    }
}

/// `context` with its host rendered from `url.host` (by default `<namespace>.preview.localhost`)
/// and its URL.
pub fn with_url(mut context: RenderContext, url: &UrlSpec) -> Result<RenderContext, RenderError> {
    context.host = match &url.host {
        Some(host) => render::render_string("url.host", host, &context)?,
        None => format!("{}.preview.localhost", context.namespace),
    };
    context.url = format!(
        "{}://{}",
        url.scheme.as_deref().unwrap_or("https"),
        context.host
    );
    Ok(context)
}
