//! The wake gate: an HTTP listener (`--gate-listen`) that answers for the hosts of sleeping
//! environments. The operator routes the URL domain's wildcard to it; an asleep environment's
//! own routes are withdrawn (`plan::asleep_routes`), so its requests land here. The
//! gate wakes it (one write, at most once per [`turns::WAKE_INTERVAL`]) and answers with a
//! waiting page until the environment's routes are back and take the host again.
//!
//! It is open to the internet, so it reads nothing but the request's host and who is asking
//! (`model::clients`), looks the host up in memory ([`hosts`]), echoes nothing and names nothing of
//! the environment ([`page`]), lets each client and all clients together wake only so many
//! environments ([`budget`]), and bounds its connections (in all and per client address) and
//! their time ([`server`]). It
//! imports only `model` and `cluster`.

pub mod budget;
pub mod hosts;
pub mod metrics;
pub mod page;
pub mod server;
pub mod turns;
