//! A template's Helm chart (`spec.manifests.helm`) rendered by Helm for one environment. The chart comes from the repository at the head commit (read once per commit)
//! or from a chart repository; its values are the template's, with every string rendered as a
//! template of the environment's facts (`tag: "{{ sha }}"`). The output is split by the file
//! it came from, so that a later refusal names `web/templates/deployment.yaml`, and goes to
//! the plan step like any manifest, marked as already rendered.

use serde_json::Value;

use super::renderer::Renderer;
use super::{counted, has_content, isolated, turn_owner};
use crate::engines::helm::{Chart, HelmRender};
use crate::model::crd::{HelmSource, InlineManifest, PreviewEnvironment, PreviewTemplate};
use crate::reconcile::error::{Refusal, RefusalReason};

/// The rendered objects of the template's chart, one manifest per source file; none when the
/// template has no chart.
pub async fn render_chart(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    namespace: &str,
    renderer: &Renderer<'_>,
) -> Result<Vec<InlineManifest>, Refusal> {
    let Some(helm) = &template.spec.manifests.helm else {
        return Ok(Vec::new());
    };
    let (release, values) = chart_values(environment, template, helm, namespace, renderer).await?;
    let files;
    let chart = match (&helm.chart.path, &helm.chart.repository) {
        (Some(path), None) => {
            files = renderer.files.folder(environment, template, path).await?;
            Chart::Files(&files)
        }
        (None, Some(repository)) => published(repository, helm)?,
        _ => {
            return Err(invalid(
                "set exactly one of helm.chart.path and helm.chart.repository",
            ));
        }
    };
    let render = HelmRender {
        chart,
        release: &release,
        namespace,
        values: &values,
    };
    let rendered = renderer
        .engines
        .helm_template(&render, &turn_owner(template))
        .await;
    let rendered = counted(rendered, "helm", "helm template", renderer)?;
    Ok(split_by_source(&rendered.text))
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalReason::ChartInvalid, message)
}

fn published<'a>(repository: &'a str, helm: &'a HelmSource) -> Result<Chart<'a>, Refusal> {
    let scheme_ok = ["https://", "http://", "oci://"]
        .iter()
        .any(|scheme| repository.starts_with(scheme));
    if !scheme_ok {
        return Err(invalid(format!(
            "helm.chart.repository {repository:?} must be an https://, http:// or oci:// URL"
        )));
    }
    match (&helm.chart.name, &helm.chart.version) {
        (Some(name), Some(version)) if !is_plain_word(name) || !is_plain_word(version) => {
            Err(invalid(format!(
                "helm.chart.name {name:?} and helm.chart.version {version:?} may hold letters, \
                 digits, '.', '_', '-' and '+' and must not start with '-'"
            )))
        }
        (Some(name), Some(version)) => Ok(Chart::Published {
            repository,
            name,
            version,
        }),
        _ => Err(invalid(
            "a chart from helm.chart.repository needs its name and exact version (helm.chart.name, helm.chart.version)",
        )),
    }
}

/// A chart name or version as Helm writes them: never empty, never read as a flag of `helm
/// pull`, never a path.
fn is_plain_word(word: &str) -> bool {
    !word.is_empty()
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
}

/// The release name and values for this environment, every string rendered with the
/// environment's facts.
async fn chart_values(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    helm: &HelmSource,
    namespace: &str,
    renderer: &Renderer<'_>,
) -> Result<(String, Value), Refusal> {
    let given = serde_json::json!({
        "helm.releaseName": helm.release_name,
        "helm.values": Value::Object(helm.values.clone().into_iter().collect()),
    });
    let mut rendered =
        isolated::render_strings(environment, template, namespace, given, renderer).await?;
    let release = match rendered["helm.releaseName"].take() {
        Value::String(name) => name,
        _ => kube::ResourceExt::name_any(environment),
    };
    Ok((release, rendered["helm.values"].take()))
}

/// Helm's output split into one manifest per `# Source:` file (Helm prints every document
/// as `---`, `# Source: <chart>/templates/<file>`, then the object).
fn split_by_source(text: &str) -> Vec<InlineManifest> {
    let mut manifests: Vec<InlineManifest> = Vec::new();
    let mut current = InlineManifest {
        name: "helm template".into(),
        template: String::new(),
    };
    for line in text.lines() {
        if let Some(source) = line.strip_prefix("# Source: ") {
            let name = source.trim().to_string();
            if name != current.name {
                let done = std::mem::replace(
                    &mut current,
                    InlineManifest {
                        name,
                        template: String::new(),
                    },
                );
                if has_content(&done.template) {
                    manifests.push(done);
                }
            }
        }
        current.template.push_str(line);
        current.template.push('\n');
    }
    if has_content(&current.template) {
        manifests.push(current);
    }
    manifests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_output_is_split_by_source_file() {
        let text = "---\n# Source: web/templates/service.yaml\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n---\n# Source: web/templates/deployment.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n";
        let manifests = split_by_source(text);
        let names: Vec<&str> = manifests.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "web/templates/service.yaml",
                "web/templates/deployment.yaml"
            ]
        );
        assert!(manifests[1].template.contains("kind: Deployment"));
        assert!(!manifests[0].template.contains("Deployment"));
    }

    #[test]
    fn a_published_chart_needs_a_url_a_name_and_a_version() {
        let helm = |name: Option<&str>, version: Option<&str>| HelmSource {
            chart: crate::model::crd::ChartLocation {
                name: name.map(String::from),
                version: version.map(String::from),
                ..Default::default()
            },
            ..Default::default()
        };
        let pinned = helm(Some("podinfo"), Some("6.5.0"));
        assert!(published("https://charts.example.com", &pinned).is_ok());
        assert!(published("oci://ghcr.io/org/charts", &pinned).is_ok());
        let refused = published("file:///etc", &pinned).err().map(|r| r.message);
        assert!(refused.is_some_and(|m| m.contains("https://")));
        let unpinned = helm(Some("podinfo"), None);
        let refused = published("https://charts.example.com", &unpinned).err();
        assert_eq!(refused.map(|r| r.reason), Some(RefusalReason::ChartInvalid));
        for (name, version) in [
            ("--destination=/tmp", "1.0.0"),
            ("podinfo", "--untar"),
            ("../podinfo", "1.0.0"),
            ("podinfo", "1.0.0 --repo"),
            ("", "1.0.0"),
        ] {
            let hostile = helm(Some(name), Some(version));
            let refused = published("https://charts.example.com", &hostile).err();
            assert_eq!(
                refused.map(|r| r.reason),
                Some(RefusalReason::ChartInvalid),
                "{name} {version}"
            );
        }
        let semver = helm(Some("web_app.v2"), Some("1.2.3-rc.1+build.5"));
        assert!(published("https://charts.example.com", &semver).is_ok());
    }
}
