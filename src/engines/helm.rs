//! Helm charts, rendered by Helm itself: `helm template`, with the chart's files written to a
//! private folder (or a published chart's archive, downloaded once by `helm pull`), the values
//! as a values file, `--include-crds` so that a chart's CRDs are seen (and refused) rather than
//! silently left out.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::process::RunError;
use super::{EngineError, Engines, Job, Rendered};

/// The largest published chart archive previewd keeps (charts are KiBs packed; a bigger one is
/// a mistake, and every archive stays in memory for the process's life, bounded by the cache).
pub const MAX_CHART_ARCHIVE_BYTES: u64 = 8 << 20;

/// A published chart's archive in the render folder.
const ARCHIVE: &str = "chart.tgz";
/// Where `helm pull` writes it, in its own folder.
const PULLED: &str = "pulled";

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

    /// `helm template` arguments, run in the folder where the chart (or its archive) and the
    /// values file are.
    fn args(&self) -> Vec<String> {
        let chart = match &self.chart {
            Chart::Files(_) => "./chart",
            Chart::Published { .. } => "./chart.tgz",
        };
        [
            "template",
            self.release,
            chart,
            "--namespace",
            self.namespace,
            "--values",
            "values.json",
            "--include-crds",
        ]
        .map(String::from)
        .to_vec()
    }
}

impl Chart<'_> {
    /// `helm pull` arguments for a published chart: the pinned version into [`PULLED`].
    fn pull_args(&self) -> Option<Vec<String>> {
        let Chart::Published {
            repository,
            name,
            version,
        } = self
        else {
            return None;
        };
        let mut args = vec!["pull".to_string()];
        if repository.starts_with("oci://") {
            args.push(format!("{}/{name}", repository.trim_end_matches('/')));
        } else {
            args.extend([name.to_string(), "--repo".into(), repository.to_string()]);
        }
        args.extend(["--version", version, "--destination", PULLED].map(String::from));
        Some(args)
    }
}

impl Engines {
    /// The chart's objects as `helm template` prints them (one YAML stream), from the cache
    /// when nothing it depends on changed.
    /// `owner` (the template) is whose fair turn the render takes.
    pub async fn helm_template(
        &self,
        render: &HelmRender<'_>,
        owner: &str,
    ) -> Result<Rendered, EngineError> {
        let key = render.key();
        if let Some(text) = self.cache.get(&key) {
            return Ok(Rendered { text, cached: true });
        }
        let values =
            serde_json::to_vec(render.values).map_err(|e| EngineError::Io(e.to_string()))?;
        let mut top = vec![("values.json".to_string(), values)];
        if let Some(pull) = render.chart.pull_args() {
            let archive = self
                .published_chart(key_of_pull(&pull), pull, owner)
                .await?;
            top.push((ARCHIVE.to_string(), archive.to_vec()));
        }
        let mut files = vec![("", &top[..])];
        if let Chart::Files(chart) = &render.chart {
            files.push(("chart", chart));
        }
        self.render(Job {
            owner,
            key,
            files,
            program: &self.config.helm,
            args: render.args(),
            env: helm_env,
        })
        .await
    }

    /// A published chart's archive: downloaded by `helm pull` once per repository, name and
    /// version (pinned), then kept, so that a new commit downloads nothing and a chart
    /// repository's rate limits see one request per chart version, not one per push.
    async fn published_chart(
        &self,
        key: [u8; 32],
        pull: Vec<String>,
        owner: &str,
    ) -> Result<Arc<Vec<u8>>, EngineError> {
        if let Some(archive) = self.archives.get(&key) {
            return Ok(archive);
        }
        let (_turn, folder) = self.private_folder(owner).await?;
        // `helm pull --destination` writes into a folder that must exist.
        std::fs::create_dir(folder.path().join(PULLED))
            .map_err(|e| EngineError::Io(e.to_string()))?;
        let pulled = self
            .run(
                &self.config.helm,
                pull,
                folder.path(),
                helm_env(folder.path()),
                true,
            )
            .await;
        pulled.map_err(|error| match error {
            // The repository's answer or its silence: it may come back, so this is retried.
            EngineError::Run(RunError::Failed { message }) => EngineError::Fetch(message),
            EngineError::Run(timeout @ RunError::TimedOut { .. }) => {
                EngineError::Fetch(timeout.to_string())
            }
            other => other,
        })?;
        let archive = Arc::new(read_archive(&folder.path().join(PULLED))?);
        self.archives.keep(key, archive.clone());
        Ok(archive)
    }
}

fn key_of_pull(args: &[String]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for arg in args {
        digest.update(arg.as_bytes());
        digest.update(b"\0");
    }
    digest.finalize().into()
}

/// The archive `helm pull` wrote into `folder`, unless it is over [`MAX_CHART_ARCHIVE_BYTES`].
fn read_archive(folder: &Path) -> Result<Vec<u8>, EngineError> {
    let io = |e: std::io::Error| EngineError::Io(e.to_string());
    for entry in std::fs::read_dir(folder).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_none_or(|e| e != "tgz") {
            continue;
        }
        let size = std::fs::metadata(&path).map_err(io)?.len();
        if size > MAX_CHART_ARCHIVE_BYTES {
            return Err(EngineError::Fetch(format!(
                "the chart archive is {size} bytes, more than {MAX_CHART_ARCHIVE_BYTES}"
            )));
        }
        return std::fs::read(&path).map_err(io);
    }
    Err(EngineError::Fetch(
        "helm pull wrote no chart archive".into(),
    ))
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
        let pull = |chart: Chart| chart.pull_args().map(|args| args.join(" "));
        assert_eq!(
            render(published("https://charts.example.com"), &values)
                .args()
                .join(" "),
            format!("template web-pr-2 ./chart.tgz {tail}")
        );
        assert_eq!(
            pull(published("https://charts.example.com")).as_deref(),
            Some(
                "pull podinfo --repo https://charts.example.com --version 6.5.0 --destination pulled"
            )
        );
        assert_eq!(
            pull(published("oci://ghcr.io/org/charts/")).as_deref(),
            Some("pull oci://ghcr.io/org/charts/podinfo --version 6.5.0 --destination pulled")
        );
        assert_eq!(pull(Chart::Files(&files)), None);
    }

    #[test]
    fn a_chart_archive_over_8_mib_is_refused() {
        // What `helm pull` left in its folder; a sparse file, as only its size is checked first.
        let archive_of = |bytes: u64| {
            let folder = tempfile::tempdir().unwrap();
            std::fs::File::create(folder.path().join("web-1.4.2.tgz"))
                .unwrap()
                .set_len(bytes)
                .unwrap();
            read_archive(folder.path())
        };
        for over in [9u64 << 20, (8 << 20) + 1] {
            match archive_of(over) {
                Err(EngineError::Fetch(message)) => assert_eq!(
                    message,
                    format!("the chart archive is {over} bytes, more than 8388608")
                ),
                other => panic!("{over} bytes: {:?}", other.map(|archive| archive.len())),
            }
        }
        assert_eq!(
            archive_of(8 << 20).map(|archive| archive.len()).ok(),
            Some(8 << 20),
            "8 MiB is not over the limit"
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
