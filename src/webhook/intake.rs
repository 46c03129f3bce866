//! Intake: a verified [`ForgeEvent`] becomes the `PreviewEnvironment`s to apply or delete.
//!
//! [`decide`] is pure (templates, the environments that exist, and `now` are passed in);
//! [`execute`] then sends one API call per decision: a server-side apply of the environment
//! (field manager `previewd-intake`) or its deletion. Nothing else is written from the request
//! path: deploying is the controller's job. A head commit the delivery says is not to be
//! deployed ([`skips`]: `[skip preview]`, path filters) is recorded in `spec.skip`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::cluster::records::{Applied, Deleter, Records};
use crate::forge::{ChangeRequest, EventKind, ForgeEvent, Push};
use crate::model::crd::{
    ForkPolicy, PreviewEnvironment, PreviewEnvironmentSpec, PreviewTemplate, SkippedCommit, Source,
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
        reason: DeletionReason,
    },
}

/// Why a delivery deletes an environment; written on it (`previewd.dev/deletion-reason`) as
/// its sentence, which the PR comment repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletionReason {
    Merged,
    Closed,
    Draft,
    RequiredLabelRemoved,
    SkipLabel,
    BranchDeleted,
}

impl DeletionReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            DeletionReason::Merged => "the pull request was merged",
            DeletionReason::Closed => "the pull request was closed",
            DeletionReason::Draft => "the pull request is a draft",
            DeletionReason::RequiredLabelRemoved => "the required label was removed",
            DeletionReason::SkipLabel => "the pull request carries the skip label",
            DeletionReason::BranchDeleted => "the branch was deleted",
        }
    }
}

impl std::fmt::Display for DeletionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
        // Compared in place: `name_any()` and `namespace()` copy a name for each of the
        // thousands of environments a delivery looks through.
        let (name, namespace) = (template.name_any(), &template.metadata.namespace);
        let existing: Vec<&PreviewEnvironment> = environments
            .iter()
            .map(|e| e.as_ref())
            .filter(|e| e.spec.template == name && e.metadata.namespace == *namespace)
            .collect();
        let start = decisions.len();
        decide_for_template(event, template, &existing, now, &mut decisions);
        for decision in &mut decisions[start..] {
            keep_known_skip(decision, &existing);
        }
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
                    same_name(current, wanted)
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

/// A delivery that says nothing of the head commit's files or message (GitHub's
/// `pull_request`) keeps the skip another delivery of the same commit recorded: the intake owns
/// `spec.skip`, and an apply without it would remove it.
fn keep_known_skip(decision: &mut Decision, existing: &[&PreviewEnvironment]) {
    let Decision::Apply(wanted) = decision else {
        return;
    };
    if wanted.spec.skip.is_some() {
        return;
    }
    let head = &wanted.spec.source.head_sha;
    wanted.spec.skip = existing
        .iter()
        .find(|current| same_name(current, wanted))
        .and_then(|current| current.spec.skip.clone())
        .filter(|skip| &skip.sha == head);
}

/// `lastActivity` drives idle timeouts measured in hours; refreshing it at most once per
/// [`ACTIVITY_GRANULARITY`] keeps a burst of deliveries (redeliveries, a busy PR) from becoming
/// a burst of writes.
pub const ACTIVITY_GRANULARITY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// True if `decision` applies an environment identical to an existing one except for a
/// `lastActivity` less than [`ACTIVITY_GRANULARITY`] old, or identical down to the forge's
/// time of the change: a delivery replayed (with a new delivery id) or redelivered says
/// nothing new, and keeps nothing alive.
fn is_mere_activity_refresh(
    decision: &Decision,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
) -> bool {
    let Decision::Apply(wanted) = decision else {
        return false;
    };
    existing.iter().any(|current| {
        same_name(current, wanted)
            && current.metadata.deletion_timestamp.is_none()
            && current.spec.source == wanted.spec.source
            && current.spec.template == wanted.spec.template
            && current.spec.skip == wanted.spec.skip
            && wanted
                .labels()
                .iter()
                .all(|(k, v)| current.labels().get(k) == Some(v))
            && (current.spec.source.changed_at.is_some()
                || current
                    .spec
                    .last_activity
                    .is_some_and(|at| now - at < ACTIVITY_GRANULARITY))
    })
}

/// True if `decision` applies a source older than the one its environment already holds.
fn is_out_of_order(decision: &Decision, existing: &[&PreviewEnvironment]) -> bool {
    let Decision::Apply(wanted) = decision else {
        return false;
    };
    existing.iter().any(|current| {
        same_name(current, wanted) && wanted.spec.source.is_older_than(&current.spec.source)
    })
}

