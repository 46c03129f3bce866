//! Faults, against the real control plane: deliveries arriving all at once, duplicated and out
//! of order; a forge that hangs, answers 502 and 429, then recovers; the same for GitLab. Every environment must end
//! correct, with nothing lost or duplicated.
//!
//! Deliveries are `github/pull_request.opened.json` and `synchronize.json`, changed in copies:
//! the PR number, its branch, the head SHA and `pull_request.updated_at` (the forge's time of
//! the change, which orders them).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use futures::future::join_all;
use previewd::model::crd::Phase;
use support::webhooks::*;
use support::{eventually, in_namespace, wait_for_phase};
use wiremock::matchers::any;
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

/// Matches every request while the flag is set: an outage a test switches on and off.
struct While(Arc<AtomicBool>);

impl Match for While {
    fn matches(&self, _: &Request) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

const REPOSITORY: &str = "Codertocat/Hello-World";
const PULL_REQUESTS: u64 = 10;
const CHANGES_PER_PULL_REQUEST: u64 = 5;

/// The `change`-th state of PR `number`: opened first, then synchronize with a new head each.
fn delivery(number: u64, change: u64) -> (String, Vec<u8>) {
    let changed = Utc::now() - TimeDelta::minutes(10) + TimeDelta::seconds(change as i64 * 10);
    (
        format!("pr-{number}-change-{change}"),
        pull_request_change(number, change, &head(number, change), changed),
    )
}

fn head(number: u64, change: u64) -> String {
    format!("{number:0>20}{change:0>20}")
}

#[tokio::test]
async fn a_hundred_deliveries_at_once_with_duplicates_out_of_order_end_at_the_newest_heads() {
    in_namespace("faults-burst", |client, ns| async move {
        let forge = github_forge().await;
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;

        // 50 distinct deliveries, each sent twice (a redelivery with the same id), in an order
        // that is neither chronological nor grouped (a fixed permutation: the test repeats).
        let mut sends = Vec::new();
        for number in 1..=PULL_REQUESTS {
            for change in 0..CHANGES_PER_PULL_REQUEST {
                let (id, body) = delivery(70 + number, change);
                sends.push((id.clone(), body.clone()));
                sends.push((id, body));
            }
        }
        let count = sends.len();
        assert_eq!(count, 100);
        let mut order: Vec<usize> = (0..count).collect();
        let mut state = 0x2545_f491_u64;
        for i in (1..count).rev() {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        let answers = join_all(order.iter().map(|&i| {
            let (id, body) = &sends[i];
            harness.signed("pull_request", id, body)
        }))
        .await;
        let mut duplicates = 0;
        for (status, answer) in &answers {
            assert!(*status == 202 || *status == 200, "{status} {answer}");
            duplicates += usize::from(answer["outcome"] == "duplicate");
        }
        assert_eq!(duplicates, 50, "every redelivery is recognised");

        // Each PR ends Ready at its newest head, whatever order its deliveries came in.
        for number in 1..=PULL_REQUESTS {
            let name = environment_of_pr(&harness.environments, 70 + number).await;
            let newest = head(70 + number, CHANGES_PER_PULL_REQUEST - 1);
            wait_ready_with_sha(&harness.environments, &name, &newest).await;
        }
        // Nothing went back afterwards, and nothing was made twice. Every delivery was written
        // before it was answered, so the heads cannot change any more; a second comment could
        // only come from a later reconcile (one that read a stale record). The marker: each
        // environment is poked and a reconcile has finished after each poke.
        for (poke, number) in (1..=PULL_REQUESTS).enumerate() {
            let name = environment_of_pr(&harness.environments, 70 + number).await;
            harness
                .poke_and_wait_for_a_reconcile(&name, poke as u32 + 1)
                .await;
        }
        let environments = harness.environments.list(&Default::default()).await.unwrap().items;
        assert_eq!(environments.len(), PULL_REQUESTS as usize, "one environment per PR");
        for environment in &environments {
            let number = environment.spec.source.pull_request.unwrap();
            assert_eq!(
                environment.spec.source.head_sha,
                head(number, CHANGES_PER_PULL_REQUEST - 1),
                "PR {number} went back to an older head"
            );
            assert_eq!(
                sent(&forge, "POST", &format!("/issues/{number}/comments"), "").await,
                1,
                "PR {number} has exactly one comment"
            );
        }
        // An older snapshot that came after a newer one is not applied: found older before
        // writing ("unchanged": every snapshot has its own head, so it would be a change) or
        // when its write met the newer one ("out of order").
        let stale = answers
            .iter()
            .filter(|(_, a)| {
                a["outcome"] == "unchanged"
                    || a["message"].as_str().is_some_and(|m| m.contains("out of order"))
            })
            .count();
        assert!(
            stale > 0,
            "the shuffled burst delivered some older snapshot after a newer one: {answers:?}"
        );

        // Deterministically too: an old snapshot of PR 71 (another head than the environment's)
        // sent alone, long after its newest was applied, is found older than what the
        // environment holds before anything is written: answered "unchanged", newest head kept.
        // (Without the ordering check it would be applied: a different head is a change.)
        let (id, body) = delivery(71, 1);
        let (status, answer) = harness
            .signed("pull_request", &format!("{id}-late"), &body)
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(answer["outcome"], "unchanged", "{answer}");
        let name = environment_of_pr(&harness.environments, 71).await;
        let late = harness.environments.get(&name).await.unwrap();
        assert_eq!(
            late.spec.source.head_sha,
            head(71, CHANGES_PER_PULL_REQUEST - 1)
        );
        eprintln!("100 deliveries at once: 50 duplicates recognised, {stale} older snapshots not applied, 10 environments at their newest heads; a late old snapshot not applied");
    })
    .await;
}

/// Replaces every answer of `forge` by `answer`.
async fn forge_answers(forge: &MockServer, answer: ResponseTemplate) {
    forge.reset().await;
    Mock::given(any()).respond_with(answer).mount(forge).await;
}

#[tokio::test]
async fn a_forge_that_hangs_then_fails_then_recovers_never_blocks_deploying_and_ends_with_one_comment()
 {
    in_namespace("faults-forge", |client, ns| async move {
        // First the forge hangs: it would answer after 60 s, six times previewd's 10 s timeout.
        let forge = MockServer::start().await;
        forge_answers(
            &forge,
            ResponseTemplate::new(200).set_delay(Duration::from_secs(60)),
        )
        .await;
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let sent_at = Instant::now();
        let (status, _) = harness
            .signed(
                "pull_request",
                "hang-open",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        assert_eq!(status, 202);
        let name = environment_of_pr(&harness.environments, 2).await;
        wait_for_phase(
            &harness.environments,
            &name,
            Phase::Ready,
            Duration::from_secs(90),
        )
        .await;
        eprintln!(
            "Ready {:.1} s after the delivery, with the forge hanging",
            sent_at.elapsed().as_secs_f64()
        );
        // What "never touched" is checked against: the app's object and the environment's spec.
        let ready = harness.environments.get(&name).await.unwrap();
        let target = ready.status.as_ref().unwrap().namespace.clone().unwrap();
        let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client.clone(), &target);
        let app_version = || async {
            config_maps
                .get("app")
                .await
                .unwrap()
                .metadata
                .resource_version
        };
        let app_at_ready = app_version().await;

        // Then 502 Bad Gateway, then 429 with Retry-After, for a while each.
        forge_answers(&forge, ResponseTemplate::new(502)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        forge_answers(
            &forge,
            ResponseTemplate::new(429).insert_header("retry-after", "3"),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;

        // The forge is back: previewd's retries make the comment, once, and the environment
        // was never touched meanwhile.
        forge.reset().await;
        mount_github_api(&forge).await;
        let recovered_at = Instant::now();
        eventually(
            "the comment after the forge recovered",
            Duration::from_secs(300),
            || async { (sent(&forge, "POST", "/issues/2/comments", "").await >= 1).then_some(()) },
        )
        .await;
        eprintln!(
            "comment created {:.1} s after the forge recovered",
            recovered_at.elapsed().as_secs_f64()
        );
        // The report's last call, after the comment: a second comment would have come first.
        let status_path = "/statuses/ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        eventually("the commit status", Duration::from_secs(60), || async {
            (sent(&forge, "POST", status_path, "success").await >= 1).then_some(())
        })
        .await;
        assert_eq!(
            sent(&forge, "POST", "/issues/2/comments", "").await,
            1,
            "one comment"
        );
        let environment = harness.environments.get(&name).await.unwrap();
        assert_eq!(environment.status.unwrap().phase, Phase::Ready);
        assert!(environment.metadata.deletion_timestamp.is_none());
        assert_eq!(
            environment.metadata.generation, ready.metadata.generation,
            "the environment's spec was rewritten"
        );
        assert_eq!(
            app_version().await,
            app_at_ready,
            "the app was written again"
        );
        let text = harness.metrics().await;
        let errors = metric_value(
            &text,
            r#"previewd_reconcile_errors_total{category="forge"}"#,
        )
        .unwrap_or(0.0);
        assert!(errors >= 1.0, "the forge errors were counted:\n{text}");
    })
    .await;
}

/// GitLab hanging (an answer after 60 s, past previewd's timeout), then failing (502, then 429
/// with Retry-After) never blocks deploying a merge request; once GitLab answers again,
/// previewd makes its note, once. (The GitLab client is not GitHub's: its timeout is its own.)
#[tokio::test]
async fn a_gitlab_that_hangs_then_fails_never_blocks_deploying_and_ends_with_one_note() {
    in_namespace("faults-gitlab", |client, ns| async move {
        let forge = MockServer::start().await;
        forge_answers(
            &forge,
            ResponseTemplate::new(200).set_delay(Duration::from_secs(60)),
        )
        .await;
        install_template(
            &client,
            &ns,
            "gitlab",
            "gitlabhq/gitlab-test",
            Some(&forge.uri()),
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let opened = json_fixture("gitlab/merge_request.json");
        let delivered = harness
            .gitlab(
                "Merge Request Hook",
                "gitlab-outage",
                opened.to_string().as_bytes(),
                SECRET,
            )
            .await;
        assert_eq!(delivered.0, 202, "{}", delivered.1);
        let name = harness
            .environment_names()
            .await
            .pop()
            .expect("an environment");
        wait_for_phase(
            &harness.environments,
            &name,
            Phase::Ready,
            Duration::from_secs(90),
        )
        .await;
        // previewd gave up on a hanging call and tried again: without a timeout of its own the
        // GitLab client would still wait for its first answer.
        eventually(
            "a call given up and tried again",
            Duration::from_secs(40),
            || async {
                let calls = forge.received_requests().await.unwrap_or_default().len();
                (calls >= 2).then_some(())
            },
        )
        .await;
        forge_answers(&forge, ResponseTemplate::new(502)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        forge_answers(
            &forge,
            ResponseTemplate::new(429).insert_header("retry-after", "2"),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        // GitLab is back: one note, and the environment stayed Ready throughout.
        forge.reset().await;
        mount_gitlab_api(&forge).await;
        eventually(
            "the MR note after GitLab recovered",
            Duration::from_secs(300),
            || async {
                (sent(&forge, "POST", "/merge_requests/1/notes", "").await >= 1).then_some(())
            },
        )
        .await;
        // The note's id is recorded with the status, so later reports edit it: one note.
        let recorded = eventually(
            "the note's id in the status",
            Duration::from_secs(30),
            || async {
                let status = harness.environments.get(&name).await.ok()?.status?;
                status
                    .forge
                    .as_ref()?
                    .comment_id
                    .map(|id| (id, status.phase))
            },
        )
        .await;
        assert_eq!(
            recorded,
            (99, Phase::Ready),
            "the note GitLab made (id 99), the environment Ready throughout"
        );
        assert_eq!(
            sent(&forge, "POST", "/merge_requests/1/notes", "").await,
            1,
            "one note"
        );
        // The GitLab environment and the commit's deployment, registered once GitLab is back,
        // and only once: the ids are recorded with the status like the note's.
        let head = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
        eventually(
            "the commit's GitLab deployment after GitLab recovered",
            Duration::from_secs(60),
            || async { (sent(&forge, "POST", "/deployments", head).await >= 1).then_some(()) },
        )
        .await;
        harness.poke_and_wait_for_a_reconcile(&name, 1).await;
        assert_eq!(
            sent(&forge, "POST", "/environments", "").await,
            1,
            "one GitLab environment"
        );
        assert_eq!(
            sent(&forge, "POST", "/deployments", head).await,
            1,
            "one deployment"
        );
    })
    .await;
}

/// The forge fails just as the pull request closes. The namespace goes at once (a forge outage
/// never keeps one alive); the environment's record waits for the forge, and once the forge
/// answers again the comment says destroyed and the deployment goes inactive. Then the record
/// goes too.
#[tokio::test]
async fn a_forge_failing_when_the_pull_request_closes_still_hears_the_environment_is_destroyed() {
    in_namespace("faults-destroyed", |client, ns| async move {
        let forge = github_forge().await;
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let opened = harness
            .signed(
                "pull_request",
                "destroyed-open",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        let (name, ready) = harness
            .ready_after(opened, "ec26c3e57ca3a959ca5aad62de7213c562f8c821")
            .await;
        let target = ready.status.unwrap().namespace.unwrap();
        eventually("the comment", Duration::from_secs(30), || async {
            last_comment_text(&forge)
                .await
                .filter(|t| t.contains("Preview environment: ready"))
        })
        .await;

        // The outage is a mock in front of the working API, switched off to recover: no
        // moment without either (a 404 from an empty stand-in would be a refusal, not an
        // outage).
        let down = Arc::new(AtomicBool::new(true));
        Mock::given(While(down.clone()))
            .respond_with(ResponseTemplate::new(503))
            .with_priority(1)
            .mount(&forge)
            .await;
        let (status, answer) = harness
            .signed(
                "pull_request",
                "destroyed-closed",
                &github_fixture("pull_request.closed.json"),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        wait_namespace_gone_record_waiting(&client, &harness.environments, &name, &target).await;
        let failed = eventually(
            "the forge to be told, and fail",
            Duration::from_secs(30),
            || async {
                let requests = forge.received_requests().await.unwrap_or_default();
                let told = requests.iter().any(|r| r.method.as_str() == "PATCH");
                told.then_some(requests)
            },
        )
        .await;

        down.store(false, Ordering::SeqCst);
        let after_recovery = |verb: &'static str, path_end: &'static str, needle: &'static str| {
            let (forge, skip) = (&forge, failed.len());
            async move {
                let requests = forge.received_requests().await.unwrap_or_default();
                requests
                    .iter()
                    .skip(skip)
                    .filter(|r| r.method.as_str() == verb && r.url.path().ends_with(path_end))
                    .any(|r| String::from_utf8_lossy(&r.body).contains(needle))
            }
        };
        eventually(
            "the comment to say destroyed after the forge recovered",
            Duration::from_secs(90),
            || async {
                let edited = after_recovery("PATCH", "/issues/comments/4242", "destroyed");
                edited.await.then_some(())
            },
        )
        .await;
        wait_gone(&client, &harness.environments, &name, &target).await;
        assert!(
            after_recovery("POST", "/deployments/77/statuses", "\"inactive\"").await,
            "the deployment went inactive"
        );
        assert_eq!(
            sent(&forge, "POST", "/issues/2/comments", "").await,
            1,
            "the comment was edited, not made again"
        );
    })
    .await;
}
