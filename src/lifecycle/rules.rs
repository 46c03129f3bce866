//! The sweep's decisions (pure): which environments and namespaces go, and why. The loop that
//! gathers the facts and acts on them lives in [`super::sweeper`].
//!
//! Safety first: forge facts (open PRs, existing branches) may be missing (the forge could not
//! be asked) — then no environment is removed for a forge reason. They may also be slightly
//! stale, so an environment touched within [`FORGE_GRACE`] is never removed for a forge
//! reason either. Idle and age rules need no forge and always apply.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::model::clock::{deadlines, last_activity};
use crate::model::crd::{IdleAction, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::is_hub_record;
use crate::model::metadata::{
    LABEL_ENVIRONMENT_NAMESPACE, LABEL_ENVIRONMENT_UID, LABEL_MANAGED_BY,
};

/// A forge fact younger than this may not know about a PR or branch yet.
pub const FORGE_GRACE: TimeDelta = TimeDelta::minutes(5);
/// A labelled namespace younger than this may belong to an environment the sweep's cache has
/// not seen yet.
pub const ORPHAN_GRACE: TimeDelta = TimeDelta::minutes(2);

/// Why an environment is removed (also a metric label: a static category).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    PullRequestClosed,
    BranchGone,
    Idle,
    MaxAge,
    TemplateGone,
    OrphanedNamespace,
}

impl Reason {
    /// Every reason (the deletion metric starts each at 0).
    pub const ALL: [Reason; 6] = [
        Reason::PullRequestClosed,
        Reason::BranchGone,
        Reason::Idle,
        Reason::MaxAge,
        Reason::TemplateGone,
        Reason::OrphanedNamespace,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::PullRequestClosed => "pull_request_closed",
            Reason::BranchGone => "branch_gone",
            Reason::Idle => "idle",
            Reason::MaxAge => "max_age",
            Reason::TemplateGone => "template_gone",
            Reason::OrphanedNamespace => "orphaned_namespace",
        }
    }

    /// The sentence the PR comment and the Event show.
    pub fn sentence(self) -> &'static str {
        match self {
            Reason::PullRequestClosed => "the pull request is no longer open",
            Reason::BranchGone => "the branch no longer exists",
            Reason::Idle => "it was idle longer than the template allows",
            Reason::MaxAge => "it reached the template's maximum age",
            Reason::TemplateGone => "its PreviewTemplate was deleted",
            Reason::OrphanedNamespace => "its PreviewEnvironment no longer exists",
        }
    }
}

/// What the forge says about one repository, from list calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ForgeFacts {
    pub open_pull_requests: HashSet<u64>,
    pub branches: HashSet<String>,
}

/// The sweep's verdict on one environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Delete(Reason),
    /// Scale to zero (the template's idle action is `Sleep`).
    Sleep,
}

/// Judges one environment. `template` is `None` when it is gone; `facts` is `None` when the
/// forge could not be asked in this sweep.
pub fn judge(
    environment: &PreviewEnvironment,
    template: Option<&PreviewTemplate>,
    facts: Option<&ForgeFacts>,
    now: DateTime<Utc>,
) -> Verdict {
    // A hub's record: its life is the hub's to decide (`is_hub_record`).
    if environment.metadata.deletion_timestamp.is_some() || is_hub_record(environment) {
        return Verdict::Keep;
    }
    let Some(template) = template else {
        return Verdict::Delete(Reason::TemplateGone);
    };
    let lifecycle = &template.spec.lifecycle;
    // `/preview extend` holds both deadlines back (a closed PR still removes it).
    let clock = deadlines(environment, lifecycle);
    if clock.too_old(now) {
        return Verdict::Delete(Reason::MaxAge);
    }
    let active_at = last_activity(environment);
    if let Some(facts) = facts
        && active_at.is_some_and(|at| now - at > FORGE_GRACE)
    {
        let source = &environment.spec.source;
        match source.pull_request {
            Some(number) if !facts.open_pull_requests.contains(&number) => {
                return Verdict::Delete(Reason::PullRequestClosed);
            }
            None if !facts.branches.contains(&source.branch) => {
                return Verdict::Delete(Reason::BranchGone);
            }
            _ => {}
        }
    }
    if clock.idle(now) {
        return match lifecycle.idle_action {
            IdleAction::Delete => Verdict::Delete(Reason::Idle),
            IdleAction::Sleep if environment.spec.sleep => Verdict::Keep,
            IdleAction::Sleep => Verdict::Sleep,
        };
    }
    Verdict::Keep
}

/// A namespace previewd labelled, as the sweep sees it.
#[derive(Clone, Debug)]
pub struct LabelledNamespace {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub created: Option<DateTime<Utc>>,
    pub terminating: bool,
}

