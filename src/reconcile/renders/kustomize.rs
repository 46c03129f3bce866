//! A template's Kustomize overlay (`spec.manifests.kustomize`) built by Kustomize for one
//! environment. The folder `root` is read from the repository at the head commit (once per
//! commit); previewd's own kustomization on top sets the namespace, and the template's images
//! and patches with every string rendered as a template of the environment's facts.

use serde_json::Value;

use super::renderer::Renderer;
use super::{counted, isolated, turn_owner};
use crate::engines::kustomize::{self, KustomizeRender};
use crate::model::crd::{InlineManifest, KustomizeSource, PreviewEnvironment, PreviewTemplate};
use crate::plan::render_failed;
use crate::plan::request::{RenderJob, RenderRequest};
use crate::plan::values::facts;
use crate::reconcile::error::{Refusal, RefusalReason};

/// The overlay's objects as one manifest named after it; none when the template has no
/// overlay.
pub async fn build_overlay(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    renderer: &Renderer<'_>,
) -> Result<Vec<InlineManifest>, Refusal> {
    let Some(kustomize) = &template.spec.manifests.kustomize else {
        return Ok(Vec::new());
    };
    let (root, overlay) = folders(kustomize)?;
    let (images, patches) = on_top(environment, template, kustomize, namespace, renderer).await?;
    let files = renderer.files.folder(environment, template, &root).await?;
    check_overlay(
        environment,
        template,
        namespace,
        &files,
        &root,
        &overlay,
        renderer,
    )
    .await?;
    let render = KustomizeRender {
        files: &files,
        root: &root,
        overlay: &overlay,
        namespace,
        images: &images,
        patches: &patches,
    };
    let rendered = renderer
        .engines
        .kustomize_build(&render, &turn_owner(template))
        .await;
    let rendered = counted(rendered, "kustomize", "kubectl kustomize", renderer)?;
    Ok(vec![InlineManifest {
        name: format!("kustomize {}", kustomize.path.trim_matches('/')),
        template: rendered.text.to_string(),
    }])
}

/// Checks in a render worker that the overlay refers only to what previewd read
/// (`engines::kustomize::check_references`): its kustomizations are parsed there, under the
/// worker's memory limit, never in previewd's own process. What refers outside is refused
/// before Kustomize runs, with the file and entry named; the kernel's walls hold behind it.
async fn check_overlay(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    files: &[(String, Vec<u8>)],
    root: &str,
    overlay: &str,
    renderer: &Renderer<'_>,
) -> Result<(), Refusal> {
    let request = RenderRequest {
        facts: facts(environment, &template.spec, namespace),
        url: template.spec.url.clone(),
        job: RenderJob::CheckOverlay(kustomize::outline(files, overlay)),
    };
    let checked = isolated::render(request, template, renderer)
        .await?
        .checked()
        .map_err(render_failed)?;
    checked.map_err(|refused| {
        Refusal::new(
            RefusalReason::RenderFailed,
            format!(
                "kubectl kustomize: {}; nothing was applied",
                kustomize::in_root(root, &refused)
            ),
        )
    })
}

/// The folder to read (`root`) and the overlay's path inside it.
fn folders(kustomize: &KustomizeSource) -> Result<(String, String), Refusal> {
    let path = kustomize.path.trim_matches('/');
    let root = kustomize.root.as_deref().unwrap_or(path).trim_matches('/');
    let overlay = if path == root {
        Some("")
    } else if root.is_empty() {
        Some(path)
    } else {
        path.strip_prefix(root)
            .and_then(|rest| rest.strip_prefix('/'))
    };
    match overlay {
        Some(overlay) if !path.is_empty() || kustomize.root.is_some() => {
            Ok((root.to_string(), overlay.to_string()))
        }
        _ => Err(Refusal::new(
            RefusalReason::ManifestsUnavailable,
            format!(
                "kustomize.path {path:?} must be a folder inside kustomize.root {root:?} \
                 (the folder previewd reads)"
            ),
        )),
    }
}

/// The template's images and patches as Kustomize entries, every string rendered.
async fn on_top(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    kustomize: &KustomizeSource,
    namespace: &str,
    renderer: &Renderer<'_>,
) -> Result<(Vec<Value>, Vec<Value>), Refusal> {
    let entries = |list: Result<Vec<Value>, serde_json::Error>| {
        list.map_err(|e| {
            Refusal::new(
                RefusalReason::RenderFailed,
                format!("kustomize entries: {e}"),
            )
        })
    };
    let images = entries(kustomize.images.iter().map(serde_json::to_value).collect())?;
    let patches = entries(kustomize.patches.iter().map(serde_json::to_value).collect())?;
    let given = serde_json::json!({"kustomize.images": images, "kustomize.patches": patches});
    let mut rendered =
        isolated::render_strings(environment, template, namespace, given, renderer).await?;
    let list = |value: Value| match value {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    Ok((
        list(rendered["kustomize.images"].take()),
        list(rendered["kustomize.patches"].take()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(path: &str, root: Option<&str>) -> KustomizeSource {
        KustomizeSource {
            path: path.into(),
            root: root.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn the_overlay_is_found_inside_the_folder_read() {
        let found = |path, root| folders(&source(path, root)).map_err(|r| r.message);
        assert_eq!(
            found("deploy/overlays/preview", Some("deploy")),
            Ok(("deploy".into(), "overlays/preview".into()))
        );
        assert_eq!(
            found("deploy/preview/", None),
            Ok(("deploy/preview".into(), String::new()))
        );
        assert_eq!(
            found("overlays/preview", Some("")),
            Ok((String::new(), "overlays/preview".into()))
        );
        assert!(found("other/preview", Some("deploy")).is_err());
        assert!(found("deployment/x", Some("deploy")).is_err());
        assert!(found("", None).is_err());
    }
}
