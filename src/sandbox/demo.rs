//! `previewd sandbox --demo`: first the examples that read the repository (templates/web-chart,
//! a Helm chart, and templates/web-kustomize, a Kustomize overlay) applied as `kubectl apply -f
//! templates/<name>/` applies them, Ready, then removed; then a pull request's life in the
//! sandbox, from the fixture deliveries, with what happens printed as it happens: opened →
//! Ready → synchronize (a new commit) → Ready again → asleep → a request to its host through the
//! sandbox's ingress wakes it → the app answers → closed → gone. The PR comment is printed
//! each time previewd edits it.
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
use crate::model::crd::{Phase, PreviewEnvironment, PreviewTemplate};

/// How long one step (Ready, gone) may take before the demo gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);
/// The head SHA of the demo's second commit.
const NEW_HEAD: &str = "5a1b2c3d4e5f60718293a4b5c6d7e8f901234567";

/// How long each step took.
#[derive(Debug)]
pub struct DemoTimings {
    /// From applying the two examples until both were Ready.
    pub examples_to_ready: Duration,
    pub opened_to_ready: Duration,
    pub synchronize_to_ready: Duration,
    /// From the first request to the sleeping environment's host until the app answered it.
    pub request_to_app: Duration,
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

/// Plays the PR's life, its deliveries sent as a forge would (through the stand-in, to
/// previewd); returns the timings.
pub async fn play(
    client: &kube::Client,
    playground: &Playground,
    with_helm: bool,
) -> Result<DemoTimings, SandboxError> {
    let mut demo = Demo {
        client,
        playground,
        narrator: Narrator {
            started: Instant::now(),
            last_state: Default::default(),
        },
        forge_events: playground.forge.subscribe(),
        http: reqwest::Client::new(),
        environments: Api::namespaced(client.clone(), NAMESPACE),
    };
    let examples_to_ready = demo.examples(with_helm).await?;
    let (name, opened_to_ready) = demo.opened().await?;
    let synchronize_to_ready = demo.synchronized(&name).await?;
    let request_to_app = demo.woken_by_a_request(&name).await?;
    let closed_to_gone = demo.closed(&name).await?;
    Ok(DemoTimings {
        examples_to_ready,
        opened_to_ready,
        synchronize_to_ready,
        request_to_app,
        closed_to_gone,
    })
}

/// What the three acts of the demo share.
struct Demo<'a> {
    client: &'a kube::Client,
    playground: &'a Playground,
    narrator: Narrator,
    forge_events: tokio::sync::broadcast::Receiver<Received>,
    http: reqwest::Client,
    environments: Api<PreviewEnvironment>,
}

