//! Who may run (pure): a template's cap on running environments, the queue beyond it, and
//! fork pull requests that wait for a maintainer's approval.
//!
//! The decision is a function of the environments the controller's cache holds, so concurrent
//! reconciles agree on it: environments that wait for a slot are ordered by creation time (then
//! name), and the first ones fill the free slots. Two reconciles working from the same cache
//! therefore never both take the last slot, even before either has written its status.

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::model::crd::{ForkPolicy, Phase, PreviewEnvironment, PreviewTemplate};

/// Whether an environment may deploy now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// `position` 1 is the next to start; `cap` is the template's `maxEnvironments`.
    Queued {
        position: u32,
        cap: u32,
    },
}

/// A fork pull request the template deploys only once a maintainer approved its head commit.
pub fn awaits_approval(environment: &PreviewEnvironment, template: &PreviewTemplate) -> bool {
    let source = &environment.spec.source;
    source.fork
        && template.spec.triggers.fork_policy != ForkPolicy::Allow
        && environment.spec.approved_sha.as_deref() != Some(source.head_sha.as_str())
}

/// Runs (or is being deployed) and so takes one of the template's slots. Sleeping, queued and
/// deleted environments take none, nor does a pending one that never ran. A fork PR whose new
/// commit waits for approval (`Pending`, with a namespace) still runs its approved commit, and
/// keeps its slot.
pub fn holds_slot(environment: &PreviewEnvironment) -> bool {
    environment.metadata.deletion_timestamp.is_none()
        && !environment.spec.sleep
        && environment.status.as_ref().is_some_and(|s| {
            matches!(
                s.phase,
                Phase::Deploying | Phase::Seeding | Phase::Ready | Phase::Degraded
            ) || (s.phase == Phase::Pending && s.namespace.is_some())
        })
}

fn wants_slot(environment: &PreviewEnvironment, template: &PreviewTemplate) -> bool {
    environment.metadata.deletion_timestamp.is_none()
        && !environment.spec.sleep
        && !holds_slot(environment)
        && !awaits_approval(environment, template)
}

