//! previewd in the forge's workflow, against a real kube-apiserver with the forge API served by
//! wiremock: a new commit waits for CI (GitHub check runs and commit statuses, GitLab pipeline
//! hooks) while the commit deployed before keeps running, and `/preview deploy` skips the wait.
//!
//! Deliveries: pull requests and merge requests are the fixtures in `../shared/fixtures`
//! (`github/pull_request.opened.json`, `synchronize.json`, `gitlab/merge_request.json`), with
//! the head SHA changed in copies. The fixtures have no check deliveries: [`check_run`],
//! [`commit_status`] and [`pipeline`] write them in the shape of GitHub's "Webhook events and
//! payloads" (`check_run`, `status`; the fields previewd reads and their neighbours, as in
//! octokit/webhooks' `check_run/completed.payload.json`) and GitLab's "Webhook events"
//! (Pipeline events).

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use serde_json::json;
use support::webhooks::*;
use support::{eventually, in_namespace, wait_for_phase};
use wiremock::MockServer;

const FIRST: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
const SECOND: &str = "1f2e3d4c5b6a79880716253443526170f8e9dacb";
const THIRD: &str = "3333333333333333333333333333333333333333";

/// A `check_run` delivery for `sha`: `status` is `queued`, `in_progress` or `completed` (then
/// with `conclusion`).
fn check_run(name: &str, sha: &str, status: &str, conclusion: Option<&str>) -> Vec<u8> {
    let action = if status == "completed" {
        "completed"
    } else {
        "created"
    };
    json!({
        "action": action,
        "check_run": {
            "id": 128620228, "head_sha": sha, "external_id": "", "name": name,
            "status": status, "conclusion": conclusion,
            "started_at": "2019-05-15T15:21:12Z",
            "check_suite": {"id": 118578147, "head_branch": "changes", "head_sha": sha},
            "app": {"id": 15368, "slug": "github-actions", "name": "GitHub Actions"},
            "pull_requests": [{"number": 2, "head": {"ref": "changes", "sha": sha}}]
        },
        "repository": {"id": 186853002, "name": "Hello-World", "full_name": GITHUB_REPOSITORY},
        "sender": {"login": "Codertocat", "id": 21031067}
    })
    .to_string()
    .into_bytes()
}

/// A `status` delivery (a commit status set by a CI service without a GitHub App).
fn commit_status(context: &str, sha: &str, state: &str) -> Vec<u8> {
    json!({
        "id": 6805126730_u64, "sha": sha, "name": GITHUB_REPOSITORY, "context": context,
        "state": state, "description": "The build is running", "target_url": null,
        "branches": [{"name": "changes", "commit": {"sha": sha}}],
        "repository": {"id": 186853002, "name": "Hello-World", "full_name": GITHUB_REPOSITORY},
        "sender": {"login": "Codertocat", "id": 21031067}
    })
    .to_string()
    .into_bytes()
}

fn synchronize_to(sha: &str) -> Vec<u8> {
    let mut delivery = json_fixture("github/pull_request.synchronize.json");
    delivery["pull_request"]["head"]["sha"] = sha.into();
    delivery.to_string().into_bytes()
}

async fn config_map_sha(client: &kube::Client, namespace: &str) -> String {
    let map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get("app")
        .await
        .unwrap();
    map.data.unwrap()["sha"].clone()
}

/// Waits until the environment holds `sha` back for `reason`.
async fn wait_held(
    environments: &Api<PreviewEnvironment>,
    name: &str,
    sha: &str,
    reason: &str,
) -> PreviewEnvironment {
    eventually(
        &format!("{name} to hold {sha} back ({reason})"),
        Duration::from_secs(30),
        || async {
            let environment = environments.get(name).await.ok()?;
            let waiting = environment.status.as_ref()?.waiting.as_ref()?;
            (waiting.sha == sha && waiting.reason.as_str() == reason).then_some(environment)
        },
    )
    .await
}

/// Waits until previewd sent a commit status for `sha` whose body contains `needle`.
async fn commit_status_says(forge: &MockServer, sha: &str, needle: &str) {
    eventually(
        &format!("a commit status of {sha} saying {needle:?}"),
        Duration::from_secs(30),
        || async {
            (sent(forge, "POST", &format!("/statuses/{sha}"), needle).await > 0).then_some(())
        },
    )
    .await
}

/// The requests previewd made that would ask the forge about a commit's CI (check runs and
/// suites, a commit's statuses read back, pipelines, jobs): the forge tells previewd by its
/// deliveries, so there should be none. Setting a commit status (a POST) is a report, not a
/// question, and is not listed.
async fn ci_questions(forge: &MockServer) -> Vec<String> {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| {
            let path = r.url.path();
            let reads_statuses = r.method.as_str() == "GET"
                && (path.contains("/statuses") || path.ends_with("/status"));
            reads_statuses
                || [
                    "/check-runs",
                    "/check-suites",
                    "/commits/",
                    "/pipelines",
                    "/jobs",
                ]
                .iter()
                .any(|part| path.contains(part))
        })
        .map(|r| format!("{} {}", r.method.as_str(), r.url.path()))
        .collect()
}

