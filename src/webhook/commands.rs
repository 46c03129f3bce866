//! Comment commands: `/preview deploy`, `extend <duration>`, `sleep`, `wake`, `destroy` and
//! `approve`, written on a pull/merge request by someone with write access to the repository.
//!
//! [`parse`] and [`effect`] are pure. [`handle`] asks the forge whether the author may write to
//! the repository (cached briefly), then changes the environment with one merge patch (or
//! deletes it). The answer is written on the environment as the annotation
//! [`ANNOTATION_LAST_COMMAND`]; the controller puts it into its one PR comment, so every command
//! is answered by an edit of that comment, never by a new one.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::refusals::RefusalAnswers;
use crate::cluster::records::{Deleter, Records};
use crate::forge::access::WriteAccess;
use crate::forge::{Comment, ForgeEvent};
use crate::model::crd::{ForkPolicy, PreviewEnvironment, PreviewTemplate};
use crate::model::durations::parse_duration;
use crate::model::metadata::{
    ANNOTATION_LAST_COMMAND, ANNOTATION_WOKEN_BY_REQUEST, CommandReply, quote_user_text,
};

/// The longest `/preview extend` accepted.
pub const MAX_EXTENSION: TimeDelta = TimeDelta::days(30);

const USAGE: &str = "use `/preview deploy`, `extend <duration>` (e.g. `3d`), `sleep`, `wake`, `destroy` or `approve <commit>`";

/// The lengths of a whole commit SHA: SHA-1 (40 hexadecimal digits) and SHA-256 (64), as Git
/// names commits. `/preview approve` takes nothing shorter: two commits that share a 7-digit
/// prefix can be made in minutes, so a prefix the reviewer read could approve a commit pushed
/// after the review.
const WHOLE_SHA_LENGTHS: [usize; 2] = [40, 64];

#[derive(Clone, Debug, PartialEq)]
pub enum CommentCommand {
    Deploy,
    /// Keep the environment at least this long from now (the text as written, e.g. `3d`).
    Extend(String, TimeDelta),
    Sleep,
    Wake,
    Destroy,
    /// Approve the fork's head commit, named by its whole SHA (lower case): a push that lands
    /// between the reviewer's reading and approving is not approved by accident.
    Approve(String),
}

impl std::fmt::Display for CommentCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommentCommand::Deploy => write!(f, "/preview deploy"),
            CommentCommand::Extend(text, _) => write!(f, "/preview extend {text}"),
            CommentCommand::Sleep => write!(f, "/preview sleep"),
            CommentCommand::Wake => write!(f, "/preview wake"),
            CommentCommand::Destroy => write!(f, "/preview destroy"),
            CommentCommand::Approve(commit) => write!(f, "/preview approve {commit}"),
        }
    }
}

/// The command in a comment: the first line that starts with `/preview`. `None` when the
/// comment holds none (an ordinary comment); `Err` with the answer when it is not understood.
pub fn parse(body: &str) -> Option<Result<CommentCommand, String>> {
    let line = body.lines().map(str::trim).find(|line| {
        line.strip_prefix("/preview")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
    })?;
    let mut words = line["/preview".len()..].split_whitespace();
    let (Some(verb), argument, extra) = (words.next(), words.next(), words.next()) else {
        return Some(Err(format!("which command? {USAGE}")));
    };
    let command = match (verb, argument) {
        ("extend", Some(text)) => {
            extension(text).map(|delta| CommentCommand::Extend(quote_user_text(text), delta))
        }
        ("extend", None) => Err("`/preview extend` needs a duration, e.g. `3d`".to_string()),
        ("approve", Some(commit)) => approved_commit(commit).map(CommentCommand::Approve),
        ("approve", None) => Err(
            "`/preview approve` needs the commit you reviewed: `/preview approve <sha>`, its whole SHA (40 characters, as previewd's comment shows it)".to_string()
        ),
        (_, Some(argument)) => Err(format!(
            "`/preview {}` takes no argument (got `{}`)",
            quote_user_text(verb),
            quote_user_text(argument)
        )),
        ("deploy" | "redeploy", None) => Ok(CommentCommand::Deploy),
        ("sleep", None) => Ok(CommentCommand::Sleep),
        ("wake", None) => Ok(CommentCommand::Wake),
        ("destroy", None) => Ok(CommentCommand::Destroy),
        (other, None) => Err(format!(
            "unknown command `{}`: {USAGE}",
            quote_user_text(other)
        )),
    };
    Some(match (command, extra) {
        (Ok(_), Some(extra)) => Err(format!(
            "unexpected `{}` after the command",
            quote_user_text(extra)
        )),
        (result, _) => result,
    })
}

