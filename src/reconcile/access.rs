//! The access step: where previewd's RBAC confines its writes to environment namespaces (the
//! chart, see `model::rbac`), it may write in a namespace only once it has bound the
//! environment role there to its own ServiceAccount. It does so right after claiming the
//! namespace, so a namespace previewd did not create never gets the binding.
//!
//! The API server's RBAC authorizer reads bindings from a cache, so a binding just created may
//! not be in force for a few milliseconds; the step waits until it is (a SelfSubjectAccessReview)
//! rather than let the first guard rail fail with 403 and the environment flap to Degraded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::apply::apply;
use super::config::EnvironmentAccess;
use super::context::Context;
use super::error::{ReconcileError, Stop};

/// The name of the RoleBinding previewd makes for itself in each environment namespace.
pub const ACCESS_BINDING_NAME: &str = "previewd-access";

/// How long a new binding may take to be in force before the reconcile is retried.
const GRANT_PATIENCE: Duration = Duration::from_secs(10);

/// The RoleBinding of the environment role to previewd's ServiceAccount in `namespace`.
pub fn access_binding(
    namespace: &str,
    access: &EnvironmentAccess,
    labels: &BTreeMap<String, String>,
) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": ACCESS_BINDING_NAME, "namespace": namespace, "labels": labels},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": access.cluster_role,
        },
        "subjects": [{
            "kind": "ServiceAccount",
            "name": access.service_account_name,
            "namespace": access.service_account_namespace,
        }],
    })
}

/// Binds the environment role in the (claimed) namespace, and waits until it is in force.
/// Nothing to do when previewd runs without `--environment-role`.
pub async fn grant(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    context: &Context,
    bypass_cache: bool,
) -> Result<(), Stop> {
    let Some(access) = &context.config.environment_access else {
        return Ok(());
    };
    let binding = access_binding(namespace, access, labels);
    if apply(context, &[&binding], bypass_cache).await? == 0 {
        return Ok(());
    }
    wait_until_in_force(namespace, context)
        .await
        .map_err(Stop::Failed)
}

/// Polls until previewd may patch ResourceQuotas (the first thing it writes next) in `namespace`.
async fn wait_until_in_force(namespace: &str, context: &Context) -> Result<(), ReconcileError> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(context.client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("patch".into()),
                resource: Some("resourcequotas".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let started = Instant::now();
    loop {
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReconcileError::Grant)?;
        if answer.status.is_some_and(|status| status.allowed) {
            return Ok(());
        }
        if started.elapsed() > GRANT_PATIENCE {
            return Err(ReconcileError::GrantNotInForce(namespace.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
