//! `previewd sandbox --demo`: a pull request's life in the sandbox, from the fixture
//! deliveries, with what happens printed as it happens: opened → Ready → synchronize (a new
//! commit) → Ready again → closed → gone. The PR comment is printed each time previewd edits it.
//!
//! The `synchronize` fixture carries the same head SHA as `opened` (both are snapshots of one
//! PR), so the demo sends a copy with a new head SHA, as a real push would, and says so.

use std::io::Write;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::ListParams;

use super::SandboxError;
use super::forge_standin::Received;
use super::playground::{DELIVERIES, GITHUB_TEMPLATE, NAMESPACE, Playground};
use crate::model::crd::{Phase, PreviewEnvironment};

/// How long one step (Ready, gone) may take before the demo gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);
/// The head SHA of the demo's second commit.
const NEW_HEAD: &str = "5a1b2c3d4e5f60718293a4b5c6d7e8f901234567";

/// How long each step took.
#[derive(Debug)]
pub struct DemoTimings {
    pub opened_to_ready: Duration,
    pub synchronize_to_ready: Duration,
    pub closed_to_gone: Duration,
}

struct Narrator {
    started: Instant,
    /// The environment's state last printed, so that only changes are printed.
    last_state: std::cell::RefCell<String>,
}

impl Narrator {
    /// Prints the environment's state if it changed since last time.
    fn state(&self, state: String) {
        if *self.last_state.borrow() != state {
            self.say(&format!("  environment {state}"));
            *self.last_state.borrow_mut() = state;
        }
    }

    fn say(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "[{:>5.1}s] {text}",
            self.started.elapsed().as_secs_f64()
        );
        let _ = out.flush();
    }
}

/// Plays the PR's life against previewd at `webhook_base`; returns the timings.
pub async fn play(
    client: &kube::Client,
    playground: &Playground,
    webhook_base: &str,
) -> Result<DemoTimings, SandboxError> {
    let narrator = Narrator {
        started: Instant::now(),
        last_state: Default::default(),
    };
    let mut forge_events = playground.forge.subscribe();
    let http = reqwest::Client::new();
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), NAMESPACE);
    let body = |index: usize| DELIVERIES[index].1.as_bytes().to_vec();

    narrator.say(
        "pull_request opened: PR #2 (branch `changes`) of Codertocat/Hello-World, head ec26c3e",
    );
    let sent = Instant::now();
    send(
        &http,
        playground,
        webhook_base,
        "demo-opened",
        &body(0),
        &narrator,
    )
    .await?;
    let name = follow(&environments, None, &narrator, &mut forge_events, |e| {
        ready_at(e, "ec26c3e")
    })
    .await?;
    let opened_to_ready = sent.elapsed();
    narrator.say(&format!(
        "READY: {name} in {:.1} s",
        opened_to_ready.as_secs_f64()
    ));

    let mut synchronize: serde_json::Value = serde_json::from_slice(&body(1))
        .map_err(|e| SandboxError::Process(format!("the synchronize delivery: {e}")))?;
    synchronize["pull_request"]["head"]["sha"] = NEW_HEAD.into();
    synchronize["before"] = "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into();
    synchronize["after"] = NEW_HEAD.into();
    narrator.say(&format!(
        "pull_request synchronize: a new commit {} (the fixture's copy with a new head SHA)",
        &NEW_HEAD[..7]
    ));
    let sent = Instant::now();
    send(
        &http,
        playground,
        webhook_base,
        "demo-synchronize",
        synchronize.to_string().as_bytes(),
        &narrator,
    )
    .await?;
    follow(
        &environments,
        Some(&name),
        &narrator,
        &mut forge_events,
        |e| ready_at(e, &NEW_HEAD[..7]),
    )
    .await?;
    let synchronize_to_ready = sent.elapsed();
    narrator.say(&format!(
        "UPDATED: {name} Ready at {} in {:.1} s",
        &NEW_HEAD[..7],
        synchronize_to_ready.as_secs_f64()
    ));

    narrator.say("pull_request closed: PR #2 closed without merging");
    let sent = Instant::now();
    send(
        &http,
        playground,
        webhook_base,
        "demo-closed",
        &body(2),
        &narrator,
    )
    .await?;
    let namespace = environments
        .get_opt(&name)
        .await?
        .and_then(|e| e.status.and_then(|s| s.namespace));
    wait_gone(
        client,
        &environments,
        &name,
        namespace.as_deref(),
        &narrator,
        &mut forge_events,
    )
    .await?;
    let closed_to_gone = sent.elapsed();
    narrator.say(&format!(
        "DESTROYED: {name} and its namespace deleted in {:.1} s",
        closed_to_gone.as_secs_f64()
    ));
    Ok(DemoTimings {
        opened_to_ready,
        synchronize_to_ready,
        closed_to_gone,
    })
}