/// Whether two environments have one name; compared in place, since a delivery compares
/// against every environment of its template and `name_any()` copies the name each time.
fn same_name(a: &PreviewEnvironment, b: &PreviewEnvironment) -> bool {
    a.metadata.name == b.metadata.name
}

/// Whether `environment` is named `name` (compared in place, as [`same_name`]).
fn named(environment: &PreviewEnvironment, name: &str) -> bool {
    environment.metadata.name.as_deref() == Some(name)
}

fn serves(template: &PreviewTemplate, event: &ForgeEvent) -> bool {
    template.spec.forge.kind == event.forge
        && template
            .spec
            .forge
            .repository
            .eq_ignore_ascii_case(&event.repository)
}

/// The decisions `event` makes for one template, appended to `decisions`.
fn decide_for_template(
    event: &ForgeEvent,
    template: &PreviewTemplate,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
    decisions: &mut Vec<Decision>,
) {
    let found = match &event.kind {
        EventKind::ChangeRequest(change) => change_request(event, change, template, existing, now)
            .into_iter()
            .collect(),
        EventKind::ChangeRequestClosed {
            number,
            branch,
            merged,
            changed_at,
        } => {
            let name = naming::environment_name(&template.name_any(), branch, Some(*number));
            let reason = if *merged {
                DeletionReason::Merged
            } else {
                DeletionReason::Closed
            };
            // A close older than what the environment recorded (it was reopened, or pushed to,
            // since) is a replayed or late delivery: the request is open again.
            let closed = Source {
                changed_at: *changed_at,
                ..Source::default()
            };
            let superseded = existing
                .iter()
                .any(|e| named(e, &name) && closed.is_older_than(&e.spec.source));
            (!superseded)
                .then(|| delete(template, name, reason))
                .into_iter()
                .collect()
        }
        EventKind::Push(push) => pushed(event, push, template, existing, now),
        EventKind::BranchDeleted { branch } => branch_deleted(event, branch, template, existing),
        // Comment commands and pings change no environment here.
        // Check results are recorded by the check step, not decided on here.
        EventKind::Comment(_) | EventKind::Check(_) | EventKind::Ping | EventKind::Ignored(_) => {
            Vec::new()
        }
    };
    decisions.extend(found);
}

fn delete(template: &PreviewTemplate, name: String, reason: DeletionReason) -> Decision {
    Decision::Delete {
        namespace: template.namespace().unwrap_or_default(),
        name,
        reason,
    }
}

/// An open pull request's snapshot: its environment, unless the triggers exclude it (then an
/// existing one goes: a PR turned draft, a required label removed).
fn change_request(
    event: &ForgeEvent,
    change: &ChangeRequest,
    template: &PreviewTemplate,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
) -> Option<Decision> {
    let triggers = &template.spec.triggers;
    if !triggers.pull_requests {
        return None;
    }
    let name = naming::environment_name(&template.name_any(), &change.branch, Some(change.number));
    let exists = existing.iter().any(|e| named(e, &name));
    if change.draft && !triggers.draft_pull_requests {
        return exists.then(|| delete(template, name, DeletionReason::Draft));
    }
    if let Some(label) = &triggers.required_label
        && !change.labels.iter().any(|l| l == label)
    {
        return exists.then(|| delete(template, name, DeletionReason::RequiredLabelRemoved));
    }
    if let Some(label) = &triggers.skip_label
        && change.labels.iter().any(|l| l == label)
    {
        return exists.then(|| delete(template, name, DeletionReason::SkipLabel));
    }
    // A fork PR runs only where the template allows it. With RequireApproval its environment
    // is created but waits (phase Pending, the PR comment says so) until a maintainer approves
    // its head commit with `/preview approve`.
    let allowed = !change.fork || triggers.fork_policy != ForkPolicy::Deny;
    allowed.then(|| {
        let mut environment = pull_request_environment(template, event, change, now);
        let message = change.head_message.as_deref();
        environment.spec.skip = skips::skip(triggers, &change.head_sha, None, message);
        Decision::Apply(environment)
    })
}