/// A commit as `/preview approve` takes it: its whole SHA, lower-cased.
fn approved_commit(text: &str) -> Result<String, String> {
    let hex = text.chars().all(|c| c.is_ascii_hexdigit());
    if hex && WHOLE_SHA_LENGTHS.contains(&text.len()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "`{}` is not a whole commit SHA: write all 40 characters, as previewd's comment shows them (a prefix could name a commit pushed after your review)",
            quote_user_text(text)
        ))
    }
}

fn extension(text: &str) -> Result<TimeDelta, String> {
    let delta = parse_duration(text)
        .ok()
        .and_then(|d| TimeDelta::from_std(d).ok())
        .filter(|d| *d > TimeDelta::zero())
        .ok_or_else(|| {
            format!(
                "`{}` is not a duration: write e.g. `12h`, `3d`",
                quote_user_text(text)
            )
        })?;
    if delta > MAX_EXTENSION {
        return Err(format!(
            "`{}` is longer than the {} days an environment can be extended by",
            quote_user_text(text),
            MAX_EXTENSION.num_days()
        ));
    }
    Ok(delta)
}

/// What a command does to one environment.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// A merge patch of the environment (always with the answer annotation).
    Patch(Value),
    /// Delete the environment; the reason ends up in the PR comment.
    Delete(String),
}

fn patch_with_answer(spec: Value, command: &str, user: &str, answer: &str) -> Value {
    let reply = CommandReply {
        command: command.to_string(),
        user: user.to_string(),
        reply: answer.to_string(),
    };
    let mut patch = json!({"metadata": {"annotations": {
        ANNOTATION_LAST_COMMAND: serde_json::to_string(&reply).unwrap_or_default(),
    }}});
    if spec.as_object().is_some_and(|s| !s.is_empty()) {
        patch["spec"] = spec;
    }
    patch
}

/// The patch that only answers: the command was refused or not understood.
pub fn refusal(command: &str, user: &str, why: &str) -> Effect {
    Effect::Patch(patch_with_answer(json!({}), command, user, why))
}

