//! Intake: a verified [`ForgeEvent`] becomes the `PreviewEnvironment`s to apply or delete.
//!
//! [`decide`] is pure (templates, the environments that exist, and `now` are passed in);
//! [`execute`] then sends one API call per decision: a server-side apply of the environment
//! (field manager `previewd-intake`) or its deletion. Nothing else is written from the request
//! path: deploying is the controller's job.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use kube::{Client, ResourceExt};

use crate::cluster::records;
use crate::forge::{ChangeRequest, EventKind, ForgeEvent, Push};
use crate::model::crd::{
    ForkPolicy, PreviewEnvironment, PreviewEnvironmentSpec, PreviewTemplate, Source,
};
use crate::model::metadata::{LABEL_PULL_REQUEST, LABEL_TEMPLATE};
use crate::model::naming;

/// One write the intake makes.
#[derive(Clone, Debug)]
pub enum Decision {
    /// Create or update this environment (server-side apply).
    Apply(Box<PreviewEnvironment>),
    /// Wake this sleeping environment (a new commit was pushed to it).
    Wake { namespace: String, name: String },
    /// Delete this environment (its namespace goes with it).
    Delete {
        namespace: String,
        name: String,
        reason: &'static str,
    },
}

/// What to do about `event`, for every template of its repository.
pub fn decide(
    event: &ForgeEvent,
    templates: &[Arc<PreviewTemplate>],
    environments: &[Arc<PreviewEnvironment>],
    now: DateTime<Utc>,
) -> Vec<Decision> {
    let mut decisions = Vec::new();
    for template in templates.iter().filter(|t| serves(t, event)) {
        let existing: Vec<&PreviewEnvironment> = environments
            .iter()
            .map(|e| e.as_ref())
            .filter(|e| {
                e.spec.template == template.name_any() && e.namespace() == template.namespace()
            })
            .collect();
        let start = decisions.len();
        decide_for_template(event, template, &existing, now, &mut decisions);
        // Drop applies that would change nothing but a recent `lastActivity`, and deliveries
        // older than what the environment already holds.
        let mut index = start;
        decisions.retain(|decision| {
            let keep = index < start
                || !(is_mere_activity_refresh(decision, &existing, now)
                    || is_out_of_order(decision, &existing));
            index += 1;
            keep
        });
        // A new commit for a sleeping environment wakes it.
        let wakes: Vec<Decision> = decisions[start..]
            .iter()
            .filter_map(|decision| match decision {
                Decision::Apply(wanted) => existing.iter().find(|current| {
                    current.name_any() == wanted.name_any()
                        && current.spec.sleep
                        && current.spec.source.head_sha != wanted.spec.source.head_sha
                }),
                _ => None,
            })
            .map(|sleeping| Decision::Wake {
                namespace: sleeping.namespace().unwrap_or_default(),
                name: sleeping.name_any(),
            })
            .collect();
        decisions.extend(wakes);
    }
    decisions
}

/// `lastActivity` drives idle timeouts measured in hours; refreshing it at most once per
/// [`ACTIVITY_GRANULARITY`] keeps a burst of deliveries (redeliveries, a busy PR) from becoming
/// a burst of writes.
pub const ACTIVITY_GRANULARITY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// True if `decision` applies an environment identical to an existing one except for a
/// `lastActivity` less than [`ACTIVITY_GRANULARITY`] old.
fn is_mere_activity_refresh(
    decision: &Decision,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
) -> bool {
    let Decision::Apply(wanted) = decision else {
        return false;
    };
    existing.iter().any(|current| {
        current.name_any() == wanted.name_any()
            && current.metadata.deletion_timestamp.is_none()
            && current.spec.source == wanted.spec.source
            && current.spec.template == wanted.spec.template
            && wanted
                .labels()
                .iter()
                .all(|(k, v)| current.labels().get(k) == Some(v))
            && current
                .spec
                .last_activity
                .is_some_and(|at| now - at < ACTIVITY_GRANULARITY)
    })
}

