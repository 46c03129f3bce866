//! The budget of content-creating requests (comments, comment edits, commit statuses,
//! deployments and their statuses, GitLab environments): GitHub allows 80 a minute and 500 an
//! hour per token or App installation besides the hourly rate limit, and answers a breach with
//! 403/429 and a wait. previewd spends its own budget first, a little under those limits, so
//! the forge never has to refuse it.
//!
//! One [`ContentBudget`] per GitHub App installation or token (GitHub and GitLab count per user):
//! [`ContentBudgets`] keeps them. Each counts what it let through in the last minute and hour
//! (a sliding window: no minute or hour of the forge's, however it counts, sees more).
//!
//! Final reports (an environment Ready, Degraded, asleep or gone) go first: a final report
//! that does not fit waits its turn in line and is told when to come back, and intermediate
//! reports (Pending, Deploying, Seeding) go out only while a quarter of each window is left
//! and no final report waits. An intermediate report that does not fit is not sent at all:
//! the next report of that environment says something newer.
//!
//! Fair shares inside each budget: one installation or token serves many repositories and
//! environments, and one author pushing every few seconds would otherwise spend the hour in
//! its first minutes and hold every other team's final reports back until it rolls over. So
//! each environment may spend at most half of the minute and a quarter of the hour, and each
//! repository at most half of each while others spend too ([`ContentBudget::share_turn`]; a report beyond its share waits
//! for its own share, not in the line, and its next report says the newest state), and the
//! last quarter of each window serves only environments that spent little in it
//! ([`light_reserve`]): a quiet environment's final report finds room however busy its
//! neighbours are.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many content-creating requests a budget lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentLimits {
    pub per_minute: u32,
    pub per_hour: u32,
}

/// Under GitHub's published 80 a minute and 500 an hour, with room for a clock that differs
/// from the forge's by a little and for an operator's other tools on the same token.
impl Default for ContentLimits {
    fn default() -> Self {
        Self {
            per_minute: 70,
            per_hour: 450,
        }
    }
}

/// The most content-creating requests one report sends (a comment, a deployment with its
/// status and a commit status, a GitLab environment's URL): a budget smaller than this
/// could never let a report through.
pub const MOST_REQUESTS_PER_REPORT: u32 = 5;

/// Whether a report says where an environment came to rest, or a step on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// Ready, Degraded, Sleeping, Queued, or destroyed: must arrive, waits its turn.
    Final,
    /// Pending, Deploying, Seeding: sent while there is room, else dropped for a newer one.
    Intermediate,
}

/// Why a report is not sent now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotNow {
    /// When to ask again (a final report's turn in line), or when room is expected.
    pub wait: Duration,
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3_600);
/// How long past its turn a waiting final report keeps its place: one that does not come back
/// (its environment was removed, or changed again) must not hold the others up.
/// The soonest a report not let through is told to come back: an estimate of "now" (the
/// hour's reserve short while the minute has room, say) must not spin a reconcile.
const LEAST_WAIT: Duration = Duration::from_secs(1);
/// A reconcile renders and applies before it reports, and waits for a worker under load: a
/// minute late is still coming back.
const TURN_GRACE: Duration = Duration::from_secs(60);

/// The content budget of one installation or token.
pub struct ContentBudget {
    limits: ContentLimits,
    state: Mutex<BudgetState>,
}

/// Who spends: an environment (its UID) and the repository it previews.
#[derive(Clone, Copy, Debug)]
pub struct Party<'a> {
    pub environment: &'a str,
    pub repository: &'a str,
}

/// One request let through: when, and for whom.
struct Sent {
    at: Instant,
    environment: Arc<str>,
    repository: Arc<str>,
}

#[derive(Default)]
struct BudgetState {
    /// Each request of the last hour let through, oldest first.
    sent: VecDeque<Sent>,
    /// Until when the forge asked for no more (a secondary-limit answer).
    paused_until: Option<Instant>,
    /// Final reports waiting their turn, first come first.
    line: Vec<Waiting>,
}

struct Waiting {
    /// The environment (its UID).
    key: String,
    requests: u32,
    /// When its turn is expected.
    turn: Instant,
}

