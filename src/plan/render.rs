//! Render (pure): a template's manifests and seeds plus an environment's facts → the objects to
//! apply. Manifests are minijinja templates with strict undefined variables; each may hold
//! several YAML documents. Errors name the manifest and the line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::crd::{InlineManifest, SeedSpec};

/// Annotation on a manifest object: the wave it is applied in (integer, default 0).
pub const ANNOTATION_WAVE: &str = "previewd.dev/wave";
/// Label on seed Jobs: the seed's name.
pub const LABEL_SEED: &str = "previewd.dev/seed";

/// What the templates see.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct RenderContext {
    pub name: String,
    pub branch: String,
    pub slug: String,
    pub sha: String,
    pub short_sha: String,
    /// Absent (undefined) for a plain branch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pr: Option<u64>,
    pub repository: String,
    pub author: String,
    pub namespace: String,
    pub host: String,
    pub url: String,
    pub values: BTreeMap<String, Value>,
}

/// One object to apply.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct RenderedObject {
    pub manifest: String,
    pub wave: i32,
    /// `Some(seed name)` for seed Jobs.
    pub seed: Option<String>,
    pub object: Value,
}

impl RenderedObject {
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// A render failure, located.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize, thiserror::Error)]
#[error("{manifest}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct RenderError {
    pub manifest: String,
    pub line: Option<usize>,
    pub message: String,
}

/// How much work one template may do (minijinja's fuel: about one unit per instruction).
/// The Online Boutique's 35 objects take a few thousand; a loop nested to run for minutes
/// runs out in milliseconds, so a hostile template cannot hold a reconcile worker.
pub const RENDER_FUEL: u64 = 2_000_000;

/// The most text one template may render (the API server takes objects up to ~1.5 MiB).
pub const MAX_RENDERED_BYTES: usize = 4 << 20;

/// Renders one string template (used for the URL host too), within [`RENDER_FUEL`] and
/// [`MAX_RENDERED_BYTES`].
pub fn render_string(
    name: &str,
    source: &str,
    context: &impl serde::Serialize,
) -> Result<String, RenderError> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(RENDER_FUEL));
    env.add_template(name, source)
        .map_err(|e| located(name, &e))?;
    let template = env.get_template(name).map_err(|e| located(name, &e))?;
    let text = template.render(context).map_err(|e| located(name, &e))?;
    if text.len() > MAX_RENDERED_BYTES {
        return Err(RenderError {
            manifest: name.to_string(),
            line: None,
            message: format!(
                "renders {} bytes, more than the limit of {MAX_RENDERED_BYTES}",
                text.len()
            ),
        });
    }
    Ok(text)
}

/// Whether a string of `value` holds template syntax (what [`render_strings`] renders).
pub fn holds_templates(value: &Value) -> bool {
    match value {
        Value::String(text) => is_template(text),
        Value::Array(items) => items.iter().any(holds_templates),
        Value::Object(fields) => fields.values().any(holds_templates),
        _ => false,
    }
}

fn is_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

