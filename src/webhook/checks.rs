//! CI results: a check delivery (GitHub check run, check suite or commit status; GitLab
//! pipeline or job) is recorded on the environments whose head commit it is for, when their
//! template waits for checks (`triggers.waitForChecks`). The reconciler reads `spec.checks` and
//! deploys the commit once they pass; no forge request is made per delivery.
//!
//! [`patches`] is pure (templates and environments from the caches); [`record`] sends one merge
//! patch per environment (field manager `previewd-checks`).
//!
//! A check name is not proof of who ran it: anyone who can push a workflow can name a job
//! `build`. Waiting for checks decides *when* a commit deploys, never *whether* it may: fork
//! pull requests still need their approval first (see docs/security.md).

use std::sync::Arc;

use kube::ResourceExt;
use serde_json::{Map, Value, json};

use crate::cluster::records::Records;
use crate::forge::CheckResult;
use crate::model::crd::{CheckRecord, PreviewEnvironment, PreviewTemplate};

/// At most this many results are kept per commit: in "every check" mode a repository with
/// more reports than this waits for the first ones only (logged).
pub const MAX_CHECKS_PER_COMMIT: usize = 32;

/// Names longer than this are not recorded (no forge names its checks that long).
pub const MAX_CHECK_NAME: usize = 200;

/// One environment's change of `spec.checks` (merged: `null` drops a result).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckPatch {
    pub namespace: String,
    pub name: String,
    pub checks: Value,
}

/// The writes `check` makes: one per environment of a verified template that waits for it,
/// whose head is the check's commit, not deployed yet (nor begun), and that does not hold this result
/// already. Results of other commits are dropped in the same patch, so `spec.checks` stays
/// small.
pub fn patches(
    check: &CheckResult,
    templates: &[Arc<PreviewTemplate>],
    environments: &[Arc<PreviewEnvironment>],
) -> Vec<CheckPatch> {
    if check.name.chars().count() > MAX_CHECK_NAME {
        tracing::info!(sha = %check.sha, "a check name longer than {MAX_CHECK_NAME} characters is not recorded");
        return Vec::new();
    }
    let mut found = Vec::new();
    for template in templates {
        let Some(wait) = &template.spec.triggers.wait_for_checks else {
            continue;
        };
        if !wait.names.is_empty() && !wait.names.contains(&check.name) {
            continue;
        }
        let waiting = environments.iter().filter(|e| {
            e.spec.template == template.name_any()
                && e.namespace() == template.namespace()
                && e.metadata.deletion_timestamp.is_none()
                && e.spec.source.head_sha.eq_ignore_ascii_case(&check.sha)
                && !e.status.as_ref().is_some_and(|s| s.has_started(&check.sha))
        });
        found.extend(waiting.filter_map(|e| patch_for(e, check)));
    }
    found
}

/// The patch that records `check` on `environment`, if it changes anything.
fn patch_for(environment: &PreviewEnvironment, check: &CheckResult) -> Option<CheckPatch> {
    let head = &environment.spec.source.head_sha;
    let held = &environment.spec.checks;
    let record = CheckRecord {
        sha: head.clone(),
        state: check.state,
    };
    if held.get(&check.name) == Some(&record) {
        return None;
    }
    let of_head = held.iter().filter(|(_, r)| &r.sha == head);
    if !held.contains_key(&check.name) && of_head.count() >= MAX_CHECKS_PER_COMMIT {
        tracing::info!(environment = %environment.name_any(), check = %check.name, "more than {MAX_CHECKS_PER_COMMIT} checks for one commit: this one is not recorded");
        return None;
    }
    let mut checks = Map::new();
    for (name, stale) in held {
        if &stale.sha != head {
            checks.insert(name.clone(), Value::Null);
        }
    }
    checks.insert(check.name.clone(), json!(record));
    Some(CheckPatch {
        namespace: environment.namespace().unwrap_or_default(),
        name: environment.name_any(),
        checks: Value::Object(checks),
    })
}

