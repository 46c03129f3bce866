//! The reconcile engine against a real kube-apiserver: the web-postgres example reaches Ready
//! in order, re-reconciles send nothing, a new head SHA re-applies only what changed, drift
//! is reverted, broken or unsafe templates apply nothing and say why, and deletion removes the
//! namespace.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::reconcile::ControllerConfig;
use serde_json::json;
use support::apps::{boutique_with_slow_seed, example, managed_counts};
use support::{Running, eventually, in_namespace, wait_for_phase};

/// Starts a controller watching only `namespace`, on the calling test's runtime.
async fn start_controller(client: &Client, namespace: &str, resync: Duration) -> Running {
    start_controller_with(
        client,
        ControllerConfig {
            namespace: Some(namespace.to_string()),
            apply_concurrency: 16,
            resync_interval: resync,
            ..Default::default()
        },
    )
    .await
}

async fn start_controller_with(client: &Client, config: ControllerConfig) -> Running {
    support::start_controller_with(client, config).await
}

fn applies_sent(context: &Running) -> u64 {
    context
        .metrics
        .cluster
        .applies
        .with_label_values(&["sent"])
        .get()
}

/// Every Event about a PreviewEnvironment of `namespace` (name, count, resourceVersion): what
/// previewd records about its environments there.
async fn environment_events(client: &Client, namespace: &str) -> Vec<(String, i32, String)> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), namespace);
    let mut listed: Vec<(String, i32, String)> = events
        .list(&ListParams::default().fields("involvedObject.kind=PreviewEnvironment"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            (
                e.name_any(),
                e.count.unwrap_or(1),
                e.resource_version().unwrap_or_default(),
            )
        })
        .collect();
    listed.sort();
    listed
}

fn failed_reconciles(context: &Running) -> u64 {
    context
        .metrics
        .reconcile
        .reconcile_duration
        .with_label_values(&["error"])
        .get_sample_count()
}

fn reconciles(context: &Running) -> u64 {
    ["ok", "error"]
        .iter()
        .map(|o| {
            context
                .metrics
                .reconcile
                .reconcile_duration
                .with_label_values(&[o])
                .get_sample_count()
        })
        .sum()
}

