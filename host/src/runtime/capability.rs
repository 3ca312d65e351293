//! The host's capabilities, one unit each ([`unit::Capability`]): its
//! grant, its part of each instance's Store and its link step, in its own
//! module. They are registered, in the order they are linked, in
//! [`crate::runtime::guest`]; `CONTRIBUTING.md` walks through adding one.
//!
//! - [`status`]: `current-status`, the status and its change signal.
//! - [`membership`]: `current-hosts`, the live hosts.
//! - [`schedule`]: `current-run`, the scheduled run an instance is for.
//! - [`clocks`]: the wall and monotonic clocks a guest reads.
//! - [`output`]: stdout and stderr as log lines, within limits.
//! - [`env`]: the environment variables granted.
//! - [`files`]: the directories granted, every mutating operation fenced.
//! - [`sockets`]: TCP connections and name lookups under grants.
//! - [`http`]: outgoing HTTP requests and the Kubernetes API under grants,
//!   carrying the term.
//! - [`keyvalue`]: `wasi:keyvalue` over the lease store's fenced buckets.
//! - [`config`]: `wasi:config` from the plugin's `config` table.

pub mod clocks;
pub mod config;
pub mod env;
pub mod files;
pub mod http;
pub mod keyvalue;
pub mod membership;
pub mod output;
pub mod schedule;
pub mod sockets;
pub mod status;
pub mod unit;