/// A new commit waits for its named check while the commit deployed before keeps running; the
/// check results are recorded in `spec.checks` by the field manager `previewd-checks`, and
/// recording them asks the forge nothing.
#[tokio::test]
async fn a_new_commit_waits_for_its_checks_while_the_previous_one_keeps_running() {
    in_namespace("workflow-checks", |client, ns| async move {
        let forge = github_forge().await;
        with_permissions(&forge).await;
        let wait = json!({"triggers": {"waitForChecks": {"names": ["build-image"]}}});
        let app = format!("{CONFIG_MAP_APP}---\n{INGRESS_FOR_HOST}");
        install_template_with(&client, &ns, "github", GITHUB_REPOSITORY, Some(&forge.uri()), wait, &app).await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;

        // The first commit: nothing runs until its image is built.
        let name = harness.open_pull_request(2, FIRST).await;
        let first = wait_for_phase(&harness.environments, &name, Phase::Pending, Duration::from_secs(30)).await;
        let status = first.status.unwrap();
        assert_eq!(status.waiting.unwrap().reason.as_str(), "AwaitingChecks");
        assert_eq!(status.namespace, None, "nothing deployed");
        comment_says(&forge, &name, "waiting for `build-image` (not reported yet)").await;
        commit_status_says(&forge, FIRST, "\"pending\"").await;
        // Another check, and the same check of another commit, change nothing.
        let (code, answer) = harness.signed("check_run", "c-lint", &check_run("lint", FIRST, "completed", Some("success"))).await;
        assert_eq!((code, answer["outcome"].as_str()), (202, Some("unchanged")), "{answer}");
        let (code, _) = harness.signed("check_run", "c-other", &check_run("build-image", THIRD, "completed", Some("success"))).await;
        assert_eq!(code, 202);
        harness.poke_and_wait_for_a_reconcile(&name, 1).await;
        assert_eq!(harness.environments.get(&name).await.unwrap().status.unwrap().phase, Phase::Pending);

        let (code, answer) = harness.signed("check_run", "c-1", &check_run("build-image", FIRST, "completed", Some("success"))).await;
        assert_eq!(code, 202, "{answer}");
        let ready = wait_ready_with_sha(&harness.environments, &name, FIRST).await;
        let target = ready.status.unwrap().namespace.unwrap();
        assert_eq!(ready.spec.checks["build-image"].sha, FIRST);

        // A new commit whose image is being built: the first keeps running, Ready.
        harness.signed("pull_request", "sync-2", &synchronize_to(SECOND)).await;
        // A check delivery counts once previewd has seen the push that makes its commit the
        // head (an earlier one is not recorded; CI reports the commit again when it finishes).
        wait_held(&harness.environments, &name, SECOND, "AwaitingChecks").await;
        harness.signed("check_run", "c-2", &check_run("build-image", SECOND, "in_progress", None)).await;
        let held = eventually("the wait to name the running check", Duration::from_secs(30), || async {
            let environment = harness.environments.get(&name).await.ok()?;
            let message = &environment.status.as_ref()?.waiting.as_ref()?.message;
            message.contains("(running)").then_some(environment)
        })
        .await;
        // The running check is recorded on the environment by its own field manager...
        let owners: Vec<String> = held
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|entry| {
                entry.fields_v1.as_ref().is_some_and(|fields| {
                    fields.0["f:spec"]["f:checks"]
                        .get("f:build-image")
                        .is_some()
                })
            })
            .filter_map(|entry| entry.manager.clone())
            .collect();
        assert_eq!(
            owners,
            ["previewd-checks"],
            "the managers owning spec.checks.build-image: {:?}",
            held.metadata.managed_fields
        );
        // ... and neither recording it nor deciding from it asked the forge about the commit.
        let asked = ci_questions(&forge).await;
        assert!(asked.is_empty(), "no forge request for a check delivery: {asked:?}");
        let status = held.status.unwrap();
        assert_eq!(status.phase, Phase::Ready, "the previous commit still serves");
        assert_eq!(status.deployed_sha.as_deref(), Some(FIRST));
        assert_eq!(config_map_sha(&client, &target).await, FIRST);
        comment_says(&forge, &name, "**Not deployed yet** (commit `ec26c3e` keeps running meanwhile):\n```text\nCommit `1f2e3d4` deploys once CI passes: waiting for `build-image` (running).\n```").await;
        commit_status_says(&forge, SECOND, "deploys once CI passes").await;

        // It fails: still the first commit, and both the comment and the status say so.
        harness.signed("check_run", "c-3", &check_run("build-image", SECOND, "completed", Some("failure"))).await;
        wait_held(&harness.environments, &name, SECOND, "ChecksFailed").await;
        comment_says(&forge, &name, "CI reported a failure of `build-image`").await;
        commit_status_says(&forge, SECOND, "\"failure\"").await;
        assert_eq!(config_map_sha(&client, &target).await, FIRST);
        assert_eq!(
            sent(&forge, "POST", "/deployments", SECOND).await,
            0,
            "no GitHub deployment for a commit that is not deployed"
        );

        // Re-run, passed: the second commit deploys.
        harness.signed("check_run", "c-4", &check_run("build-image", SECOND, "completed", Some("success"))).await;
        let ready = wait_ready_with_sha(&harness.environments, &name, SECOND).await;
        assert_eq!(ready.status.unwrap().waiting, None);
        assert_eq!(config_map_sha(&client, &target).await, SECOND);
        assert!(sent(&forge, "POST", "/deployments", SECOND).await >= 1);

        // A third commit never gets its check: a maintainer deploys it anyway.
        harness.signed("pull_request", "sync-3", &synchronize_to(THIRD)).await;
        wait_held(&harness.environments, &name, THIRD, "AwaitingChecks").await;
        harness.signed("issue_comment", "deploy-3", &comment_on(2, "maintainer", "/preview deploy")).await;
        wait_ready_with_sha(&harness.environments, &name, THIRD).await;
        comment_says(&forge, &name, "deploying commit `3333333` now, without waiting for its checks").await;
        assert_eq!(config_map_sha(&client, &target).await, THIRD);

        let metrics = harness.metrics().await;
        assert_eq!(
            metric_value(&metrics, r#"previewd_webhook_deliveries_total{event="check",forge="github",outcome="accepted"}"#),
            Some(4.0),
            "the 4 check results recorded:\n{metrics}"
        );
        // Six check deliveries in all, and not one question to the forge about a commit's CI.
        let asked = ci_questions(&forge).await;
        assert!(asked.is_empty(), "no forge request for check deliveries: {asked:?}");
    })
    .await;
}

