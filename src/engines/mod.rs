//! The third-party engines previewd renders manifests with: Helm (`helm template`) and
//! Kustomize (`kubectl kustomize`). They are real programs run on input from pull requests, so
//! every run has a time limit, an output limit and a private folder, and at most
//! [`CONCURRENT_RENDERS`] run at once, in fair turns between templates ([`turns`]): one
//! template's hanging renders delay another template's by at most one render.
//! What they print is kept by digest of their input ([`cache`]): an unchanged commit renders
//! nothing. A published chart is downloaded once per version.
//!
//! The engines return text; parsing it into objects, mapping Helm hooks to waves and checking
//! them is the plan step's work (`plan`).

pub mod cache;
pub mod contain;
pub mod helm;
pub mod kustomize;
pub mod process;
pub mod turns;
pub mod warm;
pub mod worker;

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use cache::RenderCache;
use process::{Run, RunError};
use turns::{FairTurns, Turn};

/// How many engine programs run at once (each is a process of its own; the machine previewd
/// runs on may have two cores).
pub const CONCURRENT_RENDERS: usize = 2;

/// The most text one render may print (the same bound as a minijinja template's).
pub const MAX_OUTPUT_BYTES: usize = 4 << 20;

/// The most memory one engine program may take by default (`--render-memory-limit`): Helm
/// renders a large chart in well under 200 MiB; two renders at once stay well below the chart's
/// 1 GiB container limit, which previewd shares with them.
pub const DEFAULT_MEMORY_LIMIT: u64 = 384 << 20;

/// Where the engines are, how long they may take and how much memory (`--helm`, `--kubectl`,
/// `--render-timeout`, `--render-memory-limit`).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub helm: PathBuf,
    pub kubectl: PathBuf,
    /// The program that renders templates in a child process ([`worker`]): previewd itself
    /// (tests that run the controller in their own process name the built `previewd`).
    pub worker: PathBuf,
    pub timeout: Duration,
    /// Bytes of private writable memory per engine program.
    pub memory_limit: u64,
    /// Whether the engines and render workers run behind the kernel's walls ([`contain`]).
    pub containment: contain::ContainmentMode,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            helm: PathBuf::from("helm"),
            kubectl: PathBuf::from("kubectl"),
            worker: worker::this_program(),
            timeout: Duration::from_secs(30),
            memory_limit: DEFAULT_MEMORY_LIMIT,
            containment: contain::ContainmentMode::Required,
        }
    }
}

/// Why an engine rendered nothing.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("{0:?} is not a plain relative file path; nothing was rendered")]
    BadPath(String),
    #[error("preparing the render folder: {0}")]
    Io(String),
    /// A published chart could not be downloaded (the repository's answer, or its silence):
    /// retried, as the repository may come back.
    #[error("downloading the chart: {0}")]
    Fetch(String),
    #[error("previewd is shutting down")]
    ShuttingDown,
    /// The input ran the program out of memory or output (what the same input does again on
    /// any node, unlike a timeout under load): the environment's commit is set aside
    /// (`reconcile::quarantine`) until the template or the commit changes.
    #[error("{0} (set aside: not rendered again until the template or the commit changes)")]
    Exhausted(RunError),
    /// The same input failed so before (out of memory or time): not run again until the
    /// template or the commit changes.
    #[error(
        "{0} (said before of this same input: not rendered again until the template or the commit changes)"
    )]
    SaidBefore(RunError),
}

/// One render's text, and whether it came from the cache.
pub struct Rendered {
    pub text: Arc<String>,
    pub cached: bool,
}

pub struct Engines {
    config: EngineConfig,
    cache: RenderCache,
    /// Published charts' archives, by `helm pull`'s arguments (repository, name, version).
    archives: RenderCache<Vec<u8>>,
    turns: FairTurns,
    workers: worker::Workers,
    /// Inputs that exhausted an engine, refused again at once (until the environment's status
    /// says so, `reconcile::quarantine`, and for other environments with the same input).
    exhausted: std::sync::Mutex<worker::Remembered<RunError>>,
}

impl Engines {
    pub fn new(config: EngineConfig) -> Self {
        Self {
            config,
            cache: RenderCache::default(),
            archives: RenderCache::default(),
            turns: FairTurns::new(CONCURRENT_RENDERS),
            workers: worker::Workers::default(),
            exhausted: std::sync::Mutex::default(),
        }
    }

