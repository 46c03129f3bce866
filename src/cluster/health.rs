//! Health (pure): an object's observed state → Ready, Progressing or Failed; and the
//! environment's phase from its objects.

use serde_json::Value;

use crate::model::kinds::group_of;
use crate::model::pod_kinds::{Readiness, pod_kind};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Ready,
    Progressing(String),
    Failed(String),
}

impl Health {
    pub fn state(&self) -> &'static str {
        match self {
            Health::Ready => "Ready",
            Health::Progressing(_) => "Progressing",
            Health::Failed(_) => "Failed",
        }
    }
    pub fn message(&self) -> Option<String> {
        match self {
            Health::Ready => None,
            Health::Progressing(m) | Health::Failed(m) => Some(m.clone()),
        }
    }
}

/// Health of one object from what the API server holds. Workloads by their own rules
/// (Deployments and StatefulSets Available with every replica updated and ready for the current
/// generation, DaemonSets scheduled and available everywhere, Jobs Complete), a
/// PersistentVolumeClaim once Bound, a Pod once Ready or Succeeded, a LoadBalancer Service once it
/// has an address, a Gateway API route once a Gateway accepted it; every other
/// kind, custom resources included, by the kstatus convention ([`by_conditions`]).
pub fn of_object(object: &Value) -> Health {
    let kind = object["kind"].as_str().unwrap_or_default();
    let group = group_of(object["apiVersion"].as_str().unwrap_or_default());
    if let Some(runs_pods) = pod_kind(group, kind) {
        return match runs_pods.readiness {
            Readiness::Deployment => deployment(object),
            Readiness::StatefulSet => stateful_set(object),
            Readiness::DaemonSet => daemon_set(object),
            Readiness::Job => job(object),
            Readiness::Pod => pod(object),
            Readiness::Conditions => by_conditions(object),
        };
    }
    match (group, kind) {
        ("", "PersistentVolumeClaim") => claim(object),
        ("", "Service") => service(object),
        ("gateway.networking.k8s.io", "HTTPRoute" | "GRPCRoute") => gateway_route(object),
        _ => by_conditions(object),
    }
}

/// A Gateway API route reports per Gateway (`status.parents[]`), not in conditions of its own:
/// it serves once a Gateway has accepted it for the current generation, and it has failed when
/// every Gateway that answered refused it (`Accepted` False, e.g. `NotAllowedByListeners`).
fn gateway_route(object: &Value) -> Health {
    let generation = int(&object["metadata"]["generation"]);
    let parents = object["status"]["parents"].as_array();
    let accepted: Vec<&Value> = parents
        .into_iter()
        .flatten()
        .filter_map(|parent| parent["conditions"].as_array())
        .filter_map(|conditions| conditions.iter().find(|c| c["type"] == "Accepted"))
        .filter(|c| {
            !c["observedGeneration"].is_i64() || int(&c["observedGeneration"]) >= generation
        })
        .collect();
    if accepted.iter().any(|c| c["status"] == "True") {
        return Health::Ready;
    }
    match accepted.first() {
        Some(refused) => Health::Failed(said(refused, "no Gateway accepted it")),
        None => Health::Progressing("waiting for a Gateway to accept it".into()),
    }
}