/// A push: it updates the environments of the pull requests of that branch (not a second
/// environment), else a branch environment when the branch matches the template's globs.
///
/// A push names a branch of the delivery's repository. A fork pull request's head branch lives
/// in the fork: it may share the name (`main`), but the base repository's pushes are not its
/// commits. So only pull requests from the repository itself follow its pushes; a fork's new
/// commits arrive as `synchronize` deliveries of the pull request.
fn pushed(
    event: &ForgeEvent,
    push: &Push,
    template: &PreviewTemplate,
    existing: &[&PreviewEnvironment],
    now: DateTime<Utc>,
) -> Vec<Decision> {
    let pr_environments: Vec<&&PreviewEnvironment> = existing
        .iter()
        .filter(|e| {
            e.spec.source.pull_request.is_some() && same_repository_branch(e, event, &push.branch)
        })
        .collect();
    // The same verdict for every environment of this template: the push decides it.
    let skip = pushed_skip(template, push);
    if !pr_environments.is_empty() {
        return pr_environments
            .into_iter()
            .map(|environment| {
                let mut source = environment.spec.source.clone();
                source.head_sha = push.head_sha.clone();
                source.changed_at = push.changed_at;
                let name = environment.name_any();
                let mut wanted = environment_object(template, &name, source, now);
                wanted.spec.skip = skip.clone();
                Decision::Apply(wanted)
            })
            .collect();
    }
    let globs = &template.spec.triggers.branches;
    if globs.iter().any(|glob| glob_matches(glob, &push.branch)) {
        let mut environment = branch_environment(template, event, push, now);
        environment.spec.skip = skip;
        return vec![Decision::Apply(environment)];
    }
    Vec::new()
}

/// Whether the pushed head is skipped (its message, or the files the push changed).
fn pushed_skip(template: &PreviewTemplate, push: &Push) -> Option<SkippedCommit> {
    let triggers = &template.spec.triggers;
    let files = push.files.as_deref();
    skips::skip(
        triggers,
        &push.head_sha,
        files,
        push.head_message.as_deref(),
    )
}

/// Whether `environment` follows `branch` of the delivery's repository: not a fork pull
/// request whose head branch in the fork only has the same name.
fn same_repository_branch(
    environment: &PreviewEnvironment,
    event: &ForgeEvent,
    branch: &str,
) -> bool {
    let source = &environment.spec.source;
    !source.fork
        && source.branch == branch
        && source.repository.eq_ignore_ascii_case(&event.repository)
}

/// A deleted branch: every environment of it goes (not a fork's pull request from a branch of
/// the same name), and its branch environment by name even if the cache does not show it yet
/// (just created?); a 404 is fine.
fn branch_deleted(
    event: &ForgeEvent,
    branch: &str,
    template: &PreviewTemplate,
    existing: &[&PreviewEnvironment],
) -> Vec<Decision> {
    let mut decisions: Vec<Decision> = existing
        .iter()
        .filter(|e| same_repository_branch(e, event, branch))
        .map(|e| delete(template, e.name_any(), DeletionReason::BranchDeleted))
        .collect();
    let branch_env = naming::environment_name(&template.name_any(), branch, None);
    let globs = &template.spec.triggers.branches;
    if !existing.iter().any(|e| named(e, &branch_env))
        && globs.iter().any(|glob| glob_matches(glob, branch))
    {
        decisions.push(delete(template, branch_env, DeletionReason::BranchDeleted));
    }
    decisions
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

/// `*` matches any run of characters (`/` included), `?` exactly one. Also one folder of a
/// path filter (`skips::path_matches`). Without recursion: on a mismatch only the last `*`
/// takes one more character, so a glob with many `*` stays linear in each of them and a long
/// branch name or path cannot make it costly.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut g, mut t) = (0, 0);
    // Where the last `*` was, and how much of the text it has taken so far.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(c) if *c == '?' || *c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((star_at, taken)) => {
                    g = star_at + 1;
                    t = taken + 1;
                    star = Some((star_at, taken + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// Carries the decisions out, one write each (see [`records`]). Returns what became of each:
/// an apply found older than the environment's current source, or meeting an environment
/// being removed, is not written; a delete of an environment that is already gone is not an
/// error.
pub async fn execute(
    records: Records<'_>,
    decisions: &[Decision],
) -> Result<Vec<Applied>, kube::Error> {
    let mut written = Vec::with_capacity(decisions.len());
    for decision in decisions {
        let wrote = match decision {
            Decision::Apply(environment) => records.apply_in_order(environment).await?,
            Decision::Wake { namespace, name } => {
                records.wake(namespace, name).await?;
                Applied::Written
            }
            Decision::Delete {
                namespace,
                name,
                reason,
            } => {
                let by = Deleter::Intake;
                records
                    .delete_with_reason(namespace, name, reason.as_str(), by)
                    .await?;
                Applied::Written
            }
        };
        written.push(wrote);
    }
    Ok(written)
}

mod skips;

#[cfg(test)]
mod tests;
