//! `baton run`'s daemon: [`serve`], the one entry point, and the `Daemon`
//! it runs. One elector per lease, one supervisor per plugin, and an
//! orderly shutdown: tell the tasks, wait for them (grace, then force), and
//! only then release each lease.
//!
//! [`serve`] reads top to bottom: set up (the admin endpoints, the engine,
//! the control socket, the election runtime and the store, the plugins
//! compiled), start the `Daemon`, `select!` between running it and the
//! shutdown, then drain it. The `Daemon` is here, with its lifecycle
//! (`start`, `run`, `shut_down`); a reload applied to it is its submodule
//! `apply_reload` (`serve/apply_reload.rs`).
//!
//! Electors are supervised: one that panics or ends on its own is reported,
//! its lease's tasks are stopped, the other leases are handed over as in a
//! shutdown, and [`serve`] fails, without releasing that lease (so it
//! expires normally). They run on a runtime of their own, apart from the
//! guests (`election_runtime.rs`).
//!
//! The spreader ([`Spreader`](crate::election::spread::Spreader)) runs on
//! the election runtime too, when the configuration calls for one
//! (`spread_for`): it keeps this host's membership record and, with
//! spreading on, *steers* the electors' intents. A reload that changes what
//! it should do replaces it (`Launcher::respread`): the old one is stopped,
//! the leases go back to contending if the new one does not steer, and the
//! new one steers them from its first listing; later reloads tell it of
//! added and removed leases.
//!
//! With an admin address configured, it also serves `/metrics`,
//! `/healthz` and `/readyz` from a thread of its own ([`admin`](crate::ops::admin)):
//! the electors and supervisors report to [`Metrics`], and [`Health`]
//! watches both runtimes, every elector's heartbeat and what it publishes.
//!
//! [`TestHooks`], in a build with the `test-hooks` feature only, let tests
//! give their own store and stall the election runtime.

mod apply_reload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use self::apply_reload::ReloadRefused;
use super::election_runtime::ElectionRuntime;
pub use super::error::ServeError;
use super::leases::{ElectorFailure, Launcher, LeaseRun, PluginRun, sync_controlled, wanted_spread};
use super::load::{Loaded, load_plugins};
use super::stores::store_timings;
use crate::config::Config;
use crate::daemon::control::{ControlSocket, ControlledHost, SharedLeases};
use crate::daemon::reload;
use crate::election::{ClaimGate, HostHandle, Intent, NoObserver, TermClock};
use crate::ops::admin::{AdminServer, Monitoring};
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::runtime::{EngineOptions, Plugin, PluginEngine, PluginRuntime, PoolLimits, default_cache_dir};
use crate::store::buckets::BucketStore;
use crate::store::{HostInfo, LeaseStore};
use crate::supervisor::NoTaskObserver;

/// What [`serve`] is given beyond the configuration.
#[derive(Default)]
pub struct Setup {
    /// Reloads (SIGHUP, a watched file): see [`crate::daemon::reload`].
    /// `None`: none.
    pub reload: Option<reload::Reload>,
    /// Hooks for tests (a build with the `test-hooks` feature only).
    #[cfg(feature = "test-hooks")]
    pub hooks: TestHooks,
}

/// Hooks for tests, compiled only with the `test-hooks` feature (the test
/// suite's builds, never a shipped one). None is set by default.
#[cfg(feature = "test-hooks")]
#[derive(Default)]
pub struct TestHooks {
    /// The lease store to use instead of the configured one (tests that
    /// inject store faults).
    pub store: Option<Arc<dyn LeaseStore>>,
    /// The buckets to use instead of the configured store's; with
    /// [`store`](Self::store) given and this not, plugins have none.
    pub buckets: Option<Arc<dyn BucketStore>>,
    /// `baton run --test-stall-election-runtime DELAY` (hidden): this long
    /// after start, the election runtime's only thread blocks for an hour,
    /// as a runtime whose worker hangs would. Only for tests of
    /// `/healthz`: the process is not usable afterwards.
    pub stall_election_after: Option<std::time::Duration>,
}

