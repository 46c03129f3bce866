//! Health (pure): an object's observed state → Ready, Progressing or Failed; and the
//! environment's phase from its objects.

use serde_json::Value;

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

/// Health of one object from what the API server holds: Deployments and StatefulSets must be
/// Available with every replica updated and ready for the current generation, Jobs Complete;
/// anything else is healthy once it exists.
pub fn of_object(kind: &str, object: &Value) -> Health {
    match kind {
        "Deployment" => deployment(object),
        "StatefulSet" => stateful_set(object),
        "Job" => job(object),
        _ => Health::Ready,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deployment_is_ready_only_when_available_for_the_current_generation() {
        let mut d = json!({"metadata": {"generation": 2}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                       "conditions": [{"type": "Available", "status": "True"}]}});
        assert_eq!(of_object("Deployment", &d), Health::Ready);
        d["status"]["observedGeneration"] = json!(1);
        assert!(matches!(
            of_object("Deployment", &d),
            Health::Progressing(_)
        ));
        d["status"]["observedGeneration"] = json!(2);
        d["status"]["readyReplicas"] = json!(1);
        assert_eq!(
            of_object("Deployment", &d),
            Health::Progressing("1/2 replicas ready".into())
        );
        d["status"]["conditions"] = json!([{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}]);
        assert_eq!(
            of_object("Deployment", &d),
            Health::Failed("too slow".into())
        );
    }

    #[test]
    fn job_complete_failed_or_running() {
        let complete = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(of_object("Job", &complete), Health::Ready);
        let failed = json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}});
        assert_eq!(
            of_object("Job", &failed),
            Health::Failed(
                "BackoffLimitExceeded: Job has reached the specified backoff limit".into()
            )
        );
        assert!(matches!(
            of_object("Job", &json!({})),
            Health::Progressing(_)
        ));
    }

    #[test]
    fn other_kinds_are_ready_when_present() {
        assert_eq!(of_object("ConfigMap", &json!({})), Health::Ready);
        let sts = json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {"observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 1}});
        assert_eq!(of_object("StatefulSet", &sts), Health::Ready);
    }
}
