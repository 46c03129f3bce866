//! The secrets step: the Secrets a template asks previewd to put into every environment
//! (`spec.secrets`), added to the plan as objects of its first wave, so that they are applied,
//! listed in the status and pruned like any other object.
//!
//! * Copies ([`add_copies`], before the namespace is claimed, so that a missing or unshared
//!   source refuses the commit before anything is written): each source is read at every
//!   reconcile, so a changed source is copied at the next one (a template change, a new commit,
//!   or the resync). The source must consent: its annotation [`COPY_ANNOTATION`] lists the
//!   namespaces of the templates that may copy it. Without that, any template author could copy
//!   any Secret previewd can read (another team's, or their own forge token) into a namespace
//!   where a pull request's code runs.
//! * Generated secrets ([`add_generated`], after previewd's rights in the namespace are granted,
//!   since it reads them back there): random values made once. Kept from what the environment
//!   already holds (the apply's record, or one read after a restart), so they stay the same for
//!   the environment's life; a key added to the template gets a value, the others keep theirs.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use crate::cluster::observed::ObjectKey;
use crate::model::crd::{CopiedSecret, GeneratedSecret, PreviewTemplate};
use crate::plan::Plan;
use crate::plan::render::RenderedObject;

/// On a source Secret: the namespaces (comma-separated, or `*`) whose templates may copy it.
pub const COPY_ANNOTATION: &str = "previewd.dev/copy-to-templates-in";

/// The name the plan gives the copies' and generated secrets' "manifest" in messages.
const SOURCE: &str = "spec.secrets";

const DEFAULT_LENGTH: u32 = 32;
const LENGTHS: std::ops::RangeInclusive<u32> = 16..=128;
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Reads every copied Secret's source and adds its copy to the plan.
pub async fn add_copies(
    plan: &mut Plan,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<(), Stop> {
    let template_namespace = template.namespace().unwrap_or_default();
    for copy in &template.spec.secrets.copy {
        let source_namespace = copy.namespace.as_deref().unwrap_or(&template_namespace);
        let source = read_source(context, source_namespace, &copy.name).await?;
        if !shared_with(&source, &template_namespace) {
            return Err(Stop::Refused(Refusal::new(
                RefusalReason::SecretNotShared,
                format!(
                    "Secret {source_namespace}/{} is not shared with templates in namespace {template_namespace:?}: its owner adds the annotation {COPY_ANNOTATION}: \"{template_namespace}\" to allow the copy; nothing was applied",
                    copy.name
                ),
            )));
        }
        let object = copied(&source, copy, plan);
        add(plan, object)?;
    }
    Ok(())
}

async fn read_source(context: &Context, namespace: &str, name: &str) -> Result<Secret, Stop> {
    let api: Api<Secret> = Api::namespaced(context.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(Stop::Refused(Refusal {
            reason: RefusalReason::SecretUnavailable,
            message: format!(
                "Secret {namespace}/{name}, which {SOURCE}.copy names, does not exist; nothing was applied"
            ),
            retry: Some(Box::new(ReconcileError::Secrets(not_found(
                namespace, name,
            )))),
            quarantine: None,
            violations: Vec::new(),
        })),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(Stop::Refused(Refusal {
            reason: RefusalReason::SecretUnavailable,
            message: format!(
                "previewd may not read Secrets in namespace {namespace} (add it to the chart's rbac.secretNamespaces), so it cannot copy {name}; nothing was applied"
            ),
            retry: Some(Box::new(ReconcileError::Secrets(kube::Error::Api(status)))),
            quarantine: None,
            violations: Vec::new(),
        })),
        Err(error) => Err(Stop::Failed(ReconcileError::Secrets(error))),
    }
}

fn not_found(namespace: &str, name: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(
            &format!("secrets \"{name}\" not found in {namespace}"),
            "NotFound",
        )
        .with_code(404)
        .boxed(),
    )
}

/// Whether the Secret's owner lets templates of `template_namespace` copy it.
/// An operator's credential (a cluster's, a database server's) is never shared, whatever its
/// annotations say.
fn shared_with(source: &Secret, template_namespace: &str) -> bool {
    !crate::cluster::secrets::is_operator_credential(source)
        && source
            .annotations()
            .get(COPY_ANNOTATION)
            .is_some_and(|list| {
                list.split(',')
                    .map(str::trim)
                    .any(|entry| entry == "*" || entry == template_namespace)
            })
}

