//! Kustomiz overlays, built by Kustomize itself (`kubectl kustomize`). The folder read from
//! the repository is written to a private folder under `repo/`, and previewd adds one
//! kustomization of its own on top of the overlay, as a person would with `kustomize edit`:
//! the environment's namespace, the images to set (`images:`) and the template's patches.
//!
//! Kustomize fetches a base it cannot find locally with git or HTTP, and reads a base folder
//! anywhere on the file system. On input from a pull request that would mean requests from
//! inside the cluster to any address, and the controller's own files. So before Kustomize runs,
//! every file and folder a kustomization refers to must be one previewd wrote
//! ([`check_references`]), and every kustomization must read to previewd as it reads to
//! Kustomize ([`shape`]: no case-variant or unknown fields, merge keys, tags or plugins);
//! nothing else is built.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;
use sha2::{Digest, Sha256};

use super::{EngineError, Engines, Job, Rendered};

pub mod shape;

/// Where previewd writes the repository's folder, and its own kustomization, in the private
/// folder.
const REPOSITORY_FOLDER: &str = "repo";
const OWN_FOLDER: &str = "previewd";

/// The names Kustomize looks for in a folder, in its order.
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Fields of a kustomization that list files or folders (a string per entry). Plugin
/// configurations (`generators`, …) are refused outright ([`shape`]).
const PATH_LISTS: [&str; 6] = [
    "resources",
    "bases",
    "components",
    "crds",
    "configurations",
    "patchesStrategicMerge",
];

/// The ones of them whose folders are kustomizations themselves (followed in turn).
const NESTED: [&str; 3] = ["resources", "bases", "components"];

/// Fields that list objects with a `path`.
const PATH_OBJECTS: [&str; 3] = ["patches", "patchesJson6902", "replacements"];

/// One `kubectl kustomize` run.
pub struct KustomizeRender<'a> {
    /// The folder read from the repository, as (path relative to it, bytes).
    pub files: &'a [(String, Vec<u8>)],
    /// Its path in the repository, for messages (`deploy`).
    pub root: &'a str,
    /// The folder Kustomize builds, relative to `root` (`""` for `root` itself).
    pub overlay: &'a str,
    pub namespace: &'a str,
    /// Kustomize `images:` entries (`name`, `newName`, `newTag`, `digest`).
    pub images: &'a [Value],
    /// Kustomize `patches:` entries (`patch`, `target`).
    pub patches: &'a [Value],
}

impl KustomizeRender<'_> {
    /// previewd's kustomization on top of the overlay (JSON is YAML, as Kustomize reads it).
    fn own_kustomization(&self) -> Value {
        let overlay = match self.overlay {
            "" => format!("../{REPOSITORY_FOLDER}"),
            path => format!("../{REPOSITORY_FOLDER}/{path}"),
        };
        let mut kustomization = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": self.namespace,
            "resources": [overlay],
        });
        if !self.images.is_empty() {
            kustomization["images"] = Value::from(self.images.to_vec());
        }
        if !self.patches.is_empty() {
            kustomization["patches"] = Value::from(self.patches.to_vec());
        }
        kustomization
    }

    /// A digest of everything the output depends on.
    fn key(&self, own: &[u8]) -> [u8; 32] {
        let mut digest = Sha256::new();
        digest.update(b"kustomize\0");
        for (path, bytes) in self.files {
            digest.update((path.len() as u64).to_le_bytes());
            digest.update(path.as_bytes());
            digest.update((bytes.len() as u64).to_le_bytes());
            digest.update(bytes);
        }
        digest.update(own);
        digest.finalize().into()
    }
}