#[tokio::test]
async fn web_postgres_reaches_ready_seeded_in_order_then_writes_nothing_until_something_changes() {
    support::in_namespace_with_quiet_windows("web-postgres", |client, ns| async move {
        let context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let (template, environment) = example("web-postgres");
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns).create(&PostParams::default(), &template).await.unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&PostParams::default(), &environment).await.unwrap();

        let ready = wait_for_phase(&environments, "web-postgres-pr-2", Phase::Ready, Duration::from_secs(90)).await;
        let status = ready.status.clone().unwrap();
        let target = status.namespace.clone().unwrap();
        assert!(previewd::model::naming::is_dns1123_label(&target));
        assert_eq!(status.url.as_deref(), Some("https://changes.preview.example.com"));
        assert_eq!(status.deployed_sha.as_deref(), Some("ec26c3e57ca3a959ca5aad62de7213c562f8c821"));
        assert_eq!(status.seeds.len(), 1);
        assert_eq!(status.seeds[0].state, "Succeeded");
        assert!(status.timings.as_ref().unwrap().seconds_to_ready.is_some());
        eprintln!("web-postgres: Ready {:.1} s after the request", status.timings.as_ref().unwrap().seconds_to_ready.unwrap());
        // The metrics of that: one seed run timed, no failure, one commit Ready. They are
        // recorded once the reconcile that wrote Ready is done (after its Event), which the
        // test can see before: wait for that reconcile to end, then read them.
        let reconciled = reconciles(&context);
        eventually("the reconcile that wrote Ready to end", Duration::from_secs(30), || {
            let text = context.metrics.render();
            let recorded = text.lines().any(|l| l == "previewd_time_to_ready_seconds_count 1");
            let done = recorded || reconciles(&context) > reconciled;
            async move { done.then_some(()) }
        })
        .await;
        let text = context.metrics.render();
        for series in ["previewd_seed_duration_seconds_count 1", "previewd_seed_failures_total 0", "previewd_time_to_ready_seconds_count 1"] {
            assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
        }
        // Each wave's reconcile re-sends nothing already applied unchanged: the apply cache hits.
        let skipped = support::webhooks::metric_value(&text, r#"previewd_apply_requests_total{outcome="skipped"}"#);
        assert!(skipped.is_some_and(|n| n >= 1.0), "apply cache hits in:\n{text}");
        assert_eq!(support::webhooks::metric_sum(&text, "previewd_reconcile_errors_total"), 0.0, "no reconcile failed:\n{text}");

        // Guard rails in the namespace.
        assert!(Api::<ResourceQuota>::namespaced(client.clone(), &target).get_opt("previewd-quota").await.unwrap().is_some());
        assert!(Api::<LimitRange>::namespaced(client.clone(), &target).get_opt("previewd-limits").await.unwrap().is_some());
        assert!(Api::<NetworkPolicy>::namespaced(client.clone(), &target).get_opt("previewd-default-deny").await.unwrap().is_some());

        // Order: the seed ran after the database was Available and before the web app existed.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &target);
        let postgres = deployments.get("postgres").await.unwrap();
        let web = deployments.get("web").await.unwrap();
        let job = Api::<Job>::namespaced(client.clone(), &target).get(&status.seeds[0].job).await.unwrap();
        let database_available = postgres.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "Available").unwrap();
        let job_created = job.creation_timestamp().unwrap().0;
        let job_completed = job.status.unwrap().completion_time.unwrap().0;
        let web_created = web.creation_timestamp().unwrap().0;
        assert!(database_available.last_transition_time.unwrap().0 <= job_created, "seed started after the database was Available");
        assert!(job_completed <= web_created, "the web app was created after the seed completed");

        // An unchanged environment: reconciles happen, writes do not, counted by the API server
        // itself while no other test of this binary runs. Each poke is waited for until the
        // controller has reconciled it, so a slow controller cannot pass by not having looked.
        let quiet = support::quiet_window().await;
        let objects_before = managed_counts(&client, &target).await;
        let events_before = environment_events(&client, &ns).await;
        let (served_before, reconciles_before) = (support::apiserver::request_counts(&client).await, reconciles(&context));
        for i in 1..=3 {
            let poke = json!({"metadata": {"annotations": {"test.previewd.dev/poke": i.to_string()}}});
            environments.patch("web-postgres-pr-2", &PatchParams::default(), &Patch::Merge(poke)).await.unwrap();
            eventually("the poke to be reconciled", Duration::from_secs(30), || {
                let done = reconciles(&context) >= reconciles_before + i;
                async move { done.then_some(()) }
            })
            .await;
        }
        let served = support::apiserver::request_counts(&client).await.since(&served_before);
        let events_after = environment_events(&client, &ns).await;
        drop(quiet);
        // The counter covers every client, and the controller manager keeps writing in the
        // background (creating what a namespace made by an earlier test gets, emptying one
        // that test left, Events about pods), with POST, PUT and DELETE. previewd's writes
        // have other shapes (`Requests::is_previewd_shaped`: PATCH or APPLY, and writes to
        // PreviewEnvironments): the three pokes and nothing else. previewd's Events, about
        // PreviewEnvironments, are compared before and after; its deletes by the object counts.
        assert_eq!(events_before, events_after, "no Event about a PreviewEnvironment was recorded");
        let pokes = served.count("PATCH", "previewenvironments");
        assert_eq!(pokes, 3, "the API server saw the test's three pokes: {}", served.describe());
        // Pod status PATCHes are the node simulator's (pods of earlier tests' namespaces
        // still moving), Event PATCHes the controller manager's; previewd writes neither
        // (its Events are compared above).
        let previewds = |r: &support::apiserver::Requests| {
            r.is_previewd_shaped() && r.resource != "pods" && r.resource != "events"
        };
        assert_eq!(
            served.writes(previewds),
            3,
            "an unchanged environment sends no write request; the API server served: {}",
            served.describe()
        );
        assert_eq!(managed_counts(&client, &target).await, objects_before, "nothing was deleted");
        eprintln!("web-postgres, three reconciles of an unchanged environment; the API server served: {}", served.describe());

        // A new head SHA re-applies only the object whose render changed (the web Deployment).
        let sent_before = applies_sent(&context);
        let new_sha = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c";
        let push = json!({"spec": {"source": {"headSha": new_sha}}});
        environments.patch("web-postgres-pr-2", &PatchParams::default(), &Patch::Merge(push)).await.unwrap();
        eventually("the new SHA to be deployed", Duration::from_secs(60), || {
            let environments = environments.clone();
            async move {
                let env = environments.get("web-postgres-pr-2").await.ok()?;
                let status = env.status?;
                (status.phase == Phase::Ready && status.deployed_sha.as_deref() == Some(new_sha)).then_some(())
            }
        })
        .await;
        assert_eq!(applies_sent(&context) - sent_before, 1, "only the web Deployment changed");

        // Drift: someone scales the database by hand; previewd puts it back.
        let scale = json!({"spec": {"replicas": 3}});
        deployments.patch("postgres", &PatchParams::apply("someone-else").force(), &Patch::Apply(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "postgres"}, "spec": scale["spec"]
        }))).await.unwrap();
        eventually("the drift to be reverted", Duration::from_secs(30), || {
            let deployments = deployments.clone();
            async move { (deployments.get("postgres").await.ok()?.spec?.replicas == Some(1)).then_some(()) }
        })
        .await;

        // Deleting the environment removes its namespace.
        environments.delete("web-postgres-pr-2", &Default::default()).await.unwrap();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        eventually("the environment and its namespace to be gone", Duration::from_secs(90), || {
            let (namespaces, environments, target) = (namespaces.clone(), environments.clone(), target.clone());
            async move {
                let namespace_gone = namespaces.get_opt(&target).await.ok()?.is_none();
                let environment_gone = environments.get_opt("web-postgres-pr-2").await.ok()?.is_none();
                (namespace_gone && environment_gone).then_some(())
            }
        })
        .await;
    })
    .await;
}

fn template_with(manifest: &str) -> PreviewTemplate {
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "unsafe"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "manifests": {"inline": [
                     {"name": "ok.yaml", "template": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n"},
                     {"name": "bad.yaml", "template": manifest}]}}
    }))
    .unwrap()
}

/// Waits until the environment is Degraded with a Ready condition of `reason`, and returns it.
/// (A template created just before the environment may not have reached previewd's template
/// watch at the first reconcile, which then says TemplateNotFound until the watch catches up.)
async fn wait_for_reason(
    environments: &Api<PreviewEnvironment>,
    name: &str,
    reason: &str,
) -> PreviewEnvironment {
    eventually(
        &format!("{name} Degraded with {reason}"),
        Duration::from_secs(30),
        || async {
            let environment = environments.get(name).await.ok()?;
            let status = environment.status.as_ref()?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (status.phase == Phase::Degraded && ready.reason == reason).then_some(environment)
        },
    )
    .await
}

fn environment_of(template: &str) -> PreviewEnvironment {
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment", "metadata": {"name": "pr-7"},
        "spec": {"template": template, "source": {"repository": "Codertocat/Hello-World", "branch": "evil", "pullRequest": 7, "headSha": "abc1234"}}
    }))
    .unwrap()
}