#[tokio::test]
async fn every_check_mode_waits_for_all_reported_commit_statuses() {
    in_namespace("workflow-statuses", |client, ns| async move {
        let forge = github_forge().await;
        let wait = json!({"triggers": {"waitForChecks": {"timeout": "10m"}}});
        install_template_with(
            &client,
            &ns,
            "github",
            GITHUB_REPOSITORY,
            Some(&forge.uri()),
            wait,
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        let name = harness.open_pull_request(2, FIRST).await;
        let held = wait_held(&harness.environments, &name, FIRST, "AwaitingChecks").await;
        assert!(
            held.status
                .unwrap()
                .waiting
                .unwrap()
                .message
                .contains("none reported yet")
        );
        harness
            .signed(
                "status",
                "s-1",
                &commit_status("ci/circleci: build", FIRST, "pending"),
            )
            .await;
        harness
            .signed(
                "status",
                "s-2",
                &commit_status("ci/circleci: test", FIRST, "success"),
            )
            .await;
        // Once both are recorded, only the one still running is waited for.
        eventually(
            "the wait for the build only",
            Duration::from_secs(30),
            || async {
                let environment = harness.environments.get(&name).await.ok()?;
                let message = environment.status?.waiting?.message;
                message
                    .ends_with("waiting for `ci/circleci: build` (running).")
                    .then_some(())
            },
        )
        .await;
        harness
            .signed(
                "status",
                "s-3",
                &commit_status("ci/circleci: build", FIRST, "success"),
            )
            .await;
        wait_ready_with_sha(&harness.environments, &name, FIRST).await;
    })
    .await;
}

/// A Pipeline Hook delivery for `sha` (GitLab's "Pipeline events", trimmed).
fn pipeline(project: &str, sha: &str, status: &str) -> Vec<u8> {
    json!({
        "object_kind": "pipeline",
        "object_attributes": {"id": 31, "iid": 3, "ref": "ms-viewport", "tag": false, "sha": sha,
            "source": "merge_request_event", "status": status, "stages": ["build", "test"]},
        "merge_request": {"id": 1, "iid": 1, "source_branch": "ms-viewport", "target_branch": "master"},
        "user": {"id": 1, "name": "Administrator", "username": "root"},
        "project": {"id": 1, "name": "Gitlab Test", "path_with_namespace": project},
        "builds": [{"id": 380, "stage": "build", "name": "build-image", "status": status}]
    })
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn gitlab_a_merge_request_deploys_once_its_pipeline_succeeded() {
    in_namespace("workflow-gitlab", |client, ns| async move {
        let forge = gitlab_forge().await;
        let project = "gitlabhq/gitlab-test";
        let wait = json!({"triggers": {"waitForChecks": {"names": ["pipeline"]}}});
        install_template_with(
            &client,
            &ns,
            "gitlab",
            project,
            Some(&forge.uri()),
            wait,
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        let opened = gitlab_fixture_bytes("gitlab/merge_request.json");
        let sha =
            json_fixture("gitlab/merge_request.json")["object_attributes"]["last_commit"]["id"]
                .as_str()
                .unwrap()
                .to_string();
        let (code, answer) = harness
            .gitlab("Merge Request Hook", "mr-1", &opened, SECRET)
            .await;
        assert_eq!(code, 202, "{answer}");
        let name = harness.environment_names().await.pop().unwrap();
        wait_held(&harness.environments, &name, &sha, "AwaitingChecks").await;

        harness
            .gitlab(
                "Pipeline Hook",
                "p-1",
                &pipeline(project, &sha, "running"),
                SECRET,
            )
            .await;
        harness
            .gitlab(
                "Pipeline Hook",
                "p-2",
                &pipeline(project, &sha, "failed"),
                SECRET,
            )
            .await;
        let failed = wait_held(&harness.environments, &name, &sha, "ChecksFailed").await;
        assert_eq!(
            failed.status.unwrap().phase,
            Phase::Degraded,
            "a first commit that failed CI"
        );
        assert_eq!(
            sent(&forge, "POST", &format!("/statuses/{sha}"), "state=failed").await,
            1,
            "the commit status says failed, once"
        );
        // Retried, passed.
        harness
            .gitlab(
                "Pipeline Hook",
                "p-3",
                &pipeline(project, &sha, "success"),
                SECRET,
            )
            .await;
        wait_ready_with_sha(&harness.environments, &name, &sha).await;
        // Three pipeline deliveries decided it, with no question to GitLab about the pipeline.
        let asked = ci_questions(&forge).await;
        assert!(
            asked.is_empty(),
            "no GitLab request for pipeline deliveries: {asked:?}"
        );
    })
    .await;
}

fn gitlab_fixture_bytes(path: &str) -> Vec<u8> {
    std::fs::read(support::fixture(path)).unwrap()
}

/// How many requests to the GitLab API whose path ends with `path_end` and whose (form) body
/// contains every one of `needles`.
async fn gitlab_sent(forge: &MockServer, verb: &str, path_end: &str, needles: &[&str]) -> usize {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.method.as_str() == verb && r.url.path().ends_with(path_end))
        .filter(|r| {
            let body = String::from_utf8_lossy(&r.body);
            needles.iter().all(|needle| body.contains(needle))
        })
        .count()
}

/// Waits until the GitLab API got such a request.
async fn gitlab_got(forge: &MockServer, verb: &str, path_end: &str, needles: &[&str]) {
    eventually(
        &format!("{verb} …{path_end} with {needles:?}"),
        Duration::from_secs(30),
        || async { (gitlab_sent(forge, verb, path_end, needles).await > 0).then_some(()) },
    )
    .await
}

/// A GitLab environment is registered once (with its URL, sent again when the URL changes), gets
/// a deployment per commit on the merge request's source branch, and is stopped on removal.
#[tokio::test]
async fn gitlab_an_environment_is_registered_deployed_per_commit_and_stopped_on_removal() {
    in_namespace("workflow-gitlab-env", |client, ns| async move {
        let forge = gitlab_forge().await;
        let project = "gitlabhq/gitlab-test";
        let app = format!("{CONFIG_MAP_APP}---\n{INGRESS_FOR_HOST}");
        let api = Some(forge.uri());
        install_template_with(
            &client,
            &ns,
            "gitlab",
            project,
            api.as_deref(),
            json!({}),
            &app,
        )
        .await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        let mut delivery = json_fixture("gitlab/merge_request.json");
        let first = delivery["object_attributes"]["last_commit"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let branch = delivery["object_attributes"]["source_branch"]
            .as_str()
            .unwrap()
            .to_string();
        let mr = delivery.to_string().into_bytes();
        harness
            .gitlab("Merge Request Hook", "e-1", &mr, SECRET)
            .await;
        let name = harness.environment_names().await.pop().unwrap();
        let ready = wait_ready_with_sha(&harness.environments, &name, &first).await;
        let url = ready.status.unwrap().url.unwrap();
        let encoded =
            |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
        let environment = encoded(&format!("preview/{ns}/{name}"));

        // Registered once, with its URL, as a review app (tier development).
        let named = format!("name={environment}");
        gitlab_got(
            &forge,
            "POST",
            "/environments",
            &[&named, "tier=development"],
        )
        .await;
        let environment_url = format!("external_url={}", encoded(&url));
        let with_url = gitlab_sent(&forge, "POST", "/environments", &[&environment_url]).await
            + gitlab_sent(&forge, "PUT", "/environments/5", &[&environment_url]).await;
        assert_eq!(with_url, 1, "the environment got its URL {url} once");
        // One deployment of the commit to it, on the source branch, finished as success.
        let deployed = [
            format!("environment={environment}"),
            format!("sha={first}"),
            format!("ref={}", encoded(&branch)),
        ];
        let deployed: Vec<&str> = deployed.iter().map(String::as_str).collect();
        gitlab_got(&forge, "POST", "/deployments", &deployed).await;
        let succeeded = || async {
            let created = gitlab_sent(&forge, "POST", "/deployments", &["status=success"]).await;
            created + gitlab_sent(&forge, "PUT", "/deployments/7", &["status=success"]).await
        };
        eventually(
            "the deployment to succeed",
            Duration::from_secs(30),
            || async { (succeeded().await == 1).then_some(()) },
        )
        .await;

        // A new commit: a second deployment, the environment is not made again.
        let second = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";
        delivery["object_attributes"]["action"] = "update".into();
        delivery["object_attributes"]["last_commit"]["id"] = second.into();
        harness
            .gitlab(
                "Merge Request Hook",
                "e-2",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        wait_ready_with_sha(&harness.environments, &name, second).await;
        gitlab_got(&forge, "POST", "/deployments", &[&format!("sha={second}")]).await;
        eventually(
            "the second deployment to succeed",
            Duration::from_secs(30),
            || async { (succeeded().await == 2).then_some(()) },
        )
        .await;
        assert_eq!(
            gitlab_sent(&forge, "POST", "/environments", &[]).await,
            1,
            "one environment"
        );

        // The URL changes (the template now says `http`): the GitLab environment is told.
        let changed = url.replacen("https://", "http://", 1);
        assert_ne!(changed, url, "the first URL is https");
        let scheme = json!({"spec": {"url": {"scheme": "http"}}});
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .patch(
                "app-gitlab",
                &PatchParams::default(),
                &Patch::Merge(&scheme),
            )
            .await
            .expect("change the template's URL scheme");
        eventually(
            "the environment to show its new URL",
            Duration::from_secs(60),
            || async {
                let environment = harness.environments.get(&name).await.ok()?;
                let url = environment.status?.url?;
                (url == changed).then_some(())
            },
        )
        .await;
        let changed_url = format!("external_url={}", encoded(&changed));
        gitlab_got(&forge, "PUT", "/environments/5", &[&changed_url]).await;
        assert_eq!(
            gitlab_sent(&forge, "POST", "/environments", &[]).await,
            1,
            "still one environment"
        );

        // Closed: the preview goes, and GitLab's environment is stopped.
        delivery["object_attributes"]["action"] = "close".into();
        harness
            .gitlab(
                "Merge Request Hook",
                "e-3",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        gitlab_got(&forge, "POST", "/environments/5/stop", &[]).await;
    })
    .await;
}

/// The requests previewd sent to the forge that were not reads: `METHOD path` each.
async fn forge_writes(forge: &MockServer) -> Vec<String> {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect()
}

/// docs/forges.md: "The ids and the last URL and state sent are kept in `status.forge` …, so a
/// restart neither makes a second environment nor resends anything." A real previewd process
/// registers a merge request's GitLab environment and finishes its deployment, and is
/// SIGKILLed; the next process reconciles the environment and sends GitLab nothing, then
/// deploys a new commit to the same GitLab environment (GitLab lists none by name here, so a
/// process that had lost the id would register a second one).
#[tokio::test]
async fn gitlab_a_restarted_previewd_neither_registers_a_second_environment_nor_resends() {
    in_namespace("workflow-gitlab-restart", |client, ns| async move {
        let forge = gitlab_forge().await;
        let project = "gitlabhq/gitlab-test";
        let api = Some(forge.uri());
        let app = format!("{CONFIG_MAP_APP}---\n{INGRESS_FOR_HOST}");
        install_template_with(
            &client,
            &ns,
            "gitlab",
            project,
            api.as_deref(),
            json!({}),
            &app,
        )
        .await;
        let logs = tempfile::tempdir().unwrap();
        let start = |name: &str| {
            support::process::PreviewdProcess::start(
                name,
                &support::shared().kubeconfig_path,
                &["--watch-namespace", &ns, "--lease-namespace", &ns],
                &[],
                logs.path(),
            )
        };
        let http = reqwest::Client::new();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let mut delivery = json_fixture("gitlab/merge_request.json");
        let first = delivery["object_attributes"]["last_commit"]["id"]
            .as_str()
            .unwrap()
            .to_string();

        let before = start("before-restart");
        before.wait_ready(&http).await;
        before
            .send_gitlab(
                &http,
                "Merge Request Hook",
                "restart-1",
                delivery.to_string().as_bytes(),
            )
            .await;
        let name = eventually("the environment", Duration::from_secs(30), || async {
            environments
                .list(&Default::default())
                .await
                .ok()?
                .items
                .pop()
        })
        .await
        .metadata
        .name
        .unwrap();
        wait_ready_with_sha(&environments, &name, &first).await;
        let recorded = eventually(
            "the deployment recorded",
            Duration::from_secs(30),
            || async {
                let environment = environments.get(&name).await.ok()?;
                let forge = environment.status?.forge?;
                (forge.deployment_state.as_deref() == Some("Success")).then_some(forge)
            },
        )
        .await;
        assert_eq!(recorded.environment_id, Some(5));
        assert_eq!(gitlab_sent(&forge, "POST", "/environments", &[]).await, 1);
        let sent_before = forge_writes(&forge).await;
        before.signal(libc::SIGKILL);
        drop(before);

        let after = start("after-restart");
        after.wait_ready(&http).await;
        eventually(
            "the new process to reconcile",
            Duration::from_secs(30),
            || async {
                let reconciled = after
                    .metric_total(&http, "previewd_reconcile_duration_seconds_count")
                    .await?;
                (reconciled >= 1.0).then_some(())
            },
        )
        .await;
        assert_eq!(
            forge_writes(&forge).await,
            sent_before,
            "sent again after the restart"
        );

        let second = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";
        delivery["object_attributes"]["action"] = "update".into();
        delivery["object_attributes"]["last_commit"]["id"] = second.into();
        after
            .send_gitlab(
                &http,
                "Merge Request Hook",
                "restart-2",
                delivery.to_string().as_bytes(),
            )
            .await;
        wait_ready_with_sha(&environments, &name, second).await;
        gitlab_got(&forge, "POST", "/deployments", &[&format!("sha={second}")]).await;
        assert_eq!(
            gitlab_sent(&forge, "POST", "/environments", &[]).await,
            1,
            "one GitLab environment across the restart: {:#?}",
            forge_writes(&forge).await
        );
    })
    .await;
}

/// A GitLab deployment is created `running` on the merge request's source branch while the
/// commit deploys, and set to `failed` (once, never back to `running`) when its seed fails.
#[tokio::test]
async fn gitlab_a_deployment_starts_running_on_its_branch_and_ends_failed_when_its_seed_fails() {
    in_namespace("workflow-gitlab-failed", |client, ns| async move {
        let forge = gitlab_forge().await;
        let project = "gitlabhq/gitlab-test";
        let seeds = json!({"seeds": [
            {"name": "load", "wave": 1, "job": crate::webhooks::SEED_FAILING_ON_BAD_COMMITS}
        ]});
        let api = Some(forge.uri());
        install_template_with(
            &client,
            &ns,
            "gitlab",
            project,
            api.as_deref(),
            seeds,
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        // The merge request's last commit starts with `bad`: its seed Job fails.
        let bad = format!("bad{}", "0".repeat(37));
        let mut delivery = json_fixture("gitlab/merge_request.json");
        delivery["object_attributes"]["last_commit"]["id"] = bad.clone().into();
        let branch = delivery["object_attributes"]["source_branch"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, answer) = harness
            .gitlab(
                "Merge Request Hook",
                "f-1",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        assert_eq!(code, 202, "{answer}");
        let name = harness.environment_names().await.pop().unwrap();
        wait_for_phase(
            &harness.environments,
            &name,
            Phase::Degraded,
            Duration::from_secs(90),
        )
        .await;

        let encoded =
            |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
        let created = [
            format!("environment={}", encoded(&format!("preview/{ns}/{name}"))),
            format!("sha={bad}"),
            format!("ref={}", encoded(&branch)),
            "status=running".to_string(),
        ];
        let created: Vec<&str> = created.iter().map(String::as_str).collect();
        gitlab_got(&forge, "POST", "/deployments", &created).await;
        gitlab_got(&forge, "PUT", "/deployments/7", &["status=failed"]).await;
        assert_eq!(
            gitlab_sent(&forge, "POST", "/deployments", &[]).await,
            1,
            "one deployment of the commit"
        );
        assert_eq!(
            gitlab_sent(&forge, "PUT", "/deployments/7", &["status=failed"]).await,
            1,
            "finished once"
        );
        assert_eq!(
            gitlab_sent(&forge, "PUT", "/deployments/7", &["status=running"]).await,
            0,
            "a deployment never goes back to running"
        );
    })
    .await;
}

/// An RSA key pair made by `openssl` for the test's GitHub App: (private key, public key), PEM.
fn app_key_pair() -> (String, String) {
    let folder = tempfile::tempdir().unwrap();
    let private = folder.path().join("app.pem");
    let made = std::process::Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&private)
        .arg("2048")
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl genrsa: {made:?}");
    let public = std::process::Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(&private)
        .output()
        .unwrap();
    assert!(public.status.success(), "openssl rsa -pubout: {public:?}");
    let private = std::fs::read_to_string(&private).unwrap();
    (private, String::from_utf8(public.stdout).unwrap())
}

/// GitHub's App endpoints as the test plays them: every call must carry a JWT signed with the
/// App's private key (checked with its public key, RS256, issuer the App id, not expired);
/// the answer for call `n` (from 0) is `answer(n)`.
struct AppEndpoint {
    public_key: jsonwebtoken::DecodingKey,
    app_id: u64,
    calls: std::sync::atomic::AtomicUsize,
    answer: fn(usize) -> serde_json::Value,
}

impl wiremock::Respond for AppEndpoint {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        let bearer = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let mut rules = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        rules.set_required_spec_claims(&["exp", "iat", "iss"]);
        rules.set_issuer(&[self.app_id.to_string()]);
        match jsonwebtoken::decode::<serde_json::Value>(bearer, &self.public_key, &rules) {
            Ok(_) => {
                let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                wiremock::ResponseTemplate::new(201).set_body_json((self.answer)(n))
            }
            Err(e) => wiremock::ResponseTemplate::new(401).set_body_json(
                json!({"message": format!("A JSON web token could not be decoded: {e}")}),
            ),
        }
    }
}

/// Installation tokens: the first expires in 2 minutes (inside previewd's 5-minute renewal
/// margin, so the next call renews it), the second in an hour.
fn installation_token(n: usize) -> serde_json::Value {
    let (token, lifetime) = match n {
        0 => ("ghs_first", chrono::TimeDelta::minutes(2)),
        _ => ("ghs_second", chrono::TimeDelta::hours(1)),
    };
    let expires_at = (chrono::Utc::now() + lifetime).to_rfc3339();
    json!({"token": token, "expires_at": expires_at, "permissions": {"pull_requests": "write"},
        "repository_selection": "selected"})
}

/// How many requests previewd sent to the GitHub API with `Authorization: Bearer <token>`.
async fn sent_with_token(forge: &MockServer, token: &str) -> usize {
    let expected = format!("Bearer {token}");
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&expected))
        .count()
}

/// [`AppEndpoint`] of App `app_id` whose key pair has `public_key` (PEM) as its public half.
fn app_endpoint(
    public_key: &str,
    app_id: u64,
    answer: fn(usize) -> serde_json::Value,
) -> AppEndpoint {
    AppEndpoint {
        public_key: jsonwebtoken::DecodingKey::from_rsa_pem(public_key.as_bytes()).unwrap(),
        app_id,
        calls: Default::default(),
        answer,
    }
}

/// A new key pair for App `app_id`, whose installation 42 on the tests' repository answers
/// `forge`'s installation lookup and token requests ([`installation_token`]). Returns the
/// private key (PEM).
async fn mount_app_installation_42(forge: &MockServer, app_id: u64) -> String {
    let (private_key, public_key) = app_key_pair();
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path(format!(
            "/repos/{GITHUB_REPOSITORY}/installation"
        )))
        .respond_with(app_endpoint(
            &public_key,
            app_id,
            |_| json!({"id": 42, "app_id": 31337}),
        ))
        .mount(forge)
        .await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path(
            "/app/installations/42/access_tokens",
        ))
        .respond_with(app_endpoint(&public_key, app_id, installation_token))
        .mount(forge)
        .await;
    private_key
}

/// The template of the GitHub App tests: it acts as App `app_id`, whose `private_key` is in
/// Secret `github-app`. A personal token is configured too (the Secret install_template_with
/// writes): the App takes precedence, so that token must never be sent.
async fn install_app_template(
    client: &kube::Client,
    ns: &str,
    forge: &MockServer,
    app_id: u64,
    private_key: &str,
) {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "github-app"}, "stringData": {"private-key.pem": private_key}
    }))
    .unwrap();
    Api::namespaced(client.clone(), ns)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let forge_section = json!({"forge": {"kind": "github", "repository": GITHUB_REPOSITORY,
        "apiUrl": forge.uri(), "webhookSecretRef": {"name": "webhook", "key": "secret"},
        "tokenSecretRef": {"name": "webhook", "key": "token"},
        "githubApp": {"appId": app_id, "privateKeySecretRef": {"name": "github-app", "key": "private-key.pem"}}}});
    install_template_with(
        client,
        ns,
        "github",
        GITHUB_REPOSITORY,
        None,
        forge_section,
        CONFIG_MAP_APP,
    )
    .await;
}

