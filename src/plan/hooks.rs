//! Objects an engine already rendered (a Helm chart), placed in waves. Helm runs a chart's
//! hooks around its other objects; previewd's waves do the same job:
//!
//! * `pre-install` / `pre-upgrade` hooks go in waves before the chart's other objects, one wave
//!   per distinct `helm.sh/hook-weight`, lightest first (Helm's order);
//! * `post-install` / `post-upgrade` hooks go in waves after them, the same way;
//! * a hook Job is run like a seed: named after its content, so it runs once per content
//!   (Helm re-creates a hook at every upgrade; a preview's commit is one upgrade);
//! * `test`, `pre-delete`, `post-delete`, `pre-rollback` and `post-rollback` hooks are left out:
//!   previewd removes an environment by deleting its namespace and never rolls back.
//!
//! previewd waits for every object of a wave to be healthy before the next, so a pre-install
//! migration Job finishes before the Deployment that needs it starts, as under Helm.

use std::collections::BTreeSet;

use serde_json::Value;

use super::render::{
    LABEL_SEED, RenderError, RenderedObject, parse_documents, seed_job_name, set_label, wave_of,
};
use crate::model::crd::InlineManifest;
use crate::model::naming::slug;

pub const ANNOTATION_HOOK: &str = "helm.sh/hook";
pub const ANNOTATION_HOOK_WEIGHT: &str = "helm.sh/hook-weight";

/// When an object is applied relative to the chart's other objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Main,
    Before(i64),
    After(i64),
    Skipped,
}

/// The objects of already-rendered manifests, each in its wave, hook Jobs as seeds.
pub fn place(rendered: &[InlineManifest]) -> Result<Vec<RenderedObject>, RenderError> {
    let mut staged = Vec::new();
    for manifest in rendered {
        for object in parse_documents(&manifest.name, &manifest.template)? {
            let stage = stage_of(&object);
            if stage != Stage::Skipped {
                staged.push((manifest.name.clone(), stage, object));
            }
        }
    }
    let mut main_waves = Vec::new();
    for (manifest, stage, object) in &staged {
        if *stage == Stage::Main {
            main_waves.push(wave_of(manifest, object)?);
        }
    }
    let first = main_waves.iter().copied().min().unwrap_or(0);
    let last = main_waves.iter().copied().max().unwrap_or(0);
    let weights = |before: bool| -> Vec<i64> {
        let set: BTreeSet<i64> = staged
            .iter()
            .filter_map(|(_, stage, _)| match (stage, before) {
                (Stage::Before(w), true) | (Stage::After(w), false) => Some(*w),
                _ => None,
            })
            .collect();
        set.into_iter().collect()
    };
    let (before, after) = (weights(true), weights(false));
    let rank = |weights: &[i64], weight: i64| -> i32 {
        let index = weights.iter().position(|w| *w == weight).unwrap_or(0);
        i32::try_from(index).unwrap_or(i32::MAX)
    };
    let before_count = i32::try_from(before.len()).unwrap_or(i32::MAX);
    let mut objects = Vec::new();
    for (manifest, stage, mut object) in staged {
        let (wave, hook) = match stage {
            Stage::Main => (wave_of(&manifest, &object)?, false),
            Stage::Before(weight) => (
                first
                    .saturating_sub(before_count)
                    .saturating_add(rank(&before, weight)),
                true,
            ),
            Stage::After(weight) => (
                last.saturating_add(1).saturating_add(rank(&after, weight)),
                true,
            ),
            Stage::Skipped => continue,
        };
        let seed = (hook && object["kind"] == "Job").then(|| {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            object["metadata"]["name"] = Value::String(seed_job_name(&name, &object));
            // A Job's name may be longer than a label value (63 characters) may be.
            let mut label = slug(&name);
            label.truncate(63);
            let label = label.trim_end_matches('-').to_string();
            set_label(&mut object, LABEL_SEED, &label);
            label
        });
        objects.push(RenderedObject {
            manifest,
            wave,
            seed,
            object,
        });
    }
    Ok(objects)
}

fn stage_of(object: &Value) -> Stage {
    let annotations = &object["metadata"]["annotations"];
    let Some(hooks) = annotations[ANNOTATION_HOOK].as_str() else {
        return Stage::Main;
    };
    // Helm reads an unreadable weight as 0.
    let weight = annotations[ANNOTATION_HOOK_WEIGHT]
        .as_str()
        .and_then(|w| w.trim().parse::<i64>().ok())
        .unwrap_or(0);
    let events: Vec<&str> = hooks.split(',').map(str::trim).collect();
    let has = |names: [&str; 2]| events.iter().any(|e| names.contains(e));
    if has(["pre-install", "pre-upgrade"]) {
        Stage::Before(weight)
    } else if has(["post-install", "post-upgrade"]) {
        Stage::After(weight)
    } else {
        Stage::Skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, name: &str, hook: Option<(&str, &str)>) -> String {
        let annotations = hook
            .map(|(h, w)| {
                format!("  annotations:\n    helm.sh/hook: {h}\n    helm.sh/hook-weight: \"{w}\"\n")
            })
            .unwrap_or_default();
        format!("---\napiVersion: v1\nkind: {kind}\nmetadata:\n  name: {name}\n{annotations}")
    }

    #[test]
    fn hooks_go_in_waves_around_the_chart_by_weight_and_jobs_run_once_per_content() {
        let text = [
            object("Deployment", "web", None),
            object("Job", "migrate", Some(("pre-install,pre-upgrade", "5"))),
            object("ConfigMap", "settings", Some(("pre-install", "-1"))),
            object("Job", "warm-cache", Some(("post-install", "0"))),
            object("Pod", "web-test", Some(("test", "0"))),
            object("Job", "backup", Some(("pre-delete", "0"))),
        ]
        .concat();
        let placed = place(&[InlineManifest {
            name: "web/templates/all.yaml".into(),
            template: text,
        }])
        .unwrap();
        let found: Vec<(&str, i32, Option<&str>)> = placed
            .iter()
            .map(|o| (o.kind(), o.wave, o.seed.as_deref()))
            .collect();
        assert_eq!(
            found,
            [
                ("Deployment", 0, None),
                ("Job", -1, Some("migrate")),
                ("ConfigMap", -2, None),
                ("Job", 1, Some("warm-cache")),
            ],
            "test and delete hooks are left out"
        );
        assert!(
            placed[1].name().starts_with("seed-migrate-"),
            "{}",
            placed[1].name()
        );
        assert_eq!(placed[2].name(), "settings", "only Jobs are renamed");
        let long_name = "a".repeat(70);
        let placed = place(&[InlineManifest {
            name: "x".into(),
            template: object("Job", &long_name, Some(("pre-install", "0"))),
        }])
        .unwrap();
        assert_eq!(
            placed[0].seed.as_deref(),
            Some("a".repeat(63).as_str()),
            "a valid label value"
        );
    }

    #[test]
    fn hostile_waves_and_weights_do_not_overflow() {
        let text = format!(
            "{}  annotations:\n    previewd.dev/wave: \"2147483647\"\n{}",
            object("Service", "web", None),
            object(
                "Job",
                "after",
                Some(("post-install", "99999999999999999999"))
            )
        );
        let placed = place(&[InlineManifest {
            name: "x".into(),
            template: text,
        }])
        .unwrap();
        assert_eq!(placed[1].wave, i32::MAX);
    }
}
