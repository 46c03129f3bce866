//! Who may run (pure): a template's cap on running environments, the queue beyond it, and
//! fork pull requests that wait for a maintainer's approval.
//!
//! The decision is a function of the environments the controller's cache holds, so concurrent
//! reconciles agree on it, and two of them never both take the last slot, even before either
//! has written its status.
//!
//! What order is fair: slots are for the work of pull requests' authors. An environment whose
//! author made it want one (a new pull request, a push, a writer's command) is an author's
//! claim; one awake only because a request reached its host (the wake gate, which anyone who
//! can reach a preview URL may cause, [`Claim::Visitor`]) is a visitor's. Authors' claims go
//! first, and each kind is served in the order it was made: by when the environment began to
//! want a slot (created, or woken), never by its age, which let an outsider's wake of an old
//! pull request go before a new one. And a running visitor's claim yields its slot to a waiting
//! author's: the waiting environment's reconcile puts the visitor (the one woken longest ago)
//! back to sleep, and a later request may wake it again, into the queue behind the authors.

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::model::crd::{ForkPolicy, Phase, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::ANNOTATION_WOKEN_BY_REQUEST;

/// Whether an environment may deploy now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// `position` 1 is the next to start; `cap` is the template's `maxEnvironments`.
    /// `displaces`: a running environment that holds its slot only for a visitor, which this
    /// one (an author's) may have: put to sleep, it frees the slot.
    Queued {
        position: u32,
        cap: u32,
        displaces: Option<String>,
    },
}

/// Why an environment wants (or holds) a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    /// Its author's work: created for a pull request or branch, pushed to, or acted on by a
    /// writer's command since it was woken.
    Author,
    /// A request woke it (the wake gate) and nothing of its author's came since: the head is
    /// still the commit the gate woke.
    Visitor,
}