/// What `command` from `user` (who may write to the repository) does to `environment`.
pub fn effect(
    command: &CommentCommand,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    user: &str,
    now: DateTime<Utc>,
) -> Effect {
    let spec = &environment.spec;
    let short_sha: String = spec.source.head_sha.chars().take(7).collect();
    let active = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (changes, answer) = match command {
        CommentCommand::Destroy => {
            return Effect::Delete(format!("@{user} asked for it with `/preview destroy`"));
        }
        CommentCommand::Deploy => deploy_now(environment, template, &active, &short_sha),
        CommentCommand::Extend(_, delta) => {
            let until = now + *delta;
            (
                json!({"keepUntil": until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "lastActivity": active}),
                format!(
                    "kept at least until {}",
                    until.format("%Y-%m-%d %H:%M UTC")
                ),
            )
        }
        CommentCommand::Sleep if spec.sleep => (json!({}), "already asleep".to_string()),
        CommentCommand::Sleep => (
            json!({"sleep": true, "lastActivity": active}),
            "going to sleep: every workload scales to zero".to_string(),
        ),
        CommentCommand::Wake if !spec.sleep => (
            json!({"lastActivity": active}),
            "already awake".to_string(),
        ),
        CommentCommand::Wake => (
            json!({"sleep": false, "lastActivity": active}),
            "waking up: the replicas from before the sleep come back".to_string(),
        ),
        CommentCommand::Approve(_) if !spec.source.fork => (
            json!({}),
            "nothing to approve: the pull request does not come from a fork".to_string(),
        ),
        CommentCommand::Approve(_) if template.spec.triggers.fork_policy != ForkPolicy::RequireApproval => (
            json!({}),
            "the template does not deploy fork pull requests on approval (forkPolicy is not RequireApproval)"
                .to_string(),
        ),
        CommentCommand::Approve(commit) if !spec.source.head_sha.eq_ignore_ascii_case(commit) => (
            json!({}),
            format!("`{commit}` is not the head of this pull request (`{short_sha}`): nothing approved; review the new commits, then approve the head"),
        ),
        CommentCommand::Approve(_) => (
            json!({"approvedSha": spec.source.head_sha, "lastActivity": active}),
            format!("approved commit `{short_sha}` of the fork; a new push needs a new approval"),
        ),
    };
    let acts = changes.get("lastActivity").is_some();
    let mut patch = patch_with_answer(changes, &command.to_string(), user, &answer);
    if acts {
        // A writer acted on it: it runs for its author now, not only for a visitor.
        patch["metadata"]["annotations"][ANNOTATION_WOKEN_BY_REQUEST] = Value::Null;
    }
    Effect::Patch(patch)
}

/// `/preview deploy`: restart every workload; a head commit that waits for its checks deploys
/// now, without them (for this commit only).
fn deploy_now(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    active: &str,
    short_sha: &str,
) -> (Value, String) {
    let spec = &environment.spec;
    let head = &spec.source.head_sha;
    let started = environment
        .status
        .as_ref()
        .is_some_and(|s| s.has_started(head));
    if template.spec.triggers.wait_for_checks.is_some() && !started {
        return (
            json!({"deployWithoutChecks": head, "redeploy": active, "lastActivity": active}),
            format!("deploying commit `{short_sha}` now, without waiting for its checks"),
        );
    }
    (
        json!({"redeploy": active, "lastActivity": active}),
        format!("redeploying commit `{short_sha}`: every workload restarts"),
    )
}

/// Who may give commands (asked of the forge), and which commenters without write access
/// were answered lately.
#[derive(Clone, Copy)]
pub struct Commenters<'a> {
    pub write_access: &'a WriteAccess,
    pub refusals: &'a RefusalAnswers,
}

/// Acts on a comment: returns one line per environment changed (empty when the comment holds
/// no command, or its pull request has no environment).
pub async fn handle(
    records: Records<'_>,
    commenters: Commenters<'_>,
    event: &ForgeEvent,
    comment: &Comment,
    templates: &[Arc<PreviewTemplate>],
    environments: &[Arc<PreviewEnvironment>],
    now: DateTime<Utc>,
) -> Result<Vec<String>, kube::Error> {
    let Some(parsed) = parse(&comment.body) else {
        return Ok(Vec::new());
    };
    let shown = match &parsed {
        Ok(command) => command.to_string(),
        Err(_) => "/preview".to_string(),
    };
    let mut done = Vec::new();
    for template in templates {
        let targets = environments.iter().filter(|e| {
            e.spec.template == template.name_any()
                && e.namespace() == template.namespace()
                && e.spec.source.pull_request == Some(comment.number)
                && e.metadata.deletion_timestamp.is_none()
        });
        for environment in targets {
            let namespace = environment.namespace().unwrap_or_default();
            let name = environment.name_any();
            let asked = Asked {
                event,
                comment,
                parsed: &parsed,
                shown: &shown,
            };
            let Some(effect) = decide(commenters, asked, environment, template, now).await else {
                done.push(format!(
                    "refused {shown} on {namespace}/{name} (answered lately)"
                ));
                continue;
            };
            tracing::info!(environment = %name, %namespace, user = %comment.author, command = %shown, effect = ?effect, "comment command");
            match effect {
                Effect::Delete(reason) => {
                    let by = Deleter::Command;
                    records
                        .delete_with_reason(&namespace, &name, &reason, by)
                        .await?;
                    done.push(format!("deleted {namespace}/{name} ({reason})"));
                }
                Effect::Patch(patch) => {
                    if records.answer_command(&namespace, &name, patch).await? {
                        done.push(format!("answered {shown} on {namespace}/{name}"));
                    }
                }
            }
        }
    }
    Ok(done)
}

