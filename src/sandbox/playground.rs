//! What makes the sandbox something to poke at: the forge stand-in, a Secret with fresh webhook
//! credentials, two example templates (GitHub `Codertocat/Hello-World` and GitLab
//! `gitlabhq/gitlab-test`, the repositories of the fixture deliveries), the deliveries written
//! to files, and the facts a person or a script needs to send them (`--info-file`).

use std::path::{Path, PathBuf};

use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde_json::{Value, json};

use super::SandboxError;
use super::control_plane::random_hex;
use super::forge_standin::ForgeStandIn;
// The examples' repositories, the ones the fixture deliveries name.
use super::repositories::Repositories;
pub use super::repositories::{GITHUB_REPOSITORY, GITLAB_REPOSITORY};
use crate::model::crd::{ForgeKind, PreviewTemplate};

/// Where the sandbox's templates, their Secret and the environments live.
pub const NAMESPACE: &str = "default";
pub const GITHUB_TEMPLATE: &str = "hello-world";
pub const GITLAB_TEMPLATE: &str = "gitlab-test";
const SECRET_NAME: &str = "previewd-sandbox-forge";
/// The Secret the examples in templates/ read their forge token from.
const EXAMPLES_TOKEN_SECRET: &str = "forge-token";
const FIELD_MANAGER: &str = "previewd-sandbox";

/// The app both templates deploy: the web-postgres example (database, seed Job, web app).
const EXAMPLE_TEMPLATE: &str = include_str!("../../templates/web-postgres/template.yaml");

/// Real deliveries (see `deliveries/README.md`), by file name.
pub const DELIVERIES: [(&str, &str); 4] = [
    (
        "github.pull_request.opened.json",
        include_str!("deliveries/github.pull_request.opened.json"),
    ),
    (
        "github.pull_request.synchronize.json",
        include_str!("deliveries/github.pull_request.synchronize.json"),
    ),
    (
        "github.pull_request.closed.json",
        include_str!("deliveries/github.pull_request.closed.json"),
    ),
    (
        "gitlab.merge_request.json",
        include_str!("deliveries/gitlab.merge_request.json"),
    ),
];

/// The facts `--info-file` writes, for scripts.
#[derive(Clone, Debug, Serialize)]
pub struct Facts {
    pub kubeconfig: String,
    pub github_webhook_url: String,
    pub github_webhook_secret: String,
    pub gitlab_webhook_url: String,
    pub gitlab_webhook_token: String,
    pub forge_api_url: String,
    /// The sandbox's ingress (`sandbox::ingress`): send a request with an environment's host.
    pub ingress_url: String,
    /// The kubectl of the control plane's release (built with it, or found).
    pub kubectl: String,
    /// The Kubernetes release the control plane runs, e.g. `v1.37.2`.
    pub kubernetes_version: String,
}

pub struct Playground {
    pub forge: ForgeStandIn,
    pub facts: Facts,
    /// Where the deliveries were written (inside the sandbox's data folder).
    pub deliveries: PathBuf,
}

impl Playground {
    /// Starts the stand-in (serving `repositories`), writes the Secrets and the templates, and
    /// the delivery files under `data_dir`. `webhook_base` is previewd's HTTP address
    /// (`http://host:port`).
    pub async fn set_up(
        client: &kube::Client,
        kubeconfig: &Path,
        data_dir: &Path,
        webhook_base: &str,
        repositories: Repositories,
    ) -> Result<Self, SandboxError> {
        let own = repositories.own();
        // The forge token of the sandbox's templates: the one key to the repositories served.
        let api_token = random_hex(16)?;
        let repositories = repositories.guarded_by(api_token.clone());
        let forge = ForgeStandIn::relaying_to(webhook_base, repositories).await?;
        forge.track(ForgeKind::Github, GITHUB_REPOSITORY);
        forge.track(ForgeKind::Gitlab, GITLAB_REPOSITORY);
        // One's own repositories: open PRs as the deliveries say, branches as the folder has.
        for name in own {
            forge.track(ForgeKind::Github, &name);
            forge.track(ForgeKind::Gitlab, &name);
        }
        // The examples' environments (templates/*/environment.yaml) are PR #2 of
        // Codertocat/Hello-World, the PR the fixture deliveries open: open from the start, so
        // the sweep keeps an example applied with kubectl.
        let (_, opened) = DELIVERIES[0];
        forge.learn(ForgeKind::Github, "pull_request", opened);
        // Deliveries go through the stand-in, as they come from a forge: it learns which PRs
        // are open and answers the sweep's lists from that (see `forge_relay`).
        let facts = Facts {
            kubeconfig: kubeconfig.display().to_string(),
            github_webhook_url: forge.hook_url("github"),
            github_webhook_secret: random_hex(16)?,
            gitlab_webhook_url: forge.hook_url("gitlab"),
            gitlab_webhook_token: random_hex(16)?,
            forge_api_url: forge.url(),
            ingress_url: String::new(),
            kubectl: String::new(),
            kubernetes_version: String::new(),
        };
        write_secrets(client, &facts, &api_token).await?;
        apply_templates(client, &facts.forge_api_url).await?;
        let deliveries = data_dir.join("deliveries");
        std::fs::create_dir_all(&deliveries).map_err(|e| SandboxError::io(&deliveries, e))?;
        for (file, body) in DELIVERIES {
            let path = deliveries.join(file);
            std::fs::write(&path, body).map_err(|e| SandboxError::io(&path, e))?;
        }
        Ok(Self {
            forge,
            facts,
            deliveries,
        })
    }

