//! The plan step (pure, no client required): the template, the environment and its manifests
//! become the exact objects to apply, or a [`Refused`] that says what and where. Nothing is
//! applied unless the whole plan passes, so a broken or unsafe template leaves the previous
//! commit running.
//!
//! In order: the render values ([`values`]), the render ([`render`]), the object limit, the
//! guard ([`guard`]), and the workload adjustments for sleep and redeploy ([`workloads`]).

pub mod asleep_routes;
pub mod footprint;
pub mod guard;
pub mod hooks;
pub mod host_claims;
pub mod policy;
pub mod render;
pub mod request;
pub mod routes;
pub mod values;
pub mod workloads;

#[cfg(test)]
pub(crate) mod test_support;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::crd::{InlineManifest, PreviewEnvironment, PreviewTemplate};
use crate::model::grants::OperatorPolicy;
use crate::model::kinds::TemplateKinds;
use crate::model::metadata::environment_labels;
pub use crate::model::refusal::RefusalReason;
use guard::Violation;

/// The default of `--max-objects-per-environment`: the 35-object Online Boutique fits 14 times.
pub const DEFAULT_MAX_OBJECTS: usize = 500;

/// The most bytes (as JSON) an environment's objects may take together by default: what the
/// quota does not count (Roles, ServiceAccounts, NetworkPolicies, annotations) is held to it.
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;

/// Why a plan cannot be made: the `Ready` reason, a message naming the object, file or rule,
/// and (for the guard and the content policy) each refused object with its reason.
#[derive(Debug)]
pub struct Refused {
    pub reason: RefusalReason,
    pub message: String,
    pub violations: Vec<Violation>,
}

impl Refused {
    pub fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            violations: Vec::new(),
        }
    }
}
use render::RenderedObject;
use request::{RenderJob, RenderRequest, RenderedTemplates};

/// What a reconcile will apply, in the environment's namespace.
#[derive(Debug)]
pub struct Plan {
    pub namespace: String,
    /// The labels on every object (and the namespace) of the environment.
    pub labels: BTreeMap<String, String>,
    /// The environment's URL, as the template's `url` renders it.
    pub url: String,
    /// The URL's host (`status.host` once the environment holds it, see [`host_claims`]).
    pub host: String,
    /// The other Ingress hosts it routes, of those its template's `policy.allowedIngressHosts`
    /// lists (`status.extraHosts` once held, see [`host_claims`]).
    pub extra_hosts: Vec<String>,
    /// The objects that route the URL's host; the URL is reported once one of them is healthy.
    pub routes: Vec<routes::Route>,
    pub objects: Vec<RenderedObject>,
    /// The replica counts to remember while asleep (`status.replicasBeforeSleep`).
    pub replicas_before_sleep: BTreeMap<String, i32>,
    /// What the environment's pods request while awake ([`footprint`]).
    pub requests: crate::model::footprint::Requests,
    /// The environment's databases (filled in by the reconciler's databases step, which
    /// branches them; the plan itself asks no server).
    pub databases: Vec<crate::model::crd::DatabaseStatus>,
}

/// A template's manifests: templates previewd renders (minijinja), and text an engine already
/// rendered (a Helm chart's objects), taken as they are.
#[derive(Clone, Debug, Default)]
pub struct Manifests {
    pub templates: Vec<InlineManifest>,
    pub rendered: Vec<InlineManifest>,
}

/// What the operator allows every template (`--max-objects-per-environment`, `--template-kinds`,
/// `--template-role-rules`, `--ingress-annotations`), and whether previewd's wake gate answers
/// for sleeping hosts (`--gate-listen`: a sleeping environment's routes are withdrawn).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_objects: usize,
    /// The most bytes the objects may take together, as JSON.
    pub max_bytes: usize,
    pub kinds: TemplateKinds,
    pub operator: OperatorPolicy,
    pub gate_answers: bool,
}

/// Plans `environment` from `template` and `manifests` into `namespace`, rendering its
/// templates in this process. `live_replicas` says how many replicas a workload runs now (from
/// the watch), for the count to restore on waking.
pub fn plan(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    manifests: &Manifests,
    namespace: &str,
    limits: &Limits,
    live_replicas: impl Fn(&Value) -> Option<i32>,
) -> Result<Plan, Refused> {
    let request = templates_request(
        environment,
        template,
        manifests.templates.clone(),
        namespace,
    );
    let mut rendered = request
        .render()
        .and_then(request::RenderOutput::templates)
        .map_err(render_failed)?;
    for engine_output in &manifests.rendered {
        let place = place_request(environment, template, engine_output.clone(), namespace);
        let placed = place.render().and_then(request::RenderOutput::placed);
        rendered.objects.extend(placed.map_err(render_failed)?);
    }
    plan_rendered(
        environment,
        template,
        rendered,
        namespace,
        limits,
        live_replicas,
    )
}

/// What minijinja renders of `environment`: the template's manifests (`templates`) and seeds.
pub fn templates_request(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    templates: Vec<InlineManifest>,
    namespace: &str,
) -> RenderRequest {
    RenderRequest {
        facts: values::facts(environment, &template.spec, namespace),
        url: template.spec.url.clone(),
        job: RenderJob::Objects {
            manifests: templates,
            seeds: template.spec.seeds.clone(),
            labels: environment_labels(environment, template),
        },
    }
}

