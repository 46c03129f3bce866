//! The webhook server against a real kube-apiserver: signed fixture deliveries create, update
//! and delete PreviewEnvironments; bad input is refused and changes nothing; redeliveries and
//! concurrent deliveries never make a second environment; a failing seed is reported and a
//! fixed commit recovers.
//!
//! Deliveries are the files in `../shared/fixtures/github` and `../shared/fixtures/gitlab`,
//! signed as the forge signs them. Where a test needs a variant (another head SHA, another PR
//! number, the GitLab project), it changes those fields in a copy and says so.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use previewd::forge::github;
use previewd::model::crd::{Phase, PreviewTemplate};
use serde_json::json;
use support::webhooks::*;
use support::{eventually, fixture, in_namespace, wait_for_phase};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn github_pull_request_opened_synchronized_closed() {
    in_namespace("webhook-github", |client, ns| async move {
        let forge = github_forge().await;
        // The app and an Ingress for the environment's host: previewd reports the URL once
        // something routes it.
        let routed = format!("{CONFIG_MAP_APP}---\n{INGRESS_FOR_HOST}");
        install_template_with(
            &client,
            &ns,
            "github",
            "Codertocat/Hello-World",
            Some(&forge.uri()),
            json!({}),
            &routed,
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;

        let (status, answer) = harness
            .signed(
                "pull_request",
                "d-opened",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let names = harness.environment_names().await;
        assert_eq!(names.len(), 1, "one environment: {names:?}");
        let name = names[0].clone();
        assert!(name.starts_with("app-github-pr-2-"), "{name}");
        let ready = wait_ready_with_sha(
            &harness.environments,
            &name,
            "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
        )
        .await;
        let url = ready.status.as_ref().unwrap().url.clone().unwrap();
        let target = ready.status.unwrap().namespace.unwrap();
        let comment = eventually("the comment to say ready", Duration::from_secs(30), || {
            let forge = &forge;
            async move {
                last_comment_text(forge)
                    .await
                    .filter(|t| t.contains("Preview environment: ready"))
            }
        })
        .await;
        assert!(
            comment.contains(&url),
            "the comment shows the URL: {comment}"
        );
        assert!(
            sent(&forge, "POST", "/deployments/77/statuses", "\"success\"").await >= 1,
            "a success deployment status"
        );
        assert!(
            sent(
                &forge,
                "POST",
                "/statuses/ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                "\"success\""
            )
            .await
                >= 1,
            "a success commit status"
        );
        // The webhook secret and the forge token (install_template_with's) show in no status,
        // Event or metric (docs/security.md), though previewd used both for this story.
        let shows_a_secret =
            |text: &str| text.contains(SECRET) || text.contains("forge-token-for-tests");
        let record = harness.environments.get(&name).await.unwrap();
        assert!(!shows_a_secret(&serde_json::to_string(&record).unwrap()));
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns)
            .list(&Default::default())
            .await
            .unwrap();
        assert!(!events.items.is_empty(), "previewd wrote Events to look through");
        assert!(!shows_a_secret(&serde_json::to_string(&events.items).unwrap()));

        // synchronize: the fixture carries the opened PR's SHA; a copy with a new head SHA.
        let mut synchronize = json_fixture("github/pull_request.synchronize.json");
        let new_sha = "1f2e3d4c5b6a79880716253443526170f8e9dacb";
        synchronize["pull_request"]["head"]["sha"] = new_sha.into();
        let (status, _) = harness
            .signed("pull_request", "d-sync", synchronize.to_string().as_bytes())
            .await;
        assert_eq!(status, 202);
        wait_ready_with_sha(&harness.environments, &name, new_sha).await;
        let config_map =
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &target)
                .get("app")
                .await
                .unwrap();
        assert_eq!(config_map.data.unwrap()["sha"], new_sha);
        assert_eq!(
            harness.environment_names().await,
            vec![name.clone()],
            "still one environment"
        );
        eventually(
            "the comment to show the new commit",
            Duration::from_secs(30),
            || {
                let forge = &forge;
                async move {
                    last_comment_text(forge)
                        .await
                        .filter(|t| t.contains("ready") && t.contains("`1f2e3d4`"))
                }
            },
        )
        .await;

        let (status, answer) = harness
            .signed(
                "pull_request",
                "d-closed",
                &github_fixture("pull_request.closed.json"),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains("closed"),
            "{answer}"
        );
        wait_gone(&client, &harness.environments, &name, &target).await;
        let last = last_comment_text(&forge).await.unwrap();
        assert!(
            last.contains("destroyed") && last.contains("the pull request was closed"),
            "{last}"
        );
        assert!(
            sent(&forge, "POST", "/deployments/77/statuses", "\"inactive\"").await >= 1,
            "the deployment went inactive"
        );
        assert_eq!(
            sent(&forge, "POST", "/issues/2/comments", "").await,
            1,
            "exactly one comment was created"
        );
        assert!(
            sent(&forge, "PATCH", "/issues/comments/4242", "").await >= 2,
            "and then edited in place"
        );
        // What /metrics says after the story (static labels only).
        let text = harness.metrics().await;
        let value = |series: &str| {
            metric_value(&text, series).unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
        };
        assert_eq!(
            value(r#"previewd_webhook_deliveries_total{event="pull_request",forge="github",outcome="accepted"}"#),
            3.0,
            "opened, synchronize, closed"
        );
        assert_eq!(value("previewd_time_to_ready_seconds_count"), 2.0, "two commits became Ready");
        assert_eq!(value(r#"previewd_environments{phase="Ready"}"#), 0.0, "closed: none left");
        assert!(value(r#"previewd_reconcile_duration_seconds_count{outcome="ok"}"#) >= 3.0);
        assert!(value(r#"previewd_apply_requests_total{outcome="sent"}"#) >= 2.0);
        assert!(value(r#"previewd_forge_requests_total{forge="github",operation="create_comment",outcome="ok"}"#) == 1.0);
        assert_eq!(value(r#"previewd_forge_rate_limit_remaining{budget="token",forge="github"}"#), 4990.0);
        // The intake's writes go through previewd's writer: each is counted once, with how it
        // ended, under the intake's operations (two applies: opened, synchronize; one delete).
        // An apply refused by a status write in between (409) is sent again: a second request.
        for (operation, written) in [("intake_apply", 2.0), ("intake_delete", 1.0)] {
            let requests = format!(r#"previewd_write_requests_total{{operation="{operation}"}}"#);
            let ok = format!(r#"previewd_write_results_total{{operation="{operation}",result="ok"}}"#);
            assert!(value(&requests) >= written, "{operation}");
            assert_eq!(value(&ok), written, "{operation}: ended ok, through the writer");
        }
        assert!(!text.contains(&name), "no environment name in any label");
        assert!(!shows_a_secret(&text), "no secret in any metric");
        let calls = forge.received_requests().await.unwrap_or_default();
        eprintln!(
            "github story: {} forge API calls in all: {}",
            calls.len(),
            calls
                .iter()
                .map(|r| format!("{} {}", r.method, r.url.path()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    })
    .await;
}

#[tokio::test]
async fn gitlab_merge_request_open_update_merge() {
    in_namespace("webhook-gitlab", |client, ns| async move {
        let forge = gitlab_forge().await;
        install_template(
            &client,
            &ns,
            "gitlab",
            "gitlabhq/gitlab-test",
            Some(&forge.uri()),
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let mut delivery = json_fixture("gitlab/merge_request.json");
        let delivered = harness
            .gitlab(
                "Merge Request Hook",
                "g-open",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        let (name, ready) = harness
            .ready_after(delivered, "da1560886d4f094c3e6c9ef40349f7d38b5d27d7")
            .await;
        let target = ready.status.unwrap().namespace.unwrap();
        eventually("the MR note to say ready", Duration::from_secs(30), || {
            let forge = &forge;
            async move {
                last_comment_text(forge)
                    .await
                    .filter(|t| t.contains("Preview environment: ready"))
            }
        })
        .await;
        assert!(
            sent(
                &forge,
                "POST",
                "/statuses/da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
                "success"
            )
            .await
                >= 1,
            "a success commit status"
        );

        // update with a new last commit (changed in a copy), then merge.
        delivery["object_attributes"]["action"] = "update".into();
        delivery["object_attributes"]["last_commit"]["id"] =
            "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567".into();
        let (status, _) = harness
            .gitlab(
                "Merge Request Hook",
                "g-update",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        assert_eq!(status, 202);
        wait_ready_with_sha(
            &harness.environments,
            &name,
            "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        )
        .await;
        delivery["object_attributes"]["action"] = "merge".into();
        let (status, answer) = harness
            .gitlab(
                "Merge Request Hook",
                "g-merge",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        assert_eq!(status, 202);
        assert!(
            answer["message"].as_str().unwrap().contains("merged"),
            "{answer}"
        );
        wait_gone(&client, &harness.environments, &name, &target).await;
        let last = last_comment_text(&forge).await.unwrap();
        assert!(
            last.contains("destroyed") && last.contains("merged"),
            "{last}"
        );
        assert_eq!(
            sent(&forge, "POST", "/merge_requests/1/notes", "").await,
            1,
            "exactly one note was created"
        );
        // ... and kept up to date by editing it (the id GitLab answered the POST with).
        assert!(sent(&forge, "PUT", "/merge_requests/1/notes/99", "0a1b2c3").await >= 1);
        assert!(sent(&forge, "PUT", "/merge_requests/1/notes/99", "destroyed").await >= 1);
    })
    .await;
}

#[tokio::test]
async fn bad_deliveries_are_refused_and_change_nothing() {
    in_namespace("webhook-bad", |client, ns| async move {
        install_template(&client, &ns, "github", "Codertocat/Hello-World", None).await;
        install_template(&client, &ns, "gitlab", "gitlabhq/gitlab-test", None).await;
        let harness = Harness::start(&client, &ns, 64 * 1024).await;
        let opened = github_fixture("pull_request.opened.json");

        let wrong = github::sign(b"not-the-secret", &opened);
        assert_eq!(
            harness
                .github("pull_request", "b1", &opened, Some(wrong))
                .await
                .0,
            401,
            "wrong signature"
        );
        assert_eq!(
            harness.github("pull_request", "b2", &opened, None).await.0,
            401,
            "no signature"
        );
        let mut tampered = opened.clone();
        tampered.extend_from_slice(b"\n");
        let signature_of_original = github::sign(SECRET.as_bytes(), &opened);
        assert_eq!(
            harness
                .github("pull_request", "b3", &tampered, Some(signature_of_original))
                .await
                .0,
            401,
            "body changed after signing"
        );
        assert_eq!(
            harness
                .gitlab(
                    "Merge Request Hook",
                    "b4",
                    &std::fs::read(fixture("gitlab/merge_request.json")).unwrap(),
                    "wrong-token"
                )
                .await
                .0,
            401,
            "wrong GitLab token"
        );

        let malformed = b"{\"action\": \"opened\", \"pull_request\": ";
        assert_eq!(
            harness.signed("pull_request", "b5", malformed).await.0,
            400,
            "malformed JSON"
        );
        let mut too_large = opened.clone();
        too_large.resize(70 * 1024, b' ');
        assert_eq!(
            harness.signed("pull_request", "b6", &too_large).await.0,
            413,
            "over the size limit"
        );

        let (status, answer) = harness.signed("deployment_review", "b7", &opened).await;
        assert_eq!(
            (status, answer["outcome"].as_str()),
            (202, Some("ignored")),
            "unknown event: {answer}"
        );
        // Without a secret of this previewd, a repository nobody serves and a served one get
        // one answer, naming nothing: an outsider cannot map which (private) repositories
        // previewd serves, nor learn a template's or a Secret's name. (Signed with previewd's
        // own secret, a delivery for a repository nobody serves is accepted and ignored: an
        // organisation's hook sends them all.)
        let mut elsewhere = json_fixture("github/pull_request.opened.json");
        elsewhere["repository"]["full_name"] = "someone/unknown".into();
        let elsewhere = elsewhere.to_string();
        let guessed = Some(previewd::forge::github::sign(b"a guess", elsewhere.as_bytes()));
        let unserved = harness
            .github("pull_request", "b8", elsewhere.as_bytes(), guessed)
            .await;
        let unsigned = harness.github("pull_request", "b8b", &opened, None).await;
        assert_eq!(unserved, unsigned, "one answer for both");
        assert_eq!(unserved.0, 401);
        let said = unserved.1.to_string();
        for name in ["someone/unknown", "Codertocat", &ns, "PreviewTemplate"] {
            assert!(!said.contains(name), "{name} in {said}");
        }
        // The ping fixture belongs to Octocoders/Hello-World: the copy names our repository.
        let mut ping = json_fixture("github/ping.json");
        ping["repository"]["full_name"] = "Codertocat/Hello-World".into();
        let (status, answer) = harness
            .signed("ping", "b9", ping.to_string().as_bytes())
            .await;
        assert_eq!((status, answer["outcome"].as_str()), (200, Some("pong")));
        let (status, answer) = harness
            .signed("push", "b10", &github_fixture("push.json"))
            .await;
        assert_eq!(
            (status, answer["outcome"].as_str()),
            (202, Some("ignored")),
            "a tag push: {answer}"
        );

        // Extra fields GitHub may add, optional ones missing: handled.
        let mut extended = json_fixture("github/pull_request.opened.json");
        extended["enterprise"] = json!({"id": 7, "slug": "acme"});
        extended["pull_request"]["a_field_from_2030"] = json!({"nested": true});
        extended["pull_request"]
            .as_object_mut()
            .unwrap()
            .remove("draft");
        extended["pull_request"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        // No event header: 400 (the body is read, nothing is acted on).
        let headerless = harness
            .http
            .post(format!("{}/webhooks/github", harness.base))
            .body(opened.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(headerless.status().as_u16(), 400, "no X-GitHub-Event");
        // Each refusal is counted by its outcome (forges.md: every answer is counted).
        let metrics = harness.metrics().await;
        let unauthorized = r#"previewd_webhook_deliveries_total{event="pull_request",forge="github",outcome="unauthorized"}"#;
        assert_eq!(metric_value(&metrics, unauthorized), Some(4.0), "{metrics}");
        let too_large = r#"previewd_webhook_deliveries_total{event="pull_request",forge="github",outcome="too_large"}"#;
        assert_eq!(metric_value(&metrics, too_large), Some(1.0));
        // The liveness probe answers.
        let healthz = harness.http.get(format!("{}/healthz", harness.base)).send().await.unwrap();
        assert_eq!(healthz.status().as_u16(), 200);
        // Each was answered 4xx above, and the intake writes before it answers: nothing to wait for.
        assert!(
            harness.environment_names().await.is_empty(),
            "none of the bad deliveries wrote anything"
        );
        // A GitLab delivery sent twice under one X-Gitlab-Event-UUID: the second is a duplicate.
        let merge_request = std::fs::read(fixture("gitlab/merge_request.json")).unwrap();
        let counted_before = harness.metrics().await;
        let first = harness.gitlab("Merge Request Hook", "g-twice", &merge_request, SECRET).await;
        assert_eq!(first.0, 202, "{}", first.1);
        let again = harness.gitlab("Merge Request Hook", "g-twice", &merge_request, SECRET).await;
        assert_eq!((again.0, again.1["outcome"].as_str()), (200, Some("duplicate")), "{}", again.1);
        assert_eq!(harness.environment_names().await.len(), 1, "one environment from the two");
        // Every answer is counted by outcome and timed (forges.md, "Answers"): the two GitLab
        // deliveries made the latency count grow by two, the second counted as a duplicate.
        let counted = harness.metrics().await;
        let timed = |text: &str, forge: &str| {
            let series = format!(r#"previewd_webhook_duration_seconds_count{{forge="{forge}"}}"#);
            metric_value(text, &series).unwrap_or(0.0)
        };
        assert_eq!(
            timed(&counted, "gitlab") - timed(&counted_before, "gitlab"),
            2.0,
            "both GitLab deliveries timed:\n{counted}"
        );
        let duplicate = r#"previewd_webhook_deliveries_total{event="pull_request",forge="gitlab",outcome="duplicate"}"#;
        assert_eq!(metric_value(&counted, duplicate), Some(1.0), "{counted}");
        // The unknown event (`deployment_review`) and the tag push were counted as ignored.
        for event in ["other", "push"] {
            let ignored = format!(
                r#"previewd_webhook_deliveries_total{{event="{event}",forge="github",outcome="ignored"}}"#
            );
            assert_eq!(metric_value(&counted, &ignored), Some(1.0), "{ignored}:\n{counted}");
        }
        // Each GitHub delivery so far, whatever its answer, was timed once.
        let github_deliveries: f64 = counted
            .lines()
            .filter(|line| {
                line.starts_with("previewd_webhook_deliveries_total{")
                    && line.contains(r#"forge="github""#)
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert!(github_deliveries >= 11.0, "{counted}");
        assert_eq!(timed(&counted, "github"), github_deliveries, "{counted}");
        let (status, answer) = harness
            .signed("pull_request", "b11", extended.to_string().as_bytes())
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(harness.environment_names().await.len(), 2, "the GitLab one and this");
    })
    .await;
}

#[tokio::test]
async fn redeliveries_and_concurrent_deliveries_make_one_environment_per_pr() {
    in_namespace("webhook-dup", |client, ns| async move {
        let forge = github_forge().await;
        install_template(
            &client,
            &ns,
            "github",
            "Codertocat/Hello-World",
            Some(&forge.uri()),
        )
        .await;
        let harness = Arc::new(Harness::start(&client, &ns, 2 << 20).await);

        let body = github_fixture("pull_request.opened.json");
        let first = harness.signed("pull_request", "same-id", &body).await;
        let again = harness.signed("pull_request", "same-id", &body).await;
        assert_eq!(first.0, 202);
        assert_eq!(
            (again.0, again.1["outcome"].as_str()),
            (200, Some("duplicate"))
        );
        assert_eq!(harness.environment_names().await.len(), 1);

        // 50 deliveries for 10 PRs at once: five deliveries per PR with distinct delivery ids
        // (as when a forge retries after a timeout), all in flight together.
        let mut tasks = Vec::new();
        for number in 100..110u64 {
            for attempt in 0..5 {
                let harness = harness.clone();
                tasks.push(tokio::spawn(async move {
                    let body = opened_for(number, "2c3d4e5f60718293a4b5c6d7e8f9012345678901");
                    harness
                        .signed("pull_request", &format!("pr-{number}-{attempt}"), &body)
                        .await
                        .0
                }));
            }
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), 202);
        }
        let names = harness.environment_names().await;
        assert_eq!(names.len(), 11, "PR 2 and PRs 100-109: {names:?}");
        // Every environment gets to Ready and has exactly one comment.
        for name in &names {
            let environments = harness.environments.clone();
            eventually(
                &format!("{name} Ready with its comment recorded"),
                Duration::from_secs(90),
                || {
                    let (environments, name) = (environments.clone(), name.clone());
                    async move {
                        let status = environments.get(&name).await.ok()?.status?;
                        let commented = status.forge.as_ref().and_then(|f| f.comment_id).is_some();
                        (status.phase == Phase::Ready && commented).then_some(())
                    }
                },
            )
            .await;
        }
        let mut created = Vec::new();
        for number in std::iter::once(2).chain(100..110) {
            created.push(sent(&forge, "POST", &format!("/issues/{number}/comments"), "").await);
        }
        assert_eq!(created, vec![1; 11], "one comment per PR");
    })
    .await;
}

#[tokio::test]
async fn a_forge_outage_never_blocks_deploying_or_deleting() {
    in_namespace("webhook-outage", |client, ns| async move {
        // Every GitHub API call fails: 500, or 429 with Retry-After for comments.
        let forge = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path_regex(r"/comments$"))
            .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "3600"))
            .mount(&forge)
            .await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(500))
            .mount(&forge)
            .await;
        install_template(
            &client,
            &ns,
            "github",
            "Codertocat/Hello-World",
            Some(&forge.uri()),
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let delivered = harness
            .signed(
                "pull_request",
                "o-opened",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        let (name, ready) = harness
            .ready_after(delivered, "ec26c3e57ca3a959ca5aad62de7213c562f8c821")
            .await;
        let target = ready.status.unwrap().namespace.unwrap();
        // Retries back off instead of hammering the forge: once previewd has tried the forge
        // (a report must be attempted, or this proves nothing), few more calls in 5 s.
        eventually("a first forge call", Duration::from_secs(30), || async {
            let calls = forge.received_requests().await.unwrap_or_default().len();
            (calls >= 1).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let calls = forge.received_requests().await.unwrap_or_default().len();
        assert!(
            (1..=8).contains(&calls),
            "{calls} forge calls in the first seconds of an outage"
        );
        eprintln!("forge outage: Ready anyway, {calls} forge calls in ~6 s");

        let (status, _) = harness
            .signed(
                "pull_request",
                "o-closed",
                &github_fixture("pull_request.closed.json"),
            )
            .await;
        assert_eq!(status, 202);
        // The namespace goes at once; the record waits for the forge to hear, but not for ever.
        let closed_at = std::time::Instant::now();
        wait_namespace_gone_record_waiting(&client, &harness.environments, &name, &target).await;
        // Reopened meanwhile: written onto the record being removed, the change would vanish
        // with it. It is refused, so that the forge shows it failed, and redelivered later.
        let reopened = github_fixture("pull_request.reopened.json");
        let (status, answer) = harness
            .signed("pull_request", "o-reopened", &reopened)
            .await;
        assert_eq!(status, 409, "{answer}");
        assert_eq!(answer["outcome"], "being_removed", "{answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("still being removed"),
            "{answer}"
        );
        eventually(
            "the record to go although the forge never answered",
            Duration::from_secs(180),
            || async {
                let gone = harness.environments.get_opt(&name).await.ok()?.is_none();
                gone.then_some(())
            },
        )
        .await;
        eprintln!(
            "forge outage: namespace and record gone {:.0} s after the close",
            closed_at.elapsed().as_secs_f64()
        );
        // The same delivery again (the forge's "redeliver"): not a duplicate, and it makes the
        // PR's environment anew.
        let (status, answer) = harness
            .signed("pull_request", "o-reopened", &reopened)
            .await;
        assert_eq!(status, 202, "{answer}");
        environment_of_pr(&harness.environments, 2).await;
    })
    .await;
}

/// Manifests from the repository, read from GitHub's Git data API: one listing of the commit's
/// tree, then the YAML files directly in the folder by blob id. A subfolder's file and a README
/// are not read. A commit is never fetched twice, and a new commit
/// whose folder is unchanged costs its tree listing alone (the blob is kept by its id).
#[tokio::test]
async fn manifests_from_the_repository_are_read_once_per_commit() {
    const OPENED: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    const NEXT: &str = "abcdef0123456789abcdef0123456789abcdef01";
    const REPOSITORY: &str = "Codertocat/Hello-World";
    in_namespace("webhook-repo", |client, ns| async move {
        use support::contents::{content_requests, serve_commit_tree};
        let forge = github_forge().await;
        let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-repo\ndata:\n  sha: \"{{ short_sha }}\"\n";
        let stray = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stray\n";
        let tree: Vec<(String, Vec<u8>)> = [
            ("README.md", "# Hello"),
            ("deploy/preview/app.yaml", manifest),
            ("deploy/preview/README.md", "not a manifest"),
            ("deploy/preview/old/stray.yaml", stray),
        ]
        .iter()
        .map(|(path, text)| (path.to_string(), text.as_bytes().to_vec()))
        .collect();
        for sha in [OPENED, NEXT] {
            serve_commit_tree(&forge, REPOSITORY, sha, &tree).await;
        }
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let from_repository = json!({"spec": {"manifests": {"inline": null, "repositoryPath": "deploy/preview"}}});
        templates.patch("app-github", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(from_repository)).await.unwrap();
        let harness = Harness::start(&client, &ns, 2 << 20).await;

        let delivered = harness.signed("pull_request", "r-opened", &github_fixture("pull_request.opened.json")).await;
        let (name, ready) = harness.ready_after(delivered, OPENED).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &target);
        assert_eq!(config_maps.get("from-repo").await.unwrap().data.unwrap()["sha"], "ec26c3e");
        assert!(config_maps.get_opt("stray").await.unwrap().is_none(), "a subfolder's file was read");
        assert_eq!(content_requests(&forge, REPOSITORY).await, (1, 1), "one tree listing and one blob");

        // More reconciles of the same commit (each waited for) read nothing more.
        for i in 0..3 {
            harness.poke_and_wait_for_a_reconcile(&name, i).await;
        }
        assert_eq!(content_requests(&forge, REPOSITORY).await, (1, 1), "an unchanged commit is never fetched twice");

        // A new commit is listed at that commit; its unchanged file is not fetched again.
        let mut synchronize = json_fixture("github/pull_request.synchronize.json");
        synchronize["pull_request"]["head"]["sha"] = NEXT.into();
        harness.signed("pull_request", "r-sync", synchronize.to_string().as_bytes()).await;
        wait_ready_with_sha(&harness.environments, &name, NEXT).await;
        assert_eq!(config_maps.get("from-repo").await.unwrap().data.unwrap()["sha"], "abcdef0");
        assert_eq!(content_requests(&forge, REPOSITORY).await, (2, 1), "the new commit cost its tree listing alone");
        let metrics = harness.metrics().await;
        let kept = r#"previewd_forge_blobs_total{forge="github",outcome="kept"}"#;
        assert_eq!(metric_value(&metrics, kept), Some(1.0), "{metrics}");
    })
    .await;
}

/// The same from GitLab: the folder listed with the repository tree API (entries in the shape
/// GitLab documents for `GET /projects/:id/repository/tree`: id, name, type, path, mode) at the
/// merge request's last commit, each YAML blob read raw by its id, and at the next commit, whose
/// folder is unchanged, only the listing.
#[tokio::test]
async fn gitlab_manifests_from_the_repository_are_read_at_the_merge_requests_commit() {
    in_namespace("webhook-gitlab-repo", |client, ns| async move {
        let forge = gitlab_forge().await;
        let tree = json!([
            {"id": "a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba", "name": "app.yaml", "type": "blob", "path": "deploy/preview/app.yaml", "mode": "100644"},
            {"id": "4535904260b1082e14f867f7a24fd8c21495bde3", "name": "README.md", "type": "blob", "path": "deploy/preview/README.md", "mode": "100644"},
            {"id": "b52f7fd9a9e6ba1b1d2e3e5b6a4a0e1b8c6d4f21", "name": "old", "type": "tree", "path": "deploy/preview/old", "mode": "040000"}
        ]);
        let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-repo\ndata:\n  sha: \"{{ short_sha }}\"\n";
        Mock::given(method("GET"))
            .and(path_regex(r"^/api/v4/projects/[^/]+/repository/tree$"))
            .and(wiremock::matchers::query_param("path", "deploy/preview"))
            .respond_with(ResponseTemplate::new(200).set_body_json(tree))
            .mount(&forge)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(
                r"^/api/v4/projects/[^/]+/repository/blobs/a1e8f8d745cc87e3a9248358d9352bb7f9a0aeba/raw$",
            ))
            .respond_with(ResponseTemplate::new(200).set_body_string(manifest))
            .mount(&forge)
            .await;
        install_template(&client, &ns, "gitlab", "gitlabhq/gitlab-test", Some(&forge.uri())).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let from_repository =
            json!({"spec": {"manifests": {"inline": null, "repositoryPath": "deploy/preview"}}});
        templates
            .patch(
                "app-gitlab",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(from_repository),
            )
            .await
            .unwrap();
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let mut delivery = json_fixture("gitlab/merge_request.json");
        let first = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
        let delivered = harness
            .gitlab("Merge Request Hook", "gr-open", delivery.to_string().as_bytes(), SECRET)
            .await;
        let (name, ready) = harness.ready_after(delivered, first).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &target);
        let sha_in_cluster = || async {
            config_maps.get("from-repo").await.unwrap().data.unwrap()["sha"].clone()
        };
        assert_eq!(sha_in_cluster().await, "da15608");

        let second = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";
        delivery["object_attributes"]["action"] = "update".into();
        delivery["object_attributes"]["last_commit"]["id"] = second.into();
        let (status, _) = harness
            .gitlab("Merge Request Hook", "gr-update", delivery.to_string().as_bytes(), SECRET)
            .await;
        assert_eq!(status, 202);
        wait_ready_with_sha(&harness.environments, &name, second).await;
        assert_eq!(sha_in_cluster().await, "0a1b2c3");
        let requests = forge.received_requests().await.unwrap_or_default();
        let listings_at = |sha: &str| {
            let at = format!("ref={sha}");
            requests
                .iter()
                .filter(|r| r.url.path().ends_with("/repository/tree"))
                .filter(|r| r.url.query().is_some_and(|q| q.contains(&at)))
                .count()
        };
        let blob_reads = requests
            .iter()
            .filter(|r| r.url.path().contains("/repository/blobs/"))
            .count();
        assert_eq!(
            (listings_at(first), listings_at(second), blob_reads),
            (1, 1, 1),
            "one tree listing per commit and the YAML blob once (unchanged at the second \
             commit), README and folder skipped"
        );
    })
    .await;
}

/// A seed Job whose pod fails when the commit starts with `bad` (the node simulator fails a
/// Job's pod that carries its fail annotation), and succeeds for any other commit.
pub(crate) const SEED_FAILING_ON_BAD_COMMITS: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: load
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations:
        sandbox.previewd.dev/fail: \"{{ 'true' if sha[:3] == 'bad' else 'false' }}\"
    spec:
      restartPolicy: Never
      containers:
      - name: load
        image: registry.example/seed:{{ short_sha }}
";

#[tokio::test]
async fn a_failing_seed_degrades_the_environment_names_the_job_and_a_fixed_commit_recovers() {
    in_namespace("seed-fails", |client, ns| async move {
        let forge = github_forge().await;
        install_template_with(
            &client,
            &ns,
            "github",
            "Codertocat/Hello-World",
            Some(&forge.uri()),
            json!({"seeds": [{"name": "load", "wave": 1, "job": SEED_FAILING_ON_BAD_COMMITS}]}),
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let failures =
            |text: &str| metric_value(text, "previewd_seed_failures_total").unwrap_or(0.0);
        let failures_before = failures(&harness.metrics().await);

        // A commit whose seed fails: Degraded, SeedFailed, the Job named in status and comment.
        let bad = format!("bad{}", "0".repeat(37));
        let name = harness.open_pull_request(2, &bad).await;
        let degraded = wait_for_phase(
            &harness.environments,
            &name,
            Phase::Degraded,
            Duration::from_secs(90),
        )
        .await;
        let status = degraded.status.unwrap();
        let job = status
            .seeds
            .first()
            .map(|s| s.job.clone())
            .expect("the seed's Job is named in status");
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("a Ready condition");
        assert_eq!(condition.reason, "SeedFailed", "{condition:?}");
        assert!(
            condition.message.contains(&job),
            "the condition names Job {job}: {}",
            condition.message
        );
        eventually(
            "the PR comment to name the failed Job",
            Duration::from_secs(30),
            || {
                let (forge, job) = (&forge, job.clone());
                async move {
                    last_comment_text(forge)
                        .await
                        .filter(|t| t.contains("What failed") && t.contains(&job))
                }
            },
        )
        .await;
        // The metric is recorded just after the status write the test saw: wait for it.
        let failed = eventually(
            "the seed failure to be counted",
            Duration::from_secs(10),
            || async {
                let counted = failures(&harness.metrics().await) - failures_before;
                (counted > 0.0).then_some(counted)
            },
        )
        .await;
        assert_eq!(
            failed, 1.0,
            "one seed failure counted in previewd_seed_failures_total"
        );

        // The fix is pushed: the seed runs again for the new commit and the environment recovers.
        let good = format!("600d{}", "0".repeat(36));
        let fixed = pull_request_change(2, 1, &good, chrono::Utc::now());
        let (status, answer) = harness.signed("pull_request", "seed-fixed", &fixed).await;
        assert_eq!(status, 202, "{answer}");
        let ready = wait_ready_with_sha(&harness.environments, &name, &good).await;
        let seed = ready
            .status
            .unwrap()
            .seeds
            .first()
            .cloned()
            .expect("a seed");
        assert_eq!(seed.state, "Succeeded");
        assert_ne!(seed.job, job, "the fixed commit's seed ran as a new Job");
        eventually("the comment to say ready", Duration::from_secs(30), || {
            let forge = &forge;
            async move {
                last_comment_text(forge)
                    .await
                    .filter(|t| t.contains("ready") && !t.contains("What failed"))
            }
        })
        .await;
        assert_eq!(
            failures(&harness.metrics().await) - failures_before,
            1.0,
            "no further failure"
        );

        // Every metric the operations and forge docs promise is on /metrics after such a life;
        // the registered clusters' (`previewd_cluster_*`, one series per cluster) are checked by
        // `tests/integration/clusters.rs` on a hub with clusters.
        let text = harness.metrics().await;
        for doc in ["operations.md", "forges.md"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs")
                .join(doc);
            let documented = documented_metrics(&std::fs::read_to_string(&path).unwrap());
            for name in documented
                .into_iter()
                .filter(|n| !n.starts_with("previewd_cluster_"))
            {
                assert!(
                    text.contains(&format!("# TYPE {name} ")),
                    "docs/{doc} promises {name}, /metrics has no such metric:\n{text}"
                );
            }
        }
    })
    .await;
}

/// The `previewd_*` metric names a doc mentions (histogram series names reduced to the metric).
pub fn documented_metrics(doc: &str) -> std::collections::BTreeSet<String> {
    // A name starts a word: `previewd_` inside a test's name is not a metric.
    let starts_word = |start: usize| {
        doc[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    };
    let names = doc
        .match_indices("previewd_")
        .filter(|(start, _)| starts_word(*start))
        .map(|(start, _)| {
            let name: String = doc[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name)
                .to_string()
        });
    // `previewd_*` in prose is a pattern, not a metric.
    names.filter(|name| name != "previewd_").collect()
}

/// `gitlab/push.json` for `branch` at `after` (changed in a copy: `ref`, `after`,
/// `checkout_sha`; a deleted branch is pushed with `after` all zeros and no checkout).
fn gitlab_push(branch: &str, after: &str) -> Vec<u8> {
    let mut delivery = json_fixture("gitlab/push.json");
    delivery["ref"] = format!("refs/heads/{branch}").into();
    delivery["after"] = after.into();
    delivery["checkout_sha"] = if after.bytes().all(|b| b == b'0') {
        serde_json::Value::Null
    } else {
        after.into()
    };
    delivery.to_string().into_bytes()
}

/// GitLab push hooks make branch environments for branches that match the template's globs
/// (and none for others), redeploy on the next push, and remove the environment when the
/// branch is deleted.
#[tokio::test]
async fn gitlab_pushes_to_matching_branches_deploy_and_a_deleted_branch_removes_its_environment() {
    in_namespace("webhook-gitlab-push", |client, ns| async move {
        let forge = gitlab_forge().await;
        install_template_with(
            &client,
            &ns,
            "gitlab",
            "mike/diaspora",
            Some(&forge.uri()),
            json!({"triggers": {"branches": ["feature/*"]}}),
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let first = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
        let second = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";

        // A branch outside the globs: answered, nothing made.
        let (status, answer) = harness
            .gitlab(
                "Push Hook",
                "p-docs",
                &gitlab_push("docs/readme", first),
                SECRET,
            )
            .await;
        assert!(status == 202 || status == 200, "{status} {answer}");
        assert!(
            harness.environment_names().await.is_empty(),
            "no environment for docs/readme: {answer}"
        );

        // A matching branch: an environment at the pushed commit, then at the next push.
        let (status, answer) = harness
            .gitlab(
                "Push Hook",
                "p-open",
                &gitlab_push("feature/login", first),
                SECRET,
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let names = harness.environment_names().await;
        assert_eq!(names.len(), 1, "{names:?}");
        let name = names[0].clone();
        let ready = wait_ready_with_sha(&harness.environments, &name, first).await;
        assert_eq!(ready.spec.source.branch, "feature/login");
        assert_eq!(ready.spec.source.pull_request, None);
        let target = ready.status.unwrap().namespace.unwrap();
        let (status, answer) = harness
            .gitlab(
                "Push Hook",
                "p-next",
                &gitlab_push("feature/login", second),
                SECRET,
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        wait_ready_with_sha(&harness.environments, &name, second).await;

        // The branch is deleted: its environment and namespace go.
        let deleted = "0".repeat(40);
        let (status, answer) = harness
            .gitlab(
                "Push Hook",
                "p-delete",
                &gitlab_push("feature/login", &deleted),
                SECRET,
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        wait_gone(&client, &harness.environments, &name, &target).await;
    })
    .await;
}

/// `pull_request.<action>` of PR 2 with `labels` and `draft` (changed in a copy of the
/// `labeled` fixture: action, labels, draft, `updated_at` a second later each time).
fn pull_request_state(action: &str, labels: &[&str], draft: bool, step: i64) -> Vec<u8> {
    let mut delivery = json_fixture("github/pull_request.labeled.json");
    delivery["action"] = action.into();
    delivery["pull_request"]["draft"] = draft.into();
    delivery["pull_request"]["labels"] = labels.iter().map(|l| json!({"name": l})).collect();
    let changed =
        chrono::Utc::now() - chrono::TimeDelta::minutes(5) + chrono::TimeDelta::seconds(step);
    delivery["pull_request"]["updated_at"] =
        changed.format("%Y-%m-%dT%H:%M:%SZ").to_string().into();
    delivery.to_string().into_bytes()
}

/// One state of a PR: delivery id, action, labels, draft, and `Some(why)` if it removes the
/// environment (the answer names why) or `None` if the environment is then Ready.
type LabelStep = (
    &'static str,
    &'static str,
    &'static [&'static str],
    bool,
    Option<&'static str>,
);

/// A template that requires the `preview` label: a PR gets an environment when labelled, loses
/// it when the label goes or the PR turns draft, and gets it back when ready for review.
#[tokio::test]
async fn a_required_label_and_drafts_decide_whether_a_pull_request_has_an_environment() {
    in_namespace("webhook-labels", |client, ns| async move {
        let forge = github_forge().await;
        install_template_with(
            &client,
            &ns,
            "github",
            "Codertocat/Hello-World",
            Some(&forge.uri()),
            json!({"triggers": {"requiredLabel": "preview"}}),
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        let send = |id: &'static str, body: Vec<u8>| {
            let harness = &harness;
            async move {
                let (status, answer) = harness.signed("pull_request", id, &body).await;
                assert!(status == 202 || status == 200, "{id}: {status} {answer}");
                answer
            }
        };

        send(
            "opened-unlabelled",
            pull_request_state("opened", &["bug"], false, 0),
        )
        .await;
        assert!(
            harness.environment_names().await.is_empty(),
            "no label, no environment"
        );

        // Each later state of the PR: (delivery, action, labels, draft, and then either its
        // environment Ready, or its removal with the answer saying why).
        let name = previewd::model::naming::environment_name("app-github", "changes", Some(2));
        let steps: [LabelStep; 5] = [
            ("labelled", "labeled", &["bug", "preview"], false, None),
            ("unlabelled", "unlabeled", &["bug"], false, Some("label")),
            ("relabelled", "labeled", &["preview"], false, None),
            (
                "draft",
                "converted_to_draft",
                &["preview"],
                true,
                Some("draft"),
            ),
            ("ready", "ready_for_review", &["preview"], false, None),
        ];
        let mut target = String::new();
        for (step, (id, action, labels, draft, removed_because)) in steps.into_iter().enumerate() {
            let answer = send(
                id,
                pull_request_state(action, labels, draft, step as i64 + 1),
            )
            .await;
            match removed_because {
                None => {
                    let ready = wait_ready_with_sha(&harness.environments, &name, sha).await;
                    target = ready.status.and_then(|s| s.namespace).expect("a namespace");
                }
                Some(why) => {
                    let said = answer["message"].as_str().is_some_and(|m| m.contains(why));
                    assert!(said, "{id}: {answer}");
                    wait_gone(&client, &harness.environments, &name, &target).await;
                }
            }
        }
    })
    .await;
}

/// previewd's comment already on the PR (made by an earlier previewd whose status write was
/// lost, so the environment records no comment id) is found by its marker in the forge's list,
/// among other people's comments, and edited: never a second comment. A copy of the marker in
/// someone else's comment (a PR author's, posted first) is not adopted: previewd would edit it,
/// and its author could then rewrite "previewd's" comment at will.
#[tokio::test]
async fn a_comment_whose_id_was_lost_is_found_by_its_marker_and_edited() {
    in_namespace("webhook-marker", |client, ns| async move {
        let forge = MockServer::start().await;
        let name = previewd::model::naming::environment_name("app-github", "changes", Some(2));
        let ours = format!("<!-- previewd:environment={ns}/{name} -->\nPreview environment: deploying");
        // The list as GitHub sends it: other people's comments first, previewd's further on.
        Mock::given(method("GET"))
            .and(path_regex(r"^/repos/[^/]+/[^/]+/issues/2/comments$"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!([
                        {"id": 101, "body": "Looks good to me", "user": {"login": "octocat", "type": "User"}},
                        {"id": 666, "body": format!("{ours}\n**Approved by the platform team**"), "user": {"login": "mallory", "type": "User"}},
                        {"id": 4343, "body": ours, "user": {"login": "previewd-bot", "type": "User"}},
                    ]))
                    .insert_header("etag", "\"comments-v1\""),
            )
            .mount(&forge)
            .await;
        mount_github_api(&forge).await;
        install_template(&client, &ns, "github", "Codertocat/Hello-World", Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let (status, answer) = harness.signed("pull_request", "marker-open", &github_fixture("pull_request.opened.json")).await;
        assert_eq!(status, 202, "{answer}");
        wait_ready_with_sha(&harness.environments, &name, "ec26c3e57ca3a959ca5aad62de7213c562f8c821").await;
        eventually("previewd's comment 4343 to be edited", Duration::from_secs(30), || {
            let forge = &forge;
            async move { (sent(forge, "PATCH", "/issues/comments/4343", "ready").await >= 1).then_some(()) }
        })
        .await;
        assert_eq!(sent(&forge, "POST", "/issues/2/comments", "").await, 0, "no second comment");
        assert_eq!(sent(&forge, "PATCH", "/issues/comments/101", "").await, 0, "nobody else's comment is touched");
        assert_eq!(sent(&forge, "PATCH", "/issues/comments/666", "").await, 0, "a copy of the marker is not adopted");
    })
    .await;
}

/// A body far over the limit (20 MB, GitHub sends up to 25 MB) still gets previewd's 413, not a
/// reset connection: previewd reads and drops the rest of a body up to 32 MiB before it
/// answers, so that whoever sent it sees why (GitHub's delivery log, the sandbox's relay,
/// which passes previewd's answer on as it came). Before, previewd closed the connection after
/// its limit, the sender was still writing, and got a reset: the relay answered 502.
#[tokio::test]
async fn a_body_far_over_the_limit_gets_413_directly_and_through_the_sandbox_relay() {
    in_namespace("webhook-huge", |client, ns| async move {
        install_template(&client, &ns, "github", "Codertocat/Hello-World", None).await;
        let harness = Harness::start(&client, &ns, 64 * 1024).await;
        let mut huge = github_fixture("pull_request.opened.json");
        huge.resize(20_000_000, b' ');
        let signature = github::sign(SECRET.as_bytes(), &huge);
        let send = |url: String| {
            let http = reqwest::Client::new();
            let (huge, signature) = (huge.clone(), signature.clone());
            async move {
                http.post(url)
                    .header("x-github-event", "pull_request")
                    .header("x-github-delivery", "huge")
                    .header("x-hub-signature-256", signature)
                    .header("content-type", "application/json")
                    .body(huge)
                    .send()
                    .await
                    .map(|answer| answer.status().as_u16())
                    .map_err(|e| format!("{e:?}"))
            }
        };
        assert_eq!(
            send(format!("{}/webhooks/github", harness.base)).await,
            Ok(413)
        );
        let relay = previewd::sandbox::forge_standin::ForgeStandIn::relaying_to(
            &harness.base,
            Default::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            send(relay.hook_url("github")).await,
            Ok(413),
            "through the relay"
        );
        assert!(
            harness
                .environments
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty(),
            "nothing was created"
        );
    })
    .await;
}

/// PreviewEnvironment pr-`number` of `namespace` at head `sha` (40 times), changed at
/// `changed_at`: the intake's wanted state for one delivery.
fn environment_at(
    namespace: &str,
    number: u64,
    sha: char,
    changed_at: &str,
) -> previewd::model::crd::PreviewEnvironment {
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
        "metadata": {"name": format!("pr-{number}"), "namespace": namespace},
        "spec": {"template": "t", "source": {"repository": "o/r", "branch": "b",
            "pullRequest": number, "headSha": sha.to_string().repeat(40),
            "changedAt": changed_at}}}))
    .unwrap()
}

#[tokio::test]
async fn a_newer_write_just_before_the_intakes_write_is_not_overwritten() {
    // docs/forges.md: "The API server keeps the order itself: it refuses a `spec.source` whose
    // `changedAt` is older than the stored one, so two deliveries handled at once (even by two
    // replicas) cannot interleave." Another replica writes the third commit just before this
    // intake's write of the second reaches the API server: the API server refuses the second
    // (its CEL rule), and the intake answers it as older. Without the rule the second commit
    // overwrites the third.
    in_namespace("intake-precondition", |client, ns| async move {
        use previewd::cluster::records::{Applied, Records};
        use previewd::cluster::writer::Writer;
        use previewd::model::crd::PreviewEnvironment;
        let writer = Writer::new(previewd::cluster::metrics::ClusterMetrics::new());
        let writer = &writer;
        let apply_in_order = |client, wanted: PreviewEnvironment| async move {
            Records::new(client, writer).apply_in_order(&wanted).await
        };
        let at = |sha: char, changed_at: &str| environment_at(&ns, 7, sha, changed_at);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let first = apply_in_order(&client, at('1', "2026-11-26T10:00:00Z")).await;
        assert_eq!(first.unwrap(), Applied::Written);
        // Another replica's write of the third commit, just before this intake's write of the
        // second is sent.
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let third = at('3', "2026-11-26T10:03:00Z");
        let other_replica = {
            let environments = environments.clone();
            support::layers::Around::new(move |method, path| {
                let writes_it =
                    method == http::Method::PATCH && path.ends_with("/previewenvironments/pr-7");
                if !writes_it || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return Default::default();
                }
                let (environments, third) = (environments.clone(), third.clone());
                support::layers::Hooks {
                    before: Some(Box::pin(async move {
                        let params = kube::api::PatchParams::apply("other-replica").force();
                        let patch = kube::api::Patch::Apply(&third);
                        environments.patch("pr-7", &params, &patch).await.unwrap();
                    })),
                    after: None,
                }
            })
        };
        let interleaving = kube::client::ClientBuilder::try_from(support::shared_config().await)
            .unwrap()
            .with_layer(&other_replica)
            .build();

        let second = apply_in_order(&interleaving, at('2', "2026-11-26T10:02:00Z")).await;

        assert_eq!(second.unwrap(), Applied::Older);
        let now = environments.get("pr-7").await.unwrap();
        assert_eq!(now.spec.source.head_sha, "3".repeat(40));
    })
    .await;
}

#[tokio::test]
async fn one_apply_per_new_head_whatever_the_controller_writes_meanwhile() {
    // issue 58: the intake's apply carried the resourceVersion it had read, so a status write
    // of the controller in between made it a 409, a read and a second apply. The order is now
    // the API server's (a CEL rule on `spec.source`): one apply per new head, an older source
    // refused even from another writer, a newer one written onto a record being removed said
    // so (the forge is asked to deliver it again).
    in_namespace("intake-one-apply", |client, ns| async move {
        use previewd::cluster::records::{Applied, Records};
        use previewd::cluster::writer::Writer;
        use previewd::model::crd::{OLDER_SOURCE_MESSAGE, PreviewEnvironment};
        use kube::api::{Patch, PatchParams};
        let writer = Writer::new(previewd::cluster::metrics::ClusterMetrics::new());
        let applies = || writer.metrics().writes.with_label_values(&["intake_apply"]).get();
        let at = |sha: char, changed_at: &str| environment_at(&ns, 8, sha, changed_at);
        let records = Records::new(&client, &writer);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let first = records.apply_in_order(&at('1', "2026-11-26T10:00:00Z")).await;
        assert_eq!(first.unwrap(), Applied::Written);
        // The controller's status write, between two deliveries.
        let status = json!({"status": {"phase": "Deploying", "message": "rolling out"}});
        environments
            .patch_status("pr-8", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let before = applies();
        let second = records.apply_in_order(&at('2', "2026-11-26T10:01:00Z")).await;
        assert_eq!(second.unwrap(), Applied::Written);
        assert_eq!(applies() - before, 1, "one apply for the new head");
        // Two changes within one second (GitHub's resolution) go in arrival order.
        let same_second = records.apply_in_order(&at('3', "2026-11-26T10:01:00Z")).await;
        assert_eq!(same_second.unwrap(), Applied::Written);
        // An older source is refused by the API server, whoever writes it.
        let older = records.apply_in_order(&at('0', "2026-11-26T09:59:00Z")).await;
        assert_eq!(older.unwrap(), Applied::Older);
        let by_hand = json!({"spec": {"source": {"headSha": "f".repeat(40), "changedAt": "2026-11-26T09:00:00Z"}}});
        let refused = environments
            .patch("pr-8", &PatchParams::default(), &Patch::Merge(&by_hand))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 422 && s.message.contains(OLDER_SOURCE_MESSAGE)),
            "{refused:?}"
        );
        let now = environments.get("pr-8").await.unwrap();
        assert_eq!(now.spec.source.head_sha, "3".repeat(40));
        // Being removed (a finalizer holds it): the newer change is written onto it, and said.
        let held = json!({"metadata": {"finalizers": ["previewd.dev/test-hold"]}});
        environments
            .patch("pr-8", &PatchParams::default(), &Patch::Merge(&held))
            .await
            .unwrap();
        environments.delete("pr-8", &Default::default()).await.unwrap();
        let removed = records.apply_in_order(&at('4', "2026-11-26T10:02:00Z")).await;
        assert_eq!(removed.unwrap(), Applied::BeingRemoved);
        let released = json!({"metadata": {"finalizers": null}});
        environments
            .patch("pr-8", &PatchParams::default(), &Patch::Merge(&released))
            .await
            .unwrap();
    })
    .await;
}

/// A delivery whose template's webhook secret previewd cannot read (the API server refuses the
/// read: here the server's client is a ServiceAccount without rights) gets 503, so the forge
/// delivers it again, and an answer that names nothing: not the template, not the Secret, not
/// previewd's identity, which go to the log only. Before, the answer carried the read's error
/// with all three.
#[tokio::test]
async fn an_unreadable_webhook_secret_gets_503_naming_nothing() {
    in_namespace("webhook-unreadable", |client, ns| async move {
        install_template(&client, &ns, "github", "Codertocat/Hello-World", None).await;
        let config = previewd::reconcile::ControllerConfig {
            namespace: Some(ns.clone()),
            ..Default::default()
        };
        let running = support::start_controller_with(&client, config).await;
        let nobody = support::client_as_service_account(&ns, "nobody").await;
        let state = running.server_state(&nobody, 64 * 1024);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(previewd::webhook::server::serve(
            state,
            listener,
            std::future::pending(),
        ));
        let http = reqwest::Client::new();
        wait_until_ready(&http, &base).await;
        let opened = github_fixture("pull_request.opened.json");
        let signature = Some(github::sign(SECRET.as_bytes(), &opened));
        let (status, answer) =
            post_github(&http, &base, "pull_request", "u1", &opened, signature).await;
        assert_eq!(status, 503, "{answer}");
        assert_eq!(
            answer["message"],
            previewd::webhook::server::UNAVAILABLE,
            "{answer}"
        );
        let said = answer.to_string();
        for name in [
            "app-github",
            "webhook\\\"",
            "nobody",
            "serviceaccount",
            ns.as_str(),
        ] {
            assert!(!said.contains(name), "{name:?} in {said}");
        }
    })
    .await;
}

/// A verified delivery whose write the API server refuses (here: a quota of no environments in
/// the template's namespace) gets 503, so the forge delivers it again, and the one answer that
/// names nothing: not the namespace, the quota or previewd's identity, which the API server's
/// words carry and the log keeps. Before, the answer carried those words.
#[tokio::test]
async fn a_delivery_previewd_cannot_write_gets_503_naming_nothing() {
    in_namespace("webhook-unwritable", |client, ns| async move {
        let quota: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "no-previews"},
            "spec": {"hard": {"count/previewenvironments.previewd.dev": "0"}}
        }))
        .unwrap();
        Api::namespaced(client.clone(), &ns)
            .create(&kube::api::PostParams::default(), &quota)
            .await
            .unwrap();
        install_template(&client, &ns, "github", "Codertocat/Hello-World", None).await;
        let harness = Harness::start(&client, &ns, 64 * 1024).await;
        let opened = github_fixture("pull_request.opened.json");
        let answer = support::eventually("the quota in force", Duration::from_secs(30), || async {
            let (status, answer) = harness.signed("pull_request", "w1", &opened).await;
            (status == 503).then_some(answer)
        })
        .await;
        assert_eq!(
            answer["message"],
            previewd::webhook::server::NOT_WRITTEN,
            "{answer}"
        );
        let said = answer.to_string();
        for name in ["no-previews", "quota", "forbidden", ns.as_str()] {
            assert!(!said.contains(name), "{name:?} in {said}");
        }
        let written = harness
            .environments
            .list(&Default::default())
            .await
            .unwrap();
        assert!(written.items.is_empty());
    })
    .await;
}
