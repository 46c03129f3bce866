//! How often requests may wake one environment: at most once per [`WAKE_INTERVAL`] while it
//! sleeps. A flood of requests to a sleeping host sends one write to the API server; the rest
//! get the waiting page from memory. A turn is taken at the environment's generation (its spec's
//! version); once the environment is put to sleep again (by the sweep or a writer's command,
//! never by a request) its generation is higher and the first request wakes it at once. The
//! record is bounded: beyond [`MAX_REMEMBERED`] environments, turns that have run out are
//! forgotten first, and only environments that exist are ever recorded.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The least time between two wakes of one environment by requests.
pub const WAKE_INTERVAL: Duration = Duration::from_secs(30);

/// Environments whose last wake is remembered before old turns are dropped.
const MAX_REMEMBERED: usize = 4096;

/// A wake sent: when, and at which generation of the environment.
#[derive(Clone, Copy)]
struct Turn {
    at: Instant,
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
            && now.saturating_duration_since(turn.at) < WAKE_INTERVAL
        {
            return false;
        }
        if last.len() >= MAX_REMEMBERED {
            last.retain(|_, turn| now.saturating_duration_since(turn.at) < WAKE_INTERVAL);
        }
        if last.len() >= MAX_REMEMBERED {
            // Every remembered turn is still running: wait for one to run out.
            return false;
        }
        last.insert(
            key,
            Turn {
                at: now,
                generation,
            },
        );
        true
    }

    /// Gives the turn back, after a wake that failed (the next request tries again).
    pub fn give_back(&self, namespace: &str, name: &str) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.remove(&(namespace.to_string(), name.to_string()));
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
    fn a_failed_wake_gives_its_turn_back() {
        let turns = WakeTurns::default();
        let now = Instant::now();
        assert!(turns.take("previews", "pr-2", 4, now));
        turns.give_back("previews", "pr-2");
        assert!(turns.take("previews", "pr-2", 4, now));
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