/// Namespaces previewd made whose environment no longer exists. Only namespaces previewd
/// created qualify (labelled managed-by previewd, with the UID of the environment they were
/// created for): an unrelated namespace, or one from before the UID label, is never touched. With `scope` (a
/// previewd watching one namespace), only environments of that namespace are known, so only
/// their namespaces are considered.
pub fn orphaned_namespaces(
    namespaces: &[LabelledNamespace],
    environments: &[&PreviewEnvironment],
    scope: Option<&str>,
    now: DateTime<Utc>,
) -> Vec<String> {
    let existing: HashSet<&str> = environments
        .iter()
        .filter_map(|e| e.metadata.uid.as_deref())
        .collect();
    namespaces
        .iter()
        .filter(|ns| !ns.terminating)
        .filter(|ns| ns.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some("previewd"))
        .filter(|ns| ns.created.is_some_and(|at| now - at > ORPHAN_GRACE))
        .filter(|ns| {
            scope.is_none_or(|scope| {
                ns.labels
                    .get(LABEL_ENVIRONMENT_NAMESPACE)
                    .map(String::as_str)
                    == Some(scope)
            })
        })
        .filter_map(|ns| {
            let owner = ns.labels.get(LABEL_ENVIRONMENT_UID)?;
            (!owner.is_empty() && !existing.contains(owner.as_str())).then(|| ns.name.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{PreviewEnvironmentSpec, PreviewTemplateSpec, Source};
    use crate::model::metadata::LABEL_ENVIRONMENT;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn now() -> DateTime<Utc> {
        "2026-11-22T12:00:00Z".parse().unwrap()
    }

    fn template(adjust: impl FnOnce(&mut PreviewTemplateSpec)) -> PreviewTemplate {
        let mut spec = PreviewTemplateSpec::default();
        adjust(&mut spec);
        PreviewTemplate::new("web", spec)
    }

    fn environment(
        pr: Option<u64>,
        branch: &str,
        created_hours_ago: i64,
        active_hours_ago: i64,
    ) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new(
            "web-x",
            PreviewEnvironmentSpec {
                template: "web".into(),
                source: Source {
                    repository: "o/r".into(),
                    branch: branch.into(),
                    pull_request: pr,
                    head_sha: "abc".into(),
                    author: None,
                    fork: false,
                    changed_at: None,
                },
                last_activity: Some(now() - TimeDelta::hours(active_hours_ago)),
                ..Default::default()
            },
        );
        environment.metadata.namespace = Some("previews".into());
        let created = now() - TimeDelta::hours(created_hours_ago);
        environment.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created.timestamp()).unwrap(),
        ));
        environment
    }

    fn facts(prs: &[u64], branches: &[&str]) -> ForgeFacts {
        ForgeFacts {
            open_pull_requests: prs.iter().copied().collect(),
            branches: branches.iter().map(|b| b.to_string()).collect(),
        }
    }

    #[test]
    fn closed_prs_and_gone_branches_go_only_when_the_forge_was_asked() {
        let t = template(|_| {});
        let pr = environment(Some(2), "changes", 10, 1);
        assert_eq!(
            judge(&pr, Some(&t), Some(&facts(&[2], &[])), now()),
            Verdict::Keep
        );
        assert_eq!(
            judge(&pr, Some(&t), Some(&facts(&[3], &[])), now()),
            Verdict::Delete(Reason::PullRequestClosed)
        );
        assert_eq!(
            judge(&pr, Some(&t), None, now()),
            Verdict::Keep,
            "forge unavailable: nothing deleted for forge reasons"
        );
        let branch = environment(None, "release/1", 10, 1);
        assert_eq!(
            judge(&branch, Some(&t), Some(&facts(&[], &["release/1"])), now()),
            Verdict::Keep
        );
        assert_eq!(
            judge(&branch, Some(&t), Some(&facts(&[], &["main"])), now()),
            Verdict::Delete(Reason::BranchGone)
        );
    }

    #[test]
    fn a_hubs_record_is_left_to_its_hub() {
        let mut t = template(|spec| spec.lifecycle.idle_timeout = Some("1h".into()));
        t.spec.lifecycle.max_age = Some("1h".into());
        let mut record = environment(Some(2), "changes", 10, 5);
        let before = judge(&record, Some(&t), Some(&facts(&[], &[])), now());
        assert_ne!(
            before,
            Verdict::Keep,
            "as an environment of its own, it would go"
        );
        record.metadata.labels = Some(
            [(
                crate::model::metadata::LABEL_HUB_NAMESPACE.to_string(),
                "team-a".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            judge(&record, Some(&t), Some(&facts(&[], &[])), now()),
            Verdict::Keep
        );
        assert_eq!(
            judge(&record, None, None, now()),
            Verdict::Keep,
            "even its template gone"
        );
    }

    #[test]
    fn an_extension_shields_idle_sleep_and_age_but_not_a_closed_pr_or_a_gone_branch() {
        let idle_sleep = template(|s| {
            s.lifecycle.idle_timeout = Some("72h".into());
            s.lifecycle.idle_action = IdleAction::Sleep;
            s.lifecycle.max_age = Some("1d".into());
        });
        let mut extended = environment(Some(2), "changes", 100, 73);
        extended.spec.keep_until = Some(now() + TimeDelta::days(1));
        assert_eq!(
            judge(&extended, Some(&idle_sleep), None, now()),
            Verdict::Keep,
            "idle and too old, but extended: neither sleeps nor goes"
        );
        assert_eq!(
            judge(&extended, Some(&idle_sleep), Some(&facts(&[3], &[])), now()),
            Verdict::Delete(Reason::PullRequestClosed),
            "its PR closed: it goes all the same"
        );
        let mut branch = environment(None, "release/1", 100, 73);
        branch.spec.keep_until = Some(now() + TimeDelta::days(1));
        assert_eq!(
            judge(
                &branch,
                Some(&idle_sleep),
                Some(&facts(&[], &["main"])),
                now()
            ),
            Verdict::Delete(Reason::BranchGone)
        );
    }

    #[test]
    fn fresh_activity_is_protected_from_stale_forge_lists() {
        let t = template(|_| {});
        let mut just_pushed = environment(Some(9), "new", 0, 0);
        just_pushed.spec.last_activity = Some(now() - TimeDelta::minutes(1));
        assert_eq!(
            judge(&just_pushed, Some(&t), Some(&facts(&[], &[])), now()),
            Verdict::Keep
        );
    }

    #[test]
    fn idle_and_age_apply_without_the_forge() {
        let idle_delete = template(|s| s.lifecycle.idle_timeout = Some("72h".into()));
        let idle_sleep = template(|s| {
            s.lifecycle.idle_timeout = Some("72h".into());
            s.lifecycle.idle_action = IdleAction::Sleep;
        });
        let aged = template(|s| s.lifecycle.max_age = Some("14d".into()));
        let quiet = environment(Some(2), "changes", 100, 73);
        let busy = environment(Some(2), "changes", 100, 71);
        assert_eq!(
            judge(&quiet, Some(&idle_delete), None, now()),
            Verdict::Delete(Reason::Idle)
        );
        assert_eq!(judge(&busy, Some(&idle_delete), None, now()), Verdict::Keep);
        assert_eq!(
            judge(&quiet, Some(&idle_sleep), None, now()),
            Verdict::Sleep
        );
        let mut asleep = quiet.clone();
        asleep.spec.sleep = true;
        assert_eq!(
            judge(&asleep, Some(&idle_sleep), None, now()),
            Verdict::Keep
        );
        assert_eq!(
            judge(
                &environment(Some(2), "c", 14 * 24 + 1, 0),
                Some(&aged),
                None,
                now()
            ),
            Verdict::Delete(Reason::MaxAge)
        );
        assert_eq!(
            judge(
                &environment(Some(2), "c", 14 * 24 - 1, 0),
                Some(&aged),
                None,
                now()
            ),
            Verdict::Keep
        );
        assert_eq!(
            judge(&busy, None, None, now()),
            Verdict::Delete(Reason::TemplateGone)
        );
    }

    #[test]
    fn only_namespaces_previewd_created_without_their_environment_are_orphans() {
        let labels = |env: &str| -> BTreeMap<String, String> {
            [
                (LABEL_MANAGED_BY.to_string(), "previewd".to_string()),
                (LABEL_ENVIRONMENT.to_string(), env.to_string()),
                (
                    LABEL_ENVIRONMENT_NAMESPACE.to_string(),
                    "previews".to_string(),
                ),
                (LABEL_ENVIRONMENT_UID.to_string(), format!("uid-{env}")),
            ]
            .into()
        };
        let mut without_uid = labels("gone");
        without_uid.remove(LABEL_ENVIRONMENT_UID);
        let old = Some(now() - TimeDelta::hours(1));
        let namespaces = vec![
            LabelledNamespace {
                name: "preview-alive".into(),
                labels: labels("web-x"),
                created: old,
                terminating: false,
            },
            LabelledNamespace {
                name: "preview-orphan".into(),
                labels: labels("gone"),
                created: old,
                terminating: false,
            },
            LabelledNamespace {
                name: "preview-young".into(),
                labels: labels("gone"),
                created: Some(now()),
                terminating: false,
            },
            LabelledNamespace {
                name: "unrelated".into(),
                labels: BTreeMap::new(),
                created: old,
                terminating: false,
            },
            // previewd's labels but no UID: made by hand, or before the UID label existed.
            LabelledNamespace {
                name: "not-proven-ours".into(),
                labels: without_uid,
                created: old,
                terminating: false,
            },
        ];
        let mut alive = environment(Some(2), "changes", 1, 1);
        alive.metadata.uid = Some("uid-web-x".into());
        assert_eq!(
            orphaned_namespaces(&namespaces, &[&alive], None, now()),
            vec!["preview-orphan".to_string()]
        );
        // A previewd watching another namespace knows nothing of these: it leaves them alone.
        assert!(orphaned_namespaces(&namespaces, &[], Some("elsewhere"), now()).is_empty());
        assert_eq!(
            orphaned_namespaces(&namespaces, &[&alive], Some("previews"), now()),
            vec!["preview-orphan".to_string()]
        );
    }
}
