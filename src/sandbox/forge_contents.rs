//! Repository contents as the forges' APIs answer them, for the forge stand-in: the calls
//! previewd makes to read manifests, charts and overlays (`src/forge/github/api.rs`,
//! `src/forge/gitlab/api.rs`), answered from [`Repositories`].
//!
//! * GitHub: `GET /repos/{owner}/{name}/contents/{path}?ref=R`: a folder's entries (`name`,
//!   `path`, `type` `file`/`dir`, `size`), or one file with its `content` in base64.
//! * GitLab: `GET /api/v4/projects/{id}/repository/tree?path=P&ref=R[&recursive=true]` (entries
//!   with `type` `blob`/`tree`; `[]` for a path that is no folder, which previewd reads as
//!   "maybe one file"), and `GET /api/v4/projects/{id}/repository/files/{path}/raw?ref=R`.
//!
//! A repository the sandbox does not serve answers 404, as before.

use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::forge_relay::{query_parameter, requested_page};
use super::repositories::{NotServed, Repositories, entries_in};

/// The answer to a contents call, or `None` when `path` is no contents call.
pub async fn answer(
    repositories: &Arc<Repositories>,
    method: &Method,
    path: &[&str],
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Response> {
    if method != Method::GET {
        return None;
    }
    let branches_of = |repository: String| {
        repositories
            .has_branches(&repository)
            .then_some(Call::Branches { repository })
    };
    let call = match path {
        ["repos", owner, name, "branches"] => branches_of(format!("{owner}/{name}"))?,
        ["api", "v4", "projects", project, "repository", "branches"] => {
            branches_of(project.to_string())?
        }
        ["repos", owner, name, "contents", rest @ ..] => Call::GithubContents {
            repository: format!("{owner}/{name}"),
            path: rest.join("/"),
        },
        ["api", "v4", "projects", project, "repository", "tree"] => Call::GitlabTree {
            repository: project.to_string(),
            path: query_parameter(query, "path").unwrap_or_default(),
            recursive: query_parameter(query, "recursive").as_deref() == Some("true"),
        },
        [
            "api",
            "v4",
            "projects",
            project,
            "repository",
            "files",
            file,
            "raw",
        ] => Call::GitlabRaw {
            repository: project.to_string(),
            path: file.to_string(),
        },
        _ => return None,
    };
    if !repositories.admits(headers) {
        let refused = json!({"message": "Bad credentials"});
        return Some((StatusCode::UNAUTHORIZED, axum::Json(refused)).into_response());
    }
    let reference = query_parameter(query, "ref").unwrap_or_default();
    let page = requested_page(query);
    let repositories = repositories.clone();
    // Listing a folder or asking git blocks: off the stand-in's async threads.
    let answered =
        tokio::task::spawn_blocking(move || call.answer(&repositories, &reference, page)).await;
    Some(answered.unwrap_or_else(|e| {
        let failed = json!({"message": format!("the stand-in failed: {e}")});
        (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(failed)).into_response()
    }))
}

enum Call {
    GithubContents {
        repository: String,
        path: String,
    },
    GitlabTree {
        repository: String,
        path: String,
        recursive: bool,
    },
    GitlabRaw {
        repository: String,
        path: String,
    },
    /// A repository's branches (a git checkout's, a plain folder's `main`), on page `1`.
    Branches {
        repository: String,
    },
}

impl Call {
    fn answer(&self, repositories: &Repositories, reference: &str, page: u64) -> Response {
        let outcome = match self {
            Call::GithubContents { repository, path } => {
                github_contents(repositories, repository, path.trim_matches('/'), reference)
            }
            Call::GitlabTree {
                repository,
                path,
                recursive,
            } => gitlab_tree(repositories, repository, path, reference, *recursive),
            Call::GitlabRaw { repository, path } => repositories
                .read(repository, reference, path)
                .map(|read| read.map(|bytes| (StatusCode::OK, bytes).into_response())),
            Call::Branches { repository } => repositories.branches(repository).map(|listed| {
                // The one list previewd pages through: everything on the first page.
                let names = listed?.into_iter().filter(|_| page <= 1);
                let named = names.map(|name| json!({"name": name})).collect();
                Ok(json_ok(Value::Array(named)))
            }),
        };
        match outcome {
            Some(Ok(response)) => response,
            Some(Err(NotServed(why))) => not_found(&why),
            None => not_found("Not Found"),
        }
    }
}

type Answered = Option<Result<Response, NotServed>>;

fn github_contents(
    repositories: &Repositories,
    repository: &str,
    path: &str,
    reference: &str,
) -> Answered {
    let files = match repositories.files(repository, reference)? {
        Ok(files) => files,
        Err(not) => return Some(Err(not)),
    };
    if files.contains_key(path) {
        return Some(
            repositories
                .read(repository, reference, path)?
                .map(|bytes| json_ok(github_file(path, &bytes))),
        );
    }
    let Some(entries) = entries_in(&files, path) else {
        return Some(Err(NotServed("Not Found".into())));
    };
    let listed: Vec<Value> = entries
        .into_iter()
        .map(|(name, folder, size)| {
            let full = joined(path, &name);
            let kind = if folder { "dir" } else { "file" };
            json!({"name": name, "path": full, "type": kind, "size": size})
        })
        .collect();
    Some(Ok(json_ok(Value::Array(listed))))
}

/// A file as GitHub's contents API gives it: base64 in lines of 60, as GitHub writes it.
fn github_file(path: &str, bytes: &[u8]) -> Value {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(60)
        .filter_map(|chunk| std::str::from_utf8(chunk).ok())
        .collect();
    let name = path.rsplit('/').next().unwrap_or(path);
    json!({
        "type": "file", "name": name, "path": path, "size": bytes.len(),
        "encoding": "base64", "content": lines.join("\n"),
    })
}

fn gitlab_tree(
    repositories: &Repositories,
    repository: &str,
    path: &str,
    reference: &str,
    recursive: bool,
) -> Answered {
    let files = match repositories.files(repository, reference)? {
        Ok(files) => files,
        Err(not) => return Some(Err(not)),
    };
    let mut listed = Vec::new();
    let mut folders = vec![path.trim_matches('/').to_string()];
    while let Some(folder) = folders.pop() {
        for (name, is_folder, _) in entries_in(&files, &folder).unwrap_or_default() {
            let full = joined(&folder, &name);
            let kind = if is_folder { "tree" } else { "blob" };
            if is_folder && recursive {
                folders.push(full.clone());
            }
            listed.push(
                json!({"id": "", "name": name, "type": kind, "path": full, "mode": "100644"}),
            );
        }
    }
    Some(Ok(json_ok(Value::Array(listed))))
}

fn joined(folder: &str, name: &str) -> String {
    if folder.is_empty() {
        name.to_string()
    } else {
        format!("{folder}/{name}")
    }
}

fn json_ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn not_found(message: &str) -> Response {
    let body = json!({"message": message});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::super::forge_standin::ForgeStandIn;
    use super::super::playground::{GITHUB_REPOSITORY, GITLAB_REPOSITORY};
    use super::super::repositories::Repositories;
    use crate::forge::client::{ForgeApiError, ForgeClients};
    use crate::forge::metrics::ForgeMetrics;
    use crate::model::crd::ForgeKind;

    /// previewd's own forge clients read the examples' chart and overlay from the stand-in
    /// exactly as they are in templates/, on both forges; a path that is not there is an error.
    #[tokio::test]
    async fn previewds_forge_clients_read_the_example_folders_from_the_stand_in() {
        let stand_in = ForgeStandIn::start().await.unwrap();
        let clients = ForgeClients::new(ForgeMetrics::new());
        let templates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let chart_yaml = std::fs::read(templates.join("web-chart/chart/Chart.yaml")).unwrap();
        let overlay = std::fs::read_to_string(
            templates.join("web-kustomize/deploy/overlays/preview/kustomization.yaml"),
        )
        .unwrap();
        for (kind, repository) in [
            (ForgeKind::Github, GITHUB_REPOSITORY),
            (ForgeKind::Gitlab, GITLAB_REPOSITORY),
        ] {
            let url = stand_in.url();
            let client = clients.get(kind, Some(&url), b"t", "token").await.unwrap();
            let chart = client
                .read_folder(repository, "deploy/chart", "ec26c3e")
                .await
                .unwrap();
            assert_eq!(
                chart.len(),
                10,
                "{kind:?}: {:?}",
                chart.iter().map(|f| &f.0).collect::<Vec<_>>()
            );
            assert!(
                chart.contains(&("Chart.yaml".to_string(), chart_yaml.clone())),
                "{kind:?}"
            );
            assert!(
                chart
                    .iter()
                    .any(|(path, _)| path == "templates/tests/test-connection.yaml"),
                "{kind:?}: subfolders are read"
            );
            let manifests = client
                .read_manifests(repository, "deploy/overlays/preview", "ec26c3e")
                .await
                .unwrap();
            let names: Vec<&str> = manifests.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(
                names,
                ["ingress.yaml", "kustomization.yaml", "small.yaml"],
                "{kind:?}"
            );
            assert!(manifests.contains(&("kustomization.yaml".to_string(), overlay.clone())));
            let missing = client.read_folder(repository, "no/such/folder", "x").await;
            assert!(
                matches!(
                    missing,
                    Err(ForgeApiError::Http { status: 404, .. })
                        | Err(ForgeApiError::NotAFolder { .. })
                ),
                "{kind:?}: {missing:?}"
            );
        }
    }

    /// Only a caller with the sandbox's token reads the repositories (another local user
    /// reaches the loopback port too): a wrong or missing token is a 401, as on GitHub.
    #[tokio::test]
    async fn a_caller_without_the_token_reads_nothing() {
        let guarded = Repositories::default().guarded_by("the-token".into());
        let stand_in = ForgeStandIn::serving(guarded).await.unwrap();
        let clients = ForgeClients::new(ForgeMetrics::new());
        let url = stand_in.url();
        for (kind, repository) in [
            (ForgeKind::Github, GITHUB_REPOSITORY),
            (ForgeKind::Gitlab, GITLAB_REPOSITORY),
        ] {
            let wrong = clients
                .get(kind, Some(&url), b"guess", "token")
                .await
                .unwrap();
            let refused = wrong.read_folder(repository, "deploy/chart", "x").await;
            let said = refused.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(said.contains("401"), "{kind:?}: {said}");
            let right = clients
                .get(kind, Some(&url), b"the-token", "token")
                .await
                .unwrap();
            let read = right.read_folder(repository, "deploy/chart", "x").await;
            assert_eq!(read.map(|files| files.len()).ok(), Some(10), "{kind:?}");
        }
        let anonymous = reqwest::get(format!("{url}/repos/{GITHUB_REPOSITORY}/contents/deploy"))
            .await
            .unwrap();
        assert_eq!(anonymous.status().as_u16(), 401);
    }
}
