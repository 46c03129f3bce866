//! Provisioning: the binaries the sandbox and the tests run, of pinned versions
//! ([`super::versions`]): kube-apiserver, kube-controller-manager, kube-scheduler and kubectl of
//! a current Kubernetes, etcd under them, and `helm`.
//!
//! Each is found or built, in this order:
//! 1. in `KUBEBUILDER_ASSETS` (the folder controller-runtime's envtest uses), then on PATH,
//!    when it reports the wanted line: the Kubernetes minor of [`KubernetesVersion::wanted`]
//!    (1.37, or `PREVIEWD_KUBERNETES_VERSION`'s), etcd 3.5 or newer, Helm's pinned minor;
//! 2. otherwise built once from its published Go module with the go command
//!    ([`super::go_build`]) and cached under `~/.cache/previewd/builds/`, keyed by version.
//!
//! Why build: the machines previewd is developed and tested on have no container engine and
//! reach no network but the package registries; the Go module proxy serves `k8s.io/kubernetes`,
//! `go.etcd.io/etcd/server/v3` and `helm.sh/helm/v4`, and nothing serves their release binaries.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::SandboxError;
use super::go_build::{Go, GoBuild, no_replaces};
use super::machine::{Progress, ensure_debian_packages, is_executable};
use super::versions::{self, KubernetesVersion};

/// The Kubernetes programs the sandbox runs, built together from `k8s.io/kubernetes`.
pub const KUBERNETES_BINARIES: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];
/// Debian packages the sandbox needs at run time, with a file that proves each.
const PACKAGES: [(&str, &str); 1] = [("openssl", "/usr/bin/openssl")];

/// Where the control-plane binaries and kubectl are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub apiserver: PathBuf,
    pub controller_manager: PathBuf,
    pub scheduler: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
    /// The Kubernetes release the apiserver reports, e.g. `v1.37.2`.
    pub kubernetes: String,
    /// Where they came from, one line for a person.
    pub origin: String,
}

