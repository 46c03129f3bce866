//! The image (issue: "an image that is built, not described"): what cannot be built here is
//! checked here. `.ci/Containerfile` builds it, `.ci/release.yml` publishes it under the name
//! the chart installs by default, and docs/installing.md describes it; these tests keep the
//! versions and names in those files in agreement with the one place that pins them
//! (`previewd::sandbox::versions`, which the sandbox and the tests build from), and check that
//! the binary links only against libraries the final stage (distroless `cc`: glibc and libgcc)
//! has.

use previewd::sandbox::versions;

use std::collections::BTreeMap;
use std::path::Path;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `ARG NAME=value` defaults of the Containerfile.
fn build_arguments() -> BTreeMap<String, String> {
    read(".ci/Containerfile")
        .lines()
        .filter_map(|line| line.strip_prefix("ARG "))
        .filter_map(|arg| arg.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// The value of `key: value` (or `key = "value"`) on a line of its own in `text`.
fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix(key)?;
            let value = rest.trim_start().strip_prefix([':', '='])?;
            Some(value.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

#[test]
fn the_containerfile_the_chart_the_release_and_the_docs_name_one_image() {
    let arguments = build_arguments();
    let argument = |name: &str| {
        arguments
            .get(name)
            .unwrap_or_else(|| panic!(".ci/Containerfile has no ARG {name}"))
            .clone()
    };
    let cargo = read("Cargo.toml");
    let chart = read("charts/previewd/Chart.yaml");
    let values = read("charts/previewd/values.yaml");
    let release = read(".ci/release.yml");
    let installing = read("docs/installing.md");

    // The image is built with the Rust the project says it needs, at the version it releases.
    assert_eq!(argument("RUST_VERSION"), field(&cargo, "rust-version"));
    assert_eq!(field(&chart, "appVersion"), field(&cargo, "version"));
    assert_eq!(field(&chart, "version"), field(&cargo, "version"));
    // The chart installs the image the release publishes.
    let image = field(&values, "repository");
    assert_eq!(
        field(&release, "IMAGE"),
        image,
        ".ci/release.yml publishes another image"
    );
    assert!(release.contains("file: .ci/Containerfile"));
    // The engines the image carries are the versions the sandbox and the tests run.
    assert_eq!(argument("HELM_VERSION"), versions::HELM);
    assert_eq!(argument("KUBERNETES_VERSION"), versions::KUBERNETES);
    assert!(release.contains(&format!("version: {}", versions::HELM)));
    // The chart says which Kubernetes it supports: the range versions.rs states.
    assert_eq!(
        field(&chart, "kubeVersion"),
        format!(
            ">= 1.{}.0-0, < 1.{}.0-0",
            versions::OLDEST_SUPPORTED_MINOR,
            versions::NEWEST_SUPPORTED_MINOR + 1
        )
    );
    // The docs name the same image, file, engines and supported range.
    let range = format!(
        "Kubernetes 1.{} to 1.{}",
        versions::OLDEST_SUPPORTED_MINOR,
        versions::NEWEST_SUPPORTED_MINOR
    );
    for named in [
        image.as_str(),
        ".ci/Containerfile",
        versions::HELM,
        versions::KUBERNETES,
        &range,
    ] {
        assert!(
            installing.contains(named),
            "docs/installing.md does not say {named}"
        );
    }
}

#[test]
fn the_image_runs_as_the_user_the_chart_runs_it_as_and_builds_its_engines_verified() {
    let containerfile = read(".ci/Containerfile");
    let stages = containerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(stages >= 3, "build, engines and final stages: {stages}");
    let last_stage = containerfile.rsplit("\nFROM ").next().unwrap();
    assert!(last_stage.contains("USER 65532:65532"), "{last_stage}");
    assert!(
        !last_stage.contains("RUN "),
        "the final stage has no shell to run anything"
    );
    let values = read("charts/previewd/values.yaml");
    assert_eq!(field(&values, "runAsUser"), "65532");
    // Nothing is downloaded outside the go command, which verifies every module it fetches
    // against the Go checksum database; both engines are checked to be the pinned versions.
    assert!(!containerfile.contains("curl"), "{containerfile}");
    for unverified in [
        "GONOSUMDB",
        "GONOSUMCHECK",
        "GOSUMDB",
        "GOPRIVATE",
        "GOINSECURE",
        "-insecure",
    ] {
        assert!(
            !containerfile.contains(unverified),
            "{unverified} in {containerfile}"
        );
    }
    assert!(containerfile.contains("grep -qx \"Client Version: ${KUBERNETES_VERSION}\""));
    assert!(containerfile.contains("grep -qx \"${HELM_VERSION}\""));
}

/// The libraries distroless `cc-debian12` carries that a Rust binary may link against: glibc's
/// and libgcc's. Anything else (libssl, say) would be missing at run time.
const BASE_IMAGE_LIBRARIES: [&str; 8] = [
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libgcc_s.so.1",
];

#[test]
fn the_binary_needs_only_the_libraries_the_base_image_has() {
    let binary = env!("CARGO_BIN_EXE_previewd");
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .expect("ldd (Debian's libc-bin) runs");
    assert!(output.status.success(), "ldd {binary} failed");
    let listed = String::from_utf8_lossy(&output.stdout);
    let needed: Vec<&str> = listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(|library| library.rsplit('/').next().unwrap_or(library))
        .collect();
    assert!(needed.contains(&"libc.so.6"), "ldd said: {listed}");
    let missing: Vec<&&str> = needed
        .iter()
        .filter(|library| !BASE_IMAGE_LIBRARIES.contains(library))
        .collect();
    assert!(
        missing.is_empty(),
        "previewd links against {missing:?}, which gcr.io/distroless/cc-debian12 lacks: change the final stage of .ci/Containerfile"
    );
}