impl Engines {
    /// The overlay's objects as `kubectl kustomize` prints them (one YAML stream), from the
    /// cache when nothing they depend on changed.
    /// `owner` (the template) is whose fair turn the build takes. The caller checks the overlay
    /// first ([`check_outline`], in a render worker): this runs Kustomize on what it is given,
    /// behind the kernel's walls (`engines::contain`).
    pub async fn kustomize_build(
        &self,
        render: &KustomizeRender<'_>,
        owner: &str,
    ) -> Result<Rendered, EngineError> {
        let own = serde_json::to_vec_pretty(&render.own_kustomization())
            .map_err(|e| EngineError::Io(e.to_string()))?;
        let own_file = [("kustomization.yaml".to_string(), own)];
        let rendered = self
            .render(Job {
                owner,
                key: render.key(&own_file[0].1),
                files: vec![(REPOSITORY_FOLDER, render.files), (OWN_FOLDER, &own_file)],
                program: &self.config.kubectl,
                args: vec!["kustomize".into(), OWN_FOLDER.into()],
                env: kustomize_env,
            })
            .await;
        rendered.map_err(|error| match error {
            // Kustomize names files by their path in the private folder: say the repository's.
            EngineError::Run(super::process::RunError::Failed { message }) => {
                let repository = format!("./{REPOSITORY_FOLDER}/");
                let named = message.replace(&repository, &in_root(render.root, ""));
                EngineError::Run(super::process::RunError::Failed { message: named })
            }
            other => other,
        })
    }
}

/// `path` said as a path of the repository.
pub fn in_root(root: &str, path: &str) -> String {
    match root.trim_matches('/') {
        "" => path.to_string(),
        root => format!("{root}/{path}"),
    }
}

/// Nothing of the operator's reaches Kustomize: its home is the private folder.
fn kustomize_env(folder: &Path) -> Vec<(&'static str, String)> {
    vec![("HOME", folder.join("home").display().to_string())]
}

/// What [`check_references`] reads of a folder: the path of every file, the text of its
/// kustomizations, and the overlay's folder in it. previewd checks it in a render worker
/// (`plan::request`), where the kustomizations, YAML from a pull request, are
/// parsed under the worker's memory limit.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct OverlayOutline {
    pub paths: Vec<String>,
    pub kustomizations: BTreeMap<String, String>,
    /// Kustomizations that are not UTF-8 text (refused: checked as text, they would not be
    /// what Kustomize reads).
    pub not_text: Vec<String>,
    pub overlay: String,
}

/// The outline of `files` (the folder read) for the overlay at `overlay` in it.
pub fn outline(files: &[(String, Vec<u8>)], overlay: &str) -> OverlayOutline {
    let mut outline = OverlayOutline {
        paths: files.iter().map(|(path, _)| path.clone()).collect(),
        kustomizations: BTreeMap::new(),
        not_text: Vec::new(),
        overlay: overlay.to_string(),
    };
    for (path, bytes) in files {
        let name = path.rsplit('/').next().unwrap_or(path);
        if !KUSTOMIZATION_FILES.contains(&name) {
            continue;
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                outline
                    .kustomizations
                    .insert(path.clone(), text.to_string());
            }
            Err(_) => outline.not_text.push(path.clone()),
        }
    }
    outline
}

/// [`check_references`] on an outline (the other files' contents play no part).
pub fn check_outline(outline: &OverlayOutline) -> Result<(), String> {
    if let Some(path) = outline.not_text.first() {
        return Err(format!(
            "{path}: not UTF-8 text; previewd checks a kustomization as text, so write it as UTF-8"
        ));
    }
    let files: Vec<(String, Vec<u8>)> = outline
        .paths
        .iter()
        .map(|path| {
            let text = outline.kustomizations.get(path).map(String::as_bytes);
            (path.clone(), text.unwrap_or_default().to_vec())
        })
        .collect();
    check_references(&files, &outline.overlay)
}

