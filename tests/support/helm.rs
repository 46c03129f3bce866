//! The Helm engine for chart tests: the sandbox's (`previewd::sandbox::helm_engine`), Helm's Go
//! SDK as the PyPI package `helm-python-sdk` carries it (a prebuilt native library; no `helm`
//! binary, no Go build). Installed once into a virtual environment under
//! `~/.cache/previewd/helm-python/` (or `$PREVIEWD_CACHE_DIR`), the way the control plane is
//! cached, so that `cargo test` works on a fresh machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use previewd::sandbox::helm_engine::{self, HelmEngine};

/// The engine, installed on first use (`previewd::sandbox::helm_engine`).
fn engine() -> &'static HelmEngine {
    static ENGINE: OnceLock<HelmEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let progress = previewd::sandbox::StderrProgress;
        helm_engine::ensure(&super::cache_dir(), &progress)
            .unwrap_or_else(|e| panic!("installing Helm's engine: {e}"))
    })
}

/// The Python that can `import helm_python`.
pub fn python() -> &'static Path {
    &engine().python
}

/// A `helm` command for previewd's `--helm`: the sandbox's, `helm_template.py` on the engine.
pub fn template_command() -> PathBuf {
    engine().program.clone()
}

fn run(what: &str, command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The objects Helm's install action (client-only dry run: the code path of `helm template`)
/// makes of the chart in `chart` for `release` in `namespace` with `values`; hooks excluded,
/// as Helm keeps them apart from the release's manifest.
pub fn install_manifest(
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/helm_install_manifest.py");
    let output = Command::new(python())
        .arg(script)
        .arg(chart)
        .args([release, namespace, &values.to_string()])
        .output()
        .expect("run helm_install_manifest.py");
    assert!(
        output.status.success(),
        "Helm's install dry run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    super::yaml_documents(&String::from_utf8_lossy(&output.stdout))
}

/// A Helm chart repository holding the chart in `chart`, as `helm package` and `helm repo
/// index --url base_url` make it: the files to serve at `base_url` (`index.yaml` and the
/// chart's archive), as (name, bytes).
pub fn chart_repository(chart: &Path, base_url: &str) -> Vec<(String, Vec<u8>)> {
    let folder = tempfile::tempdir().expect("a folder for the chart repository");
    let script = "import sys, helm_python as h\n\
                  h.package(sys.argv[1], destination=sys.argv[2])\n\
                  h.repo_index_generate(sys.argv[2], base_url=sys.argv[3])\n";
    run(
        "packaging and indexing the chart",
        Command::new(python())
            .args(["-c", script])
            .arg(chart)
            .arg(folder.path())
            .arg(base_url),
    );
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder.path()).expect("the repository folder") {
        let path = entry.expect("a repository file").path();
        let name = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        files.push((name, std::fs::read(&path).expect("read a repository file")));
    }
    files.sort();
    files
}