#[tokio::test]
async fn unsafe_or_broken_templates_apply_nothing_and_say_why() {
    in_namespace("guard", |client, ns| async move {
        let _context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let cases = [
            ("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: take-over\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: []\n",
             "GuardRejected", "ClusterRoleBinding/take-over (from bad.yaml)"),
            ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: steal\n  namespace: kube-system\n", "GuardRejected", "kube-system"),
            ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ branch \n", "RenderFailed", "bad.yaml line 4"),
            // An allowed kind at a version no cluster serves (as a CRD not installed would be).
            ("apiVersion: autoscaling/v9\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: web\nspec: {scaleTargetRef: {kind: Deployment, name: web}, maxReplicas: 2}\n",
             "KindNotServed", "does not serve autoscaling/v9 HorizontalPodAutoscaler, which HorizontalPodAutoscaler web (from bad.yaml) uses"),
            // A custom kind the operator did not allow (the guard decides before any discovery).
            ("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n", "GuardRejected", "kind Widget (example.com/v1) may not be created by a template"),
        ];
        for (manifest, reason, needle) in cases {
            templates.patch("unsafe", &PatchParams::apply("test").force(), &Patch::Apply(template_with(manifest))).await.unwrap();
            let _ = environments.delete("pr-7", &Default::default()).await;
            eventually("the previous environment to go", Duration::from_secs(60), || {
                let environments = environments.clone();
                async move { environments.get_opt("pr-7").await.ok()?.is_none().then_some(()) }
            })
            .await;
            environments.create(&PostParams::default(), &environment_of("unsafe")).await.unwrap();
            let degraded = wait_for_reason(&environments, "pr-7", reason).await;
            let condition = degraded.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
            assert_eq!(condition.status, "False");
            assert!(condition.message.contains(needle), "condition says {:?}, expected it to mention {needle:?}", condition.message);
            // Nothing was applied: not even the harmless ConfigMap, not even the namespace.
            let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default().labels(&format!("previewd.dev/environment=pr-7,previewd.dev/environment-namespace={ns}"))).await.unwrap();
            assert!(namespaces.items.is_empty(), "no namespace was created for a rejected template");
        }
    })
    .await;
}