/// Runs the configured leases and plugins until `shutdown` is cancelled,
/// then drains every task and releases every lease.
///
/// A plugin that cannot be loaded is reported (naming it) and left out;
/// the others run. Returns the number of plugins that failed to load, or
/// [`ServeError::NothingToRun`] at once if that leaves no lease to contend
/// for.
pub async fn serve(
    mut config: Config,
    mut setup: Setup,
    shutdown: CancellationToken,
) -> Result<usize, ServeError> {
    // Set up. The admin endpoints first, so that liveness answers while
    // the plugins compile; the control socket before anything contends, so
    // that a host that would share another's socket does not start.
    let (monitoring, _admin) = start_admin(&config)?;
    let cache_dir = config.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let engine = open_engine(&config, &cache_dir)?;
    let control = bind_control(&config)?;
    let control_path = control.as_ref().map(|c| c.path().to_path_buf());
    check_own_files(&config, &cache_dir, control_path.as_deref())?;
    let election = ElectionRuntime::start()?;
    election.watched(monitoring.as_ref());
    #[cfg(feature = "test-hooks")]
    election.stall_after(setup.hooks.stall_election_after);
    let (store, buckets) = setup.open_stores(&election, &config).await?;
    tracing::info!(identity = %config.identity, store = %store.describe(), cache = %cache_dir.display(), advertised = config.advertised().as_deref().unwrap_or(""), "baton starting");
    let (runtime, loaded) = load(&mut config, &engine, buckets.as_ref(), &cache_dir, &shutdown).await?;
    if loaded.cancelled {
        return Ok(loaded.failed);
    }
    loaded.report(monitoring.as_ref(), &engine, &runtime);
    let parts = Parts {
        store,
        buckets,
        election: election.handle().clone(),
        monitoring,
        engine,
        runtime,
        fixed: fixed_settings(&config, cache_dir, control_path),
    };
    let mut daemon = Daemon::start(config, parts, &loaded, setup.reload).await?;
    let control = daemon.serve_control(control);

    // Run until the shutdown, or until an elector fails (its lease's tasks
    // are then stopped before anything else). A reload under way when the
    // shutdown comes is abandoned.
    let failed = tokio::select! {
        failed = daemon.run() => Some(failed),
        () = shutdown.cancelled() => None,
    };
    if let Some((lease, reason)) = failed {
        daemon.elector_failed(lease, reason).await;
    }

    // Drain: every task stopped, then every lease handed over.
    daemon.shut_down(control).await
}

impl Setup {
    /// The lease store and the buckets: the configured store's, opened on
    /// the election runtime (where its requests run), or the ones a test
    /// gave ([`TestHooks`], in a build with them).
    async fn open_stores(
        &mut self,
        election: &ElectionRuntime,
        config: &Config,
    ) -> Result<(Arc<dyn LeaseStore>, Option<Arc<dyn BucketStore>>), ServeError> {
        #[cfg(feature = "test-hooks")]
        if let Some(store) = self.hooks.store.take() {
            return Ok((store, self.hooks.buckets.take()));
        }
        let (store, buckets) = election.open_stores(config).await?;
        #[cfg(feature = "test-hooks")]
        let buckets = self.hooks.buckets.take().unwrap_or(buckets);
        Ok((store, Some(buckets)))
    }
}

/// Compiles the configured plugins (registry plugins pulled first) on a
/// new plugin runtime whose plugins have `buckets`; on a terminal, the
/// plugins loaded out of all and a spinner per compilation in flight,
/// until every plugin is loaded. Fails at once if a plugin has a schedule
/// and there are no buckets.
async fn load(
    config: &mut Config,
    engine: &PluginEngine,
    buckets: Option<&Arc<dyn BucketStore>>,
    cache_dir: &Path,
    shutdown: &CancellationToken,
) -> Result<(Arc<PluginRuntime>, Loaded), ServeError> {
    let progress = Arc::new(crate::ops::logging::progress(config.plugins.len()));
    let mut runtime = PluginRuntime::new(engine.clone())?;
    runtime.set_compile_observer(progress.clone());
    if let Some(buckets) = buckets {
        tracing::info!(buckets = %buckets.describe(), "plugins' key-value buckets");
        runtime.set_bucket_store(buckets.clone());
    } else if let Some(p) = config.plugins.iter().find(|p| p.schedule.is_some()) {
        return Err(ServeError::Store(format!(
            "plugin {:?} has a schedule, which keeps its progress in the store's buckets, and this store has none",
            p.spec.name
        )));
    }
    let runtime = Arc::new(runtime);
    let unpulled = super::pull::pull_plugins(config, cache_dir, None, shutdown).await;
    let loaded = load_plugins(config, &runtime, &progress, shutdown, unpulled).await;
    Ok((runtime, loaded))
}