/// What one engine printed for `environment` (`engine_output`), to parse and place in waves.
pub fn place_request(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    engine_output: InlineManifest,
    namespace: &str,
) -> RenderRequest {
    RenderRequest {
        facts: values::facts(environment, &template.spec, namespace),
        url: template.spec.url.clone(),
        job: RenderJob::Place {
            rendered: engine_output,
            labels: environment_labels(environment, template),
        },
    }
}

/// A broken template is not retried until it changes (or the slow resync).
pub fn render_failed(error: render::RenderError) -> Refused {
    Refused::new(RefusalReason::RenderFailed, error.to_string())
}

/// Plans `environment` from its rendered templates (with what its engines printed, placed):
/// every check after the render.
pub fn plan_rendered(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    rendered: RenderedTemplates,
    namespace: &str,
    limits: &Limits,
    live_replicas: impl Fn(&Value) -> Option<i32>,
) -> Result<Plan, Refused> {
    let labels = environment_labels(environment, template);
    let RenderedTemplates {
        url,
        host,
        mut objects,
    } = rendered;
    refuse_crds(&objects)?;
    check_object_limit(objects.len(), limits.max_objects)?;
    check_byte_limit(&objects, limits.max_bytes)?;
    let guarded = guard::check(&objects, namespace, &limits.kinds);
    refuse_violations(RefusalReason::GuardRejected, guarded)?;
    let scope = policy::Scope {
        namespace,
        url_host: &host,
        operator: &limits.operator,
        kinds: &limits.kinds,
    };
    let policy = policy::check(&objects, &template.spec.policy, &scope);
    refuse_violations(RefusalReason::PolicyRejected, policy)?;
    let previous = environment.status.clone().unwrap_or_default();
    let replicas_before_sleep = workloads::prepare(
        &mut objects,
        environment.spec.sleep,
        &previous.replicas_before_sleep,
        live_replicas,
        environment.spec.redeploy.as_deref(),
    );
    let routes = routes::routes_to(&objects, &host);
    let stage = asleep_routes::stage_of(environment, limits.gate_answers, chrono::Utc::now());
    asleep_routes::place(&mut objects, &routes, stage);
    let defaults = crate::model::quota::container_default_requests(&template.spec);
    let requests = footprint::requested(
        &objects,
        &defaults,
        environment.spec.sleep,
        &replicas_before_sleep,
    );
    let extra_hosts = routes::extra_hosts(&objects, &template.spec.policy.allowed_ingress_hosts);
    Ok(Plan {
        namespace: namespace.to_string(),
        labels,
        url,
        routes,
        extra_hosts,
        host,
        objects,
        replicas_before_sleep,
        requests,
        databases: Vec::new(),
    })
}

/// Any violation refuses the whole render, with every violation in the message.
fn refuse_violations(reason: RefusalReason, violations: Vec<Violation>) -> Result<(), Refused> {
    if violations.is_empty() {
        return Ok(());
    }
    let message = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    Err(Refused {
        violations,
        ..Refused::new(reason, message)
    })
}

/// A CustomResourceDefinition is cluster-wide: it would change the API for every tenant, and
/// outlive the environment. Charts that carry one (in `crds/` or a template) are refused with
/// what to do instead, rather than having it dropped silently as `helm template` would.
fn refuse_crds(objects: &[RenderedObject]) -> Result<(), Refused> {
    let crds: Vec<String> = objects
        .iter()
        .filter(|o| o.kind() == "CustomResourceDefinition")
        .map(|o| format!("{} ({})", o.name(), o.manifest))
        .collect();
    if crds.is_empty() {
        return Ok(());
    }
    Err(Refused::new(
        RefusalReason::CRDsNotInstalled,
        format!(
            "the manifests contain CustomResourceDefinition {}: previewd never installs CRDs, which are cluster-wide; ask the cluster's operator to install them and allow their kinds (templateKinds), and leave them out of the preview (for a chart: skip its crds/ folder with a value, or move the CRDs to a chart of their own); nothing was applied",
            crds.join(", ")
        ),
    ))
}

/// A runaway loop in a template, or a hostile one, must not flood the API server.
fn check_object_limit(count: usize, max_objects: usize) -> Result<(), Refused> {
    if count > max_objects {
        return Err(Refused::new(
            RefusalReason::TooManyObjects,
            format!(
                "the template renders {count} objects, more than the limit of {max_objects} per environment (--max-objects-per-environment); nothing was applied"
            ),
        ));
    }
    Ok(())
}

/// Refuses objects that take more than `max_bytes` together (as JSON).
fn check_byte_limit(objects: &[RenderedObject], max_bytes: usize) -> Result<(), Refused> {
    let bytes = objects
        .iter()
        .map(|o| serde_json::to_vec(&o.object).map_or(0, |b| b.len()))
        .fold(0usize, usize::saturating_add);
    if bytes > max_bytes {
        return Err(Refused::new(
            RefusalReason::TooManyObjects,
            format!(
                "the template's objects take {bytes} bytes, more than the limit of {max_bytes} per environment (--max-bytes-per-environment); nothing was applied"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
