//! Two (then three) real `previewd run` processes against one control plane, with leader
//! election through a Lease of 4 s: only the holder reconciles, every replica accepts webhooks,
//! a SIGKILLed leader is replaced and its pending work finished, and a SIGTERMed leader
//! releases the Lease, answers what is in flight and exits 0; only the leader sweeps; a leader
//! cut off from the API server stops before another can take over. The processes log JSON; the test
//! reads those logs for the per-delivery and per-reconcile spans and for leaked secrets. A
//! SIGKILLed previewd's successor writes nothing for an environment nobody changed, and only
//! the object edited by hand meanwhile.
//!
//! PR deliveries are `github/pull_request.opened.json` and `synchronize.json` changed in copies
//! (PR number, branch and head SHA), so that several PRs live side by side.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use previewd::model::crd::PreviewEnvironment;
use serde_json::Value;
use support::process::PreviewdProcess;
use support::proxy::CuttableProxy;
use support::webhooks::*;
use support::{eventually, in_namespace};
use wiremock::MockServer;

const REPOSITORY: &str = "Codertocat/Hello-World";
const LEASE: &str = "previewd-leader";
const LEASE_SECONDS: u64 = 4;
const FORGE_TOKEN: &str = "forge-token-for-tests";

/// One `previewd run` replica of the namespace, with a Lease of `LEASE_SECONDS`.
fn replica(namespace: &str, identity: &str, logs: &Path) -> PreviewdProcess {
    replica_through(
        namespace,
        identity,
        &support::shared().kubeconfig_path,
        logs,
    )
}

