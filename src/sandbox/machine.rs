//! What the sandbox needs of the machine it runs on: programs on PATH, Debian packages (as
//! root), a file lock between processes that build the same thing, and a way to tell a person
//! how a long step goes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::SandboxError;

/// Reports progress of a long provisioning step to a person.
pub trait Progress: Send + Sync {
    fn step(&self, message: &str);
}

/// Progress printed to stderr with a `[sandbox]` prefix.
pub struct StderrProgress;

impl Progress for StderrProgress {
    fn step(&self, message: &str) {
        eprintln!("[sandbox] {message}");
    }
}

pub fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Looks a program up on PATH and in the usual system directories.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

/// Installs Debian `packages` (none: nothing to do). Needs root; says so plainly otherwise.
pub fn ensure_debian_packages(
    missing: &[&str],
    progress: &dyn Progress,
) -> Result<(), SandboxError> {
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(SandboxError::Provision(format!(
            "the sandbox needs these Debian packages, and installing them needs root: \
             run `sudo apt-get install -y {}` and try again",
            missing.join(" ")
        )));
    }
    progress.step(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    run_logged(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    run_logged(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(missing),
        "apt-get install",
    )
}

pub(super) fn run_logged(command: &mut Command, what: &str) -> Result<(), SandboxError> {
    let output = command
        .output()
        .map_err(|e| SandboxError::Provision(format!("{what}: cannot run: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(SandboxError::Provision(format!(
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}

/// An exclusive `flock` on a file, released on drop.
pub(super) struct FileLock(fs::File);

impl FileLock {
    /// Waits for the lock on `path`; says so when another process holds it (doing `what`).
    pub(super) fn acquire(
        path: &Path,
        progress: &dyn Progress,
        what: &str,
    ) -> Result<Self, SandboxError> {
        use std::os::fd::AsRawFd;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| SandboxError::io(path, e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            progress.step(&format!("another process is {what}; waiting for it"));
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(SandboxError::io(path, std::io::Error::last_os_error()));
            }
        }
        Ok(Self(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking a descriptor we own.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}