/// The kstatus convention, which controllers of custom resources (cert-manager, External
/// Secrets, Gateway implementations, Crossplane, …) follow: an object is still in progress while
/// its controller has not observed its generation (`status.observedGeneration`, or a `Ready`
/// condition's own `observedGeneration`), while `Reconciling` is True, or while `Ready` or
/// `Available` is not True; it failed when `Stalled` is True. An object without any of these
/// (a ConfigMap, a custom resource without a status) is Ready once it exists.
pub fn by_conditions(object: &Value) -> Health {
    if !object["metadata"]["deletionTimestamp"].is_null() {
        return Health::Progressing("being deleted".into());
    }
    let generation = int(&object["metadata"]["generation"]);
    let observed = &object["status"]["observedGeneration"];
    if observed.is_i64() && int(observed) < generation {
        return Health::Progressing(format!(
            "its controller has not seen generation {generation} yet"
        ));
    }
    if let Some(stalled) = condition(object, "Stalled").filter(|c| c["status"] == "True") {
        return Health::Failed(said(stalled, "Stalled"));
    }
    if let Some(busy) = condition(object, "Reconciling").filter(|c| c["status"] == "True") {
        return Health::Progressing(said(busy, "Reconciling"));
    }
    for type_ in ["Ready", "Available"] {
        let Some(found) = condition(object, type_) else {
            continue;
        };
        let stale =
            found["observedGeneration"].is_i64() && int(&found["observedGeneration"]) < generation;
        if found["status"] != "True" || stale {
            return Health::Progressing(said(found, &format!("{type_} is not True")));
        }
    }
    Health::Ready
}

/// A condition as a person reads it: "Reason: message", or `fallback` without either.
fn said(condition: &Value, fallback: &str) -> String {
    let reason = condition["reason"].as_str().unwrap_or_default();
    let message = condition["message"].as_str().unwrap_or_default();
    match (reason, message) {
        ("", "") => fallback.to_string(),
        (reason, "") => reason.to_string(),
        ("", message) => message.to_string(),
        (reason, message) => format!("{reason}: {message}"),
    }
}

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