/// [`replica`] reaching the API server through `kubeconfig` (e.g. a cuttable proxy).
fn replica_through(
    namespace: &str,
    identity: &str,
    kubeconfig: &Path,
    logs: &Path,
) -> PreviewdProcess {
    let lease = format!("{LEASE_SECONDS}s");
    PreviewdProcess::start(
        identity,
        kubeconfig,
        &[
            "--watch-namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--lease-duration",
            &lease,
            "--identity",
            identity,
            "--shutdown-grace",
            "10s",
        ],
        &[],
        logs,
    )
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

async fn wait_for_holder(leases: &Api<Lease>, among: &[&str]) -> String {
    eventually(
        "a replica to hold the Lease",
        Duration::from_secs(30),
        || async {
            let lease = leases.get_opt(LEASE).await.ok()??;
            holder(&lease).filter(|h| among.contains(&h.as_str()))
        },
    )
    .await
}

/// Waits until `process` logged a finished sweep (a leader's term starts with one).
async fn wait_for_sweep(process: &PreviewdProcess) {
    eventually(
        &format!("a sweep by {}", process.name),
        Duration::from_secs(30),
        || async {
            process
                .log_lines()
                .iter()
                .any(|line| line.contains("sweep done"))
                .then_some(())
        },
    )
    .await;
}

fn synchronize_for(number: u64, sha: &str) -> Vec<u8> {
    let mut delivery = json_fixture("github/pull_request.synchronize.json");
    delivery["number"] = number.into();
    delivery["pull_request"]["number"] = number.into();
    delivery["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
    delivery["pull_request"]["head"]["sha"] = sha.into();
    delivery.to_string().into_bytes()
}

async fn ready_at(environments: &Api<PreviewEnvironment>, number: u64, sha: &str) {
    let name = environment_of_pr(environments, number).await;
    wait_ready_with_sha(environments, &name, sha).await;
}

fn sha(n: u64) -> String {
    format!("{n:0>40}")
}

/// What each test here starts from: the GitHub stand-in and a template for it, a folder for
/// the replicas' logs, and the Leases and environments of the test's namespace.
struct Setup {
    forge: MockServer,
    logs: tempfile::TempDir,
    http: reqwest::Client,
    leases: Api<Lease>,
    environments: Api<PreviewEnvironment>,
}

async fn setup(client: &kube::Client, namespace: &str) -> Setup {
    let forge = github_forge().await;
    install_template(client, namespace, "github", REPOSITORY, Some(&forge.uri())).await;
    Setup {
        forge,
        logs: tempfile::tempdir().unwrap(),
        http: reqwest::Client::new(),
        leases: Api::namespaced(client.clone(), namespace),
        environments: Api::namespaced(client.clone(), namespace),
    }
}

#[tokio::test]
async fn one_leader_reconciles_a_killed_leader_is_replaced_and_sigterm_hands_over() {
    in_namespace("ha", |client, ns| async move {
        let Setup {
            forge: _forge,
            logs,
            http,
            leases,
            environments,
        } = setup(&client, &ns).await;

        let a = replica(&ns, "replica-a", logs.path());
        let b = replica(&ns, "replica-b", logs.path());
        a.wait_ready(&http).await;
        b.wait_ready(&http).await;
        let first = wait_for_holder(&leases, &["replica-a", "replica-b"]).await;
        let (leader, standby) = if first == "replica-a" { (a, b) } else { (b, a) };
        eprintln!("leader: {}, standby: {}", leader.name, standby.name);

        // Both accept webhooks; the leader deploys what either wrote.
        standby
            .send(&http, "pull_request", "open-21", &opened_for(21, &sha(21)))
            .await;
        leader
            .send(&http, "pull_request", "open-22", &opened_for(22, &sha(22)))
            .await;
        ready_at(&environments, 21, &sha(21)).await;
        ready_at(&environments, 22, &sha(22)).await;
        assert_eq!(leader.metric(&http, "previewd_leader").await, Some(1.0));
        assert_eq!(standby.metric(&http, "previewd_leader").await, Some(0.0));
        let standby_reconciled = standby
            .log_lines()
            .iter()
            .any(|line| line.contains("\"name\":\"reconcile\""));
        assert!(
            !standby_reconciled,
            "the standby reconciled while not leading"
        );
        // Only the leader sweeps: a term starts with a sweep; the standby's log has none.
        wait_for_sweep(&leader).await;
        assert!(
            !standby
                .log_lines()
                .iter()
                .any(|line| line.contains("sweep done")),
            "the standby swept while not leading"
        );

        // SIGKILL the leader: no release, the standby must wait the Lease out, then finish
        // what arrived meanwhile.
        let killed_at = Instant::now();
        leader.signal(libc::SIGKILL);
        standby
            .send(&http, "pull_request", "open-23", &opened_for(23, &sha(23)))
            .await;
        standby
            .send(
                &http,
                "pull_request",
                "sync-21",
                &synchronize_for(21, &sha(121)),
            )
            .await;
        wait_for_holder(&leases, &[standby.name.as_str()]).await;
        eprintln!(
            "takeover after SIGKILL: {:.1} s (lease duration {LEASE_SECONDS} s)",
            killed_at.elapsed().as_secs_f64()
        );
        ready_at(&environments, 23, &sha(23)).await;
        ready_at(&environments, 21, &sha(121)).await;
        assert_eq!(standby.metric(&http, "previewd_leader").await, Some(1.0));
        wait_for_sweep(&standby).await;
        let killed_log = leader.log_lines();
        drop(leader);

        // SIGTERM the new leader: it releases the Lease and exits 0; the third replica takes
        // over without waiting the Lease out.
        let mut new_leader = standby;
        let c = replica(&ns, "replica-c", logs.path());
        c.wait_ready(&http).await;
        eventually("replica-c to stand by", Duration::from_secs(10), || async {
            (c.metric(&http, "previewd_leader").await == Some(0.0)).then_some(())
        })
        .await;
        let terminated_at = Instant::now();
        new_leader.signal(libc::SIGTERM);
        let status = eventually(
            "the SIGTERMed leader to exit",
            Duration::from_secs(30),
            || {
                let status = new_leader.child.try_wait().ok().flatten();
                async move { status }
            },
        )
        .await;
        assert!(status.success(), "previewd exited with {status} on SIGTERM");
        wait_for_holder(&leases, &["replica-c"]).await;
        eprintln!(
            "hand-over after SIGTERM: {:.1} s (no wait for the {LEASE_SECONDS} s lease)",
            terminated_at.elapsed().as_secs_f64()
        );
        let released = new_leader
            .log_lines()
            .iter()
            .any(|line| line.contains("released the leader Lease"));
        assert!(released, "the SIGTERMed leader did not log its release");
        c.send(&http, "pull_request", "open-24", &opened_for(24, &sha(24)))
            .await;
        ready_at(&environments, 24, &sha(24)).await;
        // A delivery signed with another secret: 401, and a log line says so (docs/security.md).
        let forged_body = opened_for(25, &sha(25));
        let forged = Some(previewd::forge::github::sign(
            b"not-the-secret",
            &forged_body,
        ));
        let (status, answer) = post_github(
            &http,
            &c.base,
            "pull_request",
            "forged-25",
            &forged_body,
            forged,
        )
        .await;
        assert_eq!(status, 401, "{answer}");

        // Logs: JSON lines; deliveries and reconciles in spans naming what they are about;
        // neither the webhook secret nor the forge token anywhere.
        let mut lines = killed_log;
        lines.extend(new_leader.log_lines());
        lines.extend(c.log_lines());
        assert!(!lines.is_empty());
        let records: Vec<Value> = lines
            .iter()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
            })
            .collect();
        let delivery_span = records.iter().any(|r| {
            r["span"]["name"] == "delivery"
                && r["span"]["delivery"] == "open-23"
                && r["span"]["repository"] == REPOSITORY
        });
        assert!(delivery_span, "no log line in the span of delivery open-23");
        let reconcile_span = records.iter().any(|r| {
            r["spans"].as_array().is_some_and(|spans| {
                spans.iter().any(|s| {
                    s["name"] == "reconcile"
                        && s["repository"] == REPOSITORY
                        && s["environment"]
                            .as_str()
                            .is_some_and(|e| e.starts_with(&ns))
                })
            })
        });
        assert!(reconcile_span, "no log line in a reconcile span");
        let refusal_said = records.iter().any(|r| {
            r["fields"]["outcome"] == "unauthorized"
                && r["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("webhook refused"))
        });
        assert!(
            refusal_said,
            "no `webhook refused` line for the forged delivery"
        );
        for line in &lines {
            assert!(
                !line.contains(SECRET),
                "the webhook secret was logged: {line}"
            );
            assert!(
                !line.contains(FORGE_TOKEN),
                "the forge token was logged: {line}"
            );
        }

        // A new leader's first reconciles must not run before its template cache is synced
        // (they would call the template missing and mark healthy environments Degraded).
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
        let degraded: Vec<String> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Degraded"))
            .map(|e| e.message.unwrap_or_default())
            .collect();
        assert!(
            degraded.is_empty(),
            "environments went Degraded: {degraded:?}"
        );

        // Leave nothing behind: close every PR and let the leader clean up.
        let names: Vec<String> = environments
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(kube::ResourceExt::name_any)
            .collect();
        for number in [21u64, 22, 23, 24] {
            let mut closed = json_fixture("github/pull_request.closed.json");
            closed["number"] = number.into();
            closed["pull_request"]["number"] = number.into();
            closed["pull_request"]["head"]["ref"] = format!("pr-{number}").into();
            let body = closed.to_string().into_bytes();
            c.send(&http, "pull_request", &format!("close-{number}"), &body)
                .await;
        }
        eventually(
            "every environment to be removed",
            Duration::from_secs(60),
            || async {
                let left = environments
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .len();
                (left == 0).then_some(())
            },
        )
        .await;
        assert_eq!(names.len(), 4, "exactly one environment per PR: {names:?}");
    })
    .await;
}

/// The `timestamp` of the first JSON log line of `process` that contains `needle`.
fn logged_at(process: &PreviewdProcess, needle: &str) -> Option<String> {
    process
        .log_lines()
        .iter()
        .filter(|l| l.contains(needle))
        .find_map(|line| {
            let record: Value = serde_json::from_str(line).ok()?;
            record["timestamp"].as_str().map(str::to_string)
        })
}

/// A leader cut off from the API server stops reconciling within the renew deadline, before
/// the standby can take the Lease (so two never reconcile at once), and once reconnected it
/// stays a standby: it neither reconciles nor sweeps while the other leads.
#[tokio::test]
async fn a_leader_that_cannot_renew_stops_before_the_standby_takes_over_and_stays_standing_by() {
    in_namespace("ha-cut", |client, ns| async move {
        let Setup {
            forge: _forge,
            logs,
            http,
            leases,
            environments,
        } = setup(&client, &ns).await;
        let (proxy, through_proxy) =
            CuttableProxy::in_front_of(&support::shared().kubeconfig_path, logs.path()).await;
        let a = replica_through(&ns, "replica-a", &through_proxy, logs.path());
        a.wait_ready(&http).await;
        assert_eq!(wait_for_holder(&leases, &["replica-a"]).await, "replica-a");
        let b = replica(&ns, "replica-b", logs.path());
        b.wait_ready(&http).await;
        a.send(&http, "pull_request", "open-31", &opened_for(31, &sha(31)))
            .await;
        ready_at(&environments, 31, &sha(31)).await;

        // Cut the leader off: it cannot renew; the standby takes the Lease once it runs out.
        proxy.cut();
        wait_for_holder(&leases, &["replica-b"]).await;
        let stopped = eventually(
            "replica-a to stop reconciling",
            Duration::from_secs(30),
            || async {
                logged_at(
                    &a,
                    "could not renew the leader Lease within the renew deadline",
                )
            },
        )
        .await;
        let taken =
            logged_at(&b, "leading: reconciling and sweeping").expect("replica-b logged its term");
        assert!(
            stopped < taken,
            "replica-a stopped at {stopped}, before replica-b took over at {taken}"
        );

        // Reconnected, replica-a stands by: replica-b deploys a new commit, replica-a reconciles
        // nothing (its log shows no reconcile after the cut) and says it does not lead.
        proxy.heal();
        eventually(
            "replica-a to see replica-b leading",
            Duration::from_secs(30),
            || async {
                a.log_lines()
                    .iter()
                    .any(|l| l.contains("standing by: another replica leads"))
                    .then_some(())
            },
        )
        .await;
        let lines_at_heal = a.log_lines().len();
        b.send(
            &http,
            "pull_request",
            "push-31",
            &synchronize_for(31, &sha(131)),
        )
        .await;
        ready_at(&environments, 31, &sha(131)).await;
        assert_eq!(a.metric(&http, "previewd_leader").await, Some(0.0));
        assert_eq!(b.metric(&http, "previewd_leader").await, Some(1.0));
        let reconciled_after = a.log_lines()[lines_at_heal..]
            .iter()
            .any(|l| l.contains("\"name\":\"reconcile\""));
        assert!(
            !reconciled_after,
            "replica-a reconciled while replica-b led"
        );
    })
    .await;
}

/// An application of the kinds previewd writes most: a Secret (not watched: read back after a
/// restart), a ServiceAccount (its token list is another manager's), a Deployment (its revision
/// annotation and status are the controllers'), a Service and two ConfigMaps.
const APP: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {LOG_LEVEL: info}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: release}
data: {GIT_SHA: "{{ sha }}"}
---
apiVersion: v1
kind: Secret
metadata: {name: app}
stringData: {SESSION_KEY: preview-only}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      serviceAccountName: app
      containers: [{name: web, image: "nginx:1.25", ports: [{containerPort: 80, protocol: TCP}]}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, protocol: TCP}]
