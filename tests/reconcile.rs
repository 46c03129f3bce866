//! The reconcile engine against a real kube-apiserver: the web-postgres example reaches Ready
//! in order, re-reconciles send nothing, a new head SHA re-applies only what changed, drift
//! is reverted, broken or unsafe templates apply nothing and say why, and deletion removes the
//! namespace.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use previewd::controller::{self, Context, ControllerConfig};
use previewd::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::metrics::Metrics;
use serde_json::json;
use support::{eventually, in_namespace};

/// Starts a controller watching only `namespace`, on the calling test's runtime.
async fn start_controller(client: &Client, namespace: &str, resync: Duration) -> Arc<Context> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let config = ControllerConfig {
        namespace: Some(namespace.to_string()),
        apply_concurrency: 16,
        resync_interval: resync,
    };
    tokio::spawn(controller::run(
        client.clone(),
        config,
        Arc::new(Metrics::new()),
        Some(tx),
    ));
    rx.await.expect("controller context")
}

fn example(name: &str) -> (PreviewTemplate, PreviewEnvironment) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("templates")
        .join(name);
    let template =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("template.yaml")).unwrap())
            .unwrap();
    let environment =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("environment.yaml")).unwrap())
            .unwrap();
    (template, environment)
}

async fn wait_for_phase(
    api: &Api<PreviewEnvironment>,
    name: &str,
    phase: Phase,
    timeout: Duration,
) -> PreviewEnvironment {
    eventually(&format!("{name} to be {phase:?}"), timeout, || {
        let api = api.clone();
        async move {
            api.get(name)
                .await
                .ok()
                .filter(|e| e.status.as_ref().is_some_and(|s| s.phase == phase))
        }
    })
    .await
}

fn applies_sent(context: &Context) -> u64 {
    context.metrics.applies.with_label_values(&["sent"]).get()
}

fn reconciles(context: &Context) -> u64 {
    ["ok", "error"]
        .iter()
        .map(|o| {
            context
                .metrics
                .reconcile_duration
                .with_label_values(&[o])
                .get_sample_count()
        })
        .sum()
}

#[tokio::test]
async fn web_postgres_reaches_ready_seeded_in_order_then_writes_nothing_until_something_changes() {
    in_namespace("web-postgres", |client, ns| async move {
        let context = start_controller(&client, &ns, Duration::from_secs(600)).await;
        let (template, environment) = example("web-postgres");
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns).create(&PostParams::default(), &template).await.unwrap();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        environments.create(&PostParams::default(), &environment).await.unwrap();

        let ready = wait_for_phase(&environments, "web-postgres-pr-2", Phase::Ready, Duration::from_secs(90)).await;
        let status = ready.status.clone().unwrap();
        let target = status.namespace.clone().unwrap();
        assert!(previewd::naming::is_dns1123_label(&target));
        assert_eq!(status.url.as_deref(), Some("https://changes.preview.example.com"));
        assert_eq!(status.deployed_sha.as_deref(), Some("ec26c3e57ca3a959ca5aad62de7213c562f8c821"));
        assert_eq!(status.seeds.len(), 1);
        assert_eq!(status.seeds[0].state, "Succeeded");
        assert!(status.timings.as_ref().unwrap().seconds_to_ready.is_some());
        eprintln!("web-postgres: Ready {:.1} s after the request", status.timings.as_ref().unwrap().seconds_to_ready.unwrap());

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

        // An unchanged environment: reconciles happen, writes do not.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (writes_before, reconciles_before) = (context.metrics.total_writes(), reconciles(&context));
        for i in 0..3 {
            let poke = json!({"metadata": {"annotations": {"test.previewd.dev/poke": i.to_string()}}});
            environments.patch("web-postgres-pr-2", &PatchParams::default(), &Patch::Merge(poke)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        assert!(reconciles(&context) >= reconciles_before + 3, "each poke was reconciled");
        assert_eq!(context.metrics.total_writes(), writes_before, "an unchanged environment sends no write request");

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
            let degraded = wait_for_phase(&environments, "pr-7", Phase::Degraded, Duration::from_secs(30)).await;
            let condition = degraded.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
            assert_eq!(condition.status, "False");
            assert_eq!(condition.reason, reason);
            assert!(condition.message.contains(needle), "condition says {:?}, expected it to mention {needle:?}", condition.message);
            // Nothing was applied: not even the harmless ConfigMap, not even the namespace.
            let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default().labels(&format!("previewd.dev/environment=pr-7,previewd.dev/environment-namespace={ns}"))).await.unwrap();
            assert!(namespaces.items.is_empty(), "no namespace was created for a rejected template");
        }
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
        let _context = start_controller(&client, &ns, Duration::from_secs(600)).await;
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
        // The changed seed ran exactly once: one Job, one pod run, and nothing new after a while.
        tokio::time::sleep(Duration::from_secs(3)).await;
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
