//! Repository contents as the forges' APIs answer them, for the forge stand-in: the calls
//! previewd makes to read manifests, charts and overlays (`src/forge/github/api.rs`,
//! `src/forge/gitlab/api.rs`), answered from [`Repositories`]: one tree listing per commit,
//! then each file by its blob id.
//!
//! * GitHub: `GET /repos/{owner}/{name}/git/trees/{reference}[?recursive=1]` (a commit SHA or
//!   a branch; `recursive` with any value lists every file and folder, else the root's
//!   entries): `sha`, `truncated` (always `false`) and `tree`, entries sorted by path with
//!   `path`, `mode`, `type` `blob`/`tree`, `sha` (a file's blob id) and a file's `size`.
//! * GitHub: `GET /repos/{owner}/{name}/git/blobs/{sha}`: `sha`, `size`, and `content` in
//!   base64 (`encoding` `base64`).
//! * GitLab: `GET /api/v4/projects/{id}/repository/tree?path=P&ref=R[&recursive=true]` (entries
//!   with `type` `blob`/`tree` and `id`, a file's blob id; `[]` for a path that is no folder,
//!   which previewd reads as "maybe one file").
//! * GitLab: `GET /api/v4/projects/{id}/repository/blobs/{sha}/raw`: the blob's bytes.
//! * Both: a repository's branches (`GET /repos/{owner}/{name}/branches`,
//!   `GET /api/v4/projects/{id}/repository/branches`), for the repositories whose source has
//!   them (not the examples).
//!
//! Every call needs the sandbox's token ([`Repositories::admits`]): else 401. A repository the
//! sandbox does not serve, a ref it does not know and a blob id it does not list answer 404.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::forge_relay::{query_parameter, requested_page};
use super::repositories::{NotServed, Repositories, entries_in, folder_id};

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
        // A branch may hold `/`: the rest of the path is the reference.
        ["repos", owner, name, "git", "trees", reference @ ..] => Call::GithubTree {
            repository: format!("{owner}/{name}"),
            reference: reference.join("/"),
            recursive: query_parameter(query, "recursive").is_some(),
        },
        ["repos", owner, name, "git", "blobs", id] => Call::GithubBlob {
            repository: format!("{owner}/{name}"),
            id: id.to_string(),
        },
        ["api", "v4", "projects", project, "repository", "tree"] => Call::GitlabTree {
            repository: project.to_string(),
            path: query_parameter(query, "path").unwrap_or_default(),
            reference: query_parameter(query, "ref").unwrap_or_default(),
            recursive: query_parameter(query, "recursive").as_deref() == Some("true"),
        },
        [
            "api",
            "v4",
            "projects",
            project,
            "repository",
            "blobs",
            id,
            "raw",
        ] => Call::GitlabBlob {
            repository: project.to_string(),
            id: id.to_string(),
        },
        _ => return None,
    };
    if !repositories.admits(headers) {
        let refused = json!({"message": "Bad credentials"});
        return Some((StatusCode::UNAUTHORIZED, axum::Json(refused)).into_response());
    }
    let page = requested_page(query);
    let repositories = repositories.clone();
    // Listing a folder or asking git blocks: off the stand-in's async threads.
    let answered = tokio::task::spawn_blocking(move || call.answer(&repositories, page)).await;
    Some(answered.unwrap_or_else(|e| {
        let failed = json!({"message": format!("the stand-in failed: {e}")});
        (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(failed)).into_response()
    }))
}

enum Call {
    /// The tree of a commit (or a branch's), the root's entries or all (`recursive`).
    GithubTree {
        repository: String,
        reference: String,
        recursive: bool,
    },
    GithubBlob {
        repository: String,
        id: String,
    },
    GitlabTree {
        repository: String,
        path: String,
        reference: String,
        recursive: bool,
    },
    GitlabBlob {
        repository: String,
        id: String,
    },
    /// A repository's branches (a git checkout's, a plain folder's `main`), on page `1`.
    Branches {
        repository: String,
    },
}

