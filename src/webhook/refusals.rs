//! How often people without write access get an answer (pure, in memory): a refused command's
//! answer edits the environment's one PR comment, and anyone who may comment on the pull
//! request can comment as often as the forge lets them. Each such edit spends the content
//! budget's share of that environment, which its final reports need. So each commenter is
//! answered at most once per [`PER_USER`] on an environment, and an environment's outsiders
//! together at most [`PER_ENVIRONMENT`] times an hour; beyond that the command is refused
//! without an answer (logged). People with write access are always answered.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The least time between two answers to one commenter on one environment.
pub const PER_USER: Duration = Duration::from_secs(600);
/// Answers to commenters without write access, per environment and hour.
pub const PER_ENVIRONMENT: usize = 6;
const HOUR: Duration = Duration::from_secs(3_600);
/// Environments remembered at once; beyond, those without an answer this hour go first.
const MAX_ENVIRONMENTS: usize = 4096;

/// The answers given to commenters without write access, by environment (its UID).
#[derive(Default)]
pub struct RefusalAnswers {
    answered: Mutex<HashMap<String, VecDeque<(Instant, String)>>>,
}

impl RefusalAnswers {
    /// Whether `user` may be answered on `environment` at `now`; if so, it counts.
    pub fn may_answer(&self, environment: &str, user: &str, now: Instant) -> bool {
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = |at: &Instant| now.saturating_duration_since(*at) < HOUR;
        if !answered.contains_key(environment) && answered.len() >= MAX_ENVIRONMENTS {
            answered.retain(|_, answers| {
                answers.retain(|(at, _)| recent(at));
                !answers.is_empty()
            });
            if answered.len() >= MAX_ENVIRONMENTS {
                return false;
            }
        }
        let answers = answered.entry(environment.to_string()).or_default();
        answers.retain(|(at, _)| recent(at));
        let told_lately = answers
            .iter()
            .any(|(at, who)| who == user && now.saturating_duration_since(*at) < PER_USER);
        if told_lately || answers.len() >= PER_ENVIRONMENT {
            return false;
        }
        answers.push_back((now, user.to_string()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_commenter_is_answered_once_in_ten_minutes_and_all_six_times_an_hour() {
        let answers = RefusalAnswers::default();
        let start = Instant::now();
        assert!(answers.may_answer("uid-1", "stranger", start));
        assert!(!answers.may_answer("uid-1", "stranger", start + Duration::from_secs(599)));
        assert!(answers.may_answer("uid-1", "stranger", start + PER_USER));
        assert!(
            answers.may_answer("uid-2", "stranger", start),
            "another environment"
        );
        for user in ["b", "c", "d", "e"] {
            assert!(answers.may_answer("uid-1", user, start + PER_USER));
        }
        assert!(
            !answers.may_answer("uid-1", "f", start + PER_USER),
            "six answers to outsiders this hour"
        );
        assert!(answers.may_answer("uid-1", "f", start + HOUR + Duration::from_secs(1)));
    }
}