/// The control socket of `config` (see [`crate::daemon::control`]): the one it
/// sets, or the default one beside its file; none for a configuration
/// without a file that sets none.
fn bind_control(config: &Config) -> Result<Option<ControlSocket>, ServeError> {
    match (&config.control_socket, &config.source) {
        (Some(path), _) => ControlSocket::bind(path).map(Some),
        (None, Some(file)) => ControlSocket::bind_default(Some(file), &config.identity),
        (None, None) => Ok(None),
    }
    .map_err(ServeError::Control)
}

/// Starts the admin endpoints, when configured: their metrics and health
/// (shared with the parts that report to them), and the server, which
/// serves until dropped.
fn start_admin(config: &Config) -> Result<(Option<Monitoring>, Option<AdminServer>), ServeError> {
    let Some(address) = config.admin_address else {
        return Ok((None, None));
    };
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new());
    health.loading(config.plugins.len());
    let host = crate::ops::leases::Host {
        identity: config.identity.clone(),
        address: config.advertised(),
    };
    let server = crate::ops::admin::start(address, metrics.clone(), health.clone(), host)
        .map_err(|e| ServeError::Admin { address, error: e })?;
    tracing::info!(address = %server.address(), "admin endpoints listening: /metrics, /healthz, /readyz, /leases");
    health.watch_runtime("guest", &tokio::runtime::Handle::current());
    Ok((Some(Monitoring { metrics, health }), Some(server)))
}

/// The wasm engine, with the compiled-code cache in `cache_dir` and an
/// instance pool sized for the configured plugins if asked for.
fn open_engine(config: &Config, cache_dir: &Path) -> Result<PluginEngine, ServeError> {
    Ok(PluginEngine::new(EngineOptions {
        cache_dir: Some(cache_dir.to_path_buf()),
        coredump_dir: config.coredump_dir.clone(),
        largest_memory: config.plugins.iter().map(|p| p.spec.memory_limit).max(),
        pool_slots: config
            .instance_pool
            .then(|| PoolLimits::slots_for(config.plugins.len())),
    })?)
}

/// Refuses a `dirs` grant over the host's own files: the store, the
/// configuration, the cache, the control socket (see
/// [`crate::config::own_files`]).
fn check_own_files(config: &Config, cache_dir: &Path, control: Option<&Path>) -> Result<(), ServeError> {
    crate::config::own_files::check_grants(config, cache_dir, control).map_err(|error| ServeError::Grants {
        file: config.source.clone(),
        error,
    })
}

/// What a reload may not change, as the host started.
fn fixed_settings(config: &Config, cache_dir: PathBuf, control_socket: Option<PathBuf>) -> reload::Fixed {
    reload::Fixed {
        memory_reservation: config.instance_pool.then(|| {
            config
                .plugins
                .iter()
                .map(|p| p.spec.memory_limit)
                .max()
                .unwrap_or(crate::runtime::DEFAULT_MEMORY_LIMIT)
                .max(1 << 20)
                .next_power_of_two()
        }),
        pool_slots: config
            .instance_pool
            .then(|| PoolLimits::slots_for(config.plugins.len())),
        cache_dir,
        control_socket,
    }
}

/// A running `baton run`: the leases and plugins it serves, and what a
/// reload or the shutdown needs. `Daemon::run` runs it until an elector
/// fails, [`serve`] until the shutdown; `Daemon::shut_down` drains it.
/// Its fields are this module's and `apply_reload`'s alone.
struct Daemon {
    /// The configuration in force (the last one a reload applied).
    config: Config,
    launcher: Launcher,
    runs: BTreeMap<String, LeaseRun>,
    plugins: BTreeMap<String, PluginRun>,
    /// Plugins a reload removed, until their supervisor has returned (no
    /// task of them runs any more): a plugin of the same name added again
    /// waits for it.
    removed: BTreeMap<String, CancellationToken>,
    /// Each elector's end: its lease and `Err(why)` if it failed.
    ended: mpsc::UnboundedReceiver<super::leases::ElectorEnd>,
    runtime: Arc<PluginRuntime>,
    engine: PluginEngine,
    monitoring: Option<Monitoring>,
    fixed: reload::Fixed,
    reloads: Option<reload::Reload>,
    /// The files the watcher watches, if it runs.
    files: watch::Sender<Vec<PathBuf>>,
    /// The tags of registry plugins the tag watcher watches, if it runs.
    tags: watch::Sender<super::pull::Tags>,
    watch_stop: CancellationToken,
    /// The leases `baton yield` may reach.
    controlled: SharedLeases,
    control_stop: CancellationToken,
    /// Electors that failed, and why.
    failures: Vec<(String, ElectorFailure)>,
    /// Leases whose tasks could not be confirmed stopped.
    unconfirmed: Vec<String>,
    /// Plugins that could not be loaded at start.
    failed_plugins: usize,
}