#[tokio::test]
async fn an_object_the_api_server_refuses_is_named_on_the_environment_until_the_template_is_fixed()
{
    in_namespace("refused", |client, ns| async move {
        let context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        // Renders fine, passes the guard rails, and is invalid: a Deployment without a selector.
        let broken = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: broken\nspec:\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: web, image: web}]\n";
        templates
            .create(&PostParams::default(), &template_with(broken))
            .await
            .unwrap();
        environments
            .create(&PostParams::default(), &environment_of("unsafe"))
            .await
            .unwrap();
        let degraded = wait_for_reason(&environments, "pr-7", "ApplyRefused").await;
        let condition = degraded.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(
            condition.message.contains("Deployment broken") && condition.message.contains("selector"),
            "the condition names the object and the API server's reason: {:?}",
            condition.message
        );
        assert!(
            condition.message.contains("(Invalid, HTTP 422)") && !condition.message.contains("Status {"),
            "the API server's words, not a Rust dump of its Status: {:?}",
            condition.message
        );

        // Retried with backoff (2 s, 4 s, 8 s, …), never in a loop driven by previewd's own
        // status writes: the failed reconciles of the next 15 s are counted and their spacing
        // measured (a slow machine can only make fewer of them).
        let status_writes = |context: &Running| {
            support::webhooks::metric_value(&context.metrics.render(), r#"previewd_write_requests_total{operation="status"}"#).unwrap_or(0.0)
        };
        let status_writes_before = status_writes(&context);
        let watched = std::time::Instant::now();
        let mut failures = Vec::new();
        let mut last = failed_reconciles(&context);
        // Something that cannot make the refused object acceptable changes meanwhile (here a
        // label on the environment; on a loaded machine once a watch event of unknown origin,
        // and a retry came 21 ms after another): no retry before the backoff ends.
        let mut touched = false;
        while watched.elapsed() < Duration::from_secs(15) {
            let now = failed_reconciles(&context);
            if now > last {
                failures.push(watched.elapsed());
                last = now;
                // Right after a retry: a reconcile now would be a second one within ms.
                if !touched {
                    let label = json!({"metadata": {"labels": {"test.previewd.dev/touched": "yes"}}});
                    environments.patch("pr-7", &PatchParams::default(), &Patch::Merge(label)).await.unwrap();
                    touched = true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The mechanism first: a retry of an unchanged refusal writes no status, so no watch
        // event of previewd's own can trigger a reconcile outside the backoff. (Should this
        // fail, rerun with PREVIEWD_TEST_LOG=previewd=debug,kube_runtime=debug: each
        // reconcile's reason is logged.)
        assert_eq!(status_writes(&context), status_writes_before, "a retry wrote the status; failed reconciles at {failures:?}");
        assert!(!failures.is_empty() && failures.len() <= 4, "failed reconciles in 15 s at {failures:?}: expected the retries at about 2, 6 and 14 s");
        assert!(touched, "the environment was touched after a retry");
        for pair in failures.windows(2) {
            assert!(pair[1] - pair[0] >= Duration::from_millis(1_500), "retries {:?} apart: {failures:?}", pair[1] - pair[0]);
        }

        // Fixed: the template watch triggers a reconcile at once, not after the backoff.
        let fixed = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fixed\ndata: {ok: \"yes\"}\n";
        templates
            .patch("unsafe", &PatchParams::apply("test").force(), &Patch::Apply(template_with(fixed)))
            .await
            .unwrap();
        wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(30)).await;
    })
    .await;
}

fn small_template(config_maps: &[&str], seed_sql: &str) -> PreviewTemplate {
    let manifests: Vec<serde_json::Value> = config_maps
        .iter()
        .map(|name| json!({"name": format!("{name}.yaml"), "template": format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  sha: \"{{{{ short_sha }}}}\"\n")}))
        .collect();
    let job = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: seed\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: psql\n        image: postgres:16-alpine\n        args: [\"{seed_sql}\"]\n"
    );
    serde_json::from_value(json!({
        "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "small"},
        "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                 "manifests": {"inline": manifests},
                 "seeds": [{"name": "data", "wave": 1, "job": job}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn template_changes_prune_removed_objects_and_rerun_a_changed_seed_once() {
    in_namespace("prune-seed", |client, ns| async move {
        let context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let apply = |template: PreviewTemplate| {
            let templates = templates.clone();
            async move {
                templates
                    .patch(
                        "small",
                        &PatchParams::apply("test").force(),
                        &Patch::Apply(template),
                    )
                    .await
                    .unwrap()
            }
        };
        apply(small_template(&["alpha", "beta"], "one.sql")).await;
        environments
            .create(&PostParams::default(), &environment_of("small"))
            .await
            .unwrap();
        let ready =
            wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let status = ready.status.unwrap();
        let target = status.namespace.clone().unwrap();
        let first_job = status.seeds[0].job.clone();
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &target);
        assert!(config_maps.get_opt("beta").await.unwrap().is_some());

        // Remove `beta` and change the seed: beta is deleted, the new seed Job runs, the old one goes.
        apply(small_template(&["alpha"], "two.sql")).await;
        let jobs: Api<Job> = Api::namespaced(client.clone(), &target);
        let second_job = eventually(
            "the changed seed to run and beta to be pruned",
            Duration::from_secs(60),
            || {
                let (environments, config_maps, first_job) =
                    (environments.clone(), config_maps.clone(), first_job.clone());
                async move {
                    let status = environments.get("pr-7").await.ok()?.status?;
                    let job = status.seeds.first()?.clone();
                    let done = status.phase == Phase::Ready
                        && job.job != first_job
                        && job.state == "Succeeded";
                    let pruned = config_maps.get_opt("beta").await.ok()?.is_none();
                    (done && pruned).then_some(job.job)
                }
            },
        )
        .await;
        eventually(
            "the old seed Job to be deleted",
            Duration::from_secs(30),
            || {
                let (jobs, first_job) = (jobs.clone(), first_job.clone());
                async move { jobs.get_opt(&first_job).await.ok()?.is_none().then_some(()) }
            },
        )
        .await;
        // The changed seed ran exactly once: one Job, one pod run, and nothing new after two
        // more reconciles of the environment (poked, and waited for), not merely after a while.
        // One poke at a time: two pokes in a row may be handled by one reconcile.
        let reconciled = reconciles(&context);
        for i in 1..=2 {
            let poke =
                json!({"metadata": {"annotations": {"test.previewd.dev/poke": i.to_string()}}});
            environments
                .patch("pr-7", &PatchParams::default(), &Patch::Merge(poke))
                .await
                .unwrap();
            eventually("the poke to be reconciled", Duration::from_secs(30), || {
                let done = reconciles(&context) >= reconciled + i;
                async move { done.then_some(()) }
            })
            .await;
        }
        let seed_jobs: Vec<String> = jobs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|j| j.name_any())
            .collect();
        assert_eq!(seed_jobs, vec![second_job.clone()]);
        let job = jobs.get(&second_job).await.unwrap();
        assert_eq!(job.status.unwrap().succeeded, Some(1));
    })
    .await;
}

/// Objects previewd manages for one environment, by kind.

#[tokio::test]
async fn online_boutique_example_reaches_ready_with_its_35_objects_and_its_ingress() {
    in_namespace("boutique", |client, ns| async move {
        let _context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let (template, environment) = example("online-boutique");
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments
            .create(&PostParams::default(), &environment)
            .await
            .unwrap();
        let ready = wait_for_phase(
            &environments,
            "online-boutique-pr-7",
            Phase::Ready,
            Duration::from_secs(120),
        )
        .await;
        let status = ready.status.unwrap();
        let target = status.namespace.unwrap();
        assert_eq!(
            status.url.as_deref(),
            Some("https://feature-cart-badge--66586fee6e9f39aa.boutique.preview.example.com")
        );
        assert_eq!(managed_counts(&client, &target).await, (12, 12, 11));
        let deployments = Api::<Deployment>::namespaced(client.clone(), &target)
            .list(&ListParams::default())
            .await
            .unwrap();
        for deployment in deployments.items {
            let available = deployment
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            assert!(
                available,
                "Deployment {} is Available",
                deployment.metadata.name.unwrap_or_default()
            );
        }
        eprintln!(
            "online-boutique: Ready {:.1} s after the request",
            status.timings.unwrap().seconds_to_ready.unwrap()
        );
    })
    .await;
}

/// Creates the small environment `pr-7` under a controller with `config` and returns the
/// namespace it deployed to, once Ready.
async fn ready_small_environment(
    client: &Client,
    ns: &str,
    config: ControllerConfig,
) -> (Running, String) {
    let context = start_controller_with(client, config).await;
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), ns);
    templates
        .create(
            &PostParams::default(),
            &small_template(&["alpha", "beta"], "one.sql"),
        )
        .await
        .unwrap();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), ns);
    environments
        .create(&PostParams::default(), &environment_of("small"))
        .await
        .unwrap();
    let status = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60))
        .await
        .status
        .unwrap();
    (context, status.namespace.unwrap())
}

