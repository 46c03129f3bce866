//! The sweep against a real kube-apiserver, with the forge served by wiremock and the clock
//! injected: a missed `closed` webhook is repaired; a forge that fails or rate-limits causes no
//! deletion; idle environments go; orphaned labelled namespaces go, unrelated ones stay.

mod support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use previewd::lifecycle::rules::Reason;
use previewd::lifecycle::sweeper::Sweeper;
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::reconcile::Context;
use serde_json::{Value, json};
use support::webhooks::metric_value;
use support::{eventually, in_namespace};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

async fn start(client: &Client, namespace: &str) -> (support::Running, Sweeper) {
    let running = support::start_controller(client, namespace).await;
    let sweeper = running.sweeper(client, namespace);
    running.wait_for_caches().await;
    (running, sweeper)
}

/// A GitHub API whose open-PR list holds `open` and whose branch list holds `main`.
async fn forge_listing(open: &[u64]) -> MockServer {
    let server = MockServer::start().await;
    let pulls: Vec<Value> = open.iter().map(|n| json!({"number": n})).collect();
    Mock::given(method("GET"))
        .and(path_regex(r"/pulls$"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(pulls)
                .insert_header("etag", "\"pulls-v1\""),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(r"/branches$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "main"}])))
        .mount(&server)
        .await;
    // Comments and statuses: accepted.
    Mock::given(method("GET"))
        .and(path_regex(r"/comments$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({"id": 1})))
        .mount(&server)
        .await;
    server
}

async fn install(client: &Client, namespace: &str, forge: &str, lifecycle: Value) {
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "forge"}, "stringData": {"token": "t"}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "app"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World", "apiUrl": forge,
                           "tokenSecretRef": {"name": "forge", "key": "token"}},
                 "lifecycle": lifecycle,
                 "manifests": {"inline": [{"name": "app.yaml", "template": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n"}]}}
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// Points the template at another forge URL and waits until the controller's cache has it.
async fn point_template_at(templates: &Api<PreviewTemplate>, context: &Context, uri: &str) {
    let patch = json!({"spec": {"forge": {"apiUrl": uri}}});
    templates
        .patch("app", &Default::default(), &kube::api::Patch::Merge(patch))
        .await
        .unwrap();
    eventually(
        "the template change to reach the cache",
        Duration::from_secs(10),
        || async {
            context
                .caches
                .templates
                .state()
                .iter()
                .any(|t| t.spec.forge.api_url.as_deref() == Some(uri))
                .then_some(())
        },
    )
    .await;
}

/// A PR environment made by hand (as the intake would), for PR `number`.
async fn environment(client: &Client, namespace: &str, number: u64) -> String {
    let name = format!("app-pr-{number}");
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": name},
        "spec": {"template": "app", "source": {"repository": "Codertocat/Hello-World", "branch": format!("pr-{number}"),
                 "pullRequest": number, "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821"},
                 "lastActivity": Utc::now().to_rfc3339()}
    }))
    .unwrap();
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &environment)
        .await
        .unwrap();
    eventually(&format!("{name} Ready"), Duration::from_secs(60), || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            api.get(&name)
                .await
                .ok()?
                .status
                .filter(|s| s.phase == Phase::Ready)
                .map(|_| ())
        }
    })
    .await;
    name
}

async fn names(client: &Client, namespace: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<PreviewEnvironment>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.metadata.deletion_timestamp.is_none())
        .map(|e| e.name_any())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_missed_close_is_repaired_but_never_while_the_forge_cannot_be_asked() {
    in_namespace("sweep-forge", |client, ns| async move {
        let forge = forge_listing(&[2]).await;
        install(&client, &ns, &forge.uri(), json!({})).await;
        let (context, sweeper) = start(&client, &ns).await;
        environment(&client, &ns, 2).await;
        let closed = environment(&client, &ns, 3).await; // PR 3 was closed; its webhook was missed
        let later = Utc::now() + TimeDelta::minutes(10); // past the forge grace period

        // The forge fails: nothing is deleted.
        let broken = MockServer::start().await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(500))
            .mount(&broken)
            .await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        point_template_at(&templates, &context, &broken.uri()).await;
        let report = sweeper.sweep(&context.reporter, later).await.unwrap();
        assert!(
            report.deleted.is_empty(),
            "forge 500: nothing deleted ({report:?})"
        );
        assert_eq!(
            report.forge_unavailable,
            vec!["Codertocat/Hello-World".to_string()]
        );

        // Rate-limited: nothing deleted either.
        let limited = MockServer::start().await;
        Mock::given(wiremock::matchers::any())
            .respond_with(
                ResponseTemplate::new(403)
                    .insert_header("x-ratelimit-remaining", "0")
                    .insert_header("retry-after", "600"),
            )
            .mount(&limited)
            .await;
        point_template_at(&templates, &context, &limited.uri()).await;
        let report = sweeper.sweep(&context.reporter, later).await.unwrap();
        assert!(
            report.deleted.is_empty(),
            "rate-limited: nothing deleted ({report:?})"
        );
        assert_eq!(names(&client, &ns).await.len(), 2);

        // The forge answers: PR 3 is not open, so its environment and namespace go.
        point_template_at(&templates, &context, &forge.uri()).await;
        let report = sweeper.sweep(&context.reporter, later).await.unwrap();
        assert_eq!(
            report.deleted,
            vec![(format!("{ns}/{closed}"), Reason::PullRequestClosed)]
        );
        eventually("PR 3's environment to be gone", Duration::from_secs(60), || {
            let (client, ns) = (client.clone(), ns.clone());
            async move { (names(&client, &ns).await == vec!["app-pr-2".to_string()]).then_some(()) }
        })
        .await;
        let list_calls = forge
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.url.path().ends_with("/pulls") || r.url.path().ends_with("/branches"))
            .count();
        assert_eq!(list_calls, 2, "one list call per repository and page");
    })
    .await;
}

