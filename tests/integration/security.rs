//! Security, against the real control plane: what a pull request, a fork or another team's
//! template can do through previewd, tried as an attacker would (issue 16). Every test here
//! failed on the code before its fix.
//!
//! Deliveries are the fixtures in `../shared/fixtures`, signed as the forges sign them.
//!
//! What previewd itself may do (its RBAC, least privilege) is proven where the chart is
//! installed: `tests/integration/chart.rs`, `assert_confined_to_environments`, acting as the chart's
//! ServiceAccount against the real API server.

use crate::support;

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use previewd::forge::github;
use previewd::lifecycle::sweeper::Sweeper;
use previewd::model::crd::PreviewTemplate;
use previewd::model::metadata::{
    LABEL_ENVIRONMENT, LABEL_ENVIRONMENT_NAMESPACE, LABEL_ENVIRONMENT_UID, LABEL_MANAGED_BY,
};
use previewd::model::naming;
use serde_json::json;
use support::webhooks::*;
use support::{eventually, in_namespace};

const REPOSITORY: &str = "Codertocat/Hello-World";

/// A template `name` of the GitHub repository, verified by its own Secret `name` holding
/// `secret` (for GitLab: the token).
async fn team_template(client: &kube::Client, namespace: &str, forge: &str, name: &str) {
    team_template_with(client, namespace, forge, name, json!({})).await;
}

/// [`team_template`] with `forge` keys (an `apiUrl`, then the team's token too) and `triggers`
/// of its own.
async fn team_template_with(
    client: &kube::Client,
    namespace: &str,
    forge: &str,
    name: &str,
    extra: serde_json::Value,
) {
    let repository = match forge {
        "gitlab" => "gitlabhq/gitlab-test",
        _ => REPOSITORY,
    };
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"secret": format!("{name}-secret"), "token": "forge-token-for-tests"}
    }))
    .unwrap();
    Api::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut template = json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
        "metadata": {"name": name},
        "spec": {
            "forge": {"kind": forge, "repository": repository,
                      "webhookSecretRef": {"name": name, "key": "secret"}},
            "manifests": {"inline": [{"name": "app.yaml", "template": CONFIG_MAP_APP}]}
        }
    });
    for (key, value) in extra["forge"].as_object().into_iter().flatten() {
        template["spec"]["forge"][key] = value.clone();
    }
    if extra["forge"].get("apiUrl").is_some() {
        // A forge to call needs the team's token.
        template["spec"]["forge"]["tokenSecretRef"] = json!({"name": name, "key": "token"});
    }
    if let Some(triggers) = extra.get("triggers") {
        template["spec"]["triggers"] = triggers.clone();
    }
    let template: PreviewTemplate = serde_json::from_value(template).unwrap();
    Api::<PreviewTemplate>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
}