impl ContentBudget {
    pub fn new(limits: ContentLimits) -> Self {
        let limits = ContentLimits {
            per_minute: limits.per_minute.max(MOST_REQUESTS_PER_REPORT),
            per_hour: limits.per_hour.max(MOST_REQUESTS_PER_REPORT),
        };
        Self {
            limits,
            state: Mutex::default(),
        }
    }

    /// The state, even if a thread panicked holding it (a few numbers, always valid).
    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lets `party`'s report of `requests` content-creating requests through now (and counts
    /// them), or says when to ask again.
    /// Returns when they were counted, for [`ContentBudget::refund`].
    pub fn admit(&self, party: &Party, requests: u32, urgency: Urgency) -> Result<Instant, NotNow> {
        self.admit_at(party, requests, urgency, Instant::now())
    }

    fn admit_at(
        &self,
        party: &Party,
        requests: u32,
        urgency: Urgency,
        now: Instant,
    ) -> Result<Instant, NotNow> {
        let key = party.environment;
        // More than a share holds could never go: it goes when the share is empty.
        let requests = requests
            .min(share(self.limits.per_minute, 2))
            .min(share(self.limits.per_hour, 4));
        let mut state = self.lock();
        state.forget_before(now);
        if urgency == Urgency::Intermediate {
            // A newer report of the same environment replaces its place in line.
            state.line.retain(|waiting| waiting.key != key);
        }
        if let Some(until) = state.paused_until.filter(|until| *until > now) {
            if urgency == Urgency::Final {
                state.wait_in_line(key, requests, until);
            }
            return Err(NotNow { wait: until - now });
        }
        if let Some(turn) = self.share_turn(&state, party, requests, now) {
            // Its own share is spent: it waits for that, holding nobody else up.
            state.line.retain(|waiting| waiting.key != key);
            return Err(NotNow {
                wait: turn.saturating_duration_since(now).max(LEAST_WAIT),
            });
        }
        let ahead = state.requests_ahead_of(key);
        if urgency == Urgency::Intermediate
            && let Some(first) = state.line.first()
        {
            // Final reports wait: the room that comes back is theirs. (Not sooner than
            // `LEAST_WAIT`: the first may be late for a turn already due.)
            return Err(NotNow {
                wait: first
                    .turn
                    .saturating_duration_since(now)
                    .max(LEAST_WAIT * 5),
            });
        }
        self.send_or_wait(&mut state, party, (requests, ahead), urgency, now)
    }

    /// Past the pause, the shares and the line: sends `requests` now if the window has room
    /// for them, the `ahead` in line and what must stay free for others; else says when, and
    /// keeps a final report's place in line (a light spender's).
    fn send_or_wait(
        &self,
        state: &mut BudgetState,
        party: &Party,
        (requests, ahead): (u32, u32),
        urgency: Urgency,
        now: Instant,
    ) -> Result<Instant, NotNow> {
        let key = party.environment;
        let heavy = self.heavy(state, party, requests, now);
        let reserve = self.reserve(urgency, heavy);
        let needed = ahead.saturating_add(requests);
        let room = self.room(state, now);
        if room.0 >= needed.saturating_add(reserve.0) && room.1 >= needed.saturating_add(reserve.1)
        {
            state.line.retain(|waiting| waiting.key != key);
            state.record_sent(party, requests, now);
            return Ok(now);
        }
        let turn = self.room_for(
            state,
            (
                needed.saturating_add(reserve.0),
                needed.saturating_add(reserve.1),
            ),
            now,
        );
        // A heavy spender's final report does not wait in line: the line's turns come out of
        // the whole window, and the last quarter is not its to wait for.
        if urgency == Urgency::Final && !heavy {
            state.wait_in_line(key, requests, turn);
        } else {
            state.line.retain(|waiting| waiting.key != key);
        }
        Err(NotNow {
            wait: turn.saturating_duration_since(now).max(LEAST_WAIT),
        })
    }

    /// What must stay free beside a report: an intermediate one leaves a quarter of each window
    /// to final ones; a heavy spender's final one leaves the light spenders' last quarter.
    fn reserve(&self, urgency: Urgency, heavy: bool) -> (u32, u32) {
        match urgency {
            Urgency::Final if heavy => (
                light_reserve(self.limits.per_minute),
                light_reserve(self.limits.per_hour),
            ),
            Urgency::Final => (0, 0),
            Urgency::Intermediate => (self.limits.per_minute / 4, self.limits.per_hour / 4),
        }
    }

