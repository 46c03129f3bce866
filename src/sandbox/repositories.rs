//! The repository contents the sandbox's forge stand-in serves: the examples' chart and
//! Kustomize folders out of the box (as `Codertocat/Hello-World` and `gitlabhq/gitlab-test`,
//! the repositories of the fixture deliveries), and a person's own repository from a local
//! folder (`previewd sandbox --repository owner/name=PATH`).
//!
//! * A git checkout serves its commits: a ref (a SHA, a branch) is resolved by `git`, so a new
//!   local commit is a new SHA to preview, and a ref git does not know is a 404, as on a forge.
//! * A plain folder serves what is in it now, at any ref (it has no history).
//! * The examples are compiled in, so the sandbox serves them wherever the binary runs.
//!
//! Each listed file has a blob id, as a forge's trees give it, by which it is then read
//! ([`Repositories::blob`]): a git checkout's object id; for the examples, an id of the
//! content; for a plain folder, an id of the path, size and modification time (a listing
//! reads no file), so an id changes when the file does.
//!
//! Only files found by listing the source are ever read (a request's path or blob id is looked
//! up in the listing, never joined onto a folder), symbolic links are not followed, and a
//! folder is listed to at most [`MAX_FILES`] files: the stand-in listens on loopback, but what
//! it serves is exactly the folder named.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::SandboxError;

/// The repository the examples are served as on GitHub: the one the fixture deliveries name.
pub const GITHUB_REPOSITORY: &str = "Codertocat/Hello-World";
/// The same on GitLab.
pub const GITLAB_REPOSITORY: &str = "gitlabhq/gitlab-test";
use crate::forge::secrets_equal;

/// The most files a plain folder is listed to (a checkout's `target/` or `node_modules/` is
/// no chart): files past it are not served. A git checkout has no such bound (git lists what
/// is committed, not what was built).
pub const MAX_FILES: usize = 20_000;

/// `(path in the repository, the file of templates/ compiled in)`.
macro_rules! example {
    ($at:literal, $folder:literal, $file:literal) => {
        (
            concat!($at, "/", $file),
            include_bytes!(concat!("../../templates/", $folder, "/", $file)),
        )
    };
}

/// The example folders, at the paths `templates/web-chart` and `templates/web-kustomize` read
/// them from (`deploy/chart`, `deploy/`).
const EXAMPLE_FILES: [(&str, &[u8]); 16] = [
    example!("deploy/chart", "web-chart/chart", "Chart.yaml"),
    example!("deploy/chart", "web-chart/chart", "templates/_helpers.tpl"),
    example!(
        "deploy/chart",
        "web-chart/chart",
        "templates/configmap.yaml"
    ),
    example!(
        "deploy/chart",
        "web-chart/chart",
        "templates/deployment.yaml"
    ),
    example!("deploy/chart", "web-chart/chart", "templates/ingress.yaml"),
    example!(
        "deploy/chart",
        "web-chart/chart",
        "templates/migrate-job.yaml"
    ),
    example!("deploy/chart", "web-chart/chart", "templates/service.yaml"),
    example!(
        "deploy/chart",
        "web-chart/chart",
        "templates/tests/test-connection.yaml"
    ),
    example!("deploy/chart", "web-chart/chart", "values.schema.json"),
    example!("deploy/chart", "web-chart/chart", "values.yaml"),
    example!("deploy", "web-kustomize/deploy", "base/deployment.yaml"),
    example!("deploy", "web-kustomize/deploy", "base/kustomization.yaml"),
    example!("deploy", "web-kustomize/deploy", "base/service.yaml"),
    example!(
        "deploy",
        "web-kustomize/deploy",
        "overlays/preview/ingress.yaml"
    ),
    example!(
        "deploy",
        "web-kustomize/deploy",
        "overlays/preview/kustomization.yaml"
    ),
    example!(
        "deploy",
        "web-kustomize/deploy",
        "overlays/preview/small.yaml"
    ),
];

/// Where a served repository's files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Examples,
    Folder(PathBuf),
    Git(PathBuf),
}

