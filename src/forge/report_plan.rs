//! What a report to the forge sends, decided without calling anything: from the environment,
//! the status about to be written and what was sent before (`status.forge`, the record). The
//! reporter ([`super::report`]) carries a plan out and fills in the ids the forge gives back.
//!
//! Each part is there only when what it would say changed since it was last sent, so an
//! unchanged environment plans nothing and costs no forge call.

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::comment::{self, CommentInput, CommentState, CommitState};
use super::forges;
use super::vocabulary::DeploymentState;
pub use super::vocabulary::{DeployUpdate, Retire, StatusUpdate};
use crate::model::crd::{
    ForgeKind, ForgeReport, Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate,
    WaitingCommit,
};
use crate::model::footprint::Prices;

/// What to send for a live environment.
#[derive(Debug, Default, PartialEq)]
pub struct ReportPlan {
    /// The comment's new text (pull/merge requests only).
    pub comment: Option<CommentUpdate>,
    /// The commit status of a held-back head.
    pub waiting: Option<StatusUpdate>,
    /// The head's deployment and commit status (none while the head itself is held back).
    pub deploy: Option<DeployUpdate>,
}

/// The one comment's text, and which comment it is.
#[derive(Debug, PartialEq)]
pub struct CommentUpdate {
    pub number: u64,
    /// `<namespace>/<name>`, the comment's hidden marker.
    pub environment: String,
    pub text: String,
    /// SHA-256 of `text`, for `status.forge.commentSha`.
    pub sha: String,
}

/// What to send when the environment is gone.
#[derive(Debug, Default, PartialEq)]
pub struct RemovalPlan {
    pub comment: Option<CommentUpdate>,
    pub retire: Option<Retire>,
}

/// One part of a plan as the content budget counts it ([`super::budget`]): which part, the
/// hash of what it says, and the content-creating requests sending it makes, by kind
/// (`comment`, `commit_status`, `deployment`, `deployment_status`, `environment`).
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPart {
    pub part: &'static str,
    pub sha: String,
    pub requests: Vec<&'static str>,
}

impl ReportPlan {
    /// The parts of this plan, with the requests each makes on `forge` given `record`.
    pub fn parts(&self, forge: ForgeKind, record: &ForgeReport, head: &str) -> Vec<PlannedPart> {
        let mut parts = Vec::new();
        if let Some(update) = &self.comment {
            parts.push(comment_part(update));
        }
        if let Some(update) = &self.waiting {
            parts.push(PlannedPart {
                part: "waiting",
                sha: update.sha.clone(),
                requests: vec!["commit_status"],
            });
        }
        if let Some(update) = &self.deploy {
            let mut requests = (forges::forge(forge).deploy_requests)(update, record, head);
            requests.push("commit_status");
            parts.push(PlannedPart {
                part: "deploy",
                sha: update.status.sha.clone(),
                requests,
            });
        }
        parts
    }
}

impl RemovalPlan {
    /// The parts of this plan, as [`ReportPlan::parts`] counts them.
    pub fn parts(&self) -> Vec<PlannedPart> {
        let mut parts: Vec<PlannedPart> = self.comment.iter().map(comment_part).collect();
        if let Some(retire) = &self.retire {
            parts.push(PlannedPart {
                part: "retire",
                sha: String::new(),
                requests: vec![retire.request],
            });
        }
        parts
    }
}

fn comment_part(update: &CommentUpdate) -> PlannedPart {
    PlannedPart {
        part: "comment",
        sha: update.sha.clone(),
        requests: vec!["comment"],
    }
}