/// Checks that every file and folder the kustomizations reachable from `overlay` refer to is
/// one of `files` (paths relative to the folder read). Returns what refers to what, otherwise.
pub fn check_references(files: &[(String, Vec<u8>)], overlay: &str) -> Result<(), String> {
    let present: BTreeSet<&str> = files.iter().map(|(path, _)| path.as_str()).collect();
    let folders: BTreeSet<&str> = files
        .iter()
        .flat_map(|(path, _)| path.match_indices('/').map(|(at, _)| &path[..at]))
        .collect();
    let mut to_visit = VecDeque::from([overlay.trim_matches('/').to_string()]);
    let mut visited = BTreeSet::new();
    while let Some(folder) = to_visit.pop_front() {
        if !visited.insert(folder.clone()) {
            continue;
        }
        let Some((file, text)) = kustomization_in(files, &folder) else {
            let shown = if folder.is_empty() { "." } else { &folder };
            return Err(format!(
                "{shown}: no kustomization.yaml there (Kustomize builds a folder that has one)"
            ));
        };
        for (field, reference) in references(&file, text)? {
            let Some(target) = resolve(&folder, &reference) else {
                return Err(outside(&file, field, &reference));
            };
            if folders.contains(target.as_str()) || target.is_empty() {
                if NESTED.contains(&field) {
                    to_visit.push_back(target);
                }
            } else if !present.contains(target.as_str()) {
                return Err(outside(&file, field, &reference));
            }
        }
    }
    Ok(())
}

fn outside(file: &str, field: &str, reference: &str) -> String {
    format!(
        "{file}: {field} entry {reference:?} is not a file or folder of what previewd read from \
         the repository; previewd builds only from that folder (no remote bases, no absolute \
         paths, nothing above it: set the template's kustomize.root to a folder that holds every \
         base)"
    )
}

/// The kustomization file of `folder` (its path and text), if it has one.
fn kustomization_in<'a>(
    files: &'a [(String, Vec<u8>)],
    folder: &str,
) -> Option<(String, &'a [u8])> {
    KUSTOMIZATION_FILES.iter().find_map(|name| {
        let path = if folder.is_empty() {
            name.to_string()
        } else {
            format!("{folder}/{name}")
        };
        let found = files.iter().find(|(p, _)| *p == path)?;
        Some((path, found.1.as_slice()))
    })
}

/// Every (field, file or folder) a kustomization refers to.
fn references(file: &str, text: &[u8]) -> Result<Vec<(&'static str, String)>, String> {
    let parsed: Yaml =
        serde_yaml_ng::from_slice(text).map_err(|e| format!("{file}: not a kustomization: {e}"))?;
    shape::check(file, text, &parsed)?;
    let mut found = Vec::new();
    let mut add = |field: &'static str, entry: &Yaml| {
        // An entry of `patchesStrategicMerge` over several lines is an inline patch, not a
        // path; anywhere else it is checked as the path Kustomize would take it for.
        let inline = |text: &&str| field == "patchesStrategicMerge" && text.contains('\n');
        if let Some(text) = entry.as_str().filter(|text| !inline(text)) {
            found.push((field, text.to_string()));
        }
    };
    for field in PATH_LISTS {
        for entry in list(&parsed, field) {
            add(field, entry);
        }
    }
    for field in PATH_OBJECTS {
        for entry in list(&parsed, field) {
            add(field, entry.get("path").unwrap_or(&Yaml::Null));
        }
    }
    if let Some(openapi) = parsed.get("openapi") {
        add("openapi", openapi.get("path").unwrap_or(&Yaml::Null));
    }
    for field in ["configMapGenerator", "secretGenerator"] {
        for generator in list(&parsed, field) {
            for entry in list(generator, "files") {
                // `key=path` names the key the file's content is kept under.
                if let Some(text) = entry.as_str() {
                    let path = text.split_once('=').map_or(text, |(_, path)| path);
                    add(field, &Yaml::from(path));
                }
            }
            // An `envs` entry is a path as a whole (Kustomize splits no key off it).
            for entry in list(generator, "envs") {
                add(field, entry);
            }
            add(field, generator.get("env").unwrap_or(&Yaml::Null));
        }
    }
    Ok(found)
}

fn list<'a>(value: &'a Yaml, field: &str) -> impl Iterator<Item = &'a Yaml> {
    value
        .get(field)
        .and_then(Yaml::as_sequence)
        .into_iter()
        .flatten()
}