#[tokio::test]
async fn idle_environments_and_orphaned_namespaces_go_unrelated_ones_stay() {
    in_namespace("sweep-idle", |client, ns| async move {
        let forge = forge_listing(&[2, 3]).await;
        install(&client, &ns, &forge.uri(), json!({"idleTimeout": "72h"})).await;
        let (context, sweeper) = start(&client, &ns).await;
        environment(&client, &ns, 2).await;
        // An orphan: created by previewd (its labels, with the UID of an environment) for an
        // environment that no longer exists. A lookalike with the same labels but no UID was not
        // shown to be previewd's (made by hand, or before the UID label): it stays.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let orphan = format!("{ns}-orphan");
        let unrelated = format!("{ns}-unrelated");
        let lookalike = format!("{ns}-lookalike");
        let previewds = json!({"app.kubernetes.io/managed-by": "previewd", "previewd.dev/environment": "gone", "previewd.dev/environment-namespace": ns});
        let mut created_by_previewd = previewds.clone();
        created_by_previewd["previewd.dev/environment-uid"] = json!("uid-of-a-deleted-environment");
        for (name, labels) in [
            (&orphan, created_by_previewd),
            (&lookalike, previewds),
            (&unrelated, json!({"team": "payments"})),
        ] {
            let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
            namespaces.create(&PostParams::default(), &namespace).await.unwrap();
        }

        // Two days on: nothing is idle yet, the orphan goes (past its grace), the rest stays.
        let report = sweeper.sweep(&context.reporter, Utc::now() + TimeDelta::hours(48)).await.unwrap();
        assert!(report.deleted.is_empty(), "{report:?}");
        assert_eq!(report.orphans, vec![orphan.clone()]);
        for kept in [&unrelated, &lookalike] {
            assert!(namespaces.get_opt(kept).await.unwrap().is_some_and(|n| n.metadata.deletion_timestamp.is_none()), "{kept} untouched");
        }

        // Four days on: the environment was idle more than 72 h.
        let report = sweeper.sweep(&context.reporter, Utc::now() + TimeDelta::hours(96)).await.unwrap();
        assert_eq!(report.deleted.len(), 1);
        assert_eq!(report.deleted[0].1, Reason::Idle);
        // As /metrics says it: one removal for idleness, one orphaned namespace.
        let text = context.metrics.render();
        for series in [r#"previewd_gc_deletions_total{reason="idle"}"#, r#"previewd_gc_deletions_total{reason="orphaned_namespace"}"#] {
            assert_eq!(metric_value(&text, series), Some(1.0), "{series} in:\n{text}");
        }
        let _ = namespaces.delete(&unrelated, &Default::default()).await;
        let _ = namespaces.delete(&lookalike, &Default::default()).await;
    })
    .await;
}

/// A repository with more open PRs than previewd reads: the list is not cut off and acted on
/// (PR 2 is not on the pages read, so a cut-off list would delete its live environment); the
/// forge counts as unavailable for that sweep and nothing is removed.
#[tokio::test]
async fn a_list_longer_than_previewd_reads_removes_nothing() {
    in_namespace("sweep-long-list", |client, ns| async move {
        let forge = MockServer::start().await;
        let full_page: Vec<Value> = (1000..1100u64).map(|n| json!({"number": n})).collect();
        Mock::given(method("GET"))
            .and(path_regex(r"/pulls$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(full_page))
            .mount(&forge)
            .await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
            .mount(&forge)
            .await;
        install(&client, &ns, &forge.uri(), json!({})).await;
        let (context, sweeper) = start(&client, &ns).await;
        environment(&client, &ns, 2).await;
        let report = sweeper
            .sweep(&context.reporter, Utc::now() + TimeDelta::minutes(10))
            .await
            .unwrap();
        assert!(report.deleted.is_empty(), "{report:?}");
        assert_eq!(
            report.forge_unavailable,
            vec!["Codertocat/Hello-World".to_string()]
        );
        assert_eq!(names(&client, &ns).await, vec!["app-pr-2".to_string()]);
    })
    .await;
}
