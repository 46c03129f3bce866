//! The Helm engine the sandbox brings when no `helm` is on PATH, the way it brings its control
//! plane: installed once into the cache, then found there. It is Helm's own Go SDK, as the PyPI
//! package `helm-python-sdk` carries it (a prebuilt native library: no `helm` binary can be
//! installed from the registries this project builds from), driven by `helm_template.py`,
//! which takes `helm template` and `helm pull`'s place on the command line previewd runs.
//!
//! The tests use the same engine (`tests/support/helm.rs`). A `helm` found on PATH wins.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::SandboxError;
use super::provision::{FileLock, Progress, StderrProgress, is_executable, run_logged, which};

/// The pinned SDK: the script reads its render output and errors.
pub const SDK: &str = "helm-python-sdk==0.2.2";

/// The command-line stand-in, written next to the engine.
const SCRIPT: &str = include_str!("helm_template.py");

/// An installed engine: the program previewd runs as `helm`, and the Python that imports the
/// SDK (for the tests' own calls).
#[derive(Clone, Debug)]
pub struct HelmEngine {
    pub program: PathBuf,
    pub python: PathBuf,
}

/// The `helm` previewd should run in the sandbox, and where it came from (for the sandbox's
/// output): `named` when it is found (a path, or a name on PATH); the engine in the cache when
/// the default `helm` is not on PATH. Another name that is not found is an error, not
/// silently replaced.
pub fn choose(
    named: &Path,
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<(PathBuf, String), SandboxError> {
    let found = match named.to_str() {
        Some(name) if !name.contains('/') => which(name),
        _ => is_executable(named).then(|| named.to_path_buf()),
    };
    if let Some(found) = found {
        return Ok((found.clone(), format!("{} (found)", found.display())));
    }
    if named != Path::new("helm") {
        return Err(SandboxError::Provision(format!(
            "--helm {}: no such program",
            named.display()
        )));
    }
    let engine = ensure(cache_dir, progress)?;
    let said = format!(
        "{} ({SDK}, Helm's Go SDK, installed in the cache)",
        engine.program.display()
    );
    Ok((engine.program, said))
}

/// [`choose`], off the async threads (an install takes seconds to minutes), its progress on
/// standard error.
pub async fn bring(named: &Path, cache_dir: &Path) -> Result<(PathBuf, String), SandboxError> {
    let (named, cache_dir) = (named.to_path_buf(), cache_dir.to_path_buf());
    tokio::task::spawn_blocking(move || choose(&named, &cache_dir, &StderrProgress))
        .await
        .map_err(|e| SandboxError::Provision(format!("installing Helm's engine: {e}")))?
}

/// The engine in `cache_dir`, installed first if it is not there (under a file lock: tests
/// and sandboxes may ask at once).
pub fn ensure(cache_dir: &Path, progress: &dyn Progress) -> Result<HelmEngine, SandboxError> {
    let venv = cache_dir.join("helm-python");
    let folder = cache_dir.join("helm-engine");
    let engine = HelmEngine {
        program: folder.join("helm"),
        python: venv.join("bin/python"),
    };
    // The shim quotes paths in single quotes: a path with one in it is refused, not mangled.
    let printable = |path: &Path| path.to_str().is_some_and(|text| !text.contains('\''));
    if !printable(&engine.python) || !printable(&folder) {
        return Err(SandboxError::Provision(format!(
            "the cache folder {} holds a quote or is not UTF-8: set PREVIEWD_CACHE_DIR to a plain path",
            cache_dir.display()
        )));
    }
    std::fs::create_dir_all(&folder).map_err(|e| SandboxError::io(&folder, e))?;
    let _lock = FileLock::acquire(&folder.join(".lock"), progress, "installing Helm's engine")?;
    if !imports_the_sdk(&engine.python)? {
        install(&venv, &engine.python, progress)?;
    }
    write_if_changed(&folder.join("helm_template.py"), SCRIPT, 0o644)?;
    let shim = format!(
        "#!/bin/sh\n# previewd's Helm engine ({SDK}); see src/sandbox/helm_engine.rs\nexec '{}' '{}' \"$@\"\n",
        engine.python.display(),
        folder.join("helm_template.py").display()
    );
    write_if_changed(&engine.program, &shim, 0o755)?;
    Ok(engine)
}

/// Whether `python` imports the SDK: `false` when it is not there or says the module is
/// missing (then it is installed); an error when it could not be asked (then nothing is
/// touched: other processes may be using it).
fn imports_the_sdk(python: &Path) -> Result<bool, SandboxError> {
    if !python.exists() {
        return Ok(false);
    }
    let output = Command::new(python)
        .args(["-c", "import helm_python"])
        .output()
        .map_err(|e| SandboxError::Provision(format!("{}: {e}", python.display())))?;
    if output.status.success() {
        return Ok(true);
    }
    let said = String::from_utf8_lossy(&output.stderr);
    if said.contains("ModuleNotFoundError") || said.contains("No module named") {
        return Ok(false);
    }
    Err(SandboxError::Provision(format!(
        "{} -c 'import helm_python' failed: {}",
        python.display(),
        said.trim()
    )))
}

/// A virtual environment at `venv` with the SDK in it; Debian's `python3-venv` first when
/// `python3 -m venv` cannot make one (as root; otherwise the error says what to install).
fn install(venv: &Path, python: &Path, progress: &dyn Progress) -> Result<(), SandboxError> {
    progress.step(&format!(
        "installing Helm's engine ({SDK}, about 75 MB) into {} (once)",
        venv.display()
    ));
    // `venv` on an existing environment keeps what is in it; nothing is removed.
    let make_venv = || {
        run_logged(
            Command::new("python3").arg("-m").arg("venv").arg(venv),
            "python3 -m venv",
        )
    };
    if make_venv().is_err() {
        super::provision::ensure_debian_packages(&["python3-venv"], progress)?;
        make_venv()?;
    }
    run_logged(
        Command::new(python).args(["-m", "pip", "install", "--quiet", SDK]),
        "pip install",
    )?;
    if imports_the_sdk(python)? {
        return Ok(());
    }
    Err(SandboxError::Provision(format!(
        "{SDK} was installed into {} but does not import",
        venv.display()
    )))
}

/// Writes `text` to `path` (mode `mode`) unless it holds it already; through a temporary file
/// and a rename, so a reader never runs half a script.
fn write_if_changed(path: &Path, text: &str, mode: u32) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::read_to_string(path).is_ok_and(|held| held == text) {
        return Ok(());
    }
    let temporary = path.with_extension(format!("new-{}", std::process::id()));
    std::fs::write(&temporary, text).map_err(|e| SandboxError::io(&temporary, e))?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .map_err(|e| SandboxError::io(&temporary, e))?;
    std::fs::rename(&temporary, path).map_err(|e| SandboxError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quiet;
    impl Progress for Quiet {
        fn step(&self, _: &str) {}
    }

    /// A `--helm` that names a program is used as it is, or refused when it does not exist;
    /// only the default `helm`, missing, is replaced by the engine (not asked here: the cache
    /// folder does not exist, so nothing may be installed into it).
    #[test]
    fn a_named_helm_is_used_or_refused_never_silently_replaced() {
        let nowhere = Path::new("/nonexistent-previewd-cache");
        let (found, said) = choose(Path::new("/bin/sh"), nowhere, &Quiet).unwrap();
        assert_eq!(found, Path::new("/bin/sh"));
        assert!(said.contains("(found)"), "{said}");
        for missing in ["/no/such/helm", "helm3-not-installed"] {
            let refused = choose(Path::new(missing), nowhere, &Quiet);
            assert!(
                matches!(&refused, Err(SandboxError::Provision(m)) if m.contains("no such program")),
                "{missing}: {refused:?}"
            );
        }
    }
}
