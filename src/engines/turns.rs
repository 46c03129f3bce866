//! Fair turns at the engines ([`FairTurns`]): at most a fixed number of engine programs run at
//! once, and when a turn frees, it goes to the waiting owner (a template) with the fewest turns
//! running, the longest-waiting first among equals. A plain first-come queue would let one
//! template with many environments whose renders hang (up to `--render-timeout` each) hold
//! every turn for minutes while other teams' charts wait behind all of them; here another
//! template waits for at most one render to end.
//!
//! Turns are handed over, not raced for: a released turn goes straight to the chosen waiter, so
//! a newcomer cannot overtake the queue. A waiter that gives up (its reconcile was cancelled)
//! passes a turn it was handed on to the next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// The turns, shared by every render.
pub struct FairTurns {
    state: Arc<Mutex<State>>,
}

struct State {
    /// Turns nobody holds.
    free: usize,
    /// Turns held, per owner (owners holding none are removed).
    running: HashMap<String, usize>,
    /// Waiters in order of arrival.
    waiting: VecDeque<Waiter>,
    /// For the waiters' identities (cancelled ones are found by it).
    next_id: u64,
}

struct Waiter {
    id: u64,
    owner: String,
    hand_over: oneshot::Sender<()>,
}

/// A turn: held while its engine runs, handed on when dropped.
pub struct Turn {
    state: Arc<Mutex<State>>,
    owner: String,
}

impl FairTurns {
    pub fn new(turns: usize) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                free: turns,
                running: HashMap::new(),
                waiting: VecDeque::new(),
                next_id: 0,
            })),
        }
    }

    /// A turn for `owner`: at once if one is free and nobody waits, else when handed over.
    pub async fn acquire(&self, owner: &str) -> Turn {
        let (id, handed) = {
            let mut state = lock(&self.state);
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                *state.running.entry(owner.to_string()).or_default() += 1;
                return self.turn(owner);
            }
            let (hand_over, handed) = oneshot::channel();
            let id = state.next_id;
            state.next_id = state.next_id.wrapping_add(1);
            state.waiting.push_back(Waiter {
                id,
                owner: owner.to_string(),
                hand_over,
            });
            (id, handed)
        };
        let mut waiting = Waiting {
            state: self.state.clone(),
            id,
            owner: owner.to_string(),
            handed,
            done: false,
        };
        // The sender lives in the queue until it is used: an error cannot happen, and would
        // only mean the turns are gone (then the caller holds a turn nobody counts).
        let _ = (&mut waiting.handed).await;
        waiting.done = true;
        self.turn(owner)
    }

    fn turn(&self, owner: &str) -> Turn {
        Turn {
            state: self.state.clone(),
            owner: owner.to_string(),
        }
    }

    /// How many turns are held, and how many waiters wait (for tests and metrics).
    pub fn load(&self) -> (usize, usize) {
        let state = lock(&self.state);
        (state.running.values().sum(), state.waiting.len())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if let Some(held) = state.running.get_mut(&self.owner) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                state.running.remove(&self.owner);
            }
        }
        state.free += 1;
        hand_over(&mut state);
    }
}

/// A waiter's side while it waits: if it is dropped (cancelled), it leaves the queue, or hands
/// on the turn it was given meanwhile.
struct Waiting {
    state: Arc<Mutex<State>>,
    id: u64,
    owner: String,
    handed: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = lock(&self.state);
        let before = state.waiting.len();
        state.waiting.retain(|w| w.id != self.id);
        if state.waiting.len() == before && self.handed.try_recv().is_ok() {
            // Handed a turn it will not use: give it back and on.
            drop(state);
            drop(Turn {
                state: self.state.clone(),
                owner: self.owner.clone(),
            });
        }
    }
}

/// Gives free turns to waiters: each to the waiting owner with the fewest turns running, the
/// longest-waiting first among equals.
fn hand_over(state: &mut State) {
    while state.free > 0 {
        let chosen = state
            .waiting
            .iter()
            .enumerate()
            .min_by_key(|(at, w)| (state.running.get(&w.owner).copied().unwrap_or(0), *at))
            .map(|(at, _)| at);
        let Some(waiter) = chosen.and_then(|at| state.waiting.remove(at)) else {
            return;
        };
        state.free -= 1;
        *state.running.entry(waiter.owner.clone()).or_default() += 1;
        if waiter.hand_over.send(()).is_err() {
            // Gone while we chose it: undo and choose again.
            state.free += 1;
            if let Some(held) = state.running.get_mut(&waiter.owner) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    state.running.remove(&waiter.owner);
                }
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;

    /// Lets spawned waiters reach the queue.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn another_owner_waits_for_one_turn_not_for_the_whole_queue() {
        let turns = Arc::new(FairTurns::new(2));
        let held = [turns.acquire("a").await, turns.acquire("a").await];
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for owner in ["a", "a", "a", "a", "b"] {
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let turn = turns.acquire(owner).await;
                order.lock().unwrap().push(owner);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(turn);
            }));
            settle().await;
        }
        assert_eq!(turns.load(), (2, 5));
        // One of a's renders ends: b, queued last, goes next.
        drop(held);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let b_at = order.iter().position(|o| *o == "b").unwrap();
        assert!(
            b_at <= 1,
            "b got a turn after at most one of a's: {order:?}"
        );
        assert_eq!(turns.load(), (0, 0), "every turn came back");
    }

    #[test]
    fn a_third_render_waits_while_two_run() {
        // The engines' own turns, so the configured limit is what is checked: two renders at
        // once (docs/security.md, docs/writing-templates.md), whoever they are for.
        let engines = crate::engines::Engines::new(crate::engines::EngineConfig::default());
        let turns = &engines.turns;
        let first = turns.acquire("a").now_or_never();
        let second = turns.acquire("b").now_or_never();
        assert!(first.is_some(), "a first render runs at once");
        assert!(second.is_some(), "a second render runs at once");
        // Pending, not timed: a third gets no turn however long it waits, and leaves the
        // queue when dropped.
        assert!(
            turns.acquire("c").now_or_never().is_none(),
            "a third render waits"
        );
        assert_eq!(turns.load(), (2, 0));
        drop(first);
        assert!(
            turns.acquire("c").now_or_never().is_some(),
            "a third render runs once one ends"
        );
        drop(second);
        assert_eq!(turns.load(), (0, 0), "every turn came back");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_turn() {
        let turns = Arc::new(FairTurns::new(1));
        let held = turns.acquire("a").await;
        let cancelled = {
            let turns = turns.clone();
            tokio::spawn(async move { turns.acquire("b").await })
        };
        settle().await;
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        // The one turn is free again: taken at once.
        let again = tokio::time::timeout(Duration::from_secs(1), turns.acquire("c")).await;
        assert!(again.is_ok(), "the turn was not lost");
        assert_eq!(turns.load(), (1, 0));
    }
}
