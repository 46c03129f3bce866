//! Whether the CRDs installed in the cluster are the ones this previewd needs. Helm does not
//! upgrade CRDs: after `helm upgrade` without applying `charts/previewd/crds/previewd.dev.yaml`,
//! the API server keeps the old schema. previewd's intake relies on one rule of the new one
//! (the order of deliveries, kept by the API server on `spec.source`); without it an older
//! delivery handled at the same moment as a newer one could overwrite it. previewd therefore
//! refuses to start on an older CRD and says what to apply; the replicas of the previous
//! version keep running meanwhile, since the new ones never turn ready.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kube::api::Api;
use kube::{Client, CustomResourceExt};

use crate::model::crd::{OLDER_SOURCE_MESSAGE, PreviewEnvironment};

/// The installed PreviewEnvironment CRD keeps the order of deliveries, or why not.
pub async fn check_delivery_order(client: &Client) -> Result<(), String> {
    let name = PreviewEnvironment::crd_name();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed = crds
        .get(name)
        .await
        .map_err(|e| format!("reading the installed CustomResourceDefinition {name}: {e}"))?;
    if keeps_delivery_order(&installed) {
        return Ok(());
    }
    Err(format!(
        "the installed CustomResourceDefinition {name} is older than this previewd: its spec.source has no rule keeping the order of deliveries. Apply charts/previewd/crds/previewd.dev.yaml (kubectl apply --server-side -f), then restart previewd"
    ))
}

/// Whether every served version's schema holds the order rule on `spec.source` (found by its
/// message, [`OLDER_SOURCE_MESSAGE`]).
pub fn keeps_delivery_order(crd: &CustomResourceDefinition) -> bool {
    let mut served = crd
        .spec
        .versions
        .iter()
        .filter(|version| version.served)
        .peekable();
    served.peek().is_some() && served.all(has_order_rule)
}

/// Whether `version`'s schema of `spec.source` carries the order rule.
fn has_order_rule(version: &CustomResourceDefinitionVersion) -> bool {
    version
        .schema
        .as_ref()
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
        .and_then(|root| root.properties.as_ref()?.get("spec"))
        .and_then(|spec| spec.properties.as_ref()?.get("source"))
        .and_then(|source| source.x_kubernetes_validations.as_ref())
        .is_some_and(|rules| {
            rules
                .iter()
                .any(|rule| rule.message.as_deref() == Some(OLDER_SOURCE_MESSAGE))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_previewds_crd_keeps_the_order_and_one_without_the_rule_does_not() {
        let mut crd = PreviewEnvironment::crd();
        assert!(keeps_delivery_order(&crd));
        for version in &mut crd.spec.versions {
            let source = version
                .schema
                .as_mut()
                .and_then(|schema| schema.open_api_v3_schema.as_mut())
                .and_then(|root| root.properties.as_mut()?.get_mut("spec"))
                .and_then(|spec| spec.properties.as_mut()?.get_mut("source"))
                .expect("spec.source in the schema");
            source.x_kubernetes_validations = None;
        }
        assert!(
            !keeps_delivery_order(&crd),
            "an older CRD, as Helm leaves it"
        );
    }
}
