//! The lifecycle of environments after they are created: the sweep that removes (or puts to
//! sleep) what should no longer run, and the traffic that keeps what is used awake.
//!
//! * [`rules`]: the pure verdicts (closed PR, gone branch, idle, too old, orphaned namespace);
//! * [`sweeper`]: the loop that gathers the facts, judges, and acts;
//! * [`traffic`]: requests to an environment's host, from Prometheus, as activity.

pub mod metrics;
pub mod rules;
pub mod sweeper;
pub mod traffic;
