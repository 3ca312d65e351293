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

pub use health::{CheckOutcome, HealthChecker};
pub use load::PluginRuntime;
pub use spec::{DirGrant, HealthCheck, PluginSpec};
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

/// The world a plugin targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// `baton:leader/future-plugin`: component-model async.
    Future,
    /// `baton:leader/pollable-plugin`: WASI 0.2 pollables.
    Pollable,
}

impl World {
    /// The world's WIT name in the newest version of the contract.
    pub fn wit_name(self) -> &'static str {
        self.wit_name_in(Contract::NEWEST)
    }

    /// The world's WIT name in `contract`.
    pub fn wit_name_in(self, contract: Contract) -> &'static str {
        match (self, contract) {
            (World::Future, Contract::V0_1) => "baton:leader/future-plugin@0.1.0",
            (World::Pollable, Contract::V0_1) => "baton:leader/pollable-plugin@0.1.0",
            (World::Future, Contract::V0_2) => "baton:leader/future-plugin@0.2.0",
            (World::Pollable, Contract::V0_2) => "baton:leader/pollable-plugin@0.2.0",
            (World::Future, Contract::V0_3) => "baton:leader/future-plugin@0.3.0",
            (World::Pollable, Contract::V0_3) => "baton:leader/pollable-plugin@0.3.0",
            (World::Future, Contract::V0_4) => "baton:leader/future-plugin@0.4.0",
            (World::Pollable, Contract::V0_4) => "baton:leader/pollable-plugin@0.4.0",
        }
    }
}

/// The version of the contract (`baton:leader`) a plugin was built
/// against. Every one is served: a 0.x minor version is a breaking one, so
/// a plugin of 0.1.0 cannot run as one of 0.2.0, nor one of 0.2.0 as one
/// of 0.3.0, and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// `baton:leader@0.1.0` (`wit/v0.1.0/leader.wit`).
    V0_1,
    /// `baton:leader@0.2.0` (`wit/v0.2.0/leader.wit`): adds the live hosts.
    V0_2,
    /// `baton:leader@0.3.0` (`wit/v0.3.0/leader.wit`): adds the scheduled
    /// run (`current-run`).
    V0_3,
    /// `baton:leader@0.4.0` (`wit/leader.wit`): adds the holder's address
    /// to the status and the health check a plugin may export.
    V0_4,
}

impl Contract {
    /// The newest version, which `wit/leader.wit` and the Rust SDK target.
    pub const NEWEST: Contract = Contract::V0_4;

    /// Whether a plugin of this version can learn which scheduled run it
    /// is for (`current-run`, from 0.3.0). An older one still runs on a
    /// schedule; it is just not told the due time.
    pub fn tells_scheduled_run(self) -> bool {
        self >= Contract::V0_3
    }

    /// Whether a plugin of this version sees the holder's address and may
    /// export a health check (from 0.4.0).
    pub fn has_health_check(self) -> bool {
        self >= Contract::V0_4
    }

    /// Which version an export's version suffix names, if one this host
    /// serves.
    fn of_version(version: &str) -> Option<Contract> {
        match version {
            "0.1.0" => Some(Contract::V0_1),
            "0.2.0" => Some(Contract::V0_2),
            "0.3.0" => Some(Contract::V0_3),
            "0.4.0" => Some(Contract::V0_4),
            _ => None,
        }
    }
}

/// Something a component imports that does nothing without a grant of its
/// plugin's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
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

impl Capability {
    /// The interfaces and the grant, for `baton check`.
    pub fn describe(self) -> &'static str {
        match self {
            Capability::Http => "wasi:http/outgoing-handler (needs `http` grants)",
            Capability::Sockets => "wasi:sockets (needs `connect` or `name-lookup` grants)",
            Capability::Files => "wasi:filesystem (needs `dirs` grants; Rust's std imports it anyway)",
            Capability::KeyValue => {
                "wasi:keyvalue (the plugin's own bucket; other buckets need a `keyvalue` grant)"
            }
            Capability::Config => "wasi:config (values from the plugin's `config` table)",
        }
    }

    fn of_import(name: &str) -> Option<Capability> {
        let name = unversioned(name);
        if name == "wasi:http/outgoing-handler" {
            Some(Capability::Http)
        } else if name.starts_with("wasi:sockets/") {
            Some(Capability::Sockets)
        } else if name.starts_with("wasi:filesystem/") {
            Some(Capability::Files)
        } else if name.starts_with("wasi:keyvalue/") {
            Some(Capability::KeyValue)
        } else if name.starts_with("wasi:config/") {
            Some(Capability::Config)
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