/// Whether Kustomize could take `reference` for something to fetch rather than a path: a URL,
/// a git location (`github.com/org/repo//base?ref=v1`, `git@host:repo`, `git::…`), which it
/// tries before a local folder of the same name, or a Windows-style path.
fn looks_remote(reference: &str) -> bool {
    const GIT_HOSTS: [&str; 4] = ["github.com/", "gitlab.com/", "bitbucket.org/", "git@"];
    [":", "?", "//", "\\"]
        .iter()
        .any(|sign| reference.contains(sign))
        || GIT_HOSTS.iter().any(|host| reference.starts_with(host))
}

/// `reference` taken from `folder`, as a path relative to the folder read, or `None` when it
/// is remote, absolute, or climbs above that folder.
fn resolve(folder: &str, reference: &str) -> Option<String> {
    if reference.starts_with('/') || looks_remote(reference) {
        return None;
    }
    let mut parts: Vec<&str> = folder.split('/').filter(|p| !p.is_empty()).collect();
    for part in reference.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(path, text)| (path.to_string(), text.as_bytes().to_vec()))
            .collect()
    }

    fn base_and_overlay(overlay: &str) -> Vec<(String, Vec<u8>)> {
        files(&[
            ("base/kustomization.yaml", "resources: [web.yaml]\n"),
            ("base/web.yaml", "kind: Deployment\n"),
            ("overlays/preview/kustomization.yaml", overlay),
            ("overlays/preview/patch.yaml", "kind: Deployment\n"),
        ])
    }

    #[test]
    fn bases_patches_and_generator_files_inside_the_folder_pass() {
        let overlay = "resources: [../../base]\npatches:\n- path: patch.yaml\n\
                       - patch: |-\n    kind: Deployment\n    x: 1\n\
                       configMapGenerator:\n- name: c\n  files: [conf=patch.yaml]\n";
        assert_eq!(
            check_references(&base_and_overlay(overlay), "overlays/preview"),
            Ok(())
        );
    }

    #[test]
    fn remote_absolute_and_escaping_references_are_refused_before_kustomize_runs() {
        for (hostile, shown) in [
            ("resources: [github.com/evil/x]", "github.com/evil/x"),
            (
                "resources: [https://evil.example/x.yaml]",
                "https://evil.example/x.yaml",
            ),
            ("resources: [/etc/kubernetes]", "/etc/kubernetes"),
            ("resources: [../../../../etc]", "../../../../etc"),
            ("components: [../../missing]", "../../missing"),
            ("patches: [{path: /etc/passwd}]", "/etc/passwd"),
            (
                "configMapGenerator: [{name: c, files: [k=../../../x]}]",
                "../../../x",
            ),
            (
                "configMapGenerator: [{name: c, env: /proc/self/environ}]",
                "/proc/self/environ",
            ),
            ("openapi: {path: /var/run/x.json}", "/var/run/x.json"),
            // Git locations Kustomize tries before a local folder of the same name.
            (
                "resources: [github.com/evil/x//base?ref=v1]",
                "github.com/evil/x//base?ref=v1",
            ),
            (
                "resources: [\"git@github.com:evil/x\"]",
                "git@github.com:evil/x",
            ),
            ("resources: [\"git::evil/x\"]", "git::evil/x"),
            // A path over several lines is still a path outside `patchesStrategicMerge`.
            ("resources:\n- |\n  ../../../etc\n  x", "../../../etc\nx"),
            // An `envs` entry is a whole path: no key is split off it as for `files`.
            (
                "configMapGenerator: [{name: c, envs: [\"http://evil.example/e=patch.yaml\"]}]",
                "http://evil.example/e=patch.yaml",
            ),
        ] {
            let refused = check_references(&base_and_overlay(hostile), "overlays/preview");
            let message = refused.expect_err(hostile);
            assert!(
                message.contains(&format!("{shown:?}"))
                    && message.starts_with("overlays/preview/kustomization.yaml"),
                "{hostile}: {message}"
            );
        }
    }

    #[test]
    fn the_outline_checks_as_the_files_do_and_refuses_a_kustomization_that_is_not_text() {
        let read = base_and_overlay("resources: [../../base]");
        assert_eq!(check_outline(&outline(&read, "overlays/preview")), Ok(()));
        let escaping = base_and_overlay("resources: [../../../x]");
        assert!(check_outline(&outline(&escaping, "overlays/preview")).is_err());
        let mut binary = read;
        binary[2].1 = vec![0xff, 0xfe, b'r', 0];
        let said = check_outline(&outline(&binary, "overlays/preview")).unwrap_err();
        assert!(
            said.starts_with("overlays/preview/kustomization.yaml: not UTF-8"),
            "{said}"
        );
    }

    #[test]
    fn a_base_is_checked_like_the_overlay() {
        let mut read = base_and_overlay("resources: [../../base]");
        read[0].1 = b"resources: [web.yaml, github.com/evil/x]".to_vec();
        let message = check_references(&read, "overlays/preview").unwrap_err();
        assert!(message.starts_with("base/kustomization.yaml"), "{message}");
        // A base that names its overlay back is visited once, not forever.
        read[0].1 = b"resources: [web.yaml, ../overlays/preview]".to_vec();
        assert_eq!(check_references(&read, "overlays/preview"), Ok(()));
    }

    #[test]
    fn a_folder_without_a_kustomization_is_said() {
        let message = check_references(&base_and_overlay(""), "overlays/missing").unwrap_err();
        assert!(
            message.contains("overlays/missing: no kustomization"),
            "{message}"
        );
    }

    #[test]
    fn previewd_sets_namespace_images_and_patches_on_top_of_the_overlay() {
        let read = base_and_overlay("resources: [../../base]");
        let images = [json!({"name": "ghcr.io/org/web", "newTag": "abc123"})];
        let render = KustomizeRender {
            files: &read,
            root: "deploy",
            overlay: "overlays/preview",
            namespace: "preview-web-pr-2",
            images: &images,
            patches: &[],
        };
        let own = render.own_kustomization();
        assert_eq!(own["namespace"], "preview-web-pr-2");
        assert_eq!(own["resources"], json!(["../repo/overlays/preview"]));
        assert_eq!(own["images"][0]["newTag"], "abc123");
        assert!(own.get("patches").is_none());
        let key = render.key(b"a");
        assert_ne!(key, render.key(b"b"), "previewd's own kustomization");
        let changed = files(&[("base/web.yaml", "kind: Service\n")]);
        let other = KustomizeRender {
            files: &changed,
            ..render
        };
        assert_ne!(key, other.key(b"a"), "the repository's files");
    }

    /// docs/security.md: "previewd passes neither `--enable-helm` nor `--enable-alpha-plugins`".
    /// A `kubectl` that prints its arguments as a ConfigMap shows exactly what previewd runs.
    #[tokio::test]
    async fn kustomize_runs_with_no_flag_that_enables_helm_or_plugins() {
        use std::os::unix::fs::PermissionsExt;
        let folder = tempfile::tempdir().unwrap();
        let kubectl = folder.path().join("kubectl");
        let script = "#!/bin/sh\nprintf 'apiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  \
                      name: args\\ndata:\\n  args: \"%s\"\\n' \"$*\"\n";
        std::fs::write(&kubectl, script).unwrap();
        std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another test's fork may briefly hold the new file open for writing (ETXTBSY): wait
        // until it runs here before the engine runs it.
        for _ in 0..100 {
            match std::process::Command::new(&kubectl).output() {
                Ok(_) => break,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        let engines = crate::engines::Engines::new(crate::engines::EngineConfig {
            kubectl,
            ..Default::default()
        });
        let files = base_and_overlay("resources: [../../base]\n");
        let render = KustomizeRender {
            files: &files,
            root: "deploy",
            overlay: "overlays/preview",
            namespace: "preview-x",
            images: &[],
            patches: &[],
        };

        let rendered = engines.kustomize_build(&render, "team/app").await.unwrap();

        let args = format!("args: \"kustomize {OWN_FOLDER}\"");
        assert!(rendered.text.contains(&args), "{}", rendered.text);
    }
}