/// What the daemon is made of once the plugins are loaded.
struct Parts {
    store: Arc<dyn LeaseStore>,
    buckets: Option<Arc<dyn BucketStore>>,
    election: tokio::runtime::Handle,
    monitoring: Option<Monitoring>,
    engine: PluginEngine,
    runtime: Arc<PluginRuntime>,
    fixed: reload::Fixed,
}

impl Daemon {
    /// Starts an elector per lease and a supervisor per loaded plugin, the
    /// spreader, and the file watcher if asked for.
    async fn start(
        config: Config,
        parts: Parts,
        loaded: &Loaded,
        reloads: Option<reload::Reload>,
    ) -> Result<Daemon, ServeError> {
        let (ended_tx, ended) = mpsc::unbounded_channel();
        let metrics = parts.monitoring.as_ref().map(|m| m.metrics.clone());
        let routing = super::route::routing(&config, &parts.election, metrics).await?;
        let launcher = Launcher {
            store: parts.store.clone(),
            clock: TermClock::system(),
            election: parts.election,
            election_observer: match &parts.monitoring {
                Some(m) => m.metrics.clone(),
                None => Arc::new(NoObserver),
            },
            task_observer: match &parts.monitoring {
                Some(m) => m.metrics.clone(),
                None => Arc::new(NoTaskObserver),
            },
            health: parts.monitoring.as_ref().map(|o| o.health.clone()),
            identity: config.identity.clone(),
            buckets: parts.buckets.clone(),
            ended: ended_tx,
            hosts: parts.runtime.hosts().clone(),
            spread: None,
            gate: Arc::new(ClaimGate::new(parts.store)),
            host: HostHandle::new(HostInfo {
                address: config.advertised(),
                draining: false,
                weight: config.weight,
                versions: BTreeMap::new(),
            }),
            routing,
        };
        let (files, _) = watch::channel(reload::watched_files(&config));
        let (tags, _) = watch::channel(super::pull::Tags::default());
        let mut daemon = Daemon {
            config,
            launcher,
            runs: BTreeMap::new(),
            plugins: BTreeMap::new(),
            removed: BTreeMap::new(),
            ended,
            runtime: parts.runtime,
            engine: parts.engine,
            monitoring: parts.monitoring,
            fixed: parts.fixed,
            reloads,
            files,
            tags,
            watch_stop: CancellationToken::new(),
            controlled: SharedLeases::default(),
            control_stop: CancellationToken::new(),
            failures: Vec::new(),
            unconfirmed: Vec::new(),
            failed_plugins: loaded.failed,
        };
        daemon.publish_sources();
        daemon.start_leases(&loaded.plugins);
        if daemon.runs.is_empty() && loaded.failed > 0 {
            return Err(ServeError::NothingToRun(loaded.failed));
        }
        // Spreading: this host's membership record, and its electors
        // steered so that each host leads its share. Reloads replace the
        // spreader when what it should do changes (`Launcher::respread`).
        let wanted = wanted_spread(&daemon.config, &daemon.runs, &daemon.plugins);
        daemon.launcher.respread(wanted, &daemon.runs).await;
        sync_controlled(&daemon.controlled, &daemon.runs, &daemon.plugins);
        daemon.watch_files();
        Ok(daemon)
    }