/// Why a listing or a file is not served: a 404 with this message.
#[derive(Debug, PartialEq, Eq)]
pub struct NotServed(pub String);

/// One file of a listing: its size in bytes and its blob id (40 or 64 hex characters), by
/// which [`Repositories::blob`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub size: u64,
    pub blob: String,
}

/// The repositories served, by `owner/name` in lower case (forges compare names so), and the
/// token a caller must present to read them.
#[derive(Debug)]
pub struct Repositories {
    served: HashMap<String, Source>,
    token: Option<String>,
    /// The blob ids a listing of a git checkout gave, by repository: only those are served,
    /// never another object of the checkout's store (a stash, a staged file).
    listed_blobs: std::sync::Mutex<HashSet<(String, String)>>,
}

impl Default for Repositories {
    /// The examples, as the fixture deliveries' repositories.
    fn default() -> Self {
        let served = [GITHUB_REPOSITORY, GITLAB_REPOSITORY]
            .map(|name| (name.to_lowercase(), Source::Examples));
        Self {
            served: served.into_iter().collect(),
            token: None,
            listed_blobs: Default::default(),
        }
    }
}

impl Repositories {
    /// Only callers that present `token` as their forge token read these repositories: the
    /// stand-in listens on loopback, where every local user can reach it, and the sandbox may
    /// run as root with a folder other users may not read.
    pub fn guarded_by(self, token: String) -> Self {
        Self {
            token: Some(token),
            ..self
        }
    }

    /// Whether a request with `headers` may read: it carries the token as GitHub's clients send
    /// it (`Authorization: Bearer …` or `token …`) or as GitLab's do (`PRIVATE-TOKEN`).
    pub fn admits(&self, headers: &http::HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let presented = header("private-token")
            .or_else(|| header("authorization").and_then(|value| value.split_whitespace().nth(1)));
        presented.is_some_and(|presented| secrets_equal(presented.as_bytes(), token.as_bytes()))
    }

    /// Serves `name` (`owner/name`) from `path`: its commits when it is a git checkout, else
    /// what is in it. Replaces what was served under that name (the examples too).
    pub fn add(&mut self, name: &str, path: &Path) -> Result<Source, SandboxError> {
        if !is_repository_name(name) {
            return Err(SandboxError::Process(format!(
                "--repository {name:?}: not a repository name (owner/name, or group/…/project)"
            )));
        }
        let folder = path.canonicalize().map_err(|e| SandboxError::io(path, e))?;
        if !folder.is_dir() {
            return Err(SandboxError::Process(format!(
                "--repository {name}={}: not a folder",
                path.display()
            )));
        }
        let source = if folder.join(".git").exists() {
            git(
                &folder,
                &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
            )
            .map_err(|NotServed(why)| {
                SandboxError::Process(format!(
                    "--repository {name}={}: a git checkout, but {why}",
                    path.display()
                ))
            })?;
            Source::Git(folder)
        } else {
            Source::Folder(folder)
        };
        self.served.insert(name.to_lowercase(), source.clone());
        Ok(source)
    }

