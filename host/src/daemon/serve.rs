//! `baton run`: joins the parts. One elector per lease, one supervisor per
//! plugin, and an orderly shutdown: tell the tasks, wait for them (grace,
//! then force), and only then release each lease.
//!
//! The electors and the lease store run on a runtime of their own (one
//! thread, `baton-election`), apart from the guests: a guest that blocks a
//! worker thread (inline file I/O on a slow disk, a busy loop between two
//! epoch ticks) cannot delay a renewal or a step-down. The two sides share
//! only each lease's status channel and its [`Term`](crate::election::Term).
//!
//! Electors are supervised: one that panics or ends on its own is reported,
//! its lease's tasks are stopped, the other leases are handed over as in a
//! shutdown, and [`serve`] fails, without releasing that lease (so it
//! expires normally).
//!
//! The spreader ([`Spreader`]) runs on the election runtime too, when the
//! configuration calls for one (`spread_for`): it keeps this host's
//! membership record and, with spreading on, *steers* the electors' intents.
//! A reload that changes what it should do replaces it
//! (`Launcher::respread`): the old one is stopped, the leases go back to
//! contending if the new one does not steer, and the new one steers them
//! from its first listing; later reloads tell it of added and removed
//! leases.
//!
//! With an admin address configured, it also serves `/metrics`,
//! `/healthz` and `/readyz` from a thread of its own ([`admin`](crate::ops::admin)):
//! the electors and supervisors report to [`Metrics`], and [`Health`]
//! watches both runtimes, every elector's heartbeat and what it publishes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::apply::ReloadRefused;
pub use super::error::ServeError;
use super::leases::{ElectorFailure, Launcher, sync_controlled, wanted_spread};
use super::load::{Loaded, load_plugins};
use super::state::{Daemon, Monitoring};
use super::stores::store_timings;
pub use super::stores::{open_store, open_stores};
use crate::config::Config;
use crate::daemon::control::{ControlSocket, ControlledHost, SharedLeases};
use crate::daemon::reload;
use crate::election::{ClaimGate, HostHandle, Intent, NoObserver, TermClock};
use crate::ops::admin::AdminServer;
use crate::ops::health::Health;
use crate::ops::metrics::Metrics;
use crate::runtime::{EngineOptions, Plugin, PluginEngine, PluginRuntime, PoolLimits, default_cache_dir};
use crate::store::buckets::BucketStore;
use crate::store::{HostInfo, LeaseStore};
use crate::supervisor::NoTaskObserver;

/// How [`serve_opts`] runs, beyond the configuration.
pub struct ServeOptions {
    /// The lease store to use instead of the configured one (tests that
    /// inject store faults).
    pub store: Option<Arc<dyn LeaseStore>>,
    /// The clock of term deadlines.
    pub clock: TermClock,
    /// Test hook (`baton run --test-stall-election-runtime DELAY`, hidden):
    /// this long after start, the election runtime's only thread blocks
    /// for an hour, as a runtime whose worker hangs would. Only for tests
    /// of `/healthz`: the process is not usable afterwards.
    pub stall_election_after: Option<Duration>,
    /// Reloads (SIGHUP, a watched file): see [`crate::daemon::reload`]. `None`:
    /// none.
    pub reload: Option<crate::daemon::reload::Reload>,
    /// The buckets to use instead of the configured store's (tests); with
    /// [`store`](Self::store) given and this not, plugins have none.
    pub buckets: Option<Arc<dyn BucketStore>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            store: None,
            clock: TermClock::system(),
            stall_election_after: None,
            reload: None,
            buckets: None,
        }
    }
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

/// Runs the configured leases and plugins until `shutdown` is cancelled,
/// then drains every task and releases every lease.
///
/// A plugin that cannot be loaded is reported (naming it) and left out;
/// the others run. Returns the number of plugins that failed to load, or
/// [`ServeError::NothingToRun`] at once if that leaves no lease to contend
/// for.
pub async fn serve(config: Config, shutdown: CancellationToken) -> Result<usize, ServeError> {
    serve_with(config, None, TermClock::system(), shutdown).await
}