/// The environment's `Ready` condition, once its reason is `reason`.
async fn condition_with_reason(
    harness: &Harness,
    name: &str,
    reason: &str,
) -> previewd::model::crd::Condition {
    eventually(reason, Duration::from_secs(60), || {
        let environments = harness.environments.clone();
        let name = name.to_string();
        async move {
            let status = environments.get(&name).await.ok()?.status?;
            let condition = status.conditions.first()?.clone();
            (condition.reason == reason).then_some(condition)
        }
    })
    .await
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

/// The same for the deliveries that change a running environment: team A's secret can neither
/// redeploy team B's environment with a push nor approve its fork commit with a comment, while
/// both act on team A's own.
#[tokio::test]
async fn another_teams_secret_neither_redeploys_nor_approves_an_environment() {
    in_namespace("security-templates-approve", |client, ns| async move {
        let forge = github_forge().await;
        with_permissions(&forge).await;
        let extra = json!({
            "forge": {"apiUrl": forge.uri()},
            "triggers": {"forkPolicy": "RequireApproval"}});
        team_template_with(&client, &ns, "github", "team-a", extra.clone()).await;
        team_template_with(&client, &ns, "github", "team-b", extra).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let signed_by =
            |team: &str, body: &[u8]| Some(github::sign(format!("{team}-secret").as_bytes(), body));
        let first = "1111111111111111111111111111111111111111";
        let from_fork = |action: &str, sha: &str| {
            let mut delivery = json_fixture("github/pull_request.opened.json");
            delivery["action"] = action.into();
            delivery["pull_request"]["head"]["repo"]["full_name"] = "mallory/Hello-World".into();
            delivery["pull_request"]["head"]["sha"] = sha.into();
            delivery.to_string().into_bytes()
        };
        let opened = from_fork("opened", first);
        for team in ["team-a", "team-b"] {
            let (status, answer) = harness
                .github(
                    "pull_request",
                    &format!("{team}-opened"),
                    &opened,
                    signed_by(team, &opened),
                )
                .await;
            assert_eq!(status, 202, "{answer}");
        }
        let (team_a, team_b) = (
            environments_of(&harness, "team-a").await,
            environments_of(&harness, "team-b").await,
        );
        assert_eq!((team_a.len(), team_b.len()), (1, 1));
        let spec_of = |name: String| {
            let environments = harness.environments.clone();
            async move { environments.get(&name).await.unwrap().spec }
        };

        // A maintainer's approval, signed with team A's secret, approves team A's commit only.
        let approve = comment_on(2, "maintainer", &format!("/preview approve {first}"));
        let (status, answer) = harness
            .github(
                "issue_comment",
                "a-approve",
                &approve,
                signed_by("team-a", &approve),
            )
            .await;
        assert!(status < 300, "{status} {answer}");
        eventually(
            "team A's commit to be approved",
            Duration::from_secs(30),
            || {
                let spec = spec_of(team_a[0].clone());
                async move { (spec.await.approved_sha.as_deref() == Some(first)).then_some(()) }
            },
        )
        .await;
        assert_eq!(
            spec_of(team_b[0].clone()).await.approved_sha,
            None,
            "team B's commit is not approved"
        );

        // A push, signed with team A's secret, moves team A's environment only.
        let second = "2222222222222222222222222222222222222222";
        let pushed = from_fork("synchronize", second);
        let (status, answer) = harness
            .github(
                "pull_request",
                "a-pushed",
                &pushed,
                signed_by("team-a", &pushed),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(spec_of(team_a[0].clone()).await.source.head_sha, second);
        assert_eq!(
            spec_of(team_b[0].clone()).await.source.head_sha,
            first,
            "team B's environment is not redeployed"
        );
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

/// A GitLab group hook (and a GitHub organization hook) sends every project's events with one
/// token, and GitLab disables a hook after four failed deliveries in a row, refusals included:
/// deliveries for projects no template serves, sent with a template's own token or secret, are
/// accepted and ignored (no environment), four in a row and more; unauthenticated deliveries
/// get the one refusal, whether their project is served or not. On the code before, the group
/// hook's deliveries for other projects got 401, and GitLab would have disabled it.
#[tokio::test]
async fn a_group_hooks_deliveries_for_projects_no_template_serves_are_accepted_and_ignored() {
    in_namespace("security-group-hook", |client, ns| async move {
        team_template(&client, &ns, "gitlab", "team-a").await;
        team_template(&client, &ns, "github", "team-b").await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let served = json_fixture("gitlab/merge_request.json");
        let mut unserved = served.clone();
        unserved["project"]["path_with_namespace"] = json!("another-group/unserved");
        let (served, unserved) = (
            serde_json::to_vec(&served).unwrap(),
            serde_json::to_vec(&unserved).unwrap(),
        );
        for attempt in 0..5 {
            let (status, answer) = harness
                .gitlab(
                    "Merge Request Hook",
                    &format!("group-{attempt}"),
                    &unserved,
                    "team-a-secret",
                )
                .await;
            assert_eq!(status, 202, "{answer}");
            assert_eq!(answer["outcome"], "ignored", "{answer}");
        }
        let mut github_unserved = json_fixture("github/pull_request.opened.json");
        github_unserved["repository"]["full_name"] = json!("another-org/unserved");
        let github_unserved = serde_json::to_vec(&github_unserved).unwrap();
        let signed = Some(github::sign(b"team-b-secret", &github_unserved));
        let (status, answer) = harness
            .github("pull_request", "org-1", &github_unserved, signed)
            .await;
        assert_eq!(
            (status, &answer["outcome"]),
            (202, &json!("ignored")),
            "{answer}"
        );
        // No token of this previewd: one refusal, served project or not, naming nothing.
        let (status_served, refused_served) = harness
            .gitlab("Merge Request Hook", "stranger-1", &served, "not-a-token")
            .await;
        let (status_unserved, refused_unserved) = harness
            .gitlab("Merge Request Hook", "stranger-2", &unserved, "not-a-token")
            .await;
        assert_eq!(status_served, 401, "{refused_served}");
        assert_eq!(
            (status_served, &refused_served),
            (status_unserved, &refused_unserved)
        );
        let unsigned = harness
            .github(
                "pull_request",
                "org-2",
                &github_unserved,
                Some(github::sign(b"guess", &github_unserved)),
            )
            .await;
        assert_eq!(unsigned, (status_served, refused_served.clone()));
        assert!(
            !refused_served.to_string().contains("team-"),
            "{refused_served}"
        );
        assert!(environments_of(&harness, "team-a").await.is_empty());
        assert!(environments_of(&harness, "team-b").await.is_empty());
    })
    .await;
}

/// A namespace as another team (or the cluster admin) made it: nothing of previewd's, or
/// previewd's labels copied by hand, with a ConfigMap of its own.
async fn foreign_namespace(client: &kube::Client, name: &str, labels: serde_json::Value) {
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels}
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let data: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "their-data"}, "data": {"owner": "another team"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &data)
        .await
        .unwrap();
}

async fn assert_untouched(client: &kube::Client, name: &str) {
    let namespace = Api::<Namespace>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    assert!(
        namespace.metadata.deletion_timestamp.is_none(),
        "{name} is not being deleted"
    );
    assert!(
        !namespace.labels().contains_key(LABEL_ENVIRONMENT_UID),
        "{name} was not adopted: {:?}",
        namespace.labels()
    );
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), name);
    assert!(configmaps.get_opt("their-data").await.unwrap().is_some());
    assert!(
        configmaps.get_opt("app").await.unwrap().is_none(),
        "nothing of the environment was applied in {name}"
    );
    // previewd's own access is bound only in namespaces it created (docs/security.md, RBAC).
    let bindings = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), name);
    assert!(
        bindings.get_opt("previewd-access").await.unwrap().is_none(),
        "previewd bound its access in {name}"
    );
}