"#;

/// The resourceVersion of every object previewd manages in `namespace` (kinds of [`APP`] and
/// the guard rails), by kind and name: any write to one of them changes it.
async fn versions_in(client: &kube::Client, namespace: &str) -> Vec<(String, String)> {
    use kube::ResourceExt;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
    let mut versions = Vec::new();
    for (group, version, kind) in [
        ("", "v1", "ConfigMap"),
        ("", "v1", "Secret"),
        ("", "v1", "ServiceAccount"),
        ("", "v1", "Service"),
        ("apps", "v1", "Deployment"),
        ("", "v1", "ResourceQuota"),
        ("", "v1", "LimitRange"),
        ("networking.k8s.io", "v1", "NetworkPolicy"),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ] {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let listed = api
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=previewd"))
            .await
            .unwrap();
        for object in listed {
            let version = match kind {
                // The quota controller writes a quota's status (what is used) whenever it
                // recounts, at times of its own: on a loaded machine after the settle window
                // (CI saw one such write after the restart). What previewd wrote is the spec
                // and its own managed fields.
                "ResourceQuota" => format!(
                    "{} {:?}",
                    object.data["spec"],
                    object
                        .metadata
                        .managed_fields
                        .iter()
                        .flatten()
                        .filter(|entry| {
                            entry
                                .manager
                                .as_deref()
                                .is_some_and(|m| m.starts_with("previewd"))
                        })
                        .map(|entry| entry.time.clone())
                        .collect::<Vec<_>>()
                ),
                _ => object.resource_version().unwrap_or_default(),
            };
            versions.push((format!("{kind}/{}", object.name_any()), version));
        }
    }
    versions.sort();
    versions
}