    /// When `party`'s own shares have room for `requests` more, if they have none now: an
    /// environment may spend half the minute and a quarter of the hour, and a repository half
    /// of each while another
    /// repository spends in that window too (a token that serves one repository loses
    /// nothing by it).
    fn share_turn(
        &self,
        state: &BudgetState,
        party: &Party,
        requests: u32,
        now: Instant,
    ) -> Option<Instant> {
        let mut turn = None;
        for by_repository in [false, true] {
            let whose = |sent: &&Sent| match by_repository {
                false => &*sent.environment == party.environment,
                true => &*sent.repository == party.repository,
            };
            for (window, limit) in self.windows() {
                // An environment's bursts may take half a minute; what it keeps up takes a
                // quarter of the hour. A repository: half of each.
                let part = if by_repository || window == MINUTE {
                    2
                } else {
                    4
                };
                let shared = state.sent.iter().any(|sent| {
                    now.saturating_duration_since(sent.at) < window
                        && &*sent.repository != party.repository
                });
                if by_repository && !shared {
                    continue;
                }
                let own = state.sent.iter().filter(whose).map(|sent| sent.at);
                if let Some(at) = turn_within(own, window, share(limit, part), requests, now) {
                    turn = Some(turn.map_or(at, |t: Instant| t.max(at)));
                }
            }
        }
        turn
    }

    /// Whether `party`'s environment spent more than an eighth of either window (with
    /// `requests`): it may not use the last quarter, kept for those that spent little.
    fn heavy(&self, state: &BudgetState, party: &Party, requests: u32, now: Instant) -> bool {
        self.windows().into_iter().any(|(window, limit)| {
            let spent = state
                .sent
                .iter()
                .filter(|sent| {
                    &*sent.environment == party.environment
                        && now.saturating_duration_since(sent.at) < window
                })
                .count();
            let spent = u32::try_from(spent).unwrap_or(u32::MAX);
            spent.saturating_add(requests) > share(limit, 8)
        })
    }

    fn windows(&self) -> [(Duration, u32); 2] {
        [
            (MINUTE, self.limits.per_minute),
            (HOUR, self.limits.per_hour),
        ]
    }

    /// Gives back `requests` of those let through `at` that were never sent (the report
    /// stopped at a failure before them): the forge did not count them either. Only entries
    /// of that instant go, never another report's.
    pub fn refund(&self, at: Instant, requests: u32) {
        let mut state = self.lock();
        for _ in 0..requests {
            match state.sent.iter().rposition(|sent| sent.at == at) {
                Some(index) => {
                    state.sent.remove(index);
                }
                None => break,
            }
        }
    }

    /// Environment `key` no longer waits (it was removed, or has nothing to send).
    pub fn leave_line(&self, key: &str) {
        self.lock().line.retain(|waiting| waiting.key != key);
    }

    /// Whether nothing of this budget is in use: nothing sent this hour, nobody in line, no
    /// pause. Such a budget can be dropped and made anew without letting more through.
    fn idle(&self) -> bool {
        let mut state = self.lock();
        let now = Instant::now();
        state.forget_before(now);
        state.sent.is_empty()
            && state.line.is_empty()
            && state.paused_until.is_none_or(|until| until <= now)
    }

    /// The forge refused a request for its own limit: nothing more until `wait` is over.
    pub fn pause(&self, wait: Duration) {
        let until = Instant::now() + wait.min(super::transport::MAX_RATE_LIMIT_WAIT);
        let mut state = self.lock();
        state.paused_until = Some(state.paused_until.map_or(until, |at| at.max(until)));
    }

    /// Requests the windows allow now: (this minute, this hour).
    fn room(&self, state: &BudgetState, now: Instant) -> (u32, u32) {
        let in_minute = state
            .sent
            .iter()
            .rev()
            .take_while(|sent| now.saturating_duration_since(sent.at) < MINUTE);
        let in_minute = u32::try_from(in_minute.count()).unwrap_or(u32::MAX);
        let in_hour = u32::try_from(state.sent.len()).unwrap_or(u32::MAX);
        (
            self.limits.per_minute.saturating_sub(in_minute),
            self.limits.per_hour.saturating_sub(in_hour),
        )
    }

