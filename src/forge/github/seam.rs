//! GitHub behind previewd's one seam ([`ForgeApi`]): the calls of [`GithubApi`], the
//! deployment reports (a GitHub Deployment per head commit, with a status per change), and
//! what they cost.

use std::collections::HashSet;

use kube::ResourceExt;

use super::api::GithubApi;
use crate::forge::seam::{Answer, AtPath, Connect, Depth, ForgeApi, Listing, TreeFile};
use crate::forge::vocabulary::{DeployUpdate, DeploymentState, Retire, StatusUpdate};
use crate::model::crd::{ForgeReport, PreviewEnvironment};

/// A GitHub client for `connect` ([`crate::forge::seam::Forge::connect`]).
pub(super) fn connect(connect: Connect) -> Answer<'static, Box<dyn ForgeApi>> {
    Box::pin(async move {
        let api_url = connect.api_url.as_deref();
        let api = GithubApi::new(api_url, connect.token, connect.budget, connect.metrics)?
            .commenting_as(connect.author)
            .keeping_blobs_in(connect.blobs)
            .scoped(connect.scope);
        Ok(Box::new(api) as Box<dyn ForgeApi>)
    })
}

/// A deployment per new head and a status of it, as [`GithubApi::deploy`] sends them.
pub(super) fn deploy_requests(
    _update: &DeployUpdate,
    record: &ForgeReport,
    head: &str,
) -> Vec<&'static str> {
    let new_head = record.deployment_sha.as_deref() != Some(head);
    let mut requests = Vec::new();
    if new_head {
        requests.push("deployment");
    }
    requests.push("deployment_status");
    requests
}

/// The last deployment's status goes `inactive`.
pub(super) fn retire(record: &ForgeReport) -> Option<Retire> {
    record.deployment_id.map(|id| Retire {
        id,
        request: "deployment_status",
    })
}

impl ForgeApi for GithubApi {
    fn scope(&self) -> &str {
        GithubApi::scope(self)
    }

    fn find_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        marker: &'a str,
    ) -> Answer<'a, Option<u64>> {
        Box::pin(GithubApi::find_comment(self, repository, number, marker))
    }

    fn create_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        body: &'a str,
    ) -> Answer<'a, u64> {
        Box::pin(GithubApi::create_comment(self, repository, number, body))
    }

    fn edit_comment<'a>(
        &'a self,
        repository: &'a str,
        _number: u64,
        id: u64,
        body: &'a str,
    ) -> Answer<'a, ()> {
        Box::pin(GithubApi::edit_comment(self, repository, id, body))
    }

    fn list_path<'a>(&'a self, at: Listing<'a>, depth: Depth) -> Answer<'a, AtPath> {
        let below = depth == Depth::Every;
        Box::pin(self.tree_at(at.repository, at.reader, at.path, at.sha, below))
    }

    fn read_files<'a>(
        &'a self,
        at: Listing<'a>,
        files: Vec<TreeFile>,
    ) -> Answer<'a, Vec<(String, Vec<u8>)>> {
        Box::pin(self.read_blobs(at.repository, at.reader, at.path, files))
    }

    fn open_requests<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<u64>> {
        Box::pin(async move {
            let path = format!("/repos/{repository}/pulls?state=open");
            let pages = self
                .list_all("list_pull_requests", &path, &["number"])
                .await?;
            Ok(pages
                .iter()
                .filter_map(|pr| pr["number"].as_u64())
                .collect())
        })
    }

    fn branches<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<String>> {
        Box::pin(async move {
            let path = format!("/repos/{repository}/branches");
            let pages = self.list_all("list_branches", &path, &["name"]).await?;
            Ok(pages
                .iter()
                .filter_map(|b| b["name"].as_str().map(str::to_string))
                .collect())
        })
    }

    fn write_access<'a>(
        &'a self,
        repository: &'a str,
        user: &'a str,
        _user_id: Option<u64>,
    ) -> Answer<'a, bool> {
        Box::pin(GithubApi::write_access(self, repository, user))
    }

    fn commit_status<'a>(
        &'a self,
        repository: &'a str,
        status: &'a StatusUpdate,
    ) -> Answer<'a, ()> {
        Box::pin(GithubApi::commit_status(
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
        let inactive = DeploymentState::Inactive;
        Box::pin(self.deployment_status(repository, retire.id, inactive, ""))
    }
}

impl GithubApi {
    /// A Deployment per head commit (made once), then its status for `update`.
    async fn deploy_head(
        &self,
        environment: &PreviewEnvironment,
        update: &DeployUpdate,
        record: &mut ForgeReport,
    ) -> Result<(), crate::forge::transport::ForgeApiError> {
        let source = &environment.spec.source;
        if record.deployment_sha.as_deref() != Some(source.head_sha.as_str()) {
            let name = environment.name_any();
            let deployment = self
                .create_deployment(&source.repository, &source.head_sha, &name)
                .await?;
            record.deployment_id = Some(deployment);
            record.deployment_sha = Some(source.head_sha.clone());
        }
        if let Some(deployment) = record.deployment_id {
            let (state, url) = (update.deployment_state, &update.status.url);
            self.deployment_status(&source.repository, deployment, state, url)
                .await?;
        }
        Ok(())
    }
}
