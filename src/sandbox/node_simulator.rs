//! A node simulator: the part of a kubelet that the control plane can see.
//!
//! There is no container runtime here, so no real kubelet. The simulator registers Nodes (with
//! capacity, a Ready condition and a heartbeat Lease in `kube-node-lease`, without which the
//! node lifecycle controller would mark them NotReady after ~40 s and evict their pods) and
//! moves the pods the real scheduler binds to them through their lives by writing pod status:
//!
//! * ordinary pods become Running and Ready after a short delay, so Deployments, ReplicaSets and
//!   StatefulSets reach Available through the real controllers;
//! * pods owned by a Job run for [`ANNOTATION_RUN_SECONDS`] (default 1 s) and then Succeed,
//!   or Fail with exit code 1 when the pod template carries [`ANNOTATION_FAIL`]`: "true"`;
//! * pods being deleted are removed at once (a kubelet confirms deletion the same way, with a
//!   zero grace period), so namespace deletion completes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// Pod annotation: `"true"` makes a Job's pod fail; other pods then never become Ready.
pub const ANNOTATION_FAIL: &str = "sandbox.previewd.dev/fail";
/// Pod annotation: how many seconds a Job's pod runs before it finishes (default 1).
pub const ANNOTATION_RUN_SECONDS: &str = "sandbox.previewd.dev/run-seconds";
const FIELD_MANAGER: &str = "previewd-sandbox-kubelet";
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// How the simulated nodes behave.
#[derive(Clone, Debug)]
pub struct NodeSimulatorConfig {
    pub nodes: usize,
    /// Delay between a pod being bound and it running.
    pub startup_delay: Duration,
    /// How often each node renews its Lease (a kubelet: 10 s).
    pub lease_renew_interval: Duration,
}

impl Default for NodeSimulatorConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            startup_delay: Duration::from_millis(500),
            lease_renew_interval: Duration::from_secs(10),
        }
    }
}

/// The running simulator; its tasks stop when it is dropped.
pub struct NodeSimulator {
    tasks: Vec<JoinHandle<()>>,
    node_names: Vec<String>,
}

impl NodeSimulator {
    /// Registers the nodes and starts simulating. Returns once the nodes are Ready.
    pub async fn start(client: Client, config: NodeSimulatorConfig) -> Result<Self, kube::Error> {
        let node_names: Vec<String> = (0..config.nodes)
            .map(|i| format!("sandbox-node-{i}"))
            .collect();
        let nodes: Api<Node> = Api::all(client.clone());
        // A kubelet is never newer than its API server: the nodes say the server's release.
        let version = client.apiserver_version().await?.git_version;
        for (index, name) in node_names.iter().enumerate() {
            register_node(&nodes, name, index, &version).await?;
        }
        let mut tasks = Vec::new();
        for name in &node_names {
            tasks.push(tokio::spawn(heartbeat(
                client.clone(),
                name.clone(),
                config.lease_renew_interval,
            )));
        }
        let kubelet = Kubelet {
            client: client.clone(),
            nodes: node_names.iter().cloned().collect(),
            startup_delay: config.startup_delay,
            state: Arc::new(Mutex::new(PodBook::default())),
        };
        tasks.push(tokio::spawn(kubelet.run()));
        Ok(Self { tasks, node_names })
    }

    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }
}

impl Drop for NodeSimulator {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn node_conditions() -> Value {
    let now = now_rfc3339();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": "previewd sandbox",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        condition("Ready", "True", "KubeletReady"),
    ])
}

async fn register_node(
    nodes: &Api<Node>,
    name: &str,
    index: usize,
    version: &str,
) -> Result<(), kube::Error> {
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "previewd.dev/sandbox-node": "true"
            }
        },
        "spec": {"podCIDR": format!("10.244.{index}.0/24")}
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    nodes.patch(name, &params, &Patch::Apply(&node)).await?;
    let capacity =
        json!({"cpu": "32", "memory": "128Gi", "pods": "250", "ephemeral-storage": "200Gi"});
    let status = json!({
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": node_conditions(),
            "addresses": [
                {"type": "InternalIP", "address": format!("10.0.0.{}", index + 10)},
                {"type": "Hostname", "address": name}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": format!("sandbox-{index}"), "systemUUID": format!("sandbox-{index}"),
                "bootID": format!("sandbox-{index}"), "kernelVersion": "sandbox",
                "osImage": "previewd sandbox", "containerRuntimeVersion": "sandbox://1",
                "kubeletVersion": version,
                "operatingSystem": "linux", "architecture": "amd64"
            }
        }
    });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Renews the node's Lease every interval and refreshes its conditions every third time.