/// The environment's namespace name already exists and previewd did not create it: the
/// environment says `NamespaceConflict`, nothing is applied there, and deleting the environment
/// (or an orphan sweep) leaves that namespace alone. Before the fix, previewd force-applied the
/// namespace, adopted it, and deleted it on cleanup.
#[tokio::test]
async fn a_namespace_previewd_did_not_create_is_never_adopted_or_deleted() {
    in_namespace("security-foreign-ns", |client, ns| async move {
        team_template(&client, &ns, "github", "team-a").await;
        let environment = naming::environment_name("team-a", "changes", Some(2));
        let target = naming::namespace_name("preview", &ns, &environment);
        // Someone made it first, even with previewd's environment labels copied onto it.
        let copied = json!({
            LABEL_MANAGED_BY: "previewd",
            LABEL_ENVIRONMENT: environment,
            LABEL_ENVIRONMENT_NAMESPACE: ns,
        });
        foreign_namespace(&client, &target, copied).await;
        // And one that looks like an orphan of previewd's (labels, no UID): the sweep's case.
        let lookalike = format!("{ns}-lookalike");
        let labels = json!({LABEL_MANAGED_BY: "previewd", LABEL_ENVIRONMENT: "gone",
                            LABEL_ENVIRONMENT_NAMESPACE: ns});
        foreign_namespace(&client, &lookalike, labels).await;

        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let opened = github_fixture("pull_request.opened.json");
        let signature = Some(github::sign(b"team-a-secret", &opened));
        let (status, answer) = harness
            .github("pull_request", "opened", &opened, signature)
            .await;
        assert_eq!(status, 202, "{answer}");
        let conflict = condition_with_reason(&harness, &environment, "NamespaceConflict").await;
        assert!(conflict.message.contains(&target), "{}", conflict.message);
        assert_untouched(&client, &target).await;

        let sweeper = Sweeper {
            client: client.clone(),
            caches: harness.context.caches.clone(),
            metrics: harness.metrics.sweep.clone(),
            writes: harness.metrics.cluster.clone(),
            watch_namespace: Some(ns.clone()),
        };
        let report = sweeper
            .sweep(
                harness.context.reporter.clients(),
                Utc::now() + TimeDelta::hours(1),
            )
            .await
            .unwrap();
        assert!(report.orphans.is_empty(), "{report:?}");

        // The PR closes: the environment goes, the namespace it never owned stays.
        let closed = github_fixture("pull_request.closed.json");
        let signature = Some(github::sign(b"team-a-secret", &closed));
        let (status, answer) = harness
            .github("pull_request", "closed", &closed, signature)
            .await;
        assert_eq!(status, 202, "{answer}");
        eventually("the environment to go", Duration::from_secs(30), || {
            let environments = harness.environments.clone();
            let name = environment.clone();
            async move {
                environments
                    .get_opt(&name)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }
        })
        .await;
        for name in [&target, &lookalike] {
            assert_untouched(&client, name).await;
            let _ = Api::<Namespace>::all(client.clone())
                .delete(name, &Default::default())
                .await;
        }
    })
    .await;
}

/// A forge (or whatever answers at its address) asks previewd to wait 2^64 − 1 seconds. That
/// overflowed the clock and panicked inside the reconcile; now a rate limit waits an hour at
/// most, and the controller goes on deploying: both PRs get Ready.
#[tokio::test]
async fn a_retry_after_of_u64_max_does_not_take_the_controller_down() {
    in_namespace("security-retry-after", |client, ns| async move {
        let forge = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::any())
            .respond_with(
                wiremock::ResponseTemplate::new(429)
                    .insert_header("retry-after", "18446744073709551615")
                    .set_body_json(json!({"message": "slow down"})),
            )
            .mount(&forge)
            .await;
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.uri())).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        for number in [2, 3] {
            let sha = format!("{number}{}", "0".repeat(39));
            let name = harness.open_pull_request(number, &sha).await;
            wait_ready_with_sha(&harness.environments, &name, &sha).await;
        }
        assert!(
            !forge
                .received_requests()
                .await
                .unwrap_or_default()
                .is_empty(),
            "previewd asked the forge and was told to wait"
        );
    })
    .await;
}

/// A manifest that reaches for the node or out of the namespace (the kind a pull request can
/// write with `manifests.repositoryPath`): a privileged pod with the node's filesystem, a
/// LoadBalancer, an Ingress for another team's host, a binding to cluster-admin. Each is
/// refused by name under the default policy, and nothing of the render is applied (the other
/// integration tests deploy ordinary apps under the same default policy).
#[tokio::test]
async fn the_default_policy_refuses_what_reaches_outside_the_namespace() {
    const HOSTILE: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: miner}
spec:
  selector: {matchLabels: {app: miner}}
  template:
    metadata: {labels: {app: miner}}
    spec:
      hostPID: true
      volumes: [{name: root, hostPath: {path: /}}]
      containers:
      - name: miner
        image: busybox
        securityContext: {privileged: true}
        volumeMounts: [{name: root, mountPath: /host}]
---
apiVersion: v1
kind: Service
metadata: {name: open}
spec: {type: LoadBalancer, selector: {app: miner}, ports: [{port: 80, protocol: TCP}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: login}
spec:
  rules:
  - host: login.bank.example.org
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: open, port: {number: 80}}}}]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: default, namespace: kube-system}]
"#;
    in_namespace("security-policy", |client, ns| async move {
        install_template_with(&client, &ns, "github", REPOSITORY, None, json!({}), HOSTILE).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let (status, answer) = harness
            .signed(
                "pull_request",
                "opened",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        assert_eq!(status, 202, "{answer}");
        let name = environment_of_pr(&harness.environments, 2).await;
        let refused = condition_with_reason(&harness, &name, "PolicyRejected")
            .await
            .message;
        for named in [
            "Deployment/miner (from app.yaml): spec.template.spec.hostPID",
            "spec.template.spec.volumes[0] mounts hostPath",
            "containers[0].securityContext.privileged",
            "Service/open (from app.yaml): spec.type is LoadBalancer",
            "Ingress/login (from app.yaml): host \"login.bank.example.org\"",
            "RoleBinding/admin (from app.yaml): roleRef is ClusterRole \"cluster-admin\"",
            "subjects[0] is ServiceAccount \"default\" in \"kube-system\"",
        ] {
            assert!(refused.contains(named), "{named:?} not in: {refused}");
        }
        let target = naming::namespace_name("preview", &ns, &name);
        let namespace = Api::<Namespace>::all(client.clone())
            .get_opt(&target)
            .await
            .unwrap();
        assert!(
            namespace.is_none(),
            "nothing applied, not even the namespace"
        );
    })
    .await;
}

/// A connection to the webhook server at `address` that has sent a delivery's headers and the
/// start of its body, and then stalls (slowloris). It comes from `client`, as the loopback
/// proxy (trusted, as a cluster's ingress is) says in `X-Forwarded-For`.
async fn stalled_client(address: &str, client: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stalled = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /webhooks/github HTTP/1.1\r\nhost: {address}\r\nx-forwarded-for: {client}\r\nx-github-event: pull_request\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"action\":"
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled
}

