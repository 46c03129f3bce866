//! The content budget (docs/forges.md, "What previewd sends per push"), against the forge
//! doubles (wiremock playing GitHub's and GitLab's APIs) with the Secret holding the token in
//! the real kube-apiserver: an update superseded before it is sent is never sent, a final
//! report that does not fit waits its turn, and a secondary-limit answer pauses the budget
//! while the final state still arrives.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use previewd::cluster::secrets::SecretReader;
use previewd::forge::budget::ContentLimits;
use previewd::forge::client::ForgeApiError;
use previewd::forge::metrics::ForgeMetrics;
use previewd::forge::report::Reporter;
use previewd::forge::template_client::{ForgeCallError, TemplateClients};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate};
use serde_json::{Value, json};
use support::webhooks::*;
use support::{eventually, in_namespace};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SHA_C: &str = "cccccccccccccccccccccccccccccccccccccccc";

/// The double of forge `kind`, accepting every report.
async fn forge_double(kind: &str) -> MockServer {
    match kind {
        "github" => github_forge().await,
        _ => gitlab_forge().await,
    }
}

/// A template of forge `kind` whose calls go to `forge`, with its token in a Secret of
/// `namespace` (the only object the reporter reads from the API server).
async fn template(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    forge: &MockServer,
) -> PreviewTemplate {
    template_with_token(
        client,
        namespace,
        kind,
        forge,
        "forge",
        "forge-token-for-tests",
    )
    .await
}

/// [`template`] named `name`, whose token (in Secret `name`) is `token`.
async fn template_with_token(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    forge: &MockServer,
    name: &str,
    token: &str,
) -> PreviewTemplate {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "stringData": {"token": token}
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let _ = secrets.create(&PostParams::default(), &secret).await;
    let repository = forge_double_repository(kind);
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "forge": {"kind": kind, "repository": repository, "apiUrl": forge.uri(),
                      "webhookSecretRef": {"name": name, "key": "token"},
                      "tokenSecretRef": {"name": name, "key": "token"}},
            "manifests": {"inline": [{"name": "app.yaml", "template": CONFIG_MAP_APP}]}
        }
    }))
    .unwrap()
}

fn forge_double_repository(kind: &str) -> &'static str {
    match kind {
        "github" => GITHUB_REPOSITORY,
        _ => "group/app",
    }
}

/// The environment of pull request `number` at `sha`.
fn environment(namespace: &str, kind: &str, number: u64, sha: &str) -> PreviewEnvironment {
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": format!("app-pr-{number}"), "namespace": namespace, "uid": format!("uid-{number}")},
        "spec": {"template": "app", "source": {
            "repository": forge_double_repository(kind), "branch": format!("feature-{number}"),
            "pullRequest": number, "headSha": sha}}
    }))
    .unwrap()
}

fn status(phase: Phase, number: u64) -> PreviewEnvironmentStatus {
    PreviewEnvironmentStatus {
        phase,
        url: Some(format!("https://app-pr-{number}.preview.example")),
        ..Default::default()
    }
}

fn reporter(client: &kube::Client, metrics: &ForgeMetrics, limits: ContentLimits) -> Reporter {
    let secrets = Arc::new(SecretReader::new(client.clone()));
    let clients = TemplateClients::new(metrics.clone(), secrets);
    Reporter::new(Arc::new(clients)).with_content_limits(limits)
}

/// The requests previewd sent that create or change content (every one but a read).
async fn writes(forge: &MockServer) -> Vec<(String, String, Value)> {
    let requests = forge.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| {
            let body = serde_json::from_slice(&r.body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&r.body).into_owned()));
            (r.method.to_string(), r.url.path().to_string(), body)
        })
        .collect()
}