    /// A `curl` that sends the GitHub `pull_request` `opened` delivery, signed.
    pub fn github_curl(&self) -> String {
        let (file, body) = DELIVERIES[0];
        let signature = crate::forge::github::sign(
            self.facts.github_webhook_secret.as_bytes(),
            body.as_bytes(),
        );
        format!(
            "curl -sS -X POST {url} -H 'Content-Type: application/json' -H 'X-GitHub-Event: pull_request' -H 'X-GitHub-Delivery: sandbox-opened-1' -H 'X-Hub-Signature-256: {signature}' --data-binary @{path}",
            url = self.facts.github_webhook_url,
            path = self.deliveries.join(file).display(),
        )
    }

    /// A `curl` that sends the GitLab `Merge Request Hook` delivery with its token.
    pub fn gitlab_curl(&self) -> String {
        let (file, _) = DELIVERIES[3];
        format!(
            "curl -sS -X POST {url} -H 'Content-Type: application/json' -H 'X-Gitlab-Event: Merge Request Hook' -H 'X-Gitlab-Event-UUID: sandbox-mr-1' -H 'X-Gitlab-Token: {token}' --data-binary @{path}",
            url = self.facts.gitlab_webhook_url,
            token = self.facts.gitlab_webhook_token,
            path = self.deliveries.join(file).display(),
        )
    }
}

/// The example template for one forge: the web-postgres app, this forge and repository, the
/// stand-in as API, and the sandbox Secret for the webhook and the token.
fn example_template(
    name: &str,
    kind: &str,
    repository: &str,
    webhook_key: &str,
    api_url: &str,
) -> Result<Value, SandboxError> {
    let mut template: Value = serde_yaml_ng::from_str(EXAMPLE_TEMPLATE)
        .map_err(|e| SandboxError::Process(format!("the example template is not YAML: {e}")))?;
    template["metadata"] = json!({"name": name, "namespace": NAMESPACE});
    template["spec"]["forge"] = json!({
        "kind": kind,
        "repository": repository,
        "apiUrl": api_url,
        "tokenSecretRef": {"name": SECRET_NAME, "key": "api-token"},
        "webhookSecretRef": {"name": SECRET_NAME, "key": webhook_key},
    });
    Ok(template)
}

/// The sandbox's Secret (the webhook secret and token of its two templates, the forge token)
/// and the token Secret the examples in templates/ name.
async fn write_secrets(
    client: &kube::Client,
    facts: &Facts,
    api_token: &str,
) -> Result<(), SandboxError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET_NAME},
        "stringData": {
            "github-webhook-secret": facts.github_webhook_secret,
            "gitlab-webhook-token": facts.gitlab_webhook_token,
            // The stand-in reads repositories for this token only; a real forge needs a
            // real one (docs/forges.md).
            "api-token": api_token,
        }
    });
    secrets
        .patch(SECRET_NAME, &params, &Patch::Apply(&secret))
        .await?;
    // The token the examples in templates/ name (`tokenSecretRef: forge-token`).
    let example_token = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": EXAMPLES_TOKEN_SECRET},
        "stringData": {"token": api_token},
    });
    secrets
        .patch(
            EXAMPLES_TOKEN_SECRET,
            &params,
            &Patch::Apply(&example_token),
        )
        .await?;
    Ok(())
}

/// The sandbox's own two templates, one per forge, against the forge stand-in at `api_url`.
async fn apply_templates(client: &kube::Client, api_url: &str) -> Result<(), SandboxError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let templates: Api<PreviewTemplate> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, kind, repository, secret_key) in [
        (
            GITHUB_TEMPLATE,
            "github",
            GITHUB_REPOSITORY,
            "github-webhook-secret",
        ),
        (
            GITLAB_TEMPLATE,
            "gitlab",
            GITLAB_REPOSITORY,
            "gitlab-webhook-token",
        ),
    ] {
        let template = example_template(name, kind, repository, secret_key, api_url)?;
        templates
            .patch(name, &params, &Patch::Apply(&template))
            .await?;
    }
    Ok(())
}
