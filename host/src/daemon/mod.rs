//! `baton run`: the daemon's wiring. Start-up, the electors and the
//! supervised tasks, reloads, the control socket, shutdown.
//!
//! - [`serve`]: the one entry point, [`serve::serve`] (set up, run until
//!   the shutdown, drain), and the running daemon: its struct and its
//!   lifecycle (start, run, shut down) in `serve.rs`, a reload applied to
//!   it in `serve/apply_reload.rs`. Hooks for tests ([`serve::Setup`]'s
//!   `hooks`) only with the `test-hooks` feature.
//! - `election_runtime` (private): the electors' and the store's runtime,
//!   a thread of its own.
//! - [`reload`]: what a changed configuration changes, what needs a
//!   restart, the file watcher.
//! - [`control`]: the control socket (`baton yield`): protocol, server and
//!   client.
//! - `stores` (private): opening the lease store and the buckets
//!   ([`open_store`], [`open_stores`], which `baton status` and `baton kv`
//!   use too).
//! - `load` and `leases` (private): the plugins loaded at start, the
//!   leases and plugins served.
//! - `route` (private): the leader's pod's route labels.
//! - `pull` (private): plugins pulled from registries, and their tags
//!   watched.

pub mod control;
mod election_runtime;
mod error;
mod leases;
mod load;
mod pull;
pub mod reload;
mod route;
pub mod serve;
mod stores;

pub use stores::{open_store, open_stores};