/// The copy: the source's type and data, the environment's labels, nothing else of the source's
/// metadata (its annotations may name other namespaces).
fn copied(source: &Secret, copy: &CopiedSecret, plan: &Plan) -> RenderedObject {
    let name = copy.target.as_deref().unwrap_or(&copy.name);
    let mut object = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": plan.namespace, "labels": plan.labels},
        "type": source.type_.as_deref().unwrap_or("Opaque"),
    });
    if let Some(data) = &source.data {
        object["data"] = serde_json::to_value(data).unwrap_or_default();
    }
    secret_object(plan, object)
}

/// Adds the generated Secrets, keeping every value the environment already holds.
pub async fn add_generated(
    plan: &mut Plan,
    template: &PreviewTemplate,
    context: &Context,
) -> Result<(), Stop> {
    for wanted in &template.spec.secrets.generate {
        let existing = current_data(plan, &wanted.name, context).await?;
        let object = generated(wanted, &existing, plan).map_err(Stop::Refused)?;
        add(plan, object)?;
    }
    Ok(())
}

/// The data (key → base64) of the environment's Secret `name`: from the applier's record of
/// its last apply, else read from the cluster (after a restart), else nothing yet.
pub(super) async fn current_data(
    plan: &Plan,
    name: &str,
    context: &Context,
) -> Result<BTreeMap<String, String>, Stop> {
    let key = ObjectKey {
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: plan.namespace.clone(),
        name: name.to_string(),
    };
    if let Some(recorded) = context.applier.observed().get(&key) {
        return Ok(serde_json::from_value(recorded.content()["data"].take()).unwrap_or_default());
    }
    let api: Api<Secret> = Api::namespaced(context.client.clone(), &plan.namespace);
    let secret = api
        .get_opt(name)
        .await
        .map_err(|e| Stop::Failed(ReconcileError::Secrets(e)))?;
    let data = secret.and_then(|s| s.data).unwrap_or_default();
    Ok(serde_json::from_value(serde_json::to_value(data).unwrap_or_default()).unwrap_or_default())
}

/// The generated Secret: `existing` values kept, missing keys given fresh random values.
fn generated(
    wanted: &GeneratedSecret,
    existing: &BTreeMap<String, String>,
    plan: &Plan,
) -> Result<RenderedObject, Refusal> {
    let length = wanted.length.unwrap_or(DEFAULT_LENGTH);
    if !LENGTHS.contains(&length) {
        return Err(Refusal::new(
            RefusalReason::RenderFailed,
            format!(
                "{SOURCE}.generate {}: length {length} is outside {}..={}",
                wanted.name,
                LENGTHS.start(),
                LENGTHS.end()
            ),
        ));
    }
    let mut data = BTreeMap::new();
    for key in &wanted.keys {
        let value = match existing.get(key) {
            Some(value) => value.clone(),
            None => BASE64.encode(random_text(length).map_err(|e| {
                Refusal::new(
                    RefusalReason::RenderFailed,
                    format!("no randomness from the system: {e}"),
                )
            })?),
        };
        data.insert(key.clone(), value);
    }
    let object = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": wanted.name, "namespace": plan.namespace, "labels": plan.labels},
        "data": data,
    });
    Ok(secret_object(plan, object))
}

/// `length` letters and digits from the operating system's random source (rejection sampling,
/// so every character is equally likely).
pub(super) fn random_text(length: u32) -> Result<String, getrandom::Error> {
    let mut text = String::new();
    let mut buffer = [0u8; 64];
    while text.len() < length as usize {
        getrandom::fill(&mut buffer)?;
        for byte in buffer {
            // 62 * 4 = 248: bytes from 248 up would favour the first characters.
            if byte < 248 && text.len() < length as usize {
                text.push(char::from(ALPHABET[usize::from(byte % 62)]));
            }
        }
    }
    Ok(text)
}

/// A Secret of the plan's first wave.
pub(super) fn secret_object(plan: &Plan, object: Value) -> RenderedObject {
    RenderedObject {
        manifest: SOURCE.to_string(),
        wave: plan.objects.iter().map(|o| o.wave).min().unwrap_or(0),
        seed: None,
        object,
    }
}

