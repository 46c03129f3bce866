//! A repository's folder as the forge serves it (GitHub's Git trees and blobs on a forge double), and
//! the comparison of live objects with what a third-party engine renders for the same input.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::Discovery;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Every file under `root`, as (path relative to it, bytes), sorted.
pub fn files_of(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                folders.push(entry);
            } else {
                let relative = entry.strip_prefix(root).unwrap().display().to_string();
                files.push((relative, std::fs::read(&entry).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// `files` with `path` replaced by `text` (or added).
pub fn with_file(files: &[(String, Vec<u8>)], path: &str, text: &str) -> Vec<(String, Vec<u8>)> {
    let mut changed: Vec<_> = files.iter().filter(|(p, _)| p != path).cloned().collect();
    changed.push((path.to_string(), text.as_bytes().to_vec()));
    changed.sort();
    changed
}

/// The id the tests' forge doubles give a file's content (a Git blob id has the same shape: 40
/// hex digits naming the content).
pub fn blob_id(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))[..40].to_string()
}

/// Serves `files` as folder `folder` of `repository` at commit `sha`, the way GitHub's Git
/// data API does: the commit's whole tree in one listing (`git/trees/{sha}?recursive=1`, with
/// an entry for each folder on the way and each file's blob id and size), and each file by its
/// blob id (`git/blobs/{id}`, base64).
pub async fn serve_folder(
    forge: &MockServer,
    repository: &str,
    folder: &str,
    sha: &str,
    files: &[(String, Vec<u8>)],
) {
    serve_folders(forge, repository, sha, &[(folder, files)]).await;
}

/// Files as (path, bytes).
pub type Files = [(String, Vec<u8>)];

/// [`serve_folder`] for several folders of the same commit.
pub async fn serve_folders(
    forge: &MockServer,
    repository: &str,
    sha: &str,
    folders: &[(&str, &Files)],
) {
    let files: Vec<(String, Vec<u8>)> = folders
        .iter()
        .flat_map(|(folder, files)| {
            files
                .iter()
                .map(move |(relative, bytes)| (format!("{folder}/{relative}"), bytes.clone()))
        })
        .collect();
    serve_commit_tree(forge, repository, sha, &files).await;
}

/// Serves `files` (paths from the repository's root) as the whole tree of commit `sha` of
/// `repository`, with their blobs, as GitHub's Git data API does. Every folder of one commit
/// goes in one call ([`serve_folders`]): a commit has one tree.
pub async fn serve_commit_tree(
    forge: &MockServer,
    repository: &str,
    sha: &str,
    files: &[(String, Vec<u8>)],
) {
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    for (full, bytes) in files {
        let parts: Vec<&str> = full.split('/').collect();
        for depth in 1..parts.len() {
            let folder = parts[..depth].join("/");
            let entry = json!({"path": folder, "mode": "040000", "type": "tree",
                "sha": blob_id(folder.as_bytes())});
            entries.insert(folder, entry);
        }
        let id = blob_id(bytes);
        let entry = json!({"path": full, "mode": "100644", "type": "blob", "sha": id,
            "size": bytes.len()});
        entries.insert(full.clone(), entry);
        let blob = json!({"sha": id, "size": bytes.len(), "encoding": "base64",
            "content": base64::engine::general_purpose::STANDARD.encode(bytes)});
        Mock::given(method("GET"))
            .and(path(format!("/repos/{repository}/git/blobs/{id}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(blob))
            .mount(forge)
            .await;
    }
    let tree = json!({"sha": blob_id(sha.as_bytes()), "truncated": false,
        "tree": entries.into_values().collect::<Vec<_>>()});
    Mock::given(method("GET"))
        .and(path(format!("/repos/{repository}/git/trees/{sha}")))
        .and(query_param("recursive", "1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(tree))
        .mount(forge)
        .await;
}

/// The requests `forge` received for `repository`'s content: (tree listings, blob reads).
pub async fn content_requests(forge: &MockServer, repository: &str) -> (usize, usize) {
    let requests = forge.received_requests().await.unwrap_or_default();
    let under = |folder: &str| {
        let prefix = format!("/repos/{repository}/git/{folder}/");
        requests
            .iter()
            .filter(|r| r.url.path().starts_with(&prefix))
            .count()
    };
    (under("trees"), under("blobs"))
}

/// Every object `engine` rendered is in namespace `target` as the engine rendered it: every
/// field it rendered is in the live object with the same value (the API server adds defaults
/// beside them).
pub async fn assert_live_as_rendered(
    client: &Client,
    target: &str,
    expected: &[Value],
    engine: &str,
) {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for object in expected {
        let (group_version, kind) = (
            object["apiVersion"].as_str().unwrap(),
            object["kind"].as_str().unwrap(),
        );
        let name = object["metadata"]["name"].as_str().unwrap();
        let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
        let (resource, _) = discovery
            .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
            .unwrap();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), target, &resource);
        let live = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if let Some(difference) = missing_from(&live, object, kind) {
            panic!("{kind} {name} is not as {engine} renders it: {difference}");
        }
    }
}

/// The first place where `live` lacks something of `expected`.
fn missing_from(live: &Value, expected: &Value, at: &str) -> Option<String> {
    match (expected, live) {
        (Value::Object(fields), Value::Object(live_fields)) => {
            fields.iter().find_map(|(k, v)| match live_fields.get(k) {
                Some(l) => missing_from(l, v, &format!("{at}.{k}")),
                None => Some(format!("{at}.{k}")),
            })
        }
        (Value::Array(items), Value::Array(live_items)) if items.len() == live_items.len() => items
            .iter()
            .zip(live_items)
            .enumerate()
            .find_map(|(i, (e, l))| missing_from(l, e, &format!("{at}[{i}]"))),
        _ if expected == live => None,
        _ => Some(format!("{at}: expected {expected}, found {live}")),
    }
}
