//! What rendering an environment's manifests needs, and nothing of the cluster: the engines,
//! the counter of their renders, and the template's repository at a commit. The controller
//! makes one from its context (`Context::renderer`); a dry run can make one without a cluster,
//! with a forge client of its own.

use std::sync::Arc;

use prometheus::IntCounterVec;

use crate::engines::Engines;
use crate::forge::client::{ForgeApiError, ForgeClient};
use crate::forge::repository::{FolderFiles, RepositoryManifests};
use crate::forge::template_client::TemplateClients;
use crate::model::crd::{InlineManifest, PreviewEnvironment, PreviewTemplate};
use crate::reconcile::error::{Refusal, RefusalReason};

pub struct Renderer<'a> {
    pub engines: &'a Engines,
    /// `previewd_engine_renders_total{engine, outcome}`.
    pub renders: &'a IntCounterVec,
    pub files: RepositoryFiles<'a>,
}

/// The template's repository, read through the forge API and kept by commit.
pub struct RepositoryFiles<'a> {
    pub access: ForgeAccess<'a>,
    pub kept: &'a RepositoryManifests,
}

/// Which forge client reads the repository.
pub enum ForgeAccess<'a> {
    /// The one the template's token (or GitHub App) opens, as for its reports.
    Template(&'a TemplateClients),
    /// A given one (a dry run's).
    Given(Arc<ForgeClient>),
}

/// Who reads the repository, for its share of the repository's reads: the environment, for
/// one folder of its template (a template may read up to three: its manifests, its chart and
/// its overlay, each up to 200 files; each has a share, so that the first commit's folders
/// all fit).
fn reader(environment: &PreviewEnvironment, path: &str) -> String {
    use kube::ResourceExt;
    let namespace = environment.namespace().unwrap_or_default();
    format!("{namespace}/{}:{path}", environment.name_any())
}

impl RepositoryFiles<'_> {
    /// The manifests in `path` of the template's repository at the environment's head, read
    /// on the environment's share of the repository's reads.
    pub async fn manifests(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        path: &str,
    ) -> Result<Arc<Vec<InlineManifest>>, Refusal> {
        let client = self.client(template, path).await?;
        let repository = &template.spec.forge.repository;
        let head_sha = &environment.spec.source.head_sha;
        self.kept
            .get(
                &client,
                repository,
                path,
                head_sha,
                &reader(environment, path),
            )
            .await
            .map_err(|e| repository_refusal(path, head_sha, e))
    }

    /// Every file of folder `path` of the template's repository at the environment's head,
    /// read on the environment's share of the repository's reads.
    pub async fn folder(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        path: &str,
    ) -> Result<Arc<FolderFiles>, Refusal> {
        let client = self.client(template, path).await?;
        let repository = &template.spec.forge.repository;
        let head_sha = &environment.spec.source.head_sha;
        self.kept
            .folder(
                &client,
                repository,
                path,
                head_sha,
                &reader(environment, path),
            )
            .await
            .map_err(|e| repository_refusal(path, head_sha, e))
    }

    /// The forge client for reading `path` from the template's repository, or why there is
    /// none.
    async fn client(
        &self,
        template: &PreviewTemplate,
        path: &str,
    ) -> Result<Arc<ForgeClient>, Refusal> {
        let clients = match &self.access {
            ForgeAccess::Given(client) => return Ok(client.clone()),
            ForgeAccess::Template(clients) => clients,
        };
        clients
            .client(template)
            .await
            .map_err(|e| unavailable(format!("reading {path} from the repository: {e}")))?
            .ok_or_else(|| {
                unavailable(format!(
                    "reading {path} from the repository needs forge.tokenSecretRef"
                ))
            })
    }
}

pub(in crate::reconcile) fn unavailable(message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalReason::ManifestsUnavailable, message)
}

/// What a failed read of `path` at `head_sha` says on the environment.
fn repository_refusal(path: &str, head_sha: &str, error: ForgeApiError) -> Refusal {
    match error {
        // A commit never changes: nothing to retry until a new push.
        ForgeApiError::ManifestsTooLarge { .. } => Refusal::new(
            RefusalReason::ManifestsTooLarge,
            format!("reading {path} at {head_sha}: {error}; nothing was applied"),
        ),
        ForgeApiError::NotAFolder { .. } | ForgeApiError::NotInRepository { .. } => Refusal::new(
            RefusalReason::ManifestsUnavailable,
            format!("reading {path} at {head_sha}: {error}; nothing was applied"),
        ),
        e => unavailable(format!("reading {path} at {head_sha}: {e}")),
    }
}
