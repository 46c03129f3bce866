//! The real `helm` and `kubectl` for the tests, of the versions `previewd::sandbox::versions`
//! pins: found where they are of the pinned line, otherwise built once from their Go modules
//! into `~/.cache/previewd/builds/` (or under `$PREVIEWD_CACHE_DIR`), as the control plane is
//! (`previewd::sandbox::provision`), so that `cargo test` works on a fresh machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use previewd::sandbox::provision;

/// The pinned `helm`, brought on first use.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let progress = previewd::sandbox::StderrProgress;
        provision::ensure_helm(&super::cache_dir(), &progress)
            .unwrap_or_else(|e| panic!("bringing helm: {e}"))
            .0
    })
}

/// The `kubectl` of the control plane's release, brought on first use.
pub fn kubectl() -> &'static Path {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL.get_or_init(|| {
        let progress = previewd::sandbox::StderrProgress;
        provision::ensure_binaries(&super::cache_dir(), &progress)
            .unwrap_or_else(|e| panic!("bringing kubectl: {e}"))
            .kubectl
    })
}

/// A `helm` command for previewd's `--helm`.
pub fn template_command() -> PathBuf {
    helm().to_path_buf()
}

/// Runs `helm args…`, with Helm's own folders in a temporary place (no repository or plugin
/// of the machine's user applies), and returns what it said, successful or not.
pub fn run_helm(args: &[&std::ffi::OsStr]) -> Output {
    let home = tempfile::tempdir().expect("a home for helm");
    Command::new(helm())
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap_or_else(|e| panic!("could not run helm {args:?}: {e}"))
}

/// `helm args…`, which must succeed; its standard output.
pub fn helm_ok(args: &[&std::ffi::OsStr]) -> String {
    let output = run_helm(args);
    assert!(
        output.status.success(),
        "helm {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `values` written to a file in `folder`, for `--values`.
pub fn values_file(folder: &Path, values: &serde_json::Value) -> PathBuf {
    let path = folder.join("values.json");
    std::fs::write(&path, values.to_string()).expect("write the values");
    path
}

/// The objects `helm template` makes of the chart in `chart` for `release` in `namespace` with
/// `values`, without hooks (Helm keeps them apart from the release's manifest).
pub fn install_manifest(
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let folder = tempfile::tempdir().expect("a folder for the values");
    let values = values_file(folder.path(), values);
    let text = helm_ok(&[
        "template".as_ref(),
        release.as_ref(),
        chart.as_os_str(),
        "--namespace".as_ref(),
        namespace.as_ref(),
        "--no-hooks".as_ref(),
        "--values".as_ref(),
        values.as_os_str(),
    ]);
    super::yaml_documents(&text)
}

/// A Helm chart repository holding the chart in `chart`, as `helm package` and `helm repo
/// index --url base_url` make it: the files to serve at `base_url` (`index.yaml` and the
/// chart's archive), as (name, bytes).
pub fn chart_repository(chart: &Path, base_url: &str) -> Vec<(String, Vec<u8>)> {
    let folder = tempfile::tempdir().expect("a folder for the chart repository");
    helm_ok(&[
        "package".as_ref(),
        chart.as_os_str(),
        "--destination".as_ref(),
        folder.path().as_os_str(),
    ]);
    helm_ok(&[
        "repo".as_ref(),
        "index".as_ref(),
        folder.path().as_os_str(),
        "--url".as_ref(),
        base_url.as_ref(),
    ]);
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
