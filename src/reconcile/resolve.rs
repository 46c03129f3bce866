//! The resolve step: the environment's template (from the watch cache) and the template's
//! manifests: inline, every key of a ConfigMap (sorted by key), and a folder of the repository
//! at the head commit (read through the forge API, cached by commit).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::error::Refusal;
use crate::cluster::errors::in_words;
use crate::forge::client::{ForgeApiError, ForgeClient};
use crate::model::crd::{InlineManifest, ManifestSource, PreviewEnvironment, PreviewTemplate};

/// The environment's template, or the refusal `TemplateNotFound`.
pub fn template(
    environment: &PreviewEnvironment,
    context: &Context,
) -> Result<Arc<PreviewTemplate>, Refusal> {
    context.template_of(environment).ok_or_else(|| {
        Refusal::new(
            "TemplateNotFound",
            format!(
                "PreviewTemplate {:?} not found in namespace {:?}",
                environment.spec.template,
                environment.namespace().unwrap_or_default()
            ),
        )
    })
}

/// Every manifest template of the template, or the refusal `ManifestsUnavailable` saying which
/// source failed and why. (A Helm chart is read and rendered by the `charts` step.)
pub async fn manifests(
    template: &PreviewTemplate,
    head_sha: &str,
    context: &Context,
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
        all.extend(from_repository(template, path, head_sha, context).await?);
    }
    if let Some(source) = config_map {
        all.extend(from_config_map(template, &source.name, context).await?);
    }
    if all.is_empty() && helm.is_none() && kustomize.is_none() {
        return Err(unavailable("the template has no manifests"));
    }
    Ok(all)
}

fn unavailable(message: impl Into<String>) -> Refusal {
    Refusal::new("ManifestsUnavailable", message)
}

async fn from_repository(
    template: &PreviewTemplate,
    path: &str,
    head_sha: &str,
    context: &Context,
) -> Result<Vec<InlineManifest>, Refusal> {
    let client = forge_client(template, path, context).await?;
    let files = context
        .repository_manifests
        .get(&client, &template.spec.forge.repository, path, head_sha)
        .await
        .map_err(|e| repository_refusal(path, head_sha, e))?;
    Ok(files.iter().cloned().collect())
}

/// The forge client for reading `path` from the template's repository, or why there is none.
pub(super) async fn forge_client(
    template: &PreviewTemplate,
    path: &str,
    context: &Context,
) -> Result<Arc<ForgeClient>, Refusal> {
    context
        .reporter
        .client(template)
        .await
        .map_err(|e| unavailable(format!("reading {path} from the repository: {e}")))?
        .ok_or_else(|| {
            unavailable(format!(
                "reading {path} from the repository needs forge.tokenSecretRef"
            ))
        })
}

/// What a failed read of `path` at `head_sha` says on the environment.
pub(super) fn repository_refusal(path: &str, head_sha: &str, error: ForgeApiError) -> Refusal {
    match error {
        // A commit never changes: nothing to retry until a new push.
        ForgeApiError::ManifestsTooLarge { .. } => Refusal::new(
            "ManifestsTooLarge",
            format!("reading {path} at {head_sha}: {error}; nothing was applied"),
        ),
        ForgeApiError::NotAFolder { .. } => Refusal::new(
            "ManifestsUnavailable",
            format!("reading {path} at {head_sha}: {error}; nothing was applied"),
        ),
        e => unavailable(format!("reading {path} at {head_sha}: {e}")),
    }
}

async fn from_config_map(
    template: &PreviewTemplate,
    name: &str,
    context: &Context,
) -> Result<Vec<InlineManifest>, Refusal> {
    let api: Api<ConfigMap> = Api::namespaced(
        context.client.clone(),
        &template.namespace().unwrap_or_default(),
    );
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
