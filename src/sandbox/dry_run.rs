//! `previewd render`: what previewd would apply for one environment of a template, without a
//! cluster or a pull request, for template authors and their CI (as `helm template` and
//! `kustomize build` are to theirs). The steps are the controller's own
//! (`reconcile::dry_run`); the template's repository is a local checkout, served through the
//! sandbox's forge stand-in (`--checkout`, read at the environment's commit as previewd reads
//! a forge), and Helm is the one the sandbox would run.
//!
//! Prints the objects in waves, as YAML, each `allowed` (a plan exists only when the guard
//! and the content policy allowed every object); on a refusal, the reason and message the
//! environment's condition (and the PR comment) would show, then, when the guard or the
//! content policy refused, one line per refused object with its own reason, and exit status 1. What only a cluster can say (the kinds it serves, copied Secrets, which
//! environment holds a host, ConfigMap sources) is said to be skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use serde_json::Value;

use super::SandboxError;
use super::control_plane::random_hex;
use super::forge_standin::ForgeStandIn;
use super::helm;
use super::machine::StderrProgress;
use super::provision;
use super::repositories::{Repositories, head_commit};
use crate::engines::{EngineConfig, Engines};
use crate::forge::client::{ForgeClient, ForgeClients, TOKEN_BUDGET};
use crate::forge::metrics::ForgeMetrics;
use crate::forge::repository::RepositoryManifests;
use crate::model::crd::{PreviewEnvironment, PreviewTemplate};
use crate::plan::{Limits, Plan};
use crate::reconcile::DEFAULT_MAX_OBJECTS;
use crate::reconcile::dry_run::{self, ForgeAccess, Renderer, RepositoryFiles};

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The PreviewTemplate, as a YAML file.
    #[arg(long)]
    pub template: PathBuf,
    /// The PreviewEnvironment, as a YAML file (else one is made from the flags below).
    #[arg(long)]
    pub environment: Option<PathBuf>,
    /// The branch (without `--environment`).
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The pull request number (without `--environment`; none: a branch environment).
    #[arg(long)]
    pub pr: Option<u64>,
    /// The commit (without `--environment`; default: the checkout's HEAD, else zeros).
    #[arg(long)]
    pub sha: Option<String>,
    /// A local checkout of the template's repository, for charts, overlays and manifests the
    /// template reads from it (a git checkout: read at the commit; a plain folder: as it is).
    #[arg(long)]
    pub checkout: Option<PathBuf>,
    /// The `helm` program (default: the one on PATH, else the sandbox's engine).
    #[arg(long, env = "PREVIEWD_HELM", default_value = "helm")]
    pub helm: PathBuf,
    /// The `kubectl` program, for Kustomize.
    #[arg(long, env = "PREVIEWD_KUBECTL", default_value = "kubectl")]
    pub kubectl: PathBuf,
    /// Where the sandbox's Helm engine is cached.
    #[arg(long, env = "PREVIEWD_CACHE_DIR", default_value_os_t = super::cli::default_cache_dir())]
    pub cache_dir: PathBuf,
}

/// Renders and prints; `Ok(true)` when everything would be applied, `Ok(false)` on a refusal.
pub async fn run(args: RenderArgs) -> Result<bool, SandboxError> {
    let template = template_from(&read(&args.template)?)?;
    let environment = match &args.environment {
        Some(path) => environment_from(&read(path)?, &template)?,
        None => environment_of(&args, &template)?,
    };
    // Kept alive while rendering: the client reads the checkout through it.
    let (_stand_in, client) = local_forge(&template, args.checkout.as_deref()).await?;
    let uses_kustomize = template.spec.manifests.kustomize.is_some();
    let engines = engines(&args, uses_kustomize).await;
    let renders = prometheus::IntCounterVec::new(
        prometheus::Opts::new("renders", "renders by engine and outcome"),
        &["engine", "outcome"],
    )
    .map_err(|e| SandboxError::Process(e.to_string()))?;
    let kept = RepositoryManifests::default();
    let renderer = Renderer {
        engines: &engines,
        renders: &renders,
        files: RepositoryFiles {
            access: ForgeAccess::Given(client),
            kept: &kept,
        },
    };
    let limits = Limits {
        max_objects: DEFAULT_MAX_OBJECTS,
        max_bytes: crate::reconcile::DEFAULT_MAX_BYTES,
        kinds: Default::default(),
        operator: Default::default(),
        gate_answers: false,
    };
    match dry_run::plan(&environment, &template, &renderer, limits).await {
        Ok(plan) => {
            print!("{}", describe(&plan));
            Ok(true)
        }
        Err(refusal) => {
            println!("# refused: {}: {}", refusal.reason, refusal.message);
            for violation in &refusal.violations {
                println!(
                    "# {}/{} (from {}): refused: {}",
                    violation.kind, violation.name, violation.manifest, violation.reason
                );
            }
            eprintln!(
                "previewd render: refused ({}): {}",
                refusal.reason, refusal.message
            );
            Ok(false)
        }
    }
}