/// How many token requests (`POST /app/installations/{installation}/access_tokens`) GitHub
/// received for `installation`.
async fn token_requests(forge: &MockServer, installation: u64) -> usize {
    let path = format!("/app/installations/{installation}/access_tokens");
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.method.as_str() == "POST" && r.url.path() == path)
        .count()
}

/// The token requests previewd counted with `outcome` (`ok`, `error`), in the series
/// docs/forges.md names; `None` when there was no such request.
fn app_token_requests_counted(metrics: &str, outcome: &str) -> Option<f64> {
    let series = format!(
        r#"previewd_forge_requests_total{{forge="github",operation="app_token",outcome="{outcome}"}}"#
    );
    metric_value(metrics, &series)
}

/// The `Authorization` headers of the comment requests (created or edited) whose body contains
/// `needle`.
async fn comment_authorizations(forge: &MockServer, needle: &str) -> Vec<String> {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.method.as_str() != "GET" && r.url.path().contains("/comments"))
        .filter(|r| String::from_utf8_lossy(&r.body).contains(needle))
        .filter_map(|r| {
            r.headers
                .get("authorization")?
                .to_str()
                .ok()
                .map(str::to_string)
        })
        .collect()
}

/// A template acting as a GitHub App reports with installation tokens: the JWT is signed with
/// the App's key, the installation is looked up once, a token is kept until shortly before it
/// expires, and every token request is counted (docs/forges.md, "How previewd uses it").
#[tokio::test]
async fn a_github_app_gets_installation_tokens_signed_with_its_key_cached_and_renewed() {
    in_namespace("workflow-github-app", |client, ns| async move {
        let forge = github_forge().await;
        let app_id = 31337;
        let private_key = mount_app_installation_42(&forge, app_id).await;
        install_app_template(&client, &ns, &forge, app_id, &private_key).await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;

        let name = harness.open_pull_request(2, FIRST).await;
        wait_ready_with_sha(&harness.environments, &name, FIRST).await;
        comment_says(&forge, &name, "Preview environment: ready").await;
        harness
            .signed("pull_request", "app-2", &synchronize_to(SECOND))
            .await;
        wait_ready_with_sha(&harness.environments, &name, SECOND).await;
        harness
            .signed("pull_request", "app-3", &synchronize_to(THIRD))
            .await;
        wait_ready_with_sha(&harness.environments, &name, THIRD).await;
        comment_says(&forge, &name, "`3333333`").await;

        // The first token was used, then renewed once (it was about to expire); the second,
        // valid for an hour, served every call after it: two tokens for three commits.
        let minted = sent(&forge, "POST", "/access_tokens", "").await;
        assert_eq!(minted, 2, "installation tokens minted");
        assert_eq!(
            sent(&forge, "GET", "/installation", "").await,
            1,
            "installation looked up once"
        );
        let token_body = sent(
            &forge,
            "POST",
            "/access_tokens",
            "\"repositories\":[\"Hello-World\"]",
        )
        .await;
        assert_eq!(
            token_body, 2,
            "each token is limited to the template's repository"
        );
        assert!(sent_with_token(&forge, "ghs_first").await >= 1);
        let later = sent_with_token(&forge, "ghs_second").await;
        assert!(
            later >= 4,
            "the renewed token made the later calls ({later})"
        );
        assert_eq!(
            sent_with_token(&forge, "forge-token-for-tests").await,
            0,
            "no personal token"
        );
        let metrics = harness.metrics().await;
        // docs/forges.md: token requests are counted in previewd_forge_requests_total
        // {operation="app_token"}; the count must be what GitHub received, so an operator can
        // tell a token renewed about once an hour from one asked for on every call.
        let received = token_requests(&forge, 42).await;
        assert_eq!(received, 2, "token requests GitHub received");
        assert_eq!(
            app_token_requests_counted(&metrics, "ok"),
            Some(received as f64),
            "{metrics}"
        );
        assert_eq!(
            app_token_requests_counted(&metrics, "error"),
            None,
            "{metrics}"
        );
        // The rate-limit budget is the installation's (GitHub counts an App per installation).
        let budget =
            r#"previewd_forge_rate_limit_remaining{budget="installation-42",forge="github"}"#;
        assert_eq!(metric_value(&metrics, budget), Some(4990.0), "{metrics}");
        let spent_as_token =
            r#"previewd_forge_rate_limit_remaining{budget="token",forge="github"}"#;
        assert_eq!(
            metric_value(&metrics, spent_as_token),
            None,
            "no personal-token budget"
        );
    })
    .await;
}

