//! The sweep against a real kube-apiserver, with the forge served by wiremock and the clock
//! injected: a missed `closed` webhook is repaired; a forge that fails or rate-limits causes no
//! deletion; idle environments go; orphaned labelled namespaces go, unrelated ones stay; the
//! lifecycle rules (idle, branch gone, extension, maximum age, template gone) on injected days;
//! GitLab's paged merge-request list and branches.

use crate::support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use previewd::cluster::records;
use previewd::lifecycle::rules::Reason;
use previewd::lifecycle::sweeper::Sweeper;
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::model::metadata::ANNOTATION_DELETION_REASON;
use previewd::reconcile::Context;
use serde_json::{Value, json};
use support::webhooks::metric_value;
use support::{eventually, in_namespace};
use wiremock::matchers::{header, method, path_regex, query_param};
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
    mount_all_but_pulls(&server).await;
    server
}

/// Everything but the PR list: one branch (`main`), no comments yet, and 201 for any write
/// (comments, statuses).
async fn mount_all_but_pulls(server: &MockServer) {
    Mock::given(method("GET"))
        .and(path_regex(r"/branches$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "main"}])))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(r"/comments$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(201).set_body_json(json!({"id": 1})))
        .mount(server)
        .await;
}

async fn install(client: &Client, namespace: &str, forge: &str, lifecycle: Value) {
    install_for(
        client,
        namespace,
        "github",
        "Codertocat/Hello-World",
        forge,
        lifecycle,
    )
    .await;
}

/// The template `app` for `repository` on a forge of `kind` served at `forge`.
async fn install_for(
    client: &Client,
    namespace: &str,
    kind: &str,
    repository: &str,
    forge: &str,
    lifecycle: Value,
) {
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
        "spec": {"forge": {"kind": kind, "repository": repository, "apiUrl": forge,
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
    let name = created(client, namespace, number).await;
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
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

/// The environment of PR `number`, created (not waited for: no controller may run yet).
async fn created(client: &Client, namespace: &str, number: u64) -> String {
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
        let report = sweeper
            .sweep(context.reporter.clients(), later)
            .await
            .unwrap();
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
        let report = sweeper
            .sweep(context.reporter.clients(), later)
            .await
            .unwrap();
        assert!(
            report.deleted.is_empty(),
            "rate-limited: nothing deleted ({report:?})"
        );
        assert_eq!(names(&client, &ns).await.len(), 2);

        // The forge answers: PR 3 is not open, so its environment and namespace go.
        point_template_at(&templates, &context, &forge.uri()).await;
        let report = sweeper
            .sweep(context.reporter.clients(), later)
            .await
            .unwrap();
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
        let report = sweeper.sweep(context.reporter.clients(), Utc::now() + TimeDelta::hours(48)).await.unwrap();
        assert!(report.deleted.is_empty(), "{report:?}");
        assert_eq!(report.orphans, vec![orphan.clone()]);
        for kept in [&unrelated, &lookalike] {
            assert!(namespaces.get_opt(kept).await.unwrap().is_some_and(|n| n.metadata.deletion_timestamp.is_none()), "{kept} untouched");
        }

        // Four days on: the environment was idle more than 72 h.
        let report = sweeper.sweep(context.reporter.clients(), Utc::now() + TimeDelta::hours(96)).await.unwrap();
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
            .sweep(
                context.reporter.clients(),
                Utc::now() + TimeDelta::minutes(10),
            )
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

/// An environment made by hand (as the intake would) with `source`, waited for until Ready.
async fn environment_with(client: &Client, namespace: &str, name: &str, source: Value) {
    let environment: PreviewEnvironment = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": name},
        "spec": {"template": "app", "source": source, "lastActivity": Utc::now().to_rfc3339()}
    }))
    .unwrap();
    let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &environment)
        .await
        .unwrap();
    support::wait_for_phase(&api, name, Phase::Ready, Duration::from_secs(60)).await;
}

/// The lifecycle rules end to end, on the clock's injected days: idleness, a branch deleted on
/// the forge (`BranchGone`), `keepUntil` (what `/preview extend` writes; the command itself is
/// tested in `tests/integration/lifecycle.rs`) shielding from idleness and from the maximum age until it
/// runs out, the maximum age, and a deleted template (`TemplateGone`).
#[tokio::test]
async fn lifecycle_rules_idle_branch_gone_extend_max_age_and_template_gone() {
    in_namespace("sweep-rules", |client, ns| async move {
        let forge = forge_listing(&[2, 3, 4]).await;
        install(
            &client,
            &ns,
            &forge.uri(),
            json!({"idleTimeout": "72h", "maxAge": "120h"}),
        )
        .await;
        let (context, sweeper) = start(&client, &ns).await;
        let idle = environment(&client, &ns, 2).await;
        let extended = environment(&client, &ns, 3).await;
        let sha = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
        environment_with(
            &client,
            &ns,
            "app-feature-x",
            json!({"repository": "Codertocat/Hello-World", "branch": "feature-x", "headSha": sha}),
        )
        .await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let keep_until = Utc::now() + TimeDelta::days(10);
        environments
            .patch(
                &extended,
                &Default::default(),
                &kube::api::Patch::Merge(json!({"spec": {"keepUntil": keep_until.to_rfc3339()}})),
            )
            .await
            .unwrap();
        eventually(
            "the extension to reach the cache",
            Duration::from_secs(10),
            || async {
                context
                    .caches
                    .environments
                    .state()
                    .iter()
                    .any(|e| e.spec.keep_until.is_some())
                    .then_some(())
            },
        )
        .await;

        // Four days on: PR 2 was idle more than 72 h; branch feature-x is gone from the forge's
        // branch list; PR 3 is idle as long, but extended.
        let report = sweeper
            .sweep(
                context.reporter.clients(),
                Utc::now() + TimeDelta::hours(96),
            )
            .await
            .unwrap();
        let mut deleted = report.deleted.clone();
        deleted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            deleted,
            vec![
                (format!("{ns}/app-feature-x"), Reason::BranchGone),
                (format!("{ns}/{idle}"), Reason::Idle)
            ],
            "{report:?}"
        );

        // Eight days on: past the 120 h maximum age, still extended: kept.
        let report = sweeper
            .sweep(context.reporter.clients(), Utc::now() + TimeDelta::days(8))
            .await
            .unwrap();
        assert!(
            report.deleted.is_empty(),
            "the extension shields from the maximum age: {report:?}"
        );

        // Eleven days on: the extension ran out; the maximum age decides (before idleness).
        let report = sweeper
            .sweep(context.reporter.clients(), Utc::now() + TimeDelta::days(11))
            .await
            .unwrap();
        assert_eq!(
            report.deleted,
            vec![(format!("{ns}/{extended}"), Reason::MaxAge)]
        );
        eventually(
            "the three environments to be gone",
            Duration::from_secs(60),
            || {
                let (client, ns) = (client.clone(), ns.clone());
                async move { names(&client, &ns).await.is_empty().then_some(()) }
            },
        )
        .await;

        // A new environment, then its template is deleted: the environment goes with it.
        let orphaned = environment(&client, &ns, 4).await;
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .delete("app", &Default::default())
            .await
            .unwrap();
        eventually(
            "the template deletion to reach the cache",
            Duration::from_secs(10),
            || async { context.caches.templates.state().is_empty().then_some(()) },
        )
        .await;
        let report = sweeper
            .sweep(context.reporter.clients(), Utc::now())
            .await
            .unwrap();
        assert_eq!(
            report.deleted,
            vec![(format!("{ns}/{orphaned}"), Reason::TemplateGone)]
        );
        let text = context.metrics.render();
        for (reason, count) in [
            ("idle", 1.0),
            ("branch_gone", 1.0),
            ("max_age", 1.0),
            ("template_gone", 1.0),
        ] {
            let series = format!(r#"previewd_gc_deletions_total{{reason="{reason}"}}"#);
            assert_eq!(
                metric_value(&text, &series),
                Some(count),
                "{series} in:\n{text}"
            );
        }
    })
    .await;
}

/// The sweep on GitLab: the open merge requests are read over two pages (offset pagination, as
/// GitLab answers: a full page of 100, then a short one), the branches listed. MR 1 is only on
/// the second page and keeps its environment; MR 2 was merged with the hook missed, and branch
/// `feature-x` was deleted: both environments go.
#[tokio::test]
async fn on_gitlab_the_sweep_reads_every_page_of_merge_requests_and_the_branches() {
    in_namespace("sweep-gitlab", |client, ns| async move {
        let forge = MockServer::start().await;
        let full_page: Vec<Value> = (1001..=1100u64).map(|iid| json!({"iid": iid})).collect();
        Mock::given(method("GET"))
            .and(path_regex(r"/merge_requests$"))
            .and(query_param("page", "2"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"iid": 1}])).insert_header("x-page", "2").insert_header("x-total-pages", "2"))
            .mount(&forge)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"/merge_requests$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(full_page).insert_header("x-page", "1").insert_header("x-next-page", "2").insert_header("x-total-pages", "2"))
            .mount(&forge)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"/repository/branches$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([{"name": "main"}, {"name": "mr-1"}, {"name": "mr-2"}])))
            .mount(&forge)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"/notes$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
            .mount(&forge)
            .await;
        // The environments' reports register GitLab environments: none exists yet (a list).
        Mock::given(method("GET"))
            .and(path_regex(r"/environments$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
            .mount(&forge)
            .await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(201).set_body_json(json!({"id": 1, "body": ""})))
            .mount(&forge)
            .await;
        install_for(&client, &ns, "gitlab", "mike/diaspora", &forge.uri(), json!({})).await;
        let (context, sweeper) = start(&client, &ns).await;
        let sha = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
        for (name, source) in [
            ("app-mr-1", json!({"repository": "mike/diaspora", "branch": "mr-1", "pullRequest": 1, "headSha": sha})),
            ("app-mr-2", json!({"repository": "mike/diaspora", "branch": "mr-2", "pullRequest": 2, "headSha": sha})),
            ("app-feature-x", json!({"repository": "mike/diaspora", "branch": "feature-x", "headSha": sha})),
        ] {
            environment_with(&client, &ns, name, source).await;
        }

        let report = sweeper.sweep(context.reporter.clients(), Utc::now() + TimeDelta::minutes(10)).await.unwrap();
        assert!(report.forge_unavailable.is_empty(), "{report:?}");
        let mut deleted = report.deleted.clone();
        deleted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            deleted,
            vec![(format!("{ns}/app-feature-x"), Reason::BranchGone), (format!("{ns}/app-mr-2"), Reason::PullRequestClosed)],
            "{report:?}"
        );
        let pages = forge
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.url.path().ends_with("/merge_requests"))
            .count();
        assert_eq!(pages, 2, "both pages of open merge requests were read, once each");
        eventually("the two environments to be gone", Duration::from_secs(60), || {
            let (client, ns) = (client.clone(), ns.clone());
            async move { (names(&client, &ns).await == vec!["app-mr-1".to_string()]).then_some(()) }
        })
        .await;
    })
    .await;
}