async fn heartbeat(client: Client, node: String, interval: Duration) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes: Api<Node> = Api::all(client);
    let mut beat: u64 = 0;
    loop {
        let renew = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renew}
        });
        if let Err(e) = leases
            .patch(
                &node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
        {
            tracing::warn!(node = %node, error = %e, "sandbox node could not renew its lease");
        }
        if beat.is_multiple_of(3) {
            let status = json!({"status": {"conditions": node_conditions()}});
            if let Err(e) = nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                tracing::warn!(node = %node, error = %e, "sandbox node could not report its status");
            }
        }
        beat += 1;
        tokio::time::sleep(interval).await;
    }
}

/// Which pods the simulator has already taken in hand, and the IPs it handed out.
#[derive(Default)]
struct PodBook {
    started: HashSet<String>,
    deleting: HashSet<String>,
    next_ip: HashMap<String, u32>,
}

#[derive(Clone)]
struct Kubelet {
    client: Client,
    nodes: HashSet<String>,
    startup_delay: Duration,
    state: Arc<Mutex<PodBook>>,
}

impl Kubelet {
    async fn run(self) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        // Only pods bound to some node; one watch for the whole cluster.
        let config = watcher::Config::default().fields("spec.nodeName!=");
        let mut events = watcher(pods, config).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    self.observe(pod)
                }
                Ok(watcher::Event::Delete(pod)) => self.forget(&pod),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "sandbox pod watch interrupted; resuming");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    fn observe(&self, pod: Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        if !self.nodes.contains(&node) {
            return;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let mut book = self.state.lock().expect("pod book lock");
        if pod.metadata.deletion_timestamp.is_some() {
            if book.deleting.insert(uid) {
                tokio::spawn(self.clone().remove(pod));
            }
            return;
        }
        let fresh = phase.is_empty() || phase == "Pending";
        if fresh && book.started.insert(uid) {
            let counter = book.next_ip.entry(node.clone()).or_insert(1);
            *counter += 1;
            let ip = pod_ip(&node, *counter);
            tokio::spawn(self.clone().start(pod, node, ip));
        }
    }

    fn forget(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut book = self.state.lock().expect("pod book lock");
        book.started.remove(&uid);
        book.deleting.remove(&uid);
    }

    /// Confirms a deletion as a kubelet would once the containers are gone.
    async fn remove(self, pod: Pod) {
        let (Some(name), Some(namespace)) =
            (pod.metadata.name.clone(), pod.metadata.namespace.clone())
        else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = pods.delete(&name, &params).await
            && !is_not_found(&e)
        {
            tracing::warn!(pod = %name, namespace = %namespace, error = %e, "sandbox could not remove a pod");
        }
    }

    async fn start(self, pod: Pod, node: String, ip: String) {
        tokio::time::sleep(self.startup_delay).await;
        let (Some(name), Some(namespace)) =
            (pod.metadata.name.clone(), pod.metadata.namespace.clone())
        else {
            return;
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let fails = annotations
            .get(ANNOTATION_FAIL)
            .is_some_and(|v| v == "true");
        let host_ip = node_ip(&node);
        let result = if is_job_pod(&pod) {
            let run_for = annotations
                .get(ANNOTATION_RUN_SECONDS)
                .and_then(|s| s.parse::<f64>().ok())
                .map(Duration::from_secs_f64)
                .unwrap_or(Duration::from_secs(1));
            let running = pod_status(&pod, ContainerPhase::Running { ready: true }, &ip, &host_ip);
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&running))
                .await;
            tokio::time::sleep(run_for).await;
            let exit_code = if fails { 1 } else { 0 };
            let done = pod_status(
                &pod,
                ContainerPhase::Terminated { exit_code },
                &ip,
                &host_ip,
            );
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&done))
                .await
        } else {
            let running = pod_status(
                &pod,
                ContainerPhase::Running { ready: !fails },
                &ip,
                &host_ip,
            );
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&running))
                .await
        };
        if let Err(e) = result
            && !is_not_found(&e)
        {
            tracing::warn!(pod = %name, namespace = %namespace, error = %e, "sandbox could not start a pod");
            // Let the next watch event try again.
            if let Some(uid) = &pod.metadata.uid {
                self.state
                    .lock()
                    .expect("pod book lock")
                    .started
                    .remove(uid);
            }
        }
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 409)
}