/// The claim `environment` makes.
pub fn claim(environment: &PreviewEnvironment) -> Claim {
    let woken_at = environment.annotations().get(ANNOTATION_WOKEN_BY_REQUEST);
    match woken_at {
        Some(head) if *head == environment.spec.source.head_sha => Claim::Visitor,
        _ => Claim::Author,
    }
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

/// When `environment` began to want a slot: its creation, or, once it ran before, its waking
/// (`status.wakingSince`; before the reconcile wrote that, the activity that woke it).
fn since(environment: &PreviewEnvironment) -> DateTime<Utc> {
    let status = environment.status.as_ref();
    let ran_before = status.is_some_and(|s| s.deployed_sha.is_some());
    let woken = status
        .and_then(|s| s.waking_since)
        .or(environment.spec.last_activity);
    match woken {
        Some(at) if ran_before => at,
        _ => created(environment),
    }
}

/// The order of service: authors' claims first, then by when each was made, then by name.
fn turn(environment: &PreviewEnvironment) -> (Claim, DateTime<Utc>, String) {
    (
        claim(environment),
        since(environment),
        environment.name_any(),
    )
}

/// True when [`admission`] is `Run` whoever the peers are: the template caps nothing, or the
/// environment already holds its slot. Callers need not gather the peers then.
pub fn runs_whatever_its_peers(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
) -> bool {
    template.spec.lifecycle.max_environments.is_none() || holds_slot(environment)
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
    if runs_whatever_its_peers(environment, template) {
        return Admission::Run;
    }
    let name = environment.name_any();
    let others = peers.iter().copied().filter(|p| p.name_any() != name);
    let running: Vec<&PreviewEnvironment> = others.clone().filter(|p| holds_slot(p)).collect();
    let free = usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .saturating_sub(running.len());
    let mut waiting: Vec<&PreviewEnvironment> = others
        .filter(|p| wants_slot(p, template))
        .chain(std::iter::once(environment))
        .collect();
    waiting.sort_by_cached_key(|p| turn(p));
    let index = waiting
        .iter()
        .position(|p| p.name_any() == name)
        .unwrap_or(waiting.len());
    if index < free {
        return Admission::Run;
    }
    Admission::Queued {
        position: u32::try_from(index - free + 1).unwrap_or(u32::MAX),
        cap,
        displaces: displaced_by(environment, index - free, &running),
    }
}

/// The running visitor's claim that the `rank`-th author's claim beyond the free slots takes
/// the slot of: visitors woken longest ago go first. Authors come before visitors in the
/// queue, so every reconcile that computes this from the same cache pairs them alike.
fn displaced_by(
    environment: &PreviewEnvironment,
    rank: usize,
    running: &[&PreviewEnvironment],
) -> Option<String> {
    if claim(environment) != Claim::Author {
        return None;
    }
    let mut visitors: Vec<&PreviewEnvironment> = running
        .iter()
        .copied()
        .filter(|p| claim(p) == Claim::Visitor)
        .collect();
    visitors.sort_by_cached_key(|p| (since(p), p.name_any()));
    visitors.get(rank).map(|p| p.name_any())
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
                cap: 1,
                displaces: None,
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
                cap: 2,
                displaces: None,
            }
        );
        assert_eq!(
            admission(&d, &all, &template),
            Admission::Queued {
                position: 2,
                cap: 2,
                displaces: None,
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
        // Waking `a` (it ran before) while the slots are full queues it behind those that
        // waited before it woke, however old it is.
        let mut a = ran_before(environment("a", 0, Some(Phase::Sleeping)), 10);
        a.spec.sleep = false;
        let c = environment("c", 2, Some(Phase::Ready));
        let all = [&a, &b, &c, &d];
        assert!(matches!(
            admission(&a, &all, &template),
            Admission::Queued { position: 2, .. }
        ));
        assert!(matches!(
            admission(&d, &all, &template),
            Admission::Queued { position: 1, .. }
        ));
    }

    /// `environment`, deployed before and woken (or active) at `minute`.
    fn ran_before(mut environment: PreviewEnvironment, minute: i64) -> PreviewEnvironment {
        let start: DateTime<Utc> = "2026-11-22T10:00:00Z".parse().unwrap();
        environment.spec.last_activity = Some(start + chrono::TimeDelta::minutes(minute));
        let status = environment.status.get_or_insert_with(Default::default);
        status.deployed_sha = Some(environment.spec.source.head_sha.clone());
        environment
    }

    /// `environment` as the wake gate woke it: at its head, at `minute`.
    fn woken_by_request(environment: PreviewEnvironment, minute: i64) -> PreviewEnvironment {
        let mut environment = ran_before(environment, minute);
        let head = environment.spec.source.head_sha.clone();
        environment
            .annotations_mut()
            .insert(ANNOTATION_WOKEN_BY_REQUEST.into(), head);
        environment
    }

    #[test]
    fn a_visitors_wake_waits_behind_authors_and_gives_its_slot_up_to_one() {
        let template = template(Some(2));
        let author = ran_before(environment("a", 0, Some(Phase::Ready)), 1);
        let visitor = woken_by_request(environment("v", 1, Some(Phase::Ready)), 5);
        let new_pr = environment("n", 10, None);
        let all = [&author, &visitor, &new_pr];
        assert_eq!(claim(&visitor), Claim::Visitor);
        assert_eq!(
            admission(&new_pr, &all, &template),
            Admission::Queued {
                position: 1,
                cap: 2,
                displaces: Some("v".into()),
            },
            "the new pull request takes the visitor's slot"
        );
        let mut asleep = visitor.clone();
        asleep.spec.sleep = true;
        let all = [&author, &asleep, &new_pr];
        assert_eq!(admission(&new_pr, &all, &template), Admission::Run);
        // Woken again meanwhile, the visitor waits behind every author, however old it is.
        let mut again = woken_by_request(environment("v", 1, Some(Phase::Sleeping)), 20);
        again.spec.sleep = false;
        let later_pr = environment("m", 30, None);
        let full = [&author, &new_pr_running(), &again, &later_pr];
        assert!(matches!(
            admission(&later_pr, &full, &template),
            Admission::Queued {
                position: 1,
                displaces: None,
                ..
            }
        ));
        assert!(matches!(
            admission(&again, &full, &template),
            Admission::Queued {
                position: 2,
                displaces: None,
                ..
            }
        ));
        // A push since the wake (a new head) or a writer's command makes it its author's again.
        let mut pushed = visitor.clone();
        pushed.spec.source.head_sha = "def".into();
        assert_eq!(claim(&pushed), Claim::Author);
        let all = [&author, &pushed, &new_pr];
        assert!(matches!(
            admission(&new_pr, &all, &template),
            Admission::Queued {
                displaces: None,
                ..
            }
        ));
    }

    fn new_pr_running() -> PreviewEnvironment {
        environment("n", 10, Some(Phase::Ready))
    }

    #[test]
    fn of_two_visitors_the_one_woken_longest_ago_gives_its_slot_up_first() {
        let template = template(Some(2));
        let early = woken_by_request(environment("x", 0, Some(Phase::Ready)), 5);
        let late = woken_by_request(environment("y", 0, Some(Phase::Ready)), 9);
        let first = environment("p", 10, None);
        let second = environment("q", 11, None);
        let all = [&late, &early, &first, &second];
        let displaced = |environment| match admission(environment, &all, &template) {
            Admission::Queued { displaces, .. } => displaces,
            Admission::Run => None,
        };
        assert_eq!(displaced(&first).as_deref(), Some("x"));
        assert_eq!(displaced(&second).as_deref(), Some("y"));
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