    /// An elector per configured lease, with a supervisor per plugin of it
    /// that was loaded; a lease none of whose plugins loaded is left out.
    fn start_leases(&mut self, loaded: &[(String, Arc<Plugin>)]) {
        for lease in &self.config.leases {
            let configured = self
                .config
                .plugins
                .iter()
                .filter(|p| p.lease == lease.name)
                .count();
            if configured > 0 && !loaded.iter().any(|(l, _)| l == &lease.name) {
                // Holding a lease whose tasks cannot run would keep a
                // healthy standby from running them.
                tracing::error!(lease = %lease.name, "no plugin of this lease could be loaded; not contending for it");
                continue;
            }
            let mut run = self.launcher.lease(lease, None);
            for (_, plugin) in loaded.iter().filter(|(l, _)| l == &lease.name) {
                let p = self
                    .config
                    .plugins
                    .iter()
                    .find(|p| p.spec.name == plugin.name())
                    .expect("a loaded plugin is configured");
                let hash = Some(plugin.content_hash());
                let supervised = self.launcher.plugin(&mut run, p, plugin.clone(), hash, None);
                self.plugins.insert(p.spec.name.clone(), supervised);
            }
            self.runs.insert(lease.name.clone(), run);
        }
    }

    /// Starts the watcher of the configuration and plugin files, when the
    /// host watches them.
    fn watch_files(&mut self) {
        let Some(tx) = self.reloads.as_mut().and_then(|r| r.watch.take()) else {
            return;
        };
        let files = self.files.subscribe();
        tracing::info!(
            files = files.borrow().len(),
            "watching the configuration and plugin files for changes"
        );
        tokio::spawn(reload::watch_files(files, tx.clone(), self.watch_stop.clone()));
        let tags = self.tags.subscribe();
        tokio::spawn(super::pull::watch_tags(tags, tx, self.watch_stop.clone()));
    }

    /// Publishes what the registry plugins run (see [`super::pull::publish`]).
    fn publish_sources(&self) {
        let metrics = self.monitoring.as_ref().map(|m| &*m.metrics);
        let (config, cache) = (&self.config, &self.fixed.cache_dir);
        super::pull::publish(config, cache, &self.launcher.host, &self.tags, metrics);
    }

    /// Serves the control socket (`baton yield` reaches the electors
    /// through it) until the shutdown.
    fn serve_control(&self, control: Option<ControlSocket>) -> Option<tokio::task::JoinHandle<()>> {
        control.map(|socket| {
            let host = ControlledHost {
                identity: self.config.identity.clone(),
                config: self
                    .config
                    .source
                    .as_ref()
                    .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
                leases: self.controlled.clone(),
                host: self.launcher.host.clone(),
            };
            tokio::spawn(socket.serve(host, self.control_stop.clone()))
        })
    }

    /// Serves until an elector fails (it never ends on its own, and one
    /// told to stop by a reload has handed its lease over), applying
    /// reloads as they come; returns that elector's lease and why it
    /// failed. [`serve`] drops it when the shutdown comes, which finds it
    /// either waiting for the next of those or applying a reload (which is
    /// then abandoned).
    async fn run(&mut self) -> (String, ElectorFailure) {
        loop {
            tokio::select! {
                Some((lease, result)) = self.ended.recv() => match result {
                    Ok(()) if self.runs.get(&lease).is_some_and(|r| r.retiring) => self.retired(lease),
                    result => return (lease, result.err().unwrap_or(ElectorFailure::StoppedOnItsOwn)),
                },
                Some(cause) = next_reload(&mut self.reloads) => {
                    let load = self.reloads.as_ref().expect("a reload came").load.clone();
                    let outcome = self.reload_once(&cause, &load).await;
                    self.reloaded(&cause, outcome);
                }
                else => std::future::pending().await,
            }
        }
    }

    /// The elector of `lease`, removed by a reload, handed its lease over
    /// and returned: its tasks are awaited in the background, and the
    /// lease is no longer contended for.
    fn retired(&mut self, lease: String) {
        let mut run = self.runs.remove(&lease).expect("present");
        run.ended = true;
        let clock = self.launcher.clock.clone();
        tokio::spawn(async move {
            run.wait_for_tasks(&lease, &clock).await;
            tracing::info!(
                lease,
                "lease removed by a reload: handed over, no longer contended for"
            );
        });
    }

    /// The elector of `lease` failed with `reason`: its guests are stopped
    /// before anything else, and the failure is kept for
    /// [`shut_down`](Self::shut_down) to return.
    async fn elector_failed(&mut self, lease: String, reason: ElectorFailure) {
        let clock = self.launcher.clock.clone();
        if let Some(run) = self.runs.get_mut(&lease) {
            run.failed(&lease, &reason, &clock);
            if !run.wait_for_tasks(&lease, &clock).await {
                self.unconfirmed.push(lease.clone());
            }
        }
        self.failures.push((lease, reason));
    }