    /// Runs `job` in a fresh private folder, unless the cache has its output (by `job.key`).
    async fn render(&self, job: Job<'_>) -> Result<Rendered, EngineError> {
        if let Some(text) = self.cache.get(&job.key) {
            return Ok(Rendered { text, cached: true });
        }
        if let Some(said) = self.said_before(&job.key) {
            return Err(EngineError::SaidBefore(said));
        }
        let (_turn, folder) = self.private_folder(job.owner).await?;
        for (under, files) in job.files {
            write_files(&folder.path().join(under), files)?;
        }
        let env = (job.env)(folder.path());
        let ran = self.run(job.program, job.args, folder.path(), env, false);
        let text = ran.await.map_err(exhausted).inspect_err(|error| {
            if let EngineError::Exhausted(said) = error {
                let mut exhausted = self
                    .exhausted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                exhausted.keep(job.key, said.clone());
            }
        })?;
        let text = Arc::new(text);
        self.cache.keep(job.key, text.clone());
        Ok(Rendered {
            text,
            cached: false,
        })
    }

    /// What the same input said when it exhausted an engine before, if it did.
    fn said_before(&self, key: &cache::RenderKey) -> Option<RunError> {
        let exhausted = self
            .exhausted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        exhausted.get(key)
    }

    /// A turn among the [`CONCURRENT_RENDERS`], fair between owners (templates), and a fresh
    /// private folder (removed when dropped) to run an engine in.
    async fn private_folder(&self, owner: &str) -> Result<(Turn, tempfile::TempDir), EngineError> {
        let turn = self.turns.acquire(owner).await;
        let folder = tempfile::tempdir().map_err(|e| EngineError::Io(e.to_string()))?;
        Ok((turn, folder))
    }

    /// Engine turns held and waited for.
    pub fn turns_in_use(&self) -> (usize, usize) {
        self.turns.load()
    }

    async fn run(
        &self,
        program: &Path,
        args: Vec<String>,
        folder: &Path,
        mut env: Vec<(&'static str, String)>,
        network: bool,
    ) -> Result<String, EngineError> {
        // PATH is previewd's own (so `helm` is found as on the command line); nothing else is.
        env.push((
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        ));
        Ok(process::run(Run {
            program,
            args,
            folder,
            env,
            timeout: self.config.timeout,
            max_output: MAX_OUTPUT_BYTES,
            max_memory: self.config.memory_limit,
            reads_input: false,
            walls: contain::Walls {
                folder: Some(folder.to_path_buf()),
                network,
                mode: self.config.containment,
            },
        })
        .await?)
    }
}

/// A run that ran out of memory or output did so because of its input (the same input does
/// the same again): said as [`EngineError::Exhausted`]. A timeout may be the node's load.
fn exhausted(error: EngineError) -> EngineError {
    match error {
        EngineError::Run(run @ (RunError::OutOfMemory { .. } | RunError::TooMuchOutput { .. })) => {
            EngineError::Exhausted(run)
        }
        other => other,
    }
}

/// Files as (path relative to a folder, bytes): a chart, a repository folder.
pub type Files = [(String, Vec<u8>)];

/// One engine run: what it depends on (`key`), the files to write into its private folder
/// (each list under a sub-folder, `""` for the folder itself), and the program to run there.
struct Job<'a> {
    /// Whose turn it takes (the template, `namespace/name`).
    owner: &'a str,
    key: [u8; 32],
    files: Vec<(&'a str, &'a Files)>,
    program: &'a Path,
    args: Vec<String>,
    /// The program's environment variables, given its private folder.
    env: fn(&Path) -> Vec<(&'static str, String)>,
}

/// Writes `files` under `root`. Every path must be plain and relative (no `..`, no absolute
/// path, no empty part): the names come from the repository of a pull request.
fn write_files(root: &Path, files: &[(String, Vec<u8>)]) -> Result<(), EngineError> {
    for (path, bytes) in files {
        if !is_plain_relative(path) {
            return Err(EngineError::BadPath(path.clone()));
        }
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| EngineError::Io(e.to_string()))?;
        }
        std::fs::write(&target, bytes).map_err(|e| EngineError::Io(e.to_string()))?;
    }
    Ok(())
}

fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|part| {
            !part.is_empty() && part != "." && part != ".." && !part.contains(['\\', '\0'])
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_written() {
        for good in [
            "Chart.yaml",
            "templates/web.yaml",
            "charts/db/values.yaml",
            ".helmignore",
        ] {
            assert!(is_plain_relative(good), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "templates/../../x",
            "a//b",
            "./a",
            "a\\..\\b",
            "a\0",
        ] {
            assert!(!is_plain_relative(bad), "{bad:?}");
        }
        let folder = tempfile::tempdir().unwrap();
        let escape = [("../outside".to_string(), b"x".to_vec())];
        assert!(matches!(
            write_files(folder.path(), &escape),
            Err(EngineError::BadPath(_))
        ));
        assert!(!folder.path().parent().unwrap().join("outside").exists());
    }
}