/// docs/forges.md: "The key and the tokens are never logged". A real previewd process, logging
/// everything every crate will say (`RUST_LOG=trace`), reports as a GitHub App across a token
/// renewal; its log holds none of the key's lines, none of the JWTs it signed and none of the
/// installation tokens it was given.
#[tokio::test]
async fn a_github_apps_key_jwts_and_tokens_are_never_logged_even_at_trace_level() {
    in_namespace("workflow-app-logs", |client, ns| async move {
        let forge = github_forge().await;
        let app_id = 31337;
        let private_key = mount_app_installation_42(&forge, app_id).await;
        install_app_template(&client, &ns, &forge, app_id, &private_key).await;
        let logs = tempfile::tempdir().unwrap();
        let previewd = support::process::PreviewdProcess::start(
            "app-logs",
            &support::shared().kubeconfig_path,
            &["--watch-namespace", &ns, "--lease-namespace", &ns],
            &[("RUST_LOG".into(), "trace".into())],
            logs.path(),
        );
        let http = reqwest::Client::new();
        previewd.wait_ready(&http).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);

        previewd
            .send(&http, "pull_request", "app-logs-1", &opened_for(2, FIRST))
            .await;
        let name = environment_of_pr(&environments, 2).await;
        wait_ready_with_sha(&environments, &name, FIRST).await;
        previewd
            .send(&http, "pull_request", "app-logs-2", &synchronize_to(SECOND))
            .await;
        wait_ready_with_sha(&environments, &name, SECOND).await;
        comment_says(&forge, &name, "`1f2e3d4`").await;

        let jwts: Vec<String> = forge
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.url.path().contains("/installation"))
            .filter_map(|r| r.headers.get("authorization")?.to_str().ok())
            .filter_map(|v| v.strip_prefix("Bearer ").map(str::to_string))
            .collect();
        assert!(jwts.len() >= 2, "JWTs sent: {jwts:?}");
        assert_eq!(
            token_requests(&forge, 42).await,
            2,
            "a token, then its renewal"
        );
        let key_lines: Vec<&str> = private_key
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let log = previewd.log_lines().join("\n");
        assert!(
            log.contains("secrets/github-app"),
            "the trace log does not show the key's Secret being read at all"
        );
        for secret in jwts
            .iter()
            .map(String::as_str)
            .chain(["ghs_first", "ghs_second"])
            .chain(key_lines)
        {
            assert!(!log.contains(secret), "logged: {secret}");
        }
    })
    .await;
}

