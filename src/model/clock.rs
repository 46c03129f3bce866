//! The lifecycle clock (pure): when an environment goes idle and when it is too old, computed
//! once for the sweep that acts on it (`lifecycle::rules`) and the PR comment that announces it
//! (`forge::comment`, "Expires …"), so that the two never disagree.
//!
//! * idle: `lifecycle.idleTimeout` after the last activity (a push, a command, a request), or
//!   after creation when there has been none;
//! * too old: `lifecycle.maxAge` after creation;
//! * `/preview extend` (`spec.keepUntil`) holds both back until then.

use chrono::{DateTime, TimeDelta, Utc};

use super::crd::{IdleAction, Lifecycle, PreviewEnvironment, PreviewTemplate};
use super::durations::template_duration;

/// When an environment's lifecycle rules fall due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// When it counts as idle (`None`: no idle timeout, or a time beyond what a date holds).
    pub idle_at: Option<DateTime<Utc>>,
    /// When it is too old.
    pub too_old_at: Option<DateTime<Utc>>,
    /// `/preview extend`: neither rule applies before this.
    pub kept_until: Option<DateTime<Utc>>,
}

impl Deadlines {
    /// Whether the idle rule applies at `now`.
    pub fn idle(&self, now: DateTime<Utc>) -> bool {
        !self.extended(now) && self.idle_at.is_some_and(|at| now > at)
    }

    /// Whether the age rule applies at `now`.
    pub fn too_old(&self, now: DateTime<Utc>) -> bool {
        !self.extended(now) && self.too_old_at.is_some_and(|at| now > at)
    }

    fn extended(&self, now: DateTime<Utc>) -> bool {
        self.kept_until.is_some_and(|until| until > now)
    }

    /// When the environment goes if nothing happens: the earlier of the two deadlines
    /// (idleness only when `idle_removes`: an idle environment that sleeps does not go), never
    /// before it was extended to.
    pub fn expiry(&self, idle_removes: bool) -> Option<DateTime<Utc>> {
        let idle = self.idle_at.filter(|_| idle_removes);
        let expiry = match (idle, self.too_old_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (expiry, self.kept_until) {
            (Some(expiry), Some(kept)) => Some(expiry.max(kept)),
            (expiry, _) => expiry,
        }
    }
}

/// When the environment was created, to the second.
pub fn created(environment: &PreviewEnvironment) -> Option<DateTime<Utc>> {
    let created = environment.metadata.creation_timestamp.as_ref()?;
    DateTime::<Utc>::from_timestamp(created.0.as_second(), 0)
}

/// The last sign of life: the last push, command or request, else creation.
pub fn last_activity(environment: &PreviewEnvironment) -> Option<DateTime<Utc>> {
    environment.spec.last_activity.or(created(environment))
}

/// When the environment expires if nothing happens (the PR comment's "Expires …"): the
/// sweep's own deadlines, idleness counting only when the template deletes idle
/// environments. A time beyond what a date can hold never expires.
pub fn expires_at(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
) -> Option<DateTime<Utc>> {
    let lifecycle = &template.spec.lifecycle;
    let idle_removes = lifecycle.idle_action == IdleAction::Delete;
    deadlines(environment, lifecycle).expiry(idle_removes)
}

/// The deadlines of `environment` under `lifecycle`.
pub fn deadlines(environment: &PreviewEnvironment, lifecycle: &Lifecycle) -> Deadlines {
    let after =
        |from: Option<DateTime<Utc>>, length: Option<TimeDelta>| from?.checked_add_signed(length?);
    Deadlines {
        idle_at: after(
            last_activity(environment),
            template_duration(lifecycle.idle_timeout.as_deref()),
        ),
        too_old_at: after(
            created(environment),
            template_duration(lifecycle.max_age.as_deref()),
        ),
        kept_until: environment.spec.keep_until,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn environment(created: &str, active: Option<&str>) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new("pr-2", Default::default());
        let seconds = at(created).timestamp();
        environment.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap(),
            ));
        environment.spec.last_activity = active.map(at);
        environment
    }

    fn lifecycle() -> Lifecycle {
        Lifecycle {
            idle_timeout: Some("72h".into()),
            max_age: Some("14d".into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_environment_without_activity_goes_idle_from_its_creation_and_its_comment_says_when() {
        let quiet = environment("2026-11-20T10:00:00Z", None);
        let clock = deadlines(&quiet, &lifecycle());
        assert_eq!(clock.idle_at, Some(at("2026-11-23T10:00:00Z")));
        assert!(clock.idle(at("2026-11-23T10:00:01Z")));
        assert!(!clock.idle(at("2026-11-23T10:00:00Z")));
        assert_eq!(
            clock.expiry(true),
            Some(at("2026-11-23T10:00:00Z")),
            "the comment's expiry is the sweep's"
        );
        assert_eq!(
            clock.expiry(false),
            Some(at("2026-12-04T10:00:00Z")),
            "sleeping: only age removes it"
        );
    }

    #[test]
    fn activity_moves_the_idle_deadline_and_an_extension_holds_both() {
        let mut busy = environment("2026-11-20T10:00:00Z", Some("2026-12-03T10:00:00Z"));
        let clock = deadlines(&busy, &lifecycle());
        assert_eq!(
            clock.expiry(true),
            Some(at("2026-12-04T10:00:00Z")),
            "age comes first"
        );
        assert!(clock.too_old(at("2026-12-04T10:00:01Z")));
        busy.spec.keep_until = Some(at("2026-12-10T00:00:00Z"));
        let kept = deadlines(&busy, &lifecycle());
        assert!(
            !kept.too_old(at("2026-12-05T00:00:00Z")) && !kept.idle(at("2026-12-07T00:00:00Z"))
        );
        assert_eq!(kept.expiry(true), Some(at("2026-12-10T00:00:00Z")));
    }

    #[test]
    fn no_timeout_no_deadline_and_a_time_beyond_any_date_never_falls_due() {
        let quiet = environment("2026-11-20T10:00:00Z", None);
        assert_eq!(
            deadlines(&quiet, &Lifecycle::default()),
            Deadlines::default()
        );
        let forever = Lifecycle {
            idle_timeout: Some("99999999999d".into()),
            ..Default::default()
        };
        assert_eq!(deadlines(&quiet, &forever).idle_at, None);
    }
}
