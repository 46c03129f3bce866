//! The claim step: before anything is applied, make sure the environment's namespace is its
//! own. previewd creates the namespace itself, labelled with the environment's UID
//! ([`LABEL_ENVIRONMENT_UID`]); a namespace that exists without that label (another team's,
//! `kube-system`, another environment's) is never adopted: the environment gets the condition
//! `NamespaceConflict`, nothing is applied, and nothing is deleted later either, since cleanup
//! and the orphan sweep make the same check.
//!
//! Namespaces made before this label existed are not recognised either (anyone able to label
//! a namespace could copy the other labels): docs/operations.md says how to move past them.
//!
//! Costs nothing at steady state: a namespace the watch store already shows as this
//! environment's needs no request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::error::{ReconcileError, Refusal, RefusalReason, Stop};
use super::namespace::namespace_object;
use crate::cluster::observed::ObjectKey;
use crate::model::crd::PreviewEnvironment;
use crate::model::metadata::{FIELD_MANAGER_RECONCILE, LABEL_ENVIRONMENT_UID};

/// Whose a namespace is, as far as one environment is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Created by previewd for this environment.
    Ours,
    /// Anyone else's, or previewd's for another environment.
    Foreign,
}

/// Ownership of a namespace with `labels` for `environment` (pure). Only the UID label counts:
/// the name labels can be copied by anyone who can label a namespace, and the status names a
/// namespace before it is claimed.
pub fn ownership(labels: &BTreeMap<String, String>, environment: &PreviewEnvironment) -> Ownership {
    let uid = environment.meta().uid.as_deref().unwrap_or_default();
    match labels.get(LABEL_ENVIRONMENT_UID) {
        Some(owner) if !uid.is_empty() && owner == uid => Ownership::Ours,
        _ => Ownership::Foreign,
    }
}

/// Makes `namespace` the environment's: creates it with `labels` if it does not exist, and
/// refuses with `NamespaceConflict` if it exists and is not the environment's own.
pub async fn claim_namespace(
    environment: &PreviewEnvironment,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    context: &Context,
) -> Result<(), Stop> {
    let object = namespace_object(namespace, labels);
    if let Some(observed) = context.applier.observed_labels(&ObjectKey::of(&object))
        && ownership(&observed, environment) == Ownership::Ours
    {
        return Ok(());
    }
    let api: Api<Namespace> = Api::all(context.client.clone());
    let existing = match api.get_opt(namespace).await {
        Ok(Some(existing)) => existing,
        Ok(None) => return create(&api, namespace, object, context).await,
        Err(e) => return Err(Stop::Failed(ReconcileError::Claim(e))),
    };
    match ownership(existing.labels(), environment) {
        Ownership::Ours => Ok(()),
        Ownership::Foreign => Err(Stop::Refused(conflict(namespace))),
    }
}

/// Creates the namespace (a create, not an apply: an apply would adopt one that appeared
/// meanwhile). Someone else creating it first is a conflict, looked at again next time.
async fn create(
    api: &Api<Namespace>,
    namespace: &str,
    object: serde_json::Value,
    context: &Context,
) -> Result<(), Stop> {
    let object: Namespace = serde_json::from_value(object)
        .map_err(|e| Stop::Failed(ReconcileError::Claim(kube::Error::SerdeError(e))))?;
    // Created under the reconciler's field manager: the labels it sets are the ones the
    // namespace's applies set, so they are not mistaken for a hand edit after a restart.
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER_RECONCILE.to_string()),
        ..Default::default()
    };
    let created = context
        .writer
        .write("create", api.create(&params, &object))
        .await;
    match created {
        Ok(_) => {
            tracing::info!(%namespace, "created the environment's namespace");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let mut refusal = conflict(namespace);
            refusal.retry = Some(Box::new(ReconcileError::Claim(kube::Error::Api(status))));
            Err(Stop::Refused(refusal))
        }
        Err(e) => Err(Stop::Failed(ReconcileError::Claim(e))),
    }
}

fn conflict(namespace: &str) -> Refusal {
    Refusal::new(
        RefusalReason::NamespaceConflict,
        format!(
            "namespace {namespace} already exists and previewd did not create it for this environment: nothing is applied there, and it is never deleted by previewd"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewEnvironmentSpec;
    use crate::model::metadata::{LABEL_ENVIRONMENT, LABEL_ENVIRONMENT_NAMESPACE};

    fn environment(uid: &str) -> PreviewEnvironment {
        let mut environment =
            PreviewEnvironment::new("web-pr-1", PreviewEnvironmentSpec::default());
        environment.metadata.namespace = Some("team-a".into());
        environment.metadata.uid = Some(uid.into());
        environment
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_a_namespace_labelled_with_the_environments_uid_is_its_own() {
        let env = environment("uid-1");
        let ours = labels(&[(LABEL_ENVIRONMENT_UID, "uid-1")]);
        assert_eq!(ownership(&ours, &env), Ownership::Ours);
        let another = labels(&[(LABEL_ENVIRONMENT_UID, "uid-2")]);
        assert_eq!(ownership(&another, &env), Ownership::Foreign);
        // kube-system, or a team's namespace: no previewd label at all.
        assert_eq!(ownership(&BTreeMap::new(), &env), Ownership::Foreign);
        // The environment's name labels, copied by hand (or from before the UID label).
        let lookalike = labels(&[
            (LABEL_ENVIRONMENT, "web-pr-1"),
            (LABEL_ENVIRONMENT_NAMESPACE, "team-a"),
        ]);
        assert_eq!(ownership(&lookalike, &env), Ownership::Foreign);
        // An environment without a UID (never from the API server) owns nothing.
        let empty = labels(&[(LABEL_ENVIRONMENT_UID, "")]);
        assert_eq!(ownership(&empty, &environment("")), Ownership::Foreign);
    }
}
