//! Plugins: checking and loading a component, and running its leader task
//! for one term in a fresh Store.
//!
//! - `spec`: what the configuration grants a plugin (`PluginSpec`).
//! - `linkers`: the host's imports, linked once for each world.
//! - `component`: checking a component's world, contract and imports as it
//!   is compiled (`CompileError` says why it cannot run).
//! - `load`: `PluginRuntime`, which compiles each content once (one slot
//!   per content, shared by every plugin that names it) and makes plugins.
//! - `task`: `Plugin`, and one run of its task in a fresh Store.
//! - `health`: its health check, in an instance of its own per term.
//!
//! Invariant: a `Plugin` exists only for a component that compiled and
//! whose every import this host provides.

use std::time::Duration;

mod component;
mod health;
mod linkers;
mod load;
mod spec;
mod task;

pub use crate::runtime::world::{Contract, World};
pub use health::{CheckOutcome, HealthChecker};
pub use load::PluginRuntime;
pub use spec::{HealthCheck, PluginSpec};
pub use task::{Plugin, Prepared, TaskOutcome};

/// The memory limit of one plugin instance unless configured otherwise
/// (and of `baton check`): room for the Python and JavaScript runtimes,
/// which need tens of MiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 256 * 1024 * 1024;

/// How long a task of a plugin that counts the live hosts waits, at its
/// start, for the membership listing to count this host: the first
/// listing follows this host's first membership write within a retry
/// period, so this is a bound for a store that cannot be reached, not a
/// delay a working host sees.
pub const FIRST_HOSTS_WAIT: Duration = Duration::from_secs(5);

/// Something a component imports that does nothing without a grant of its
/// plugin's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GrantedImport {
    /// `wasi:http/outgoing-handler`: the `http` grants.
    Http,
    /// `wasi:sockets`: the `connect` and `name-lookup` grants.
    Sockets,
    /// `wasi:filesystem`: the `dirs` grants.
    Files,
    /// `wasi:keyvalue`: the `keyvalue` grant (by default the plugin's own
    /// bucket).
    KeyValue,
    /// `wasi:config`: the `config` table.
    Config,
}

impl GrantedImport {
    /// The interfaces and the grant, for `baton check`.
    pub fn describe(self) -> &'static str {
        match self {
            GrantedImport::Http => "wasi:http/outgoing-handler (needs `http` grants)",
            GrantedImport::Sockets => "wasi:sockets (needs `connect` or `name-lookup` grants)",
            GrantedImport::Files => "wasi:filesystem (needs `dirs` grants; Rust's std imports it anyway)",
            GrantedImport::KeyValue => {
                "wasi:keyvalue (the plugin's own bucket; other buckets need a `keyvalue` grant)"
            }
            GrantedImport::Config => "wasi:config (values from the plugin's `config` table)",
        }
    }

    fn of_import(name: &str) -> Option<GrantedImport> {
        let name = unversioned(name);
        if name == "wasi:http/outgoing-handler" {
            Some(GrantedImport::Http)
        } else if name.starts_with("wasi:sockets/") {
            Some(GrantedImport::Sockets)
        } else if name.starts_with("wasi:filesystem/") {
            Some(GrantedImport::Files)
        } else if name.starts_with("wasi:keyvalue/") {
            Some(GrantedImport::KeyValue)
        } else if name.starts_with("wasi:config/") {
            Some(GrantedImport::Config)
        } else {
            None
        }
    }
}

/// An import's or export's name without its version.
fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

#[cfg(test)]
pub(crate) mod tests;
