//! GitLab environments (`/projects/:id/environments`): found by name, created, given their
//! external URL, stopped. The gitlab crate (0.1905) lists environments but cannot create, edit
//! or stop one, so these endpoints are written here, as GitLab's Environments API documents
//! them. Deployments use the crate's own `CreateDeployment` / `EditDeployment`.

use std::borrow::Cow;

use gitlab::api::common::NameOrId;
use gitlab::api::{BodyError, Endpoint, FormParams, QueryParams};
use http::Method;

/// `GET /projects/:id/environments?name=…`: the environment with exactly this name, if any.
pub struct EnvironmentsNamed<'a> {
    pub project: &'a str,
    pub name: &'a str,
}

impl Endpoint for EnvironmentsNamed<'_> {
    fn method(&self) -> Method {
        Method::GET
    }

    fn endpoint(&self) -> Cow<'static, str> {
        format!("projects/{}/environments", NameOrId::from(self.project)).into()
    }

    fn parameters(&self) -> QueryParams<'_> {
        let mut params = QueryParams::default();
        params.push("name", self.name);
        params
    }
}

/// `POST /projects/:id/environments`: a new environment of tier `development` (GitLab's tier
/// for review apps), with its URL when one is known.
pub struct CreateEnvironment<'a> {
    pub project: &'a str,
    pub name: &'a str,
    pub external_url: &'a str,
}

impl Endpoint for CreateEnvironment<'_> {
    fn method(&self) -> Method {
        Method::POST
    }

    fn endpoint(&self) -> Cow<'static, str> {
        format!("projects/{}/environments", NameOrId::from(self.project)).into()
    }

    fn body(&self) -> Result<Option<(&'static str, Vec<u8>)>, BodyError> {
        let mut params = FormParams::default();
        params.push("name", self.name).push("tier", "development");
        if !self.external_url.is_empty() {
            params.push("external_url", self.external_url);
        }
        params.into_body()
    }
}

/// `PUT /projects/:id/environments/:environment_id` with a new external URL.
pub struct EditEnvironmentUrl<'a> {
    pub project: &'a str,
    pub id: u64,
    pub external_url: &'a str,
}

impl Endpoint for EditEnvironmentUrl<'_> {
    fn method(&self) -> Method {
        Method::PUT
    }

    fn endpoint(&self) -> Cow<'static, str> {
        let project = NameOrId::from(self.project);
        format!("projects/{project}/environments/{}", self.id).into()
    }

    fn body(&self) -> Result<Option<(&'static str, Vec<u8>)>, BodyError> {
        let mut params = FormParams::default();
        params.push("external_url", self.external_url);
        params.into_body()
    }
}

/// `POST /projects/:id/environments/:environment_id/stop`.
pub struct StopEnvironment<'a> {
    pub project: &'a str,
    pub id: u64,
}

impl Endpoint for StopEnvironment<'_> {
    fn method(&self) -> Method {
        Method::POST
    }

    fn endpoint(&self) -> Cow<'static, str> {
        let project = NameOrId::from(self.project);
        format!("projects/{project}/environments/{}/stop", self.id).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_bodies_are_the_ones_gitlab_documents() {
        let named = EnvironmentsNamed {
            project: "group/project",
            name: "preview/app-mr-1",
        };
        assert_eq!(named.endpoint(), "projects/group%2Fproject/environments");
        let mut url = url::Url::parse("https://gitlab.example/api/v4/").unwrap();
        named.parameters().add_to_url(&mut url);
        assert_eq!(url.query(), Some("name=preview%2Fapp-mr-1"));

        let create = CreateEnvironment {
            project: "group/project",
            name: "preview/app-mr-1",
            external_url: "",
        };
        let (kind, body) = create.body().unwrap().unwrap();
        assert_eq!(kind, "application/x-www-form-urlencoded");
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "name=preview%2Fapp-mr-1&tier=development",
            "no external_url while none is known"
        );
        let edit = EditEnvironmentUrl {
            project: "group/project",
            id: 5,
            external_url: "https://a.example",
        };
        assert_eq!(edit.endpoint(), "projects/group%2Fproject/environments/5");
        let stop = StopEnvironment {
            project: "group/project",
            id: 5,
        };
        assert_eq!(
            stop.endpoint(),
            "projects/group%2Fproject/environments/5/stop"
        );
    }
}