    /// What is served, one line each, by name: for the sandbox's output.
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .served
            .iter()
            .map(|(name, source)| match source {
                Source::Examples => format!("{name} (the examples' chart/ and deploy/)"),
                Source::Folder(path) => format!("{name} (folder {}, any SHA)", path.display()),
                Source::Git(path) => format!("{name} (git checkout {})", path.display()),
            })
            .collect();
        lines.sort();
        lines
    }

    /// The repositories added with [`Repositories::add`] (not the examples), by name.
    pub fn own(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .served
            .iter()
            .filter(|(_, source)| **source != Source::Examples)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// The branches of `repository`, when its source has them: a git checkout's (`refs/heads`),
    /// a plain folder's one (`main`); `None` for the examples and for repositories not served
    /// (whose branches are what the deliveries said).
    pub fn branches(&self, repository: &str) -> Option<Result<Vec<String>, NotServed>> {
        match self.served.get(&repository.to_lowercase())? {
            Source::Examples => None,
            Source::Folder(_) => Some(Ok(vec!["main".into()])),
            Source::Git(root) => Some(
                git(
                    root,
                    &["for-each-ref", "--format=%(refname:short)", "refs/heads"],
                )
                .map(|listed| listed.lines().map(str::to_string).collect()),
            ),
        }
    }

    /// Whether `repository`'s branches come from its source ([`Repositories::branches`]).
    pub fn has_branches(&self, repository: &str) -> bool {
        self.served
            .get(&repository.to_lowercase())
            .is_some_and(|source| *source != Source::Examples)
    }

    /// Every file of `repository` at `reference` (path, with its size and blob id), sorted;
    /// `None`: not served.
    pub fn files(
        &self,
        repository: &str,
        reference: &str,
    ) -> Option<Result<BTreeMap<String, Listed>, NotServed>> {
        let source = self.served.get(&repository.to_lowercase())?;
        Some(match source {
            Source::Examples => Ok(EXAMPLE_FILES
                .iter()
                .map(|(path, bytes)| {
                    let listed = Listed {
                        size: bytes.len() as u64,
                        blob: content_id(bytes),
                    };
                    (path.to_string(), listed)
                })
                .collect()),
            Source::Folder(root) => Ok(walk(root)),
            Source::Git(root) => commit(root, reference)
                .and_then(|sha| git_files(root, &sha))
                .inspect(|files| self.remember_blobs(repository, files)),
        })
    }

    fn remember_blobs(&self, repository: &str, files: &BTreeMap<String, Listed>) {
        let mut listed = self.listed_blobs.lock().unwrap_or_else(|e| e.into_inner());
        for file in files.values() {
            listed.insert((repository.to_lowercase(), file.blob.clone()));
        }
    }

    fn was_listed(&self, repository: &str, id: &str) -> bool {
        let listed = self.listed_blobs.lock().unwrap_or_else(|e| e.into_inner());
        listed.contains(&(repository.to_lowercase(), id.to_string()))
    }

    /// The bytes of the blob `id` of `repository` (an id its listings give); `None`: not
    /// served. Only ids of 40 or 64 hex characters are looked up. A plain folder serves only
    /// a file listed now with that id (a file changed since its listing has another id).
    pub fn blob(&self, repository: &str, id: &str) -> Option<Result<Vec<u8>, NotServed>> {
        let source = self.served.get(&repository.to_lowercase())?;
        let missing = || NotServed(format!("{id}: no such blob"));
        if !is_object_id(id) {
            return Some(Err(missing()));
        }
        let id = id.to_ascii_lowercase();
        Some(match source {
            Source::Examples => EXAMPLE_FILES
                .iter()
                .find(|(_, bytes)| content_id(bytes) == id)
                .map(|(_, bytes)| bytes.to_vec())
                .ok_or_else(missing),
            // The path comes from the listing, never from the request.
            Source::Folder(root) => walk(root)
                .into_iter()
                .find(|(_, listed)| listed.blob == id)
                .and_then(|(path, _)| read_inside(root, &path))
                .ok_or_else(missing),
            // `id` is hex only: no option, no revision syntax reaches git; and only an id a
            // listing gave.
            Source::Git(_) if !self.was_listed(repository, &id) => Err(missing()),
            Source::Git(root) => git_bytes(root, &["cat-file", "blob", &id]).map_err(|_| missing()),
        })
    }

    /// The bytes of file `path` of `repository` at `reference`; `None`: not served.
    pub fn read(
        &self,
        repository: &str,
        reference: &str,
        path: &str,
    ) -> Option<Result<Vec<u8>, NotServed>> {
        let source = self.served.get(&repository.to_lowercase())?;
        let missing = || NotServed(format!("{path}: no such file"));
        Some(match source {
            Source::Examples => EXAMPLE_FILES
                .iter()
                .find(|(at, _)| *at == path)
                .map(|(_, bytes)| bytes.to_vec())
                .ok_or_else(missing),
            // Only a file the listing holds: the path is never joined unchecked.
            Source::Folder(root) => match walk(root).contains_key(path) {
                true => read_inside(root, path).ok_or_else(missing),
                false => Err(missing()),
            },
            Source::Git(root) => commit(root, reference).and_then(|sha| {
                git_bytes(root, &["cat-file", "blob", &format!("{sha}:{path}")])
                    .map_err(|_| missing())
            }),
        })
    }
}

