//! When an environment is looked at again: the requeue after a reconcile, and the clock of
//! the slow full re-apply (`--reapply-interval`), which bypasses the apply cache.

use std::time::{Duration, Instant};

use super::checks::Held;
use super::context::{Context, EnvironmentRef};
use crate::model::crd::Phase;

/// When to look at the environment again after a reconcile that left it in `phase`: a
/// settled one at the resync (or its full re-apply, if sooner), one on its way within 30 s
/// (the watch triggers a reconcile when its objects change; this is only a safety net), and a
/// held commit at its checks' next look.
pub(super) fn requeue_after(
    phase: Phase,
    held: Option<&Held>,
    context: &Context,
    key: &EnvironmentRef,
) -> Duration {
    let requeue = match phase {
        Phase::Ready | Phase::Degraded | Phase::Sleeping => {
            // A full re-apply falls due at its own time, not at the next resync after it.
            let reapply = reapply_left(context, key).unwrap_or(Duration::MAX);
            context.config.resync_interval.min(reapply)
        }
        _ => Duration::from_secs(30).min(context.config.resync_interval),
    };
    match held.and_then(|h| h.recheck) {
        Some(recheck) => requeue.min(recheck),
        None => requeue,
    }
}

/// Whether the slow periodic full re-apply is due: then the apply cache is bypassed. The clock
/// of an environment starts at its first reconcile, set back by a spread that its name picks
/// (up to one interval): a restarted previewd meets all environments at once, and their full
/// re-applies must not all fall due together.
pub(super) fn reapply_due(context: &Context, key: &EnvironmentRef) -> bool {
    let Some(interval) = context.config.reapply_interval else {
        return false;
    };
    match context.memory.last_full_apply(key) {
        None => {
            let started = Instant::now();
            let spread = reapply_spread(key, interval);
            let clock = started.checked_sub(spread).unwrap_or(started);
            context.memory.note_full_apply(key, clock);
            false
        }
        Some(at) => at.elapsed() >= interval,
    }
}

/// How long until the environment's next full re-apply (`None` without `--reapply-interval`,
/// or before its first reconcile); at least a second, so a due re-apply that failed is not
/// retried in a loop.
fn reapply_left(context: &Context, key: &EnvironmentRef) -> Option<Duration> {
    let interval = context.config.reapply_interval?;
    let last = context.memory.last_full_apply(key)?;
    let left = interval.saturating_sub(last.elapsed());
    Some(left.max(Duration::from_secs(1)))
}

/// A fraction of `interval` that depends only on the environment's name: the same in every
/// replica and every run, different between environments.
fn reapply_spread(key: &EnvironmentRef, interval: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let fraction = (hasher.finish() % 1024) as f64 / 1024.0;
    interval.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::ObjectRef;

    #[test]
    fn full_reapplies_of_many_environments_are_spread_over_the_interval() {
        let interval = Duration::from_secs(3600);
        let spreads: Vec<Duration> = (0..200)
            .map(|n| {
                reapply_spread(
                    &ObjectRef::new(&format!("pr-{n}")).within("previews"),
                    interval,
                )
            })
            .collect();
        assert!(spreads.iter().all(|s| *s < interval));
        let first_quarter = spreads.iter().filter(|s| **s < interval / 4).count();
        assert!(
            (25..=75).contains(&first_quarter),
            "{first_quarter} of 200 fall in the first quarter"
        );
    }
}
