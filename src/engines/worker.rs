//! previewd's own template render (minijinja) run like an engine: in a child process
//! (`previewd render-worker`, the same program), under [`TEMPLATE_MEMORY_LIMIT`] and the
//! engines' time limit, so that a template that builds a gigabyte from a few instructions fails
//! its own allocation there, instead of growing previewd until the kernel kills it, and the
//! standby after it. At most [`CONCURRENT_RENDERS`] such children run at once, in fair turns of
//! their own: a template's hanging Helm renders do not hold up another template's manifests.
//! The children stay running between requests ([`warm`](super::warm)), one request at a time
//! each, and are replaced once their memory has grown past [`RETIRE_ABOVE`] or after
//! [`MAX_SERVED`] requests.
//!
//! Fuel bounds a render's instructions, not its bytes; the child bounds both, and previewd
//! never renders a template in its own process. Rendering is pure (the same input renders the
//! same output with the same memory), so what a child answered is kept by the input's digest
//! (bounded by bytes, like the engines' output: an unchanged commit runs no child), and an input
//! that ran out of memory or time is refused again at once, without a child, until the template
//! or commit changes: neither is tried blindly twice.

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use super::cache::{RenderCache, RenderKey};
use super::contain::{ContainmentMode, Walls};
use super::process::{Run, RunError};
use super::turns::FairTurns;
use super::warm::{Limits, WarmChild};
use super::{CONCURRENT_RENDERS, EngineError, Engines, MAX_OUTPUT_BYTES, Rendered};

/// The most memory one template render may take: the output is at most 4 MiB per manifest, so
/// an ordinary template's render needs a few MiB; the program itself takes about 10 MiB.
pub const TEMPLATE_MEMORY_LIMIT: u64 = 128 << 20;

/// The subcommand of `previewd` that renders one request read on its standard input.
pub const WORKER_COMMAND: &str = "render-worker";

/// The most a render's answer may take (its objects as JSON): four times one template's
/// output limit, far above any application's manifests and below the memory limit.
pub const MAX_ANSWER_BYTES: usize = 4 * MAX_OUTPUT_BYTES;

/// A child whose resident memory has grown past this after a request is replaced: what a
/// request finds left over by the ones before stays small beside [`TEMPLATE_MEMORY_LIMIT`].
pub const RETIRE_ABOVE: u64 = TEMPLATE_MEMORY_LIMIT / 4;

/// A child is replaced after this many requests all the same.
pub const MAX_SERVED: u32 = 1_000;

/// How many failed inputs are remembered (32 bytes and a message each).
const REMEMBERED: usize = 16_384;

/// The children's turns, the children waiting, what they answered by input and the inputs that
/// ran out of memory or time there (with what was said), each bounded, oldest out first.
pub struct Workers {
    turns: FairTurns,
    /// Children waiting for a request (at most one per turn).
    idle: Mutex<Vec<WarmChild>>,
    answers: RenderCache,
    overgrown: Mutex<Remembered<RunError>>,
}

impl Default for Workers {
    fn default() -> Self {
        Self {
            turns: FairTurns::new(CONCURRENT_RENDERS),
            idle: Mutex::default(),
            answers: RenderCache::default(),
            overgrown: Mutex::default(),
        }
    }
}

pub(super) struct Remembered<T> {
    keys: HashSet<RenderKey>,
    order: VecDeque<(RenderKey, T)>,
}

impl<T> Default for Remembered<T> {
    fn default() -> Self {
        Self {
            keys: HashSet::new(),
            order: VecDeque::new(),
        }
    }
}

impl<T: Clone> Remembered<T> {
    pub(super) fn get(&self, key: &RenderKey) -> Option<T> {
        if !self.keys.contains(key) {
            return None;
        }
        self.order
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value.clone())
    }

    pub(super) fn keep(&mut self, key: RenderKey, value: T) {
        if !self.keys.insert(key) {
            return;
        }
        self.order.push_back((key, value));
        while self.order.len() > REMEMBERED {
            if let Some((dropped, _)) = self.order.pop_front() {
                self.keys.remove(&dropped);
            }
        }
    }
}