/// Renders every string of `value` that holds template syntax; `at` names where it is, for
/// errors (`helm.values.image.tag`).
pub fn render_strings(
    value: &mut Value,
    at: &str,
    facts: &RenderContext,
) -> Result<(), RenderError> {
    match value {
        Value::String(text) if is_template(text) => {
            *text = render_string(at, text, facts)?;
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                render_strings(item, &format!("{at}[{index}]"), facts)?;
            }
        }
        Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                let inner = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                render_strings(field, &inner, facts)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn located(name: &str, error: &minijinja::Error) -> RenderError {
    let detail = error.detail().map(|d| format!(": {d}")).unwrap_or_default();
    RenderError {
        manifest: name.to_string(),
        line: error.line(),
        message: format!("{}{detail}", error.kind()),
    }
}

/// Renders every manifest and seed. Objects get previewd's labels and the environment's
/// namespace; seed Jobs get a name derived from their content.
pub fn render(
    manifests: &[InlineManifest],
    seeds: &[SeedSpec],
    context: &RenderContext,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<RenderedObject>, RenderError> {
    let mut objects = Vec::new();
    for manifest in manifests {
        let text = render_string(&manifest.name, &manifest.template, context)?;
        for object in parse_documents(&manifest.name, &text)? {
            let wave = wave_of(&manifest.name, &object)?;
            objects.push(RenderedObject {
                manifest: manifest.name.clone(),
                wave,
                seed: None,
                object,
            });
        }
    }
    for seed in seeds {
        let manifest = format!("seed {}", seed.name);
        let text = render_string(&manifest, &seed.job, context)?;
        let mut documents = parse_documents(&manifest, &text)?;
        if documents.len() != 1 || documents[0]["kind"] != "Job" {
            return Err(RenderError {
                manifest,
                line: None,
                message: "a seed must render exactly one batch/v1 Job".into(),
            });
        }
        let mut job = documents.remove(0);
        job["metadata"]["name"] = Value::String(seed_job_name(&seed.name, &job));
        set_label(&mut job, LABEL_SEED, &seed.name);
        objects.push(RenderedObject {
            manifest,
            wave: seed.wave,
            seed: Some(seed.name.clone()),
            object: job,
        });
    }
    stamp(&mut objects, &context.namespace, labels);
    Ok(objects)
}

/// Gives every object the environment's namespace (where it names none) and previewd's labels.
pub fn stamp(objects: &mut [RenderedObject], namespace: &str, labels: &BTreeMap<String, String>) {
    for rendered in objects {
        if rendered.object["metadata"]["namespace"].is_null() {
            rendered.object["metadata"]["namespace"] = Value::String(namespace.to_string());
        }
        for (key, value) in labels {
            set_label(&mut rendered.object, key, value);
        }
    }
}

/// `<seed>-<hash of the Job's content>`: a changed seed is a new Job, an unchanged one never runs twice.
pub fn seed_job_name(seed: &str, job: &Value) -> String {
    let mut content = job.clone();
    if let Some(metadata) = content.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("name");
    }
    let digest = hex::encode(Sha256::digest(content.to_string().as_bytes()));
    let mut base = crate::model::naming::slug(seed);
    base.truncate(40);
    format!("seed-{}-{}", base.trim_end_matches('-'), &digest[..10])
}

pub(super) fn set_label(object: &mut Value, key: &str, value: &str) {
    let metadata = &mut object["metadata"];
    if !metadata["labels"].is_object() {
        metadata["labels"] = Value::Object(Default::default());
    }
    metadata["labels"][key] = Value::String(value.to_string());
}

pub(super) fn parse_documents(manifest: &str, text: &str) -> Result<Vec<Value>, RenderError> {
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(document).map_err(|e| RenderError {
            manifest: manifest.to_string(),
            line: e.location().map(|l| l.line()),
            message: format!("invalid YAML: {e}"),
        })?;
        match value {
            Value::Null => continue,
            Value::Object(_) => {}
            _ => {
                return Err(RenderError {
                    manifest: manifest.to_string(),
                    line: None,
                    message: "a document is not a mapping".into(),
                });
            }
        }
        for field in ["apiVersion", "kind"] {
            if !value[field].is_string() {
                return Err(RenderError {
                    manifest: manifest.to_string(),
                    line: None,
                    message: format!("an object has no {field}"),
                });
            }
        }
        let mut value = value;
        if !value["metadata"]["name"].is_string() && !name_generated_job(&mut value) {
            let kind = value["kind"].as_str().unwrap_or_default();
            let generated = if value["metadata"]["generateName"].is_string() {
                " (metadata.generateName is taken for Jobs only: server-side apply needs a name)"
            } else {
                ""
            };
            return Err(RenderError {
                manifest: manifest.to_string(),
                line: None,
                message: format!("a {kind} has no metadata.name{generated}"),
            });
        }
        documents.push(value);
    }
    Ok(documents)
}