#[tokio::test]
async fn a_restarted_previewd_writes_nothing_for_an_unchanged_environment_and_repairs_a_hand_edit()
{
    in_namespace("restart", |client, ns| async move {
        let forge = github_forge().await;
        install_template_with(
            &client,
            &ns,
            "github",
            REPOSITORY,
            Some(&forge.uri()),
            serde_json::json!({}),
            APP,
        )
        .await;
        let http = reqwest::Client::new();
        let logs = tempfile::tempdir().unwrap();
        let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
        let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), &ns);

        let first = replica(&ns, "first", logs.path());
        first.wait_ready(&http).await;
        wait_for_holder(&leases, &["first"]).await;
        first
            .send(&http, "pull_request", "open-31", &opened_for(31, &sha(31)))
            .await;
        ready_at(&environments, 31, &sha(31)).await;
        let name = environment_of_pr(&environments, 31).await;
        let environment = environments.get(&name).await.unwrap();
        let namespace = environment.status.unwrap().namespace.unwrap();
        // The controllers' own writes (a Deployment's status) settle; then nothing moves.
        let before = eventually("the objects to settle", Duration::from_secs(30), || async {
            let earlier = versions_in(&client, &namespace).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            (versions_in(&client, &namespace).await == earlier).then_some(earlier)
        })
        .await;
        // The application's six objects, the quota, the default LimitRange and the default-deny
        // NetworkPolicy.
        assert_eq!(before.len(), 9, "{before:?}");

        // SIGKILL (no hand-over); meanwhile, someone edits one ConfigMap by hand.
        drop(first);
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), &namespace);
        let edit = serde_json::json!({"data": {"LOG_LEVEL": "debug"}});
        let by_hand = kube::api::PatchParams {
            field_manager: Some("kubectl-edit".into()),
            ..Default::default()
        };
        configmaps
            .patch("settings", &by_hand, &kube::api::Patch::Merge(&edit))
            .await
            .unwrap();
        let edited = versions_in(&client, &namespace).await;

        let second = replica(&ns, "second", logs.path());
        second.wait_ready(&http).await;
        wait_for_holder(&leases, &["second"]).await;
        // The edit is repaired…
        eventually(
            "the hand edit repaired",
            Duration::from_secs(30),
            || async {
                let settings = configmaps.get("settings").await.ok()?;
                let level = settings.data?.get("LOG_LEVEL").cloned();
                (level.as_deref() == Some("info")).then_some(())
            },
        )
        .await;
        // … and it is the only write: every other object keeps its resourceVersion, and
        // previewd's own count agrees (one apply sent, nine recalled; no status, no Event).
        // The marker: a reconcile asked for after the repair has finished, so whatever the
        // restart would write is written by then.
        let reconciles = || async {
            let total = second.metric_total(&http, "previewd_reconcile_duration_seconds_count");
            total.await.unwrap_or(0.0)
        };
        let reconciled = reconciles().await;
        let poke =
            serde_json::json!({"metadata": {"annotations": {"test.previewd.dev/poke": "1"}}});
        environments
            .patch(&name, &Default::default(), &kube::api::Patch::Merge(&poke))
            .await
            .unwrap();
        eventually(
            "a reconcile after the poke",
            Duration::from_secs(30),
            || async { (reconciles().await > reconciled).then_some(()) },
        )
        .await;
        let after = versions_in(&client, &namespace).await;
        let changed: Vec<_> = after.iter().filter(|v| !edited.contains(v)).collect();
        assert_eq!(changed.len(), 1, "changed after the restart: {changed:?}");
        assert_eq!(changed[0].0, "ConfigMap/settings");
        assert_eq!(
            second
                .metric_total(&http, "previewd_write_requests_total")
                .await,
            Some(1.0)
        );
        assert_eq!(
            second
                .metric(&http, "previewd_apply_requests_total{outcome=\"sent\"}")
                .await,
            Some(1.0)
        );
    })
    .await;
}