/// True if `decision` applies a source older than the one its environment already holds.
fn is_out_of_order(decision: &Decision, existing: &[&PreviewEnvironment]) -> bool {
    let Decision::Apply(wanted) = decision else {
        return false;
    };
    existing.iter().any(|current| {
        current.name_any() == wanted.name_any()
            && wanted.spec.source.is_older_than(&current.spec.source)
    })
}

fn serves(template: &PreviewTemplate, event: &ForgeEvent) -> bool {
    template.spec.forge.kind == event.forge
        && template
            .spec
            .forge
            .repository
            .eq_ignore_ascii_case(&event.repository)
}

fn decide_for_template(
    event: &ForgeEvent,
    template: &PreviewTemplate,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
    decisions: &mut Vec<Decision>,
) {
    let triggers = &template.spec.triggers;
    let namespace = template.namespace().unwrap_or_default();
    let delete = |name: String, reason: &'static str| Decision::Delete {
        namespace: namespace.clone(),
        name,
        reason,
    };
    match &event.kind {
        EventKind::ChangeRequest(change) => {
            if !triggers.pull_requests {
                return;
            }
            let name =
                naming::environment_name(&template.name_any(), &change.branch, Some(change.number));
            let exists = existing.iter().any(|e| e.name_any() == name);
            if change.draft && !triggers.draft_pull_requests {
                if exists {
                    decisions.push(delete(name, "the pull request is a draft"));
                }
                return;
            }
            if let Some(label) = &triggers.required_label
                && !change.labels.iter().any(|l| l == label)
            {
                if exists {
                    decisions.push(delete(name, "the required label was removed"));
                }
                return;
            }
            // A fork PR runs only where the template allows it. With RequireApproval its
            // environment is created but waits (phase Pending, the PR comment says so) until a
            // maintainer approves its head commit with `/preview approve`.
            let allowed = !change.fork || triggers.fork_policy != ForkPolicy::Deny;
            if allowed {
                decisions.push(Decision::Apply(pull_request_environment(
                    template, event, change, now,
                )));
            }
        }
        EventKind::ChangeRequestClosed {
            number,
            branch,
            merged,
        } => {
            let name = naming::environment_name(&template.name_any(), branch, Some(*number));
            let reason = if *merged {
                "the pull request was merged"
            } else {
                "the pull request was closed"
            };
            decisions.push(delete(name, reason));
        }
        EventKind::Push(push) => {
            // A push to a PR's branch updates that PR's environment, not a second one.
            let pr_environments: Vec<&&PreviewEnvironment> = existing
                .iter()
                .filter(|e| {
                    e.spec.source.pull_request.is_some() && e.spec.source.branch == push.branch
                })
                .collect();
            if !pr_environments.is_empty() {
                for environment in pr_environments {
                    let mut source = environment.spec.source.clone();
                    source.head_sha = push.head_sha.clone();
                    source.changed_at = push.changed_at;
                    decisions.push(Decision::Apply(environment_object(
                        template,
                        &environment.name_any(),
                        source,
                        now,
                    )));
                }
            } else if triggers
                .branches
                .iter()
                .any(|glob| glob_matches(glob, &push.branch))
            {
                decisions.push(Decision::Apply(branch_environment(
                    template, event, push, now,
                )));
            }
        }
        EventKind::BranchDeleted { branch } => {
            for environment in existing.iter().filter(|e| &e.spec.source.branch == branch) {
                decisions.push(delete(environment.name_any(), "the branch was deleted"));
            }
            let branch_env = naming::environment_name(&template.name_any(), branch, None);
            if !existing.iter().any(|e| e.name_any() == branch_env)
                && triggers
                    .branches
                    .iter()
                    .any(|glob| glob_matches(glob, branch))
            {
                // Not in our cache yet (just created?): delete by name anyway; 404 is fine.
                decisions.push(delete(branch_env, "the branch was deleted"));
            }
        }
        // Comment commands and pings change no environment here.
        EventKind::Comment(_) | EventKind::Ping | EventKind::Ignored(_) => {}
    }
}

