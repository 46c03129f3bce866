//! Faults of the platform under previewd, against the real control plane, with previewd as
//! its own `previewd run` process: the kube-apiserver killed between two waves of a deploy (the
//! seed of wave 1 running, wave 2 not yet sent) and started again; previewd's connections (its
//! watches) cut while what it watched changed beyond the API server's watch cache (the test's
//! own watch from the last resourceVersion shows the 410 Gone a resumed watch gets); previewd
//! itself SIGKILLed at each step of a PR's life. Each ends with every environment correct and
//! nothing lost or duplicated.
//!
//! These tests take turns (a killed apiserver would fail whatever else runs), and this binary
//! has its own control plane, so the other test binaries never see the faults.
//!
//! PR deliveries are `github/pull_request.*.json` changed in copies (PR number, branch, head).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use previewd::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};
use previewd::sandbox::forge_standin::{ForgeStandIn, Received};
use serde_json::json;
use support::apps::{boutique_with_slow_seed, example, managed_counts};
use support::process::PreviewdProcess;
use support::proxy::CuttableProxy;
use support::webhooks::*;
use support::{eventually, in_namespace, wait_for_phase};

const REPOSITORY: &str = "Codertocat/Hello-World";

/// One fault at a time.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn head(number: u64, change: u64) -> String {
    format!("{number:0>20}{change:0>20}")
}

fn previewd(name: &str, kubeconfig: &Path, namespace: &str, logs: &Path) -> PreviewdProcess {
    PreviewdProcess::start(
        name,
        kubeconfig,
        &["--watch-namespace", namespace],
        &[],
        logs,
    )
}

/// A previewd with its Lease in the test's namespace and short (4 s): each successor of a
/// SIGKILLed process waits for the Lease to run out, and what the test checks is that the
/// successor finishes the work, not how long the default 15 s keeps it waiting. (The watch-cut
/// test keeps the default: its cut outlasts 4 s, and a leader cut off that long steps down.)
fn previewd_with_short_lease(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    logs: &Path,
) -> PreviewdProcess {
    let args = [
        "--watch-namespace",
        namespace,
        "--lease-namespace",
        namespace,
        "--lease-duration",
        "4s",
    ];
    PreviewdProcess::start(name, kubeconfig, &args, &[], logs)
}

/// The delivery of PR `number` at `change` (0: opened), changed at a time that orders them.
fn change_of(number: u64, change: u64) -> Vec<u8> {
    let changed = chrono::Utc::now() - chrono::TimeDelta::minutes(10)
        + chrono::TimeDelta::seconds(change as i64 * 10);
    pull_request_change(number, change, &head(number, change), changed)
}

/// Comments the forge stand-in saw created (not edited) on PR `number`.
fn comments_created(forge: &ForgeStandIn, number: u64) -> usize {
    forge
        .received()
        .iter()
        .filter(|r| matches!(r, Received::Comment { number: n, edited: false, .. } if *n == number))
        .count()
}

/// Sends a signed delivery straight to `base`; returns the HTTP status.
async fn deliver(http: &reqwest::Client, base: &str, id: &str, body: &[u8]) -> u16 {
    let signature = Some(previewd::forge::github::sign(SECRET.as_bytes(), body));
    post_github(http, base, "pull_request", id, body, signature)
        .await
        .0
}

/// The namespace previewd deployed environment `name` to.
async fn target_of(environments: &Api<PreviewEnvironment>, name: &str) -> String {
    eventually(
        "the environment's namespace",
        Duration::from_secs(60),
        || async { environments.get_opt(name).await.ok()??.status?.namespace },
    )
    .await
}

async fn wait_for_job(client: &Client, target: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), target);
    eventually("the seed Job to exist", Duration::from_secs(90), || {
        let jobs = jobs.clone();
        async move {
            (!jobs
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty())
            .then_some(())
        }
    })
    .await;
}

/// Exactly one seed Job in `target`, and it succeeded once.
async fn assert_seeded_once(client: &Client, target: &str) {
    let jobs = Api::<Job>::namespaced(client.clone(), target)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(jobs.len(), 1, "one seed Job");
    assert_eq!(jobs[0].status.clone().unwrap().succeeded, Some(1));
}

