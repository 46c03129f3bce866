//! A render's whole input as data ([`RenderRequest`]), so that it can run in another process
//! and be known by its digest: what minijinja renders for one environment (its manifests and
//! seeds, or the strings a template gives an engine) together with the facts it sees.
//!
//! Rendering is pure: the same request renders the same output with the same memory. The
//! controller runs a request it has not seen in a child process under a memory limit (see
//! `reconcile::renders::isolated`), and that child runs [`serve`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::hooks;
use super::render::{self, RenderContext, RenderError, RenderedObject};
use super::values::with_url;
use crate::engines::kustomize::{OverlayOutline, check_outline};
use crate::model::crd::{InlineManifest, SeedSpec, UrlSpec};

/// One render: the facts (without host and URL, which `url` renders), and what to render.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RenderRequest {
    pub facts: RenderContext,
    pub url: UrlSpec,
    pub job: RenderJob,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub enum RenderJob {
    /// The template's manifests and seeds, into objects with `labels`.
    Objects {
        manifests: Vec<InlineManifest>,
        seeds: Vec<SeedSpec>,
        labels: BTreeMap<String, String>,
    },
    /// Every template string in a value (what a template gives Helm or Kustomize); a field's
    /// name is where it is, for errors.
    Strings(Value),
    /// What one engine printed (a chart's or an overlay's objects, never rendered again), into
    /// objects with `labels`, its hooks placed in waves around it (`super::hooks`): YAML from
    /// the pull request, parsed here, in the child, never in previewd's own process. One
    /// engine's output per request (at most 4 MiB), so that its parse fits the child's limit.
    Place {
        rendered: InlineManifest,
        labels: BTreeMap<String, String>,
    },
    /// A Kustomize overlay's folder to check before Kustomize runs
    /// (`engines::kustomize::check_references`): its kustomizations are YAML from the pull
    /// request, so they are read here, in the child, never in previewd's own process.
    CheckOverlay(OverlayOutline),
}

/// What a request rendered.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub enum RenderOutput {
    Objects(RenderedTemplates),
    Strings(Value),
    /// An overlay's check: what it refers to that previewd did not read, if anything.
    Checked(Result<(), String>),
    /// One engine's objects, placed in waves.
    Placed(Vec<RenderedObject>),
}

/// An environment's manifests and seeds, rendered: its objects, its URL and the URL's host.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct RenderedTemplates {
    pub url: String,
    pub host: String,
    pub objects: Vec<RenderedObject>,
}

impl RenderOutput {
    /// The rendered templates of an objects request.
    pub fn templates(self) -> Result<RenderedTemplates, RenderError> {
        match self {
            Self::Objects(templates) => Ok(templates),
            _ => Err(mismatch("objects")),
        }
    }

    /// The rendered value of a strings request.
    pub fn strings(self) -> Result<Value, RenderError> {
        match self {
            Self::Strings(value) => Ok(value),
            _ => Err(mismatch("strings")),
        }
    }

    /// The objects of a place request.
    pub fn placed(self) -> Result<Vec<RenderedObject>, RenderError> {
        match self {
            Self::Placed(objects) => Ok(objects),
            _ => Err(mismatch("placed objects")),
        }
    }

    /// The outcome of an overlay's check.
    pub fn checked(self) -> Result<Result<(), String>, RenderError> {
        match self {
            Self::Checked(outcome) => Ok(outcome),
            _ => Err(mismatch("check")),
        }
    }
}

/// The render answered another kind of output than asked for (a bug, said, not a panic).
fn mismatch(expected: &str) -> RenderError {
    RenderError {
        manifest: "render".into(),
        line: None,
        message: format!("expected rendered {expected}, got something else (a bug in previewd)"),
    }
}

impl RenderRequest {
    /// Renders the request here, in this process.
    pub fn render(&self) -> Result<RenderOutput, RenderError> {
        let facts = with_url(self.facts.clone(), &self.url)?;
        match &self.job {
            RenderJob::Objects {
                manifests,
                seeds,
                labels,
            } => Ok(RenderOutput::Objects(RenderedTemplates {
                objects: render::render(manifests, seeds, &facts, labels)?,
                url: facts.url,
                host: facts.host,
            })),
            RenderJob::Place { rendered, labels } => {
                let mut placed = hooks::place(std::slice::from_ref(rendered))?;
                render::stamp(&mut placed, &facts.namespace, labels);
                Ok(RenderOutput::Placed(placed))
            }
            RenderJob::Strings(value) => {
                let mut value = value.clone();
                render::render_strings(&mut value, "", &facts)?;
                Ok(RenderOutput::Strings(value))
            }
            RenderJob::CheckOverlay(outline) => Ok(RenderOutput::Checked(check_outline(outline))),
        }
    }

    /// The request as the child process reads it, and its digest (what it is known by).
    pub fn encode(&self) -> Result<(Vec<u8>, [u8; 32]), RenderError> {
        let bytes = serde_json::to_vec(self).map_err(|e| RenderError {
            manifest: "render request".into(),
            line: None,
            message: format!("could not be written: {e}"),
        })?;
        let digest = Sha256::digest(&bytes).into();
        Ok((bytes, digest))
    }
}

/// The most values (mappings, lists, strings, numbers…) a render's objects may hold: previewd
/// reads the answer back into its own memory, where each takes some 50 to 100 bytes. A thousand
/// ordinary objects hold a tenth of it.
pub const MAX_VALUES: usize = 1_000_000;

/// The deepest a rendered object may nest: the answer is read back with serde_json's limit of
/// 128 levels, a few of which the answer's own wrapping takes.
pub const MAX_DEPTH: usize = 100;