/// A client that sends headers and part of a body, then stalls (slowloris): it gets 408 once
/// its 10 s are up, and a delivery sent meanwhile is handled at once.
#[tokio::test]
async fn a_stalled_client_holds_a_turn_for_ten_seconds_at_most() {
    use tokio::io::AsyncReadExt;
    in_namespace("security-slow-client", |client, ns| async move {
        install_template(&client, &ns, "github", REPOSITORY, None).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let address = harness.base.trim_start_matches("http://").to_string();
        let mut stalled = stalled_client(&address, "203.0.113.9").await;
        let stalled_at = std::time::Instant::now();

        let (status, answer) = harness
            .signed(
                "pull_request",
                "meanwhile",
                &github_fixture("pull_request.opened.json"),
            )
            .await;
        assert_eq!(
            status, 202,
            "a delivery is not held up by the stalled one: {answer}"
        );

        let mut reply = vec![0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(60), stalled.read(&mut reply))
            .await
            .expect("the stalled client is answered")
            .unwrap();
        let held = stalled_at.elapsed();
        let reply = String::from_utf8_lossy(&reply[..read]);
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("too_slow"), "{reply}");
        // Ten seconds, as the server's bound says (and a little for a loaded machine to get to
        // it), not the minute the read above would wait.
        let bound = previewd::webhook::server::SLOW_CLIENT_TIMEOUT;
        assert!(
            held >= bound - Duration::from_secs(1) && held < bound + Duration::from_secs(5),
            "the stalled client was answered after {held:?}"
        );
    })
    .await;
}