fn created(environment: &PreviewEnvironment) -> DateTime<Utc> {
    environment
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0))
        // Not created yet as far as the cache knows: the newest of all.
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether `environment` may deploy, given every environment of its template (`peers`, from
/// the cache; `environment` itself may or may not be among them).
pub fn admission(
    environment: &PreviewEnvironment,
    peers: &[&PreviewEnvironment],
    template: &PreviewTemplate,
) -> Admission {
    let Some(cap) = template.spec.lifecycle.max_environments else {
        return Admission::Run;
    };
    if holds_slot(environment) {
        return Admission::Run;
    }
    let name = environment.name_any();
    let others = peers.iter().copied().filter(|p| p.name_any() != name);
    let running = others.clone().filter(|p| holds_slot(p)).count();
    let free = usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .saturating_sub(running);
    let mut waiting: Vec<&PreviewEnvironment> = others
        .filter(|p| wants_slot(p, template))
        .chain(std::iter::once(environment))
        .collect();
    waiting.sort_by_key(|p| (created(p), p.name_any()));
    let index = waiting
        .iter()
        .position(|p| p.name_any() == name)
        .unwrap_or(waiting.len());
    if index < free {
        Admission::Run
    } else {
        Admission::Queued {
            position: u32::try_from(index - free + 1).unwrap_or(u32::MAX),
            cap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{
        PreviewEnvironmentSpec, PreviewEnvironmentStatus, PreviewTemplateSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn template(cap: Option<u32>) -> PreviewTemplate {
        let mut spec = PreviewTemplateSpec::default();
        spec.lifecycle.max_environments = cap;
        spec.triggers.fork_policy = ForkPolicy::RequireApproval;
        PreviewTemplate::new("web", spec)
    }

    fn environment(name: &str, minute: i64, phase: Option<Phase>) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new(name, PreviewEnvironmentSpec::default());
        environment.spec.source.head_sha = "abc".into();
        let at: DateTime<Utc> = "2026-11-22T10:00:00Z".parse().unwrap();
        let at = at + chrono::TimeDelta::minutes(minute);
        environment.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(at.timestamp()).unwrap(),
        ));
        environment.status = phase.map(|phase| PreviewEnvironmentStatus {
            phase,
            ..Default::default()
        });
        environment
    }

    #[test]
    fn a_fork_whose_new_commit_awaits_approval_keeps_its_slot_while_the_old_one_runs() {
        let template = template(Some(1));
        let mut still_running = environment("a", 0, Some(Phase::Pending));
        still_running.status.as_mut().unwrap().namespace = Some("preview-a".into());
        let never_ran = environment("b", 1, Some(Phase::Pending));
        let waiting = environment("c", 2, None);
        assert!(holds_slot(&still_running));
        assert!(!holds_slot(&never_ran));
        assert_eq!(
            admission(&waiting, &[&still_running, &waiting], &template),
            Admission::Queued {
                position: 1,
                cap: 1
            }
        );
    }

    #[test]
    fn without_a_cap_everything_runs() {
        let a = environment("a", 0, None);
        assert_eq!(admission(&a, &[&a], &template(None)), Admission::Run);
    }

    #[test]
    fn beyond_the_cap_environments_queue_oldest_first() {
        let template = template(Some(2));
        let a = environment("a", 0, Some(Phase::Ready));
        let b = environment("b", 1, Some(Phase::Deploying));
        let c = environment("c", 2, None);
        let d = environment("d", 3, Some(Phase::Queued));
        let all = [&a, &b, &c, &d];
        assert_eq!(admission(&a, &all, &template), Admission::Run);
        assert_eq!(
            admission(&c, &all, &template),
            Admission::Queued {
                position: 1,
                cap: 2
            }
        );
        assert_eq!(
            admission(&d, &all, &template),
            Admission::Queued {
                position: 2,
                cap: 2
            }
        );
    }

    #[test]
    fn a_slot_freed_by_deletion_or_sleep_goes_to_the_oldest_waiting() {
        let template = template(Some(2));
        let mut a = environment("a", 0, Some(Phase::Ready));
        let b = environment("b", 1, Some(Phase::Ready));
        let c = environment("c", 2, Some(Phase::Queued));
        let d = environment("d", 3, Some(Phase::Queued));
        a.metadata.deletion_timestamp = a.metadata.creation_timestamp.clone();
        let all = [&a, &b, &c, &d];
        assert_eq!(admission(&c, &all, &template), Admission::Run);
        assert!(matches!(
            admission(&d, &all, &template),
            Admission::Queued { position: 1, .. }
        ));
        let mut a = environment("a", 0, Some(Phase::Ready));
        a.spec.sleep = true;
        let all = [&a, &b, &c, &d];
        assert_eq!(admission(&c, &all, &template), Admission::Run);
        // Waking `a` while the slots are full queues it behind the others.
        let mut a = environment("a", 0, Some(Phase::Sleeping));
        a.spec.sleep = false;
        let c = environment("c", 2, Some(Phase::Ready));
        let all = [&a, &b, &c, &d];
        assert!(matches!(
            admission(&a, &all, &template),
            Admission::Queued { position: 1, .. }
        ));
    }

    #[test]
    fn two_waiting_environments_never_both_take_the_last_slot() {
        let template = template(Some(1));
        let a = environment("a", 0, None);
        let b = environment("b", 1, None);
        let all = [&a, &b];
        assert_eq!(admission(&a, &all, &template), Admission::Run);
        assert!(matches!(
            admission(&b, &all, &template),
            Admission::Queued { position: 1, .. }
        ));
    }

    #[test]
    fn fork_environments_wait_for_approval_of_their_head_commit() {
        let template = template(None);
        let mut fork = environment("f", 0, None);
        fork.spec.source.fork = true;
        assert!(awaits_approval(&fork, &template));
        fork.spec.approved_sha = Some("abc".into());
        assert!(!awaits_approval(&fork, &template));
        fork.spec.source.head_sha = "def".into();
        assert!(
            awaits_approval(&fork, &template),
            "a new push needs a new approval"
        );
        // An unapproved fork takes no queue position.
        let capped = {
            let mut t = template.clone();
            t.spec.lifecycle.max_environments = Some(1);
            t
        };
        let other = environment("o", 1, None);
        assert_eq!(admission(&other, &[&fork, &other], &capped), Admission::Run);
    }
}
