//! Faults, against the real control plane: deliveries arriving all at once, duplicated and out
//! of order. Every environment must end correct, with nothing lost or duplicated.
//!
//! Deliveries are `github/pull_request.opened.json` and `synchronize.json`, changed in copies:
//! the PR number, its branch, the head SHA and `pull_request.updated_at` (the forge's time of
//! the change, which orders them).

mod support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use futures::future::join_all;
use support::in_namespace;
use support::webhooks::*;

const REPOSITORY: &str = "Codertocat/Hello-World";
const PULL_REQUESTS: u64 = 10;
const CHANGES_PER_PULL_REQUEST: u64 = 5;

/// The `change`-th state of PR `number`: opened first, then synchronize with a new head each.
fn delivery(number: u64, change: u64) -> (String, Vec<u8>) {
    let file = if change == 0 {
        "github/pull_request.opened.json"
    } else {
        "github/pull_request.synchronize.json"
    };
    let mut body = json_fixture(file);
    body["number"] = number.into();
    body["pull_request"]["number"] = number.into();
    body["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
    body["pull_request"]["head"]["sha"] = head(number, change).into();
    let changed = Utc::now() - TimeDelta::minutes(10) + TimeDelta::seconds(change as i64 * 10);
    body["pull_request"]["updated_at"] = changed.format("%Y-%m-%dT%H:%M:%SZ").to_string().into();
    (
        format!("pr-{number}-change-{change}"),
        body.to_string().into_bytes(),
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
        // Nothing went back afterwards, and nothing was made twice.
        tokio::time::sleep(Duration::from_secs(2)).await;
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
        let stale = answers
            .iter()
            .filter(|(_, a)| a["message"].as_str().is_some_and(|m| m.contains("out of order")))
            .count();
        eprintln!("100 deliveries at once: 50 duplicates recognised, {stale} older snapshots not applied, 10 environments at their newest heads");
    })
    .await;
}