/// The template's repository as a forge serves it: `checkout` (or only the examples'
/// repository) behind the sandbox's forge stand-in on loopback, and a forge client of the
/// template's kind with the stand-in's fresh token.
async fn local_forge(
    template: &PreviewTemplate,
    checkout: Option<&Path>,
) -> Result<(ForgeStandIn, Arc<ForgeClient>), SandboxError> {
    let mut repositories = Repositories::default();
    if let Some(checkout) = checkout {
        repositories.add(&template.spec.forge.repository, checkout)?;
    }
    let token = random_hex(16)?;
    let stand_in = ForgeStandIn::serving(repositories.guarded_by(token.clone())).await?;
    let client = ForgeClients::new(ForgeMetrics::new())
        .get(
            template.spec.forge.kind,
            Some(&stand_in.url()),
            token.as_bytes(),
            TOKEN_BUDGET,
        )
        .await
        .map_err(|e| SandboxError::Process(format!("the local forge: {e}")))?;
    Ok((stand_in, client))
}

/// The engines the controller would run: `--helm` (the pinned Helm for the default; if that
/// cannot be brought, `--helm` as it is, and a chart says `RenderFailed` naming it) and
/// `--kubectl` (the pinned kubectl for the default, brought only for a template with an
/// overlay), with the controller's default limits.
async fn engines(args: &RenderArgs, uses_kustomize: bool) -> Engines {
    let helm = match helm::bring(&args.helm, &args.cache_dir).await {
        Ok((helm, _)) => helm,
        Err(e) => {
            eprintln!("previewd render: no Helm ({e}); charts will not render");
            args.helm.clone()
        }
    };
    let mut kubectl = args.kubectl.clone();
    if uses_kustomize && kubectl == Path::new("kubectl") {
        let cache_dir = args.cache_dir.clone();
        let brought = tokio::task::spawn_blocking(move || {
            provision::ensure_kubectl(&cache_dir, &StderrProgress)
        })
        .await
        .map_err(|e| SandboxError::Provision(e.to_string()))
        .and_then(|result| result);
        match brought {
            Ok(pinned) => kubectl = pinned,
            Err(e) => {
                eprintln!("previewd render: no pinned kubectl ({e}); using `kubectl` from PATH")
            }
        }
    }
    Engines::new(EngineConfig {
        helm,
        kubectl,
        ..EngineConfig::default()
    })
}

fn read(path: &Path) -> Result<String, SandboxError> {
    std::fs::read_to_string(path).map_err(|e| SandboxError::io(path, e))
}

/// A YAML document as `T`, with the kind it must be.
fn parsed<T: serde::de::DeserializeOwned>(text: &str, kind: &str) -> Result<T, SandboxError> {
    let refused = |why: String| SandboxError::Process(format!("the {kind}: {why}"));
    let mut value: Value = serde_yaml_ng::from_str(text).map_err(|e| refused(e.to_string()))?;
    if value["kind"] != kind {
        return Err(refused(format!("kind is {}, not {kind}", value["kind"])));
    }
    if value["metadata"]["namespace"].is_null() {
        value["metadata"]["namespace"] = "default".into();
    }
    serde_json::from_value(value).map_err(|e| refused(e.to_string()))
}

fn template_from(text: &str) -> Result<PreviewTemplate, SandboxError> {
    parsed(text, "PreviewTemplate")
}

fn environment_from(
    text: &str,
    template: &PreviewTemplate,
) -> Result<PreviewEnvironment, SandboxError> {
    let environment: PreviewEnvironment = parsed(text, "PreviewEnvironment")?;
    if environment.spec.template != kube::ResourceExt::name_any(template) {
        return Err(SandboxError::Process(format!(
            "the PreviewEnvironment names template {:?}, not this one",
            environment.spec.template
        )));
    }
    Ok(environment)
}

/// The environment the intake would create for `--branch`, `--pr` and `--sha`.
fn environment_of(
    args: &RenderArgs,
    template: &PreviewTemplate,
) -> Result<PreviewEnvironment, SandboxError> {
    let name = kube::ResourceExt::name_any(template);
    let sha = match (&args.sha, &args.checkout) {
        (Some(sha), _) => sha.clone(),
        (None, Some(checkout)) if checkout.join(".git").exists() => head_commit(checkout)?,
        _ => "0".repeat(40),
    };
    let suffix = args
        .pr
        .map_or_else(|| args.branch.clone(), |n| format!("pr-{n}"));
    let environment = serde_json::json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": format!("{name}-{}", crate::model::naming::slug(&suffix)), "namespace": "default"},
        "spec": {"template": name, "source": {
            "repository": template.spec.forge.repository,
            "branch": args.branch, "pullRequest": args.pr, "headSha": sha,
        }},
    });
    serde_json::from_value(environment)
        .map_err(|e| SandboxError::Process(format!("the environment: {e}")))
}

/// The plan as YAML documents, wave by wave, each object with its verdict: `allowed`, since
/// a plan is made only when every object passed the guard and the content policy.
fn describe(plan: &Plan) -> String {
    let mut waves: BTreeMap<i32, Vec<&Value>> = BTreeMap::new();
    for object in &plan.objects {
        waves.entry(object.wave).or_default().push(&object.object);
    }
    let mut out = format!(
        "# namespace {}, URL {}\n# skipped (they need a cluster): the kinds it serves, copied Secrets, which environment holds the host\n",
        plan.namespace, plan.url
    );
    for (wave, objects) in waves {
        for object in objects {
            let kind = object["kind"].as_str().unwrap_or_default();
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let yaml = serde_yaml_ng::to_string(object).unwrap_or_default();
            out.push_str(&format!(
                "---\n# wave {wave}: {kind}/{name}: allowed\n{yaml}"
            ));
        }
    }
    out
}