/// Writes the patches; returns one line per environment written. An environment deleted in
/// the meantime is skipped.
pub async fn record(
    records: Records<'_>,
    patches: &[CheckPatch],
) -> Result<Vec<String>, kube::Error> {
    let mut done = Vec::new();
    for write in patches {
        let (namespace, name) = (&write.namespace, &write.name);
        if records
            .record_checks(namespace, name, &write.checks)
            .await?
        {
            done.push(format!(
                "recorded the check on {}/{}",
                write.namespace, write.name
            ));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{
        CheckState, PreviewEnvironmentSpec, PreviewEnvironmentStatus, PreviewTemplateSpec, Source,
        WaitForChecks,
    };

    const HEAD: &str = "1f2e3d4c5b6a79880716253443526170f8e9dacb";

    fn template(names: &[&str]) -> Arc<PreviewTemplate> {
        let mut spec: PreviewTemplateSpec =
            serde_json::from_value(json!({"forge": {"kind": "github", "repository": "o/r"},
                "manifests": {"inline": []}}))
            .unwrap();
        spec.triggers.wait_for_checks = Some(WaitForChecks {
            names: names.iter().map(|n| n.to_string()).collect(),
            timeout: None,
        });
        let mut template = PreviewTemplate::new("app", spec);
        template.metadata.namespace = Some("team".into());
        Arc::new(template)
    }

    fn environment(head: &str, deployed: Option<&str>) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new(
            "app-pr-2",
            PreviewEnvironmentSpec {
                template: "app".into(),
                source: Source {
                    head_sha: head.into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        environment.metadata.namespace = Some("team".into());
        environment.status = Some(PreviewEnvironmentStatus {
            deployed_sha: deployed.map(str::to_string),
            ..Default::default()
        });
        environment
    }

    fn check(name: &str, state: CheckState) -> CheckResult {
        CheckResult {
            sha: HEAD.into(),
            name: name.into(),
            state,
        }
    }

    #[test]
    fn a_result_for_the_waiting_head_is_recorded_and_stale_commits_are_dropped() {
        let mut env = environment(HEAD, Some("0000000000000000000000000000000000000000"));
        env.spec.checks.insert(
            "build".into(),
            CheckRecord {
                sha: "0000000000000000000000000000000000000000".into(),
                state: CheckState::Success,
            },
        );
        let found = patches(
            &check("build", CheckState::Pending),
            &[template(&["build"])],
            &[Arc::new(env)],
        );
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].checks,
            json!({"build": {"sha": HEAD, "state": "Pending"}})
        );
        assert_eq!(
            (found[0].namespace.as_str(), found[0].name.as_str()),
            ("team", "app-pr-2")
        );
    }

    #[test]
    fn nothing_is_written_that_would_change_nothing_or_is_not_waited_for() {
        let templates = [template(&["build"])];
        let pending = check("build", CheckState::Pending);
        // Another commit's environment, an already deployed head, another check's name.
        let other_head = environment("abc", None);
        let deployed = environment(HEAD, Some(HEAD));
        for env in [other_head, deployed] {
            assert!(patches(&pending, &templates, &[Arc::new(env)]).is_empty());
        }
        let env = Arc::new(environment(HEAD, None));
        assert!(
            patches(
                &check("lint", CheckState::Failure),
                &templates,
                std::slice::from_ref(&env)
            )
            .is_empty()
        );
        // The same result again (a redelivery, or a second check event of one run).
        let mut recorded = environment(HEAD, None);
        recorded.spec.checks.insert(
            "build".into(),
            CheckRecord {
                sha: HEAD.into(),
                state: CheckState::Pending,
            },
        );
        assert!(patches(&pending, &templates, &[Arc::new(recorded)]).is_empty());
        // A template that does not wait for checks records nothing.
        let mut plain = (*template(&[])).clone();
        plain.spec.triggers.wait_for_checks = None;
        assert!(patches(&pending, &[Arc::new(plain)], &[env]).is_empty());
    }

    #[test]
    fn every_check_mode_records_any_name_up_to_the_cap_and_refuses_giant_names() {
        let templates = [template(&[])];
        let mut env = environment(HEAD, None);
        for n in 0..MAX_CHECKS_PER_COMMIT {
            env.spec.checks.insert(
                format!("job-{n}"),
                CheckRecord {
                    sha: HEAD.into(),
                    state: CheckState::Success,
                },
            );
        }
        let env = Arc::new(env);
        let known = check("job-3", CheckState::Failure);
        assert_eq!(
            patches(&known, &templates, std::slice::from_ref(&env)).len(),
            1,
            "a known name is updated"
        );
        let one_too_many = check("job-extra", CheckState::Pending);
        assert!(patches(&one_too_many, &templates, std::slice::from_ref(&env)).is_empty());
        let giant = check(&"x".repeat(MAX_CHECK_NAME + 1), CheckState::Success);
        assert!(patches(&giant, &templates, &[Arc::new(environment(HEAD, None))]).is_empty());
    }
}
