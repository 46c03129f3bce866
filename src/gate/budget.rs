//! How many wakes requests may cause: per client address and in all, over a sliding window
//! (in each replica of previewd: every replica runs a gate). Anyone who can reach a preview
//! host can wake its environment, and a woken environment costs its pods until it sleeps
//! again; one environment wakes at most once per turn ([`super::turns`]), but a client that
//! walks every sleeping host would wake them all. So each client address may cause
//! [`WakeLimits::per_client`] wakes per window and all clients together
//! [`WakeLimits::in_all`]; a request beyond either gets the waiting page and wakes nothing.
//!
//! The budget in all is every team's: a few addresses walking one team's hosts would spend it
//! for all. So the environments of one team (the namespace of their templates: a team may
//! write many templates, but only the operator gives it a namespace) may take an equal part
//! of it: the budget in all divided by the teams that have a sleeping environment now (one
//! team: all of it). A flood on one team's hosts leaves every other team its part; only the
//! operator, by giving templates to more namespaces, changes how many parts there are.
//!
//! An IPv6 client is counted by its /64 (one host usually holds a whole /64, and rotating
//! addresses inside it must not buy more wakes). The record of clients is bounded: beyond
//! [`MAX_CLIENTS`] addresses with wakes in the window, a new address is refused until old
//! ones leave the window (the budget in all holds either way).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::model::clients::counted_as;

/// Client addresses remembered at once.
const MAX_CLIENTS: usize = 4096;

/// The wake budget (`--gate-wakes-per-client`, `--gate-wakes-in-all`, `--gate-wake-window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeLimits {
    /// Wakes one client address may cause per window.
    pub per_client: u32,
    /// Wakes all clients together may cause per window.
    pub in_all: u32,
    pub window: Duration,
}

impl Default for WakeLimits {
    /// A person clicking through a team's previews wakes a handful in ten minutes; a script
    /// walking every host is stopped at ten, and the whole internet at sixty.
    fn default() -> Self {
        Self {
            per_client: 10,
            in_all: 60,
            window: Duration::from_secs(600),
        }
    }
}

/// Why a wake was not let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverBudget {
    /// This client's address (or /64) used its wakes of the window.
    Client,
    /// The environments of this team used their part of the budget in all.
    Team,
    /// All clients together did.
    InAll,
}

/// The wakes of the window: in all, and per client.
pub struct WakeBudget {
    limits: WakeLimits,
    state: Mutex<Spent>,
}

#[derive(Default)]
struct Spent {
    in_all: VecDeque<Instant>,
    by_client: HashMap<IpAddr, VecDeque<Instant>>,
    by_team: HashMap<String, VecDeque<Instant>>,
}

/// Whose wake it is: the client that asks, and the team (namespace) of the environment it
/// would wake, among the `teams_asleep` that have a sleeping environment now.
#[derive(Clone, Copy, Debug)]
pub struct Waking<'a> {
    pub client: IpAddr,
    pub team: &'a str,
    pub teams_asleep: usize,
}

impl Spent {
    /// Forgets wakes older than the window.
    fn expire(&mut self, now: Instant, window: Duration) {
        let stale = |at: &Instant| now.saturating_duration_since(*at) >= window;
        while self.in_all.front().is_some_and(stale) {
            self.in_all.pop_front();
        }
        if self.by_client.len() >= MAX_CLIENTS {
            self.by_client.retain(|_, wakes| {
                wakes.retain(|at| !stale(at));
                !wakes.is_empty()
            });
        }
        // Templates are the operator's, a few; those without a wake in the window go.
        self.by_team.retain(|_, wakes| {
            while wakes.front().is_some_and(stale) {
                wakes.pop_front();
            }
            !wakes.is_empty()
        });
    }
}