/// The sweep on GitHub with a list of three pages, answered as GitHub answers them (`Link`
/// headers, an `ETag` on every page, `304 Not Modified` to a matching `If-None-Match`): PR 2 is
/// only on the last page and keeps its environment, PR 3 is on none and loses its environment;
/// the second sweep is answered by 304s and decides the same from the remembered pages.
#[tokio::test]
async fn on_github_every_page_is_read_and_unchanged_pages_come_back_304() {
    in_namespace("sweep-pages", |client, ns| async move {
        let forge = MockServer::start().await;
        let base = format!("{}/repos/Codertocat/Hello-World/pulls", forge.uri());
        let pages: [Vec<u64>; 3] = [(1000..1100).collect(), (2000..2100).collect(), vec![2, 5]];
        for (index, numbers) in pages.iter().enumerate() {
            let page = index + 1;
            let etag = format!("\"pulls-page-{page}\"");
            let mut link = format!("<{base}?per_page=100&page=3>; rel=\"last\"");
            if page < 3 {
                link = format!(
                    "<{base}?per_page=100&page={}>; rel=\"next\", {link}",
                    page + 1
                );
            }
            Mock::given(method("GET"))
                .and(path_regex(r"/pulls$"))
                .and(query_param("page", page.to_string()))
                .and(header("if-none-match", etag.as_str()))
                .respond_with(ResponseTemplate::new(304).insert_header("etag", etag.as_str()))
                .mount(&forge)
                .await;
            let body: Vec<Value> = numbers.iter().map(|n| json!({"number": n})).collect();
            Mock::given(method("GET"))
                .and(path_regex(r"/pulls$"))
                .and(query_param("page", page.to_string()))
                .respond_with(
                    ResponseTemplate::new(200)
                        .set_body_json(body)
                        .insert_header("etag", etag.as_str())
                        .insert_header("link", link.as_str()),
                )
                .mount(&forge)
                .await;
        }
        mount_all_but_pulls(&forge).await;
        install(&client, &ns, &forge.uri(), json!({})).await;
        let (context, sweeper) = start(&client, &ns).await;
        environment(&client, &ns, 2).await;
        let closed = environment(&client, &ns, 3).await;

        let later = Utc::now() + TimeDelta::minutes(10);
        let report = sweeper
            .sweep(context.reporter.clients(), later)
            .await
            .unwrap();
        assert_eq!(
            report.deleted,
            vec![(format!("{ns}/{closed}"), Reason::PullRequestClosed)],
            "{report:?}"
        );
        eventually("PR 3's environment to be gone", Duration::from_secs(60), || {
            let (client, ns) = (client.clone(), ns.clone());
            async move { (names(&client, &ns).await == vec!["app-pr-2".to_string()]).then_some(()) }
        })
        .await;

        // Again: every page is asked for with its ETag, answered 304, and PR 2 still stays.
        let report = sweeper
            .sweep(context.reporter.clients(), later)
            .await
            .unwrap();
        assert!(
            report.deleted.is_empty() && report.forge_unavailable.is_empty(),
            "{report:?}"
        );
        let requests = forge.received_requests().await.unwrap_or_default();
        let list_answers: Vec<bool> = requests
            .iter()
            .filter(|r| r.url.path().ends_with("/pulls"))
            .map(|r| r.headers.contains_key("if-none-match"))
            .collect();
        assert_eq!(
            list_answers,
            vec![false, false, false, true, true, true],
            "three pages, then three conditional requests"
        );
        assert_eq!(names(&client, &ns).await, vec!["app-pr-2".to_string()]);
    })
    .await;
}

