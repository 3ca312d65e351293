//! `baton run`: the daemon's wiring. Start-up, the electors and the
//! supervised tasks, reloads, the control socket, shutdown.
//!
//! - [`serve`]: starts everything, runs until shutdown, drains.
//! - [`reload`]: what a changed configuration changes, what needs a
//!   restart, the file watcher.
//! - [`control`]: the control socket (`baton yield`): protocol, server and
//!   client.
//! - `stores` (private): opening the lease store and the buckets.
//! - `load`, `leases` and `apply` (private): the plugins loaded at start,
//!   the leases and plugins served, and a reload applied to them.
//! - `route` (private): the leader's pod's route labels.
//! - `pull` (private): plugins pulled from registries, and their tags
//!   watched.

mod apply;
pub mod control;
mod error;
mod leases;
mod load;
mod pull;
pub mod reload;
mod route;
pub mod serve;
mod state;
mod stores;