impl WakeBudget {
    pub fn new(limits: WakeLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(Spent::default()),
        }
    }

    /// Spends one wake for `waking` at `now`, if the client's share, the team's part and
    /// the budget in all allow.
    pub fn spend(&self, waking: Waking<'_>, now: Instant) -> Result<(), OverBudget> {
        let window = self.limits.window;
        let mut spent = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        spent.expire(now, window);
        let key = counted_as(waking.client);
        if !spent.by_client.contains_key(&key) && spent.by_client.len() >= MAX_CLIENTS {
            return Err(OverBudget::InAll);
        }
        let wakes = spent.by_client.entry(key).or_default();
        wakes.retain(|at| now.saturating_duration_since(*at) < window);
        if wakes.len() >= self.limits.per_client as usize {
            return Err(OverBudget::Client);
        }
        if spent.in_all.len() >= self.limits.in_all as usize {
            return Err(OverBudget::InAll);
        }
        let part = (self.limits.in_all as usize).div_ceil(waking.teams_asleep.max(1));
        let team = spent.by_team.get(waking.team).map_or(0, VecDeque::len);
        if team >= part {
            return Err(OverBudget::Team);
        }
        spent.by_client.entry(key).or_default().push_back(now);
        let team = spent.by_team.entry(waking.team.to_string());
        team.or_default().push_back(now);
        spent.in_all.push_back(now);
        Ok(())
    }

    /// The wake spent for `client` at `at` was not sent after all (its environment's turn had
    /// run, or the write failed): it is given back.
    pub fn give_back(&self, client: IpAddr, team: &str, at: Instant) {
        let mut spent = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let forget = |wakes: &mut VecDeque<Instant>| {
            if let Some(i) = wakes.iter().rposition(|t| *t == at) {
                wakes.remove(i);
            }
        };
        forget(&mut spent.in_all);
        if let Some(wakes) = spent.by_client.get_mut(&counted_as(client)) {
            forget(wakes);
        }
        if let Some(wakes) = spent.by_team.get_mut(team) {
            forget(wakes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_client: u32, in_all: u32) -> WakeLimits {
        WakeLimits {
            per_client,
            in_all,
            window: Duration::from_secs(600),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A wake by `client` of an environment of the only team with sleeping ones.
    fn alone(client: IpAddr) -> Waking<'static> {
        Waking {
            client,
            team: "previews",
            teams_asleep: 1,
        }
    }

    #[test]
    fn each_team_takes_its_part_of_the_budget_in_all_and_no_more() {
        let budget = WakeBudget::new(limits(100, 5));
        let now = Instant::now();
        let waking = |n: u8, team| Waking {
            client: IpAddr::from([198, 51, 100, n]),
            team,
            teams_asleep: 2,
        };
        // A flood of addresses on one team's hosts: its part (5 of 2 parts, rounded up) only.
        for n in 0..3 {
            assert_eq!(budget.spend(waking(n, "team-a"), now), Ok(()));
        }
        let flooded = budget.spend(waking(3, "team-a"), now);
        assert_eq!(flooded, Err(OverBudget::Team));
        // The other team's visitors still wake theirs, up to the budget in all.
        for n in 4..6 {
            assert_eq!(budget.spend(waking(n, "team-b"), now), Ok(()));
        }
        let beyond = budget.spend(waking(6, "team-b"), now);
        assert_eq!(beyond, Err(OverBudget::InAll));
        // In the next window each has its part again.
        let later = now + Duration::from_secs(600);
        assert_eq!(budget.spend(waking(7, "team-b"), later), Ok(()));
    }

    #[test]
    fn one_client_spends_its_share_and_no_more_until_the_window_moves_on() {
        let budget = WakeBudget::new(limits(3, 100));
        let start = Instant::now();
        for i in 0..3 {
            assert_eq!(
                budget.spend(alone(ip("203.0.113.7")), start + Duration::from_secs(i)),
                Ok(())
            );
        }
        let later = start + Duration::from_secs(10);
        assert_eq!(
            budget.spend(alone(ip("203.0.113.7")), later),
            Err(OverBudget::Client)
        );
        assert_eq!(
            budget.spend(alone(ip("203.0.113.8")), later),
            Ok(()),
            "another client has its own"
        );
        let next_window = start + Duration::from_secs(600);
        assert_eq!(budget.spend(alone(ip("203.0.113.7")), next_window), Ok(()));
    }

    #[test]
    fn all_clients_together_spend_the_budget_in_all() {
        let budget = WakeBudget::new(limits(3, 5));
        let now = Instant::now();
        for i in 0..5u8 {
            assert_eq!(
                budget.spend(alone(IpAddr::from([198, 51, 100, i])), now),
                Ok(())
            );
        }
        assert_eq!(
            budget.spend(alone(ip("198.51.100.200")), now),
            Err(OverBudget::InAll)
        );
    }

    #[test]
    fn addresses_of_one_ipv6_network_share_a_share() {
        let budget = WakeBudget::new(limits(2, 100));
        let now = Instant::now();
        assert_eq!(budget.spend(alone(ip("2001:db8:1:2::1")), now), Ok(()));
        assert_eq!(budget.spend(alone(ip("2001:db8:1:2:ffff::9")), now), Ok(()));
        assert_eq!(
            budget.spend(alone(ip("2001:db8:1:2::abcd")), now),
            Err(OverBudget::Client)
        );
        assert_eq!(
            budget.spend(alone(ip("2001:db8:1:3::1")), now),
            Ok(()),
            "another /64"
        );
    }

    #[test]
    fn a_wake_given_back_is_spent_again() {
        let budget = WakeBudget::new(limits(1, 1));
        let now = Instant::now();
        assert_eq!(budget.spend(alone(ip("192.0.2.1")), now), Ok(()));
        budget.give_back(ip("192.0.2.1"), "previews", now);
        assert_eq!(budget.spend(alone(ip("192.0.2.2")), now), Ok(()));
    }

    #[test]
    fn the_record_of_clients_stays_bounded() {
        let budget = WakeBudget::new(limits(1, u32::MAX));
        let now = Instant::now();
        for i in 0..MAX_CLIENTS as u32 {
            assert_eq!(
                budget.spend(alone(IpAddr::from(i.to_be_bytes())), now),
                Ok(())
            );
        }
        let full = budget.spend(alone(ip("10.255.255.255")), now);
        assert_eq!(full, Err(OverBudget::InAll), "no room for another address");
        let later = now + Duration::from_secs(600);
        assert_eq!(
            budget.spend(alone(ip("10.255.255.255")), later),
            Ok(()),
            "old ones left"
        );
    }
}
