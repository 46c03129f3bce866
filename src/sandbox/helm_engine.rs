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
use super::provision::{FileLock, Progress, run_logged, which};

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
/// output): `named` when it is a path or found on PATH, else the engine in the cache.
pub fn choose(
    named: &Path,
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<(PathBuf, String), SandboxError> {
    let on_path = match named.to_str() {
        Some(name) if !name.contains('/') => which(name),
        _ => Some(named.to_path_buf()),
    };
    if let Some(found) = on_path {
        return Ok((found.clone(), format!("{} (found)", found.display())));
    }
    let engine = ensure(cache_dir, progress)?;
    let said = format!(
        "{} ({SDK}, Helm's Go SDK, installed in the cache)",
        engine.program.display()
    );
    Ok((engine.program, said))
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
    std::fs::create_dir_all(&folder).map_err(|e| SandboxError::io(&folder, e))?;
    let _lock = FileLock::acquire(&folder.join(".lock"), progress, "installing Helm's engine")?;
    if !imports_the_sdk(&engine.python) {
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

fn imports_the_sdk(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import helm_python"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A virtual environment at `venv` with the SDK in it; Debian's `python3-venv` first when
/// `python3 -m venv` cannot make one (as root; otherwise the error says what to install).
fn install(venv: &Path, python: &Path, progress: &dyn Progress) -> Result<(), SandboxError> {
    progress.step(&format!(
        "installing Helm's engine ({SDK}, about 75 MB) into {} (once)",
        venv.display()
    ));
    let _ = std::fs::remove_dir_all(venv);
    let make_venv = || {
        run_logged(
            Command::new("python3").arg("-m").arg("venv").arg(venv),
            "python3 -m venv",
        )
    };
    if make_venv().is_err() {
        super::provision::ensure_debian_packages(&["python3-venv"], progress)?;
        let _ = std::fs::remove_dir_all(venv);
        make_venv()?;
    }
    run_logged(
        Command::new(python).args(["-m", "pip", "install", "--quiet", SDK]),
        "pip install",
    )?;
    if imports_the_sdk(python) {
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