/// At most 64 deliveries are handled at once, and one waits at most 10 s for its turn: then
/// 503 `busy`, which the forge shows as failed. Stalled clients from four addresses (each
/// holding its share of 16) hold the turns here: 64 take them (each for its 10 s until its
/// 408), 64 more from four other addresses queue 2 s later and take them over, and a
/// delivery that queues behind those 2 s after them gets 503 after its 10 s. Once the stalled
/// clients are answered, deliveries are handled again.
#[tokio::test]
async fn a_delivery_that_finds_64_in_flight_for_ten_seconds_gets_503_busy() {
    use previewd::webhook::server::{MAX_DELIVERIES_IN_FLIGHT, SLOW_CLIENT_TIMEOUT};
    use tokio::io::AsyncReadExt;
    in_namespace("security-busy", |client, ns| async move {
        install_template(&client, &ns, "github", REPOSITORY, None).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let address = harness.base.trim_start_matches("http://").to_string();
        let mut stalled = Vec::new();
        let client = |n: usize| format!("203.0.113.{}", n % 4 + 1);
        for n in 0..MAX_DELIVERIES_IN_FLIGHT {
            stalled.push(stalled_client(&address, &client(n)).await);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let client = |n: usize| format!("203.0.113.{}", n % 4 + 5);
        for n in 0..MAX_DELIVERIES_IN_FLIGHT {
            stalled.push(stalled_client(&address, &client(n)).await);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;

        let queued_at = std::time::Instant::now();
        let opened = github_fixture("pull_request.opened.json");
        let (status, answer) = harness.signed("pull_request", "busy", &opened).await;
        let waited = queued_at.elapsed();
        assert_eq!(status, 503, "{answer}");
        assert_eq!(answer["outcome"], "busy", "{answer}");
        assert!(
            waited >= SLOW_CLIENT_TIMEOUT - Duration::from_secs(1),
            "it waited its turn first: {waited:?}"
        );
        assert!(
            harness.environment_names().await.is_empty(),
            "nothing was written"
        );

        // Every stalled client is answered 408 in its turn, and then the same delivery is
        // handled (503 kept no delivery id: it is not a duplicate).
        for mut client in stalled {
            let mut reply = vec![0u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(60), client.read(&mut reply))
                .await
                .expect("each stalled client is answered")
                .unwrap();
            let reply = String::from_utf8_lossy(&reply[..read]);
            assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        }
        let (status, answer) = harness.signed("pull_request", "busy", &opened).await;
        assert_eq!(status, 202, "{answer}");
    })
    .await;
}

/// One client, however many deliveries it opens, holds its share of the 64 turns (16), not
/// all of them: 64 stalled deliveries from one address leave the forge's delivery from
/// another handled at once. The 16 stalled in a turn get their 408; the 48 beyond the share
/// wait their 10 s for one of their own and get 503 `busy`, having held none of everyone's.
/// Before, the 64 held every turn and the forge's delivery got 503 after 10 s.
#[tokio::test]
async fn one_client_holds_its_share_of_the_turns_and_the_forges_deliveries_the_rest() {
    use previewd::webhook::server::{DEFAULT_DELIVERIES_PER_CLIENT, MAX_DELIVERIES_IN_FLIGHT};
    use tokio::io::AsyncReadExt;
    in_namespace("security-client-share", |client, ns| async move {
        install_template(&client, &ns, "github", REPOSITORY, None).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let address = harness.base.trim_start_matches("http://").to_string();
        let mut stalled = Vec::new();
        for _ in 0..MAX_DELIVERIES_IN_FLIGHT {
            stalled.push(stalled_client(&address, "203.0.113.9").await);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;

        // GitHub's hook address, as the ingress in front of previewd says.
        let mut forwarded = reqwest::header::HeaderMap::new();
        forwarded.insert("x-forwarded-for", "140.82.115.1".parse().unwrap());
        let forge = reqwest::Client::builder()
            .default_headers(forwarded)
            .build()
            .unwrap();
        let opened = github_fixture("pull_request.opened.json");
        let sent_at = std::time::Instant::now();
        let (status, answer) = support::webhooks::post_github(
            &forge,
            &harness.base,
            "pull_request",
            "from-the-forge",
            &opened,
            Some(github::sign(SECRET.as_bytes(), &opened)),
        )
        .await;
        assert_eq!(status, 202, "handled beside the stalled client: {answer}");
        assert!(
            sent_at.elapsed() < Duration::from_secs(5),
            "without waiting for a turn: {:?}",
            sent_at.elapsed()
        );

        let mut statuses = std::collections::BTreeMap::<String, usize>::new();
        for mut connection in stalled {
            let mut reply = vec![0u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(60), connection.read(&mut reply))
                .await
                .expect("each stalled delivery is answered")
                .unwrap();
            let status = String::from_utf8_lossy(&reply[..read.min(12)]).to_string();
            *statuses.entry(status).or_default() += 1;
        }
        // The first 16 hold the share for their 10 s; a waiter whose 10 s are not yet up when
        // they end (opened a few milliseconds after them) takes its place: at most a second
        // round of 16, since every waiter's time is up by then.
        let share = DEFAULT_DELIVERIES_PER_CLIENT;
        let timed_out = statuses.remove("HTTP/1.1 408").unwrap_or_default();
        let busy = statuses.remove("HTTP/1.1 503").unwrap_or_default();
        assert!(statuses.is_empty(), "only 408 and 503: {statuses:?}");
        assert_eq!(timed_out + busy, MAX_DELIVERIES_IN_FLIGHT);
        assert!(
            (share..=2 * share).contains(&timed_out),
            "{timed_out} stalled deliveries held a turn, {busy} waited for their share"
        );
    })
    .await;
}

/// A reconcile that panics must not leave a replica holding the Lease with nobody reconciling:
/// the elector sees its work end, releases the Lease for a standby and returns the reason (the
/// service then turns `/readyz` red, drains and exits 1). Before, the work task died quietly
/// and the replica went on renewing the Lease.
#[tokio::test]
async fn a_panicking_controller_gives_up_the_lease_and_stops() {
    use k8s_openapi::api::coordination::v1::Lease;
    use previewd::runtime::leader::{LeaderElector, LeaseSettings};
    in_namespace("security-panic", |client, ns| async move {
        let settings = LeaseSettings::with_duration(
            ns.clone(),
            "previewd".into(),
            "replica-1".into(),
            Duration::from_secs(4),
        );
        let metrics = std::sync::Arc::new(previewd::runtime::metrics::Metrics::new());
        let (_shutdown, shutdown) = tokio::sync::watch::channel(false);
        let elector = LeaderElector::new(client.clone(), settings);
        let work = || async { panic!("a reconcile met input it did not expect") };
        let outcome = tokio::time::timeout(
            Duration::from_secs(60),
            elector.run(metrics.clone(), shutdown, work),
        )
        .await
        .expect("the elector returns instead of leading on");
        let stopped = outcome.expect_err("the work's end is an error");
        assert!(
            stopped
                .to_string()
                .contains("a reconcile met input it did not expect"),
            "{stopped}"
        );
        assert_eq!(metrics.leader.get(), 0, "no longer counted as leader");
        let lease = Api::<Lease>::namespaced(client.clone(), &ns)
            .get("previewd")
            .await
            .unwrap();
        let holder = lease.spec.and_then(|s| s.holder_identity);
        assert_eq!(holder, None, "the Lease is released for a standby");
    })
    .await;
}

/// The same failure seen from the replica: a controller that panics turns `/readyz` red, the
/// webhook server drains and stops listening, the wake gate stops, and the service returns the
/// error the process exits 1 with (so the kubelet restarts it), instead of serving on with
/// nobody reconciling. (Before, a replica running the gate waited for a SIGTERM.)
#[tokio::test]
async fn a_replica_whose_controller_panics_turns_unready_drains_and_fails() {
    use previewd::cluster::caches::Caches;
    use previewd::cluster::secrets::SecretReader;
    use previewd::forge::access::WriteAccess;
    use previewd::forge::template_client::TemplateClients;
    use previewd::runtime::error::Error;
    use previewd::runtime::metrics::Metrics;
    use previewd::runtime::service::{Leading, serve_and_lead};
    use previewd::webhook::server::{ServerState, router};
    use std::sync::Arc;
    use tower::ServiceExt;
    in_namespace("security-panic-replica", |client, ns| async move {
        let metrics = Arc::new(Metrics::new());
        let (caches, _watches) = Caches::start(client.clone(), Some(&ns));
        let secrets = Arc::new(SecretReader::new(client.clone()));
        let clients = TemplateClients::new(metrics.forge.clone(), secrets);
        let access = Arc::new(WriteAccess::new(Arc::new(clients)));
        let limits = previewd::webhook::server::DeliveryLimits::with_max_body(1 << 20);
        let state = ServerState::new(client.clone(), caches, access, metrics.server(), limits);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (_shutdown, shutdown) = tokio::sync::watch::channel(false);
        let bug = Arc::new(tokio::sync::Notify::new());
        let work = {
            let bug = bug.clone();
            move || {
                let bug = bug.clone();
                async move {
                    bug.notified().await;
                    panic!("a reconcile met input it did not expect");
                }
            }
        };
        // The wake gate runs until a shutdown that never comes here: the service must not wait for it.
        let gate = Some(tokio::spawn(std::future::pending::<()>()));
        let leading = Leading {
            work,
            lease: None,
            metrics: metrics.clone(),
            shutdown_grace: Duration::from_secs(5),
            gate,
        };
        let service = tokio::spawn(serve_and_lead(state.clone(), listener, shutdown, leading));
        let http = reqwest::Client::new();
        wait_until_ready(&http, &base).await;
        assert_eq!(metrics.leader.get(), 1);

        bug.notify_one();
        let ended = tokio::time::timeout(Duration::from_secs(10), service)
            .await
            .expect("the service returns at once (the server drains within its grace)")
            .unwrap();
        let Err(error @ Error::ControllerStopped(_)) = ended else {
            panic!("the service must fail with the controller's end: {ended:?}");
        };
        let said = error.to_string();
        assert!(
            said.contains("it panicked: a reconcile met input it did not expect")
                && said.contains("exiting"),
            "{said}"
        );
        assert_eq!(metrics.leader.get(), 0, "no longer counted as leader");
        // Red from the moment the work stopped (what a probe on a surviving connection sees);
        // and no longer listening, so a new probe fails too.
        let request = axum::http::Request::get("/readyz")
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = router(state).oneshot(request).await.unwrap();
        assert_eq!(answer.status(), 503);
        let body = axum::body::to_bytes(answer.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&body[..], b"the controller stopped");
        let probe = http.get(format!("{base}/readyz")).send().await;
        assert!(probe.is_err(), "the server stopped listening");
    })
    .await;
}

/// A template whose loops would run for minutes (10^10 iterations) is stopped by the render's
/// fuel: the environment says `RenderFailed` with the reason, and nothing is applied. Before,
/// the reconcile worker spun on it.
#[tokio::test]
async fn a_template_that_would_render_forever_is_stopped_and_named() {
    const FOREVER: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  x: \"{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}\"\n";
    in_namespace("security-render-fuel", |client, ns| async move {
        install_template_with(&client, &ns, "github", REPOSITORY, None, json!({}), FOREVER).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let opened = github_fixture("pull_request.opened.json");
        let (status, answer) = harness.signed("pull_request", "opened", &opened).await;
        assert_eq!(status, 202, "{answer}");
        let name = environment_of_pr(&harness.environments, 2).await;
        let message = condition_with_reason(&harness, &name, "RenderFailed")
            .await
            .message;
        assert!(
            message.contains("app.yaml") && message.contains("fuel"),
            "{message}"
        );
        let target = naming::namespace_name("preview", &ns, &name);
        let namespace = Api::<Namespace>::all(client.clone())
            .get_opt(&target)
            .await
            .unwrap();
        assert!(namespace.is_none(), "nothing applied");
    })
    .await;
}

/// `listing` (entries `name`, `size`) as folder `deploy/preview` of the commit `sha`'s tree, and
/// `files` by their blob ids.
async fn mount_repository_folder(
    forge: &wiremock::MockServer,
    sha: &str,
    listing: serde_json::Value,
    files: &[(&str, &str)],
) {
    use support::contents::blob_id;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let id_of = |name: &str| blob_id(format!("{sha}/{name}").as_bytes());
    let mut tree = vec![
        json!({"path": "deploy", "mode": "040000", "type": "tree", "sha": blob_id(b"deploy")}),
        json!({"path": "deploy/preview", "mode": "040000", "type": "tree", "sha": blob_id(b"preview")}),
    ];
    for entry in listing.as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        tree.push(
            json!({"path": format!("deploy/preview/{name}"), "mode": "100644", "type": "blob",
            "sha": id_of(name), "size": entry["size"]}),
        );
    }
    Mock::given(method("GET"))
        .and(path(format!("/repos/{REPOSITORY}/git/trees/{sha}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"sha": blob_id(sha.as_bytes()), "tree": tree, "truncated": false}),
        ))
        .mount(forge)
        .await;
    for (name, text) in files {
        use base64::Engine;
        let body = json!({"sha": id_of(name), "size": text.len(), "encoding": "base64",
            "content": base64::engine::general_purpose::STANDARD.encode(text)});
        Mock::given(method("GET"))
            .and(path(format!(
                "/repos/{REPOSITORY}/git/blobs/{}",
                id_of(name)
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .mount(forge)
            .await;
    }
}

/// Requests previewd made for commit `sha`: its tree listing, and any blob of its folder.
async fn requests_at(forge: &wiremock::MockServer, sha: &str) -> usize {
    let tree = format!("/git/trees/{sha}");
    let blobs: Vec<String> = (0..5_000)
        .flat_map(|i| [format!("m{i}.yaml"), format!("h{i}.yaml")])
        .chain(["app.yaml".to_string()])
        .map(|name| support::contents::blob_id(format!("{sha}/{name}").as_bytes()))
        .collect();
    forge
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            let path = r.url.path();
            path.ends_with(&tree) || blobs.iter().any(|id| path.ends_with(id.as_str()))
        })
        .count()
}

/// A pull request that puts thousands of manifests, one huge one, or several large ones adding
/// up to more than 4 MiB into `repositoryPath` is refused from the commit's tree listing (`ManifestsTooLarge`), before any file is downloaded,
/// and the previous commit keeps running. Before, previewd read every file, whatever the
/// count and size.
#[tokio::test]
async fn a_repository_folder_beyond_the_limits_is_refused_before_it_is_read() {
    const OPENED: &str = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    const MANY: &str = "1111111111111111111111111111111111111111";
    const HUGE: &str = "2222222222222222222222222222222222222222";
    const HEAVY: &str = "3333333333333333333333333333333333333333";
    in_namespace("security-repo-limits", |client, ns| async move {
        let forge = github_forge().await;
        let file = |name: &str, size: u64| {
            json!({"type": "file", "name": name, "path": format!("deploy/preview/{name}"), "size": size})
        };
        mount_repository_folder(&forge, OPENED, json!([file("app.yaml", 90)]), &[("app.yaml", CONFIG_MAP_APP)]).await;
        let many: Vec<_> = (0..5_000).map(|i| file(&format!("m{i}.yaml"), 90)).collect();
        mount_repository_folder(&forge, MANY, json!(many), &[("m0.yaml", CONFIG_MAP_APP)]).await;
        mount_repository_folder(&forge, HUGE, json!([file("app.yaml", 50 << 20)]), &[("app.yaml", CONFIG_MAP_APP)]).await;
        // Five files under 1 MiB each, 4.5 MB in all: over the total, and known from the listing.
        let heavy: Vec<_> = (0..5).map(|i| file(&format!("h{i}.yaml"), 900 << 10)).collect();
        mount_repository_folder(&forge, HEAVY, json!(heavy), &[("h0.yaml", CONFIG_MAP_APP)]).await;
        let from_repository = json!({"manifests": {"repositoryPath": "deploy/preview"}});
        install_template_with(&client, &ns, "github", REPOSITORY, Some(&forge.uri()), from_repository, CONFIG_MAP_APP).await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;

        harness.signed("pull_request", "opened", &github_fixture("pull_request.opened.json")).await;
        let name = environment_of_pr(&harness.environments, 2).await;
        let ready = wait_ready_with_sha(&harness.environments, &name, OPENED).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let app = || async {
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
            config_maps.get("app").await.unwrap().data.unwrap()["sha"].clone()
        };
        assert_eq!(app().await, OPENED);

        for (sha, limit) in [
            (MANY, "5000 manifest files, more than the limit of 200"),
            (HUGE, "52428800 bytes, more than the limit of 1048576"),
            (HEAVY, "4608000 bytes of manifests, more than the limit of 4194304"),
        ] {
            let mut push = json_fixture("github/pull_request.synchronize.json");
            push["pull_request"]["head"]["sha"] = json!(sha);
            let (status, answer) = harness.signed("pull_request", sha, push.to_string().as_bytes()).await;
            assert_eq!(status, 202, "{answer}");
            let condition = eventually("the refusal of this commit", Duration::from_secs(60), || {
                let environments = harness.environments.clone();
                let name = name.clone();
                async move {
                    let status = environments.get(&name).await.ok()?.status?;
                    let condition = status.conditions.first()?.clone();
                    (condition.reason == "ManifestsTooLarge" && condition.message.contains(sha)).then_some(condition)
                }
            })
            .await;
            assert!(condition.message.contains(limit), "{}", condition.message);
            assert_eq!(requests_at(&forge, sha).await, 1, "only the listing was read at {sha}");
            assert_eq!(app().await, OPENED, "the previous commit keeps running");
        }
    })
    .await;
}

/// The blob id of file `i` of commit `sha` in [`mount_gitlab_folder`].
fn gitlab_blob(sha: &str, i: usize) -> String {
    support::contents::blob_id(format!("{sha}/m{i}.yaml").as_bytes())
}

/// GitLab's folder `deploy/preview` at commit `sha`: `count` YAML files, each holding `text`,
/// served by blob id unless `served` is false.
async fn mount_gitlab_folder(
    forge: &wiremock::MockServer,
    sha: &str,
    count: usize,
    text: String,
    served: bool,
) {
    use wiremock::matchers::{method, path_regex, query_param};
    use wiremock::{Mock, ResponseTemplate};
    let tree: Vec<_> = (0..count)
        .map(|i| {
            json!({"id": gitlab_blob(sha, i), "name": format!("m{i}.yaml"), "type": "blob",
                   "path": format!("deploy/preview/m{i}.yaml"), "mode": "100644"})
        })
        .collect();
    Mock::given(method("GET"))
        .and(path_regex(r"^/api/v4/projects/[^/]+/repository/tree$"))
        .and(query_param("ref", sha))
        .respond_with(ResponseTemplate::new(200).set_body_json(tree))
        .mount(forge)
        .await;
    for i in (0..count).filter(|_| served) {
        let blob = format!(
            r"^/api/v4/projects/[^/]+/repository/blobs/{}/raw$",
            gitlab_blob(sha, i)
        );
        Mock::given(method("GET"))
            .and(path_regex(blob))
            .respond_with(ResponseTemplate::new(200).set_body_string(text.clone()))
            .mount(forge)
            .await;
    }
}

/// GitLab's (tree listings, blob reads) for commit `sha` of [`mount_gitlab_folder`].
async fn gitlab_reads_at(forge: &wiremock::MockServer, sha: &str, count: usize) -> (usize, usize) {
    let at = format!("ref={sha}");
    let requests = forge.received_requests().await.unwrap_or_default();
    let listings = requests
        .iter()
        .filter(|r| r.url.path().ends_with("/tree"))
        .filter(|r| r.url.query().is_some_and(|q| q.contains(&at)))
        .count();
    let blobs: Vec<String> = (0..count).map(|i| gitlab_blob(sha, i)).collect();
    let reads = requests
        .iter()
        .filter(|r| blobs.iter().any(|id| r.url.path().contains(id.as_str())))
        .count();
    (listings, reads)
}

/// [`a_repository_folder_beyond_the_limits_is_refused_before_it_is_read`] on GitLab, whose tree
/// lists no sizes (docs/writing-templates.md): more files than the limit are refused from the
/// listing, none read; a file over 1 MiB is refused as soon as 1 MiB of it is read; files adding up to more than
/// 4 MiB stop the reading at the first file past the total (five of ten read; before, all ten
/// were downloaded and held first). The previous commit keeps running.
#[tokio::test]
async fn gitlab_a_repository_folder_beyond_the_limits_is_refused_reading_no_more_than_it_must() {
    const OPENED: &str = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
    const MANY: &str = "1111111111111111111111111111111111111111";
    const HUGE: &str = "2222222222222222222222222222222222222222";
    const HEAVY: &str = "3333333333333333333333333333333333333333";
    in_namespace("security-gitlab-repo-limits", |client, ns| async move {
        let forge = gitlab_forge().await;
        mount_gitlab_folder(&forge, OPENED, 1, CONFIG_MAP_APP.into(), true).await;
        mount_gitlab_folder(&forge, MANY, 300, CONFIG_MAP_APP.into(), false).await;
        mount_gitlab_folder(&forge, HUGE, 1, "#".repeat(2 << 20), true).await;
        mount_gitlab_folder(&forge, HEAVY, 10, "#".repeat(900 << 10), true).await;
        let from_repository = json!({"manifests": {"repositoryPath": "deploy/preview"}});
        let project = "gitlabhq/gitlab-test";
        let api = forge.uri();
        install_template_with(
            &client,
            &ns,
            "gitlab",
            project,
            Some(&api),
            from_repository,
            CONFIG_MAP_APP,
        )
        .await;
        let harness = Harness::start(&client, &ns, 2 << 20).await;
        let mut delivery = json_fixture("gitlab/merge_request.json");
        let opened = harness
            .gitlab(
                "Merge Request Hook",
                "limits-open",
                delivery.to_string().as_bytes(),
                SECRET,
            )
            .await;
        let (name, ready) = harness.ready_after(opened, OPENED).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let app = || async {
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
            config_maps.get("app").await.unwrap().data.unwrap()["sha"].clone()
        };
        assert_eq!(app().await, OPENED);

        for (sha, files, limit, files_read) in [
            (
                MANY,
                300,
                "300 manifest files, more than the limit of 200",
                0,
            ),
            (
                HUGE,
                1,
                "limit of 1048576 bytes per manifest file; previewd read no more",
                1,
            ),
            (
                HEAVY,
                10,
                "4608000 bytes of manifests, more than the limit of 4194304",
                5,
            ),
        ] {
            delivery["object_attributes"]["action"] = "update".into();
            delivery["object_attributes"]["last_commit"]["id"] = sha.into();
            let (status, answer) = harness
                .gitlab(
                    "Merge Request Hook",
                    sha,
                    delivery.to_string().as_bytes(),
                    SECRET,
                )
                .await;
            assert_eq!(status, 202, "{answer}");
            let condition = eventually(
                "the refusal of this commit",
                Duration::from_secs(60),
                || {
                    let environments = harness.environments.clone();
                    let name = name.clone();
                    async move {
                        let status = environments.get(&name).await.ok()?.status?;
                        let condition = status.conditions.first()?.clone();
                        (condition.reason == "ManifestsTooLarge" && condition.message.contains(sha))
                            .then_some(condition)
                    }
                },
            )
            .await;
            assert!(condition.message.contains(limit), "{}", condition.message);
            assert_eq!(
                gitlab_reads_at(&forge, sha, files).await,
                (1, files_read),
                "at {sha}"
            );
            assert_eq!(app().await, OPENED, "the previous commit keeps running");
        }
    })
    .await;
}

/// A forge API that redirects (a moved instance, or a hostile `apiUrl`) never gets the token
/// sent on to where it points: neither client follows the redirect. Before, GitLab's (the
/// gitlab crate's own HTTP client) followed it with the `PRIVATE-TOKEN` header.
#[tokio::test]
async fn the_forge_token_is_never_sent_on_a_redirect() {
    use previewd::forge::client::ForgeClients;
    use previewd::model::crd::ForgeKind;
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::any};

    let elsewhere = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&elsewhere)
        .await;
    let redirecting = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(302)
                .insert_header("location", format!("{}/stolen", elsewhere.uri()).as_str()),
        )
        .mount(&redirecting)
        .await;
    let clients = ForgeClients::new(Default::default());
    for (kind, repository) in [
        (ForgeKind::Github, REPOSITORY),
        (ForgeKind::Gitlab, "gitlabhq/gitlab-test"),
    ] {
        let client = clients
            .get(kind, Some(&redirecting.uri()), b"the-secret-token", "token")
            .await
            .unwrap();
        let listed = client.open_pull_requests(repository).await;
        assert!(
            listed.is_err(),
            "{kind:?}: a redirect is not an answer: {listed:?}"
        );
    }
    assert!(!redirecting.received_requests().await.unwrap().is_empty());
    let followed = elsewhere.received_requests().await.unwrap();
    assert!(
        followed.is_empty(),
        "the redirect was followed: {:?}",
        followed
            .iter()
            .map(|r| (&r.url, &r.headers))
            .collect::<Vec<_>>()
    );
}

/// forges.md: a Secret made from a file ends in a newline, which is never part of a token or a
/// webhook secret.
#[tokio::test]
async fn a_secrets_trailing_newline_is_not_part_of_its_value() {
    in_namespace("security-secret-newline", |client, ns| async move {
        use k8s_openapi::api::core::v1::Secret;
        use previewd::cluster::secrets::SecretReader;
        use previewd::model::crd::SecretKeyRef;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "from-a-file"}, "stringData": {"token": "ghp_abc\n"}
        }))
        .unwrap();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let reference = SecretKeyRef {
            name: "from-a-file".into(),
            key: "token".into(),
        };
        let reader = SecretReader::new(client.clone());
        assert_eq!(
            reader.get(&ns, &reference).await.unwrap(),
            b"ghp_abc".to_vec()
        );
    })
    .await;
}