fn generation_observed(object: &Value) -> bool {
    int(&object["status"]["observedGeneration"]) >= int(&object["metadata"]["generation"])
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn deployment(object: &Value) -> Health {
    let wanted = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &object["status"];
    if let Some(progressing) = condition(object, "Progressing")
        && progressing["status"] == "False"
        && progressing["reason"] == "ProgressDeadlineExceeded"
    {
        return Health::Failed(
            progressing["message"]
                .as_str()
                .unwrap_or("progress deadline exceeded")
                .to_string(),
        );
    }
    let available = condition(object, "Available").is_some_and(|c| c["status"] == "True");
    let updated = int(&status["updatedReplicas"]);
    let ready = int(&status["readyReplicas"]);
    if generation_observed(object)
        && available
        && updated >= wanted
        && ready >= wanted
        && int(&status["replicas"]) <= wanted
    {
        Health::Ready
    } else {
        Health::Progressing(format!("{ready}/{wanted} replicas ready"))
    }
}

fn stateful_set(object: &Value) -> Health {
    let wanted = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &object["status"];
    let ready = int(&status["readyReplicas"]);
    let updated_ok =
        status["updatedReplicas"].is_null() || int(&status["updatedReplicas"]) >= wanted;
    if generation_observed(object) && ready >= wanted && updated_ok {
        Health::Ready
    } else {
        Health::Progressing(format!("{ready}/{wanted} replicas ready"))
    }
}

fn job(object: &Value) -> Health {
    if condition(object, "Complete").is_some_and(|c| c["status"] == "True") {
        return Health::Ready;
    }
    if let Some(failed) = condition(object, "Failed").filter(|c| c["status"] == "True") {
        let reason = failed["reason"].as_str().unwrap_or("Failed");
        let message = failed["message"].as_str().unwrap_or("");
        return Health::Failed(
            format!("{reason}: {message}")
                .trim_end_matches([':', ' '])
                .to_string(),
        );
    }
    Health::Progressing("running".into())
}

fn daemon_set(object: &Value) -> Health {
    let status = &object["status"];
    let wanted = int(&status["desiredNumberScheduled"]);
    let available = int(&status["numberAvailable"]);
    let updated = int(&status["updatedNumberScheduled"]);
    if generation_observed(object) && available >= wanted && updated >= wanted {
        Health::Ready
    } else {
        Health::Progressing(format!("{available}/{wanted} nodes run it available"))
    }
}

/// A claim is Ready once Bound. One that waits for its first consumer (a storage class with
/// `WaitForFirstConsumer`) binds only when a pod mounts it: put it in the same wave as that
/// pod's workload (docs/writing-templates.md).
fn claim(object: &Value) -> Health {
    match object["status"]["phase"].as_str() {
        Some("Bound") => Health::Ready,
        Some("Lost") => Health::Failed("its PersistentVolume is lost".into()),
        _ => Health::Progressing("waiting to be bound to a volume".into()),
    }
}

/// A Pod that ran to completion is done, not unready.
fn pod(object: &Value) -> Health {
    match object["status"]["phase"].as_str() {
        Some("Succeeded") => Health::Ready,
        Some("Failed") => Health::Failed(said(&object["status"], "the pod failed")),
        _ => by_conditions(object),
    }
}

/// Services route to whatever is ready (the workloads say so themselves); a LoadBalancer
/// Service is Ready once the cloud gave it an address.
fn service(object: &Value) -> Health {
    let addressed = object["status"]["loadBalancer"]["ingress"]
        .as_array()
        .is_some_and(|ingress| !ingress.is_empty());
    if object["spec"]["type"] != "LoadBalancer" || addressed {
        Health::Ready
    } else {
        Health::Progressing("waiting for a load balancer address".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with_kind(object: &Value, api_version: &str, kind: &str) -> Value {
        let mut object = object.clone();
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        object
    }
    fn deploy(object: &Value) -> Value {
        with_kind(object, "apps/v1", "Deployment")
    }
    fn batch(object: &Value) -> Value {
        with_kind(object, "batch/v1", "Job")
    }

    #[test]
    fn deployment_is_ready_only_when_available_for_the_current_generation() {
        let mut d = json!({"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                       "conditions": [{"type": "Available", "status": "True"}]}});
        assert_eq!(of_object(&deploy(&d)), Health::Ready);
        d["status"]["observedGeneration"] = json!(1);
        assert!(matches!(of_object(&deploy(&d)), Health::Progressing(_)));
        d["status"]["observedGeneration"] = json!(2);
        d["status"]["readyReplicas"] = json!(1);
        assert_eq!(
            of_object(&deploy(&d)),
            Health::Progressing("1/2 replicas ready".into())
        );
        d["status"]["conditions"] = json!([{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}]);
        assert_eq!(of_object(&deploy(&d)), Health::Failed("too slow".into()));
    }

    #[test]
    fn job_complete_failed_or_running() {
        let complete = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(of_object(&batch(&complete)), Health::Ready);
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}});
        assert_eq!(
            of_object(&batch(&failed)),
            Health::Failed(
                "BackoffLimitExceeded: Job has reached the specified backoff limit".into()
            )
        );
        assert!(matches!(
            of_object(&batch(&json!({}))),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn other_kinds_are_ready_when_present() {
        assert_eq!(
            of_object(&json!({"apiVersion": "v1", "kind": "ConfigMap"})),
            Health::Ready
        );
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {"observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 1}});
        assert_eq!(of_object(&sts), Health::Ready);
    }

    #[test]
    fn a_kind_named_like_a_workload_in_another_group_follows_the_conditions() {
        // A custom "Deployment" (another group) has no replicas to count: it is judged by kstatus.
        let custom = json!({"apiVersion": "example.com/v1", "kind": "Deployment", "metadata": {"generation": 1}});
        assert_eq!(of_object(&custom), Health::Ready);
    }

    #[test]
    fn custom_resources_follow_the_kstatus_conditions() {
        let certificate = |status: Value| {
            json!({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                   "metadata": {"generation": 2}, "status": status})
        };
        assert_eq!(of_object(&certificate(json!(null))), Health::Ready);
        let issuing = certificate(json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "Issuing", "message": "Issuing certificate as Secret does not exist"}]}));
        assert_eq!(
            of_object(&issuing),
            Health::Progressing("Issuing: Issuing certificate as Secret does not exist".into())
        );
        let ready = certificate(
            json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2}]}),
        );
        assert_eq!(of_object(&ready), Health::Ready);
        let stale = certificate(
            json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}]}),
        );
        assert!(matches!(of_object(&stale), Health::Progressing(_)));
        let unseen = certificate(
            json!({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        assert_eq!(
            of_object(&unseen),
            Health::Progressing("its controller has not seen generation 2 yet".into())
        );
        let stalled = certificate(json!({"conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "Stalled", "status": "True", "reason": "InvalidIssuer", "message": "issuer not found"}]}));
        assert_eq!(
            of_object(&stalled),
            Health::Failed("InvalidIssuer: issuer not found".into())
        );
        let reconciling =
            certificate(json!({"conditions": [{"type": "Reconciling", "status": "True"}]}));
        assert_eq!(
            of_object(&reconciling),
            Health::Progressing("Reconciling".into())
        );
        let unavailable =
            certificate(json!({"conditions": [{"type": "Available", "status": "Unknown"}]}));
        assert_eq!(
            of_object(&unavailable),
            Health::Progressing("Available is not True".into())
        );
    }

    #[test]
    fn gateway_routes_serve_once_a_gateway_accepts_them() {
        let route = |parents: Value| {
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "web", "generation": 2}, "status": {"parents": parents}})
        };
        let accepted = |status: &str, generation: i64| {
            json!({"parentRef": {"name": "shared"}, "conditions": [{"type": "Accepted",
                "status": status, "reason": "NotAllowedByListeners",
                "message": "no listener allows this namespace", "observedGeneration": generation}]})
        };
        assert_eq!(
            of_object(&route(json!([accepted("True", 2)]))),
            Health::Ready
        );
        assert_eq!(
            of_object(&route(json!([]))),
            Health::Progressing("waiting for a Gateway to accept it".into())
        );
        assert!(
            matches!(
                of_object(&route(json!([accepted("True", 1)]))),
                Health::Progressing(_)
            ),
            "accepted for an older generation"
        );
        assert_eq!(
            of_object(&route(json!([accepted("False", 2)]))),
            Health::Failed("NotAllowedByListeners: no listener allows this namespace".into())
        );
        let one_of_two = json!([accepted("False", 2), accepted("True", 2)]);
        assert_eq!(of_object(&route(one_of_two)), Health::Ready);
    }

    #[test]
    fn daemon_sets_claims_and_load_balancers() {
        let daemon_set = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"generation": 1},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "numberAvailable": 2, "updatedNumberScheduled": 3}});
        assert_eq!(
            of_object(&daemon_set),
            Health::Progressing("2/3 nodes run it available".into())
        );
        let mut all = daemon_set.clone();
        all["status"]["numberAvailable"] = json!(3);
        assert_eq!(of_object(&all), Health::Ready);

        let claim = |phase: &str| json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "status": {"phase": phase}});
        assert_eq!(of_object(&claim("Bound")), Health::Ready);
        assert!(matches!(
            of_object(&claim("Pending")),
            Health::Progressing(_)
        ));
        assert!(matches!(of_object(&claim("Lost")), Health::Failed(_)));

        let service = |type_: &str, status: Value| json!({"apiVersion": "v1", "kind": "Service", "spec": {"type": type_}, "status": status});
        assert_eq!(of_object(&service("ClusterIP", json!({}))), Health::Ready);
        assert!(matches!(
            of_object(&service("LoadBalancer", json!({"loadBalancer": {}}))),
            Health::Progressing(_)
        ));
        let addressed = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}});
        assert_eq!(
            of_object(&service("LoadBalancer", addressed)),
            Health::Ready
        );

        let pod = |status: Value| json!({"apiVersion": "v1", "kind": "Pod", "status": status});
        let starting =
            json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]});
        assert!(matches!(of_object(&pod(starting)), Health::Progressing(_)));
        let done = json!({"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]});
        assert_eq!(of_object(&pod(done)), Health::Ready);
        let evicted = json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"});
        assert_eq!(
            of_object(&pod(evicted)),
            Health::Failed("Evicted: low on memory".into())
        );
    }
}
