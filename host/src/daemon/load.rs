//! Loading the plugins at start-up: every one compiled before any lease
//! is contended for, several at once, each on a thread of its own that a
//! shutdown abandons ([`load_plugins`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::pull::Unpulled;
use crate::config::{Config, LeaseConfig, PluginConfig};
use crate::ops::admin::Monitoring;
use crate::ops::progress::Progress;
use crate::runtime::{Plugin, PluginEngine, PluginRuntime};

/// The plugins compiled at start-up.
pub(super) struct Loaded {
    /// Each loaded plugin, with its lease.
    pub(super) plugins: Vec<(String, Arc<Plugin>)>,
    /// How many could not be loaded.
    pub(super) failed: usize,
    /// Why each of those could not (for `/readyz`).
    pub(super) refusals: Vec<String>,
    /// A shutdown came first: the rest were abandoned.
    pub(super) cancelled: bool,
    /// The configured leases (their timings are exported).
    pub(super) leases: Vec<LeaseConfig>,
}

impl Loaded {
    /// Tells the metrics, readiness and the log what was loaded.
    pub(super) fn report(
        &self,
        monitoring: Option<&Monitoring>,
        engine: &PluginEngine,
        runtime: &PluginRuntime,
    ) {
        if let Some(monitoring) = monitoring {
            monitoring.metrics.loaded(&self.plugins, self.failed, engine);
            monitoring.metrics.leases(&self.leases);
            monitoring.health.loaded(self.refusals.clone());
        }
        if let Some((hits, misses)) = engine.cache_stats() {
            tracing::info!(
                hits,
                misses,
                plugins = self.plugins.len(),
                components = runtime.components(),
                "compiled-code cache"
            );
        }
    }
}

/// Compiles every plugin before contending, so that winning a lease costs
/// an instantiation, not a compilation: several at once (one per core;
/// wasmtime also compiles a component's functions in parallel), each
/// distinct component once however many plugins name it. Before any
/// lease is contended for, `shutdown` ends this at once. The plugins of
/// `unpulled` are counted as failed, with why.
pub(super) async fn load_plugins(
    config: &Config,
    runtime: &Arc<PluginRuntime>,
    progress: &Progress,
    shutdown: &CancellationToken,
    unpulled: Vec<Unpulled>,
) -> Loaded {
    let mut loaded = Loaded {
        plugins: Vec::new(),
        failed: 0,
        refusals: Vec::new(),
        cancelled: false,
        leases: config.leases.clone(),
    };
    for (plugin, error) in &unpulled {
        loaded.failed += 1;
        loaded.refusals.push(format!("{plugin}: {error}"));
        tracing::error!(plugin = %plugin, error = %error, "cannot pull the plugin's component; the others go on");
        progress.step();
    }
    let pulled = |p: &&PluginConfig| !unpulled.iter().any(|(name, _)| name == &p.spec.name);
    let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
    let specs: Vec<_> = config
        .plugins
        .iter()
        .filter(pulled)
        .map(|p| p.spec.clone())
        .collect();
    let loader = runtime.clone();
    let mut loads = futures::stream::iter(specs.into_iter().map(move |spec| load_on_thread(&loader, &spec)))
        .buffered(parallel);
    for p in config.plugins.iter().filter(pulled) {
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            next = loads.next() => match next {
                Some(result) => result,
                None => break,
            },
        };
        progress.step();
        loaded.take(p, result);
    }
    drop(loads);
    progress.end();
    if shutdown.is_cancelled() {
        loaded.cancelled = true;
        tracing::info!(
            loaded = loaded.plugins.len(),
            plugins = config.plugins.len(),
            "shut down during start-up, before any lease was contended for; compilations in flight are abandoned"
        );
    }
    loaded
}

/// What loading one plugin gave: the plugin or why not, and how long it
/// took; `Err` if its thread failed.
type LoadResult = Result<(Result<Plugin, crate::runtime::PluginError>, Duration), ThreadFailed>;

/// Why a plugin's compile thread gave no result.
#[derive(Debug, thiserror::Error)]
enum ThreadFailed {
    /// It could not be started.
    #[error("cannot start its thread: {0}")]
    Spawn(std::io::Error),
    /// It panicked.
    #[error("it panicked")]
    Panicked,
}

/// Loads `spec` on a thread of its own rather than the blocking pool: a
/// shutdown during start-up abandons it (nothing is led yet), and the exit
/// does not wait for a compilation that may take a minute.
fn load_on_thread(
    runtime: &Arc<PluginRuntime>,
    spec: &crate::runtime::PluginSpec,
) -> impl std::future::Future<Output = LoadResult> + use<> {
    let (rt, spec) = (runtime.clone(), spec.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("baton-compile".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let result = rt.load(&spec);
            let _ = tx.send((result, started.elapsed()));
        });
    async move {
        spawned.map_err(ThreadFailed::Spawn)?;
        rx.await.map_err(|_| ThreadFailed::Panicked)
    }
}

impl Loaded {
    /// Takes in the outcome of loading `p`.
    fn take(&mut self, p: &PluginConfig, result: LoadResult) {
        match result {
            Ok((Ok(plugin), took)) => {
                tracing::info!(
                    plugin = plugin.name(),
                    lease = %p.lease,
                    world = plugin.wit_world(),
                    digest = plugin.digest(),
                    grants = %p.spec.grants(),
                    load_ms = crate::support::rounding::ms(took),
                    "plugin loaded"
                );
                self.plugins.push((p.lease.clone(), Arc::new(plugin)));
            }
            Ok((Err(e), _)) => {
                self.failed += 1;
                self.refusals.push(format!("{}: {}", p.spec.name, e.reason));
                tracing::error!(plugin = %p.spec.name, error = %e, "plugin cannot run; the others go on");
            }
            Err(e) => {
                self.failed += 1;
                self.refusals
                    .push(format!("{}: loading it failed: {e}", p.spec.name));
                tracing::error!(plugin = %p.spec.name, error = %e, "loading the plugin failed; the others go on");
            }
        }
    }
}