    /// After a reload: the new configuration in force, or the refusal said.
    fn reloaded(&mut self, cause: &reload::Cause, outcome: Result<Option<Config>, ReloadRefused>) {
        let ok = match outcome {
            Ok(Some(new)) => {
                self.config = new;
                self.launcher.store.set_timings(store_timings(&self.config));
                self.files.send_replace(reload::watched_files(&self.config));
                self.publish_sources();
                sync_controlled(&self.controlled, &self.runs, &self.plugins);
                if let Some(m) = &self.monitoring {
                    let all: Vec<_> = self
                        .plugins
                        .values()
                        .map(|p| (p.lease.clone(), p.version.borrow().clone()))
                        .collect();
                    m.metrics.loaded(&all, 0, &self.engine);
                    m.metrics.leases(&self.config.leases);
                }
                true
            }
            Ok(None) => true,
            Err(why) => {
                tracing::error!(cause = %cause, error = %why, "reload refused: nothing was changed; the running configuration and plugins go on");
                false
            }
        };
        if let Some(m) = &self.monitoring {
            m.metrics.reloaded(ok);
        }
    }

    /// Shuts down in order: every task told and stopped, then every lease
    /// handed over (the membership record first), then the spreader and
    /// the control socket. Returns the number of plugins that could not be
    /// loaded at start, or why the run failed.
    async fn shut_down(mut self, control: Option<tokio::task::JoinHandle<()>>) -> Result<usize, ServeError> {
        self.watch_stop.cancel();
        self.plugins.clear();
        tracing::info!("shutting down: stopping leader tasks, then releasing leases");
        self.control_stop.cancel();
        // The membership record goes first, so that the other hosts prefer
        // this host's leases for themselves by the time they are released.
        if let Some(spread) = &self.launcher.spread {
            spread.stop.cancel();
        }
        for run in self.runs.values() {
            run.intent.send_replace(Intent::Stop);
        }
        self.await_handovers().await;
        let clock = self.launcher.clock.clone();
        for (lease, run) in &mut self.runs {
            if !run.wait_for_tasks(lease, &clock).await && !self.unconfirmed.contains(lease) {
                self.unconfirmed.push(lease.clone());
            }
        }
        if let Some(spread) = self.launcher.spread.take() {
            let _ = spread.task.await;
        }
        if let Some(control) = control {
            // The socket is removed.
            let _ = control.await;
        }
        tracing::info!("baton stopped");
        if let Some((lease, failure)) = self.failures.into_iter().next() {
            return Err(ServeError::ElectorFailed {
                lease,
                reason: failure.to_string(),
            });
        }
        if !self.unconfirmed.is_empty() {
            return Err(ServeError::TasksNotStopped(self.unconfirmed.join(", ")));
        }
        Ok(self.failed_plugins)
    }

    /// Waits for each elector to hand its lease over (drain, then release)
    /// and return; each bounds its own wait, and the bound here only
    /// guards against a bug.
    async fn await_handovers(&mut self) {
        let clock = self.launcher.clock.clone();
        let bound = self
            .runs
            .values()
            .map(|r| r.handover_bound)
            .max()
            .unwrap_or_default();
        let deadline = tokio::time::Instant::now() + bound;
        while self.runs.values().any(|r| !r.ended) {
            match tokio::time::timeout_at(deadline, self.ended.recv()).await {
                Ok(Some((lease, result))) => {
                    if let Some(run) = self.runs.get_mut(&lease) {
                        run.ended = true;
                        if let Err(reason) = result {
                            run.failed(&lease, &reason, &clock);
                            self.failures.push((lease, reason));
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    for (lease, run) in self.runs.iter_mut().filter(|(_, r)| !r.ended) {
                        let reason = ElectorFailure::NoHandover(bound);
                        run.failed(lease, &reason, &clock);
                        self.failures.push((lease.clone(), reason));
                    }
                    break;
                }
            }
        }
    }
}

/// The next reload request; pending forever without reloads.
async fn next_reload(reloads: &mut Option<reload::Reload>) -> Option<reload::Cause> {
    match reloads {
        Some(r) => r.requests.recv().await,
        None => std::future::pending().await,
    }
}