#[tokio::test]
async fn resync_of_an_unchanged_environment_writes_nothing_yet_reverts_a_kubectl_edit() {
    in_namespace("resync", |client, ns| async move {
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            resync_interval: Duration::from_secs(2),
            ..Default::default()
        };
        let (context, target) = ready_small_environment(&client, &ns, config).await;
        // The reconcile that wrote Ready counts its Event once it ends: let it end first.
        let reconciled = reconciles(&context);
        eventually(
            "the reconcile that wrote Ready to end",
            Duration::from_secs(30),
            || {
                let done = reconciles(&context) > reconciled;
                async move { done.then_some(()) }
            },
        )
        .await;

        // Three resyncs of an environment where nothing changed: reconciled (waited for, however
        // long they take), nothing written.
        let (reconciled_before, written_before) =
            (reconciles(&context), context.metrics.total_writes());
        eventually("three resyncs", Duration::from_secs(60), || {
            let done = reconciles(&context) >= reconciled_before + 3;
            async move { done.then_some(()) }
        })
        .await;
        let written = context.metrics.total_writes() - written_before;
        assert_eq!(written, 0, "writes by resyncs of an unchanged environment");

        // A managed field edited with kubectl comes back: the watch shows the drift.
        let kubeconfig = support::shared().kubeconfig_path.clone();
        let output = std::process::Command::new(support::tools::kubectl())
            .env("KUBECONFIG", &kubeconfig)
            .args([
                "patch",
                "configmap",
                "alpha",
                "-n",
                &target,
                "--type",
                "merge",
                "-p",
                r#"{"data":{"sha":"edited-by-hand"}}"#,
            ])
            .output()
            .expect("run kubectl");
        assert!(
            output.status.success(),
            "kubectl patch: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &target);
        eventually(
            "the kubectl edit to be reverted",
            Duration::from_secs(30),
            || {
                let config_maps = config_maps.clone();
                async move {
                    let data = config_maps.get("alpha").await.ok()?.data?;
                    (data.get("sha").map(String::as_str) == Some("abc1234")).then_some(())
                }
            },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn reapply_interval_resends_everything_without_rerunning_the_seed() {
    in_namespace("reapply", |client, ns| async move {
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            resync_interval: Duration::from_secs(3),
            reapply_interval: Some(Duration::from_secs(3)),
            ..Default::default()
        };
        let (context, target) = ready_small_environment(&client, &ns, config).await;

        // Nothing changes, yet every re-apply sends all three objects (two ConfigMaps, the seed
        // Job) again: it does not trust the cache.
        let sent_before = applies_sent(&context);
        eventually(
            "a re-apply of all three objects",
            Duration::from_secs(60),
            || {
                let done = applies_sent(&context) >= sent_before + 3;
                async move { done.then_some(()) }
            },
        )
        .await;
        // The seed ran once in all this: re-applies send its Job, they do not re-run it.
        let jobs = Api::<Job>::namespaced(client.clone(), &target)
            .list(&ListParams::default())
            .await
            .unwrap();
        assert_eq!(jobs.items.len(), 1);
        assert_eq!(jobs.items[0].status.clone().unwrap().succeeded, Some(1));
    })
    .await;
}

/// A Secret a template renders (test data's password): previewd does not watch Secrets, so a
/// hand edit stays until `--reapply-interval` sends the rendered one again; a change of the
/// rendered content is sent at once (docs/security.md).
#[tokio::test]
async fn a_rendered_secret_is_sent_again_on_reapply_and_when_the_template_changes_it() {
    use k8s_openapi::api::core::v1::Secret;
    in_namespace("reapply-secret", |client, ns| async move {
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            reapply_interval: Some(Duration::from_secs(3)),
            ..Default::default()
        };
        let _context = start_controller_with(&client, config).await;
        let secret_with = |password: &str| {
            format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: test-data\nstringData:\n  password: {password}\n")
        };
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        templates.create(&PostParams::default(), &template_with(&secret_with("rendered"))).await.unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&PostParams::default(), &environment_of("unsafe")).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ready.status.unwrap().namespace.unwrap());
        let password_is = |expected: &'static str| {
            let secrets = secrets.clone();
            move || {
                let secrets = secrets.clone();
                async move {
                    let secret = secrets.get("test-data").await.ok()?;
                    let value = secret.data?.get("password")?.0.clone();
                    (value == expected.as_bytes()).then_some(())
                }
            }
        };
        eventually("the rendered password", Duration::from_secs(10), password_is("rendered")).await;

        // A hand edit: undone by the next re-apply, not left for the life of the environment.
        // (The edit is seen by its resourceVersion, not by reading it back: a re-apply every
        // 3 s may undo it before a read.)
        let edit = json!({"data": {"password": "aGFuZA=="}});
        let edited = secrets.patch("test-data", &PatchParams::default(), &Patch::Merge(&edit)).await.unwrap();
        assert_eq!(edited.data.unwrap()["password"].0, b"hand");
        let edited_version = edited.metadata.resource_version.unwrap();
        eventually("the re-apply to restore the rendered password", Duration::from_secs(30), || {
            let (secrets, edited_version) = (secrets.clone(), edited_version.clone());
            async move {
                let secret = secrets.get("test-data").await.ok()?;
                let restored = secret.data?.get("password")?.0 == b"rendered";
                (restored && secret.metadata.resource_version? != edited_version).then_some(())
            }
        })
        .await;

        // The template renders another password: sent.
        let mut changed = templates.get("unsafe").await.unwrap();
        changed.spec = template_with(&secret_with("changed")).spec;
        templates.replace("unsafe", &PostParams::default(), &changed).await.unwrap();
        eventually("the changed password", Duration::from_secs(30), password_is("changed")).await;
    })
    .await;
}

/// `previewd run` as its own process, so that it can be killed like a crashed pod. Killed
/// with SIGKILL when dropped, also when the test fails.
struct ControllerProcess(std::process::Child);

impl ControllerProcess {
    /// The Lease lives in the test's namespace and lasts 4 s (not 15): each start after a
    /// SIGKILL waits for the killed replica's Lease to expire, and this test kills twice.
    fn start(namespace: &str) -> Self {
        Self::start_with(namespace, &[])
    }