#[tokio::test]
async fn apiserver_killed_between_waves_and_restarted_everything_converges_and_nothing_is_lost() {
    let _turn = TURN.lock().await;
    in_namespace("apiserver-killed", |client, ns| async move {
        let forge = ForgeStandIn::start().await.unwrap();
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.url())).await;
        Api::<PreviewTemplate>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &boutique_with_slow_seed())
            .await
            .unwrap();
        let logs = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let previewd = previewd(
            "previewd",
            &support::shared().kubeconfig_path,
            &ns,
            logs.path(),
        );
        previewd.wait_ready(&http).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let (_, boutique) = example("online-boutique");
        let boutique_name = boutique.name_any();
        environments
            .create(&PostParams::default(), &boutique)
            .await
            .unwrap();

        // Waves 0 and 1 are applied, the seed runs, wave 2 waits for it: kill the apiserver.
        let target = target_of(&environments, &boutique_name).await;
        wait_for_job(&client, &target).await;
        support::kill_apiserver().await;
        let killed = Instant::now();

        // A delivery while the apiserver is down cannot be recorded: previewd must not say 202
        // (GitHub would not send it again), and must handle the redelivery later.
        let opened = change_of(31, 0);
        let status = deliver(&http, &previewd.base, "open-31", &opened).await;
        assert_eq!(
            status, 503,
            "a delivery previewd could not write is refused"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        support::start_apiserver().await;
        eprintln!("apiserver down for {:.1} s", killed.elapsed().as_secs_f64());
        previewd
            .send(&http, "pull_request", "open-31", &opened)
            .await;

        // Both converge: the boutique completes its waves, PR 31 deploys.
        let ready = wait_for_phase(
            &environments,
            &boutique_name,
            Phase::Ready,
            Duration::from_secs(180),
        )
        .await;
        eprintln!(
            "boutique Ready {:.1} s after the apiserver was killed",
            killed.elapsed().as_secs_f64()
        );
        assert_eq!(managed_counts(&client, &target).await, (12, 12, 11));
        let after_seed = Api::<ConfigMap>::namespaced(client.clone(), &target)
            .get("after-seed")
            .await
            .expect("wave 2 applied");
        assert_eq!(after_seed.data.unwrap()["sha"], ready.spec.source.head_sha);
        assert_seeded_once(&client, &target).await;
        let pr_31 = environment_of_pr(&environments, 31).await;
        wait_ready_with_sha(&environments, &pr_31, &head(31, 0)).await;
        let all = environments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert_eq!(all.len(), 2, "one environment each, none duplicated");
        eventually("the PR 31 comment", Duration::from_secs(30), || async {
            (comments_created(&forge, 31) == 1).then_some(())
        })
        .await;
        let lines = previewd.log_lines();
        assert!(
            lines.iter().any(|line| line.contains("\"to\":\"Ready\"")),
            "phase changes are logged"
        );
        let degraded = lines
            .iter()
            .any(|line| line.contains("\"to\":\"Degraded\""));
        assert!(
            !degraded,
            "an outage is not a reason to call an environment Degraded"
        );
    })
    .await;
}

