//! The `helm` the sandbox runs as previewd's chart engine: a program `--helm` names, or, for
//! the default `helm`, the pinned one ([`super::provision::ensure_helm`]: found on PATH when it
//! is of the pinned minor line, otherwise built once from `helm.sh/helm/v4` into the cache).
//! The tests use the same one (`tests/support/tools.rs`).

use std::path::{Path, PathBuf};

use super::SandboxError;
use super::machine::{Progress, StderrProgress, is_executable, which};
use super::provision::ensure_helm;

/// The `helm` previewd should run in the sandbox, and where it came from (for the sandbox's
/// output): `named` when it is not the default `helm` and is found (a path, or a name on PATH);
/// the pinned Helm for the default. Another name that is not found is an error, not silently
/// replaced.
pub fn choose(
    named: &Path,
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<(PathBuf, String), SandboxError> {
    if named == Path::new("helm") {
        return ensure_helm(cache_dir, progress);
    }
    let found = match named.to_str() {
        Some(name) if !name.contains('/') => which(name),
        _ => is_executable(named).then(|| named.to_path_buf()),
    };
    match found {
        Some(found) => {
            let said = format!("{} (found)", found.display());
            Ok((found, said))
        }
        None => Err(SandboxError::Provision(format!(
            "--helm {}: no such program",
            named.display()
        ))),
    }
}

/// [`choose`], off the async threads (a build takes minutes), its progress on standard error.
pub async fn bring(named: &Path, cache_dir: &Path) -> Result<(PathBuf, String), SandboxError> {
    let (named, cache_dir) = (named.to_path_buf(), cache_dir.to_path_buf());
    tokio::task::spawn_blocking(move || choose(&named, &cache_dir, &StderrProgress))
        .await
        .map_err(|e| SandboxError::Provision(format!("bringing Helm: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quiet;
    impl Progress for Quiet {
        fn step(&self, _: &str) {}
    }

    /// A `--helm` that names a program is used as it is, or refused when it does not exist;
    /// only the default `helm` is the pinned one (not asked here: that may build it).
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