    /// When both windows will have room for `needed` requests (this minute's, this hour's:
    /// each with its own reserve), if nothing else is sent.
    fn room_for(&self, state: &BudgetState, needed: (u32, u32), now: Instant) -> Instant {
        let mut turn = now;
        for ((window, limit), needed) in self.windows().into_iter().zip([needed.0, needed.1]) {
            let sent = state.sent.iter().map(|sent| sent.at);
            if let Some(at) = turn_within(sent, window, limit, needed, now) {
                turn = turn.max(at);
            }
        }
        turn
    }
}

/// `part`-th of `limit` (a quarter, a half, an eighth), never less than one report.
fn share(limit: u32, part: u32) -> u32 {
    (limit / part.max(1)).max(MOST_REQUESTS_PER_REPORT)
}

/// The last quarter of a window of `limit`, kept for environments that spent little in it; none
/// where the window holds little more than one report.
fn light_reserve(limit: u32) -> u32 {
    (limit / 4).min(limit.saturating_sub(MOST_REQUESTS_PER_REPORT))
}

/// When `needed` more requests fit under `limit` in `window`, given the times `sent` (oldest
/// first) of those already counted; `None` when they fit now. The oldest that must age out
/// first decides; past all of them, each further window lets `limit` through.
fn turn_within(
    sent: impl Iterator<Item = Instant>,
    window: Duration,
    limit: u32,
    needed: u32,
    now: Instant,
) -> Option<Instant> {
    let inside: Vec<Instant> = sent
        .filter(|at| now.saturating_duration_since(*at) < window)
        .collect();
    let over = (inside.len() as u64 + u64::from(needed)).saturating_sub(u64::from(limit));
    if over == 0 {
        return None;
    }
    Some(
        match usize::try_from(over - 1).ok().and_then(|i| inside.get(i)) {
            Some(oldest) => *oldest + window,
            None => {
                let beyond = over - inside.len() as u64;
                let windows = beyond.div_ceil(u64::from(limit.max(1)));
                let windows = u32::try_from(windows).unwrap_or(u32::MAX);
                let all_out = inside.last().map_or(now, |last| *last + window);
                all_out + window.saturating_mul(windows).min(HOUR * 24)
            }
        },
    )
}

impl BudgetState {
    /// Drops requests older than the hour, and waiting reports that did not come back.
    fn forget_before(&mut self, now: Instant) {
        while self
            .sent
            .front()
            .is_some_and(|sent| now.saturating_duration_since(sent.at) >= HOUR)
        {
            self.sent.pop_front();
        }
        self.line.retain(|waiting| waiting.turn + TURN_GRACE > now);
    }

    /// The requests of the final reports in line before `key` (all of them when `key` is not in
    /// line).
    fn requests_ahead_of(&self, key: &str) -> u32 {
        self.line
            .iter()
            .take_while(|waiting| waiting.key != key)
            .map(|waiting| waiting.requests)
            .fold(0, u32::saturating_add)
    }

    /// `requests` sent for `party` at `now`.
    fn record_sent(&mut self, party: &Party, requests: u32, now: Instant) {
        let (environment, repository): (Arc<str>, Arc<str>) =
            (party.environment.into(), party.repository.into());
        for _ in 0..requests {
            self.sent.push_back(Sent {
                at: now,
                environment: environment.clone(),
                repository: repository.clone(),
            });
        }
    }

    fn wait_in_line(&mut self, key: &str, requests: u32, turn: Instant) {
        match self.line.iter_mut().find(|waiting| waiting.key == key) {
            Some(waiting) => {
                waiting.requests = requests;
                waiting.turn = turn;
            }
            None => self.line.push(Waiting {
                key: key.to_string(),
                requests,
                turn,
            }),
        }
    }
}

/// The budgets, one per installation or token ([`super::template_client::TemplateClients::client_with_budget`]).
pub struct ContentBudgets {
    limits: ContentLimits,
    budgets: Mutex<HashMap<String, Arc<ContentBudget>>>,
}