fn pull_request_environment(
    template: &PreviewTemplate,
    event: &ForgeEvent,
    change: &ChangeRequest,
    now: DateTime<Utc>,
) -> Box<PreviewEnvironment> {
    let name = naming::environment_name(&template.name_any(), &change.branch, Some(change.number));
    let source = Source {
        repository: event.repository.clone(),
        branch: change.branch.clone(),
        pull_request: Some(change.number),
        head_sha: change.head_sha.clone(),
        author: change.author.clone(),
        fork: change.fork,
        changed_at: change.changed_at,
    };
    environment_object(template, &name, source, now)
}

fn branch_environment(
    template: &PreviewTemplate,
    event: &ForgeEvent,
    push: &Push,
    now: DateTime<Utc>,
) -> Box<PreviewEnvironment> {
    let name = naming::environment_name(&template.name_any(), &push.branch, None);
    let source = Source {
        repository: event.repository.clone(),
        branch: push.branch.clone(),
        pull_request: None,
        head_sha: push.head_sha.clone(),
        author: push.author.clone(),
        fork: false,
        changed_at: push.changed_at,
    };
    environment_object(template, &name, source, now)
}

fn environment_object(
    template: &PreviewTemplate,
    name: &str,
    source: Source,
    now: DateTime<Utc>,
) -> Box<PreviewEnvironment> {
    let mut environment = PreviewEnvironment::new(
        name,
        PreviewEnvironmentSpec {
            template: template.name_any(),
            last_activity: Some(now),
            source,
            ..Default::default()
        },
    );
    environment.metadata.namespace = template.namespace();
    let mut labels =
        std::collections::BTreeMap::from([(LABEL_TEMPLATE.to_string(), template.name_any())]);
    if let Some(number) = environment.spec.source.pull_request {
        labels.insert(LABEL_PULL_REQUEST.to_string(), number.to_string());
    }
    environment.metadata.labels = Some(labels);
    Box::new(environment)
}

/// `*` matches any run of characters (`/` included), `?` exactly one.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    fn matches(glob: &[char], text: &[char]) -> bool {
        match glob.split_first() {
            None => text.is_empty(),
            Some(('*', rest)) => (0..=text.len()).any(|skip| matches(rest, &text[skip..])),
            Some(('?', rest)) => !text.is_empty() && matches(rest, &text[1..]),
            Some((c, rest)) => text.first() == Some(c) && matches(rest, &text[1..]),
        }
    }
    let glob: Vec<char> = glob.chars().collect();
    let text: Vec<char> = text.chars().collect();
    matches(&glob, &text)
}

