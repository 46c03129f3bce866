//! What bounds an environment's namespace (pure): the ResourceQuota's `hard` limits and the
//! LimitRange's container defaults, each the built-in default with the template's changes over
//! it. A template changes a resource's value or adds a resource; it never drops one, so a quota
//! that names only `pods` still bounds CPU, memory, the node's disk and load balancers. How far
//! a template may raise a value is the operator's ceiling (`super::ceiling`, `resourceQuota`).

use std::collections::BTreeMap;

use super::crd::PreviewTemplateSpec;
use super::quantity;

/// The quota of every environment namespace, unless its template changes a value: objects
/// (enough for the examples), Jobs and CronJobs (each one runs pods on a schedule of its own),
/// the CPU, memory and node disk (ephemeral storage) its pods may request (pods without
/// requests get [`DEFAULT_LIMITS`]' through the LimitRange, so the quota refuses none of them
/// for that), and no load balancers or node ports even where the policy allows the Service
/// types.
pub const DEFAULT_QUOTA: &[(&str, &str)] = &[
    ("pods", "50"),
    ("requests.cpu", "8"),
    ("requests.memory", "16Gi"),
    ("count/jobs.batch", "30"),
    ("count/cronjobs.batch", "10"),
    ("services", "30"),
    ("services.loadbalancers", "0"),
    ("services.nodeports", "0"),
    ("persistentvolumeclaims", "10"),
    ("requests.storage", "50Gi"),
    ("secrets", "50"),
    ("configmaps", "50"),
    // The node's disk its pods may write (logs, emptyDir, writable layers): every container
    // gets a limit from the LimitRange, so the quota counts it.
    ("requests.ephemeral-storage", "20Gi"),
    ("limits.ephemeral-storage", "40Gi"),
];

/// What a container that says nothing requests (so the quota's CPU, memory and disk count it)
/// and may use at most, unless the template says otherwise for that resource. A container that
/// names its own limits is bounded by the namespace's quota of requests, not by these. `(field, [(resource, quantity)])`.
pub const DEFAULT_LIMITS: &[(&str, &[(&str, &str)])] = &[
    (
        "defaultRequest",
        &[
            ("cpu", "50m"),
            ("memory", "64Mi"),
            ("ephemeral-storage", "64Mi"),
        ],
    ),
    (
        "default",
        &[
            ("cpu", "2"),
            ("memory", "2Gi"),
            ("ephemeral-storage", "2Gi"),
        ],
    ),
];

/// The `hard` limits of the environment's ResourceQuota: [`DEFAULT_QUOTA`] with the template's
/// values over it.
pub fn quota_hard(template: &PreviewTemplateSpec) -> BTreeMap<String, String> {
    let mut hard: BTreeMap<String, String> = DEFAULT_QUOTA
        .iter()
        .map(|(resource, quantity)| (resource.to_string(), quantity.to_string()))
        .collect();
    if let Some(asked) = &template.namespace.resource_quota {
        hard.extend(asked.clone());
    }
    hard
}

/// One container limit range: `default`, `defaultRequest` and `max`, by resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerLimits {
    pub default: BTreeMap<String, String>,
    pub default_request: BTreeMap<String, String>,
    pub max: BTreeMap<String, String>,
}

fn built_in(field: &str) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
    DEFAULT_LIMITS
        .iter()
        .filter(move |(name, _)| *name == field)
        .flat_map(|(_, values)| values.iter().copied())
}

/// The environment's container limit range: for each resource the template names in
/// `default` or `defaultRequest`, the template's pair; for the others, the built-in pair,
/// lowered to the template's `max` where it names one (the API server refuses a default above
/// the maximum); the template's `max` as it is.
pub fn container_limits(template: &PreviewTemplateSpec) -> ContainerLimits {
    let Some(asked) = &template.namespace.limit_range else {
        let collect = |field| {
            built_in(field)
                .map(|(r, q)| (r.to_string(), q.to_string()))
                .collect()
        };
        return ContainerLimits {
            default: collect("default"),
            default_request: collect("defaultRequest"),
            max: BTreeMap::new(),
        };
    };
    let mut limits = ContainerLimits {
        default: asked.default.clone(),
        default_request: asked.default_request.clone(),
        max: asked.max.clone(),
    };
    let named = |resource: &str| {
        asked.default.contains_key(resource) || asked.default_request.contains_key(resource)
    };
    for (field, into) in [
        ("default", &mut limits.default),
        ("defaultRequest", &mut limits.default_request),
    ] {
        for (resource, quantity) in built_in(field).filter(|(r, _)| !named(r)) {
            let quantity = match asked.max.get(resource) {
                Some(max) if !within(quantity, max) => max.clone(),
                _ => quantity.to_string(),
            };
            into.insert(resource.to_string(), quantity);
        }
    }
    limits
}

/// Whether the quantity `asked` is at most `bound`; `None` when either is no quantity previewd
/// can compare (or too large to count).
pub fn at_most(asked: &str, bound: &str) -> Option<bool> {
    Some(quantity::millis(asked)? <= quantity::millis(bound)?)
}

fn within(asked: &str, bound: &str) -> bool {
    at_most(asked, bound).unwrap_or(false)
}

/// What a container that requests nothing is given: `(cpu, memory)` as quantities, its
/// `defaultRequest`, else its `default` (which Kubernetes then uses as the request too).
pub fn container_default_requests(
    template: &PreviewTemplateSpec,
) -> (Option<String>, Option<String>) {
    let limits = container_limits(template);
    let pick = |resource: &str| {
        limits
            .default_request
            .get(resource)
            .or_else(|| limits.default.get(resource))
            .cloned()
    };
    (pick("cpu"), pick("memory"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::LimitRangeSpec;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_templates_quota_changes_values_and_never_drops_one() {
        let mut template = PreviewTemplateSpec::default();
        template.namespace.resource_quota =
            Some(map(&[("pods", "40"), ("count/deployments.apps", "5")]));
        let hard = quota_hard(&template);
        assert_eq!(hard["pods"], "40");
        assert_eq!(hard["count/deployments.apps"], "5");
        for (resource, quantity) in DEFAULT_QUOTA.iter().filter(|(r, _)| *r != "pods") {
            assert_eq!(hard[*resource], *quantity, "{resource} kept");
        }
    }

    #[test]
    fn container_defaults_are_the_templates_per_resource_and_stay_under_its_max() {
        let mut template = PreviewTemplateSpec::default();
        template.namespace.limit_range = Some(LimitRangeSpec {
            default: map(&[("cpu", "500m"), ("memory", "512Mi")]),
            default_request: map(&[("cpu", "100m")]),
            max: map(&[("ephemeral-storage", "1Gi")]),
        });
        let limits = container_limits(&template);
        assert_eq!(
            limits.default,
            map(&[
                ("cpu", "500m"),
                ("memory", "512Mi"),
                ("ephemeral-storage", "1Gi")
            ])
        );
        assert_eq!(
            limits.default_request,
            map(&[("cpu", "100m"), ("ephemeral-storage", "64Mi")]),
            "memory: the template named its limit, so Kubernetes requests that"
        );
        assert_eq!(
            container_default_requests(&template),
            (Some("100m".into()), Some("512Mi".into()))
        );
        assert_eq!(
            container_default_requests(&PreviewTemplateSpec::default()),
            (Some("50m".into()), Some("64Mi".into()))
        );
    }
}
