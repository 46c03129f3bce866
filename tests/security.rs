//! Security, against the real control plane: what a pull request, a fork or another team's
//! template can do through previewd, tried as an attacker would (issue 16). Every test here
//! failed on the code before its fix.
//!
//! Deliveries are the fixtures in `../shared/fixtures`, signed as the forges sign them.

mod support;

use kube::api::{Api, PostParams};
use previewd::forge::github;
use previewd::model::crd::PreviewTemplate;
use serde_json::json;
use support::in_namespace;
use support::webhooks::*;

const REPOSITORY: &str = "Codertocat/Hello-World";

/// A template `name` of the GitHub repository, verified by its own Secret `name` holding
/// `secret` (for GitLab: the token).
async fn team_template(client: &kube::Client, namespace: &str, forge: &str, name: &str) {
    let repository = match forge {
        "gitlab" => "gitlabhq/gitlab-test",
        _ => REPOSITORY,
    };
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"secret": format!("{name}-secret")}
    }))
    .unwrap();
    Api::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let template: PreviewTemplate = serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
        "metadata": {"name": name},
        "spec": {
            "forge": {"kind": forge, "repository": repository,
                      "webhookSecretRef": {"name": name, "key": "secret"}},
            "manifests": {"inline": [{"name": "app.yaml", "template": CONFIG_MAP_APP}]}
        }
    }))
    .unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// The environments whose name starts with `template`.
async fn environments_of(harness: &Harness, template: &str) -> Vec<String> {
    let prefix = format!("{template}-");
    let mut names = harness.environment_names().await;
    names.retain(|name| name.starts_with(&prefix));
    names
}

/// Two teams serve one repository, each with its own template and webhook secret. A delivery
/// signed with team A's secret acts for team A's template only: team A cannot open, redeploy or
/// close team B's environments (before the fix, any template's secret acted for all).
#[tokio::test]
async fn a_delivery_acts_only_for_the_templates_whose_secret_verified_it() {
    in_namespace("security-templates", |client, ns| async move {
        team_template(&client, &ns, "github", "team-a").await;
        team_template(&client, &ns, "github", "team-b").await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let signed_by =
            |team: &str, body: &[u8]| Some(github::sign(format!("{team}-secret").as_bytes(), body));

        let opened = github_fixture("pull_request.opened.json");
        let (status, answer) = harness
            .github(
                "pull_request",
                "a-opened",
                &opened,
                signed_by("team-a", &opened),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(environments_of(&harness, "team-a").await.len(), 1);
        assert_eq!(
            environments_of(&harness, "team-b").await,
            Vec::<String>::new(),
            "team A's secret opened nothing for team B"
        );

        let (status, answer) = harness
            .github(
                "pull_request",
                "b-opened",
                &opened,
                signed_by("team-b", &opened),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let team_b = environments_of(&harness, "team-b").await;
        assert_eq!(team_b.len(), 1);

        // Team A closes the PR as far as its own template goes; team B's environment stays.
        let closed = github_fixture("pull_request.closed.json");
        let (status, answer) = harness
            .github(
                "pull_request",
                "a-closed",
                &closed,
                signed_by("team-a", &closed),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let named = answer["environments"].to_string();
        assert!(
            !named.contains("team-b"),
            "team A's delivery acted on: {named}"
        );
        let survivor = harness.environments.get(&team_b[0]).await.unwrap();
        assert!(
            survivor.metadata.deletion_timestamp.is_none(),
            "team B's environment is not being deleted"
        );

        // A secret that belongs to no template of the repository: 401, nothing changed.
        let (status, _) = harness
            .github(
                "pull_request",
                "x-closed",
                &closed,
                signed_by("team-c", &closed),
            )
            .await;
        assert_eq!(status, 401);
    })
    .await;
}

/// The same for GitLab: a template's token acts for that template only.
#[tokio::test]
async fn a_gitlab_token_acts_only_for_its_own_template() {
    in_namespace("security-gitlab-token", |client, ns| async move {
        team_template(&client, &ns, "gitlab", "team-a").await;
        team_template(&client, &ns, "gitlab", "team-b").await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let opened = serde_json::to_vec(&json_fixture("gitlab/merge_request.json")).unwrap();
        let (status, answer) = harness
            .gitlab("Merge Request Hook", "a-1", &opened, "team-a-secret")
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(environments_of(&harness, "team-a").await.len(), 1);
        assert!(environments_of(&harness, "team-b").await.is_empty());
    })
    .await;
}