/// One level of a folder in a file listing: `(name, the file)` of each entry directly in
/// `folder` (`""`: the root), the file `None` for a subfolder, sorted by name; `None` when
/// nothing is under `folder`.
pub fn entries_in(
    files: &BTreeMap<String, Listed>,
    folder: &str,
) -> Option<Vec<(String, Option<Listed>)>> {
    let folder = folder.trim_matches('/');
    let prefix = if folder.is_empty() {
        String::new()
    } else {
        format!("{folder}/")
    };
    let mut folders = BTreeSet::new();
    let mut entries: Vec<(String, Option<Listed>)> = Vec::new();
    for (path, listed) in files.range(prefix.clone()..) {
        let Some(rest) = path.strip_prefix(&prefix) else {
            break;
        };
        match rest.split_once('/') {
            Some((child, _)) => {
                folders.insert(child.to_string());
            }
            None => entries.push((rest.to_string(), Some(listed.clone()))),
        }
    }
    entries.extend(folders.into_iter().map(|name| (name, None)));
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    (!entries.is_empty()).then_some(entries)
}

/// The id a folder `path` (`""`: the root) of a listing at `reference` is given: 40 hex
/// characters, the same for the same folder and reference.
pub fn folder_id(reference: &str, path: &str) -> String {
    object_id("tree", format!("{reference}\0{path}").as_bytes())
}

/// The id of a file with these bytes, as git names a blob's object but with SHA-256 (cut to
/// the 40 hex characters of a git id): the same bytes, the same id.
fn content_id(bytes: &[u8]) -> String {
    object_id("blob", bytes)
}

/// `<kind> <length>\0<bytes>` hashed with SHA-256, in lowercase hex cut to 40 characters.
fn object_id(kind: &str, bytes: &[u8]) -> String {
    let mut digest = Sha256::new();
    digest.update(format!("{kind} {}\0", bytes.len()).as_bytes());
    digest.update(bytes);
    let mut id = hex::encode(digest.finalize());
    id.truncate(40);
    id
}

/// The id of a plain folder's file at `path` (relative to the folder) from its metadata:
/// its path, size and modification time (ns), so a listing reads no file's content and an
/// edited file gets a new id.
fn metadata_id(path: &str, metadata: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let modified = i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec());
    // The change time and inode too: tools that keep a file's modification time (`cp -p`,
    // `rsync -t`, tar) still change these, which no user can set.
    let changed = i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec());
    let described = format!(
        "{path}\0{}\0{modified}\0{changed}\0{}",
        metadata.len(),
        metadata.ino()
    );
    object_id("blob", described.as_bytes())
}