/// What a report of `status` sends, given what `record` says was sent.
pub fn plan_report(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    status: &PreviewEnvironmentStatus,
    record: &ForgeReport,
    prices: Option<&Prices>,
) -> ReportPlan {
    let source = &environment.spec.source;
    let comment = comment_update(environment, record, |id| {
        comment::render(&CommentInput {
            environment: id,
            head_sha: &source.head_sha,
            state: CommentState::Live(status),
            expires_at: crate::model::clock::expires_at(environment, template),
            last_command: crate::model::metadata::last_command_reply(environment),
            prices,
        })
    });
    let context = format!("previewd/{}", template.name_any());
    let waiting = status
        .waiting
        .as_ref()
        .map(|waiting| waiting_status(waiting, &context))
        .filter(|update| record.waiting_status_sha.as_deref() != Some(update.sha.as_str()));
    let head_held = status
        .waiting
        .as_ref()
        .is_some_and(|waiting| waiting.sha == source.head_sha);
    let deploy = if head_held {
        // Nothing of this commit runs: no deployment, no status of a deploy.
        None
    } else {
        Some(deploy_update(environment, status, context))
            .filter(|update| record.status_sha.as_deref() != Some(update.status.sha.as_str()))
    };
    ReportPlan {
        comment,
        waiting,
        deploy,
    }
}

/// What the forge is told when the environment is gone: the comment says why, and the
/// forge's deployment or environment ends. Nothing once `record.destroyed` says it heard.
pub fn plan_removal(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    reason: &str,
    record: &ForgeReport,
) -> RemovalPlan {
    if record.destroyed {
        return RemovalPlan::default();
    }
    let comment = comment_update(environment, record, |id| {
        comment::render(&CommentInput {
            environment: id,
            head_sha: &environment.spec.source.head_sha,
            state: CommentState::Destroyed { reason },
            expires_at: None,
            last_command: None,
            prices: None,
        })
    });
    let retire = (forges::forge(template.spec.forge.kind).retire)(record);
    RemovalPlan { comment, retire }
}

/// The comment's update, if the environment is a PR/MR's and the text `render` gives for its
/// marker id changed. A branch environment has no comment: nothing is rendered for it.
fn comment_update(
    environment: &PreviewEnvironment,
    record: &ForgeReport,
    render: impl FnOnce(&str) -> String,
) -> Option<CommentUpdate> {
    let number = environment.spec.source.pull_request?;
    let id = marker_id(environment);
    let text = render(&id);
    let sha = sha_hex(&text);
    (record.comment_sha.as_deref() != Some(sha.as_str())).then_some(CommentUpdate {
        number,
        environment: id,
        text,
        sha,
    })
}

/// The commit status of a held-back head: pending while it waits, failed when its checks
/// failed or timed out, success when it is skipped, with the reason as the description.
fn waiting_status(waiting: &WaitingCommit, context: &str) -> StatusUpdate {
    let state = match (waiting.failed(), waiting.skipped()) {
        (true, _) => CommitState::Failure,
        // Nothing to wait for: a required `previewd/<template>` status must not block merging.
        (false, true) => CommitState::Success,
        (false, false) => CommitState::Pending,
    };
    let description: String = waiting.message.chars().take(140).collect();
    StatusUpdate {
        sha: sha_hex(&format!("{state:?} {} {description}", waiting.sha)),
        commit: waiting.sha.clone(),
        state,
        context: context.to_string(),
        url: String::new(),
        description,
    }
}

fn deploy_update(
    environment: &PreviewEnvironment,
    status: &PreviewEnvironmentStatus,
    context: String,
) -> DeployUpdate {
    let head = &environment.spec.source.head_sha;
    let url = status.url.clone().unwrap_or_default();
    let state = comment::commit_state(status.phase);
    let deployment_state = match state {
        CommitState::Success => DeploymentState::Success,
        CommitState::Failure => DeploymentState::Failure,
        CommitState::Pending | CommitState::Running => DeploymentState::InProgress,
    };
    DeployUpdate {
        status: StatusUpdate {
            sha: sha_hex(&format!("{state:?} {head} {url}")),
            commit: head.clone(),
            state,
            context,
            url,
            description: describe(status),
        },
        deployment_state,
    }
}

/// `<namespace>/<name>`: the comment's marker names the environment.
fn marker_id(environment: &PreviewEnvironment) -> String {
    format!(
        "{}/{}",
        environment.namespace().unwrap_or_default(),
        environment.name_any()
    )
}

/// One line for the commit status (forges cap it at 140 characters).
fn describe(status: &PreviewEnvironmentStatus) -> String {
    let text = match status.phase {
        Phase::Ready => "Preview environment ready".to_string(),
        Phase::Degraded => {
            let why = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.message.as_str())
                .unwrap_or("");
            format!("Preview environment degraded: {why}")
        }
        phase => format!("Preview environment: {phase:?}"),
    };
    text.chars().take(140).collect()
}