/// [`serve`], on a given store (instead of the configured one) and clock:
/// for tests that inject store faults.
pub async fn serve_with(
    config: Config,
    store: Option<Arc<dyn LeaseStore>>,
    clock: TermClock,
    shutdown: CancellationToken,
) -> Result<usize, ServeError> {
    let options = ServeOptions {
        store,
        clock,
        ..ServeOptions::default()
    };
    serve_opts(config, options, shutdown).await
}

/// [`serve`], with [`ServeOptions`]: the phases of a run, in order.
pub async fn serve_opts(
    mut config: Config,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<usize, ServeError> {
    // First, so that liveness answers while the plugins compile.
    let (monitoring, _admin) = start_admin(&config)?;
    let cache_dir = config.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let engine = open_engine(&config, &cache_dir)?;
    // Before anything contends: a host that would share another's socket
    // does not start.
    let control = bind_control(&config)?;
    let control_path = control.as_ref().map(|c| c.path().to_path_buf());
    check_own_files(&config, &cache_dir, control_path.as_deref())?;
    let election = ElectionRuntime::start()?;
    election.watched(monitoring.as_ref(), options.stall_election_after);
    let (store, buckets) = match options.store {
        Some(store) => (store, options.buckets),
        None => {
            let (store, buckets) = election.open_stores(&config).await?;
            (store, Some(options.buckets.unwrap_or(buckets)))
        }
    };
    tracing::info!(identity = %config.identity, store = %store.describe(), cache = %cache_dir.display(), advertised = config.advertised().as_deref().unwrap_or(""), "baton starting");
    // On a terminal, the plugins loaded out of all and a spinner per
    // compilation in flight, until every plugin is loaded.
    let progress = Arc::new(crate::ops::logging::progress(config.plugins.len()));
    let mut runtime = PluginRuntime::new(engine.clone())?;
    runtime.set_compile_observer(progress.clone());
    if let Some(buckets) = &buckets {
        tracing::info!(buckets = %buckets.describe(), "plugins' key-value buckets");
        runtime.set_bucket_store(buckets.clone());
    } else if let Some(p) = config.plugins.iter().find(|p| p.schedule.is_some()) {
        return Err(ServeError::Store(format!(
            "plugin {:?} has a schedule, which keeps its progress in the store's buckets, and this store has none",
            p.spec.name
        )));
    }
    let runtime = Arc::new(runtime);
    let unpulled = super::pull::pull_plugins(&mut config, &cache_dir, None, &shutdown).await;
    let loaded = load_plugins(&config, &runtime, &progress, &shutdown, unpulled).await;
    if loaded.cancelled {
        return Ok(loaded.failed);
    }
    loaded.report(monitoring.as_ref(), &engine, &runtime);
    let fixed = fixed_settings(&config, cache_dir, control_path);
    let parts = Parts {
        store,
        buckets,
        clock: options.clock,
        election: election.handle().clone(),
        monitoring,
        engine,
        runtime,
        fixed,
    };
    let mut daemon = Daemon::start(config, parts, &loaded, options.reload).await?;
    let control = daemon.serve_control(control);
    daemon.run(&shutdown).await;
    daemon.shut_down(control).await
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

/// What the daemon is made of once the plugins are loaded.
struct Parts {
    store: Arc<dyn LeaseStore>,
    buckets: Option<Arc<dyn BucketStore>>,
    clock: TermClock,
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
            clock: parts.clock,
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

    /// Serves until `shutdown`, or until an elector fails (it never ends on
    /// its own, and one told to stop by a reload has handed its lease
    /// over), applying reloads as they come.
    async fn run(&mut self, shutdown: &CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Some((lease, result)) = self.ended.recv() => {
                    if !self.elector_ended(lease, result).await {
                        return;
                    }
                }
                Some(cause) = next_reload(&mut self.reloads) => {
                    let load = self.reloads.as_ref().expect("a reload came").load.clone();
                    let outcome = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        outcome = self.reload_once(&cause, &load) => outcome,
                    };
                    self.reloaded(&cause, outcome);
                }
            }
        }
    }

    /// The elector of `lease` returned with `result`. `true` if serving
    /// goes on: it was removed by a reload and handed its lease over.
    /// Otherwise it failed: its guests are stopped before anything else.
    async fn elector_ended(&mut self, lease: String, result: Result<(), ElectorFailure>) -> bool {
        if let Some(run) = self.runs.get_mut(&lease).filter(|r| r.retiring && result.is_ok()) {
            run.ended = true;
            let mut run = self.runs.remove(&lease).expect("present");
            let clock = self.launcher.clock.clone();
            tokio::spawn(async move {
                run.wait_for_tasks(&lease, &clock).await;
                tracing::info!(
                    lease,
                    "lease removed by a reload: handed over, no longer contended for"
                );
            });
            return true;
        }
        let reason = result.err().unwrap_or(ElectorFailure::StoppedOnItsOwn);
        let clock = self.launcher.clock.clone();
        if let Some(run) = self.runs.get_mut(&lease) {
            run.failed(&lease, &reason, &clock);
            if !run.wait_for_tasks(&lease, &clock).await {
                self.unconfirmed.push(lease.clone());
            }
        }
        self.failures.push((lease, reason));
        false
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

/// The most threads of the election runtime's blocking pool (see
/// [`ElectionRuntime::start`]).
const ELECTION_BLOCKING_THREADS: usize = 8;

/// The runtime of the electors and the store; see the [module
/// documentation](self). Shut down in the background when dropped (an
/// elector stuck in a request does not hold up the exit).
struct ElectionRuntime(Option<tokio::runtime::Runtime>);

impl ElectionRuntime {
    fn start() -> Result<ElectionRuntime, ServeError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            // The embedded store's file work runs on the blocking pool, a
            // request at a time per lease, each well under a millisecond on
            // a healthy disk: a host with 100 leases has about one in
            // flight. Without a cap, the pool kept the thread per lease it
            // grew to at start (every lease acquired at once), each woken
            // cold every few seconds. A request stuck in a hung file system
            // holds a thread; its elector's timeout does not wait for it,
            // so a full pool delays requests, never a step-down.
            .max_blocking_threads(ELECTION_BLOCKING_THREADS)
            .thread_name("baton-election")
            .enable_all()
            .build()
            .map(|rt| ElectionRuntime(Some(rt)))
            .map_err(ServeError::ElectionRuntime)
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("running").handle()
    }

    /// Its thread watched by the health checks; and the test hook that
    /// blocks it `stall_after` after start.
    fn watched(&self, monitoring: Option<&Monitoring>, stall_after: Option<Duration>) {
        if let Some(monitoring) = monitoring {
            monitoring.health.watch_runtime("election", self.handle());
        }
        if let Some(after) = stall_after {
            self.handle().spawn(async move {
                tokio::time::sleep(after).await;
                tracing::warn!("test hook: the election runtime's thread blocks for an hour now");
                std::thread::sleep(Duration::from_secs(3600));
            });
        }
    }

    /// Opens the configured store on this runtime, where its requests run.
    async fn open_stores(
        &self,
        config: &Config,
    ) -> Result<(Arc<dyn LeaseStore>, Arc<dyn BucketStore>), ServeError> {
        let config = config.clone();
        self.handle()
            .spawn(async move { open_stores(&config).await })
            .await
            .map_err(|e| ServeError::Store(format!("opening the store failed: {e}")))?
    }
}

impl Drop for ElectionRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
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
