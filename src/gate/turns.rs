//! How often requests may wake one environment: at most once per [`WAKE_INTERVAL`] while it
//! sleeps (in each replica of previewd: every replica runs a gate). A flood of requests to a
//! sleeping host sends one write to the API server; the rest get the waiting page from memory.
//! A turn is taken at the environment's generation (its spec's version); once the environment
//! is put to sleep again (by the sweep or a writer's command, never by a request) its generation
//! is higher and the first request wakes it at once. A wake that failed ends its turn after
//! [`RETRY_AFTER_FAILURE`] instead, so an API server that refuses does not get a write per
//! request. The record is bounded: beyond [`MAX_REMEMBERED`] environments, turns that have run
//! out are forgotten first, and only environments that exist are ever recorded.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The least time between two wakes of one environment by requests.
pub const WAKE_INTERVAL: Duration = Duration::from_secs(30);
/// After a failed wake, the next request may try again this much later.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// Environments whose last wake is remembered before old turns are dropped.
const MAX_REMEMBERED: usize = 4096;

/// A wake sent: until when it holds, and at which generation of the environment.
#[derive(Clone, Copy)]
struct Turn {
    until: Instant,
    generation: i64,
}

/// The last wake by request of each environment (`namespace/name`).
#[derive(Default)]
pub struct WakeTurns {
    last: Mutex<HashMap<(String, String), Turn>>,
}

impl WakeTurns {
    /// Whether a request at `now` may wake environment `namespace/name`, asleep at
    /// `generation`; if it may, its turn is taken.
    pub fn take(&self, namespace: &str, name: &str, generation: i64, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (namespace.to_string(), name.to_string());
        if let Some(turn) = last.get(&key)
            && turn.generation >= generation
            && now < turn.until
        {
            return false;
        }
        if last.len() >= MAX_REMEMBERED {
            last.retain(|_, turn| now < turn.until);
        }
        if last.len() >= MAX_REMEMBERED {
            // Every remembered turn is still running: wait for one to run out.
            return false;
        }
        let until = now + WAKE_INTERVAL;
        last.insert(key, Turn { until, generation });
        true
    }

    /// The turn just taken was not used (the client was over its wake budget): the next
    /// request may take it.
    pub fn give_back(&self, namespace: &str, name: &str) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.remove(&(namespace.to_string(), name.to_string()));
    }

    /// The wake of this turn failed: the turn ends [`RETRY_AFTER_FAILURE`] after `now`.
    pub fn failed(&self, namespace: &str, name: &str, now: Instant) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(turn) = last.get_mut(&(namespace.to_string(), name.to_string())) {
            turn.until = turn.until.min(now + RETRY_AFTER_FAILURE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_wake_per_environment_per_interval() {
        let turns = WakeTurns::default();
        let start = Instant::now();
        assert!(turns.take("previews", "pr-2", 4, start));
        for second in 0..30 {
            let at = start + Duration::from_millis(second * 999);
            assert!(!turns.take("previews", "pr-2", 4, at), "{second}");
        }
        assert!(
            turns.take("previews", "pr-3", 4, start),
            "another environment has its own turn"
        );
        assert!(turns.take("previews", "pr-2", 4, start + WAKE_INTERVAL));
    }

    #[test]
    fn an_environment_put_to_sleep_again_wakes_at_once() {
        let turns = WakeTurns::default();
        let now = Instant::now();
        assert!(turns.take("previews", "pr-2", 4, now));
        // Woken (generation 5), then asleep again (6): a new sleep, a new turn.
        assert!(turns.take("previews", "pr-2", 6, now + Duration::from_secs(5)));
        assert!(!turns.take("previews", "pr-2", 6, now + Duration::from_secs(6)));
    }

    #[test]
    fn a_failed_wake_is_tried_again_after_a_short_wait_not_at_once() {
        let turns = WakeTurns::default();
        let now = Instant::now();
        assert!(turns.take("previews", "pr-2", 4, now));
        turns.failed("previews", "pr-2", now);
        assert!(!turns.take("previews", "pr-2", 4, now + Duration::from_secs(1)));
        assert!(turns.take("previews", "pr-2", 4, now + RETRY_AFTER_FAILURE));
    }

    #[test]
    fn the_record_stays_bounded_and_old_turns_go_first() {
        let turns = WakeTurns::default();
        let start = Instant::now();
        for n in 0..MAX_REMEMBERED {
            assert!(turns.take("previews", &format!("pr-{n}"), 1, start));
        }
        assert!(
            !turns.take("previews", "one-more", 1, start),
            "all turns still running"
        );
        let later = start + WAKE_INTERVAL;
        assert!(turns.take("previews", "one-more", 1, later));
        let remembered = turns.last.lock().unwrap().len();
        assert_eq!(remembered, 1, "the turns that ran out were dropped");
    }
}
