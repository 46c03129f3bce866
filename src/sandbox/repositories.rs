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
//! Only files found by listing the source are ever read (a request's path is looked up in the
//! listing, never joined onto a folder), symbolic links are not followed, and a folder is
//! listed to at most [`MAX_FILES`] files: the stand-in listens on loopback, but what it serves
//! is exactly the folder named.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// The repositories served, by `owner/name` in lower case (forges compare names so), and the
/// token a caller must present to read them.
#[derive(Debug)]
pub struct Repositories {
    served: HashMap<String, Source>,
    token: Option<String>,
}

impl Default for Repositories {
    /// The examples, as the fixture deliveries' repositories.
    fn default() -> Self {
        let served = [GITHUB_REPOSITORY, GITLAB_REPOSITORY]
            .map(|name| (name.to_lowercase(), Source::Examples));
        Self {
            served: served.into_iter().collect(),
            token: None,
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

    /// Every file of `repository` at `reference` (path, size), sorted; `None`: not served.
    pub fn files(
        &self,
        repository: &str,
        reference: &str,
    ) -> Option<Result<BTreeMap<String, u64>, NotServed>> {
        let source = self.served.get(&repository.to_lowercase())?;
        Some(match source {
            Source::Examples => Ok(EXAMPLE_FILES
                .iter()
                .map(|(path, bytes)| (path.to_string(), bytes.len() as u64))
                .collect()),
            Source::Folder(root) => Ok(walk(root)),
            Source::Git(root) => commit(root, reference).and_then(|sha| git_files(root, &sha)),
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

/// One level of a folder in a file listing: `(name, is a folder, size)` of each entry
/// directly in `folder` (`""`: the root), sorted; `None` when nothing is under it.
pub fn entries_in(files: &BTreeMap<String, u64>, folder: &str) -> Option<Vec<(String, bool, u64)>> {
    let folder = folder.trim_matches('/');
    let prefix = if folder.is_empty() {
        String::new()
    } else {
        format!("{folder}/")
    };
    let mut folders = BTreeSet::new();
    let mut entries = Vec::new();
    for (path, size) in files.range(prefix.clone()..) {
        let Some(rest) = path.strip_prefix(&prefix) else {
            break;
        };
        match rest.split_once('/') {
            Some((child, _)) => {
                folders.insert(child.to_string());
            }
            None => entries.push((rest.to_string(), false, *size)),
        }
    }
    entries.extend(folders.into_iter().map(|name| (name, true, 0)));
    entries.sort();
    (!entries.is_empty()).then_some(entries)
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
/// at most [`MAX_FILES`].
fn walk(root: &Path) -> BTreeMap<String, u64> {
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
                let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                if let Some(relative) = relative {
                    files.insert(relative.to_string(), size);
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
    let full_sha =
        matches!(reference.len(), 40 | 64) && reference.bytes().all(|b| b.is_ascii_hexdigit());
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

/// Every blob of commit `sha` with its size (`git ls-tree -r -l`); links and submodules left
/// out, as previewd reads files only.
fn git_files(root: &Path, sha: &str) -> Result<BTreeMap<String, u64>, NotServed> {
    let listing = git_bytes(root, &["ls-tree", "-r", "-l", "-z", sha])?;
    let mut files = BTreeMap::new();
    for line in listing.split(|b| *b == 0) {
        // `<mode> SP <type> SP <object> SP+ <size> TAB <path>`
        let line = String::from_utf8_lossy(line);
        let Some((meta, path)) = line.split_once('\t') else {
            continue;
        };
        let fields: Vec<&str> = meta.split_whitespace().collect();
        if let ["100644" | "100755", "blob", _, size] = fields.as_slice() {
            files.insert(path.to_string(), size.parse().unwrap_or(0));
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

    #[test]
    fn a_folder_lists_one_level_with_its_subfolders() {
        let files: BTreeMap<String, u64> = [
            ("deploy/chart/Chart.yaml", 10),
            ("deploy/chart/templates/a.yaml", 5),
            ("deploy/chart/templates/tests/t.yaml", 5),
            ("deploy/chartless.yaml", 1),
        ]
        .map(|(p, s)| (p.to_string(), s))
        .into_iter()
        .collect();
        assert_eq!(
            entries_in(&files, "deploy/chart"),
            Some(vec![
                ("Chart.yaml".into(), false, 10),
                ("templates".into(), true, 0)
            ])
        );
        assert_eq!(
            entries_in(&files, "/deploy/"),
            Some(vec![
                ("chart".into(), true, 0),
                ("chartless.yaml".into(), false, 1)
            ])
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

    #[test]
    fn a_git_checkout_serves_each_commit_and_refuses_unknown_refs() {
        let folder = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let status = Command::new("git")
                .arg("-C")
                .arg(folder.path())
                .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "git {args:?}");
        };
        run(&["init", "-q", "-b", "main"]);
        std::fs::create_dir_all(folder.path().join("chart")).unwrap();
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 1\n").unwrap();
        run(&["add", "."]);
        run(&["commit", "-q", "-m", "one"]);
        let first = git(folder.path(), &["rev-parse", "HEAD"]).unwrap();
        std::fs::write(folder.path().join("chart/values.yaml"), "replicas: 2\n").unwrap();
        run(&["commit", "-q", "-am", "two"]);
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
        assert_eq!(files.get("chart/values.yaml"), Some(&12));
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
}