/// Adds `object` unless the template already renders an object of that name.
pub(super) fn add(plan: &mut Plan, object: RenderedObject) -> Result<(), Stop> {
    let key = ObjectKey::of(&object.object);
    if let Some(clash) = plan
        .objects
        .iter()
        .find(|o| ObjectKey::of(&o.object) == key)
    {
        return Err(Stop::Refused(Refusal::new(
            RefusalReason::GuardRejected,
            format!(
                "Secret/{} (from {}) has the name of a Secret that {SOURCE} puts into the environment; nothing was applied",
                key.name, clash.manifest
            ),
        )));
    }
    plan.objects.push(object);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            namespace: "preview-x".into(),
            labels: BTreeMap::from([("previewd.dev/environment".into(), "pr-1".into())]),
            url: String::new(),
            host: String::new(),
            extra_hosts: Vec::new(),
            routes: Vec::new(),
            objects: vec![RenderedObject {
                manifest: "app.yaml".into(),
                wave: -1,
                seed: None,
                object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
            }],
            replicas_before_sleep: BTreeMap::new(),
            requests: Default::default(),
            databases: Vec::new(),
        }
    }

    fn source(annotation: Option<&str>) -> Secret {
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "pull", "namespace": "platform",
                         "annotations": {"kept": "out of the copy"}},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": "e30="},
        }))
        .unwrap();
        if let Some(list) = annotation {
            secret
                .annotations_mut()
                .insert(COPY_ANNOTATION.into(), list.into());
        }
        secret
    }

    #[test]
    fn only_a_source_shared_with_the_templates_namespace_is_copied() {
        assert!(!shared_with(&source(None), "team-a"));
        assert!(shared_with(&source(Some("team-b, team-a")), "team-a"));
        assert!(shared_with(&source(Some("*")), "team-a"));
        assert!(!shared_with(&source(Some("team-b")), "team-a"));
        assert!(!shared_with(&source(Some("team-a-evil")), "team-a"));
        let mut credential = source(Some("*"));
        credential.type_ = Some(crate::cluster::secrets::CLUSTER_CREDENTIAL_TYPE.into());
        assert!(!shared_with(&credential, "team-a"));
        credential.type_ = Some(crate::cluster::secrets::DATABASE_CREDENTIAL_TYPE.into());
        assert!(!shared_with(&credential, "team-a"));
    }

    #[test]
    fn a_copy_keeps_type_and_data_and_takes_the_environments_labels_and_first_wave() {
        let copy = CopiedSecret {
            name: "pull".into(),
            namespace: Some("platform".into()),
            target: Some("registry".into()),
        };
        let object = copied(&source(Some("*")), &copy, &plan());
        assert_eq!(object.wave, -1);
        assert_eq!(object.object["metadata"]["name"], "registry");
        assert_eq!(object.object["metadata"]["namespace"], "preview-x");
        assert_eq!(
            object.object["metadata"]["labels"]["previewd.dev/environment"],
            "pr-1"
        );
        assert!(object.object["metadata"]["annotations"].is_null());
        assert_eq!(object.object["type"], "kubernetes.io/dockerconfigjson");
        assert_eq!(object.object["data"][".dockerconfigjson"], "e30=");
    }

    #[test]
    fn generated_values_are_random_kept_once_made_and_bounded() {
        let wanted = GeneratedSecret {
            name: "db".into(),
            keys: vec!["password".into(), "token".into()],
            length: None,
        };
        let first = generated(&wanted, &BTreeMap::new(), &plan()).unwrap();
        let password = first.object["data"]["password"]
            .as_str()
            .unwrap()
            .to_string();
        let text = BASE64.decode(&password).unwrap();
        assert_eq!(text.len(), 32);
        assert!(text.iter().all(u8::is_ascii_alphanumeric));
        assert_ne!(
            first.object["data"]["password"],
            first.object["data"]["token"]
        );
        let kept = BTreeMap::from([("password".to_string(), password.clone())]);
        let again = generated(&wanted, &kept, &plan()).unwrap();
        assert_eq!(again.object["data"]["password"], password.as_str());
        let short = GeneratedSecret {
            length: Some(4),
            ..wanted
        };
        let refused = generated(&short, &BTreeMap::new(), &plan()).unwrap_err();
        assert!(refused.message.contains("length 4"), "{}", refused.message);
    }

    #[test]
    fn a_template_object_of_the_same_name_is_refused() {
        let mut plan = plan();
        plan.objects.push(RenderedObject {
            manifest: "app.yaml".into(),
            wave: 0,
            seed: None,
            object: json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "preview-x"}}),
        });
        let wanted = GeneratedSecret {
            name: "db".into(),
            keys: vec!["password".into()],
            length: None,
        };
        let object = generated(&wanted, &BTreeMap::new(), &plan).unwrap();
        assert!(
            matches!(add(&mut plan, object), Err(Stop::Refused(r)) if r.message.contains("app.yaml"))
        );
    }
}
