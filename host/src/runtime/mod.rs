//! The WebAssembly side: one engine per host, linkers for both worlds, and
//! one fresh Store per leader-task run.
//!
//! - [`engine`]: wasmtime configuration, the compiled-code cache and the
//!   epoch ticker.
//! - [`bindings`]: `bindgen!` output for `future-plugin` and
//!   `pollable-plugin`.
//! - [`state`]: what a Store holds, and the host side of `current-status`.
//! - [`plugin`]: checking, loading and running a plugin.
//! - [`network`]: the outbound connections a plugin may make.
//! - [`output`]: guest stdout/stderr as log lines.
//!
//! Unstable: component-model async (the `future-plugin` world) is still
//! evolving in wasmtime; this module pins wasmtime 48's behaviour.

use std::path::{Path, PathBuf};

pub mod bindings;
pub mod engine;
pub mod network;
pub mod output;
pub mod plugin;
pub mod state;

pub use engine::{EPOCH_TICK, PluginEngine, default_cache_dir};
pub use network::{ConnectGrant, NetworkGrant};
pub use plugin::{DirGrant, Plugin, PluginRuntime, PluginSpec, TaskGuard, TaskOutcome, World};

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
