//! A commit whose render exhausted a render worker or an engine (its memory or output limit) is
//! set aside: the environment's status remembers the commit, the template's generation and the
//! engines' memory limit (`status.quarantine`), and no replica renders that commit again, not
//! after a restart nor after a failover, until one of them changes. (A timeout is not set
//! aside: it may be the node's load; the render worker refuses the same input again at once
//! in the same process, `engines::worker`.) The render ran in
//! a child process, so previewd itself never died on it; setting it aside keeps one hostile
//! commit from taking a render turn every resync that other templates' environments wait for.
//! The commit deployed before keeps running.

use chrono::Utc;
use kube::ResourceExt;

use super::error::{Refusal, RefusalReason};
use crate::model::crd::{PreviewEnvironment, PreviewTemplate, Quarantine};

/// The refusal for an environment whose head commit is set aside with this template and the
/// engines' `memory_limit`, before anything is read or rendered; `None` when it is not.
pub fn set_aside(
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    memory_limit: u64,
) -> Option<Refusal> {
    let quarantine = environment.status.as_ref()?.quarantine.as_ref()?;
    let same = quarantine.commit == environment.spec.source.head_sha
        && quarantine.template_generation == template.metadata.generation
        && quarantine.memory_limit == Some(memory_limit);
    same.then(|| Refusal {
        quarantine: Some(Box::new(quarantine.clone())),
        ..Refusal::new(RefusalReason::RenderFailed, quarantine.message.clone())
    })
}

/// Completes a render refusal that sets the commit aside with the commit, the template's
/// generation and the engines' memory limit (and when); other refusals pass unchanged.
pub fn record(
    mut refusal: Refusal,
    environment: &PreviewEnvironment,
    template: &PreviewTemplate,
    memory_limit: u64,
) -> Refusal {
    if let Some(quarantine) = refusal.quarantine.as_mut() {
        **quarantine = Quarantine {
            commit: environment.spec.source.head_sha.clone(),
            template_generation: template.metadata.generation,
            memory_limit: Some(memory_limit),
            message: std::mem::take(&mut quarantine.message),
            since: Utc::now(),
        };
        tracing::warn!(
            environment = %environment.name_any(),
            commit = %quarantine.commit,
            "set aside: its render exhausted a render worker or an engine; not rendered again until the commit or the template changes"
        );
    }
    refusal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewEnvironmentStatus;

    fn environment(head: &str, quarantine: Option<Quarantine>) -> PreviewEnvironment {
        let mut environment: PreviewEnvironment = serde_json::from_value(serde_json::json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
            "metadata": {"name": "web-pr-1", "namespace": "team"},
            "spec": {"template": "web", "source": {"repository": "org/web", "branch": "b",
                     "pullRequest": 1, "headSha": head}}
        }))
        .unwrap();
        environment.status = Some(PreviewEnvironmentStatus {
            quarantine,
            ..Default::default()
        });
        environment
    }

    fn template(generation: i64) -> PreviewTemplate {
        let mut template: PreviewTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewTemplate",
            "metadata": {"name": "web", "namespace": "team"},
            "spec": {"forge": {"kind": "github", "repository": "org/web"},
                     "url": {"host": "{{ slug }}.preview.example.com"},
                     "manifests": {"inline": []}}
        }))
        .unwrap();
        template.metadata.generation = Some(generation);
        template
    }

    #[test]
    fn a_commit_is_set_aside_until_the_commit_the_template_or_the_limit_changes() {
        let exhausted = Refusal {
            quarantine: Some(Box::new(Quarantine {
                message: "helm needed more than 384 MiB".into(),
                ..Default::default()
            })),
            ..Refusal::new(RefusalReason::RenderFailed, "helm needed more than 384 MiB")
        };
        let limit = 384 << 20;
        let recorded = record(exhausted, &environment("aaa", None), &template(3), limit);
        let quarantine = *recorded.quarantine.unwrap();
        assert_eq!(quarantine.commit, "aaa");
        assert_eq!(quarantine.template_generation, Some(3));

        let same = environment("aaa", Some(quarantine.clone()));
        let refused =
            set_aside(&same, &template(3), limit).expect("the same commit is not rendered");
        assert_eq!(refused.message, "helm needed more than 384 MiB");
        assert_eq!(
            refused.quarantine.as_deref(),
            Some(&quarantine),
            "and stays set aside"
        );
        let other_commit = environment("bbb", Some(quarantine.clone()));
        assert!(set_aside(&other_commit, &template(3), limit).is_none());
        assert!(set_aside(&same, &template(4), limit).is_none());
        assert!(
            set_aside(&same, &template(3), limit * 2).is_none(),
            "a raised limit"
        );
        let ordinary = record(
            Refusal::new(RefusalReason::PolicyRejected, "no"),
            &same,
            &template(3),
            limit,
        );
        assert!(ordinary.quarantine.is_none());
    }
}
