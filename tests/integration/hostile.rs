//! Hostile input: property tests (proptest) of webhook parsing and signature checking, of branch
//! name → environment and namespace names, and of template rendering; and, against the real
//! control plane, the named cases: a 20 MB body, deeply nested JSON, branch names with `../`,
//! unicode and 255 characters, a template that renders 10,000 objects, a comment command with a
//! huge argument. Nothing may panic, and nothing may change that should not.
//!
//! Deliveries start from the fixtures (`github/pull_request.opened.json`,
//! `github/issue_comment.created.json`), changed in copies where each test says.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use previewd::forge::{github, gitlab};
use previewd::model::crd::{ForgeKind, Phase};
use previewd::model::metadata::ANNOTATION_LAST_COMMAND;
use previewd::model::naming;
use proptest::prelude::*;
use serde_json::{Value, json};
use support::webhooks::*;
use support::{in_namespace, wait_for_phase};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

const REPOSITORY: &str = "Codertocat/Hello-World";

/// A JSON value of bounded depth and size.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Paths into the opened fixture whose values a hostile sender may replace.
const FIXTURE_PATHS: &[&[&str]] = &[
    &["action"],
    &["number"],
    &["pull_request"],
    &["pull_request", "head"],
    &["pull_request", "head", "ref"],
    &["pull_request", "head", "sha"],
    &["pull_request", "head", "repo"],
    &["pull_request", "user", "login"],
    &["pull_request", "draft"],
    &["pull_request", "labels"],
    &["repository"],
    &["repository", "full_name"],
    &["sender"],
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(
        event in prop::sample::select(vec!["pull_request", "push", "delete", "issue_comment", "ping", "Merge Request Hook", "Note Hook", "Push Hook", "other"]),
        body in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let _ = github::parse(event, &body);
        let _ = gitlab::parse(event, &body);
        let _ = previewd::forge::forges::forge(ForgeKind::Github).webhook.repository_of(&body);
        let _ = previewd::forge::forges::forge(ForgeKind::Gitlab).webhook.repository_of(&body);
    }

    #[test]
    fn a_real_delivery_with_any_field_replaced_never_panics_the_parser(
        path in prop::sample::select(FIXTURE_PATHS.to_vec()),
        replacement in json_value(),
    ) {
        let mut delivery = json_fixture("github/pull_request.opened.json");
        let mut slot = &mut delivery;
        for key in path {
            slot = &mut slot[*key];
        }
        *slot = replacement;
        let body = delivery.to_string().into_bytes();
        let _ = github::parse("pull_request", &body);
        let _ = previewd::forge::forges::forge(ForgeKind::Github).webhook.repository_of(&body);
    }

    #[test]
    fn only_the_right_secret_signs_a_body(
        secret in prop::collection::vec(any::<u8>(), 1..64),
        other in prop::collection::vec(any::<u8>(), 1..64),
        body in prop::collection::vec(any::<u8>(), 0..512),
        forged in ".{0,80}",
    ) {
        let signature = github::sign(&secret, &body);
        prop_assert!(github::verify(&secret, &body, Some(&signature)).is_ok());
        if other != secret {
            prop_assert!(github::verify(&other, &body, Some(&signature)).is_err());
        }
        if forged != signature {
            prop_assert!(github::verify(&secret, &body, Some(&forged)).is_err());
        }
        let token = hex::encode(&secret);
        prop_assert!(gitlab::verify(token.as_bytes(), Some(&token)).is_ok());
        if forged != token {
            prop_assert!(gitlab::verify(token.as_bytes(), Some(&forged)).is_err());
        }
    }

    #[test]
    fn any_branch_gives_valid_names(
        template in "[a-z][a-z0-9-]{0,70}",
        branch in ".{0,300}",
        pull_request in prop::option::of(any::<u64>()),
        namespace in "[a-z][a-z0-9-]{0,62}",
    ) {
        let environment = naming::environment_name(&template, &branch, pull_request);
        prop_assert!(naming::is_dns1123_label(&environment), "{environment:?}");
        let target = naming::namespace_name("preview", &namespace, &environment);
        prop_assert!(naming::is_dns1123_label(&target), "{target:?}");
    }

    #[test]
    fn distinct_branches_give_distinct_environments(a in ".{1,120}", b in ".{1,120}") {
        prop_assume!(a != b);
        prop_assert_ne!(
            naming::environment_name("app", &a, None),
            naming::environment_name("app", &b, None)
        );
    }

    #[test]
    fn rendering_arbitrary_branch_values_never_panics_and_stays_in_its_namespace(branch in ".{0,200}") {
        let manifest = previewd::model::crd::InlineManifest {
            name: "app.yaml".into(),
            template: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  branch: \"{{ branch }}\"\n".into(),
        };
        let context = previewd::plan::render::RenderContext {
            name: "app-pr-1".into(),
            branch: branch.clone(),
            slug: naming::slug(&branch),
            sha: "0".repeat(40),
            short_sha: "0000000".into(),
            pr: Some(1),
            repository: REPOSITORY.into(),
            author: "someone".into(),
            namespace: "preview-x".into(),
            host: "x.example.com".into(),
            url: "https://x.example.com".into(),
            values: Default::default(),
        };
        if let Ok(objects) = previewd::plan::render::render(&[manifest], &[], &context, &Default::default()) {
            // Whatever the branch injected, the guard sees every object and its namespace.
            let violations = previewd::plan::guard::check(&objects, "preview-x", &Default::default());
            for object in &objects {
                let allowed = object.object["metadata"]["namespace"] == "preview-x";
                prop_assert!(allowed || !violations.is_empty());
            }
        }
    }
}

