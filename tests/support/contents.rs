//! A repository's folder as the forge serves it (GitHub's contents API on a forge double), and
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

/// Serves `files` as folder `folder` of `repository` at commit `sha`, the way GitHub's
/// contents API lists folders and returns files.
pub async fn serve_folder(
    forge: &MockServer,
    repository: &str,
    folder: &str,
    sha: &str,
    files: &[(String, Vec<u8>)],
) {
    let mut listings: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    listings.insert(folder.into(), Vec::new());
    let top = folder.split('/').count();
    for (relative, bytes) in files {
        let full = format!("{folder}/{relative}");
        // Each folder on the way lists the next one down.
        let parts: Vec<&str> = full.split('/').collect();
        for depth in top..parts.len() {
            let listed = parts[..depth].join("/");
            let child = parts[..=depth].join("/");
            let entry = if depth + 1 == parts.len() {
                json!({"type": "file", "name": parts[depth], "path": child, "size": bytes.len()})
            } else {
                json!({"type": "dir", "name": parts[depth], "path": child})
            };
            let listing = listings.entry(listed).or_default();
            if !listing.contains(&entry) {
                listing.push(entry);
            }
        }
        let file = json!({"type": "file", "path": full, "size": bytes.len(), "encoding": "base64",
            "content": base64::engine::general_purpose::STANDARD.encode(bytes)});
        Mock::given(method("GET"))
            .and(path(format!("/repos/{repository}/contents/{full}")))
            .and(query_param("ref", sha))
            .respond_with(ResponseTemplate::new(200).set_body_json(file))
            .mount(forge)
            .await;
    }
    for (listed, listing) in listings {
        Mock::given(method("GET"))
            .and(path(format!("/repos/{repository}/contents/{listed}")))
            .and(query_param("ref", sha))
            .respond_with(ResponseTemplate::new(200).set_body_json(listing))
            .mount(forge)
            .await;
    }
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
