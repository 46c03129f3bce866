//! Which registered cluster a new environment goes to: the one with the most room among those
//! its template selects, that admit the template's namespace and answer. Pure: the reconciler
//! gives it the clusters and what is placed on each; the decision is then written into the API
//! (the environment's `status.cluster`) and never taken again.

use std::collections::BTreeMap;

use super::crd::{Placement, PreviewCluster};

/// A registered cluster as placement sees it.
pub struct Candidate<'a> {
    pub cluster: &'a PreviewCluster,
    /// Environments placed on it (those being removed included: they still hold their place).
    pub placed: u32,
    /// Whether its API server answered the last look.
    pub reachable: bool,
}

/// Where a new environment goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// The cluster with the most room (ties: the first by name).
    On(String),
    /// Every cluster it may use (`selected` of them) is full or does not answer: it waits.
    Full { selected: usize },
    /// No registered cluster matches the selector and admits the namespace.
    NoneSelected,
}

/// The clusters `placement` selects for a template in `namespace`.
pub fn selected<'c, 'a>(
    placement: &Placement,
    namespace: &str,
    candidates: &'c [Candidate<'a>],
) -> Vec<&'c Candidate<'a>> {
    candidates
        .iter()
        .filter(|c| c.cluster.spec.admits(namespace))
        .filter(|c| labels_hold(&placement.cluster_selector, c.cluster))
        .collect()
}

/// Chooses for a new environment of a template in `namespace`, with `ahead` environments
/// waiting before it for the same clusters: it is placed only if the room left is more than
/// they need, so that a slot freed goes to the one that waited longest.
pub fn choose(
    placement: &Placement,
    namespace: &str,
    candidates: &[Candidate<'_>],
    ahead: u32,
) -> Choice {
    let selected = selected(placement, namespace, candidates);
    if selected.is_empty() {
        return Choice::NoneSelected;
    }
    let room = |c: &Candidate<'_>| c.cluster.spec.capacity.saturating_sub(c.placed);
    let usable: Vec<&&Candidate<'_>> = selected
        .iter()
        .filter(|c| c.reachable && room(c) > 0)
        .collect();
    let room_left = usable
        .iter()
        .fold(0u32, |total, c| total.saturating_add(room(c)));
    if room_left <= ahead {
        return Choice::Full {
            selected: selected.len(),
        };
    }
    let best = usable.into_iter().max_by(|a, b| {
        room(a)
            .cmp(&room(b))
            // The first by name wins a tie: max_by keeps the last of equals.
            .then_with(|| b.cluster_name().cmp(a.cluster_name()))
    });
    match best {
        Some(candidate) => Choice::On(candidate.cluster_name().to_string()),
        None => Choice::Full {
            selected: selected.len(),
        },
    }
}

impl Candidate<'_> {
    fn cluster_name(&self) -> &str {
        self.cluster.metadata.name.as_deref().unwrap_or_default()
    }
}

fn labels_hold(selector: &BTreeMap<String, String>, cluster: &PreviewCluster) -> bool {
    let labels = cluster.metadata.labels.clone().unwrap_or_default();
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::PreviewClusterSpec;

    fn cluster(name: &str, region: &str, capacity: u32, namespaces: &[&str]) -> PreviewCluster {
        let mut cluster = PreviewCluster::new(
            name,
            PreviewClusterSpec {
                namespace: "previewd-records".into(),
                capacity,
                template_namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            },
        );
        cluster.metadata.labels = Some([("region".to_string(), region.to_string())].into());
        cluster
    }

    fn selecting(region: Option<&str>) -> Placement {
        Placement {
            cluster_selector: region
                .map(|r| [("region".to_string(), r.to_string())].into())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn the_cluster_with_the_most_room_is_chosen_and_ties_go_by_name() {
        let (a, b) = (
            cluster("a", "eu", 10, &["*"]),
            cluster("b", "eu", 10, &["*"]),
        );
        let candidates = |placed_a, placed_b| {
            vec![
                Candidate {
                    cluster: &a,
                    placed: placed_a,
                    reachable: true,
                },
                Candidate {
                    cluster: &b,
                    placed: placed_b,
                    reachable: true,
                },
            ]
        };
        let choose_now = |placed_a, placed_b| {
            choose(&selecting(None), "team", &candidates(placed_a, placed_b), 0)
        };
        assert_eq!(choose_now(0, 0), Choice::On("a".into()));
        assert_eq!(choose_now(3, 2), Choice::On("b".into()));
        assert_eq!(choose_now(9, 10), Choice::On("a".into()));
        assert_eq!(choose_now(10, 10), Choice::Full { selected: 2 });
    }

    #[test]
    fn a_cluster_that_does_not_answer_gets_nothing_new() {
        let (a, b) = (
            cluster("a", "eu", 10, &["*"]),
            cluster("b", "eu", 10, &["*"]),
        );
        let candidates = [
            Candidate {
                cluster: &a,
                placed: 0,
                reachable: false,
            },
            Candidate {
                cluster: &b,
                placed: 9,
                reachable: true,
            },
        ];
        assert_eq!(
            choose(&selecting(None), "team", &candidates, 0),
            Choice::On("b".into())
        );
        // Those waiting first keep the last slot.
        assert_eq!(
            choose(&selecting(None), "team", &candidates, 1),
            Choice::Full { selected: 2 }
        );
        // Room for those ahead and this one, over two clusters.
        let both = [
            Candidate {
                cluster: &a,
                placed: 9,
                reachable: true,
            },
            Candidate {
                cluster: &b,
                placed: 8,
                reachable: true,
            },
        ];
        assert_eq!(
            choose(&selecting(None), "team", &both, 2),
            Choice::On("b".into())
        );
        assert_eq!(
            choose(&selecting(None), "team", &both, 3),
            Choice::Full { selected: 2 }
        );
    }

    #[test]
    fn only_clusters_the_selector_names_and_that_admit_the_namespace_are_used() {
        let eu = cluster("eu", "eu", 10, &["team-a"]);
        let us = cluster("us", "us", 100, &["*"]);
        let candidates = [
            Candidate {
                cluster: &eu,
                placed: 0,
                reachable: true,
            },
            Candidate {
                cluster: &us,
                placed: 0,
                reachable: true,
            },
        ];
        assert_eq!(
            choose(&selecting(Some("eu")), "team-a", &candidates, 0),
            Choice::On("eu".into())
        );
        // Another team's template selecting the same labels: the cluster does not admit it.
        assert_eq!(
            choose(&selecting(Some("eu")), "team-b", &candidates, 0),
            Choice::NoneSelected
        );
        // A cluster with no namespaces listed admits none.
        let closed = cluster("closed", "eu", 10, &[]);
        let only_closed = [Candidate {
            cluster: &closed,
            placed: 0,
            reachable: true,
        }];
        assert_eq!(
            choose(&selecting(None), "team-a", &only_closed, 0),
            Choice::NoneSelected
        );
    }
}