impl Demo<'_> {
    fn delivery(index: usize) -> Vec<u8> {
        DELIVERIES[index].1.as_bytes().to_vec()
    }

    async fn send(&self, delivery: &str, body: &[u8]) -> Result<(), SandboxError> {
        send(&self.http, self.playground, delivery, body, &self.narrator).await
    }

    /// Act 0: the examples that read the repository, applied as `kubectl apply -f
    /// templates/<name>/` would (the stand-in serves their chart and overlay, and previewd
    /// sends their calls there); Ready, then removed before the PR's life starts. Without a
    /// Helm engine the chart is left out, and that is said.
    async fn examples(&mut self, with_helm: bool) -> Result<Duration, SandboxError> {
        let started = Instant::now();
        let mut applied = Vec::new();
        for example in &REPOSITORY_EXAMPLES {
            if example.name == "web-chart" && !with_helm {
                self.narrator.say(
                    "skipping templates/web-chart: no Helm engine (see the line `Helm:` above)",
                );
                continue;
            }
            self.narrator.say(&format!(
                "kubectl apply -f templates/{}/: {}",
                example.name, example.what
            ));
            applied.push(apply_example(self.client, example).await?);
        }
        for name in &applied {
            follow(
                &self.environments,
                Some(name),
                &self.narrator,
                &mut self.forge_events,
                |e| ready_at(e, "ec26c3e"),
            )
            .await?;
            let url = self.url_of(name).await;
            self.narrator.say(&format!("READY: {name}, {url}"));
        }
        let took = started.elapsed();
        // All at once: each removal waits for its namespace to go.
        let mut namespaces = Vec::new();
        for name in &applied {
            let environment = self.environments.get_opt(name).await?;
            namespaces.push(environment.and_then(|e| e.status.and_then(|s| s.namespace)));
            self.environments.delete(name, &Default::default()).await?;
        }
        for (name, namespace) in applied.iter().zip(namespaces) {
            self.removed(name, namespace.as_deref()).await?;
        }
        Ok(took)
    }

    /// Waits until an example's environment and its `namespace` are gone, then deletes its
    /// template.
    async fn removed(&mut self, name: &str, namespace: Option<&str>) -> Result<(), SandboxError> {
        wait_gone(
            self.client,
            &self.environments,
            name,
            namespace,
            &self.narrator,
            &mut self.forge_events,
        )
        .await?;
        let template = name.trim_end_matches("-pr-2");
        let templates: Api<PreviewTemplate> = Api::namespaced(self.client.clone(), NAMESPACE);
        templates.delete(template, &Default::default()).await?;
        self.narrator
            .say(&format!("removed {name} and its template"));
        Ok(())
    }

    /// Act 1: the PR is opened; returns the environment's name and how long Ready took.
    async fn opened(&mut self) -> Result<(String, Duration), SandboxError> {
        self.narrator.say(
            "pull_request opened: PR #2 (branch `changes`) of Codertocat/Hello-World, head ec26c3e",
        );
        let sent = Instant::now();
        self.send("demo-opened", &Self::delivery(0)).await?;
        let name = follow(
            &self.environments,
            None,
            &self.narrator,
            &mut self.forge_events,
            |e| ready_at(e, "ec26c3e"),
        )
        .await?;
        let took = sent.elapsed();
        let url = self.url_of(&name).await;
        self.narrator.say(&format!(
            "READY: {name} in {:.1} s, {url}",
            took.as_secs_f64()
        ));
        if let Ok(environment) = self.environments.get(&name).await {
            for line in super::database::describe(self.client, &environment).await {
                self.narrator.say(&line);
            }
        }
        Ok((name, took))
    }

    /// Where the environment is, as its status says (previewd reports a URL only once an
    /// Ingress or HTTPRoute routes its host; the sandbox's ingress answers it for the app's
    /// pods, see `sandbox::ingress`).
    async fn url_of(&self, name: &str) -> String {
        let url = self
            .environments
            .get(name)
            .await
            .ok()
            .and_then(|e| e.status)
            .and_then(|s| s.url);
        match url {
            Some(url) => format!("URL {url} (routed by its Ingress)"),
            None => "no URL (nothing routes its host)".into(),
        }
    }

    /// Act 2: a new commit (the fixture's synchronize with a new head SHA, as a push would).
    async fn synchronized(&mut self, name: &str) -> Result<Duration, SandboxError> {
        let mut synchronize: serde_json::Value = serde_json::from_slice(&Self::delivery(1))
            .map_err(|e| SandboxError::Process(format!("the synchronize delivery: {e}")))?;
        synchronize["pull_request"]["head"]["sha"] = NEW_HEAD.into();
        synchronize["before"] = "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into();
        synchronize["after"] = NEW_HEAD.into();
        self.narrator.say(&format!(
            "pull_request synchronize: a new commit {} (the fixture's copy with a new head SHA)",
            &NEW_HEAD[..7]
        ));
        let sent = Instant::now();
        self.send("demo-synchronize", synchronize.to_string().as_bytes())
            .await?;
        follow(
            &self.environments,
            Some(name),
            &self.narrator,
            &mut self.forge_events,
            |e| ready_at(e, &NEW_HEAD[..7]),
        )
        .await?;
        let took = sent.elapsed();
        self.narrator.say(&format!(
            "UPDATED: {name} Ready at {} in {:.1} s",
            &NEW_HEAD[..7],
            took.as_secs_f64()
        ));
        Ok(took)
    }

    /// Act 3: asleep, and woken by a request to its host through the sandbox's ingress (no
    /// push, no comment); returns the time from the first request until the app answered.
    async fn woken_by_a_request(&mut self, name: &str) -> Result<Duration, SandboxError> {
        self.narrator
            .say("sleep: spec.sleep set, as the sweep does after the template's idleTimeout");
        let asleep = serde_json::json!({"spec": {"sleep": true}});
        let params = kube::api::PatchParams::default();
        self.environments
            .patch(name, &params, &kube::api::Patch::Merge(asleep))
            .await?;
        let asleep = |e: &PreviewEnvironment| {
            e.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Sleeping)
        };
        follow(
            &self.environments,
            Some(name),
            &self.narrator,
            &mut self.forge_events,
            asleep,
        )
        .await?;
        let host = self
            .environments
            .get(name)
            .await?
            .status
            .and_then(|s| s.host)
            .unwrap_or_default();
        let sent = Instant::now();
        let (status, said) = self.request(&host).await?;
        self.narrator
            .say(&format!("GET http://{host}/ → {status}: {said}"));
        let awake = |e: &PreviewEnvironment| ready_at(e, &NEW_HEAD[..7]);
        follow(
            &self.environments,
            Some(name),
            &self.narrator,
            &mut self.forge_events,
            awake,
        )
        .await?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let (status, said) = self.request(&host).await?;
            if status == 200 {
                let took = sent.elapsed();
                self.narrator.say(&format!(
                    "WOKEN: GET http://{host}/ → 200 {:.1} s after the first request: {said}",
                    took.as_secs_f64()
                ));
                return Ok(took);
            }
            if Instant::now() > deadline {
                return Err(SandboxError::Process(format!(
                    "{host} did not reach the app within {} s (last: {status} {said})",
                    STEP_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A GET of `host` through the sandbox's ingress: its status and what it said (the gate's
    /// `state`, or the app's line).
    async fn request(&self, host: &str) -> Result<(u16, String), SandboxError> {
        let answer = self
            .http
            .get(format!("{}/", self.playground.facts.ingress_url))
            .header("Host", host)
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| SandboxError::Process(format!("a request to {host}: {e}")))?;
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        let said = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(json) => format!(
                "previewd's waiting page ({})",
                json["state"].as_str().unwrap_or_default()
            ),
            Err(_) => text.trim().to_string(),
        };
        Ok((status, said))
    }

    /// Act 4: the PR is closed; the environment and its namespace go.
    async fn closed(&mut self, name: &str) -> Result<Duration, SandboxError> {
        self.narrator
            .say("pull_request closed: PR #2 closed without merging");
        let sent = Instant::now();
        self.send("demo-closed", &Self::delivery(2)).await?;
        let namespace = self
            .environments
            .get_opt(name)
            .await?
            .and_then(|e| e.status.and_then(|s| s.namespace));
        wait_gone(
            self.client,
            &self.environments,
            name,
            namespace.as_deref(),
            &self.narrator,
            &mut self.forge_events,
        )
        .await?;
        let took = sent.elapsed();
        self.narrator.say(&format!(
            "DESTROYED: {name} and its namespace deleted in {:.1} s",
            took.as_secs_f64()
        ));
        Ok(took)
    }
}

/// An example of templates/ whose manifests come from the repository.
struct Example {
    name: &'static str,
    what: &'static str,
    template: &'static str,
    environment: &'static str,
}

const REPOSITORY_EXAMPLES: [Example; 2] = [
    Example {
        name: "web-chart",
        what: "a Helm chart in the repository (deploy/chart), rendered with `helm template`",
        template: include_str!("../../templates/web-chart/template.yaml"),
        environment: include_str!("../../templates/web-chart/environment.yaml"),
    },
    Example {
        name: "web-kustomize",
        what: "a Kustomize overlay in the repository (deploy/overlays/preview), built with `kubectl kustomize`",
        template: include_str!("../../templates/web-kustomize/template.yaml"),
        environment: include_str!("../../templates/web-kustomize/environment.yaml"),
    },
];

/// Applies an example's template and environment as they are in templates/ (server-side, as
/// `kubectl apply --server-side` would); returns the environment's name.
async fn apply_example(client: &kube::Client, example: &Example) -> Result<String, SandboxError> {
    use kube::api::{Patch, PatchParams};
    let parse = |text: &str| -> Result<serde_json::Value, SandboxError> {
        serde_yaml_ng::from_str(text).map_err(|e| {
            SandboxError::Process(format!("templates/{}/ is not YAML: {e}", example.name))
        })
    };
    let params = PatchParams::apply("previewd-sandbox-demo").force();
    let (template, environment) = (parse(example.template)?, parse(example.environment)?);
    let name_of = |object: &serde_json::Value| {
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), NAMESPACE);
    templates
        .patch(&name_of(&template), &params, &Patch::Apply(&template))
        .await?;
    let name = name_of(&environment);
    let environments: Api<PreviewEnvironment> = Api::namespaced(client.clone(), NAMESPACE);
    environments
        .patch(&name, &params, &Patch::Apply(&environment))
        .await?;
    Ok(name)
}

async fn send(
    http: &reqwest::Client,
    playground: &Playground,
    delivery: &str,
    body: &[u8],
    narrator: &Narrator,
) -> Result<(), SandboxError> {
    let signature =
        crate::forge::github::sign(playground.facts.github_webhook_secret.as_bytes(), body);
    let response = http
        .post(&playground.facts.github_webhook_url)
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