/// docs/forges.md: "an uninstalled and reinstalled App is found again after the next failed
/// token request". The installation previewd remembered (42) answers 404 once the App was
/// installed again (as 43): previewd forgets it, looks the installation up again and reports
/// with a token of the new one, without asking the old id a second time. The first token
/// expires inside the renewal margin, so the next report asks for one, as it would an hour on.
#[tokio::test]
async fn a_reinstalled_github_app_is_looked_up_again_when_its_old_installation_answers_404() {
    in_namespace("workflow-app-reinstalled", |client, ns| async move {
        let forge = github_forge().await;
        let (private_key, public_key) = app_key_pair();
        let app_id = 31337;
        // The first lookup finds 42; every later one (after the reinstall) finds 43.
        wiremock::Mock::given(wiremock::matchers::method("GET"))
            .and(wiremock::matchers::path(format!("/repos/{GITHUB_REPOSITORY}/installation")))
            .respond_with(app_endpoint(&public_key, app_id, |n| {
                let id = if n == 0 { 42 } else { 43 };
                json!({"id": id, "app_id": 31337})
            }))
            .mount(&forge)
            .await;
        // 42 mints one token, about to expire; then it is gone, and GitHub answers 404 (wiremock
        // skips a mock that reached `up_to_n_times` and tries the next one mounted).
        let old_tokens = || wiremock::matchers::path("/app/installations/42/access_tokens");
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .and(old_tokens())
            .respond_with(app_endpoint(&public_key, app_id, |_| installation_token(0)))
            .up_to_n_times(1)
            .mount(&forge)
            .await;
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .and(old_tokens())
            .respond_with(wiremock::ResponseTemplate::new(404).set_body_json(json!({
                "message": "Not Found",
                "documentation_url": "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"
            })))
            .mount(&forge)
            .await;
        // 43 mints tokens valid for an hour.
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .and(wiremock::matchers::path("/app/installations/43/access_tokens"))
            .respond_with(app_endpoint(&public_key, app_id, |_| installation_token(1)))
            .mount(&forge)
            .await;
        install_app_template(&client, &ns, &forge, app_id, &private_key).await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;

        let name = harness.open_pull_request(2, FIRST).await;
        wait_ready_with_sha(&harness.environments, &name, FIRST).await;
        assert!(sent_with_token(&forge, "ghs_first").await >= 1, "42's token was used");
        // A new commit: its report needs a new token at the latest (the first one is about to
        // expire), and the report goes through once the installation was found again.
        harness.signed("pull_request", "reinstalled-2", &synchronize_to(SECOND)).await;
        wait_ready_with_sha(&harness.environments, &name, SECOND).await;
        comment_says(&forge, &name, "`1f2e3d4`").await;

        assert_eq!(token_requests(&forge, 42).await, 2, "42: one token, then the 404 once");
        assert_eq!(sent(&forge, "GET", "/installation", "").await, 2, "looked up again after the 404");
        assert_eq!(token_requests(&forge, 43).await, 1, "43's token, valid an hour, served the rest");
        let authorizations = comment_authorizations(&forge, "`1f2e3d4`").await;
        assert!(!authorizations.is_empty(), "a comment about the second commit");
        assert!(
            authorizations.iter().all(|a| a == "Bearer ghs_second"),
            "the comment went with the new installation's token: {authorizations:?}"
        );
        assert_eq!(sent_with_token(&forge, "forge-token-for-tests").await, 0, "no personal token");
        let metrics = harness.metrics().await;
        assert_eq!(app_token_requests_counted(&metrics, "ok"), Some(2.0), "{metrics}");
        assert_eq!(app_token_requests_counted(&metrics, "error"), Some(1.0), "the 404: {metrics}");
        let budget = r#"previewd_forge_rate_limit_remaining{budget="installation-43",forge="github"}"#;
        assert_eq!(metric_value(&metrics, budget), Some(4990.0), "{metrics}");
    })
    .await;
}

