//! The engine step: the template's manifests that a third-party engine renders, a Helm chart
//! ([`helm`], `spec.manifests.helm`) and a Kustomize overlay ([`kustomize`],
//! `spec.manifests.kustomize`). The engine's output goes to the plan step like any manifest,
//! marked as already rendered (never rendered again as a minijinja template).
//!
//! What the template gives an engine (values, images, patches) is rendered first, every string
//! a template of the environment's facts, in a child process the first time ([`isolated`], as
//! the template's manifests are). Engine failures are said the
//! same way for both ([`engine_refusal`]), and counted in `previewd_engine_renders_total`.

mod helm;
pub mod isolated;
mod kustomize;
pub mod renderer;

use super::error::{ReconcileError, Refusal, RefusalReason};
use crate::engines::{EngineError, Rendered, process::RunError};
use crate::model::crd::{InlineManifest, PreviewEnvironment, PreviewTemplate};
use renderer::Renderer;

/// The objects the template's engines render for this environment; none when it uses no
/// engine.
pub async fn render_engines(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    renderer: &Renderer<'_>,
) -> Result<Vec<InlineManifest>, Refusal> {
    let mut rendered = helm::render_chart(environment, template, namespace, renderer).await?;
    rendered.extend(kustomize::build_overlay(environment, template, namespace, renderer).await?);
    Ok(rendered)
}

/// Counts the render (`previewd_engine_renders_total{engine, outcome}`) and says a failure.
fn counted(
    rendered: Result<Rendered, EngineError>,
    engine: &str,
    command: &str,
    renderer: &Renderer<'_>,
) -> Result<Rendered, Refusal> {
    let outcome = match &rendered {
        Ok(r) if r.cached => "cached",
        Ok(_) => "rendered",
        Err(_) => "failed",
    };
    renderer.renders.with_label_values(&[engine, outcome]).inc();
    rendered.map_err(|error| engine_refusal(command, error))
}

/// What a failed render says on the environment. Input that does not render, or renders too
/// much or too slowly, stays so until the commit or template changes: not retried. The engine
/// missing or a full disk is previewd's problem, and a chart repository that does not answer
/// may come back: both retried with backoff.
fn engine_refusal(command: &str, error: EngineError) -> Refusal {
    let message = format!("{command}: {error}; nothing was applied");
    let reason = match &error {
        EngineError::Run(RunError::NotStarted { .. } | RunError::NotContained { .. })
        | EngineError::Io(_) => RefusalReason::RenderFailed,
        // The chart repository may come back: retried with backoff, and said as such.
        EngineError::Fetch(_) => RefusalReason::ChartUnavailable,
        // Memory and output are the input's doing on any node: set aside. (A timeout may be
        // the node's load: said, not set aside.)
        EngineError::Exhausted(_) => return set_aside(message),
        EngineError::SaidBefore(said) if !matches!(said, RunError::TimedOut { .. }) => {
            return set_aside(message);
        }
        _ => return Refusal::new(RefusalReason::RenderFailed, message),
    };
    Refusal {
        retry: Some(Box::new(ReconcileError::Engine(error))),
        ..Refusal::new(reason, message)
    }
}

/// A render refusal that sets the commit aside (`super::quarantine` completes the record).
fn set_aside(message: String) -> Refusal {
    Refusal {
        quarantine: Some(Box::new(crate::model::crd::Quarantine {
            message: message.clone(),
            ..Default::default()
        })),
        ..Refusal::new(RefusalReason::RenderFailed, message)
    }
}

/// Whose turn at the engines a template's renders take: the template's (`namespace/name`), so
/// that one template's slow renders cannot hold every turn.
fn turn_owner(template: &crate::model::crd::PreviewTemplate) -> String {
    use kube::ResourceExt;
    format!(
        "{}/{}",
        template.namespace().unwrap_or_default(),
        template.name_any()
    )
}

/// Whether a piece of a YAML stream holds more than separators and blank lines.
fn has_content(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim();
        !line.is_empty() && line != "---"
    })
}
