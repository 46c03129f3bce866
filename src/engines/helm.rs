//! Helm charts, rendered by Helm itself: `helm template`, with the chart's files written to a
//! private folder (or fetched by Helm from a chart repository or OCI registry), the values as a
//! values file, `--include-crds` so that a chart's CRDs are seen (and refused) rather than
//! silently left out.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{EngineError, Engines, Job, Rendered};

/// Where the chart is.
pub enum Chart<'a> {
    /// The chart folder's files, as (path relative to the chart folder, bytes).
    Files(&'a [(String, Vec<u8>)]),
    /// A published chart: a Helm repository URL or an `oci://` registry, name and version.
    Published {
        repository: &'a str,
        name: &'a str,
        version: &'a str,
    },
}

/// One `helm template` run.
pub struct HelmRender<'a> {
    pub chart: Chart<'a>,
    pub release: &'a str,
    pub namespace: &'a str,
    pub values: &'a Value,
}

impl HelmRender<'_> {
    /// A digest of everything the output depends on.
    fn key(&self) -> [u8; 32] {
        let mut digest = Sha256::new();
        digest.update(b"helm\0");
        match &self.chart {
            Chart::Files(files) => {
                for (path, bytes) in *files {
                    digest.update((path.len() as u64).to_le_bytes());
                    digest.update(path.as_bytes());
                    digest.update((bytes.len() as u64).to_le_bytes());
                    digest.update(bytes);
                }
            }
            Chart::Published {
                repository,
                name,
                version,
            } => {
                for part in [repository, name, version] {
                    digest.update(part.as_bytes());
                    digest.update(b"\0");
                }
            }
        }
        for part in [self.release, self.namespace, &self.values.to_string()] {
            digest.update(b"\0");
            digest.update(part.as_bytes());
        }
        digest.finalize().into()
    }

    /// `helm template` arguments, run in `folder` (where the chart and values file are).
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["template", self.release]
            .into_iter()
            .map(String::from)
            .collect();
        match &self.chart {
            Chart::Files(_) => args.push("./chart".into()),
            Chart::Published {
                repository,
                name,
                version,
            } => {
                if repository.starts_with("oci://") {
                    args.push(format!("{}/{name}", repository.trim_end_matches('/')));
                } else {
                    args.extend(["--repo".into(), repository.to_string(), name.to_string()]);
                }
                args.extend(["--version".into(), version.to_string()]);
            }
        }
        args.extend(
            [
                "--namespace",
                self.namespace,
                "--values",
                "values.json",
                "--include-crds",
            ]
            .map(String::from),
        );
        args
    }
}

impl Engines {
    /// The chart's objects as `helm template` prints them (one YAML stream), from the cache
    /// when nothing it depends on changed.
    pub async fn helm_template(&self, render: &HelmRender<'_>) -> Result<Rendered, EngineError> {
        let values =
            serde_json::to_vec(render.values).map_err(|e| EngineError::Io(e.to_string()))?;
        let values_file = [("values.json".to_string(), values)];
        let mut files = vec![("", &values_file[..])];
        if let Chart::Files(chart) = &render.chart {
            files.push(("chart", chart));
        }
        self.render(Job {
            key: render.key(),
            files,
            program: &self.config.helm,
            args: render.args(),
            env: helm_env,
        })
        .await
    }
}

/// Helm's own folders inside the private folder: no repository list, registry login or
/// plugin of the operator's is used, and nothing is left behind.
fn helm_env(folder: &Path) -> Vec<(&'static str, String)> {
    let home = |sub: &str| folder.join(sub).display().to_string();
    vec![
        ("HOME", home("home")),
        ("HELM_CACHE_HOME", home("home/cache")),
        ("HELM_CONFIG_HOME", home("home/config")),
        ("HELM_DATA_HOME", home("home/data")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render<'a>(chart: Chart<'a>, values: &'a Value) -> HelmRender<'a> {
        HelmRender {
            chart,
            release: "web-pr-2",
            namespace: "preview-web-pr-2",
            values,
        }
    }

    #[test]
    fn arguments_for_a_folder_a_repository_and_a_registry() {
        let values = serde_json::json!({});
        let files = [("Chart.yaml".to_string(), b"name: web".to_vec())];
        let tail = "--namespace preview-web-pr-2 --values values.json --include-crds";
        assert_eq!(
            render(Chart::Files(&files), &values).args().join(" "),
            format!("template web-pr-2 ./chart {tail}")
        );
        let published = |repository| Chart::Published {
            repository,
            name: "podinfo",
            version: "6.5.0",
        };
        assert_eq!(
            render(published("https://charts.example.com"), &values)
                .args()
                .join(" "),
            format!(
                "template web-pr-2 --repo https://charts.example.com podinfo --version 6.5.0 {tail}"
            )
        );
        assert_eq!(
            render(published("oci://ghcr.io/org/charts/"), &values)
                .args()
                .join(" "),
            format!("template web-pr-2 oci://ghcr.io/org/charts/podinfo --version 6.5.0 {tail}")
        );
    }

    #[test]
    fn the_key_follows_every_input() {
        let (a, b) = (
            serde_json::json!({"tag": "a"}),
            serde_json::json!({"tag": "b"}),
        );
        let files = [("Chart.yaml".to_string(), b"name: web".to_vec())];
        let changed = [("Chart.yaml".to_string(), b"name: api".to_vec())];
        let key = render(Chart::Files(&files), &a).key();
        assert_eq!(key, render(Chart::Files(&files), &a).key());
        assert_ne!(key, render(Chart::Files(&files), &b).key(), "values");
        assert_ne!(key, render(Chart::Files(&changed), &a).key(), "chart files");
        let mut other_namespace = render(Chart::Files(&files), &a);
        other_namespace.namespace = "preview-other";
        assert_ne!(key, other_namespace.key(), "namespace");
    }
}