fn sha_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{PreviewEnvironmentSpec, PreviewTemplateSpec};

    const HEAD: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";

    fn environment(pull_request: Option<u64>) -> PreviewEnvironment {
        let mut environment =
            PreviewEnvironment::new("web-pr-2", PreviewEnvironmentSpec::default());
        environment.metadata.namespace = Some("team".into());
        environment.spec.source.head_sha = HEAD.into();
        environment.spec.source.pull_request = pull_request;
        environment
    }

    fn template(kind: ForgeKind) -> PreviewTemplate {
        let mut spec = PreviewTemplateSpec::default();
        spec.forge.kind = kind;
        PreviewTemplate::new("web", spec)
    }

    fn status(phase: Phase) -> PreviewEnvironmentStatus {
        PreviewEnvironmentStatus {
            phase,
            url: Some("https://pr-2.preview.example.com".into()),
            ..Default::default()
        }
    }

    /// The record after `plan` was carried out.
    fn after(plan: &ReportPlan, mut record: ForgeReport) -> ForgeReport {
        if let Some(comment) = &plan.comment {
            record.comment_sha = Some(comment.sha.clone());
        }
        if let Some(waiting) = &plan.waiting {
            record.waiting_status_sha = Some(waiting.sha.clone());
        }
        if let Some(deploy) = &plan.deploy {
            record.status_sha = Some(deploy.status.sha.clone());
        }
        record
    }

    #[test]
    fn a_new_ready_environment_gets_its_comment_deployment_and_status_then_nothing_more() {
        let (environment, template) = (environment(Some(2)), template(ForgeKind::Github));
        let ready = status(Phase::Ready);
        let first = plan_report(&environment, &template, &ready, &Default::default(), None);
        let comment = first.comment.as_ref().expect("a comment");
        assert_eq!(
            (comment.number, comment.environment.as_str()),
            (2, "team/web-pr-2")
        );
        assert!(comment.text.contains("ready"), "{}", comment.text);
        let deploy = first.deploy.as_ref().expect("a deployment");
        assert_eq!(deploy.deployment_state, DeploymentState::Success);
        assert_eq!(deploy.status.state, CommitState::Success);
        assert_eq!(deploy.status.context, "previewd/web");
        assert_eq!(deploy.status.commit, HEAD);
        assert_eq!(first.waiting, None);

        let sent = after(&first, ForgeReport::default());
        let again = plan_report(&environment, &template, &ready, &sent, None);
        assert_eq!(again, ReportPlan::default(), "unchanged: nothing to send");
    }

    #[test]
    fn a_phase_change_sends_the_comment_and_status_again() {
        let (environment, template) = (environment(Some(2)), template(ForgeKind::Github));
        let deploying = plan_report(
            &environment,
            &template,
            &status(Phase::Deploying),
            &Default::default(),
            None,
        );
        let sent = after(&deploying, ForgeReport::default());
        let ready = plan_report(&environment, &template, &status(Phase::Ready), &sent, None);
        assert!(ready.comment.is_some());
        let deploy = ready.deploy.expect("the status changes");
        assert_eq!(deploy.deployment_state, DeploymentState::Success);
    }

    #[test]
    fn deploying_degraded_ready_and_sleeping_map_to_the_documented_states_and_carry_the_url() {
        let (environment, template) = (environment(Some(2)), template(ForgeKind::Github));
        // forges.md: deployment statuses `in_progress`, `failure`, `success`.
        let cases = [
            (Phase::Deploying, DeploymentState::InProgress),
            (Phase::Degraded, DeploymentState::Failure),
            (Phase::Ready, DeploymentState::Success),
            (Phase::Sleeping, DeploymentState::Success),
        ];
        for (phase, expected) in cases {
            let plan = plan_report(
                &environment,
                &template,
                &status(phase),
                &Default::default(),
                None,
            );
            let deploy = plan
                .deploy
                .unwrap_or_else(|| panic!("{phase:?}: no deployment"));
            assert_eq!(deploy.deployment_state, expected, "{phase:?}");
            // The URL the deployment status (`environment_url`) and the commit status
            // (`target_url`) carry.
            assert_eq!(
                deploy.status.url, "https://pr-2.preview.example.com",
                "{phase:?}"
            );
        }
        // lifecycle.md: asleep, the commit status stays `success`, as when it was ready.
        let asleep = plan_report(
            &environment,
            &template,
            &status(Phase::Sleeping),
            &Default::default(),
            None,
        );
        assert_eq!(asleep.deploy.unwrap().status.state, CommitState::Success);
    }

    #[test]
    fn a_held_back_head_gets_only_its_pending_status() {
        let (environment, template) = (environment(Some(2)), template(ForgeKind::Gitlab));
        let mut held = status(Phase::Pending);
        held.waiting = Some(WaitingCommit {
            sha: HEAD.into(),
            message: "waiting for /preview approve".into(),
            ..Default::default()
        });
        let plan = plan_report(&environment, &template, &held, &Default::default(), None);
        let waiting = plan.waiting.expect("the held head's status");
        assert_eq!(waiting.state, CommitState::Pending);
        assert_eq!(waiting.description, "waiting for /preview approve");
        assert_eq!(
            plan.deploy, None,
            "no deployment for a commit that does not run"
        );
    }

    #[test]
    fn a_held_back_new_head_gets_its_status_while_the_running_one_keeps_its_deployment() {
        let (environment, template) = (environment(Some(2)), template(ForgeKind::Github));
        let mut running = status(Phase::Ready);
        running.waiting = Some(WaitingCommit {
            sha: "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c".into(),
            reason: crate::model::crd::WaitingReason::AwaitingChecks,
            message: "waiting for `build`".into(),
            ..Default::default()
        });
        let plan = plan_report(&environment, &template, &running, &Default::default(), None);
        let waiting = plan.waiting.as_ref().expect("the new head's status");
        assert_eq!(waiting.commit, "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c");
        assert_eq!(waiting.state, CommitState::Pending);
        let deploy = plan.deploy.as_ref().expect("the running head's deployment");
        assert_eq!(deploy.status.commit, HEAD);

        let sent = after(&plan, ForgeReport::default());
        let again = plan_report(&environment, &template, &running, &sent, None);
        assert_eq!((again.waiting, again.deploy), (None, None), "sent once");
    }

    #[test]
    fn a_branch_environment_has_no_comment() {
        let (environment, template) = (environment(None), template(ForgeKind::Github));
        let plan = plan_report(
            &environment,
            &template,
            &status(Phase::Ready),
            &Default::default(),
            None,
        );
        assert_eq!(plan.comment, None);
        assert!(plan.deploy.is_some());
    }

    #[test]
    fn a_removal_says_why_and_retires_the_forges_record_once() {
        let environment = environment(Some(2));
        let record = ForgeReport {
            deployment_id: Some(77),
            environment_id: Some(9),
            ..Default::default()
        };
        let github = plan_removal(
            &environment,
            &template(ForgeKind::Github),
            "merged",
            &record,
        );
        let comment = github.comment.expect("the comment says so");
        assert!(comment.text.contains("destroyed") && comment.text.contains("merged"));
        assert_eq!(
            github.retire,
            Some(Retire {
                id: 77,
                request: "deployment_status"
            })
        );
        let gitlab = plan_removal(
            &environment,
            &template(ForgeKind::Gitlab),
            "merged",
            &record,
        );
        assert_eq!(
            gitlab.retire,
            Some(Retire {
                id: 9,
                request: "environment"
            })
        );

        let branch = plan_removal(
            &self::environment(None),
            &template(ForgeKind::Github),
            "branch deleted",
            &ForgeReport::default(),
        );
        assert_eq!(
            branch,
            RemovalPlan::default(),
            "nothing to retire, no comment"
        );

        let heard = ForgeReport {
            destroyed: true,
            ..record
        };
        let again = plan_removal(&environment, &template(ForgeKind::Github), "merged", &heard);
        assert_eq!(again, RemovalPlan::default(), "told once");
    }
}