/// A full object id: 40 (SHA-1) or 64 (SHA-256) hex characters.
fn is_object_id(id: &str) -> bool {
    matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `owner/name` (GitHub) or `group/…/project` (GitLab): plain segments only.
fn is_repository_name(name: &str) -> bool {
    let segments: Vec<&str> = name.split('/').collect();
    segments.len() >= 2
        && segments.iter().all(|s| {
            !s.is_empty()
                && !s.starts_with('.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// The regular files under `root` (not `.git`, no symbolic links), by path relative to it,
/// at most [`MAX_FILES`], with ids of their metadata ([`metadata_id`]).
fn walk(root: &Path) -> BTreeMap<String, Listed> {
    let mut files = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(listing) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in listing.flatten() {
            if files.len() >= MAX_FILES {
                return files;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && entry.file_name() != ".git" {
                folders.push(path);
            } else if kind.is_file() {
                let relative = path.strip_prefix(root).ok().and_then(Path::to_str);
                // The entry's own metadata (`lstat`): a link is never followed.
                let Ok(metadata) = entry.metadata() else {
                    continue;
                };
                if let Some(relative) = relative {
                    let listed = Listed {
                        size: metadata.len(),
                        blob: metadata_id(relative, &metadata),
                    };
                    files.insert(relative.to_string(), listed);
                }
            }
        }
    }
    files
}

/// The bytes of the regular file `path` under `root`, read from what was opened: a file or
/// folder swapped for a symbolic link after the listing cannot lead outside `root`.
fn read_inside(root: &Path, path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut file = std::fs::File::open(root.join(path)).ok()?;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    if !opened.starts_with(root) || !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The commit `reference` names in the checkout at `root`: a full SHA (what previewd asks
/// for: an environment's `headSha`), or a branch (`refs/heads/…`). Nothing else git could
/// resolve (stashes, `ORIG_HEAD`, `HEAD~1`, short SHAs of commits no branch holds) is served.
fn commit(root: &Path, reference: &str) -> Result<String, NotServed> {
    let full_sha = is_object_id(reference);
    let branch = !reference.is_empty()
        && reference.len() <= 255
        && !reference.starts_with(['-', '/', '.'])
        && !reference.contains("..")
        && reference
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    let unknown = || NotServed(format!("No commit found for the ref {reference}"));
    let spec = match (full_sha, branch) {
        (true, _) => format!("{reference}^{{commit}}"),
        (false, true) => format!("refs/heads/{reference}^{{commit}}"),
        (false, false) => return Err(unknown()),
    };
    git(root, &["rev-parse", "--verify", "--quiet", &spec]).map_err(|_| unknown())
}

/// Every blob of commit `sha` with its size and object id (`git ls-tree -r -l`); links and
/// submodules left out, as previewd reads files only.
fn git_files(root: &Path, sha: &str) -> Result<BTreeMap<String, Listed>, NotServed> {
    let listing = git_bytes(root, &["ls-tree", "-r", "-l", "-z", sha])?;
    let mut files = BTreeMap::new();
    for line in listing.split(|b| *b == 0) {
        // `<mode> SP <type> SP <object> SP+ <size> TAB <path>`
        let line = String::from_utf8_lossy(line);
        let Some((meta, path)) = line.split_once('\t') else {
            continue;
        };
        let fields: Vec<&str> = meta.split_whitespace().collect();
        if let ["100644" | "100755", "blob", object, size] = fields.as_slice() {
            let listed = Listed {
                size: size.parse().unwrap_or(0),
                blob: object.to_string(),
            };
            files.insert(path.to_string(), listed);
        }
    }
    Ok(files)
}

/// The commit checked out in the git checkout at `checkout` (`HEAD`).
pub fn head_commit(checkout: &Path) -> Result<String, SandboxError> {
    git(checkout, &["rev-parse", "--verify", "HEAD^{commit}"]).map_err(|NotServed(why)| {
        SandboxError::Process(format!(
            "{}: no commit checked out: {why}",
            checkout.display()
        ))
    })
}

fn git(root: &Path, args: &[&str]) -> Result<String, NotServed> {
    let bytes = git_bytes(root, args)?;
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

fn git_bytes(root: &Path, args: &[&str]) -> Result<Vec<u8>, NotServed> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        // A hook's environment would point git elsewhere than `root`.
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .output()
        .map_err(|e| NotServed(format!("`git` could not be run: {e}")))?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        return Err(NotServed(format!(
            "git {}: {}",
            args.join(" "),
            said.trim()
        )));
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the example folders, as the repository path it is served at.
    fn example_folders() -> BTreeSet<String> {
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let mut served = BTreeSet::new();
        for (folder, at) in [
            ("web-chart/chart", "deploy/chart"),
            ("web-kustomize/deploy", "deploy"),
        ] {
            for path in walk(&templates.join(folder)).into_keys() {
                served.insert(format!("{at}/{path}"));
            }
        }
        served
    }

    #[test]
    fn the_examples_are_served_whole_and_as_they_are_in_templates() {
        let compiled: BTreeSet<String> = EXAMPLE_FILES.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(
            compiled,
            example_folders(),
            "a file of templates/ added or removed"
        );
        let repositories = Repositories::default();
        let files = repositories
            .files("codertocat/hello-world", "any-sha")
            .unwrap()
            .unwrap();
        assert_eq!(files.len(), EXAMPLE_FILES.len());
        let chart = repositories.read(GITHUB_REPOSITORY, "x", "deploy/chart/Chart.yaml");
        let on_disk = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/web-chart/chart/Chart.yaml"),
        )
        .unwrap();
        assert_eq!(chart, Some(Ok(on_disk)));
        assert!(repositories.files("someone/else", "x").is_none());
    }

    /// A listed file of `size` bytes with blob id `blob`.
    fn listed(size: u64, blob: &str) -> Listed {
        Listed {
            size,
            blob: blob.to_string(),
        }
    }

    #[test]
    fn a_folder_lists_one_level_with_its_subfolders() {
        let files: BTreeMap<String, Listed> = [
            ("deploy/chart/Chart.yaml", 10, "a"),
            ("deploy/chart/templates/a.yaml", 5, "b"),
            ("deploy/chart/templates/tests/t.yaml", 5, "c"),
            ("deploy/chartless.yaml", 1, "d"),
        ]
        .map(|(p, s, b)| (p.to_string(), listed(s, b)))
        .into_iter()
        .collect();
        assert_eq!(
            entries_in(&files, "deploy/chart"),
            Some(vec![
                ("Chart.yaml".to_string(), Some(listed(10, "a"))),
                ("templates".to_string(), None)
            ])
        );
        assert_eq!(
            entries_in(&files, "/deploy/"),
            Some(vec![
                ("chart".to_string(), None),
                ("chartless.yaml".to_string(), Some(listed(1, "d")))
            ])
        );
        assert_eq!(
            entries_in(&files, "").map(|entries| entries.len()),
            Some(1),
            "the root holds deploy/ only"
        );
        assert_eq!(entries_in(&files, "deploy/chart/Chart.yaml"), None);
        assert_eq!(entries_in(&files, "nowhere"), None);
    }

    #[test]
    fn a_file_swapped_for_a_link_after_the_listing_is_not_followed() {
        let folder = tempfile::tempdir().unwrap();
        let root = folder.path().canonicalize().unwrap();
        std::fs::write(root.join("values.yaml"), "a: 1\n").unwrap();
        assert_eq!(read_inside(&root, "values.yaml"), Some(b"a: 1\n".to_vec()));
        std::fs::remove_file(root.join("values.yaml")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("values.yaml")).unwrap();
        assert_eq!(read_inside(&root, "values.yaml"), None);
        std::fs::create_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("linked")).unwrap();
        assert_eq!(read_inside(&root, "linked/hostname"), None);
    }

    #[test]
    fn a_plain_folder_serves_its_files_and_nothing_outside_it() {
        let folder = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(folder.path().join("chart/templates")).unwrap();
        std::fs::write(folder.path().join("chart/Chart.yaml"), "name: mine\n").unwrap();
        std::fs::create_dir_all(folder.path().join(".git-not")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", folder.path().join("chart/passwd")).unwrap();
        let mut repositories = Repositories::default();
        let source = repositories.add("me/app", folder.path()).unwrap();
        assert!(matches!(source, Source::Folder(_)));
        let files = repositories.files("Me/App", "whatever").unwrap().unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["chart/Chart.yaml"]);
        let read = |path: &str| repositories.read("me/app", "any", path).unwrap();
        assert_eq!(read("chart/Chart.yaml"), Ok(b"name: mine\n".to_vec()));
        for outside in [
            "chart/passwd",
            "../../etc/passwd",
            "/etc/passwd",
            "chart/../../x",
        ] {
            assert!(read(outside).is_err(), "{outside} served");
        }
        assert!(repositories.add("not a name", folder.path()).is_err());
        assert!(
            repositories
                .add("me/app", &folder.path().join("nope"))
                .is_err()
        );
    }

    /// Runs git in `folder` as a test user.
    fn run_git(folder: &Path, args: &[&str]) {
        let status = Command::new("git")
            .arg("-C")
            .arg(folder)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    /// A git checkout with two commits of `chart/`: `Chart.yaml`, and `values.yaml` at
    /// `replicas: 1`, then `replicas: 2`. Returns it and the first commit's SHA.
    fn checkout_of_two_commits() -> (tempfile::TempDir, String) {
        let folder = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| run_git(folder.path(), args);
        run(&["init", "-q", "-b", "main"]);
        std::fs::create_dir_all(folder.path().join("chart")).unwrap();
        std::fs::write(folder.path().join("chart/Chart.yaml"), "name: mine\n").unwrap();
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 1\n").unwrap();
        run(&["add", "."]);
        run(&["commit", "-q", "-m", "one"]);
        let first = git(folder.path(), &["rev-parse", "HEAD"]).unwrap();
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 2\n").unwrap();
        run(&["commit", "-q", "-am", "two"]);
        (folder, first)
    }

    #[test]
    fn a_git_checkout_serves_each_commit_and_refuses_unknown_refs() {
        let (folder, first) = checkout_of_two_commits();
        let run = |args: &[&str]| run_git(folder.path(), args);
        let mut repositories = Repositories::default();
        assert!(matches!(
            repositories.add("me/app", folder.path()).unwrap(),
            Source::Git(_)
        ));
        let read = |reference: &str| {
            repositories
                .read("me/app", reference, "chart/values.yaml")
                .unwrap()
        };
        assert_eq!(read(&first), Ok(b"replicas: 1\n".to_vec()));
        assert_eq!(read("main"), Ok(b"replicas: 2\n".to_vec()));
        let files = repositories.files("me/app", &first).unwrap().unwrap();
        let size = files.get("chart/values.yaml").map(|listed| listed.size);
        assert_eq!(size, Some(12));
        // A stash: git resolves it, the forge has no such ref.
        std::fs::write(folder.path().join("chart/values.yaml"), "secret: 1\n").unwrap();
        run(&["stash", "-q"]);
        let short = &first[..10];
        for hostile in [
            "0000000000000000000000000000000000000000",
            "--output=/tmp/x",
            "main..HEAD",
            "",
            "stash",
            "refs/stash",
            "HEAD~1",
            "main^",
            ":/two",
            short,
        ] {
            assert!(
                repositories.files("me/app", hostile).unwrap().is_err(),
                "{hostile}"
            );
        }
        assert!(read(&format!("{first}:chart/values.yaml")).is_err());
    }
    /// The blob ids of every file of `repository` at `reference`, by path.
    fn blob_ids(
        repositories: &Repositories,
        repository: &str,
        reference: &str,
    ) -> BTreeMap<String, String> {
        let files = repositories.files(repository, reference).unwrap().unwrap();
        files
            .into_iter()
            .map(|(path, listed)| (path, listed.blob))
            .collect()
    }

    #[test]
    fn the_examples_are_read_by_the_ids_of_their_content() {
        let repositories = Repositories::default();
        let ids = blob_ids(&repositories, GITHUB_REPOSITORY, "one-sha");
        assert_eq!(
            ids,
            blob_ids(&repositories, GITLAB_REPOSITORY, "another-sha")
        );
        let id = &ids["deploy/chart/Chart.yaml"];
        assert_eq!(id.len(), 40);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        let on_disk = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/web-chart/chart/Chart.yaml"),
        )
        .unwrap();
        assert_eq!(repositories.blob(GITHUB_REPOSITORY, id), Some(Ok(on_disk)));
        let distinct: BTreeSet<&String> = ids.values().collect();
        assert_eq!(distinct.len(), ids.len(), "files of different content");
        let hostile = [
            "deploy/chart/Chart.yaml".to_string(),
            "main".to_string(),
            String::new(),
            "g".repeat(40),
            id[..39].to_string(),
        ];
        for refused in &hostile {
            assert!(
                repositories
                    .blob(GITHUB_REPOSITORY, refused)
                    .unwrap()
                    .is_err(),
                "{refused}"
            );
        }
        assert!(repositories.blob("someone/else", id).is_none());
        let deploy = folder_id("main", "deploy");
        assert_eq!(deploy.len(), 40);
        assert_eq!(deploy, folder_id("main", "deploy"));
        assert_ne!(deploy, folder_id("main", "deploy/chart"));
        assert_ne!(deploy, folder_id("other", "deploy"));
    }

    #[test]
    fn a_plain_folders_ids_change_with_its_files_and_read_nothing_outside_it() {
        let folder = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(folder.path().join("chart")).unwrap();
        std::fs::write(folder.path().join("chart/Chart.yaml"), "name: mine\n").unwrap();
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 1\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", folder.path().join("chart/passwd")).unwrap();
        let mut repositories = Repositories::default();
        repositories.add("me/app", folder.path()).unwrap();
        let before = blob_ids(&repositories, "me/app", "any");
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            ["chart/Chart.yaml", "chart/values.yaml"]
        );
        assert_eq!(before, blob_ids(&repositories, "me/app", "other"));
        let blob = |id: &str| repositories.blob("me/app", id).unwrap();
        assert_eq!(
            blob(&before["chart/values.yaml"]),
            Ok(b"replicas: 1\n".to_vec())
        );
        // Another size: a new id even within the clock's resolution.
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 10\n").unwrap();
        let after = blob_ids(&repositories, "me/app", "any");
        assert_eq!(after["chart/Chart.yaml"], before["chart/Chart.yaml"]);
        assert_ne!(after["chart/values.yaml"], before["chart/values.yaml"]);
        assert_eq!(
            blob(&after["chart/values.yaml"]),
            Ok(b"replicas: 10\n".to_vec())
        );
        assert!(blob(&before["chart/values.yaml"]).is_err(), "a stale id");
        let hostile = [
            "chart/passwd".to_string(),
            "../../etc/passwd".to_string(),
            "/etc/passwd".to_string(),
            "chart/Chart.yaml".to_string(),
            "0".repeat(40),
            "0".repeat(64),
        ];
        for refused in &hostile {
            assert!(blob(refused).is_err(), "{refused} served");
        }
    }

    #[test]
    fn a_git_checkouts_ids_are_its_blobs_and_change_with_each_commit() {
        let (folder, first) = checkout_of_two_commits();
        let mut repositories = Repositories::default();
        repositories.add("me/app", folder.path()).unwrap();
        let one = blob_ids(&repositories, "me/app", &first);
        let two = blob_ids(&repositories, "me/app", "main");
        assert_eq!(one, blob_ids(&repositories, "me/app", &first));
        assert_eq!(one["chart/Chart.yaml"], two["chart/Chart.yaml"]);
        assert_ne!(one["chart/values.yaml"], two["chart/values.yaml"]);
        let object = git(
            folder.path(),
            &["rev-parse", &format!("{first}:chart/values.yaml")],
        );
        assert_eq!(object, Ok(one["chart/values.yaml"].clone()));
        let blob = |id: &str| repositories.blob("me/app", id).unwrap();
        assert_eq!(
            blob(&one["chart/values.yaml"]),
            Ok(b"replicas: 1\n".to_vec())
        );
        assert_eq!(
            blob(&two["chart/values.yaml"]),
            Ok(b"replicas: 2\n".to_vec())
        );
        // A file never committed, but written into the checkout's object store (as `git add`
        // or a stash would): its id is a blob's, yet no listing gave it.
        std::fs::write(folder.path().join(".env"), "TOKEN=secret\n").unwrap();
        let unlisted = git(folder.path(), &["hash-object", "-w", ".env"]).unwrap();
        let hostile = [
            unlisted,
            first.clone(),
            first[..10].to_string(),
            "main".to_string(),
            "HEAD".to_string(),
            "--output=/tmp/x".to_string(),
            format!("{first}:chart/values.yaml"),
            "0".repeat(40),
        ];
        for refused in &hostile {
            assert!(blob(refused).is_err(), "{refused} served");
        }
    }
}
