//! One URL host, one environment (pure). Two environments of one template can render the same
//! host: a pull request and a branch environment of the same branch (both use its slug), or a
//! fork's `main` and the repository's. Two Ingresses for one host are merged by most ingress
//! controllers, so each would take the other's traffic. The environment that claimed the host
//! first keeps it: an environment claims a host by recording it in `status.host` once planned,
//! and one whose host another environment holds is refused (`HostTaken`) before anything is
//! applied. Two that recorded it at once (a narrow race) are ordered by age: the older keeps it.

use crate::model::crd::PreviewEnvironment;

/// The environment among `others` that holds `host` before `environment` may: one that holds
/// it while `environment` does not, or one that holds it too and is older.
pub fn taken_by<'a>(
    environment: &PreviewEnvironment,
    host: &str,
    others: impl IntoIterator<Item = &'a PreviewEnvironment>,
) -> Option<&'a PreviewEnvironment> {
    let holds_first = holds_before(environment, host);
    others.into_iter().find(|other| holds_first(other))
}

/// Whether another environment holds `host` before `environment` may ([`taken_by`]'s test of
/// each), for a search in place (the controller's cache).
pub fn holds_before<'a>(
    environment: &'a PreviewEnvironment,
    host: &'a str,
) -> impl Fn(&PreviewEnvironment) -> bool + 'a {
    let i_hold = holds(environment, host);
    move |other| {
        other.metadata.uid != environment.metadata.uid
            && other.metadata.deletion_timestamp.is_none()
            && holds(other, host)
            && (!i_hold || other.age() < environment.age())
    }
}

/// The URL host, or one of the extra Ingress hosts, `environment` claimed.
fn holds(environment: &PreviewEnvironment, host: &str) -> bool {
    environment.status.as_ref().is_some_and(|status| {
        status
            .host
            .iter()
            .chain(&status.extra_hosts)
            .any(|held| held.eq_ignore_ascii_case(host))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn environment(name: &str, created: &str, host: Option<&str>) -> PreviewEnvironment {
        serde_json::from_value(json!({
            "apiVersion": "previewd.dev/v1alpha1", "kind": "PreviewEnvironment",
            "metadata": {"name": name, "namespace": "team", "uid": name, "creationTimestamp": created},
            "spec": {"template": "web", "source": {"repository": "o/r", "branch": "main", "headSha": "abc"}},
            "status": {"host": host},
        }))
        .unwrap()
    }

    #[test]
    fn the_first_to_claim_a_host_keeps_it() {
        let branch = environment(
            "web-main",
            "2026-11-26T10:00:00Z",
            Some("main.preview.example.com"),
        );
        let pull = environment("web-pr-7", "2026-11-25T10:00:00Z", None);
        let others = [branch.clone()];
        let owner = taken_by(&pull, "main.preview.example.com", &others);
        assert_eq!(
            owner.and_then(|o| o.metadata.name.as_deref()),
            Some("web-main"),
            "older, but the branch holds it"
        );
        assert!(taken_by(&branch, "main.preview.example.com", &[pull]).is_none());
    }

    #[test]
    fn two_that_claimed_at_once_are_ordered_by_age() {
        let older = environment("a", "2026-11-25T10:00:00Z", Some("x.example.com"));
        let younger = environment("b", "2026-11-26T10:00:00Z", Some("X.example.com"));
        assert!(taken_by(&older, "x.example.com", [&younger]).is_none());
        assert!(taken_by(&younger, "x.example.com", [&older]).is_some());
    }

    #[test]
    fn itself_other_hosts_and_environments_being_deleted_do_not_count() {
        let me = environment("a", "2026-11-26T10:00:00Z", Some("x.example.com"));
        let other_host = environment("b", "2026-11-25T10:00:00Z", Some("y.example.com"));
        let mut leaving = environment("c", "2026-11-25T10:00:00Z", Some("x.example.com"));
        leaving.metadata.deletion_timestamp = me.metadata.creation_timestamp.clone();
        assert!(taken_by(&me, "x.example.com", [&me, &other_host, &leaving]).is_none());
    }
}