    /// [`ControllerProcess::start`] with more arguments.
    fn start_with(namespace: &str, more: &[&str]) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_previewd"))
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--watch-namespace",
                namespace,
                "--lease-namespace",
                namespace,
                "--lease-duration",
                "4s",
                "--kubeconfig",
            ])
            .arg(&support::shared().kubeconfig_path)
            .args(more)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start previewd run");
        Self(child)
    }

    /// SIGKILL: no shutdown code of previewd runs.
    fn kill(mut self) {
        self.0.kill().expect("SIGKILL previewd");
        self.0.wait().expect("reap previewd");
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn controller_killed_mid_apply_converges_after_restart_without_rerunning_the_seed() {
    in_namespace("killed", |client, ns| async move {
        use k8s_openapi::api::core::v1::Pod;
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &boutique_with_slow_seed())
            .await
            .unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let (_, environment) = example("online-boutique");
        let name = environment.metadata.name.clone().unwrap();
        // One API request at a time: wave 0's applies go one after another, so the kill lands
        // inside the wave, not after it.
        let controller = ControllerProcess::start_with(&ns, &["--api-concurrency", "1"]);
        environments
            .create(&PostParams::default(), &environment)
            .await
            .unwrap();

        // Kill 1: the moment the first Deployment of wave 0 exists.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let selector =
            format!("previewd.dev/environment={name},previewd.dev/environment-namespace={ns}");
        let target = eventually("the environment namespace", Duration::from_secs(30), || {
            let (namespaces, selector) = (namespaces.clone(), selector.clone());
            async move {
                namespaces
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?
                    .items
                    .first()
                    .map(|n| n.name_any())
            }
        })
        .await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &target);
        let mut deployments_at_kill = 0;
        for _ in 0..3000 {
            deployments_at_kill = deployments
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            if deployments_at_kill > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        controller.kill();
        let after_kill = deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
        eprintln!("killed during wave 0 with {after_kill} of 12 Deployments applied");
        assert!(deployments_at_kill > 0, "wave 0 started");
        assert!(
            after_kill < 12,
            "the kill came after wave 0's Deployments were all applied"
        );

        // Kill 2: while the seed Job runs.
        let controller = ControllerProcess::start(&ns);
        let jobs: Api<Job> = Api::namespaced(client.clone(), &target);
        let seed_job = eventually("the seed Job to start", Duration::from_secs(90), || {
            let jobs = jobs.clone();
            async move {
                jobs.list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .first()
                    .map(|j| j.name_any())
            }
        })
        .await;
        controller.kill();
        let seed_status = jobs
            .get(&seed_job)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        assert_eq!(
            seed_status.succeeded.unwrap_or(0),
            0,
            "killed while the seed was still running"
        );

        // Third start: converges.
        let controller = ControllerProcess::start(&ns);
        let ready = eventually(
            &format!("{name} to be Ready after two kills"),
            Duration::from_secs(120),
            || {
                let environments = environments.clone();
                let name = name.clone();
                async move {
                    environments
                        .get(&name)
                        .await
                        .ok()
                        .filter(|e| e.status.as_ref().is_some_and(|s| s.phase == Phase::Ready))
                }
            },
        )
        .await;
        controller.kill();
        assert_eq!(ready.status.unwrap().seeds[0].job, seed_job);
        assert_eq!(managed_counts(&client, &target).await, (12, 12, 11));
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &target);
        assert!(
            config_maps.get_opt("after-seed").await.unwrap().is_some(),
            "wave 2 was applied"
        );
        // No duplicate seed run: one Job, one pod, one success.
        let all_jobs: Vec<String> = jobs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|j| j.name_any())
            .collect();
        assert_eq!(all_jobs, vec![seed_job.clone()]);
        let seed_pods = Api::<Pod>::namespaced(client.clone(), &target)
            .list(&ListParams::default().labels(&format!("job-name={seed_job}")))
            .await
            .unwrap();
        assert_eq!(seed_pods.items.len(), 1, "the seed pod ran once");
        assert_eq!(
            jobs.get(&seed_job).await.unwrap().status.unwrap().succeeded,
            Some(1)
        );
    })
    .await;
}

/// The ConfigMap manifest source: a template whose ConfigMap is missing says so and applies
/// nothing; once the ConfigMap exists, the next resync renders every key of it as a manifest.
#[tokio::test]
async fn manifests_from_a_configmap_render_and_a_missing_configmap_is_named() {
    in_namespace("configmap-source", |client, ns| async move {
        let _context = start_controller(&client, &ns, Duration::from_secs(3)).await;
        let template: PreviewTemplate = serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate", "metadata": {"name": "from-configmap"},
            "spec": {"forge": {"kind": "github", "repository": "Codertocat/Hello-World"},
                     "manifests": {"configMap": {"name": "app-manifests"}}}
        }))
        .unwrap();
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns).create(&PostParams::default(), &template).await.unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&PostParams::default(), &environment_of("from-configmap")).await.unwrap();
        let degraded = wait_for_reason(&environments, "pr-7", "ManifestsUnavailable").await;
        let condition = degraded.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(condition.message.contains("app-manifests") && condition.message.contains("does not exist"), "{}", condition.message);

        let manifests: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "app-manifests"},
            "data": {
                "app.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  sha: \"{{ short_sha }}\"\n",
                "more.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: more\ndata:\n  branch: \"{{ branch }}\"\n"
            }
        }))
        .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &manifests).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let applied: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
        assert_eq!(applied.get("app").await.unwrap().data.unwrap()["sha"], "abc1234");
        assert_eq!(applied.get("more").await.unwrap().data.unwrap()["branch"], "evil");
    })
    .await;
}

/// A CustomResourceDefinition of group `example.com` for the custom-kind test: `scope` is
/// `Namespaced` or `Cluster`; spec and status take any fields, status is a subresource.
fn test_crd(plural: &str, kind: &str, scope: &str) -> serde_json::Value {
    crd_in("example.com", plural, kind, scope)
}

/// A CRD of `group` that keeps any spec and status (with a status subresource).
pub(crate) fn crd_in(group: &str, plural: &str, kind: &str, scope: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"),
                     // Groups under k8s.io need it; this stands in for the Gateway API's CRD.
                     "annotations": {"api-approved.kubernetes.io": "unapproved, a test stand-in"}},
        "spec": {"group": group, "scope": scope,
                 "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                   "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

/// Installs `crds` and waits until discovery serves each kind (Established alone is not enough).
pub(crate) async fn install_crds(client: &Client, crds: &[serde_json::Value]) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap();
        api.patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap();
        let served = GroupVersionKind::gvk(
            crd["spec"]["group"].as_str().unwrap(),
            "v1",
            crd["spec"]["names"]["kind"].as_str().unwrap(),
        );
        eventually(
            &format!("{name} to be served"),
            Duration::from_secs(60),
            || {
                let (client, served) = (client.clone(), served.clone());
                async move { kube::discovery::pinned_kind(&client, &served).await.ok() }
            },
        )
        .await;
    }
}

