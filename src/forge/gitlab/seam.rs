//! GitLab behind previewd's one seam ([`ForgeApi`]): the calls of [`GitlabApi`], the
//! environment and its deployments per head commit, and what they cost.

use std::collections::HashSet;

use kube::ResourceExt;

use super::api::GitlabApi;
use crate::forge::seam::{Answer, AtPath, Connect, Depth, ForgeApi, Listing, TreeFile};
use crate::forge::transport::ForgeApiError;
use crate::forge::vocabulary::{DeployUpdate, DeploymentState, Retire, StatusUpdate};
use crate::model::crd::{ForgeReport, PreviewEnvironment};

/// A GitLab client for `connect` ([`crate::forge::seam::Forge::connect`]).
pub(super) fn connect(connect: Connect) -> Answer<'static, Box<dyn ForgeApi>> {
    Box::pin(async move {
        let api_url = connect.api_url.as_deref();
        let api = GitlabApi::connect(api_url, connect.token, connect.metrics)
            .await?
            .keeping_blobs_in(connect.blobs)
            .scoped(connect.scope);
        Ok(Box::new(api) as Box<dyn ForgeApi>)
    })
}

/// The environment when it is new or its URL changed, then a deployment per new head or its
/// finished state once, as [`GitlabApi::deploy_head`] sends them.
pub(super) fn deploy_requests(
    update: &DeployUpdate,
    record: &ForgeReport,
    head: &str,
) -> Vec<&'static str> {
    let new_head = record.deployment_sha.as_deref() != Some(head);
    let mut requests = Vec::new();
    let url = update.status.url.as_str();
    let new_url = !url.is_empty() && record.environment_url.as_deref() != Some(url);
    if record.environment_id.is_none() || new_url {
        requests.push("environment");
    }
    let state = format!("{:?}", update.deployment_state);
    let finished = update.deployment_state != DeploymentState::InProgress;
    if new_head || (finished && record.deployment_state.as_deref() != Some(&state)) {
        requests.push("deployment");
    }
    requests
}

/// The environment is stopped.
pub(super) fn retire(record: &ForgeReport) -> Option<Retire> {
    record.environment_id.map(|id| Retire {
        id,
        request: "environment",
    })
}

/// The GitLab environment of a preview environment: `preview/<namespace>/<name>`. GitLab folds
/// the environments under `preview/` into one folder of its Environments page; the namespace
/// keeps two teams' templates of the same name for one project (each in its own namespace)
/// from sharing, and stopping, each other's GitLab environment.
fn environment_name(environment: &PreviewEnvironment) -> String {
    let namespace = environment.namespace().unwrap_or_default();
    format!("preview/{namespace}/{}", environment.name_any())
}

impl ForgeApi for GitlabApi {
    fn scope(&self) -> &str {
        GitlabApi::scope(self)
    }

    fn find_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        marker: &'a str,
    ) -> Answer<'a, Option<u64>> {
        Box::pin(GitlabApi::find_comment(self, repository, number, marker))
    }

    fn create_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        body: &'a str,
    ) -> Answer<'a, u64> {
        Box::pin(GitlabApi::create_comment(self, repository, number, body))
    }

    fn edit_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        id: u64,
        body: &'a str,
    ) -> Answer<'a, ()> {
        Box::pin(GitlabApi::edit_comment(self, repository, number, id, body))
    }

    fn list_path<'a>(&'a self, at: Listing<'a>, depth: Depth) -> Answer<'a, AtPath> {
        Box::pin(self.at_path(at, depth))
    }

    fn read_files<'a>(
        &'a self,
        at: Listing<'a>,
        files: Vec<TreeFile>,
    ) -> Answer<'a, Vec<(String, Vec<u8>)>> {
        Box::pin(self.read_blobs(at.repository, at.reader, at.path, files))
    }

    fn open_requests<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<u64>> {
        Box::pin(self.open_merge_requests(repository))
    }

    fn branches<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<String>> {
        Box::pin(GitlabApi::branches(self, repository))
    }

    /// GitLab names users by id: a comment without one is not a member's.
    fn write_access<'a>(
        &'a self,
        repository: &'a str,
        _user: &'a str,
        user_id: Option<u64>,
    ) -> Answer<'a, bool> {
        Box::pin(async move {
            match user_id {
                Some(id) => GitlabApi::write_access(self, repository, id).await,
                None => Ok(false),
            }
        })
    }

    fn commit_status<'a>(
        &'a self,
        repository: &'a str,
        status: &'a StatusUpdate,
    ) -> Answer<'a, ()> {
        Box::pin(GitlabApi::commit_status(
            self,
            repository,
            &status.commit,
            status.state,
            &status.context,
            &status.url,
            &status.description,
        ))
    }

    fn deploy<'a>(
        &'a self,
        environment: &'a PreviewEnvironment,
        update: &'a DeployUpdate,
        record: &'a mut ForgeReport,
    ) -> Answer<'a, ()> {
        Box::pin(self.deploy_head(environment, update, record))
    }

    fn retire<'a>(&'a self, repository: &'a str, retire: &'a Retire) -> Answer<'a, ()> {
        Box::pin(self.stop_environment(repository, retire.id))
    }
}

impl GitlabApi {
    /// Registers the environment in GitLab (once; its external URL when it changes) and keeps
    /// one deployment per head commit, so the merge request widget shows *View app*. A new
    /// deployment starts as `running` and then goes to `success` or `failed`; GitLab allows
    /// no way back to `running`, so a later `InProgress` is not sent to a deployment that
    /// finished.
    async fn deploy_head(
        &self,
        environment: &PreviewEnvironment,
        update: &DeployUpdate,
        record: &mut ForgeReport,
    ) -> Result<(), ForgeApiError> {
        let source = &environment.spec.source;
        let project = &source.repository;
        let name = environment_name(environment);
        let url = update.status.url.as_str();
        match record.environment_id {
            None => {
                record.environment_id = Some(self.environment(project, &name, url).await?);
                record.environment_url = Some(url.to_string());
            }
            Some(id) if !url.is_empty() && record.environment_url.as_deref() != Some(url) => {
                self.environment_url(project, id, url).await?;
                record.environment_url = Some(url.to_string());
            }
            Some(_) => {}
        }
        let state = format!("{:?}", update.deployment_state);
        if record.deployment_sha.as_deref() != Some(source.head_sha.as_str()) {
            let id = self
                .create_deployment(
                    project,
                    &name,
                    &source.head_sha,
                    &source.branch,
                    update.deployment_state,
                )
                .await?;
            record.deployment_id = Some(id);
            record.deployment_sha = Some(source.head_sha.clone());
            record.deployment_state = Some(state);
            return Ok(());
        }
        let finished = update.deployment_state != DeploymentState::InProgress;
        if let Some(id) = record.deployment_id
            && finished
            && record.deployment_state.as_deref() != Some(state.as_str())
        {
            self.deployment_status(project, id, update.deployment_state)
                .await?;
            record.deployment_state = Some(state);
        }
        Ok(())
    }
}