/// `github/pull_request.opened.json` for `branch` (changed in a copy: the head ref, and a push
/// delivery would carry the same), as PR `number`.
fn opened_on_branch(number: u64, branch: &str) -> Vec<u8> {
    let mut delivery = json_fixture("github/pull_request.opened.json");
    delivery["number"] = number.into();
    delivery["pull_request"]["number"] = number.into();
    delivery["pull_request"]["head"]["ref"] = branch.into();
    delivery.to_string().into_bytes()
}

#[tokio::test]
async fn hostile_deliveries_are_refused_or_contained() {
    in_namespace("hostile", |client, ns| async move {
        let forge = github_forge().await;
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;

        // 20 MB body: refused before it is read whole, nothing written.
        let huge = vec![b' '; 20 << 20];
        let (status, _) = harness.signed("pull_request", "huge", &huge).await;
        assert_eq!(status, 413);
        // 100,000 nested arrays, correctly signed: a parse error, not a stack overflow.
        let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let (status, answer) = harness
            .signed("pull_request", "nested", nested.as_bytes())
            .await;
        assert_eq!(status, 400, "{answer}");
        assert!(
            harness.environment_names().await.is_empty(),
            "nothing was written"
        );

        // Branch names: path traversal, unicode, 255 characters. Each PR gets a valid, distinct
        // environment and namespace, and its branch is kept verbatim in the spec.
        let long: String = "a".repeat(255);
        let branches = ["../../kube-system", "ñandú/🚀-feature", long.as_str()];
        let mut namespaces = Vec::new();
        for (index, branch) in branches.iter().enumerate() {
            let number = 60 + index as u64;
            let (status, answer) = harness
                .signed(
                    "pull_request",
                    &format!("branch-{index}"),
                    &opened_on_branch(number, branch),
                )
                .await;
            assert_eq!(status, 202, "{answer}");
            let name = environment_of_pr(&harness.environments, number).await;
            assert!(naming::is_dns1123_label(&name), "{name}");
            let ready = wait_for_phase(
                &harness.environments,
                &name,
                Phase::Ready,
                Duration::from_secs(60),
            )
            .await;
            assert_eq!(ready.spec.source.branch, *branch);
            let target = ready.status.unwrap().namespace.unwrap();
            assert!(
                naming::is_dns1123_label(&target) && target.starts_with("preview-"),
                "{target}"
            );
            namespaces.push(target);
        }
        namespaces.sort();
        namespaces.dedup();
        assert_eq!(
            namespaces.len(),
            3,
            "three distinct namespaces: {namespaces:?}"
        );
        let kube_system: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        assert!(
            kube_system
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=previewd"))
                .await
                .unwrap()
                .items
                .is_empty(),
            "nothing in kube-system"
        );

        // A comment command with a 100,000-character argument, from someone allowed to run
        // commands (so the argument itself is what gets judged): answered with a short refusal
        // that quotes the argument cut down, and nothing else changed.
        Mock::given(method("GET"))
            .and(path(format!(
                "/repos/{REPOSITORY}/collaborators/Codertocat/permission"
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"permission": "write"})))
            .mount(&forge)
            .await;
        let name = environment_of_pr(&harness.environments, 60).await;
        let before = harness.environments.get(&name).await.unwrap().spec;
        let mut comment = json_fixture("github/issue_comment.created.json");
        comment["issue"]["number"] = 60.into();
        comment["issue"]["pull_request"] =
            json!({"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/60"});
        comment["comment"]["body"] = format!("/preview extend {}", "9".repeat(100_000)).into();
        let (status, answer) = harness
            .signed(
                "issue_comment",
                "huge-command",
                comment.to_string().as_bytes(),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let after = harness.environments.get(&name).await.unwrap();
        let reply = after
            .annotations()
            .get(ANNOTATION_LAST_COMMAND)
            .cloned()
            .unwrap_or_default();
        assert!(
            reply.contains("not understood") && reply.contains("is not a duration"),
            "the argument was judged, not the author: {reply}"
        );
        assert!(
            reply.len() < 1_000,
            "the answer quotes the argument cut down ({} bytes)",
            reply.len()
        );
        assert_eq!(
            before.keep_until, after.spec.keep_until,
            "the huge extension changed nothing"
        );
    })
    .await;
}

#[tokio::test]
async fn a_template_rendering_10000_objects_is_refused_with_a_condition() {
    in_namespace("hostile-objects", |client, ns| async move {
        let forge = github_forge().await;
        let manifest = "{% for i in range(10000) %}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: flood-{{ i }}\n{% endfor %}\n";
        install_template_with(&client, &ns, "github", REPOSITORY, Some(&forge.uri()), json!({}), manifest).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let (status, _) = harness.signed("pull_request", "flood", &github_fixture("pull_request.opened.json")).await;
        assert_eq!(status, 202);
        let name = environment_of_pr(&harness.environments, 2).await;
        let degraded = wait_for_phase(&harness.environments, &name, Phase::Degraded, Duration::from_secs(60)).await;
        let status = degraded.status.unwrap();
        let condition = &status.conditions[0];
        assert_eq!(condition.reason, "TooManyObjects");
        assert!(condition.message.contains("10000 objects") && condition.message.contains("500"), "{}", condition.message);
        eprintln!("10,000 objects: {}", condition.message);
        let target = status.namespace.unwrap();
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
        let applied = config_maps.list(&ListParams::default().labels("app.kubernetes.io/managed-by=previewd")).await.map(|l| l.items.len()).unwrap_or(0);
        assert_eq!(applied, 0, "nothing was applied");
    })
    .await;
}