fn is_job_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .as_ref()
        .is_some_and(|owners| owners.iter().any(|o| o.kind == "Job"))
}

fn node_index(node: &str) -> u32 {
    node.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

fn node_ip(node: &str) -> String {
    format!("10.0.0.{}", node_index(node) + 10)
}

fn pod_ip(node: &str, counter: u32) -> String {
    // 10.244.<node>.<n>, wrapping within the node's /24 (plenty for a sandbox).
    format!("10.244.{}.{}", node_index(node), 2 + counter % 250)
}

enum ContainerPhase {
    Running { ready: bool },
    Terminated { exit_code: i32 },
}

/// The status a kubelet would report for `pod` in `phase`.
fn pod_status(pod: &Pod, phase: ContainerPhase, ip: &str, host_ip: &str) -> Value {
    let now = now_rfc3339();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let init_containers = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    let (pod_phase, ready, state) = match phase {
        ContainerPhase::Running { ready } => {
            ("Running", ready, json!({"running": {"startedAt": now}}))
        }
        ContainerPhase::Terminated { exit_code } => (
            if exit_code == 0 {
                "Succeeded"
            } else {
                "Failed"
            },
            false,
            json!({"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" },
                                  "startedAt": now, "finishedAt": now}}),
        ),
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let container_status = |name: &str, image: &str, ready: bool, state: &Value| {
        json!({
            "name": name, "image": image, "imageID": format!("sandbox://{image}"),
            "containerID": format!("sandbox://{uid}/{name}"), "ready": ready, "started": state.get("running").is_some(),
            "restartCount": 0, "state": state
        })
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| container_status(&c.name, c.image.as_deref().unwrap_or(""), ready, &state))
        .collect();
    let init_done = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}});
    let init_statuses: Vec<Value> = init_containers
        .iter()
        .map(|c| container_status(&c.name, c.image.as_deref().unwrap_or(""), true, &init_done))
        .collect();
    let flag = |b: bool| if b { "True" } else { "False" };
    let condition = |type_: &str, status: bool| json!({"type": type_, "status": flag(status), "lastTransitionTime": now});
    json!({
        "status": {
            "phase": pod_phase,
            "hostIP": host_ip,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [
                condition("Initialized", true),
                condition("Ready", ready),
                condition("ContainersReady", ready),
                condition("PodScheduled", true)
            ],
            "containerStatuses": statuses,
            "initContainerStatuses": init_statuses
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(job: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u1", "ownerReferences": if job {
                json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j1"}]) } else { json!([]) }},
            "spec": {"containers": [{"name": "app", "image": "busybox"}],
                     "initContainers": [{"name": "init", "image": "busybox"}]}
        }))
        .unwrap()
    }

    #[test]
    fn running_pod_reports_ready_containers() {
        let status = pod_status(
            &pod(false),
            ContainerPhase::Running { ready: true },
            "10.244.0.5",
            "10.0.0.10",
        );
        assert_eq!(status["status"]["phase"], "Running");
        assert_eq!(status["status"]["containerStatuses"][0]["ready"], true);
        assert_eq!(status["status"]["conditions"][1]["type"], "Ready");
        assert_eq!(status["status"]["conditions"][1]["status"], "True");
        assert_eq!(
            status["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"],
            0
        );
    }

    #[test]
    fn failed_job_pod_exits_with_code_one() {
        assert!(is_job_pod(&pod(true)));
        assert!(!is_job_pod(&pod(false)));
        let status = pod_status(
            &pod(true),
            ContainerPhase::Terminated { exit_code: 1 },
            "ip",
            "host",
        );
        assert_eq!(status["status"]["phase"], "Failed");
        assert_eq!(
            status["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            1
        );
    }

    #[test]
    fn pod_ips_stay_within_the_node_range() {
        assert_eq!(pod_ip("sandbox-node-1", 3), "10.244.1.5");
        assert_eq!(node_ip("sandbox-node-1"), "10.0.0.11");
        assert!(pod_ip("sandbox-node-0", 10_000).starts_with("10.244.0."));
    }
}
