//! Every label, annotation, finalizer and field manager previewd reads or writes, in one place.
//!
//! They are previewd's contract with the cluster: the watches select by these labels, pruning
//! and the orphan sweep find objects by them, and each writer owns its fields under its own
//! field manager so that no writer overwrites another's. A name changed here changes what an
//! upgraded previewd recognises as its own, so changes need a migration note.

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::crd::{PreviewEnvironment, PreviewTemplate};

/// The finalizer previewd puts on every `PreviewEnvironment`, so that its namespace is removed
/// before the record disappears.
pub const FINALIZER: &str = "previewd.dev/cleanup";

/// Label on every object previewd creates: the name of the `PreviewEnvironment` it belongs to.
pub const LABEL_ENVIRONMENT: &str = "previewd.dev/environment";
/// Label on every object previewd creates: the namespace of that `PreviewEnvironment`.
pub const LABEL_ENVIRONMENT_NAMESPACE: &str = "previewd.dev/environment-namespace";
/// Label on the namespaces previewd creates: the UID of the `PreviewEnvironment` it created
/// the namespace for. Only a namespace with its environment's UID is used, cleaned up or swept
/// as an orphan: previewd never adopts or deletes a namespace it did not create.
pub const LABEL_ENVIRONMENT_UID: &str = "previewd.dev/environment-uid";
/// Label on every object previewd creates: the `PreviewTemplate` it was rendered from.
pub const LABEL_TEMPLATE: &str = "previewd.dev/template";
/// Label that marks objects as managed by previewd (value `previewd`).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label on intake-made environments: the pull/merge request number.
pub const LABEL_PULL_REQUEST: &str = "previewd.dev/pull-request";
/// Label on seed Jobs: the seed's name in the template.
pub const LABEL_SEED: &str = "previewd.dev/seed";

/// Annotation the wake gate writes on an environment it wakes: the head commit it woke. While
/// the head is still that commit (no push since) and no writer's command came, the environment
/// runs only for a visitor, and yields its slot to one its author waits for
/// (`reconcile::queue`).
pub const ANNOTATION_WOKEN_BY_REQUEST: &str = "previewd.dev/woken-by-request";

/// Annotation on a rendered object: its wave (default 0); later waves wait for earlier ones.
pub const ANNOTATION_WAVE: &str = "previewd.dev/wave";
/// Annotation on pod templates, set by `/preview deploy`: a new value restarts every workload.
pub const ANNOTATION_REDEPLOY: &str = "previewd.dev/redeploy";
/// Annotation on every object previewd applies: SHA-256 of the rendered manifest it was applied
/// from. Kept in the cluster so that a restarted or newly elected previewd knows what it last
/// sent without sending it again (see `cluster::recall`).
pub const ANNOTATION_APPLIED: &str = "previewd.dev/applied";
/// Annotation set just before deleting an environment: why, for the PR comment.
pub const ANNOTATION_DELETION_REASON: &str = "previewd.dev/deletion-reason";
/// Annotation holding previewd's reply to the last comment command (JSON, [`CommandReply`]).
pub const ANNOTATION_LAST_COMMAND: &str = "previewd.dev/last-command";

/// Labels on the records previewd writes into a target cluster: the namespace and name of the
/// environment (or template) they stand for in the hub, and the hub environment's uid.
pub const LABEL_HUB_NAMESPACE: &str = "previewd.dev/hub-namespace";
pub const LABEL_HUB_NAME: &str = "previewd.dev/hub-name";
pub const LABEL_HUB_UID: &str = "previewd.dev/hub-uid";

/// Whether `environment` is a record a hub wrote (it carries [`LABEL_HUB_NAMESPACE`]): its
/// life is the hub's to decide. The previewd of the cluster it runs on deploys it, and neither
/// sweeps it (idle, closed, too old), records its traffic nor wakes it on a request: the hub
/// does those on its own environment, whose spec the record follows.
pub fn is_hub_record(environment: &PreviewEnvironment) -> bool {
    environment.labels().contains_key(LABEL_HUB_NAMESPACE)
}