/// Server-side applies in flight at once, and the most there ever were.
#[derive(Default)]
struct InFlight {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[tokio::test]
async fn one_environments_wave_holds_at_most_apply_concurrency_of_the_clients_places() {
    // docs/security.md: "within a wave an environment has at most `--apply-concurrency`, 16,
    // of the 32 places". A wave of 12 objects applied with an apply concurrency of 3 on a
    // client that would let all 12 go at once: every apply is held 100 ms, so all 12 would be
    // in flight together without the bound, and exactly 3 are with it.
    in_namespace("apply-concurrency", |_client, ns| async move {
        use previewd::cluster::observed::ObservedStore;
        use previewd::cluster::{applier::Applier, metrics::ClusterMetrics};
        let config = support::shared_config().await;
        // Every server-side apply (a PATCH) is held for 100 ms before it is sent, counted while
        // held: with nothing else bounding them, every apply of the wave is held at once.
        let in_flight = std::sync::Arc::new(InFlight::default());
        let held = in_flight.clone();
        let hold_applies = support::layers::Around::new(move |method, _| {
            use std::sync::atomic::Ordering;
            if method != http::Method::PATCH {
                return Default::default();
            }
            let (entering, leaving) = (held.clone(), held.clone());
            support::layers::Hooks {
                before: Some(Box::pin(async move {
                    let now = entering.now.fetch_add(1, Ordering::SeqCst) + 1;
                    entering.most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                })),
                after: Some(Box::pin(async move {
                    leaving.now.fetch_sub(1, Ordering::SeqCst);
                })),
            }
        });
        let client = kube::client::ClientBuilder::try_from(config)
            .unwrap()
            .with_layer(&hold_applies)
            .build();
        let (trigger, _reconciles) = tokio::sync::mpsc::unbounded_channel();
        let store = ObservedStore::new(client.clone(), trigger);
        let applier = Applier::new(client, store, ClusterMetrics::new(), 3);
        let wave: Vec<serde_json::Value> = (0..12)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": format!("wave-{i}"), "namespace": ns},
                       "data": {"index": i.to_string()}})
            })
            .collect();
        let objects: Vec<&serde_json::Value> = wave.iter().collect();

        let stats = applier.apply(&objects, false).await.unwrap();

        assert_eq!(stats.sent, 12);
        let most = in_flight.most.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(most, 3, "applies in flight at once");
    })
    .await;
}