/// Names a Job that has only `metadata.generateName` (as Helm and Argo CD hook examples do):
/// `<generateName>-<hash of its content>`, so it runs once per content, as a seed does, instead
/// of once per apply (server-side apply cannot generate names). False for anything else.
fn name_generated_job(object: &mut Value) -> bool {
    if object["kind"] != "Job" {
        return false;
    }
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(Value::String(prefix)) = metadata.remove("generateName") else {
        return false;
    };
    let digest = hex::encode(Sha256::digest(object.to_string().as_bytes()));
    // A Job's name goes into its pods' `job-name` label: 63 characters at most.
    let mut base = crate::model::naming::slug(&prefix);
    base.truncate(52);
    let base = match base.trim_end_matches('-') {
        "" => "job",
        trimmed => trimmed,
    };
    object["metadata"]["name"] = Value::String(format!("{base}-{}", &digest[..10]));
    true
}

pub(super) fn wave_of(manifest: &str, object: &Value) -> Result<i32, RenderError> {
    match &object["metadata"]["annotations"][ANNOTATION_WAVE] {
        Value::Null => Ok(0),
        Value::String(s) => s.trim().parse().map_err(|_| RenderError {
            manifest: manifest.to_string(),
            line: None,
            message: format!("annotation {ANNOTATION_WAVE} must be an integer, got {s:?}"),
        }),
        other => Err(RenderError {
            manifest: manifest.to_string(),
            line: None,
            message: format!("annotation {ANNOTATION_WAVE} must be a string, got {other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pr: Option<u64>) -> RenderContext {
        RenderContext {
            name: "web-pr-2-abc123".into(),
            branch: "feature/login".into(),
            slug: "feature-login".into(),
            sha: "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into(),
            short_sha: "ec26c3e".into(),
            pr,
            repository: "Codertocat/Hello-World".into(),
            author: "Codertocat".into(),
            namespace: "preview-x".into(),
            host: "feature-login.preview.example.com".into(),
            url: "https://feature-login.preview.example.com".into(),
            values: [("replicas".to_string(), serde_json::json!(2))].into(),
        }
    }

    fn manifest(name: &str, template: &str) -> InlineManifest {
        InlineManifest {
            name: name.into(),
            template: template.into(),
        }
    }

    #[test]
    fn renders_context_into_several_documents_with_labels_and_namespace() {
        let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ short_sha }}\"\n  url: \"{{ url }}\"\n  replicas: \"{{ values.replicas }}\"\n{% if pr is defined %}  pr: \"{{ pr }}\"\n{% endif %}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    previewd.dev/wave: \"2\"\n";
        let labels = [(
            "app.kubernetes.io/managed-by".to_string(),
            "previewd".to_string(),
        )]
        .into();
        let objects = render(
            &[manifest("app.yaml", template)],
            &[],
            &context(Some(2)),
            &labels,
        )
        .unwrap();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0].object["data"]["sha"], "ec26c3e");
        assert_eq!(objects[0].object["data"]["pr"], "2");
        assert_eq!(objects[0].object["data"]["replicas"], "2");
        assert_eq!(objects[0].object["metadata"]["namespace"], "preview-x");
        assert_eq!(
            objects[0].object["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "previewd"
        );
        assert_eq!(objects[1].wave, 2);
        let branch_only = render(
            &[manifest("app.yaml", template)],
            &[],
            &context(None),
            &labels,
        )
        .unwrap();
        assert!(
            branch_only[0].object["data"].get("pr").is_none(),
            "pr is undefined for a plain branch"
        );
    }

    #[test]
    fn undefined_variables_are_errors_with_manifest_and_line() {
        let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  x: \"{{ no_such_thing }}\"\n";
        let error = render(
            &[manifest("app.yaml", template)],
            &[],
            &context(None),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(error.manifest, "app.yaml");
        assert_eq!(error.line, Some(6));
        assert!(
            error.to_string().starts_with("app.yaml line 6: "),
            "{error}"
        );
    }

    #[test]
    fn a_template_that_would_run_for_minutes_runs_out_of_fuel() {
        // 10^10 iterations unbounded; stopped by fuel within a few million instructions.
        let forever =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let error = render_string("loop.yaml", forever, &context(None)).unwrap_err();
        assert_eq!(error.manifest, "loop.yaml");
        assert!(error.message.contains("fuel"), "{error}");
        // Large output within the fuel: refused by size.
        let wide = "{% for i in range(3000) %}{{ big }}{% endfor %}";
        let big = serde_json::json!({"big": "y".repeat(2048)});
        let error = render_string("wide.yaml", wide, &big).unwrap_err();
        assert!(error.message.contains("more than the limit"), "{error}");
        // The example, rendered whole as one template, fits easily.
        let example = include_str!("../../templates/online-boutique/template.yaml");
        assert!(render_string("example", example, &context(None)).is_ok());
    }

    #[test]
    fn syntax_errors_and_bad_yaml_say_where() {
        let broken = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ name \n";
        let error = render(
            &[manifest("broken.yaml", broken)],
            &[],
            &context(None),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(
            (error.manifest.as_str(), error.line),
            ("broken.yaml", Some(4)),
            "{error}"
        );
        let bad_yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  - b\n";
        let error = render(
            &[manifest("bad.yaml", bad_yaml)],
            &[],
            &context(None),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(error.manifest, "bad.yaml");
        assert!(error.line.is_some(), "{error}");
    }

    #[test]
    fn jobs_named_by_generate_name_get_a_name_from_their_content() {
        let job = |image: &str| {
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: db-migrate-\nspec:\n  template:\n    spec:\n      containers:\n      - name: m\n        image: {image}\n"
            )
        };
        let name = |text: &str| {
            let objects = parse_documents("hooks.yaml", text).unwrap();
            assert!(objects[0]["metadata"].get("generateName").is_none());
            objects[0]["metadata"]["name"].as_str().unwrap().to_string()
        };
        let first = name(&job("migrate:1"));
        assert!(first.starts_with("db-migrate-"), "{first}");
        assert!(crate::model::naming::is_dns1123_label(&first), "{first}");
        assert_eq!(
            name(&job("migrate:1")),
            first,
            "the same content, the same Job"
        );
        assert_ne!(name(&job("migrate:2")), first, "new content, a new Job");
        let long = job("x").replace("db-migrate-", &"Very_Long.".repeat(20));
        assert!(crate::model::naming::is_dns1123_label(&name(&long)));
        // Other kinds need a name: server-side apply cannot generate one.
        let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  generateName: web-\n";
        let error = parse_documents("web.yaml", deployment).unwrap_err();
        assert!(
            error
                .message
                .contains("generateName is taken for Jobs only"),
            "{error}"
        );
    }

    #[test]
    fn seed_jobs_are_named_by_content() {
        let seed = |sql: &str| SeedSpec {
            name: "load-data".into(),
            wave: 1,
            job: format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: ignored\nspec:\n  template:\n    spec:\n      containers:\n      - name: psql\n        image: postgres\n        args: [\"{sql}\"]\n"
            ),
        };
        let a = render(&[], &[seed("a.sql")], &context(None), &BTreeMap::new()).unwrap();
        let again = render(&[], &[seed("a.sql")], &context(None), &BTreeMap::new()).unwrap();
        let b = render(&[], &[seed("b.sql")], &context(None), &BTreeMap::new()).unwrap();
        assert_eq!(a[0].name(), again[0].name());
        assert_ne!(a[0].name(), b[0].name());
        assert!(
            a[0].name().starts_with("seed-load-data-"),
            "{}",
            a[0].name()
        );
        assert!(crate::model::naming::is_dns1123_label(a[0].name()));
        assert_eq!(a[0].wave, 1);
        assert_eq!(a[0].seed.as_deref(), Some("load-data"));
    }
}
