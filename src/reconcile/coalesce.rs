//! When a status write may wait (pure, no client required).
//!
//! A push to a running environment used to cost five status writes of the same object (the
//! phase going to `Deploying`, each object's progress, then `Ready`) and an Event for each
//! phase. Progress that nobody can act on is coalesced instead:
//!
//! * a rollout of a new commit to an environment that was `Ready` is not announced for its
//!   first [`ROLLOUT_GRACE`]: most finish within it, and then the one write is `Ready` at the
//!   new commit (the PR comment changes once, too). A slower rollout is written as `Deploying`
//!   once the grace is over;
//! * while an environment stays in the same in-progress phase for the same reason, changes in
//!   the progress detail (which object, how many replicas) are written at most once per
//!   [`PROGRESS_INTERVAL`].
//!
//! Everything else is written at once: a new phase other than these, a failure, a URL, a
//! commit waiting for its checks, the first status of an environment. The status still holds
//! `observedGeneration`, so tools that follow the kstatus convention see a pushed environment
//! as in progress before its status is written.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::model::crd::{Phase, PreviewEnvironmentStatus};

/// How long a rollout of a new commit may run before its `Deploying` status is written.
pub const ROLLOUT_GRACE: Duration = Duration::from_secs(5);
/// How often progress within one phase is written.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// How long writing `next` over `previous` may wait, or `None` to write it now.
/// `since_last_write` is how long ago this process last wrote the environment's status.
pub fn write_can_wait(
    previous: Option<&PreviewEnvironmentStatus>,
    next: &PreviewEnvironmentStatus,
    since_last_write: Option<Duration>,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let previous = previous?;
    if !matches!(next.phase, Phase::Deploying | Phase::Seeding) || !same_outlook(previous, next) {
        return None;
    }
    if previous.phase == Phase::Ready {
        let requested_at = next.timings.as_ref()?.requested_at;
        let since_push = (now - requested_at).to_std().ok()?;
        return ROLLOUT_GRACE
            .checked_sub(since_push)
            .filter(|d| !d.is_zero());
    }
    let same_step = previous.phase == next.phase && ready_reason(previous) == ready_reason(next);
    if !same_step {
        return None;
    }
    PROGRESS_INTERVAL
        .checked_sub(since_last_write?)
        .filter(|d| !d.is_zero())
}

/// Whether what a reader of the status acts on, besides the phase and its progress, is the
/// same: the deployed commit, the URL, the namespace, the commit waiting for its checks, the
/// queue; and what the status remembers for previewd itself: the replica counts from before
/// sleep (the next reconcile reads them back; scaled to zero, the live counts are gone).
fn same_outlook(previous: &PreviewEnvironmentStatus, next: &PreviewEnvironmentStatus) -> bool {
    previous.deployed_sha == next.deployed_sha
        && previous.url == next.url
        && previous.namespace == next.namespace
        && previous.waiting == next.waiting
        && previous.queue_position == next.queue_position
        && previous.replicas_before_sleep == next.replicas_before_sleep
}

fn ready_reason(status: &PreviewEnvironmentStatus) -> Option<&str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{Condition, Timings};

    fn status(phase: Phase, reason: &str, requested_at: DateTime<Utc>) -> PreviewEnvironmentStatus {
        PreviewEnvironmentStatus {
            phase,
            deployed_sha: Some("a".repeat(40)),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: if phase == Phase::Ready {
                    "True"
                } else {
                    "False"
                }
                .into(),
                reason: reason.into(),
                message: format!("{reason} message"),
                last_transition_time: requested_at,
            }],
            timings: Some(Timings {
                sha: "b".repeat(40),
                requested_at,
                ready_at: None,
                seconds_to_ready: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_rollout_of_a_ready_environment_waits_out_the_grace() {
        let pushed = Utc::now();
        let ready = status(Phase::Ready, "Ready", pushed);
        let deploying = status(Phase::Deploying, "Deploying", pushed);
        let one_second_later = pushed + chrono::TimeDelta::seconds(1);
        assert_eq!(
            write_can_wait(Some(&ready), &deploying, None, one_second_later),
            Some(Duration::from_secs(4))
        );
        let later = pushed + chrono::TimeDelta::seconds(6);
        assert_eq!(write_can_wait(Some(&ready), &deploying, None, later), None);
    }

    #[test]
    fn progress_within_a_step_is_written_once_per_interval() {
        let pushed = Utc::now() - chrono::TimeDelta::minutes(5);
        let before = status(Phase::Deploying, "Deploying", pushed);
        let mut after = before.clone();
        after.conditions[0].message = "waiting for wave 1".into();
        let now = Utc::now();
        let recent = Some(Duration::from_secs(3));
        assert_eq!(
            write_can_wait(Some(&before), &after, recent, now),
            Some(Duration::from_secs(7))
        );
        let long_ago = Some(Duration::from_secs(11));
        assert_eq!(write_can_wait(Some(&before), &after, long_ago, now), None);
        // Not written by this process yet (a restart): written now.
        assert_eq!(write_can_wait(Some(&before), &after, None, now), None);
    }

    #[test]
    fn outcomes_and_what_readers_act_on_are_written_at_once() {
        let now = Utc::now();
        let ready = status(Phase::Ready, "Ready", now);
        let deploying = status(Phase::Deploying, "Deploying", now);
        let recent = Some(Duration::from_secs(1));
        // An outcome.
        for phase in [Phase::Ready, Phase::Degraded, Phase::Sleeping] {
            let next = status(phase, phase.as_str(), now);
            assert_eq!(write_can_wait(Some(&deploying), &next, recent, now), None);
        }
        // A first status.
        assert_eq!(write_can_wait(None, &deploying, recent, now), None);
        // A new step: the seeds start.
        let seeding = status(Phase::Seeding, "Seeding", now);
        assert_eq!(
            write_can_wait(Some(&deploying), &seeding, recent, now),
            None
        );
        // Going to sleep: the replica counts to restore must be kept before they are gone.
        let mut falling_asleep = deploying.clone();
        falling_asleep.replicas_before_sleep = [("Deployment/web".to_string(), 3)].into();
        assert_eq!(
            write_can_wait(Some(&ready), &falling_asleep, recent, now),
            None
        );
        // A URL, or a commit waiting for its checks, changes.
        let mut routed = deploying.clone();
        routed.url = Some("https://pr-1.preview.example.com".into());
        assert_eq!(write_can_wait(Some(&ready), &routed, recent, now), None);
        // A rollout of a Ready environment that nobody pushed (a pod crashed): said at once.
        let hour_old = status(
            Phase::Deploying,
            "Deploying",
            now - chrono::TimeDelta::hours(1),
        );
        assert_eq!(write_can_wait(Some(&ready), &hour_old, recent, now), None);
        // A push stamped in the future (a skewed clock) never holds a write back.
        let future = status(
            Phase::Deploying,
            "Deploying",
            now + chrono::TimeDelta::hours(1),
        );
        assert_eq!(write_can_wait(Some(&ready), &future, recent, now), None);
    }
}
