//! The cluster's StorageClasses, as far as the content policy needs them: which keep a volume
//! after its claim is gone (`reclaimPolicy: Retain`), and which one a claim that names no class
//! gets. A pull request's claim on such a class leaves a PersistentVolume, and its disk, behind
//! every environment removed: nothing in the namespace holds it any more, nobody deletes it.
//!
//! Read only when a plan has claims, and kept for a minute: the classes change when an
//! operator installs a provisioner, not between two reconciles.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Mutex;

/// The annotations that mark the cluster's default class (the beta one is still honoured).
const DEFAULT_CLASS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];
/// How long a listing is used before it is read again.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// What the classes do with a volume once its claim is deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reclaim {
    /// Classes whose volumes outlive their claims.
    pub retaining: BTreeSet<String>,
    /// The class a claim without `storageClassName` gets, if the cluster names one.
    pub default_class: Option<String>,
}

impl Reclaim {
    /// Reads `classes` as the API server holds them.
    pub fn of(classes: &[StorageClass]) -> Self {
        let retaining = classes
            .iter()
            .filter(|class| class.reclaim_policy.as_deref() == Some("Retain"))
            .map(|class| class.name_any())
            .collect();
        // Of several default classes Kubernetes gives a claim the newest.
        let default_class = classes
            .iter()
            .filter(|class| {
                DEFAULT_CLASS
                    .iter()
                    .any(|key| class.annotations().get(*key).map(String::as_str) == Some("true"))
            })
            .max_by_key(|class| class.metadata.creation_timestamp.clone().map(|t| t.0))
            .map(|class| class.name_any());
        Self {
            retaining,
            default_class,
        }
    }

    /// The class a claim asking for `class` (`None`: it names none) gets, if that class keeps
    /// its volumes after the claim is gone.
    pub fn retaining_class<'a>(&'a self, class: Option<&'a str>) -> Option<&'a str> {
        let class = class.or(self.default_class.as_deref())?;
        self.retaining.contains(class).then_some(class)
    }
}

/// The StorageClasses, listed when asked and kept for [`FRESH_FOR`].
pub struct StorageClasses {
    client: Client,
    listed: Mutex<Option<(Instant, Reclaim)>>,
}

impl StorageClasses {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            listed: Mutex::new(None),
        }
    }

    /// What the classes do with volumes, read again once the last listing is a minute old.
    pub async fn reclaim(&self) -> Result<Reclaim, kube::Error> {
        let mut listed = self.listed.lock().await;
        if let Some((at, reclaim)) = listed.as_ref()
            && at.elapsed() < FRESH_FOR
        {
            return Ok(reclaim.clone());
        }
        let classes = Api::<StorageClass>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        let reclaim = Reclaim::of(&classes.items);
        *listed = Some((Instant::now(), reclaim.clone()));
        Ok(reclaim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, policy: Option<&str>, default: bool) -> StorageClass {
        let mut class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "provisioner": "example.com/disk"
        }))
        .unwrap();
        class.reclaim_policy = policy.map(str::to_string);
        if default {
            class
                .annotations_mut()
                .insert(DEFAULT_CLASS[0].into(), "true".into());
        }
        class
    }

    #[test]
    fn retaining_classes_and_the_default_one_are_read() {
        let reclaim = Reclaim::of(&[
            class("kept", Some("Retain"), true),
            class("standard", Some("Delete"), false),
            class("unsaid", None, false),
        ]);
        assert_eq!(reclaim.retaining_class(Some("kept")), Some("kept"));
        assert_eq!(
            reclaim.retaining_class(None),
            Some("kept"),
            "the default retains"
        );
        assert_eq!(reclaim.retaining_class(Some("standard")), None);
        assert_eq!(
            reclaim.retaining_class(Some("unsaid")),
            None,
            "Delete by default"
        );
        assert_eq!(reclaim.retaining_class(Some("absent")), None);
        let no_default = Reclaim::of(&[class("kept", Some("Retain"), false)]);
        assert_eq!(no_default.retaining_class(None), None);
        // The beta annotation counts, and of two defaults the newest is the claim's.
        let mut beta = class("kept", Some("Retain"), false);
        beta.annotations_mut()
            .insert(DEFAULT_CLASS[1].into(), "true".into());
        let stamp = |second| {
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
            ))
        };
        beta.metadata.creation_timestamp = stamp(2_000);
        let mut older = class("standard", Some("Delete"), true);
        older.metadata.creation_timestamp = stamp(1_000);
        let two = Reclaim::of(&[older, beta]);
        assert_eq!(two.retaining_class(None), Some("kept"));
    }
}