async fn send(
    http: &reqwest::Client,
    playground: &Playground,
    webhook_base: &str,
    delivery: &str,
    body: &[u8],
    narrator: &Narrator,
) -> Result<(), SandboxError> {
    let signature =
        crate::forge::github::sign(playground.facts.github_webhook_secret.as_bytes(), body);
    let response = http
        .post(format!("{webhook_base}/webhooks/github"))
        .header("Content-Type", "application/json")
        .header("X-GitHub-Event", "pull_request")
        .header("X-GitHub-Delivery", delivery)
        .header("X-Hub-Signature-256", signature)
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| SandboxError::Process(format!("sending the delivery: {e}")))?;
    let status = response.status().as_u16();
    let answer: serde_json::Value = response.json().await.unwrap_or_default();
    let message = answer["message"].as_str().unwrap_or_default();
    narrator.say(&format!("  previewd answered {status}: {message}"));
    if status != 202 {
        return Err(SandboxError::Process(format!(
            "previewd refused the demo delivery ({status}): {message}"
        )));
    }
    Ok(())
}

fn ready_at(environment: &PreviewEnvironment, short_sha: &str) -> bool {
    environment.status.as_ref().is_some_and(|s| {
        s.phase == Phase::Ready
            && s.deployed_sha
                .as_deref()
                .is_some_and(|sha| sha.starts_with(short_sha))
    })
}

/// The line printed for an environment's state: phase and its condition's message.
fn describe(environment: &PreviewEnvironment) -> String {
    let Some(status) = &environment.status else {
        return "created, not reconciled yet".into();
    };
    let message = status
        .conditions
        .first()
        .map(|c| c.message.as_str())
        .unwrap_or_default();
    format!("{}: {message}", status.phase.as_str())
}

fn print_forge(narrator: &Narrator, forge_events: &mut tokio::sync::broadcast::Receiver<Received>) {
    while let Ok(received) = forge_events.try_recv() {
        // Commit and deployment statuses on one line; comments with their text.
        let text = received.to_string();
        narrator.say(&format!("  forge ← {}", text.trim_end()));
    }
}

/// Polls the GitHub template's environment of PR 2 (by `name` once known), printing each new
/// state and what the forge received, until `done` holds. Returns the environment's name.
async fn follow(
    environments: &Api<PreviewEnvironment>,
    name: Option<&str>,
    narrator: &Narrator,
    forge_events: &mut tokio::sync::broadcast::Receiver<Received>,
    done: impl Fn(&PreviewEnvironment) -> bool,
) -> Result<String, SandboxError> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let found = environments
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| match name {
                Some(name) => kube::ResourceExt::name_any(e) == name,
                None => e.spec.template == GITHUB_TEMPLATE && e.spec.source.pull_request == Some(2),
            });
        print_forge(narrator, forge_events);
        if let Some(environment) = found {
            narrator.state(describe(&environment));
            if done(&environment) {
                return Ok(kube::ResourceExt::name_any(&environment));
            }
        }
        if Instant::now() > deadline {
            return Err(SandboxError::Process(format!(
                "the demo environment did not get there within {} s (last: {})",
                STEP_TIMEOUT.as_secs(),
                narrator.last_state.borrow()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_gone(
    client: &kube::Client,
    environments: &Api<PreviewEnvironment>,
    name: &str,
    namespace: Option<&str>,
    narrator: &Narrator,
    forge_events: &mut tokio::sync::broadcast::Receiver<Received>,
) -> Result<(), SandboxError> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        print_forge(narrator, forge_events);
        let environment = environments.get_opt(name).await?;
        if let Some(environment) = &environment {
            narrator.state(describe(environment));
        }
        let namespace_left = match namespace {
            Some(namespace) => namespaces.get_opt(namespace).await?.is_some(),
            None => false,
        };
        if environment.is_none() && !namespace_left {
            print_forge(narrator, forge_events);
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SandboxError::Process(format!(
                "{name} was not deleted within {} s",
                STEP_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