/// Field manager of the reconciler's server-side applies (the environment's objects).
pub const FIELD_MANAGER_RECONCILE: &str = "previewd";
/// Field manager of the webhook intake's applies of `PreviewEnvironment`s: the controller's
/// status and the lifecycle's fields (sleep) are other managers', so the intake never
/// overwrites them.
pub const FIELD_MANAGER_INTAKE: &str = "previewd-intake";
/// Field manager of the writes comment commands make.
pub const FIELD_MANAGER_COMMANDS: &str = "previewd-commands";
/// Field manager of the check results the webhook intake records (`spec.checks`).
pub const FIELD_MANAGER_CHECKS: &str = "previewd-checks";
/// Field manager of the sweep's own writes (`spec.sleep`).
pub const FIELD_MANAGER_SWEEP: &str = "previewd-sweep";
/// Field manager of the wake gate's wakes (`spec.sleep`, `spec.lastActivity`, the woken-by
/// annotation): who woke an environment shows in its `managedFields`.
pub const FIELD_MANAGER_GATE: &str = "previewd-gate";
/// Field manager of the traffic recorder's writes (`spec.lastActivity`).
pub const FIELD_MANAGER_TRAFFIC: &str = "previewd-traffic";
/// Field manager of the placement (`status.cluster`, written once with the environment's
/// resourceVersion as precondition) and of the records written into target clusters.
pub const FIELD_MANAGER_PLACEMENT: &str = "previewd-placement";

/// The labels previewd puts on every object of `environment`.
pub fn environment_labels(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY.to_string(), "previewd".to_string()),
        (LABEL_ENVIRONMENT.to_string(), environment.name_any()),
        (
            LABEL_ENVIRONMENT_NAMESPACE.to_string(),
            environment.namespace().unwrap_or_default(),
        ),
        (LABEL_TEMPLATE.to_string(), template.name_any()),
    ]
    .into()
}

/// Why the environment is being deleted: what the webhook, the sweep or a command wrote on it,
/// else a deletion by hand.
pub fn deletion_reason(environment: &PreviewEnvironment) -> String {
    environment
        .annotations()
        .get(ANNOTATION_DELETION_REASON)
        .cloned()
        .unwrap_or_else(|| "the PreviewEnvironment was deleted".into())
}

/// previewd's reply to a comment command, as [`ANNOTATION_LAST_COMMAND`] stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    pub command: String,
    pub user: String,
    #[serde(rename = "answer")]
    pub reply: String,
}

/// The reply to the last comment command, as one line of the PR comment.
pub fn last_command_reply(environment: &PreviewEnvironment) -> Option<String> {
    let text = environment.annotations().get(ANNOTATION_LAST_COMMAND)?;
    let reply: CommandReply = serde_json::from_str(text).ok()?;
    Some(format!(
        "`{}` by @{}: {}",
        reply.command,
        quote_user_text(&reply.user),
        reply.reply
    ))
}

/// User text quoted back in a reply: short, and only characters that cannot form Markdown or
/// HTML (a user name or a command argument is the commenter's to choose).
pub fn quote_user_text(text: &str) -> String {
    let clean: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(32)
        .collect();
    if clean.is_empty() { "?".into() } else { clean }
}

/// Whether a key's `prefix` (the part before `/`) is `domain` or one of its subdomains,
/// compared without case: `pod-security.kubernetes.io` is under `kubernetes.io`,
/// `evilkubernetes.io` is not.
pub fn prefix_in_domain(prefix: &str, domain: &str) -> bool {
    let prefix = prefix.to_ascii_lowercase();
    prefix == domain
        || prefix
            .strip_suffix(domain)
            .is_some_and(|sub| sub.ends_with('.'))
}