/// A `push` delivery of one commit `sha` to PR 2's branch (`pr-2`, as
/// [`Harness::open_pull_request`] names it) that modified `files`:
/// `push.with-new-branch.json` from the fixtures, changed in a copy into a push to an existing
/// branch (`created: false`, `before` the first commit) with this commit's files and message,
/// pushed at `pushed_at` (Unix seconds: deliveries older than what previewd holds are dropped).
fn push_of(sha: &str, files: &[&str], message: &str, pushed_at: i64) -> Vec<u8> {
    let mut delivery = json_fixture("github/push.with-new-branch.json");
    let commit = json!({"id": sha, "distinct": true, "message": message,
        "timestamp": "2019-05-15T15:20:30Z", "added": [], "removed": [], "modified": files});
    delivery["ref"] = "refs/heads/pr-2".into();
    delivery["created"] = false.into();
    delivery["before"] = FIRST.into();
    delivery["after"] = sha.into();
    delivery["commits"] = json!([commit]);
    delivery["head_commit"] = commit;
    delivery["repository"]["pushed_at"] = pushed_at.into();
    delivery.to_string().into_bytes()
}

#[tokio::test]
async fn a_docs_only_push_or_a_skip_preview_commit_is_not_deployed_and_the_comment_says_why() {
    in_namespace("workflow-skip", |client, ns| async move {
        let forge = github_forge().await;
        let triggers = json!({"triggers": {"ignorePaths": ["docs/**", "**/*.md"]}});
        install_template_with(&client, &ns, "github", GITHUB_REPOSITORY, Some(&forge.uri()), triggers, CONFIG_MAP_APP).await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        let name = harness.open_pull_request(2, FIRST).await;
        let ready = wait_ready_with_sha(&harness.environments, &name, FIRST).await;
        let target = ready.status.unwrap().namespace.unwrap();

        // Only docs changed: the first commit keeps running, the comment says why.
        let (code, _) = harness.signed("push", "p-docs", &push_of(SECOND, &["docs/setup.md"], "Explain setup", 1557933680)).await;
        assert_eq!(code, 202);
        let held = wait_held(&harness.environments, &name, SECOND, "Skipped").await;
        let status = held.status.unwrap();
        assert_eq!((status.phase, status.deployed_sha.as_deref()), (Phase::Ready, Some(FIRST)));
        comment_says(&forge, &name, "**Not deployed** (commit `ec26c3e` keeps running meanwhile):\n```text\nNo preview for commit `1f2e3d4`: only `docs/` changed.\n```").await;
        commit_status_says(&forge, SECOND, "\"success\"").await;
        assert_eq!(config_map_sha(&client, &target).await, FIRST);
        assert_eq!(sent(&forge, "POST", "/deployments", SECOND).await, 0, "no deployment");
        // GitHub's pull_request delivery of the same commit, sent after the push, keeps it
        // skipped (it says nothing of files or message).
        let mut synchronize = json_fixture("github/pull_request.synchronize.json");
        synchronize["pull_request"]["head"]["sha"] = SECOND.into();
        synchronize["pull_request"]["head"]["ref"] = "pr-2".into();
        synchronize["pull_request"]["updated_at"] = "2019-05-15T15:21:30Z".into(); // after the push
        let (code, answer) = harness.signed("pull_request", "sync-docs", synchronize.to_string().as_bytes()).await;
        assert_eq!((code, answer["outcome"].as_str()), (202, Some("accepted")), "{answer}");
        harness.poke_and_wait_for_a_reconcile(&name, 1).await;
        let still = harness.environments.get(&name).await.unwrap();
        assert_eq!(still.status.unwrap().waiting.map(|w| w.reason.as_str()), Some("Skipped"));

        // `[skip preview]` in the message skips a code change too; a plain code push deploys.
        harness.signed("push", "p-marked", &push_of(THIRD, &["src/app.rs"], "WIP [skip preview]", 1557933700)).await;
        wait_held(&harness.environments, &name, THIRD, "Skipped").await;
        comment_says(&forge, &name, "its message says `[skip preview]`").await;
        let fourth = "4444444444444444444444444444444444444444";
        harness.signed("push", "p-code", &push_of(fourth, &["src/app.rs", "docs/a.md"], "Fix", 1557933710)).await;
        wait_ready_with_sha(&harness.environments, &name, fourth).await;
        assert_eq!(config_map_sha(&client, &target).await, fourth);
    })
    .await;
}
