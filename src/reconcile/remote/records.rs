//! The records the hub writes into a target cluster's namespace, and the hub environment's
//! status read back from them. Pure: no client.
//!
//! A template's record carries none of the template's credentials (forge token, GitHub App,
//! webhook secret) and no placement: the target's previewd deploys it without reporting to the
//! forge (the hub reports, once) and never places further.

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::model::crd::{
    ClusterOfEnvironment, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate,
};
use crate::model::metadata::{LABEL_HUB_NAME, LABEL_HUB_NAMESPACE, LABEL_HUB_UID};
use crate::model::naming::record_name;

/// The template's record in `namespace` of the target.
pub fn template_record(template: &PreviewTemplate, namespace: &str) -> PreviewTemplate {
    let hub_namespace = template.namespace().unwrap_or_default();
    let name = record_name("template", &hub_namespace, &template.name_any());
    let mut spec = template.spec.clone();
    spec.forge.token_secret_ref = None;
    spec.forge.github_app = None;
    spec.forge.webhook_secret_ref = None;
    spec.placement = None;
    let mut record = PreviewTemplate::new(&name, spec);
    record.metadata.namespace = Some(namespace.to_string());
    record.metadata.labels = Some(
        [
            (LABEL_HUB_NAMESPACE.to_string(), hub_namespace),
            (LABEL_HUB_NAME.to_string(), template.name_any()),
        ]
        .into(),
    );
    record
}

/// The environment's record in `namespace` of the target, made from the template's record.
pub fn environment_record(
    environment: &PreviewEnvironment,
    template_record: &PreviewTemplate,
    namespace: &str,
) -> PreviewEnvironment {
    let hub_namespace = environment.namespace().unwrap_or_default();
    let name = record_name("environment", &hub_namespace, &environment.name_any());
    let mut spec = environment.spec.clone();
    spec.template = template_record.name_any();
    // The order of deliveries is the hub's (its intake and its API server's rule on
    // `spec.source`). On the target the record has one writer, the hub, which must always be
    // able to write it: with `changedAt` copied, a record whose time is ahead of the hub's (a
    // GitLab push that carries none, then a late merge-request delivery; a hand edit) would be
    // refused by the target's rule on every try.
    spec.source.changed_at = None;
    let mut record = PreviewEnvironment::new(&name, spec);
    record.metadata.namespace = Some(namespace.to_string());
    let mut labels = environment.labels().clone();
    labels.insert(LABEL_HUB_NAMESPACE.to_string(), hub_namespace);
    labels.insert(LABEL_HUB_NAME.to_string(), environment.name_any());
    labels.insert(
        LABEL_HUB_UID.to_string(),
        environment.uid().unwrap_or_default(),
    );
    record.metadata.labels = Some(labels);
    record
}

/// Whether the live record already says what `wanted` says (its spec, and its labels among
/// the live ones): then nothing is written.
pub fn already_says<K, S>(live: Option<&K>, wanted: &K, spec: fn(&K) -> &S) -> bool
where
    K: kube::Resource,
    S: PartialEq,
{
    live.is_some_and(|live| {
        spec(live) == spec(wanted)
            && wanted
                .labels()
                .iter()
                .all(|(key, value)| live.labels().get(key) == Some(value))
    })
}

/// Whether the cluster answers, as the hub environment's status says it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reach {
    Answers,
    /// It has not answered since then.
    Silent(DateTime<Utc>),
}

/// The hub environment's status: what the target's record says (its phase, URL, objects,
/// timings; before the target's previewd wrote any, what the hub said before), with the
/// cluster and whether it answers. The hub's own forge record stays the hub's.
/// `record_says_spec`: the record already holds the environment's spec (nothing was written
/// to it now); only then can its status describe the environment's generation.
pub fn mirrored_status(
    environment: &PreviewEnvironment,
    record: Option<&PreviewEnvironment>,
    cluster: &str,
    reach: Reach,
    record_says_spec: bool,
) -> PreviewEnvironmentStatus {
    let previous = environment.status.clone().unwrap_or_default();
    let seen = match (reach, record.and_then(|r| r.status.clone())) {
        (Reach::Answers, Some(status)) => PreviewEnvironmentStatus {
            observed_generation: if record_says_spec && record_is_current(record) {
                environment.metadata.generation
            } else {
                previous.observed_generation
            },
            // The URL goes into the PR comment: only a plain http(s) address, whoever wrote
            // the record's status there.
            url: status.url.filter(|url| is_plain_url(url)),
            ..status
        },
        // Silent, or not deployed there yet: the last sight stays.
        _ => previous.clone(),
    };
    PreviewEnvironmentStatus {
        cluster: Some(ClusterOfEnvironment {
            name: cluster.to_string(),
            reachable: reach == Reach::Answers,
            unreachable_since: match reach {
                Reach::Answers => None,
                Reach::Silent(since) => Some(since),
            },
        }),
        forge: previous.forge,
        ..seen
    }
}

