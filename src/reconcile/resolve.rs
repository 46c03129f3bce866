//! The resolve step: the environment's template (from the watch cache) and the template's
//! manifests: inline, every key of a ConfigMap (sorted by key), and a folder of the repository
//! at the head commit (read through the forge API, cached by commit).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::error::{Refusal, RefusalReason};
use super::renders::renderer::{Renderer, unavailable};
use crate::cluster::errors::in_words;
use crate::model::crd::{InlineManifest, ManifestSource, PreviewEnvironment, PreviewTemplate};

/// The environment's template, or the refusal `TemplateNotFound`.
pub fn template(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Arc<PreviewTemplate>, Refusal> {
    context.template_of(environment).ok_or_else(|| {
        Refusal::new(
            RefusalReason::TemplateNotFound,
            format!(
                "PreviewTemplate {:?} not found in namespace {:?}",
                environment.spec.template,
                environment.namespace().unwrap_or_default()
            ),
        )
    })
}

/// Every manifest template of the template, or the refusal `ManifestsUnavailable` saying which
/// source failed and why. (A Helm chart is read and rendered by the `charts` step.) A
/// ConfigMap source is read from `cluster` (none: refused, for a dry run to say).
pub async fn manifests(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    renderer: &Renderer<'_>,
    cluster: Option<&kube::Client>,
) -> Result<Vec<InlineManifest>, Refusal> {
    let ManifestSource {
        inline,
        config_map,
        repository_path,
        helm,
        kustomize,
    } = &template.spec.manifests;
    let mut all = inline.clone();
    if let Some(path) = repository_path {
        all.extend(from_repository(environment, template, path, renderer).await?);
    }
    if let Some(source) = config_map {
        let Some(cluster) = cluster else {
            let name = &source.name;
            return Err(unavailable(format!(
                "ConfigMap {name:?} is read from the cluster, and there is none"
            )));
        };
        all.extend(from_config_map(template, &source.name, cluster).await?);
    }
    if all.is_empty() && helm.is_none() && kustomize.is_none() {
        return Err(unavailable("the template has no manifests"));
    }
    Ok(all)
}

async fn from_repository(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    path: &str,
    renderer: &Renderer<'_>,
) -> Result<Vec<InlineManifest>, Refusal> {
    let files = renderer
        .files
        .manifests(environment, template, path)
        .await?;
    Ok(files.iter().cloned().collect())
}

async fn from_config_map(
    template: &PreviewTemplate,
    name: &str,
    cluster: &kube::Client,
) -> Result<Vec<InlineManifest>, Refusal> {
    let api: Api<ConfigMap> =
        Api::namespaced(cluster.clone(), &template.namespace().unwrap_or_default());
    let map = api
        .get_opt(name)
        .await
        .map_err(|e| unavailable(format!("reading ConfigMap {name}: {}", in_words(&e))))?
        .ok_or_else(|| {
            unavailable(format!(
                "ConfigMap {name:?} named by the template does not exist"
            ))
        })?;
    Ok(map
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, text)| InlineManifest {
            name: format!("{name}/{key}"),
            template: text,
        })
        .collect())
}