#[tokio::test]
async fn cut_watches_resume_and_a_410_gone_relists_and_repairs_what_changed_meanwhile() {
    let _turn = TURN.lock().await;
    in_namespace("watch-cut", |client, ns| async move {
        let forge = ForgeStandIn::start().await.unwrap();
        install_template(&client, &ns, "github", REPOSITORY, Some(&forge.url())).await;
        let logs = tempfile::tempdir().unwrap();
        let (proxy, kubeconfig) =
            CuttableProxy::in_front_of(&support::shared().kubeconfig_path, logs.path()).await;
        let http = reqwest::Client::new();
        let previewd = previewd("previewd", &kubeconfig, &ns, logs.path());
        previewd.wait_ready(&http).await;
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        previewd
            .send(&http, "pull_request", "open-41", &change_of(41, 0))
            .await;
        let name = environment_of_pr(&environments, 41).await;
        let ready = wait_ready_with_sha(&environments, &name, &head(41, 0)).await;
        let target = ready.status.unwrap().namespace.unwrap();
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target);
        let last_seen = config_maps
            .get("app")
            .await
            .unwrap()
            .resource_version()
            .unwrap();

        // Cut previewd off. Meanwhile its ConfigMap is deleted by hand, and the API server
        // restarts: its new watch cache starts after the deletion (a running cache keeps 75 s
        // of history, so this is how a 410 happens within a test's time).
        proxy.cut();
        config_maps
            .delete("app", &DeleteParams::default())
            .await
            .unwrap();
        support::kill_apiserver().await;
        support::start_apiserver().await;
        // A watch resumed from there is answered 410 Gone: only a relist can show the deletion.
        let mut resumed = config_maps
            .watch(&WatchParams::default(), &last_seen)
            .await
            .unwrap()
            .boxed();
        match resumed.next().await {
            Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {}
            other => panic!("expected 410 Gone for a watch from {last_seen}, got {other:?}"),
        }
        // A delivery while cut off cannot be written: refused, to be redelivered.
        let pushed = change_of(41, 1);
        assert_eq!(
            deliver(&http, &previewd.base, "push-41", &pushed).await,
            503
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        proxy.heal();
        let healed = Instant::now();

        // previewd relists, sees the ConfigMap gone and puts it back, with no delivery to prompt it.
        eventually(
            "previewd to restore the deleted ConfigMap",
            Duration::from_secs(90),
            || async { config_maps.get_opt("app").await.ok()?.map(|_| ()) },
        )
        .await;
        eprintln!(
            "ConfigMap restored {:.1} s after the connection came back",
            healed.elapsed().as_secs_f64()
        );
        // Its environment watch works again too: the redelivered push deploys.
        previewd
            .send(&http, "pull_request", "push-41", &pushed)
            .await;
        wait_ready_with_sha(&environments, &name, &head(41, 1)).await;
        assert_eq!(
            environments
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        assert_eq!(comments_created(&forge, 41), 1, "one comment, edited since");
    })
    .await;
}

/// A step of a pull request's (GitHub) or merge request's (GitLab) life.
#[derive(Clone, Copy)]
enum Step {
    Open,
    Push,
    Close,
}

/// A pull request or merge request, told as the deliveries its forge sends.
struct ChangeRequest {
    forge: &'static str,
    repository: &'static str,
    number: u64,
}

impl ChangeRequest {
    /// The event name and body of `step`: the head is `head(number, 0)` when opened and
    /// `head(number, 1)` after the push; each step is changed 10 s after the one before.
    fn delivery(&self, step: Step) -> (&'static str, Vec<u8>) {
        let change = match step {
            Step::Open => 0,
            Step::Push | Step::Close => 1,
        };
        let changed = chrono::Utc::now() - chrono::TimeDelta::minutes(10)
            + chrono::TimeDelta::seconds(step as i64 * 10);
        let head = head(self.number, change);
        match self.forge {
            "gitlab" => (
                "Merge Request Hook",
                self.merge_request(step, &head, changed),
            ),
            _ => ("pull_request", self.pull_request(step, &head, changed)),
        }
    }

    fn pull_request(
        &self,
        step: Step,
        head: &str,
        changed: chrono::DateTime<chrono::Utc>,
    ) -> Vec<u8> {
        let number = self.number;
        match step {
            Step::Open => pull_request_change(number, 0, head, changed),
            Step::Push => pull_request_change(number, 1, head, changed),
            Step::Close => {
                let mut closed = json_fixture("github/pull_request.closed.json");
                closed["number"] = number.into();
                closed["pull_request"]["number"] = number.into();
                closed["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
                closed["pull_request"]["head"]["sha"] = head.into();
                closed["pull_request"]["updated_at"] = timestamp(changed).into();
                closed.to_string().into_bytes()
            }
        }
    }

    /// `gitlab/merge_request.json` as merge request `number` of `repository` on branch
    /// `mr-<number>`, changed in a copy.
    fn merge_request(
        &self,
        step: Step,
        head: &str,
        changed: chrono::DateTime<chrono::Utc>,
    ) -> Vec<u8> {
        let mut delivery = json_fixture("gitlab/merge_request.json");
        delivery["project"]["path_with_namespace"] = self.repository.into();
        let attributes = &mut delivery["object_attributes"];
        attributes["iid"] = self.number.into();
        attributes["source_branch"] = format!("mr-{}", self.number).into();
        attributes["last_commit"]["id"] = head.into();
        attributes["updated_at"] = timestamp(changed).into();
        let (action, state) = match step {
            Step::Open => ("open", "opened"),
            Step::Push => ("update", "opened"),
            Step::Close => ("close", "closed"),
        };
        attributes["action"] = action.into();
        attributes["state"] = state.into();
        delivery.to_string().into_bytes()
    }

    async fn send(&self, process: &PreviewdProcess, http: &reqwest::Client, step: Step) {
        let (event, body) = self.delivery(step);
        let id = format!("{}-{}-{}", self.forge, self.number, step as u8);
        match self.forge {
            "gitlab" => process.send_gitlab(http, event, &id, &body).await,
            _ => process.send(http, event, &id, &body).await,
        }
    }

    /// The text of the last comment (GitHub) or note (GitLab) previewd wrote on it.
    fn last_comment(&self, forge: &ForgeStandIn) -> Option<String> {
        forge.received().into_iter().rev().find_map(|r| match r {
            Received::Comment { number, body, .. } if number == self.number => Some(body),
            _ => None,
        })
    }
}

fn timestamp(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[tokio::test]
async fn previewd_sigkilled_at_each_step_of_a_pull_request_finishes_it_after_restart() {
    let github = ChangeRequest {
        forge: "github",
        repository: REPOSITORY,
        number: 51,
    };
    killed_at_each_step("previewd-killed", github).await;
}

#[tokio::test]
async fn previewd_sigkilled_at_each_step_of_a_merge_request_finishes_it_after_restart() {
    let gitlab = ChangeRequest {
        forge: "gitlab",
        repository: "gitlabhq/gitlab-test",
        number: 52,
    };
    killed_at_each_step("previewd-killed-gitlab", gitlab).await;
}

/// Opened and killed while the seed runs; pushed and killed right after the answer; closed and
/// killed right after the answer. Each time a new previewd finishes the job: the new commit
/// Ready, the seed run once, the environment gone at the end, and one comment for it all.
async fn killed_at_each_step(test_name: &str, change: ChangeRequest) {
    let _turn = TURN.lock().await;
    in_namespace(test_name, |client, ns| async move {
        let forge = ForgeStandIn::start().await.unwrap();
        // A seed that runs 3 s, so that the first kill lands while the environment deploys.
        let seed = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: data\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        sandbox.previewd.dev/run-seconds: \"3\"\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: load\n        image: busybox:1.36\n";
        install_template_with(
            &client,
            &ns,
            change.forge,
            change.repository,
            Some(&forge.url()),
            json!({"seeds": [{"name": "data", "wave": 1, "job": seed}]}),
            CONFIG_MAP_APP,
        )
        .await;
        let logs = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();
        let kubeconfig = support::shared().kubeconfig_path.clone();
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);
        let start = |n: u32| {
            let process =
                previewd_with_short_lease(&format!("previewd-{n}"), &kubeconfig, &ns, logs.path());
            async move {
                process.wait_ready(&reqwest::Client::new()).await;
                process
            }
        };
        let number = change.number;

        // Opened; killed while the seed runs.
        let first = start(1).await;
        change.send(&first, &http, Step::Open).await;
        let name = environment_of_pr(&environments, number).await;
        let target = target_of(&environments, &name).await;
        wait_for_job(&client, &target).await;
        first.signal(libc::SIGKILL);
        let second = start(2).await;
        wait_ready_with_sha(&environments, &name, &head(number, 0)).await;
        assert_seeded_once(&client, &target).await;
        // The comment follows (each new process's start-up sweep gets the stand-in's 503 for
        // the list of open requests, and the forge client then waits ~2 s before its next call).
        eventually("the comment", Duration::from_secs(30), || async {
            (comments_created(&forge, number) == 1).then_some(())
        })
        .await;

        // Pushed; killed right after it answered.
        change.send(&second, &http, Step::Push).await;
        second.signal(libc::SIGKILL);
        let third = start(3).await;
        wait_ready_with_sha(&environments, &name, &head(number, 1)).await;
        assert_seeded_once(&client, &target).await;

        // Closed; killed right after it answered.
        change.send(&third, &http, Step::Close).await;
        third.signal(libc::SIGKILL);
        let fourth = start(4).await;
        wait_gone(&client, &environments, &name, &target).await;

        if comments_created(&forge, number) != 1 {
            print_forge_lines(logs.path());
        }
        assert_eq!(
            comments_created(&forge, number),
            1,
            "one comment for the whole life, however often previewd died; the forge saw {:#?}",
            forge.received()
        );
        eventually(
            "the comment to say the environment is gone",
            Duration::from_secs(30),
            || async { change.last_comment(&forge).filter(|text| text.contains("destroyed")) },
        )
        .await;
        drop(fourth);
    })
    .await;
}

/// previewd's warnings, errors and forge lines from every log under `logs`.
fn print_forge_lines(logs: &Path) {
    for entry in std::fs::read_dir(logs).unwrap() {
        let path = entry.unwrap().path();
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            if line.contains("WARN") || line.contains("ERROR") || line.contains("forge") {
                eprintln!("{}: {line}", path.display());
            }
        }
    }
}