/// The sweep judges environments from its cache, which may lag behind the API server. A verdict
/// about a version that has changed since (here extended by someone in between; in CI once, an
/// environment whose deletion had begun but was not in the cache yet) deletes nothing and
/// writes no reason on it; judged again from the current version, it goes.
#[tokio::test]
async fn a_verdict_on_a_version_that_changed_since_deletes_nothing() {
    in_namespace("sweep-stale", |client, ns| async move {
        let api: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let environment: PreviewEnvironment = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
            "metadata": {"name": "app-pr-7"},
            "spec": {"template": "app", "source": {"repository": "Codertocat/Hello-World",
                     "branch": "pr-7", "pullRequest": 7,
                     "headSha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821"}}
        }))
        .unwrap();
        let judged = api
            .create(&PostParams::default(), &environment)
            .await
            .unwrap();
        let keep_until = (Utc::now() + TimeDelta::days(3)).to_rfc3339();
        api.patch(
            "app-pr-7",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"keepUntil": keep_until}})),
        )
        .await
        .unwrap();

        let deleted = records(&client)
            .delete_as_judged(&judged, "idle for 72 h")
            .await
            .unwrap();
        assert!(!deleted, "judged before the extension: not deleted");
        let current = api.get("app-pr-7").await.unwrap();
        assert!(current.metadata.deletion_timestamp.is_none());
        assert!(
            !current
                .annotations()
                .contains_key(ANNOTATION_DELETION_REASON),
            "no reason written either"
        );

        // A change that lands after the sweep's read and before its deletion (here: the read
        // is taken, then the environment is pushed to): the deletion is refused on the old
        // version, judged again, and not made.
        let read = api.get("app-pr-7").await.unwrap();
        let push =
            json!({"spec": {"source": {"headSha": "1111111111111111111111111111111111111111"}}});
        api.patch(
            "app-pr-7",
            &Default::default(),
            &kube::api::Patch::Merge(push),
        )
        .await
        .unwrap();
        let deleted = records(&client)
            .delete_unless_changed(&current, read, "idle for 72 h")
            .await
            .unwrap();
        assert!(!deleted, "changed inside the window: not deleted");
        let current = api.get("app-pr-7").await.unwrap();
        assert!(current.metadata.deletion_timestamp.is_none());
        assert!(
            !current
                .annotations()
                .contains_key(ANNOTATION_DELETION_REASON)
        );

        assert!(
            records(&client)
                .delete_as_judged(&current, "idle for 72 h")
                .await
                .unwrap()
        );

        // A verdict on an environment that was deleted and made again under its name (a PR
        // closed and reopened): the new one is not the one judged, and stays.
        let mut second = environment.clone();
        second.metadata.name = Some("app-pr-8".into());
        let judged = api.create(&PostParams::default(), &second).await.unwrap();
        api.delete("app-pr-8", &Default::default()).await.unwrap();
        eventually("app-pr-8 gone", Duration::from_secs(30), || async {
            api.get_opt("app-pr-8").await.ok()?.is_none().then_some(())
        })
        .await;
        let again = api.create(&PostParams::default(), &second).await.unwrap();
        assert_eq!(
            again.metadata.generation, judged.metadata.generation,
            "the same generation"
        );
        let deleted = records(&client)
            .delete_as_judged(&judged, "the pull request is no longer open")
            .await
            .unwrap();
        assert!(!deleted, "another object of the same name");
        let kept = api.get("app-pr-8").await.unwrap();
        assert!(kept.metadata.deletion_timestamp.is_none());
        assert!(!kept.annotations().contains_key(ANNOTATION_DELETION_REASON));
        eventually("app-pr-7 gone", Duration::from_secs(30), || async {
            api.get_opt("app-pr-7").await.ok()?.is_none().then_some(())
        })
        .await;
    })
    .await;
}

