//! The state of a running `baton run`: what `serve.rs` starts and drains,
//! and what a reload (`apply.rs`) changes. Its methods live beside the
//! step they serve; this module only holds it, so that neither of those
//! files needs the other's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::control::SharedLeases;
use super::leases::{ElectorEnd, ElectorFailure, Launcher, LeaseRun, PluginRun};
use super::reload;
use crate::config::Config;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::runtime::{PluginEngine, PluginRuntime};

/// What the admin endpoints of one run serve, when configured (their
/// server serves until `serve_opts` returns).
pub(super) struct Monitoring {
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
}

/// A running `baton run`: the leases and plugins it serves, and what a
/// reload or the shutdown needs. `Daemon::run` runs it until shutdown,
/// `Daemon::shut_down` drains it.
pub(super) struct Daemon {
    /// The configuration in force (the last one a reload applied).
    pub(super) config: Config,
    pub(super) launcher: Launcher,
    pub(super) runs: BTreeMap<String, LeaseRun>,
    pub(super) plugins: BTreeMap<String, PluginRun>,
    /// Plugins a reload removed, until their supervisor has returned (no
    /// task of them runs any more): a plugin of the same name added again
    /// waits for it.
    pub(super) removed: BTreeMap<String, CancellationToken>,
    /// Each elector's end: its lease and `Err(why)` if it failed.
    pub(super) ended: mpsc::UnboundedReceiver<ElectorEnd>,
    pub(super) runtime: Arc<PluginRuntime>,
    pub(super) engine: PluginEngine,
    pub(super) monitoring: Option<Monitoring>,
    pub(super) fixed: reload::Fixed,
    pub(super) reloads: Option<reload::Reload>,
    /// The files the watcher watches, if it runs.
    pub(super) files: watch::Sender<Vec<PathBuf>>,
    /// The tags of registry plugins the tag watcher watches, if it runs.
    pub(super) tags: watch::Sender<super::pull::Tags>,
    pub(super) watch_stop: CancellationToken,
    /// The leases `baton yield` may reach.
    pub(super) controlled: SharedLeases,
    pub(super) control_stop: CancellationToken,
    /// Electors that failed, and why.
    pub(super) failures: Vec<(String, ElectorFailure)>,
    /// Leases whose tasks could not be confirmed stopped.
    pub(super) unconfirmed: Vec<String>,
    /// Plugins that could not be loaded at start.
    pub(super) failed_plugins: usize,
}