/// The commit statuses sent for `sha`, by the state they carried.
async fn commit_states(forge: &MockServer, sha: &str) -> Vec<String> {
    let writes = writes(forge).await;
    writes
        .iter()
        .filter(|(_, path, _)| path.contains("/statuses/") && path.ends_with(sha))
        .map(|(_, _, body)| match body {
            Value::String(form) => form.clone(),
            json => json["state"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn superseded(metrics: &ForgeMetrics, kind: &str, request: &str) -> u64 {
    let labels = [kind, request, "superseded"];
    metrics.content_requests.with_label_values(&labels).get()
}

/// Two environments share a budget of 8 a minute (a quarter, 2, kept for final reports). The
/// first comes to rest and its report takes 4. The second is Deploying: its report (comment,
/// deployment, status) would leave less than the quarter, so it is held, and nothing of it is
/// sent. Then it is Ready: that report goes out, and what Deploying would have said never does
/// (counted as superseded). A third environment's final report no longer fits: it waits its
/// turn, sending nothing.
#[tokio::test]
async fn superseded_updates_are_never_sent_and_a_final_report_waits_its_turn() {
    for kind in ["github", "gitlab"] {
        in_namespace(&format!("budget-superseded-{kind}"), |client, ns| async move {
            let forge = forge_double(kind).await;
            let template = template(&client, &ns, kind, &forge).await;
            let metrics = ForgeMetrics::new();
            let limits = ContentLimits { per_minute: 8, per_hour: 500 };
            let reporter = reporter(&client, &metrics, limits);

            let first = environment(&ns, kind, 1, SHA_A);
            let (_, sent) = reporter.report(&first, &template, &status(Phase::Ready, 1)).await;
            sent.unwrap();
            let taken = writes(&forge).await.len();
            assert_eq!(taken, 4, "{kind}: comment, deployment (GitLab: environment), its state, commit status: {:?}", writes(&forge).await);

            let second = environment(&ns, kind, 2, SHA_B);
            let (record, sent) = reporter.report(&second, &template, &status(Phase::Deploying, 2)).await;
            assert!(
                matches!(sent, Err(ForgeCallError::Forge(ForgeApiError::ContentBudget { .. }))),
                "{kind}: held, with when to come back: {sent:?}"
            );
            assert_eq!(record, None, "{kind}: nothing was sent, so nothing is recorded");
            assert_eq!(writes(&forge).await.len(), taken, "{kind}: the intermediate report is held");

            let (record, sent) = reporter.report(&second, &template, &status(Phase::Ready, 2)).await;
            sent.unwrap();
            assert!(record.is_some_and(|r| r.status_sha.is_some()), "{kind}: the final report was sent");
            let states = commit_states(&forge, SHA_B).await;
            assert_eq!(states.len(), 1, "{kind}: one commit status for the second head: {states:?}");
            assert!(states[0].contains("success"), "{kind}: the final one: {states:?}");
            let second_writes = writes(&forge).await.len() - taken;
            assert_eq!(second_writes, 4, "{kind}: the Ready report only: {:?}", writes(&forge).await);
            if kind == "github" {
                let deployment_states: Vec<String> = writes(&forge).await.iter()
                    .filter(|(_, path, _)| path.ends_with("/statuses") && path.contains("/deployments/"))
                    .map(|(_, _, body)| body["state"].as_str().unwrap_or_default().to_string())
                    .collect();
                assert_eq!(deployment_states, ["success", "success"], "no in_progress was ever sent");
            }
            assert_eq!(superseded(&metrics, kind, "comment"), 1, "{kind}");
            assert_eq!(superseded(&metrics, kind, "commit_status"), 1, "{kind}");

            let third = environment(&ns, kind, 3, SHA_C);
            let (_, sent) = reporter.report(&third, &template, &status(Phase::Ready, 3)).await;
            let Err(ForgeCallError::Forge(ForgeApiError::ContentBudget { wait })) = sent else {
                panic!("{kind}: the final report of a full minute must wait: {sent:?}");
            };
            assert!(wait > Duration::ZERO && wait <= Duration::from_secs(60), "{kind}: {wait:?}");
            assert_eq!(writes(&forge).await.len(), taken + 4, "{kind}: nothing sent while it waits");
            // A removal's report is final too: it waits its turn, it is not dropped.
            let (record, sent) = reporter.report_destroyed(&first, &template, "the pull request was closed").await;
            assert!(
                matches!(sent, Err(ForgeCallError::Forge(ForgeApiError::ContentBudget { .. }))),
                "{kind}: {sent:?}"
            );
            assert!(!record.destroyed, "{kind}: the forge has not heard yet, so it is asked again");
            assert_eq!(writes(&forge).await.len(), taken + 4, "{kind}: nothing sent while it waits");

            // Another team's template with a token of its own has a budget of its own.
            let other_team = template_with_token(&client, &ns, kind, &forge, "other-team", "another-token").await;
            let (_, sent) = reporter.report(&third, &other_team, &status(Phase::Ready, 3)).await;
            sent.unwrap();
            assert_eq!(writes(&forge).await.len(), taken + 8, "{kind}: the other token's report went out");
        })
        .await;
    }
}

/// The forge refuses a commit status for its secondary limit (GitHub: 403 with its message and
/// `Retry-After`; GitLab: 429). The budget pauses: the next report sends nothing until the
/// wait is over, and then the final state arrives.
#[tokio::test]
async fn a_secondary_limit_answer_pauses_the_budget_and_the_final_state_still_arrives() {
    for kind in ["github", "gitlab"] {
        in_namespace(&format!("budget-pause-{kind}"), |client, ns| async move {
            let forge = forge_double(kind).await;
            let (status_code, body) = match kind {
                "github" => (403, json!({"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."})),
                _ => (429, json!({"message": "Retry later"})),
            };
            Mock::given(method("POST"))
                .and(path_regex(r"/statuses/[0-9a-f]+$"))
                .respond_with(ResponseTemplate::new(status_code).set_body_json(body).insert_header("retry-after", "3"))
                .with_priority(1)
                .up_to_n_times(1)
                .mount(&forge)
                .await;
            let template = template(&client, &ns, kind, &forge).await;
            let metrics = ForgeMetrics::new();
            let reporter = reporter(&client, &metrics, ContentLimits::default());
            let environment = environment(&ns, kind, 4, SHA_A);
            let ready = status(Phase::Ready, 4);

            let (_, sent) = reporter.report(&environment, &template, &ready).await;
            assert!(
                matches!(sent, Err(ForgeCallError::Forge(ForgeApiError::RateLimited { .. }))),
                "{kind}: {sent:?}"
            );
            let refused_at = std::time::Instant::now();
            let after_refusal = writes(&forge).await.len();
            let (_, sent) = reporter.report(&environment, &template, &ready).await;
            let Err(ForgeCallError::Forge(ForgeApiError::ContentBudget { wait })) = sent else {
                panic!("{kind}: the paused budget must hold the report: {sent:?}");
            };
            assert!(wait > Duration::from_secs(2), "{kind}: {wait:?}");
            assert_eq!(writes(&forge).await.len(), after_refusal, "{kind}: nothing sent while paused");

            // `eventually` fails the test if the final state is not sent within its time.
            eventually(&format!("{kind}: the final state after the pause"), Duration::from_secs(15), || async {
                let (_, sent) = reporter.report(&environment, &template, &ready).await;
                sent.ok()
            })
            .await;
            // (The pause began at the refusal, a moment before `refused_at`.)
            assert!(refused_at.elapsed() >= Duration::from_millis(2_500), "{kind}: sent before the pause was over");
            let states = commit_states(&forge, SHA_A).await;
            assert!(states.last().is_some_and(|s| s.contains("success")), "{kind}: {states:?}");
        })
        .await;
    }
}

/// The same through the whole controller: GitHub refuses the first commit status of a new pull
/// request's environment for its secondary limit. The environment deploys all the same (a
/// forge's refusal never holds up, changes or removes an environment), and once the wait is
/// over the commit status says it is ready.
#[tokio::test]
async fn a_refused_report_leaves_the_environment_alone_and_is_sent_after_the_wait() {
    in_namespace("budget-controller", |client, ns| async move {
        let forge = github_forge().await;
        with_permissions(&forge).await;
        let secondary = json!({"message": "You have exceeded a secondary rate limit."});
        let refusal = ResponseTemplate::new(403)
            .set_body_json(secondary)
            .insert_header("retry-after", "2");
        Mock::given(method("POST"))
            .and(path_regex(r"/statuses/[0-9a-f]+$"))
            .respond_with(refusal)
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&forge)
            .await;
        install_template_with(
            &client,
            &ns,
            "github",
            GITHUB_REPOSITORY,
            Some(&forge.uri()),
            json!({}),
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 1 << 20).await;
        let name = harness.open_pull_request(2, SHA_A).await;

        let ready = wait_ready_with_sha(&harness.environments, &name, SHA_A).await;
        eventually(
            "the refused commit status",
            Duration::from_secs(30),
            || async {
                let requests = forge.received_requests().await.unwrap_or_default();
                requests
                    .iter()
                    .any(|r| r.method.as_str() == "POST" && r.url.path().contains("/statuses/"))
                    .then_some(())
            },
        )
        .await;
        // The refused one is the first; a later one says it is ready.
        eventually(
            "a commit status sent after the refusal, saying success",
            Duration::from_secs(60),
            || async {
                let states = commit_states(&forge, SHA_A).await;
                (states.len() >= 2 && states.last()?.contains("success")).then_some(())
            },
        )
        .await;
        let now = harness.environments.get(&name).await.unwrap();
        assert_eq!(now.metadata.uid, ready.metadata.uid, "the same environment");
        assert_eq!(now.status.unwrap().phase, Phase::Ready);
    })
    .await;
}

/// docs/forges.md: with room in the budget, a new head's reports send 7 content-creating
/// requests on either forge: the Deploying report 4 (the comment, the deployment and its
/// state, the commit status; GitLab registers its environment instead of a deployment state),
/// the Ready report 3 (the comment, the deployment's state, the commit status).
#[tokio::test]
async fn with_room_a_new_head_sends_its_deploying_report_then_its_ready_one() {
    for kind in ["github", "gitlab"] {
        in_namespace(&format!("budget-room-{kind}"), |client, ns| async move {
            let forge = forge_double(kind).await;
            let template = template(&client, &ns, kind, &forge).await;
            let metrics = ForgeMetrics::new();
            let reporter = reporter(&client, &metrics, ContentLimits::default());
            let environment = environment(&ns, kind, 5, SHA_A);
            for (phase, sent) in [(Phase::Deploying, 4), (Phase::Ready, 7)] {
                let (_, result) = reporter
                    .report(&environment, &template, &status(phase, 5))
                    .await;
                result.unwrap();
                let writes = writes(&forge).await;
                assert_eq!(writes.len(), sent, "{kind}, {phase:?}: {writes:?}");
            }
            let states = commit_states(&forge, SHA_A).await;
            assert!(
                !states[0].contains("success") && states[1].contains("success"),
                "{kind}: {states:?}"
            );
        })
        .await;
    }
}

/// docs/forges.md: "the environment is reconciled again at the report's turn". A budget of 5 a
/// minute: the first pull request's Ready report takes 4 of them, so the second's (4 more)
/// waits for the minute to pass. Nothing else would reconcile that environment before the
/// 10-minute resync; the report's turn brings it back, and no reconcile counts as failed.
#[tokio::test]
async fn a_report_waiting_its_turn_brings_its_environment_back_then() {
    in_namespace("budget-turn", |client, ns| async move {
        let forge = github_forge().await;
        with_permissions(&forge).await;
        install_template_with(
            &client,
            &ns,
            "github",
            GITHUB_REPOSITORY,
            Some(&forge.uri()),
            json!({}),
            CONFIG_MAP_APP,
        )
        .await;
        let config = previewd::reconcile::ControllerConfig {
            namespace: Some(ns.clone()),
            content_limits: ContentLimits {
                per_minute: 5,
                per_hour: 500,
            },
            ..Default::default()
        };
        let harness = Harness::start_with(&client, config, 1 << 20).await;
        let first = harness.open_pull_request(2, SHA_A).await;
        wait_ready_with_sha(&harness.environments, &first, SHA_A).await;
        let reported = eventually(
            "the first pull request's Ready report",
            Duration::from_secs(30),
            || async {
                let states = commit_states(&forge, SHA_A).await;
                states
                    .last()?
                    .contains("success")
                    .then_some(std::time::Instant::now())
            },
        )
        .await;
        let second = harness.open_pull_request(3, SHA_B).await;
        wait_ready_with_sha(&harness.environments, &second, SHA_B).await;
        assert!(
            commit_states(&forge, SHA_B).await.is_empty(),
            "the minute's budget is spent"
        );

        eventually(
            "the second's Ready report at its turn, a minute on",
            Duration::from_secs(120),
            || async {
                let states = commit_states(&forge, SHA_B).await;
                states.last()?.contains("success").then_some(())
            },
        )
        .await;
        assert!(
            reported.elapsed() >= Duration::from_secs(55),
            "sent before its turn"
        );
        let metrics = harness.metrics().await;
        let failed = metric_value(
            &metrics,
            r#"previewd_reconcile_errors_total{category="forge"}"#,
        );
        assert_eq!(
            failed,
            Some(0.0),
            "waiting a turn is no failure:\n{metrics}"
        );
    })
    .await;
}

/// One author pushing as fast as they can spends no more than their environment's share of
/// the token's budget (half the minute, a quarter of the hour): with a budget of 20 a minute,
/// the busy environment's first two final reports go out and its next ones wait for its share,
/// holding nobody up; a quiet environment's final report then goes out at once. On the code
/// before, the busy environment's reports took the whole minute and the quiet one's waited.
#[tokio::test]
async fn one_busy_environment_leaves_room_for_the_others_final_reports() {
    in_namespace("budget-fair-share", |client, ns| async move {
        let forge = forge_double("github").await;
        let template = template(&client, &ns, "github", &forge).await;
        let metrics = ForgeMetrics::new();
        let limits = ContentLimits {
            per_minute: 20,
            per_hour: 500,
        };
        let reporter = reporter(&client, &metrics, limits);
        let heads: Vec<String> = (0..5).map(|i| format!("{i}").repeat(40)).collect();
        let mut sent = 0;
        for head in &heads {
            let busy = environment(&ns, "github", 1, head);
            let (_, result) = reporter
                .report(&busy, &template, &status(Phase::Ready, 1))
                .await;
            match result {
                Ok(()) => sent += 1,
                Err(ForgeCallError::Forge(ForgeApiError::ContentBudget { wait })) => {
                    assert!(wait > Duration::ZERO, "{wait:?}");
                }
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(
            sent, 2,
            "the busy environment's share, half the minute, holds two reports of 4"
        );
        let quiet = environment(&ns, "github", 2, SHA_B);
        let (record, result) = reporter
            .report(&quiet, &template, &status(Phase::Ready, 2))
            .await;
        result.unwrap();
        assert!(
            record.is_some_and(|r| r.status_sha.is_some()),
            "the quiet one's final report went out"
        );
        assert_eq!(commit_states(&forge, SHA_B).await.len(), 1);
    })
    .await;
}