impl Engines {
    /// What a child answers for `input` (digest `key`), in `owner`'s turn: kept from before
    /// when the same input was rendered (`cached`), refused at once when it ran out of memory or
    /// time before.
    pub async fn render_isolated(
        &self,
        owner: &str,
        key: RenderKey,
        input: Vec<u8>,
    ) -> Result<Rendered, EngineError> {
        if let Some(text) = self.workers.answers.get(&key) {
            return Ok(Rendered { text, cached: true });
        }
        let said_before = {
            let overgrown = self.workers.overgrown.lock();
            overgrown.unwrap_or_else(PoisonError::into_inner).get(&key)
        };
        if let Some(said) = said_before {
            return Err(EngineError::SaidBefore(said));
        }
        let _turn = self.workers.turns.acquire(owner).await;
        let (mut ran, served_before) = self.exchange(&input, false).await;
        let timed_out = matches!(ran, Err(RunError::TimedOut { .. }));
        if served_before > 0 && ran.is_err() && !timed_out {
            // A child that served others may have been stopped while it waited, or kept what
            // they left: a fresh one decides (time is the input's alone: not tried twice).
            ran = self.exchange(&input, true).await.0;
        }
        // Memory, time and output are the input's doing: refused again without a child.
        let the_inputs = matches!(
            ran,
            Err(RunError::OutOfMemory { .. }
                | RunError::TimedOut { .. }
                | RunError::TooMuchOutput { .. })
        );
        let ran = ran
            .and_then(|answer| {
                String::from_utf8(answer).map_err(|_| RunError::Failed {
                    message: "it answered something that is not UTF-8 text".into(),
                })
            })
            .map_err(name_the_render);
        match ran {
            Ok(text) => {
                let text = std::sync::Arc::new(text);
                self.workers.answers.keep(key, text.clone());
                Ok(Rendered {
                    text,
                    cached: false,
                })
            }
            Err(said) => {
                if the_inputs {
                    let overgrown = self.workers.overgrown.lock();
                    let mut overgrown = overgrown.unwrap_or_else(PoisonError::into_inner);
                    overgrown.keep(key, said.clone());
                    if !matches!(said, RunError::TimedOut { .. }) {
                        return Err(EngineError::Exhausted(said));
                    }
                }
                Err(EngineError::Run(said))
            }
        }
    }

    /// One request to a waiting child (a new one when none waits, or when `fresh`), and how
    /// many requests that child had answered before.
    async fn exchange(&self, input: &[u8], fresh: bool) -> (Result<Vec<u8>, RunError>, u32) {
        let waiting = if fresh {
            None
        } else {
            let mut idle = self
                .workers
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            idle.pop()
        };
        let mut child = match waiting {
            Some(child) => child,
            None => match WarmChild::start(self.worker_run()) {
                Ok(child) => child,
                Err(not_started) => return (Err(not_started), 0),
            },
        };
        let served_before = child.served;
        let limits = Limits {
            timeout: self.config.timeout,
            max_answer: MAX_ANSWER_BYTES,
            max_memory: TEMPLATE_MEMORY_LIMIT,
        };
        let answered = child.exchange(input, &limits).await;
        if answered.is_ok() {
            self.keep_warm(child).await;
        }
        (answered, served_before)
    }

    /// Keeps `child` for the next request, unless its memory has grown or it has served long
    /// enough (then it is dropped, which kills it).
    async fn keep_warm(&self, child: WarmChild) {
        let grown = child
            .resident()
            .await
            .is_none_or(|bytes| bytes > RETIRE_ABOVE);
        if grown || child.served >= MAX_SERVED {
            return;
        }
        let mut idle = self
            .workers
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < CONCURRENT_RENDERS {
            idle.push(child);
        }
    }

    fn worker_run(&self) -> Run<'_> {
        Run {
            program: &self.config.worker,
            args: vec![WORKER_COMMAND.into()],
            // The child reads no file: its requests come on standard input.
            folder: Path::new("/"),
            env: Vec::new(),
            timeout: self.config.timeout,
            max_output: MAX_ANSWER_BYTES,
            max_memory: TEMPLATE_MEMORY_LIMIT,
            reads_input: true,
            walls: Walls::sealed(None, worker_containment(self.config.containment)),
        }
    }
}

/// The worker runs previewd's own code on data (no engine, no file, no network needed): it
/// gets every wall the kernel has, and runs without them where the kernel has none, as a
/// template's inline manifests must render on any node.
fn worker_containment(engines: ContainmentMode) -> ContainmentMode {
    match engines {
        ContainmentMode::Off => ContainmentMode::Off,
        _ => ContainmentMode::BestEffort,
    }
}

/// The child is previewd itself: its errors name the render, not the program's path, and its
/// memory limit is not `--render-memory-limit` (which is the engines').
fn name_the_render(error: RunError) -> RunError {
    let name = "the template render".to_string();
    match error {
        RunError::OutOfMemory { limit, .. } => RunError::Failed {
            message: format!(
                "{name} needed more than {} MiB of memory and was stopped (look for strings or lists built in a loop or doubled)",
                limit >> 20
            ),
        },
        RunError::TimedOut { limit, .. } => RunError::TimedOut {
            program: name,
            limit,
        },
        RunError::TooMuchOutput { limit, .. } => RunError::TooMuchOutput {
            program: name,
            limit,
        },
        other => other,
    }
}

/// The program the child runs by default: this one.
pub fn this_program() -> std::path::PathBuf {
    std::env::current_exe().unwrap_or_else(|_| Path::new("previewd").to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_bounded_number_of_inputs_oldest_out_first() {
        let mut memory: Remembered<u32> = Remembered::default();
        for n in 0..=REMEMBERED {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(n as u64).to_le_bytes());
            memory.keep(key, n as u32);
        }
        assert_eq!(memory.order.len(), REMEMBERED);
        assert_eq!(memory.keys.len(), REMEMBERED);
        assert_eq!(memory.get(&[0; 32]), None, "the oldest is forgotten");
        let mut newest = [0u8; 32];
        newest[..8].copy_from_slice(&(REMEMBERED as u64).to_le_bytes());
        assert_eq!(memory.get(&newest), Some(REMEMBERED as u32));
    }
}
