//! The WebAssembly side: one engine per host, linkers for both worlds, and
//! one fresh Store per leader-task run.
//!
//! - [`compile`]: what compiling a component says (the log, an observer).
//! - [`engine`]: wasmtime configuration, the compiled-code cache and the
//!   epoch ticker.
//! - [`bindings`]: `bindgen!` output for `future-plugin` and
//!   `pollable-plugin`.
//! - [`world`]: the worlds and the versions of the contract.
//! - [`capability`]: what a guest may import, one unit per capability
//!   (grant, per-instance context, link step).
//! - [`guest`]: what a Store holds: the capabilities' contexts, registered.
//! - [`store_term`]: the term a Store runs in, set when its instance starts
//!   (later than the Store is made, for an instance prepared ahead).
//! - [`fence`]: the host-call fence, the epoch check, the kernel-closed
//!   window and the connections reset at the force-stop: nothing of a term
//!   acts after its force-stop time, whatever the capability.
//! - [`plugin`]: checking, loading and running a plugin.
//! - [`trap`]: why an instance trapped, in one line.
//!
//! Unstable: component-model async (the `future-plugin` world) is still
//! evolving in wasmtime; this module pins wasmtime 48's behaviour, and the
//! fence relies on where wasmtime 48 calls its call hook (see [`fence`]).

use std::path::{Path, PathBuf};

pub mod bindings;
pub mod capability;
pub mod compile;
pub mod engine;
pub mod fence;
pub mod guest;
pub mod plugin;
pub mod store_term;
pub mod trap;
pub mod world;

pub use capability::clocks::{ClockGrant, GuestClock};
pub use capability::config::{ConfigGrant, ConfigSource};
pub use capability::env::EnvGrant;
pub use capability::files::DirGrant;
pub use capability::http::kubernetes::{KubeGrant, KubeRule};
pub use capability::http::stub::{HttpStub, StubRequest, StubResponse};
pub use capability::http::{HttpGrant, HttpGrantError, HttpLimits, HttpPolicy, HttpPolicyError};
pub use capability::keyvalue::{BucketGrant, OWN_BUCKET};
pub use capability::output::{OutputGrant, OutputLimits, OutputTap};
pub use capability::schedule::ScheduledRun;
pub use capability::sockets::{ConnectGrant, ConnectGrantError, NetworkGrant, SocketsGrant};
pub use compile::{CacheUse, Compile, CompileObserver, NoCompileObserver};
pub use engine::{EPOCH_TICK, EngineOptions, PluginEngine, PoolLimits, default_cache_dir};
pub use guest::{Grants, RawGrants};
pub use plugin::{
    CheckOutcome, DEFAULT_MEMORY_LIMIT, GrantedImport, HealthCheck, HealthChecker, Plugin, PluginRuntime,
    PluginSpec, Prepared, TaskOutcome,
};
pub use store_term::StoreTerm;
pub use trap::{StoppedByHost, Trap};
pub use world::{Contract, World};

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
