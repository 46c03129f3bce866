//! Where an environment's routes are while it sleeps and while it wakes, when previewd's wake
//! gate answers for sleeping hosts (`--gate-listen`).
//!
//! The operator points one wildcard route for the URL domain at the gate (an Ingress rule for
//! `*.preview.example.com`, an HTTPRoute with that hostname). Ingress controllers and Gateway
//! implementations alike prefer an exact host to a wildcard, so an awake environment's own route
//! wins and the gate only sees hosts that nobody else routes. Asleep, an environment's routes
//! for its host are left out of the plan (pruning deletes them), so its requests fall through to
//! the gate, which wakes it. Waking, they come back in a wave after every other object: the next
//! wave starts only once the earlier ones are healthy, so the first request the app gets finds
//! its workloads ready, and until then the gate keeps answering with its waiting page.

use super::render::RenderedObject;
use super::routes::Route;
use chrono::{DateTime, Utc};

use crate::model::crd::{Phase, PreviewEnvironment};

/// Where the environment is between asleep and awake, as far as its routes care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Awake and not waking: routes stay where the template put them.
    Awake,
    /// `spec.sleep`: its routes are withdrawn.
    Asleep,
    /// Woken but not `Ready` yet: its routes come last.
    Waking,
}

/// How long a waking environment's routes wait for the rest to be healthy. After that (or once
/// it is `Degraded`) they come back in their own wave, so that what runs can be reached and
/// looked at; the gate would otherwise answer "starting" for as long as a workload fails.
pub const WAKING_ROUTES_WAIT: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// The stage of `environment` at `now`; always [`Stage::Awake`] without a gate
/// (`gate_answers` false): then nothing would answer a sleeping host, and its routes stay as
/// they were.
pub fn stage_of(environment: &PreviewEnvironment, gate_answers: bool, now: DateTime<Utc>) -> Stage {
    if !gate_answers {
        return Stage::Awake;
    }
    if environment.spec.sleep {
        return Stage::Asleep;
    }
    let Some(status) = environment.status.as_ref() else {
        return Stage::Awake;
    };
    let waited_too_long = status
        .waking_since
        .is_some_and(|since| now.signed_duration_since(since) >= WAKING_ROUTES_WAIT);
    let waking = match status.phase {
        Phase::Sleeping => true,
        Phase::Degraded => false,
        _ => status.waking_since.is_some() && !waited_too_long,
    };
    if waking { Stage::Waking } else { Stage::Awake }
}

/// Withdraws `routes` from `objects`, or moves them after every other wave, as `stage` says.
pub fn place(objects: &mut Vec<RenderedObject>, routes: &[Route], stage: Stage) {
    let is_route = |object: &RenderedObject| {
        routes
            .iter()
            .any(|route| route.kind == object.kind() && route.name == object.name())
    };
    match stage {
        Stage::Awake => {}
        Stage::Asleep => objects.retain(|object| !is_route(object)),
        Stage::Waking => {
            let last = objects
                .iter()
                .filter(|object| !is_route(object))
                .map(|object| object.wave)
                .max()
                .unwrap_or(0);
            let after = last.saturating_add(1);
            for object in objects.iter_mut().filter(|object| is_route(object)) {
                object.wave = object.wave.max(after);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: &str, name: &str, wave: i32) -> RenderedObject {
        let api_version = match kind {
            "Ingress" => "networking.k8s.io/v1",
            "HTTPRoute" => "gateway.networking.k8s.io/v1",
            _ => "apps/v1",
        };
        RenderedObject {
            manifest: "app.yaml".into(),
            wave,
            seed: None,
            object: json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}),
        }
    }

    fn routes() -> Vec<Route> {
        ["Ingress", "HTTPRoute"]
            .iter()
            .map(|kind| Route {
                kind: kind.to_string(),
                name: "web".into(),
            })
            .collect()
    }

    fn plan() -> Vec<RenderedObject> {
        vec![
            object("Deployment", "web", 0),
            object("Ingress", "web", 0),
            object("Deployment", "worker", 2),
            object("HTTPRoute", "web", 1),
            // Another Ingress of the environment that does not route its host stays.
            object("Ingress", "docs", 0),
        ]
    }

    fn listed(objects: &[RenderedObject]) -> Vec<String> {
        objects
            .iter()
            .map(|o| format!("{}/{}@{}", o.kind(), o.name(), o.wave))
            .collect()
    }

    #[test]
    fn asleep_the_routes_for_the_host_are_withdrawn_and_nothing_else() {
        let mut objects = plan();
        place(&mut objects, &routes(), Stage::Asleep);
        assert_eq!(
            listed(&objects),
            ["Deployment/web@0", "Deployment/worker@2", "Ingress/docs@0"]
        );
    }

    #[test]
    fn waking_the_routes_come_after_every_other_wave() {
        let mut objects = plan();
        place(&mut objects, &routes(), Stage::Waking);
        assert_eq!(
            listed(&objects),
            [
                "Deployment/web@0",
                "Ingress/web@3",
                "Deployment/worker@2",
                "HTTPRoute/web@3",
                "Ingress/docs@0"
            ]
        );
    }

    #[test]
    fn awake_nothing_moves() {
        let mut objects = plan();
        place(&mut objects, &routes(), Stage::Awake);
        assert_eq!(listed(&objects), listed(&plan()));
    }

    fn environment(sleep: bool, phase: Phase, waking_minutes: Option<i64>) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new("pr-2", Default::default());
        environment.spec.sleep = sleep;
        environment.status = Some(crate::model::crd::PreviewEnvironmentStatus {
            phase,
            waking_since: waking_minutes.map(|m| now() - chrono::TimeDelta::minutes(m)),
            ..Default::default()
        });
        environment
    }

    fn now() -> DateTime<Utc> {
        "2026-11-26T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn routes_wait_while_waking_but_not_for_a_failure_or_longer_than_the_limit() {
        let stage = |e: &PreviewEnvironment| stage_of(e, true, now());
        assert_eq!(stage(&environment(true, Phase::Ready, None)), Stage::Asleep);
        assert_eq!(
            stage(&environment(false, Phase::Sleeping, None)),
            Stage::Waking,
            "just woken"
        );
        assert_eq!(
            stage(&environment(false, Phase::Queued, Some(1))),
            Stage::Waking,
            "woken into the queue"
        );
        assert_eq!(
            stage(&environment(false, Phase::Deploying, Some(4))),
            Stage::Waking
        );
        assert_eq!(
            stage(&environment(false, Phase::Deploying, Some(5))),
            Stage::Awake,
            "waited long enough"
        );
        assert_eq!(
            stage(&environment(false, Phase::Degraded, Some(1))),
            Stage::Awake,
            "failing: reachable"
        );
        assert_eq!(stage(&environment(false, Phase::Ready, None)), Stage::Awake);
        assert_eq!(
            stage_of(&environment(true, Phase::Ready, None), false, now()),
            Stage::Awake,
            "no gate"
        );
    }
}
