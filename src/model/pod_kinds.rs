//! The built-in kinds that run pods, listed once: where each keeps its pod template (what the
//! content policy judges), how an environment's sleep holds its pods, and how its health is
//! told. The content policy (`plan/policy`), sleep (`plan/workloads.rs`)
//! and health (`cluster/health.rs`) read this table; a kind added here is judged, slept and
//! watched alike, and one missing here is none of these (the policy refuses what it has no
//! rules for).

/// How an environment's sleep holds a kind's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sleep {
    /// Scaled to 0 replicas, the count remembered in the status for the wake.
    Replicas,
    /// `spec.suspend: true`: no new runs while asleep.
    Suspend,
    /// Left as it is: it runs to its end (a Job, a bare Pod) or cannot be scaled (a DaemonSet,
    /// which the content policy refuses).
    Runs,
}

/// How the health of an object of the kind is told (`cluster/health.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Available, every replica updated and ready for the current generation.
    Deployment,
    /// Every replica updated and ready for the current generation.
    StatefulSet,
    /// Scheduled and available on every node it should run on.
    DaemonSet,
    /// Complete (or Failed).
    Job,
    /// Ready, or Succeeded.
    Pod,
    /// By the kstatus convention: its conditions, its observed generation.
    Conditions,
}

/// A built-in kind that runs pods.
#[derive(Debug, PartialEq, Eq)]
pub struct PodKind {
    /// The API group (empty for the core group).
    pub group: &'static str,
    pub kind: &'static str,
    /// The one version whose objects sleep scales or suspends (what the API server serves).
    pub api_version: &'static str,
    /// The keys from the object to its pod template (none: the object is the pod).
    pub template: &'static [&'static str],
    /// Where the pod spec is, as the policy's messages name it.
    pub spec_path: &'static str,
    pub sleep: Sleep,
    pub readiness: Readiness,
}

const IN_SPEC_TEMPLATE: &[&str] = &["spec", "template"];

/// Every built-in kind that runs pods.
pub const POD_KINDS: &[PodKind] = &[
    PodKind {
        group: "",
        kind: "Pod",
        api_version: "v1",
        template: &[],
        spec_path: "spec",
        sleep: Sleep::Runs,
        readiness: Readiness::Pod,
    },
    PodKind {
        group: "",
        kind: "ReplicationController",
        api_version: "v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Replicas,
        readiness: Readiness::Conditions,
    },
    PodKind {
        group: "apps",
        kind: "Deployment",
        api_version: "apps/v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Replicas,
        readiness: Readiness::Deployment,
    },
    PodKind {
        group: "apps",
        kind: "StatefulSet",
        api_version: "apps/v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Replicas,
        readiness: Readiness::StatefulSet,
    },
    PodKind {
        group: "apps",
        kind: "ReplicaSet",
        api_version: "apps/v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Replicas,
        readiness: Readiness::Conditions,
    },
    PodKind {
        group: "apps",
        kind: "DaemonSet",
        api_version: "apps/v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Runs,
        readiness: Readiness::DaemonSet,
    },
    PodKind {
        group: "batch",
        kind: "Job",
        api_version: "batch/v1",
        template: IN_SPEC_TEMPLATE,
        spec_path: "spec.template.spec",
        sleep: Sleep::Runs,
        readiness: Readiness::Job,
    },
    PodKind {
        group: "batch",
        kind: "CronJob",
        api_version: "batch/v1",
        template: &["spec", "jobTemplate", "spec", "template"],
        spec_path: "spec.jobTemplate.spec.template.spec",
        sleep: Sleep::Suspend,
        readiness: Readiness::Conditions,
    },
];

/// The pod-running kind `kind` of API `group`, if it is one.
pub fn pod_kind(group: &str, kind: &str) -> Option<&'static PodKind> {
    POD_KINDS
        .iter()
        .find(|k| k.group == group && k.kind == kind)
}

/// The pod-running kind named `kind`, in whichever group (the content policy has matched the
/// group before it asks).
pub fn pod_kind_named(kind: &str) -> Option<&'static PodKind> {
    POD_KINDS.iter().find(|k| k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kinds::DEFAULT_TEMPLATE_KINDS;

    #[test]
    fn each_kind_is_listed_once_and_its_version_is_of_its_group() {
        for (i, kind) in POD_KINDS.iter().enumerate() {
            assert!(
                !POD_KINDS[..i].iter().any(|k| k.kind == kind.kind),
                "{} twice",
                kind.kind
            );
            assert_eq!(crate::model::kinds::group_of(kind.api_version), kind.group);
            let spec_path = kind.template.iter().chain(&["spec"]).copied();
            assert_eq!(kind.spec_path, spec_path.collect::<Vec<_>>().join("."));
        }
    }

    #[test]
    fn every_default_template_kind_that_runs_pods_is_in_the_table() {
        let runs_pods = ["Pod", "Deployment", "StatefulSet", "Job", "CronJob"];
        for allowed in DEFAULT_TEMPLATE_KINDS {
            let listed = pod_kind(&allowed.group, &allowed.kind).is_some();
            assert_eq!(
                listed,
                runs_pods.contains(&&*allowed.kind),
                "{}",
                allowed.kind
            );
        }
    }
}