/// The control plane's binaries and kubectl, found or built (see the module's comment). Safe
/// to call from several processes at once.
pub fn ensure_binaries(
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<Binaries, SandboxError> {
    ensure_packages(progress)?;
    let wanted = KubernetesVersion::wanted().map_err(SandboxError::Provision)?;
    let (kubernetes, kubernetes_origin) = match found_kubernetes(&wanted) {
        Some(found) => found,
        None => {
            let dir = kubernetes_build(&wanted).ensure(cache_dir, progress)?;
            let paths = KUBERNETES_BINARIES.map(|name| dir.join(name));
            (
                paths,
                format!("Kubernetes {} built in {}", wanted.tag(), dir.display()),
            )
        }
    };
    let (etcd, etcd_origin) = match found(&["etcd"], etcd_is_supported) {
        Some(path) => (path.clone(), format!("etcd {}", path.display())),
        None => {
            let dir = etcd_build().ensure(cache_dir, progress)?;
            (
                dir.join("etcd"),
                format!("etcd {} built in {}", versions::ETCD, dir.display()),
            )
        }
    };
    let [apiserver, controller_manager, scheduler, kubectl] = kubernetes;
    let reported = reported_kubernetes_version(&apiserver).unwrap_or_else(|| wanted.tag());
    Ok(Binaries {
        apiserver,
        controller_manager,
        scheduler,
        kubectl,
        etcd,
        kubernetes: reported,
        origin: format!("{kubernetes_origin}; {etcd_origin}"),
    })
}

/// The kubectl of the wanted Kubernetes release alone (for `previewd render`, which needs no
/// control plane): one of the wanted minor found on its own, or the one built with the other
/// three programs.
pub fn ensure_kubectl(cache_dir: &Path, progress: &dyn Progress) -> Result<PathBuf, SandboxError> {
    let wanted = KubernetesVersion::wanted().map_err(SandboxError::Provision)?;
    if let Some(kubectl) = found(&["kubectl"], |p| of_minor(p, &wanted)) {
        return Ok(kubectl);
    }
    let dir = kubernetes_build(&wanted).ensure(cache_dir, progress)?;
    Ok(dir.join("kubectl"))
}

/// The pinned `helm`: one of Helm's pinned minor line found in `KUBEBUILDER_ASSETS` or on
/// PATH, or built once from `helm.sh/helm/v4` into the cache. Returns it and where it came from.
pub fn ensure_helm(
    cache_dir: &Path,
    progress: &dyn Progress,
) -> Result<(PathBuf, String), SandboxError> {
    let pinned_minor = minor_line(versions::HELM);
    let of_the_pinned_line = |path: &Path| {
        let output = Command::new(path)
            .args(["version", "--template", "{{.Version}}"])
            .output()
            .ok()?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
        (minor_line(&version) == pinned_minor).then_some(())
    };
    if let Some(path) = found(&["helm"], |p| of_the_pinned_line(p).is_some()) {
        let said = format!("{} (found, Helm {pinned_minor})", path.display());
        return Ok((path, said));
    }
    let dir = helm_build().ensure(cache_dir, progress)?;
    let helm = dir.join("helm");
    let said = format!(
        "{} (Helm {}, built from its Go module)",
        helm.display(),
        versions::HELM
    );
    Ok((helm, said))
}

/// `v4.3.1+gabc` → `v4.3`.
fn minor_line(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// The four Kubernetes programs, when each is found and reports the wanted minor.
fn found_kubernetes(wanted: &KubernetesVersion) -> Option<([PathBuf; 4], String)> {
    let paths: Vec<PathBuf> = KUBERNETES_BINARIES
        .iter()
        .map(|name| found(&[name], |p| of_minor(p, wanted)))
        .collect::<Option<_>>()?;
    let origin = format!(
        "Kubernetes 1.{} found in {}",
        wanted.minor,
        distinct_folders(&paths)
    );
    paths.try_into().ok().map(|paths| (paths, origin))
}

/// Whether the Kubernetes program at `path` reports `wanted`'s minor.
fn of_minor(path: &Path, wanted: &KubernetesVersion) -> bool {
    reported_kubernetes_version(path)
        .and_then(|v| KubernetesVersion::parse(&v))
        .is_some_and(|v| v.minor == wanted.minor)
}

fn distinct_folders(paths: &[PathBuf]) -> String {
    let mut folders: Vec<String> = paths
        .iter()
        .filter_map(|p| p.parent().map(|d| d.display().to_string()))
        .collect();
    folders.sort();
    folders.dedup();
    folders.join(", ")
}

/// The release a Kubernetes program says it is (`kube-apiserver --version` prints `Kubernetes
/// v1.37.2`; kubectl prints its client version), without any suffix after the patch.
pub fn reported_kubernetes_version(program: &Path) -> Option<String> {
    let is_kubectl = program.file_name().is_some_and(|n| n == "kubectl");
    let args: &[&str] = if is_kubectl {
        &["version", "--client", "-o", "json"]
    } else {
        &["--version"]
    };
    let output = Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = if is_kubectl {
        let parsed: serde_json::Value = serde_json::from_str(&text).ok()?;
        parsed["clientVersion"]["gitVersion"].as_str()?.to_string()
    } else {
        text.split_whitespace()
            .find(|w| w.starts_with("v1."))?
            .to_string()
    };
    let parsed = KubernetesVersion::parse(version.split(['-', '+']).next()?)?;
    Some(parsed.tag())
}

/// An etcd of a line Kubernetes supports (3.5 and newer).
fn etcd_is_supported(path: &Path) -> bool {
    let Ok(output) = Command::new(path).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(str::trim)
        .unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(Some(3)), Some(Some(minor))) if minor >= 5)
}

/// The first of `names` in `KUBEBUILDER_ASSETS`, then on PATH, that `accept`s. Only absolute
/// folders are searched: an empty PATH entry would mean the working directory.
fn found(names: &[&str], accept: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let assets = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let folders: Vec<PathBuf> = assets
        .into_iter()
        .chain(std::env::split_paths(&path))
        .filter(|folder| folder.is_absolute())
        .collect();
    folders
        .iter()
        .flat_map(|folder| names.iter().map(move |name| folder.join(name)))
        .filter(|candidate| is_executable(candidate))
        .find(|candidate| accept(candidate))
}

/// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl of `version`, from
/// `k8s.io/kubernetes` with every staging module it replaces pinned to the matching `v0.x.y`,
/// stamped with the version as Kubernetes' own build (hack/lib/version.sh) stamps it.
fn kubernetes_build(version: &KubernetesVersion) -> GoBuild {
    let tag = version.tag();
    let stamps = [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ]
    .iter()
    .flat_map(|package| {
        [
            format!("-X {package}.gitVersion={tag}"),
            format!("-X {package}.gitMajor=1"),
            format!("-X {package}.gitMinor={}", version.minor),
            format!("-X {package}.gitTreeState=clean"),
        ]
    })
    .collect();
    let mut checks: Vec<(String, Vec<String>, String)> = KUBERNETES_BINARIES[..3]
        .iter()
        .map(|name| {
            (
                name.to_string(),
                vec!["--version".into()],
                format!("Kubernetes {tag}"),
            )
        })
        .collect();
    checks.push((
        "kubectl".into(),
        vec!["version".into(), "--client".into()],
        format!("Client Version: {tag}"),
    ));
    let (staging_tag, module_tag) = (version.staging_tag(), tag.clone());
    GoBuild {
        name: format!("kubernetes-{tag}"),
        what: format!(
            "kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (Kubernetes {tag})"
        ),
        packages: KUBERNETES_BINARIES
            .iter()
            .map(|name| (format!("k8s.io/kubernetes/cmd/{name}"), tag.clone()))
            .collect(),
        replaces: Box::new(move |go| {
            let modules = staging_modules(go, &module_tag)?;
            Ok(modules
                .into_iter()
                .map(|m| (m, staging_tag.clone()))
                .collect())
        }),
        stamps,
        binaries: KUBERNETES_BINARIES.map(String::from).to_vec(),
        renames: Vec::new(),
        estimate: "about 6 minutes on 2 cores",
        checks,
    }
}

fn etcd_build() -> GoBuild {
    let version = versions::ETCD.trim_start_matches('v');
    GoBuild {
        name: format!("etcd-{}", versions::ETCD),
        what: format!("etcd {}", versions::ETCD),
        packages: vec![("go.etcd.io/etcd/server/v3".into(), versions::ETCD.into())],
        replaces: no_replaces(),
        stamps: Vec::new(),
        binaries: vec!["etcd".into()],
        renames: vec![("server".into(), "etcd".into())],
        estimate: "about 1 minute on 2 cores",
        checks: vec![(
            "etcd".into(),
            vec!["--version".into()],
            format!("etcd Version: {version}"),
        )],
    }
}

fn helm_build() -> GoBuild {
    GoBuild {
        name: format!("helm-{}", versions::HELM),
        what: format!("helm {}", versions::HELM),
        packages: vec![("helm.sh/helm/v4/cmd/helm".into(), versions::HELM.into())],
        replaces: no_replaces(),
        stamps: vec![format!(
            "-X helm.sh/helm/v4/internal/version.version={}",
            versions::HELM
        )],
        binaries: vec!["helm".into()],
        renames: Vec::new(),
        estimate: "about 2 minutes on 2 cores",
        checks: vec![(
            "helm".into(),
            vec!["version".into(), "--template".into(), "{{.Version}}".into()],
            versions::HELM.into(),
        )],
    }
}

/// The staging modules `k8s.io/kubernetes@tag` replaces with `./staging/…`, read from its
/// go.mod as the Go module proxy serves it (checked against the checksum database).
fn staging_modules(go: &Go, tag: &str) -> Result<Vec<String>, SandboxError> {
    let output = go
        .command(&std::env::temp_dir())
        .args(["mod", "download", "-json"])
        .arg(format!("k8s.io/kubernetes@{tag}"))
        .output()
        .map_err(|e| SandboxError::Build(format!("go mod download: {e}")))?;
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    let Some(go_mod) = answer["GoMod"].as_str() else {
        return Err(SandboxError::Build(format!(
            "go mod download k8s.io/kubernetes@{tag} failed: {}{}",
            answer["Error"].as_str().unwrap_or_default(),
            String::from_utf8_lossy(&output.stderr)
        )));
    };
    let text = fs::read_to_string(go_mod).map_err(|e| SandboxError::io(Path::new(go_mod), e))?;
    let modules: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let (module, target) = line.trim().split_once("=>")?;
            target
                .trim()
                .starts_with("./staging/")
                .then(|| module.trim().to_string())
        })
        .collect();
    if modules.is_empty() {
        return Err(SandboxError::Build(format!(
            "{go_mod} replaces no staging module"
        )));
    }
    Ok(modules)
}

/// Installs the Debian packages that are missing. Needs root; says so plainly otherwise.
pub fn ensure_packages(progress: &dyn Progress) -> Result<(), SandboxError> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, proof)| !Path::new(proof).exists())
        .map(|(package, _)| *package)
        .collect();
    ensure_debian_packages(&missing, progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_versions_are_compared_by_their_minor_line() {
        assert_eq!(minor_line("v4.3.1+g0123abc"), "v4.3");
        assert_eq!(minor_line(versions::HELM), "v4.3");
        assert_ne!(minor_line("v3.16.2"), minor_line(versions::HELM));
    }
}