/// A comment's command as asked: the delivery, the comment, what was parsed of it and how
/// it is shown back.
#[derive(Clone, Copy)]
struct Asked<'a> {
    event: &'a ForgeEvent,
    comment: &'a Comment,
    parsed: &'a Result<CommentCommand, String>,
    shown: &'a str,
}

/// What the command comes to for `environment`: its effect, a refusal for someone without
/// write access (or when the forge cannot say), or `None` when such a commenter was answered
/// lately and is not answered again (the edit would spend what final reports need:
/// `super::refusals`).
async fn decide(
    commenters: Commenters<'_>,
    asked: Asked<'_>,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    now: DateTime<Utc>,
) -> Option<Effect> {
    let Asked {
        event,
        comment,
        parsed,
        shown,
    } = asked;
    let access = commenters
        .write_access
        .has_write_access(template, &comment.author, comment.author_id)
        .await;
    match access {
        Err(e) => {
            tracing::warn!(repository = %event.repository, user = %comment.author, error = %e, "could not ask the forge for write access; command refused");
            Some(refusal(
                shown,
                &comment.author,
                "refused: the forge could not be asked whether you may do this; try again in a minute",
            ))
        }
        Ok(false) => {
            let uid = environment.uid().unwrap_or_default();
            let now_here = std::time::Instant::now();
            if !commenters
                .refusals
                .may_answer(&uid, &comment.author, now_here)
            {
                let (namespace, name) = (
                    environment.namespace().unwrap_or_default(),
                    environment.name_any(),
                );
                tracing::info!(environment = %name, %namespace, user = %comment.author, command = %shown, "command from someone without write access refused, not answered again");
                return None;
            }
            Some(refusal(
                shown,
                &comment.author,
                "refused: only people with write access to the repository may run commands",
            ))
        }
        Ok(true) => Some(match parsed {
            Err(why) => refusal(shown, &comment.author, &format!("not understood: {why}")),
            Ok(command) => effect(command, environment, template, &comment.author, now),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{PreviewEnvironmentSpec, PreviewTemplateSpec};

    fn now() -> DateTime<Utc> {
        "2026-11-22T10:00:00Z".parse().unwrap()
    }

    fn environment() -> PreviewEnvironment {
        let mut environment =
            PreviewEnvironment::new("web-pr-2", PreviewEnvironmentSpec::default());
        environment.spec.source.head_sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into();
        environment
    }

    fn template(policy: ForkPolicy) -> PreviewTemplate {
        let mut spec = PreviewTemplateSpec::default();
        spec.triggers.fork_policy = policy;
        PreviewTemplate::new("web", spec)
    }

    fn spec_of(effect: Effect) -> Value {
        match effect {
            Effect::Patch(patch) => patch["spec"].clone(),
            Effect::Delete(reason) => panic!("unexpected delete: {reason}"),
        }
    }

    #[test]
    fn commands_are_found_on_their_own_line_only() {
        assert_eq!(parse("LGTM"), None);
        assert_eq!(parse("see /preview deploy"), None);
        assert_eq!(parse("/previewer deploy"), None);
        assert_eq!(
            parse("Thanks!\n  /preview deploy  \n"),
            Some(Ok(CommentCommand::Deploy))
        );
        assert_eq!(parse("/preview sleep"), Some(Ok(CommentCommand::Sleep)));
        assert_eq!(parse("/preview wake"), Some(Ok(CommentCommand::Wake)));
        assert_eq!(parse("/preview destroy"), Some(Ok(CommentCommand::Destroy)));
        assert_eq!(
            parse("/preview approve EC26C3E57CA3A959CA5AAD62DE7213C562F8C821"),
            Some(Ok(CommentCommand::Approve(
                "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into()
            )))
        );
        assert_eq!(
            parse("/preview extend 3d"),
            Some(Ok(CommentCommand::Extend("3d".into(), TimeDelta::days(3))))
        );
    }

    #[test]
    fn bad_commands_get_an_answer_that_says_why() {
        let answer = |text: &str| parse(text).unwrap().unwrap_err();
        assert!(answer("/preview").contains("which command"));
        // An approval names the commit reviewed, whole: a 7-digit prefix (what GitHub shows)
        // could be shared by a commit made after the review.
        assert!(answer("/preview approve").contains("needs the commit you reviewed"));
        for short in ["ec26c3e", "ec26c3e57ca3a959ca5aad62de7213c562f8c82", "main"] {
            let said = answer(&format!("/preview approve {short}"));
            assert!(
                said.contains("is not a whole commit SHA"),
                "{short}: {said}"
            );
        }
        assert!(answer("/preview frobnicate").contains("unknown command `frobnicate`"));
        assert!(answer("/preview extend").contains("needs a duration"));
        assert!(answer("/preview extend forever").contains("`forever` is not a duration"));
        assert!(answer("/preview extend 90d").contains("longer than the 30 days"));
        assert!(answer("/preview extend 1000000000000000d").contains("not a duration"));
        assert!(answer("/preview sleep now").contains("takes no argument"));
        assert!(answer("/preview extend 3d please").contains("unexpected `please`"));
    }

    #[test]
    fn a_huge_or_hostile_argument_is_quoted_short_and_harmless() {
        let huge = format!("/preview extend {}<script>", "9".repeat(100_000));
        let answer = parse(&huge).unwrap().unwrap_err();
        assert!(answer.len() < 200, "{}", answer.len());
        assert!(!answer.contains('<'));
        let markdown = parse("/preview **bold**](http://x)").unwrap().unwrap_err();
        assert!(
            markdown.contains("`boldhttpx`") && !markdown.contains('*') && !markdown.contains("]("),
            "{markdown}"
        );
    }

    #[test]
    fn each_command_changes_what_it_says() {
        let env = environment();
        let t = template(ForkPolicy::Deny);
        let deploy = spec_of(effect(&CommentCommand::Deploy, &env, &t, "octocat", now()));
        assert_eq!(deploy["redeploy"], "2026-11-22T10:00:00Z");
        let extend = spec_of(effect(
            &CommentCommand::Extend("3d".into(), TimeDelta::days(3)),
            &env,
            &t,
            "octocat",
            now(),
        ));
        assert_eq!(extend["keepUntil"], "2026-11-25T10:00:00Z");
        assert_eq!(
            spec_of(effect(&CommentCommand::Sleep, &env, &t, "octocat", now()))["sleep"],
            true
        );
        let mut asleep = env.clone();
        asleep.spec.sleep = true;
        assert_eq!(
            spec_of(effect(&CommentCommand::Wake, &asleep, &t, "octocat", now()))["sleep"],
            false
        );
        assert_eq!(
            effect(&CommentCommand::Destroy, &env, &t, "octocat", now()),
            Effect::Delete("@octocat asked for it with `/preview destroy`".into())
        );
    }

    #[test]
    fn every_command_that_acts_but_destroy_counts_as_activity() {
        let env = environment();
        let mut asleep = env.clone();
        asleep.spec.sleep = true;
        let mut fork = env.clone();
        fork.spec.source.fork = true;
        let approving = template(ForkPolicy::RequireApproval);
        let approve = CommentCommand::Approve(fork.spec.source.head_sha.clone());
        let acting = [
            (CommentCommand::Deploy, &env),
            (
                CommentCommand::Extend("3d".into(), TimeDelta::days(3)),
                &env,
            ),
            (CommentCommand::Sleep, &env),
            (CommentCommand::Wake, &asleep),
            (CommentCommand::Wake, &env),
            (approve, &fork),
        ];
        for (command, environment) in acting {
            let Effect::Patch(patch) = effect(&command, environment, &approving, "octocat", now())
            else {
                panic!("{command} patches");
            };
            assert_eq!(
                patch["spec"]["lastActivity"], "2026-11-22T10:00:00Z",
                "{command}"
            );
            // A writer acted: the environment is its author's again, not a visitor's
            // (`reconcile::queue::Claim`).
            let annotations = &patch["metadata"]["annotations"];
            assert!(
                annotations[ANNOTATION_WOKEN_BY_REQUEST].is_null(),
                "{command}"
            );
            assert!(
                annotations
                    .as_object()
                    .unwrap()
                    .contains_key(ANNOTATION_WOKEN_BY_REQUEST)
            );
        }
        let Effect::Patch(refused) = refusal("wake", "stranger", "refused") else {
            panic!("a refusal answers");
        };
        assert!(
            !refused["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .contains_key(ANNOTATION_WOKEN_BY_REQUEST),
            "a refused command changes nothing of the claim"
        );
        assert!(matches!(
            effect(&CommentCommand::Destroy, &env, &approving, "octocat", now()),
            Effect::Delete(_)
        ));
    }

    #[test]
    fn approval_applies_to_fork_head_commits_under_require_approval_only() {
        let mut fork = environment();
        fork.spec.source.fork = true;
        let approving = template(ForkPolicy::RequireApproval);
        let approve = CommentCommand::Approve(fork.spec.source.head_sha.clone());
        let approved = spec_of(effect(&approve, &fork, &approving, "maintainer", now()));
        assert_eq!(approved["approvedSha"], fork.spec.source.head_sha.as_str());
        // A commit that is not the head (a push landed after the review): nothing approved.
        let Effect::Patch(stale) = effect(
            &CommentCommand::Approve("0123456789012345678901234567890123456789".into()),
            &fork,
            &approving,
            "maintainer",
            now(),
        ) else {
            panic!("an answer, not a deletion");
        };
        assert_eq!(stale.get("spec").map(|s| s.get("approvedSha")), None);
        assert!(stale.to_string().contains("is not the head"), "{stale}");
        // Not a fork, or a template that does not approve: only an answer.
        for (env, t) in [
            (environment(), approving.clone()),
            (fork.clone(), template(ForkPolicy::Deny)),
        ] {
            assert_eq!(
                spec_of(effect(&approve, &env, &t, "maintainer", now())),
                Value::Null
            );
        }
    }

    #[test]
    fn the_answer_reaches_the_comment_line() {
        let mut env = environment();
        let Effect::Patch(patch) = refusal(
            "/preview destroy",
            "mallory",
            "refused: only people with write access to the repository may run commands",
        ) else {
            unreachable!()
        };
        let annotation = patch["metadata"]["annotations"][ANNOTATION_LAST_COMMAND]
            .as_str()
            .unwrap()
            .to_string();
        env.metadata.annotations = Some([(ANNOTATION_LAST_COMMAND.to_string(), annotation)].into());
        assert_eq!(
            crate::model::metadata::last_command_reply(&env).unwrap(),
            "`/preview destroy` by @mallory: refused: only people with write access to the repository may run commands"
        );
    }
}
