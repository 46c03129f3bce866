//! `GET /projects/:id/repository/tree` with `path` and `ref` in the query, where GitLab documents
//! them. The gitlab crate's own `Tree` endpoint (0.1905) sends both as a form body on the GET,
//! which a proxy in front of GitLab may drop; previewd would then list the repository's root at
//! the default branch instead of the manifest folder at the commit under review. Found by
//! `tests/integration/webhooks.rs` `gitlab_manifests_from_the_repository_are_read_at_the_merge_requests_commit`.

use std::borrow::Cow;

use gitlab::api::common::NameOrId;
use gitlab::api::{Endpoint, Pageable, QueryParams};
use http::Method;

/// The entries of folder `path` of `project` at commit `sha` (one level, or every level below
/// it when `recursive`).
pub struct TreeAt<'a> {
    pub project: &'a str,
    pub path: &'a str,
    pub sha: &'a str,
    pub recursive: bool,
}

impl Endpoint for TreeAt<'_> {
    fn method(&self) -> Method {
        Method::GET
    }

    fn endpoint(&self) -> Cow<'static, str> {
        let project = NameOrId::from(self.project);
        format!("projects/{project}/repository/tree").into()
    }

    fn parameters(&self) -> QueryParams<'_> {
        let mut params = QueryParams::default();
        params.push("path", self.path).push("ref", self.sha);
        if self.recursive {
            params.push("recursive", true);
        }
        params
    }
}

impl Pageable for TreeAt<'_> {
    fn use_keyset_pagination(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_ref_go_in_the_query_and_the_project_is_one_segment() {
        let tree = TreeAt {
            project: "group/project",
            path: "deploy/preview",
            sha: "da15608",
            recursive: false,
        };
        assert_eq!(tree.endpoint(), "projects/group%2Fproject/repository/tree");
        let mut url = url::Url::parse("https://gitlab.example/api/v4/").unwrap();
        tree.parameters().add_to_url(&mut url);
        assert_eq!(url.query(), Some("path=deploy%2Fpreview&ref=da15608"));
        assert!(tree.body().unwrap().is_none(), "nothing in a GET body");
    }
}