/// Carries the decisions out, one write each (see [`records`]). Returns, for each, whether it
/// was written: an apply found older than the environment's current source is not, and a
/// delete of an environment that is already gone is not an error.
pub async fn execute(client: &Client, decisions: &[Decision]) -> Result<Vec<bool>, kube::Error> {
    let mut written = Vec::with_capacity(decisions.len());
    for decision in decisions {
        let wrote = match decision {
            Decision::Apply(environment) => records::apply_in_order(client, environment).await?,
            Decision::Wake { namespace, name } => {
                records::wake(client, namespace, name).await?;
                true
            }
            Decision::Delete {
                namespace,
                name,
                reason,
            } => {
                records::delete_with_reason(client, namespace, name, reason).await?;
                true
            }
        };
        written.push(wrote);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::github;
    use crate::model::crd::{ForgeKind, PreviewTemplateSpec};

    fn now() -> DateTime<Utc> {
        "2026-11-22T10:00:00Z".parse().unwrap()
    }

    fn template(name: &str, adjust: impl FnOnce(&mut PreviewTemplateSpec)) -> Arc<PreviewTemplate> {
        let mut spec = PreviewTemplateSpec::default();
        spec.forge.kind = ForgeKind::Github;
        spec.forge.repository = "Codertocat/Hello-World".into();
        adjust(&mut spec);
        let mut template = PreviewTemplate::new(name, spec);
        template.metadata.namespace = Some("previews".into());
        Arc::new(template)
    }

    fn github_event(event_type: &str, file: &str) -> ForgeEvent {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/github")
            .join(file);
        github::parse(event_type, &std::fs::read(path).unwrap()).unwrap()
    }

    fn change_request(adjust: impl FnOnce(&mut ChangeRequest)) -> ForgeEvent {
        let mut event = github_event("pull_request", "pull_request.opened.json");
        if let EventKind::ChangeRequest(change) = &mut event.kind {
            adjust(change);
        }
        event
    }

    fn applied(decisions: &[Decision]) -> Vec<&PreviewEnvironment> {
        decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Apply(e) => Some(e.as_ref()),
                Decision::Wake { .. } | Decision::Delete { .. } => None,
            })
            .collect()
    }

    #[test]
    fn an_opened_pr_becomes_one_environment_per_matching_template() {
        let templates = [
            template("web", |_| {}),
            template("other-repo", |s| s.forge.repository = "someone/else".into()),
            template("on-gitlab", |s| s.forge.kind = ForgeKind::Gitlab),
        ];
        let decisions = decide(
            &github_event("pull_request", "pull_request.opened.json"),
            &templates,
            &[],
            now(),
        );
        let environments = applied(&decisions);
        assert_eq!(environments.len(), 1);
        let environment = environments[0];
        assert_eq!(environment.namespace().as_deref(), Some("previews"));
        assert!(environment.name_any().starts_with("web-pr-2-"));
        assert_eq!(environment.spec.template, "web");
        assert_eq!(environment.spec.source.pull_request, Some(2));
        assert_eq!(
            environment.spec.source.head_sha,
            "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
        );
        assert_eq!(environment.spec.last_activity, Some(now()));
        assert_eq!(
            environment
                .labels()
                .get(LABEL_PULL_REQUEST)
                .map(String::as_str),
            Some("2")
        );
    }

    #[test]
    fn repository_names_match_case_insensitively() {
        let templates = [template("web", |s| {
            s.forge.repository = "codertocat/hello-world".into()
        })];
        let decisions = decide(
            &github_event("pull_request", "pull_request.opened.json"),
            &templates,
            &[],
            now(),
        );
        assert_eq!(applied(&decisions).len(), 1);
    }

    #[test]
    fn closing_deletes_and_says_why() {
        let templates = [template("web", |_| {})];
        let decisions = decide(
            &github_event("pull_request", "pull_request.closed.json"),
            &templates,
            &[],
            now(),
        );
        let [Decision::Delete { name, reason, .. }] = decisions.as_slice() else {
            panic!("expected one delete, got {decisions:?}");
        };
        assert!(name.starts_with("web-pr-2-"));
        assert_eq!(*reason, "the pull request was closed");
    }

    #[test]
    fn drafts_labels_and_forks_follow_the_triggers() {
        let existing_env = |templates: &[Arc<PreviewTemplate>]| -> Vec<Arc<PreviewEnvironment>> {
            applied(&decide(&change_request(|_| {}), templates, &[], now()))
                .into_iter()
                .map(|e| Arc::new(e.clone()))
                .collect()
        };
        // Drafts off (default): a draft gets nothing; converting to draft deletes.
        let templates = [template("web", |_| {})];
        let draft = change_request(|c| c.draft = true);
        assert!(decide(&draft, &templates, &[], now()).is_empty());
        let existing = existing_env(&templates);
        assert!(matches!(
            decide(&draft, &templates, &existing, now()).as_slice(),
            [Decision::Delete { .. }]
        ));
        // Drafts on.
        let templates = [template("web", |s| s.triggers.draft_pull_requests = true)];
        assert_eq!(applied(&decide(&draft, &templates, &[], now())).len(), 1);
        // A required label.
        let templates = [template("web", |s| {
            s.triggers.required_label = Some("preview".into())
        })];
        assert!(decide(&change_request(|_| {}), &templates, &[], now()).is_empty());
        let labeled = change_request(|c| c.labels.push("preview".into()));
        assert_eq!(applied(&decide(&labeled, &templates, &[], now())).len(), 1);
        // Forks: denied by default; allowed, or recorded to wait for approval (the
        // controller holds it until `/preview approve`), when the template says so.
        let fork = change_request(|c| c.fork = true);
        assert!(decide(&fork, &[template("web", |_| {})], &[], now()).is_empty());
        for policy in [ForkPolicy::Allow, ForkPolicy::RequireApproval] {
            let templates = [template("web", |s| s.triggers.fork_policy = policy)];
            let decisions = decide(&fork, &templates, &[], now());
            let environments = applied(&decisions);
            assert_eq!(environments.len(), 1);
            assert!(environments[0].spec.source.fork);
            assert_eq!(environments[0].spec.approved_sha, None);
        }
        // PRs off.
        let off = [template("web", |s| s.triggers.pull_requests = false)];
        assert!(decide(&change_request(|_| {}), &off, &[], now()).is_empty());
    }

    #[test]
    fn a_push_to_a_pr_branch_updates_that_environment_only() {
        let templates = [template("web", |s| s.triggers.branches = vec!["*".into()])];
        let pr_env: Vec<Arc<PreviewEnvironment>> =
            applied(&decide(&change_request(|_| {}), &templates, &[], now()))
                .into_iter()
                .map(|e| Arc::new(e.clone()))
                .collect();
        let push = ForgeEvent {
            forge: ForgeKind::Github,
            repository: "Codertocat/Hello-World".into(),
            kind: EventKind::Push(Push {
                branch: "changes".into(),
                head_sha: "feedbeef".into(),
                author: None,
                changed_at: None,
            }),
        };
        let decisions = decide(&push, &templates, &pr_env, now());
        let environments = applied(&decisions);
        assert_eq!(
            environments.len(),
            1,
            "no second environment for the branch"
        );
        assert_eq!(environments[0].name_any(), pr_env[0].name_any());
        assert_eq!(environments[0].spec.source.head_sha, "feedbeef");
        assert_eq!(environments[0].spec.source.pull_request, Some(2));
    }

    #[test]
    fn an_older_delivery_never_replaces_a_newer_head() {
        let templates = [template("web", |_| {})];
        let at = |minute: u32| Some(now() - chrono::TimeDelta::minutes(60 - i64::from(minute)));
        let newer = change_request(|c| {
            c.head_sha = "newer".into();
            c.changed_at = at(30);
        });
        let decisions = decide(&newer, &templates, &[], now());
        let current: Vec<Arc<PreviewEnvironment>> = applied(&decisions)
            .into_iter()
            .map(|e| Arc::new(e.clone()))
            .collect();
        let older = change_request(|c| {
            c.head_sha = "older".into();
            c.changed_at = at(10);
        });
        assert!(
            decide(&older, &templates, &current, now()).is_empty(),
            "the older snapshot is dropped"
        );
        let later = change_request(|c| {
            c.head_sha = "later".into();
            c.changed_at = at(40);
        });
        assert_eq!(
            applied(&decide(&later, &templates, &current, now()))[0]
                .spec
                .source
                .head_sha,
            "later"
        );
        // Without timestamps nothing can be told: arrival order decides.
        let untimed = change_request(|c| {
            c.head_sha = "untimed".into();
            c.changed_at = None;
        });
        assert_eq!(
            applied(&decide(&untimed, &templates, &current, now())).len(),
            1
        );
    }

    #[test]
    fn branch_pushes_follow_the_globs_and_deletions_remove_them() {
        let templates = [template("web", |s| {
            s.triggers.branches = vec!["release/*".into()]
        })];
        let push = |branch: &str| ForgeEvent {
            forge: ForgeKind::Github,
            repository: "Codertocat/Hello-World".into(),
            kind: EventKind::Push(Push {
                branch: branch.into(),
                head_sha: "abc".into(),
                author: Some("a".into()),
                changed_at: None,
            }),
        };
        assert!(decide(&push("main"), &templates, &[], now()).is_empty());
        let decisions = decide(&push("release/1.2"), &templates, &[], now());
        let environment = applied(&decisions)[0].clone();
        assert_eq!(environment.spec.source.pull_request, None);
        assert_eq!(environment.spec.source.branch, "release/1.2");
        let deleted = ForgeEvent {
            forge: ForgeKind::Github,
            repository: "Codertocat/Hello-World".into(),
            kind: EventKind::BranchDeleted {
                branch: "release/1.2".into(),
            },
        };
        let decisions = decide(
            &deleted,
            &templates,
            &[Arc::new(environment.clone())],
            now(),
        );
        let [
            Decision::Delete {
                namespace,
                name,
                reason,
            },
        ] = decisions.as_slice()
        else {
            panic!("expected one delete, got {decisions:?}");
        };
        assert_eq!(
            (namespace.as_str(), name.clone(), *reason),
            ("previews", environment.name_any(), "the branch was deleted")
        );
    }

    #[test]
    fn pings_comments_and_ignored_events_change_nothing() {
        let templates = [template("web", |_| {})];
        for event in [
            github_event("ping", "ping.json"),
            github_event("push", "push.json"),
            github_event("issue_comment", "issue_comment.created.json"),
        ] {
            assert!(
                decide(&event, &templates, &[], now()).is_empty(),
                "{event:?}"
            );
        }
    }

    #[test]
    fn a_burst_of_identical_deliveries_writes_once_a_minute() {
        let templates = [template("web", |_| {})];
        let event = change_request(|_| {});
        let existing: Vec<Arc<PreviewEnvironment>> =
            applied(&decide(&event, &templates, &[], now()))
                .into_iter()
                .map(|e| Arc::new(e.clone()))
                .collect();
        let soon = now() + chrono::TimeDelta::seconds(30);
        assert!(
            decide(&event, &templates, &existing, soon).is_empty(),
            "nothing new within a minute"
        );
        let later = now() + chrono::TimeDelta::seconds(61);
        assert_eq!(
            applied(&decide(&event, &templates, &existing, later)).len(),
            1,
            "activity refreshed after a minute"
        );
        let new_commit = change_request(|c| c.head_sha = "feedbeef".into());
        assert_eq!(
            applied(&decide(&new_commit, &templates, &existing, soon)).len(),
            1,
            "a new commit is written at once"
        );
    }

    #[test]
    fn a_new_commit_wakes_a_sleeping_environment_and_a_redelivery_does_not() {
        let templates = [template("web", |_| {})];
        let event = change_request(|_| {});
        let mut sleeping = applied(&decide(&event, &templates, &[], now()))[0].clone();
        sleeping.spec.sleep = true;
        let existing = [Arc::new(sleeping.clone())];
        let later = now() + chrono::TimeDelta::minutes(5);
        let woke = |decisions: &[Decision]| {
            decisions
                .iter()
                .any(|d| matches!(d, Decision::Wake { name, .. } if *name == sleeping.name_any()))
        };
        assert!(!woke(&decide(&event, &templates, &existing, later)));
        let new_commit = change_request(|c| c.head_sha = "feedbeef".into());
        assert!(woke(&decide(&new_commit, &templates, &existing, later)));
    }

    #[test]
    fn globs() {
        assert!(glob_matches("feature/*", "feature/login/x"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("v?", "v1"));
        assert!(!glob_matches("feature/*", "main"));
        assert!(!glob_matches("v?", "v10"));
    }
}