/// `http(s)://` and then only what a host, a port and a path are made of: nothing that
/// Markdown or HTML would read as more than a link.
fn is_plain_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~:/%?=&#+@".contains(c))
    })
}

/// Whether the target's previewd has reconciled the record's current spec.
fn record_is_current(record: Option<&PreviewEnvironment>) -> bool {
    record.is_some_and(|r| {
        r.status.as_ref().and_then(|s| s.observed_generation) == r.metadata.generation
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{Phase, SecretKeyRef};

    fn template() -> PreviewTemplate {
        let mut template: PreviewTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": "app", "namespace": "team-a"},
            "spec": {"forge": {"kind": "github", "repository": "o/r",
                               "tokenSecretRef": {"name": "forge", "key": "token"},
                               "webhookSecretRef": {"name": "hook", "key": "secret"}},
                     "manifests": {"inline": [{"name": "a.yaml", "template": "kind: ConfigMap"}]},
                     "placement": {"clusterSelector": {"region": "eu"}}}
        }))
        .unwrap();
        template.spec.forge.github_app = Some(crate::model::crd::GithubApp {
            app_id: 1,
            private_key_secret_ref: SecretKeyRef {
                name: "app".into(),
                key: "key".into(),
            },
        });
        template
    }

    #[test]
    fn a_templates_record_carries_none_of_its_credentials_and_no_placement() {
        let record = template_record(&template(), "previewd-records");
        let forge = &record.spec.forge;
        assert!(forge.token_secret_ref.is_none());
        assert!(forge.github_app.is_none());
        assert!(forge.webhook_secret_ref.is_none());
        assert!(record.spec.placement.is_none());
        assert_eq!(record.namespace().as_deref(), Some("previewd-records"));
        // Two hub namespaces' templates of one name are two records.
        let mut other = template();
        other.metadata.namespace = Some("team-b".into());
        assert_ne!(
            record.name_any(),
            template_record(&other, "previewd-records").name_any()
        );
    }

    #[test]
    fn a_silent_cluster_keeps_the_last_sight_and_says_so() {
        let mut environment = PreviewEnvironment::new("app-pr-1", Default::default());
        environment.metadata.namespace = Some("team-a".into());
        environment.status = Some(PreviewEnvironmentStatus {
            phase: Phase::Ready,
            url: Some("https://app-pr-1.example".into()),
            ..Default::default()
        });
        let since = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let mut record = environment.clone();
        record.status = Some(PreviewEnvironmentStatus {
            phase: Phase::Degraded,
            ..Default::default()
        });
        let status = mirrored_status(
            &environment,
            Some(&record),
            "eu",
            Reach::Silent(since),
            true,
        );
        assert_eq!(status.phase, Phase::Ready);
        assert_eq!(status.url.as_deref(), Some("https://app-pr-1.example"));
        let cluster = status.cluster.unwrap();
        assert!(!cluster.reachable);
        assert_eq!(cluster.unreachable_since, Some(since));
        // Answering, the record's status is the environment's.
        let status = mirrored_status(&environment, Some(&record), "eu", Reach::Answers, true);
        assert_eq!(status.phase, Phase::Degraded);
        // But for a URL that would be more than a link in the PR comment.
        for (url, kept) in [
            ("https://app-pr-1.preview.example.com/", true),
            ("http://app-pr-1.preview.example.com:8080/x?y=1", true),
            ("https://x.example](https://evil.example) **click**", false),
            ("javascript:alert(1)", false),
            ("https://<img src=x>", false),
        ] {
            record.status.as_mut().unwrap().url = Some(url.to_string());
            let status = mirrored_status(&environment, Some(&record), "eu", Reach::Answers, true);
            assert_eq!(status.url.is_some(), kept, "{url}");
        }
    }
}