/// Past this many budgets, idle ones are dropped: rotated tokens leave budgets nobody spends
/// any more. A budget in use is never dropped (that would let its hour through again).
const MAX_BUDGETS: usize = 256;

impl ContentBudgets {
    pub fn new(limits: ContentLimits) -> Self {
        Self {
            limits,
            budgets: Mutex::default(),
        }
    }

    /// The budget of `key`, made on first use.
    pub fn of(&self, key: &str) -> Arc<ContentBudget> {
        let mut budgets = self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(budget) = budgets.get(key) {
            return budget.clone();
        }
        if budgets.len() >= MAX_BUDGETS {
            budgets.retain(|_, budget| !budget.idle());
        }
        let budget = Arc::new(ContentBudget::new(self.limits));
        budgets.insert(key.to_string(), budget.clone());
        budget
    }

    /// Takes environment `key` out of every budget's line.
    pub fn leave_lines(&self, key: &str) {
        let budgets = self
            .budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for budget in budgets.values() {
            budget.leave_line(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Environment `key` of a repository of its own.
    fn party(key: &str) -> Party<'_> {
        Party {
            environment: key,
            repository: key,
        }
    }

    fn budget(per_minute: u32, per_hour: u32) -> ContentBudget {
        ContentBudget::new(ContentLimits {
            per_minute,
            per_hour,
        })
    }

    #[test]
    fn no_minute_and_no_hour_lets_more_through_than_the_limits() {
        let budget = budget(80, 500);
        let start = Instant::now();
        let mut let_through: Vec<Instant> = Vec::new();
        // A final report of 4 requests asked for every second for two hours, by 30
        // environments in turn (each spends little: the whole budget is theirs; each comes
        // back within its turn's grace).
        let keys: Vec<String> = (0..30).map(|i| format!("env-{i}")).collect();
        for second in 0..7_200u64 {
            let now = start + Duration::from_secs(second);
            let key = &keys[(second % 30) as usize];
            if budget.admit_at(&party(key), 4, Urgency::Final, now).is_ok() {
                let_through.extend([now; 4]);
            }
        }
        for (window, limit) in [(MINUTE, 80), (HOUR, 500)] {
            for (i, at) in let_through.iter().enumerate() {
                let inside = let_through[i..]
                    .iter()
                    .filter(|t| **t - *at < window)
                    .count();
                assert!(inside <= limit, "{inside} within {window:?} of {at:?}");
            }
        }
        // The hour's budget is spent in full: 125 reports of 4 in each hour.
        assert_eq!(let_through.len(), 1_000);
    }

    #[test]
    fn one_environment_spends_half_a_minute_a_quarter_of_the_hour_and_one_repository_half() {
        let budget = budget(70, 450);
        let now = Instant::now();
        // Two repositories share the token.
        let elsewhere = Party {
            environment: "z",
            repository: "org/api",
        };
        budget.admit_at(&elsewhere, 5, Urgency::Final, now).unwrap();
        let busy = Party {
            environment: "busy",
            repository: "org/web",
        };
        let mut sent = 0;
        for _ in 0..10 {
            if budget.admit_at(&busy, 5, Urgency::Final, now).is_ok() {
                sent += 5;
            }
        }
        assert_eq!(sent, 35, "half the minute's 70 holds seven reports of 5");
        let refused = budget.admit_at(&busy, 5, Urgency::Final, now).unwrap_err();
        assert!(
            refused.wait >= Duration::from_secs(59),
            "its own share frees in a minute: {refused:?}"
        );
        assert!(
            budget.lock().line.is_empty(),
            "it waits for its share, not in the line"
        );
        // Its repository's other environments share that half of the minute with it.
        let mut repository = 35;
        for environment in ["b", "c", "d", "e"] {
            let neighbour = Party {
                environment,
                repository: "org/web",
            };
            while budget.admit_at(&neighbour, 5, Urgency::Final, now).is_ok() {
                repository += 5;
            }
        }
        assert_eq!(repository, 35);
        // The other repository still has the rest.
        let next_door = Party {
            environment: "y",
            repository: "org/api",
        };
        budget.admit_at(&next_door, 5, Urgency::Final, now).unwrap();
        // Alone on its token, a repository may spend it all (its environments a quarter each).
        let alone = super::ContentBudget::new(ContentLimits {
            per_minute: 70,
            per_hour: 450,
        });
        let mut spent = 0;
        for environment in ["a", "b", "c", "d", "e", "f"] {
            let party = Party {
                environment,
                repository: "org/web",
            };
            while alone.admit_at(&party, 5, Urgency::Final, now).is_ok() {
                spent += 5;
            }
        }
        assert!(spent > 35, "{spent}");
        // Over an hour, an environment keeps up a quarter of it: 112 of 450.
        let hourly = ContentBudget::new(ContentLimits {
            per_minute: 70,
            per_hour: 450,
        });
        let mut kept_up = 0;
        for minute in 0..60u32 {
            let at = now + MINUTE * minute;
            while hourly.admit_at(&busy, 5, Urgency::Final, at).is_ok() {
                kept_up += 5;
            }
        }
        assert_eq!(kept_up, 110, "22 reports of 5 fit in a quarter of the hour");
    }

    #[test]
    fn a_quiet_environments_final_report_finds_room_however_busy_its_neighbours_are() {
        let budget = budget(70, 450);
        let start = Instant::now();
        // Three busy environments of three repositories ask every second for an hour; a
        // quiet one reports every ten minutes (30 of the hour: under an eighth of it).
        let busy: Vec<Party> = ["a", "b", "c"]
            .iter()
            .map(|key| Party {
                environment: key,
                repository: key,
            })
            .collect();
        let quiet = party("quiet");
        let mut busy_sent = 0;
        for second in 0..3_600u64 {
            let now = start + Duration::from_secs(second);
            for party in &busy {
                if budget.admit_at(party, 5, Urgency::Final, now).is_ok() {
                    busy_sent += 5;
                }
            }
            if second % 600 == 599 {
                let report = budget.admit_at(&quiet, 5, Urgency::Final, now);
                assert!(report.is_ok(), "at {second} s: {report:?}");
            }
        }
        assert!(
            busy_sent <= 450 * 3 / 4,
            "the busy ones leave the last quarter: {busy_sent}"
        );
        assert!(busy_sent >= 450 / 2, "and use what they may: {busy_sent}");
    }

    #[test]
    fn final_reports_go_before_intermediate_ones_and_wait_their_turn_in_line() {
        let budget = budget(20, 500);
        let now = Instant::now();
        // Half the minute spent: an intermediate report fits while a quarter stays free.
        for key in ["a", "b"] {
            budget
                .admit_at(&party(key), 5, Urgency::Final, now)
                .unwrap();
        }
        budget
            .admit_at(&party("c"), 5, Urgency::Intermediate, now)
            .unwrap();
        // 5 left: a quarter (5) must stay for final reports.
        let refused = budget.admit_at(&party("d"), 1, Urgency::Intermediate, now);
        assert!(
            refused.is_err(),
            "an intermediate report may not take the reserve"
        );
        budget
            .admit_at(&party("e"), 4, Urgency::Final, now)
            .unwrap();
        // Full: two final reports wait in line, the first one's turn comes first.
        let first = budget
            .admit_at(&party("f"), 4, Urgency::Final, now)
            .unwrap_err();
        let second = budget
            .admit_at(&party("g"), 4, Urgency::Final, now)
            .unwrap_err();
        assert!(
            first.wait <= second.wait && second.wait <= MINUTE,
            "{first:?} {second:?}"
        );
        // While they wait, no intermediate report goes out, even when room comes back.
        let later = now + MINUTE;
        assert!(
            budget
                .admit_at(&party("h"), 1, Urgency::Intermediate, later)
                .is_err()
        );
        // The second in line cannot jump the first, who then gets through.
        budget
            .admit_at(&party("g"), 4, Urgency::Final, later)
            .unwrap();
        // (`g` was let through: 8 requests fit, `f` keeps its 4 ahead of it.)
        budget
            .admit_at(&party("f"), 4, Urgency::Final, later)
            .unwrap();
    }

    #[test]
    fn a_second_in_line_does_not_take_the_room_of_the_first() {
        let budget = budget(5, 500);
        let now = Instant::now();
        budget
            .admit_at(&party("a"), 5, Urgency::Final, now)
            .unwrap();
        budget
            .admit_at(&party("first"), 5, Urgency::Final, now)
            .unwrap_err();
        budget
            .admit_at(&party("second"), 5, Urgency::Final, now)
            .unwrap_err();
        let later = now + MINUTE;
        assert!(
            budget
                .admit_at(&party("second"), 5, Urgency::Final, later)
                .is_err(),
            "room for 5 is the first one's"
        );
        budget
            .admit_at(&party("first"), 5, Urgency::Final, later)
            .unwrap();
    }

    #[test]
    fn a_report_behind_a_line_longer_than_the_free_room_is_never_told_to_come_back_at_once() {
        let budget = budget(5, 500);
        let now = Instant::now();
        budget
            .admit_at(&party("a"), 5, Urgency::Final, now)
            .unwrap();
        budget
            .admit_at(&party("b"), 5, Urgency::Final, now)
            .unwrap_err();
        // A minute on, the window is empty but `b` has not come back yet: its 5 are ahead of
        // `d`'s 4, more than the window's 5.
        let later = now + MINUTE + Duration::from_secs(1);
        let refused = budget
            .admit_at(&party("d"), 4, Urgency::Final, later)
            .unwrap_err();
        assert!(refused.wait >= MINUTE, "{refused:?}");
    }

    #[test]
    fn a_report_not_let_through_is_never_told_to_come_back_at_once() {
        // The hour's reserve is short while the minute has room: an intermediate report is
        // refused, and the estimate of its room must not be "now".
        let hourly = budget(5, 20);
        let now = Instant::now();
        for (minute, key) in (0..3).zip(["a1", "a2", "a3"]) {
            let at = now + MINUTE * minute;
            hourly.admit_at(&party(key), 5, Urgency::Final, at).unwrap();
        }
        // 15 of the hour's 20 spent: 1 more would leave less than its quarter (5).
        let later = now + MINUTE * 3;
        let refused = hourly
            .admit_at(&party("b"), 1, Urgency::Intermediate, later)
            .unwrap_err();
        // The hour's reserve frees when the first report leaves the hour: 57 minutes on.
        assert!(refused.wait >= MINUTE * 56, "{refused:?}");
        // Behind a final report whose turn is due but which has not come back yet.
        let full = budget(5, 500);
        full.admit_at(&party("c"), 5, Urgency::Final, now).unwrap();
        let turn = now
            + full
                .admit_at(&party("d"), 5, Urgency::Final, now)
                .unwrap_err()
                .wait;
        let refused = full
            .admit_at(&party("e"), 1, Urgency::Intermediate, turn)
            .unwrap_err();
        assert!(refused.wait >= LEAST_WAIT * 5, "{refused:?}");
    }

    #[test]
    fn a_waiting_report_that_does_not_come_back_holds_nobody_up_for_long() {
        let budget = budget(5, 500);
        let now = Instant::now();
        budget
            .admit_at(&party("a"), 5, Urgency::Final, now)
            .unwrap();
        let gone = budget
            .admit_at(&party("gone"), 5, Urgency::Final, now)
            .unwrap_err();
        let turn = now + gone.wait;
        budget
            .admit_at(&party("next"), 5, Urgency::Final, now)
            .unwrap_err();
        let after_grace = turn + TURN_GRACE;
        budget
            .admit_at(&party("next"), 5, Urgency::Final, after_grace)
            .unwrap();
    }

    #[test]
    fn a_pause_holds_every_report_and_final_ones_keep_their_place() {
        let budget = budget(80, 500);
        budget.pause(Duration::from_secs(30));
        let refused = budget.admit(&party("env"), 1, Urgency::Final).unwrap_err();
        assert!(refused.wait > Duration::from_secs(28), "{refused:?}");
        assert!(
            budget
                .admit(&party("other"), 1, Urgency::Intermediate)
                .is_err()
        );
        let later = Instant::now() + Duration::from_secs(31);
        budget
            .admit_at(&party("env"), 1, Urgency::Final, later)
            .unwrap();
    }
}
