//! The policy's case corpus (`tests/policy/*.yaml`), run as a unit test: one file per case,
//! each with the objects a pull request might bring, the template's policy and the operator's
//! settings, and the verdict expected, with the reasons a refusal must give. Hostile cases
//! (every class of docs/security.md's threat model) and ordinary ones (what real charts
//! contain) side by side: an allow-list that refuses ordinary apps is as wrong as one that
//! lets an escape through.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::{Scope, check};
use crate::model::ceiling::{TemplateCeiling, policy_beyond};
use crate::model::crd::{InlineManifest, PolicySpec};
use crate::model::grants::{OperatorPolicy, RoleGrants};
use crate::model::kinds::TemplateKinds;
use crate::plan::hooks;
use crate::plan::render::RenderedObject;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Case {
    /// `allowed` or `refused`.
    expect: String,
    /// Texts each of which the refusal must contain.
    #[serde(default)]
    reasons: Vec<String>,
    /// The template's `spec.policy`.
    #[serde(default)]
    policy: PolicySpec,
    /// `--ingress-annotations`.
    #[serde(default)]
    ingress_annotations: Vec<String>,
    /// `--object-annotations`.
    #[serde(default)]
    object_annotations: Vec<String>,
    /// `--object-labels`.
    #[serde(default)]
    object_labels: Vec<String>,
    /// `--template-role-rules` (default: the built-in rules).
    #[serde(default)]
    role_rules: Option<Value>,
    /// `--template-kinds` (default: the built-in kinds).
    #[serde(default)]
    template_kinds: Option<Value>,
    /// `--template-ceiling` (default: the default ceiling): the template's policy must lie
    /// within it, or the case is refused as previewd refuses the template.
    #[serde(default)]
    template_ceiling: TemplateCeiling,
    #[serde(default)]
    objects: Vec<Value>,
    /// A chart's output as the Helm engine printed it (a file under `tests/policy/charts/`),
    /// placed as previewd places it: test and delete hooks left out.
    #[serde(default)]
    rendered: Option<String>,
}

const URL_HOST: &str = "pr-7.preview.example.com";
const NAMESPACE: &str = "preview-corpus";

/// The verdict on one case: `Ok` when it matches what the case expects.
fn run(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: Case = serde_yaml_ng::from_str(&text).map_err(|e| format!("not a case: {e}"))?;
    let operator = OperatorPolicy {
        role_grants: match &case.role_rules {
            Some(rules) => RoleGrants::parse(&rules.to_string())?,
            None => RoleGrants::default(),
        },
        ingress_annotations: case.ingress_annotations.clone(),
        object_annotations: case.object_annotations.clone(),
        object_labels: case.object_labels.clone(),
        ..Default::default()
    };
    let kinds = match &case.template_kinds {
        Some(kinds) => TemplateKinds::parse(&kinds.to_string())?,
        None => TemplateKinds::default(),
    };
    let scope = Scope {
        namespace: NAMESPACE,
        url_host: URL_HOST,
        operator: &operator,
        kinds: &kinds,
    };
    let mut objects: Vec<RenderedObject> = case
        .objects
        .into_iter()
        .map(|object| RenderedObject {
            manifest: "case.yaml".into(),
            wave: 0,
            seed: None,
            object,
        })
        .collect();
    if let Some(file) = &case.rendered {
        objects.extend(rendered_chart(path, file)?);
    }
    let mut refusal = policy_beyond(&case.policy, &case.template_ceiling, &[]);
    refusal.extend(
        check(&objects, &case.policy, &scope)
            .iter()
            .map(ToString::to_string),
    );
    let said = refusal.join("; ");
    match case.expect.as_str() {
        "allowed" if refusal.is_empty() => Ok(()),
        "allowed" => Err(format!("expected allowed, refused: {said}")),
        "refused" if refusal.is_empty() => Err("expected refused, allowed".into()),
        "refused" => match case.reasons.iter().find(|r| !said.contains(r.as_str())) {
            Some(missing) => Err(format!("refusal lacks {missing:?}: {said}")),
            None => Ok(()),
        },
        other => Err(format!("expect is {other:?}, not allowed or refused")),
    }
}

/// The objects of a rendered chart, as previewd's Helm path places them (hooks in waves, test
/// hooks left out).
fn rendered_chart(case: &Path, file: &str) -> Result<Vec<RenderedObject>, String> {
    let path = case.parent().unwrap_or(Path::new(".")).join(file);
    let template = std::fs::read_to_string(&path).map_err(|e| format!("{file}: {e}"))?;
    let manifest = InlineManifest {
        name: file.into(),
        template,
    };
    hooks::place(&[manifest]).map_err(|e| e.to_string())
}

#[test]
fn every_case_of_the_corpus_gets_its_verdict() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/policy");
    let mut paths: Vec<_> = std::fs::read_dir(&folder)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    paths.sort();
    assert!(paths.len() >= 20, "the corpus is in {}", folder.display());
    let failed: Vec<String> = paths
        .iter()
        .filter_map(|path| run(path).err().map(|e| format!("{}: {e}", path.display())))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let refused = paths
        .iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("expect: refused")))
        .count();
    assert!(
        refused > 0 && refused < paths.len(),
        "both verdicts are covered"
    );
}