/// The built-in kinds plus `extra` (group example.com, declared inert: the content policy has
/// no rules of its own for them), as `--template-kinds` would give them.
fn template_kinds_with(extra: &[(&str, &str)]) -> previewd::model::kinds::TemplateKinds {
    let extra: Vec<serde_json::Value> = extra
        .iter()
        .map(|(kind, resource)| json!({"group": "example.com", "kind": kind, "resource": resource, "inert": true}))
        .collect();
    support::template_kinds_and(&extra)
}

#[tokio::test]
async fn a_custom_kind_the_operator_allows_is_applied_and_followed_by_its_conditions() {
    in_namespace("custom-kind", |client, ns| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        install_crds(&client, &[test_crd("widgets", "Widget", "Namespaced"), test_crd("clusterwidgets", "ClusterWidget", "Cluster")]).await;
        // An operator who allowed both, one of them cluster-scoped by mistake.
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            template_kinds: template_kinds_with(&[("Widget", "widgets"), ("ClusterWidget", "clusterwidgets")]),
            ..Default::default()
        };
        let _context = start_controller_with(&client, config).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: cert\nspec:\n  branch: \"{{ branch }}\"\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: after-widget\n  annotations: {previewd.dev/wave: \"1\"}\n";
        templates.create(&PostParams::default(), &template_with(widget)).await.unwrap();
        environments.create(&PostParams::default(), &environment_of("unsafe")).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let status = ready.status.unwrap();
        // Nothing in this template routes the environment's host: no URL to a dead end.
        assert_eq!(status.url, None, "no Ingress or HTTPRoute, no URL");
        let target = status.namespace.unwrap();
        let widgets: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &target,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")),
        );
        let applied = widgets.get("cert").await.unwrap();
        assert_eq!(applied.data["spec"]["branch"], "evil", "rendered like any other object");
        assert_eq!(applied.labels().get("previewd.dev/environment").map(String::as_str), Some("pr-7"));
        Api::<ConfigMap>::namespaced(client.clone(), &target).get("after-widget").await.unwrap();

        // Its controller (the test) says it is not ready: the environment waits and says why.
        let set_status = |status: serde_json::Value| {
            let widgets = widgets.clone();
            async move {
                widgets.patch_status("cert", &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await.unwrap();
            }
        };
        set_status(json!({"conditions": [{"type": "Ready", "status": "False", "reason": "Issuing", "message": "waiting for the issuer"}]})).await;
        let waiting = wait_for_phase(&environments, "pr-7", Phase::Deploying, Duration::from_secs(30)).await;
        let condition = waiting.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(condition.message, "waiting for wave 0: Widget cert (Issuing: waiting for the issuer)");
        set_status(json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "Issuing", "message": "waiting for the issuer"},
            {"type": "Stalled", "status": "True", "reason": "InvalidIssuer", "message": "no issuer named letsencrypt"}]})).await;
        let failed = wait_for_phase(&environments, "pr-7", Phase::Degraded, Duration::from_secs(30)).await;
        let condition = failed.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(condition.reason, "ObjectFailed");
        assert!(condition.message.contains("Widget cert failed: InvalidIssuer: no issuer named letsencrypt"), "{}", condition.message);
        set_status(json!({"conditions": [{"type": "Ready", "status": "True"}, {"type": "Stalled", "status": "False"}]})).await;
        wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(30)).await;

        // Allowing a cluster-scoped kind does not let a template create one.
        let cluster_widget = "apiVersion: example.com/v1\nkind: ClusterWidget\nmetadata:\n  name: everywhere\n";
        let mut escaping = template_with(cluster_widget);
        escaping.metadata.name = Some("escaping".into());
        templates.create(&PostParams::default(), &escaping).await.unwrap();
        let mut second = environment_of("escaping");
        second.metadata.name = Some("pr-8".into());
        environments.create(&PostParams::default(), &second).await.unwrap();
        let refused = wait_for_reason(&environments, "pr-8", "GuardRejected").await;
        let condition = refused.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(condition.message.contains("ClusterWidget/everywhere (from bad.yaml)") && condition.message.contains("cluster-scoped"), "{}", condition.message);
        let cluster_widgets: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "ClusterWidget")),
        );
        assert!(cluster_widgets.get_opt("everywhere").await.unwrap().is_none(), "nothing cluster-scoped was created");
        let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default().labels(&format!("previewd.dev/environment=pr-8,previewd.dev/environment-namespace={ns}"))).await.unwrap();
        assert!(namespaces.items.is_empty(), "not even the namespace");
    })
    .await;
}

/// A template in `ns` that copies `copy` (source name, name in the environment) and generates
/// the Secret `db` with a password, next to one ConfigMap.
fn template_with_secrets(name: &str, copy: (&str, &str)) -> PreviewTemplate {
    let mut template = template_with("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n");
    template.metadata.name = Some(name.into());
    template.spec.secrets = serde_json::from_value(json!({
        "copy": [{"name": copy.0, "as": copy.1}],
        "generate": [{"name": "db", "keys": ["password"]}],
    }))
    .unwrap();
    template
}

