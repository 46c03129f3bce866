//! The lifecycle of environments after they are created: the sweep that removes (or puts to
//! sleep) what should no longer run.
//!
//! * [`rules`]: the pure verdicts (closed PR, gone branch, idle, too old, orphaned namespace);
//! * [`sweeper`]: the loop that gathers the facts, judges, and acts.

pub mod metrics;
pub mod rules;
pub mod sweeper;
