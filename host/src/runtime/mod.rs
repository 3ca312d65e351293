//! The WebAssembly side: one engine per host, linkers for both worlds, and
//! one fresh Store per leader-task run.
//!
//! - [`compile`]: what compiling a component says (the log, an observer).
//! - [`engine`]: wasmtime configuration, the compiled-code cache and the
//!   epoch ticker.
//! - [`bindings`]: `bindgen!` output for `future-plugin` and
//!   `pollable-plugin`.
//! - [`state`]: what a Store holds, and the host side of `current-status`.
//! - [`store_term`]: the term a Store runs in, set when its instance starts
//!   (later than the Store is made, for an instance prepared ahead).
//! - [`schedule`]: the scheduled run an instance is for (`current-run`).
//! - [`fence`]: the host-call fence, the epoch check and inline file
//!   streams: nothing of a term acts after its force-stop time.
//! - [`plugin`]: checking, loading and running a plugin.
//! - [`network`]: the outbound connections a plugin may make.
//! - [`connections`]: an instance's TCP connections, bounded and reset at
//!   the force-stop.
//! - [`lookup`]: name lookups that end at the force-stop and send no query
//!   after it.
//! - [`http`]: outgoing HTTP requests under grants, carrying the term.
//! - [`kubernetes`]: the Kubernetes API through the host, under a grant,
//!   with the host's credentials.
//! - [`keyvalue`]: `wasi:keyvalue` over the lease store's fenced buckets.
//! - [`config`]: `wasi:config` from the plugin's `config` table.
//! - [`output`]: guest stdout/stderr as log lines, within limits.
//! - [`trap`]: why an instance trapped, in one line.
//!
//! Unstable: component-model async (the `future-plugin` world) is still
//! evolving in wasmtime; this module pins wasmtime 48's behaviour, and the
//! fence relies on where wasmtime 48 calls its call hook (see [`fence`]).

use std::path::{Path, PathBuf};

pub mod bindings;
pub mod compile;
pub mod config;
pub mod connections;
pub mod engine;
pub mod fence;
pub mod http;
pub mod keyvalue;
pub mod kubernetes;
pub mod lookup;
pub mod network;
pub mod output;
pub mod plugin;
pub mod schedule;
pub mod state;
pub mod store_term;
pub mod trap;

pub use compile::{CacheUse, Compile, CompileObserver, NoCompileObserver};
pub use config::{ConfigGrant, ConfigSource};
pub use engine::{EPOCH_TICK, EngineOptions, PluginEngine, PoolLimits, default_cache_dir};
pub use http::{HttpGrant, HttpGrantError, HttpLimits, HttpPolicy, HttpPolicyError};
pub use keyvalue::{BucketGrant, OWN_BUCKET};
pub use kubernetes::{KubeGrant, KubeRule};
pub use network::{ConnectGrant, ConnectGrantError, NetworkGrant};
pub use output::OutputLimits;
pub use plugin::{
    Capability, CheckOutcome, Contract, DEFAULT_MEMORY_LIMIT, DirGrant, HealthCheck, HealthChecker, Plugin,
    PluginRuntime, PluginSpec, Prepared, TaskOutcome, World,
};
pub use schedule::ScheduledRun;
pub use store_term::StoreTerm;
pub use trap::{StoppedByHost, Trap};

/// The engine could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// wasmtime refused the configuration, or the cache could not be used.
    #[error("wasm engine: {0}")]
    Engine(String),
}

/// A plugin that cannot run, and why.
#[derive(Debug, thiserror::Error)]
#[error("plugin {plugin:?} ({}): {reason}", path.display())]
pub struct PluginError {
    /// The plugin's name.
    pub plugin: String,
    /// Its component file.
    pub path: PathBuf,
    /// Why it cannot run.
    pub reason: String,
}

impl PluginError {
    pub(crate) fn new(plugin: &str, path: &Path, reason: impl Into<String>) -> PluginError {
        PluginError {
            plugin: plugin.to_owned(),
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}
