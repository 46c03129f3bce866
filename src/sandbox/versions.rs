//! The one place that pins the versions of everything previewd runs beside it: the Kubernetes
//! control plane the sandbox and the tests start, etcd under it, and the `helm` and `kubectl`
//! previewd runs as its engines. The sandbox builds each from its published Go module
//! ([`super::go_build`]); `.ci/Containerfile`, `.ci/release.yml`, the chart's `kubeVersion` and
//! docs/installing.md name the same versions, and `tests/integration/image.rs` fails when one
//! of them drifts from here.

/// The Kubernetes release the sandbox builds and the test suite runs on by default: the newest
/// `k8s.io/kubernetes` the Go module proxy served (v1.34 to v1.37) that builds with Go 1.26.
/// Its staging modules (`k8s.io/api`, `k8s.io/client-go`, …) are pinned to the matching
/// `v0.37.2`, as Kubernetes documents for using `k8s.io/kubernetes` as a module.
pub const KUBERNETES: &str = "v1.37.2";

/// The oldest Kubernetes minor previewd supports: the oldest release still maintained upstream
/// when this was written (1.34, whose maintenance ends in 2026-10; the typed API previewd is
/// built against, k8s-openapi's `v1_33`, holds nothing newer). `PREVIEWD_KUBERNETES_VERSION`
/// runs the suite on it (docs/development.md records such a run).
pub const OLDEST_SUPPORTED_MINOR: u32 = 34;

/// The newest Kubernetes minor previewd supports: [`KUBERNETES`]'s.
pub const NEWEST_SUPPORTED_MINOR: u32 = 37;

/// etcd of the line Kubernetes 1.37 is built against (its go.mod requires the 3.7 client).
/// Built from `go.etcd.io/etcd/server/v3`, whose `main` package is the `etcd` server.
pub const ETCD: &str = "v3.7.3";

/// Helm, the current major line (4), built from `helm.sh/helm/v4/cmd/helm`.
pub const HELM: &str = "v4.3.1";

/// Names the environment variable that picks another Kubernetes release for the sandbox and
/// the tests (`PREVIEWD_KUBERNETES_VERSION=v1.34.4 cargo test`): any `v1.MINOR.PATCH` the Go
/// module proxy serves, within the supported range.
pub const KUBERNETES_VERSION_VARIABLE: &str = "PREVIEWD_KUBERNETES_VERSION";

/// A Kubernetes release, `v1.MINOR.PATCH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesVersion {
    pub minor: u32,
    pub patch: u32,
}

impl KubernetesVersion {
    /// Reads `v1.37.2` (or `1.37.2`); anything else is `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let rest = text.strip_prefix('v').unwrap_or(text);
        let mut parts = rest.splitn(3, '.');
        let major = parts.next()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?.parse().ok()?;
        (major == "1").then_some(Self { minor, patch })
    }

    /// The release wanted: `PREVIEWD_KUBERNETES_VERSION` when set, else [`KUBERNETES`]. A value
    /// that is not a supported `v1.MINOR.PATCH` is an error that says what is.
    pub fn wanted() -> Result<Self, String> {
        match std::env::var(KUBERNETES_VERSION_VARIABLE) {
            Ok(text) if !text.trim().is_empty() => Self::supported(&text),
            _ => Self::supported(KUBERNETES),
        }
    }

    fn supported(text: &str) -> Result<Self, String> {
        let version = Self::parse(text).ok_or_else(|| {
            format!(
                "{KUBERNETES_VERSION_VARIABLE}={text:?}: expected v1.MINOR.PATCH, e.g. {KUBERNETES}"
            )
        })?;
        if !(OLDEST_SUPPORTED_MINOR..=NEWEST_SUPPORTED_MINOR).contains(&version.minor) {
            return Err(format!(
                "{KUBERNETES_VERSION_VARIABLE}={text:?}: previewd supports Kubernetes 1.{OLDEST_SUPPORTED_MINOR} to 1.{NEWEST_SUPPORTED_MINOR}"
            ));
        }
        Ok(version)
    }

    /// `v1.37.2`: the tag of `k8s.io/kubernetes`.
    pub fn tag(&self) -> String {
        format!("v1.{}.{}", self.minor, self.patch)
    }

    /// `v0.37.2`: the tag of its staging modules.
    pub fn staging_tag(&self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_read_and_its_staging_tag_follows_it() {
        let version = KubernetesVersion::parse("v1.37.2").unwrap();
        assert_eq!((version.minor, version.patch), (37, 2));
        assert_eq!(version.tag(), "v1.37.2");
        assert_eq!(version.staging_tag(), "v0.37.2");
        assert_eq!(KubernetesVersion::parse("1.34.4").unwrap().tag(), "v1.34.4");
        for bad in ["v2.1.0", "v1.37", "latest", "v1.x.2", ""] {
            assert_eq!(KubernetesVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_supported_range_is_accepted() {
        assert!(KubernetesVersion::supported(KUBERNETES).is_ok());
        let too_old = KubernetesVersion::supported("v1.20.2").unwrap_err();
        assert!(too_old.contains("1.34 to 1.37"), "{too_old}");
        assert!(KubernetesVersion::supported("v1.33.9").is_err());
        assert!(KubernetesVersion::supported("v1.34.0").is_ok());
        let pinned = KubernetesVersion::parse(KUBERNETES).unwrap();
        assert_eq!(pinned.minor, NEWEST_SUPPORTED_MINOR);
    }
}