/// The sweep runs by itself: on start-up and then every `--sweep-interval` (lifecycle.md). An
/// environment already past its `maxAge` goes at start-up (the next sweep is an hour away),
/// and one that passes its `maxAge` after the first sweep of a 2 s interval goes at a later one;
/// nobody calls a sweep by hand. The leader's work is previewd's own (`service::lead`, what a
/// replica runs while it holds the Lease), so a sweep it stopped starting fails this test.
#[tokio::test]
async fn the_sweep_runs_on_its_own_on_start_up_and_every_interval() {
    in_namespace("sweep-interval", |client, ns| async move {
        let forge = forge_listing(&[2, 3]).await;
        install(&client, &ns, &forge.uri(), json!({"maxAge": "6s"})).await;
        let (_logging, logs) = support::capture_logs();
        let metrics = std::sync::Arc::new(previewd::runtime::metrics::Metrics::new());
        let gone = |name: String| {
            let (client, ns) = (client.clone(), ns.clone());
            move || {
                let (client, ns, name) = (client.clone(), ns.clone(), name.clone());
                async move { (!names(&client, &ns).await.contains(&name)).then_some(()) }
            }
        };
        let lead_with_sweeps_every = |interval: Duration| {
            let mut config = previewd::reconcile::ControllerConfig {
                namespace: Some(ns.clone()),
                ..Default::default()
            };
            config.engines.worker = std::path::PathBuf::from(env!("CARGO_BIN_EXE_previewd"));
            let lead = previewd::runtime::service::lead(
                client.clone(),
                config,
                metrics.clone(),
                interval,
                None,
            );
            tokio::spawn(lead)
        };

        let first = created(&client, &ns, 2).await;
        tokio::time::sleep(Duration::from_secs(7)).await; // past its maxAge
        let hourly = lead_with_sweeps_every(Duration::from_secs(3600));
        eventually("the start-up sweep", Duration::from_secs(30), gone(first)).await;
        hourly.abort();
        let _ = hourly.await;

        let sweeps_done = || {
            let lines = logs.lines();
            lines
                .iter()
                .filter(|line| line["fields"]["message"] == "sweep done")
                .count()
        };
        let done_before = sweeps_done();
        let every_two_seconds = lead_with_sweeps_every(Duration::from_secs(2));
        eventually(
            "the new leader's start-up sweep",
            Duration::from_secs(30),
            || async { (sweeps_done() > done_before).then_some(()) },
        )
        .await;
        // Created after that start-up sweep: only a later one, every 2 s, can remove it.
        let second = created(&client, &ns, 3).await;
        eventually("a periodic sweep", Duration::from_secs(30), gone(second)).await;
        every_two_seconds.abort();
        let by_age = metrics
            .sweep
            .deletions
            .with_label_values(&["max_age"])
            .get();
        assert_eq!(by_age, 2, "both removed by the sweep, for their age");
        // docs/lifecycle.md: "Every removal is logged".
        let logged: Vec<String> = logs
            .lines()
            .into_iter()
            .filter(|line| line["fields"]["reason"] == "max_age")
            .filter_map(|line| line["fields"]["message"].as_str().map(str::to_string))
            .filter(|message| message.starts_with("sweep deleted environment"))
            .collect();
        assert_eq!(logged.len(), 2, "{logged:?}");
    })
    .await;
}

/// previewd's record writer over `client` (its own counters: these tests count nothing).
fn records(client: &kube::Client) -> records::Records<'_> {
    static WRITER: std::sync::LazyLock<previewd::cluster::writer::Writer> =
        std::sync::LazyLock::new(|| {
            previewd::cluster::writer::Writer::new(previewd::cluster::metrics::ClusterMetrics::new())
        });
    records::Records::new(client, &WRITER)
}