/// The child process's work: a request in (JSON), its rendered output or error out (JSON).
/// Input that is not a request is said as a render error, never a panic.
pub fn serve(input: &[u8]) -> Vec<u8> {
    let answer: Result<RenderOutput, RenderError> = serde_json::from_slice::<RenderRequest>(input)
        .map_err(|e| RenderError {
            manifest: "render request".into(),
            line: None,
            message: format!("could not be read: {e}"),
        })
        .and_then(|request| request.render())
        .and_then(within_reading_limits);
    // A `Result` of plain data always serializes; the fallback is never reached.
    serde_json::to_vec(&answer).unwrap_or_default()
}

/// The output, unless previewd could not read it back within [`MAX_VALUES`] and [`MAX_DEPTH`].
fn within_reading_limits(output: RenderOutput) -> Result<RenderOutput, RenderError> {
    let mut values = 0usize;
    let deepest = match &output {
        RenderOutput::Objects(RenderedTemplates { objects, .. })
        | RenderOutput::Placed(objects) => objects
            .iter()
            .map(|o| depth_and_count(&o.object, &mut values))
            .max()
            .unwrap_or(0),
        RenderOutput::Strings(value) => depth_and_count(value, &mut values),
        RenderOutput::Checked(_) => 0,
    };
    let refusal = |message: String| RenderError {
        manifest: "render".into(),
        line: None,
        message,
    };
    if values > MAX_VALUES {
        return Err(refusal(format!(
            "the rendered objects hold {values} values, more than the limit of {MAX_VALUES}"
        )));
    }
    if deepest > MAX_DEPTH {
        return Err(refusal(format!(
            "a rendered object nests {deepest} levels deep, more than the limit of {MAX_DEPTH}"
        )));
    }
    Ok(output)
}

/// How deep `value` nests; adds how many values it holds to `count`.
fn depth_and_count(value: &Value, count: &mut usize) -> usize {
    *count = count.saturating_add(1);
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(fields) => Box::new(fields.values()),
        _ => return 1,
    };
    children
        .map(|child| depth_and_count(child, count))
        .max()
        .unwrap_or(0)
        .saturating_add(1)
}

/// Reads what [`serve`] wrote.
pub fn decode(output: &[u8]) -> Result<RenderOutput, RenderError> {
    serde_json::from_slice::<Result<RenderOutput, RenderError>>(output).unwrap_or_else(|e| {
        Err(RenderError {
            manifest: "render".into(),
            line: None,
            message: format!("the render process answered something unreadable: {e}"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> RenderContext {
        RenderContext {
            name: "web-pr-2".into(),
            branch: "feature/login".into(),
            slug: "feature-login".into(),
            sha: "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into(),
            short_sha: "ec26c3e".into(),
            pr: Some(2),
            repository: "Codertocat/Hello-World".into(),
            author: "Codertocat".into(),
            namespace: "preview-x".into(),
            host: String::new(),
            url: String::new(),
            values: BTreeMap::new(),
        }
    }

    fn request(job: RenderJob) -> RenderRequest {
        RenderRequest {
            facts: facts(),
            url: UrlSpec {
                host: Some("{{ slug }}.preview.example.com".into()),
                scheme: None,
            },
            job,
        }
    }

    #[test]
    fn a_request_renders_the_same_through_the_child_process_protocol() {
        let objects = request(RenderJob::Objects {
            manifests: vec![InlineManifest {
                name: "app.yaml".into(),
                template: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  url: \"{{ url }}\"\n".into(),
            }],
            seeds: vec![],
            labels: BTreeMap::new(),
        });
        let here = objects.render().unwrap();
        let (bytes, digest) = objects.encode().unwrap();
        assert_eq!(decode(&serve(&bytes)), Ok(here.clone()));
        let RenderOutput::Objects(RenderedTemplates { url, objects, .. }) = here else {
            panic!("objects expected");
        };
        assert_eq!(url, "https://feature-login.preview.example.com");
        assert_eq!(objects[0].object["data"]["url"], url);
        // The digest is the request's: another commit is another request.
        let mut other = request(RenderJob::Strings(Value::Null));
        other.facts.sha = "0".repeat(40);
        assert_ne!(other.encode().unwrap().1, digest);
    }

    #[test]
    fn strings_are_rendered_and_errors_say_where() {
        let strings = request(RenderJob::Strings(serde_json::json!({
            "helm.values": {"image": {"tag": "{{ short_sha }}"}, "replicas": 2}
        })));
        assert_eq!(
            strings.render(),
            Ok(RenderOutput::Strings(serde_json::json!({
                "helm.values": {"image": {"tag": "ec26c3e"}, "replicas": 2}
            })))
        );
        let broken = request(RenderJob::Strings(serde_json::json!({
            "helm.values": {"image": ["{{ nothing }}"]}
        })));
        let error = broken.render().unwrap_err();
        assert_eq!(error.manifest, "helm.values.image[0]");
        // What previewd could not read back is refused in the child, and said.
        let mut deep = serde_json::json!("x");
        for _ in 0..MAX_DEPTH {
            deep = serde_json::json!([deep]);
        }
        let too_deep = request(RenderJob::Strings(serde_json::json!({"v": deep})));
        let answer = decode(&serve(&too_deep.encode().unwrap().0));
        assert!(answer.unwrap_err().message.contains("nests"));
        let wide = request(RenderJob::Strings(serde_json::json!(vec![0; MAX_VALUES])));
        let answer = decode(&serve(&wide.encode().unwrap().0));
        assert!(answer.unwrap_err().message.contains("values"));
        // Whatever the child is given, it answers with an error, never a panic.
        assert!(decode(&serve(b"{not json")).is_err());
        assert!(decode(b"Killed").is_err());
    }
}