#[tokio::test]
async fn shared_secrets_are_copied_and_followed_generated_ones_stay_and_unshared_ones_are_refused()
{
    in_namespace("secrets", |client, ns| async move {
        use k8s_openapi::api::core::v1::Secret;
        // A short resync: a changed source is copied at the next reconcile.
        let _context = start_controller(&client, &ns, Duration::from_secs(3)).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let source = |name: &str, value: &str, shared: bool| -> Secret {
            let annotations = if shared { json!({"previewd.dev/copy-to-templates-in": format!("other-team, {ns}")}) } else { json!({}) };
            serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}, "stringData": {"token": value}})).unwrap()
        };
        secrets.create(&PostParams::default(), &source("shared-token", "first", true)).await.unwrap();
        secrets.create(&PostParams::default(), &source("forge-token", "keep-me-here", false)).await.unwrap();
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        templates.create(&PostParams::default(), &template_with_secrets("shares", ("shared-token", "api-token"))).await.unwrap();
        environments.create(&PostParams::default(), &environment_of("shares")).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(60)).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let in_environment: Api<Secret> = Api::namespaced(client.clone(), &target);
        let token = |secret: &Secret, key: &str| String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap();
        let copy = in_environment.get("api-token").await.unwrap();
        assert_eq!(token(&copy, "token"), "first");
        // The only annotation is previewd's own record of what it applied.
        let annotations: Vec<&String> = copy.annotations().keys().collect();
        assert_eq!(annotations, ["previewd.dev/applied"], "the source's annotations stay with the source");
        let password = token(&in_environment.get("db").await.unwrap(), "password");
        assert_eq!(password.len(), 32);

        // The source changes: the copy follows, the generated password does not change.
        secrets.patch("shared-token", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"token": "rotated"}}))).await.unwrap();
        eventually("the copy to follow its source", Duration::from_secs(30), || {
            let in_environment = in_environment.clone();
            async move { (token(&in_environment.get("api-token").await.ok()?, "token") == "rotated").then_some(()) }
        })
        .await;
        assert_eq!(token(&in_environment.get("db").await.unwrap(), "password"), password, "generated once, kept");

        // A Secret its owner did not share (here the template namespace's own forge token), and
        // one that does not exist: refused, nothing created.
        for (template, source, reason, needle) in [
            ("unshared", "forge-token", "SecretNotShared", "is not shared with templates in namespace"),
            ("missing", "no-such-secret", "SecretUnavailable", "does not exist"),
        ] {
            templates.create(&PostParams::default(), &template_with_secrets(template, (source, "copied"))).await.unwrap();
            let mut environment = environment_of(template);
            environment.metadata.name = Some(format!("pr-{template}"));
            environments.create(&PostParams::default(), &environment).await.unwrap();
            let refused = wait_for_reason(&environments, &format!("pr-{template}"), reason).await;
            let condition = refused.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
            assert!(condition.message.contains(needle) && condition.message.contains(source), "{}", condition.message);
            let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default().labels(&format!("previewd.dev/environment=pr-{template},previewd.dev/environment-namespace={ns}"))).await.unwrap();
            assert!(namespaces.items.is_empty(), "nothing was created for {template}");
        }
    })
    .await;
}

#[tokio::test]
async fn the_url_is_reported_once_a_gateway_accepts_the_route_for_its_host() {
    in_namespace("routed-url", |client, ns| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let gateway_api = "gateway.networking.k8s.io";
        install_crds(&client, &[crd_in(gateway_api, "httproutes", "HTTPRoute", "Namespaced")]).await;
        // The operator allows HTTPRoutes (extraTemplateKinds) and templates to name its shared
        // Gateway (the ceiling); the test plays the Gateway.
        let config = ControllerConfig {
            namespace: Some(ns.clone()),
            template_kinds: support::template_kinds_and(&[json!({"group": gateway_api, "kind": "HTTPRoute", "resource": "httproutes"})]),
            operator_policy: previewd::model::grants::OperatorPolicy {
                ceiling: previewd::model::ceiling::TemplateCeiling {
                    gateways: vec!["gateway-system/previews".into()],
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        };
        let _context = start_controller_with(&client, config).await;
        let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let route = |hostnames: &str| format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: web\nspec:\n  parentRefs: [{{name: previews, namespace: gateway-system}}]\n  hostnames: {hostnames}\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
        );
        let mut template = template_with(&route("[\"{{ host }}\"]"));
        template.spec.url.host = Some("{{ slug }}.preview.example.com".into());
        // The shared Gateway of another namespace, named by the template (the content policy).
        template.spec.policy.allowed_gateways = vec!["gateway-system/previews".into()];
        templates.create(&PostParams::default(), &template).await.unwrap();
        environments.create(&PostParams::default(), &environment_of("unsafe")).await.unwrap();

        // No Gateway has accepted the route yet: the environment waits, and has no URL.
        let waiting = eventually("waiting for a Gateway", Duration::from_secs(60), || async {
            let status = environments.get("pr-7").await.ok()?.status?;
            let condition = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            condition.message.contains("waiting for a Gateway to accept it").then_some(status)
        })
        .await;
        assert_eq!(waiting.phase, Phase::Deploying);
        assert_eq!(waiting.url, None, "nothing routes the host yet");

        // The Gateway accepts it: Ready, and the URL is reported.
        let routes: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            waiting.namespace.as_deref().unwrap(),
            &ApiResource::from_gvk(&GroupVersionKind::gvk(gateway_api, "v1", "HTTPRoute")),
        );
        let applied = routes.get("web").await.unwrap();
        assert_eq!(applied.data["spec"]["hostnames"], json!(["evil.preview.example.com"]));
        let accepted = json!({"status": {"parents": [{"parentRef": {"name": "previews"}, "controllerName": "example.com/gateway",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                "observedGeneration": applied.metadata.generation, "lastTransitionTime": "2026-11-24T10:00:00Z"}]}]}});
        routes.patch_status("web", &PatchParams::default(), &Patch::Merge(accepted)).await.unwrap();
        let ready = wait_for_phase(&environments, "pr-7", Phase::Ready, Duration::from_secs(30)).await;
        assert_eq!(ready.status.unwrap().url.as_deref(), Some("https://evil.preview.example.com"));

        // A route for another team's host: refused by the content policy, nothing applied,
        // the routed commit keeps running.
        let mut stealing = template_with(&route("[\"{{ host }}\", \"login.example.org\"]"));
        stealing.spec.url.host = Some("{{ slug }}.preview.example.com".into());
        let patch = json!({"spec": {"manifests": stealing.spec.manifests}});
        templates.patch("unsafe", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let refused = wait_for_phase(&environments, "pr-7", Phase::Degraded, Duration::from_secs(30)).await;
        let condition = refused.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(condition.reason, "PolicyRejected");
        assert!(condition.message.contains("HTTPRoute/web") && condition.message.contains("login.example.org"), "{}", condition.message);
        assert_eq!(routes.get("web").await.unwrap().data["spec"]["hostnames"], json!(["evil.preview.example.com"]));
    })
    .await;
}