impl Call {
    fn answer(&self, repositories: &Repositories, page: u64) -> Response {
        let outcome = match self {
            Call::GithubTree {
                repository,
                reference,
                recursive,
            } => github_tree(repositories, repository, reference, *recursive),
            Call::GithubBlob { repository, id } => repositories
                .blob(repository, id)
                .map(|read| read.map(|bytes| json_ok(github_blob(id, &bytes)))),
            Call::GitlabTree {
                repository,
                path,
                reference,
                recursive,
            } => gitlab_tree(repositories, repository, path, reference, *recursive),
            Call::GitlabBlob { repository, id } => repositories
                .blob(repository, id)
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

/// A commit's tree as GitHub's trees API gives it, never truncated: every file and folder
/// (`recursive`), or the entries directly at the root.
fn github_tree(
    repositories: &Repositories,
    repository: &str,
    reference: &str,
    recursive: bool,
) -> Answered {
    if reference.is_empty() {
        return Some(Err(NotServed("Not Found".into())));
    }
    let files = match repositories.files(repository, reference)? {
        Ok(files) => files,
        Err(not) => return Some(Err(not)),
    };
    let folder = |path: &str| {
        json!({
            "path": path, "mode": "040000", "type": "tree", "sha": folder_id(reference, path),
        })
    };
    let file = |path: &str, size: u64, blob: &str| {
        json!({
            "path": path, "mode": "100644", "type": "blob", "sha": blob, "size": size,
        })
    };
    // By path, so that the entries come sorted as GitHub sorts them.
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    if recursive {
        for (path, listed) in &files {
            let mut parent = path.as_str();
            while let Some((above, _)) = parent.rsplit_once('/') {
                if entries.contains_key(above) {
                    break;
                }
                entries.insert(above.to_string(), folder(above));
                parent = above;
            }
            entries.insert(
                path.clone(),
                file(path.as_str(), listed.size, listed.blob.as_str()),
            );
        }
    } else {
        for (name, listed) in entries_in(&files, "").unwrap_or_default() {
            let entry = match &listed {
                Some(listed) => file(name.as_str(), listed.size, listed.blob.as_str()),
                None => folder(name.as_str()),
            };
            entries.insert(name, entry);
        }
    }
    let tree: Vec<Value> = entries.into_values().collect();
    let answer = json!({"sha": folder_id(reference, ""), "tree": tree, "truncated": false});
    Some(Ok(json_ok(answer)))
}

/// A blob as GitHub's blobs API gives it: base64 in lines of 60, as GitHub writes it.
fn github_blob(id: &str, bytes: &[u8]) -> Value {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(60)
        .filter_map(|chunk| std::str::from_utf8(chunk).ok())
        .collect();
    json!({
        "sha": id.to_ascii_lowercase(), "size": bytes.len(),
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
        for (name, file) in entries_in(&files, &folder).unwrap_or_default() {
            let full = joined(&folder, &name);
            let (kind, mode, id) = match &file {
                Some(file) => ("blob", "100644", file.blob.clone()),
                None => ("tree", "040000", folder_id(reference, &full)),
            };
            if file.is_none() && recursive {
                folders.push(full.clone());
            }
            listed.push(json!({"id": id, "name": name, "type": kind, "path": full, "mode": mode}));
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
                .read_folder(repository, "deploy/chart", "ec26c3e", "test/pr-1")
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
                .read_manifests(
                    repository,
                    "deploy/overlays/preview",
                    "ec26c3e",
                    "test/pr-1",
                )
                .await
                .unwrap();
            let names: Vec<&str> = manifests.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(
                names,
                ["ingress.yaml", "kustomization.yaml", "small.yaml"],
                "{kind:?}"
            );
            assert!(manifests.contains(&("kustomization.yaml".to_string(), overlay.clone())));
            let missing = client
                .read_folder(repository, "no/such/folder", "x", "test/pr-1")
                .await;
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
            let refused = wrong
                .read_folder(repository, "deploy/chart", "x", "test/pr-1")
                .await;
            let said = refused.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(said.contains("401"), "{kind:?}: {said}");
            let right = clients
                .get(kind, Some(&url), b"the-token", "token")
                .await
                .unwrap();
            let read = right
                .read_folder(repository, "deploy/chart", "x", "test/pr-1")
                .await;
            assert_eq!(read.map(|files| files.len()).ok(), Some(10), "{kind:?}");
        }
        let anonymous = reqwest::get(format!("{url}/repos/{GITHUB_REPOSITORY}/git/trees/main"))
            .await
            .unwrap();
        assert_eq!(anonymous.status().as_u16(), 401);
    }
}
