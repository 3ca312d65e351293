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
//! membership record and, with spreading on, steers the electors' intents.
//! A reload that changes what it should do replaces it
//! (`Started::respread`): the old one is stopped, the leases go back to
//! contending if the new one does not steer, and the new one steers them
//! from its first listing; later reloads tell it of added and removed
//! leases.
//!
//! With an admin address configured, it also serves `/metrics`,
//! `/healthz` and `/readyz` from a thread of its own ([`admin`](crate::admin)):
//! the electors and supervisors report to [`Metrics`], and [`Health`]
//! watches both runtimes, every elector's heartbeat and what it publishes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::AdminServer;
use crate::config::{Config, StoreConfig};
use crate::config::{LeaseConfig, PluginConfig, ReloadMode};
use crate::control::{ControlSocket, ControlledHost, ControlledLease, SharedLeases};
use crate::election::LeaseClaims;
use crate::election::spread::{LeaseChange, SpreadConfig, Spreader, SteeredLease, unsteer};
use crate::election::{
    ClaimGate, DRAIN_ALLOWANCE, ElectionObserver, Elector, ElectorConfig, Hosts, Intent, LeaseView,
    NoObserver, TermClock, Timings,
};
use crate::health::Health;
use crate::logging::human;
use crate::metrics::Metrics;
use crate::reload;
use crate::runtime::Plugin;
use crate::runtime::{
    EngineOptions, PluginEngine, PluginRuntime, PoolLimits, RuntimeError, default_cache_dir,
};
use crate::store::embedded::EmbeddedStore;
use crate::store::kube::{KubeOptions, KubeStore};
use crate::store::{LeaseStore, StoreError, StoreTimings};
use crate::supervisor::{Admission, NoTaskObserver, TaskObserver, run_leader_tasks_of};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The wasm engine could not be set up.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The lease store could not be opened.
    #[error("{0}")]
    Store(String),
    /// No plugin can run (each was reported when it failed to load) and
    /// every lease has plugins, so no lease is contended for: there is
    /// nothing to serve, and a supervisor (systemd, Kubernetes) should see
    /// the host fail.
    #[error(
        "none of the {0} configured plugins can run (each is named in the errors above); nothing to serve"
    )]
    NothingToRun(usize),
    /// An elector panicked or ended on its own; its lease's tasks were
    /// stopped and the lease was not released.
    #[error(
        "the elector of lease {lease:?} failed: {reason}; its tasks were stopped and the lease was left to expire"
    )]
    ElectorFailed {
        /// The lease.
        lease: String,
        /// The panic message, or what happened.
        reason: String,
    },
    /// Shutting down, some leader tasks could not be confirmed stopped
    /// (stuck in a host call); their leases were left to expire.
    #[error("leader tasks of lease(s) {0} could not be confirmed stopped; those leases were left to expire")]
    TasksNotStopped(String),
    /// The election's runtime could not be started.
    #[error("cannot start the election runtime: {0}")]
    ElectionRuntime(String),
    /// The admin endpoints could not listen on the configured address.
    #[error("admin-address {address}: cannot serve /metrics, /healthz and /readyz there: {error}")]
    Admin {
        /// The configured address.
        address: SocketAddr,
        /// Why not.
        error: String,
    },
    /// The control socket could not be set up.
    #[error("{0}")]
    Control(String),
    /// A plugin's `dirs` grant reaches the host's own files (see
    /// [`crate::own_files`]).
    #[error("{0}")]
    Grants(String),
}

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
    /// Reloads (SIGHUP, a watched file): see [`crate::reload`]. `None`:
    /// none.
    pub reload: Option<crate::reload::Reload>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            store: None,
            clock: TermClock::system(),
            stall_election_after: None,
            reload: None,
        }
    }
}

/// The control socket of `config` (see [`crate::control`]): the one it
/// sets, or the default one beside its file; none for a configuration
/// without a file that sets none.
fn bind_control(config: &Config) -> Result<Option<ControlSocket>, ServeError> {
    match (&config.control_socket, &config.source) {
        (Some(path), _) => ControlSocket::bind(path).map(Some),
        (None, Some(file)) => ControlSocket::bind_default(Some(file), &config.identity),
        (None, None) => Ok(None),
    }
    .map_err(|e| ServeError::Control(e.to_string()))
}

/// The admin endpoints of one run, when configured.
struct Ops {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Serves until dropped, at the end of [`serve_opts`].
    _server: AdminServer,
}

/// Opens the configured lease store. For a Kubernetes store this builds
/// the client (no request is made yet): a Lease with a holder but no
/// duration is read as the longest configured lease duration, and the
/// client's connect timeout is the shortest configured request timeout.
pub async fn open_store(config: &Config) -> Result<Arc<dyn LeaseStore>, ServeError> {
    match &config.store {
        StoreConfig::Embedded { dir } => EmbeddedStore::open(dir)
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| ServeError::Store(format!("embedded store at {}: {e}", dir.display()))),
        StoreConfig::Kubernetes {
            namespace,
            kubeconfig,
            labels,
        } => {
            let timings = store_timings(config);
            let options = KubeOptions {
                namespace: namespace.clone(),
                kubeconfig: kubeconfig.clone(),
                labels: labels.clone(),
                fallback_duration: timings.fallback_duration,
                request_timeout: timings.request_timeout,
                watch_timeout_secs: None,
            };
            KubeStore::connect(options)
                .await
                .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
                .map_err(|e| match e {
                    // Not about any one lease.
                    StoreError::Refused { detail, .. } => {
                        ServeError::Store(format!("kubernetes store: {detail}"))
                    }
                    other => ServeError::Store(format!("kubernetes store: {other}")),
                })
        }
    }
}

/// What the store derives from the configured leases' timings: the longest
/// lease duration (read for a record with a holder but no duration) and
/// the shortest request timeout; the defaults' without leases. Given to the
/// store when it is opened, and again after every applied reload.
pub fn store_timings(config: &Config) -> StoreTimings {
    let defaults = crate::election::Timings::default();
    let leases = || config.leases.iter().map(|l| l.timings);
    StoreTimings {
        fallback_duration: leases()
            .map(|t| t.lease_duration)
            .max()
            .unwrap_or(defaults.lease_duration),
        request_timeout: leases()
            .map(|t| t.request_timeout)
            .min()
            .unwrap_or(defaults.request_timeout),
    }
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

/// [`serve`], with [`ServeOptions`].
pub async fn serve_opts(
    config: Config,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<usize, ServeError> {
    let ServeOptions {
        store,
        clock,
        stall_election_after,
        reload,
    } = options;
    // First, so that liveness answers while the plugins compile.
    let ops = match config.admin_address {
        Some(address) => {
            let metrics = Arc::new(Metrics::new());
            let health = Arc::new(Health::new());
            health.loading(config.plugins.len());
            let server = crate::admin::start(address, metrics.clone(), health.clone()).map_err(|e| {
                ServeError::Admin {
                    address,
                    error: e.to_string(),
                }
            })?;
            tracing::info!(address = %server.address(), "admin endpoints listening: /metrics, /healthz, /readyz");
            health.watch_runtime("guest", &tokio::runtime::Handle::current());
            Some(Ops {
                metrics,
                health,
                _server: server,
            })
        }
        None => None,
    };
    let election_observer: Arc<dyn ElectionObserver> = match &ops {
        Some(ops) => ops.metrics.clone(),
        None => Arc::new(NoObserver),
    };
    let task_observer: Arc<dyn TaskObserver> = match &ops {
        Some(ops) => ops.metrics.clone(),
        None => Arc::new(NoTaskObserver),
    };
    let cache_dir = config.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache_dir.clone()),
        coredump_dir: config.coredump_dir.clone(),
        largest_memory: config.plugins.iter().map(|p| p.spec.memory_limit).max(),
        pool_slots: config
            .instance_pool
            .then(|| PoolLimits::slots_for(config.plugins.len())),
    })?;
    // Before anything contends: a host that would share another's socket
    // does not start.
    let control = bind_control(&config)?;
    // No grant over the host's own files: the store, this file, the cache,
    // the socket.
    let control_path = control.as_ref().map(|c| c.path().to_path_buf());
    crate::own_files::check_grants(&config, &cache_dir, control_path.as_deref()).map_err(|e| {
        let file = config.source.as_ref().map(|f| format!("{}: ", f.display()));
        ServeError::Grants(format!("{}{e}", file.unwrap_or_default()))
    })?;
    let election = ElectionRuntime::start()?;
    if let Some(ops) = &ops {
        ops.health.watch_runtime("election", election.handle());
    }
    if let Some(after) = stall_election_after {
        election.handle().spawn(async move {
            tokio::time::sleep(after).await;
            tracing::warn!("test hook: the election runtime's thread blocks for an hour now");
            std::thread::sleep(Duration::from_secs(3600));
        });
    }
    let store = match store {
        Some(store) => store,
        None => {
            let config = config.clone();
            election
                .handle()
                .spawn(async move { open_store(&config).await })
                .await
                .map_err(|e| ServeError::Store(format!("opening the store failed: {e}")))??
        }
    };
    tracing::info!(identity = %config.identity, store = %store.describe(), cache = %cache_dir.display(), "baton starting");
    // On a terminal, the plugins loaded out of all and a spinner per
    // compilation in flight, until the loop below is done.
    let progress = Arc::new(crate::logging::progress(config.plugins.len()));
    let mut runtime = PluginRuntime::new(engine.clone())?;
    runtime.set_compile_observer(progress.clone());
    let runtime = Arc::new(runtime);

    // Compile every plugin before contending, so that winning a lease costs
    // an instantiation, not a compilation: several at once (one per core;
    // wasmtime also compiles a component's functions in parallel), each
    // distinct component once however many plugins name it.
    let mut failed = 0;
    let mut refusals = Vec::new();
    let mut loaded = Vec::new();
    let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
    let specs: Vec<_> = config.plugins.iter().map(|p| p.spec.clone()).collect();
    let loader = runtime.clone();
    // On threads of their own rather than the blocking pool: a shutdown
    // during start-up abandons them (nothing is led yet), and the exit
    // does not wait for a compilation that may take a minute.
    let mut loads = futures::stream::iter(specs.into_iter().map(move |spec| {
        let rt = loader.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("baton-compile".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let result = rt.load(&spec);
                let _ = tx.send((result, started.elapsed()));
            });
        async move {
            spawned.map_err(|e| format!("cannot start its thread: {e}"))?;
            rx.await.map_err(|_| "it panicked".to_owned())
        }
    }))
    .buffered(parallel);
    for p in &config.plugins {
        // Before any lease is contended for, SIGTERM and SIGINT end the
        // start-up at once.
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                progress.end();
                tracing::info!(
                    loaded = loaded.len(),
                    plugins = config.plugins.len(),
                    "shut down during start-up, before any lease was contended for; compilations in flight are abandoned"
                );
                return Ok(failed);
            }
            next = loads.next() => match next {
                Some(result) => result,
                None => break,
            },
        };
        progress.step();
        match result {
            Ok((Ok(plugin), took)) => {
                tracing::info!(
                    plugin = plugin.name(),
                    lease = %p.lease,
                    world = plugin.wit_world(),
                    grants = %p.spec.grants(),
                    load_ms = crate::logging::ms(took),
                    "plugin loaded"
                );
                loaded.push((p.lease.clone(), Arc::new(plugin)));
            }
            Ok((Err(e), _)) => {
                failed += 1;
                refusals.push(format!("{}: {}", p.spec.name, e.reason));
                tracing::error!(plugin = %p.spec.name, error = %e, "plugin cannot run; the others go on");
            }
            Err(e) => {
                failed += 1;
                refusals.push(format!("{}: loading it failed: {e}", p.spec.name));
                tracing::error!(plugin = %p.spec.name, error = %e, "loading the plugin failed; the others go on");
            }
        }
    }
    drop(loads);
    progress.end();
    if shutdown.is_cancelled() {
        tracing::info!("shut down during start-up, before any lease was contended for");
        return Ok(failed);
    }
    if let Some(ops) = &ops {
        ops.metrics.loaded(&loaded, failed, &engine);
        ops.health.loaded(refusals);
    }
    if let Some((hits, misses)) = engine.cache_stats() {
        tracing::info!(
            hits,
            misses,
            plugins = loaded.len(),
            components = runtime.components(),
            "compiled-code cache"
        );
    }

    let (ended_tx, mut ended) = mpsc::unbounded_channel();
    let mut runs: BTreeMap<String, LeaseRun> = BTreeMap::new();
    let mut plugins: BTreeMap<String, PluginRun> = BTreeMap::new();
    // Plugins a reload removed, until their supervisor has returned (no
    // task of them runs any more): a plugin of the same name added again
    // waits for it.
    let mut retired: BTreeMap<String, CancellationToken> = BTreeMap::new();
    let started = Started {
        store: store.clone(),
        clock: clock.clone(),
        election: election.handle().clone(),
        election_observer: election_observer.clone(),
        task_observer: task_observer.clone(),
        health: ops.as_ref().map(|o| o.health.clone()),
        identity: config.identity.clone(),
        ended: ended_tx.clone(),
        hosts: runtime.hosts().clone(),
        spread: None,
        gate: Arc::new(ClaimGate::new(store.clone())),
    };
    for lease in &config.leases {
        let configured = config.plugins.iter().filter(|p| p.lease == lease.name).count();
        if configured > 0 && !loaded.iter().any(|(l, _)| l == &lease.name) {
            // Holding a lease whose tasks cannot run would keep a healthy
            // standby from running them.
            tracing::error!(lease = %lease.name, "no plugin of this lease could be loaded; not contending for it");
            continue;
        }
        let mut run = started.lease(lease, None);
        for (_, plugin) in loaded.iter().filter(|(l, _)| l == &lease.name) {
            let p = config
                .plugins
                .iter()
                .find(|p| p.spec.name == plugin.name())
                .expect("a loaded plugin is configured");
            plugins.insert(
                p.spec.name.clone(),
                started.plugin(&mut run, p, plugin.clone(), Some(plugin.content_hash()), None),
            );
        }
        runs.insert(lease.name.clone(), run);
    }
    drop(ended_tx);

    if runs.is_empty() && failed > 0 {
        return Err(ServeError::NothingToRun(failed));
    }

    // Spreading: this host's membership record, and its electors steered
    // so that each host leads its share. Reloads replace the spreader when
    // what it should do changes (`Started::respread`).
    let mut started = started;
    let wanted = wanted_spread(&config, &runs, &plugins);
    started.respread(wanted, &runs).await;

    // `baton yield` reaches the electors through the control socket.
    let controlled = SharedLeases::default();
    sync_controlled(&controlled, &runs);
    let control_stop = CancellationToken::new();
    let control = control.map(|socket| {
        let host = ControlledHost {
            identity: config.identity.clone(),
            config: config
                .source
                .as_ref()
                .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
            leases: controlled.clone(),
        };
        tokio::spawn(socket.serve(host, control_stop.clone()))
    });

    // Reloads: SIGHUP, and the watcher of the files when asked for.
    let mut reloads = reload;
    let watch_stop = CancellationToken::new();
    let (files_tx, files_rx) = watch::channel(reload::watched_files(&config));
    if let Some(tx) = reloads.as_mut().and_then(|r| r.watch.take()) {
        tracing::info!(
            files = files_rx.borrow().len(),
            "watching the configuration and plugin files for changes"
        );
        tokio::spawn(reload::watch_files(files_rx, tx, watch_stop.clone()));
    }
    let fixed = reload::Fixed {
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
        cache_dir: cache_dir.clone(),
        control_socket: control_path,
    };
    let mut config = config;

    // Until shutdown, an elector that ends (it never does on its own) or
    // panics has failed; one told to stop by a reload has handed its lease
    // over.
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut unconfirmed = Vec::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some((lease, result)) = ended.recv() => {
                if let Some(run) = runs.get_mut(&lease).filter(|r| r.retiring && result.is_ok()) {
                    run.ended = true;
                    let mut run = runs.remove(&lease).expect("present");
                    let clock = clock.clone();
                    tokio::spawn(async move {
                        run.wait_for_tasks(&lease, &clock).await;
                        tracing::info!(lease, "lease removed by a reload: handed over, no longer contended for");
                    });
                    continue;
                }
                let reason = match result {
                    Ok(()) => "it stopped on its own".to_owned(),
                    Err(reason) => reason,
                };
                if let Some(run) = runs.get_mut(&lease) {
                    run.failed(&lease, &reason, &clock);
                    // Its guests are stopped before anything else is done.
                    if !run.wait_for_tasks(&lease, &clock).await {
                        unconfirmed.push(lease.clone());
                    }
                }
                failures.push((lease, reason));
                break;
            }
            Some(cause) = next_reload(&mut reloads) => {
                let load = reloads.as_ref().expect("a reload came").load.clone();
                let outcome = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    outcome = reload_once(
                        &cause, &load, &config, &fixed, &runtime, &mut started, &mut runs, &mut plugins, &mut retired,
                    ) => outcome,
                };
                let ok = match outcome {
                    Ok(Some(new)) => {
                        config = new;
                        store.set_timings(store_timings(&config));
                        files_tx.send_replace(reload::watched_files(&config));
                        sync_controlled(&controlled, &runs);
                        if let Some(ops) = &ops {
                            let all: Vec<_> = plugins
                                .values()
                                .map(|p| (p.lease.clone(), p.version.borrow().clone()))
                                .collect();
                            ops.metrics.loaded(&all, 0, &engine);
                        }
                        true
                    }
                    Ok(None) => true,
                    Err(why) => {
                        tracing::error!(cause = %cause, error = %why, "reload refused: nothing was changed; the running configuration and plugins go on");
                        false
                    }
                };
                if let Some(ops) = &ops {
                    ops.metrics.reloaded(ok);
                }
            }
        }
    }
    watch_stop.cancel();
    drop(plugins);
    tracing::info!("shutting down: stopping leader tasks, then releasing leases");
    control_stop.cancel();
    // The membership record goes first, so that the other hosts prefer
    // this host's leases for themselves by the time they are released.
    if let Some(spread) = &started.spread {
        spread.stop.cancel();
    }
    for run in runs.values() {
        run.intent.send_replace(Intent::Stop);
    }
    // Each elector hands its lease over (drain, then release) and returns;
    // it bounds its own wait. The bound here only guards against a bug.
    let bound = runs.values().map(|r| r.handover_bound).max().unwrap_or_default();
    let deadline = tokio::time::Instant::now() + bound;
    while runs.values().any(|r| !r.ended) {
        match tokio::time::timeout_at(deadline, ended.recv()).await {
            Ok(Some((lease, result))) => {
                if let Some(run) = runs.get_mut(&lease) {
                    run.ended = true;
                    if let Err(reason) = result {
                        run.failed(&lease, &reason, &clock);
                        failures.push((lease, reason));
                    }
                }
            }
            Ok(None) => break,
            Err(_) => {
                for (lease, run) in runs.iter_mut().filter(|(_, r)| !r.ended) {
                    let reason = format!("it did not hand the lease over within {}", human(bound));
                    run.failed(lease, &reason, &clock);
                    failures.push((lease.clone(), reason));
                }
                break;
            }
        }
    }
    for (lease, run) in &mut runs {
        if !run.wait_for_tasks(lease, &clock).await && !unconfirmed.contains(lease) {
            unconfirmed.push(lease.clone());
        }
    }
    if let Some(spread) = started.spread.take() {
        let _ = spread.task.await;
    }
    if let Some(control) = control {
        // The socket is removed.
        let _ = control.await;
    }
    tracing::info!("baton stopped");
    if let Some((lease, reason)) = failures.into_iter().next() {
        return Err(ServeError::ElectorFailed { lease, reason });
    }
    if !unconfirmed.is_empty() {
        return Err(ServeError::TasksNotStopped(unconfirmed.join(", ")));
    }
    Ok(failed)
}

/// One lease being served.
struct LeaseRun {
    intent: watch::Sender<Intent>,
    view: watch::Receiver<LeaseView>,
    supervisors: JoinSet<()>,
    timings: Timings,
    /// Where a reload sends new timings (for the next term).
    new_timings: watch::Sender<Timings>,
    /// How long its elector may take to hand the lease over at shutdown,
    /// by the longest timings it had: after a reload the current term
    /// keeps the timings it began with, which may be the longer ones.
    handover_bound: Duration,
    /// Its elector has returned.
    ended: bool,
    /// A reload removed it: its elector hands it over and returns.
    retiring: bool,
    /// The plugins this host claims under it (see
    /// [`crate::election::claims`]).
    claims: LeaseClaims,
}

/// How long an elector with timings `t` may take to hand its lease over
/// (drain, release); see [`DRAIN_ALLOWANCE`]. Only a bug makes one take
/// longer.
fn handover_bound(t: &Timings) -> Duration {
    t.grace + t.renew_deadline + DRAIN_ALLOWANCE + t.request_timeout * 2
}

impl LeaseRun {
    /// Its elector failed: says so, and ends its term (the tasks are told,
    /// then stopped by force); the lease is not released.
    fn failed(&mut self, lease: &str, reason: &str, clock: &TermClock) {
        self.ended = true;
        tracing::error!(
            lease,
            reason,
            "an elector failed: its lease's tasks are stopped and the lease is not released; baton will exit with status 1"
        );
        let term = self.view.borrow().term.clone();
        if let Some(term) = term {
            term.end(clock.now());
        }
    }

    /// Waits for the lease's supervisors to return (each returns once its
    /// task is gone and the elector is), at most until the current term's
    /// force-stop time plus [`DRAIN_ALLOWANCE`]. `false` if they did not.
    async fn wait_for_tasks(&mut self, lease: &str, clock: &TermClock) -> bool {
        let term = self.view.borrow().term.clone();
        let left = term.map_or(self.timings.grace, |t| t.stop_at() - clock.now()) + DRAIN_ALLOWANCE;
        let all = async { while self.supervisors.join_next().await.is_some() {} };
        if tokio::time::timeout(left, all).await.is_err() {
            tracing::error!(
                lease,
                tasks = self.supervisors.len(),
                "leader tasks are not confirmed stopped"
            );
            self.supervisors.abort_all();
            return false;
        }
        true
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
            .map_err(|e| ServeError::ElectionRuntime(e.to_string()))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("running").handle()
    }
}

impl Drop for ElectionRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The message of a caught panic.
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// What starting a lease or a plugin needs, kept for reloads.
struct Started {
    store: Arc<dyn LeaseStore>,
    clock: TermClock,
    election: tokio::runtime::Handle,
    election_observer: Arc<dyn ElectionObserver>,
    task_observer: Arc<dyn TaskObserver>,
    health: Option<Arc<Health>>,
    identity: String,
    ended: mpsc::UnboundedSender<(String, Result<(), String>)>,
    /// Where a spreader publishes the live hosts (for guests).
    hosts: watch::Sender<Hosts>,
    /// The running spreader, if any.
    spread: Option<Spreading>,
    /// Checks, before a plugin's task starts, that no other lease claims
    /// the plugin.
    gate: Arc<ClaimGate>,
}

/// A running spreader (see [`Started::respread`]).
struct Spreading {
    /// Its settings.
    cfg: SpreadConfig,
    /// Where a reload sends the leases it adds and removes, if it steers
    /// the leases (otherwise it only keeps the membership record, for
    /// plugins that count the live hosts).
    changes: Option<mpsc::UnboundedSender<LeaseChange>>,
    /// Stops it: it releases the membership record and returns.
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Spreading {
    /// What it does: its settings, and whether it steers the leases.
    fn does(&self) -> (SpreadConfig, bool) {
        (self.cfg, self.changes.is_some())
    }
}

/// The spreader `config` calls for, for the leases of `runs` and the
/// plugins of `plugins`: see [`spread_for`].
fn wanted_spread(
    config: &Config,
    runs: &BTreeMap<String, LeaseRun>,
    plugins: &BTreeMap<String, PluginRun>,
) -> Option<(SpreadConfig, bool)> {
    let serving = runs.values().any(|r| !r.retiring);
    let wants_hosts = plugins.values().any(|p| p.version.borrow().uses_hosts());
    spread_for(config, serving, wants_hosts)
}

/// The spreader `config` calls for, the same rule at start and after every
/// reload: its settings and whether it steers the leases (spreading on:
/// `[spread]`, by default with more than one lease), or, with spreading
/// off, one that only keeps the membership record while a plugin counts
/// the live hosts (`wants_hosts`); none while the host serves no lease
/// (its record would count it among the hosts that share the leads).
fn spread_for(config: &Config, serving: bool, wants_hosts: bool) -> Option<(SpreadConfig, bool)> {
    if !serving {
        return None;
    }
    match config.spread {
        Some(cfg) => Some((cfg, true)),
        None => config.membership.filter(|_| wants_hosts).map(|cfg| (cfg, false)),
    }
}

impl Started {
    /// Starts contending for `lease` (its plugins are added with
    /// [`Started::plugin`]), with the intent `initial` if given.
    fn lease(&self, lease: &LeaseConfig, initial: Option<Intent>) -> LeaseRun {
        let cfg = ElectorConfig {
            lease: lease.name.clone(),
            identity: self.identity.clone(),
            timings: lease.timings,
        };
        // Built inside the election runtime: its subscription's task runs
        // there.
        let (mut elector, view, intent) = {
            let _inside = self.election.enter();
            Elector::new(cfg, self.store.clone(), self.clock.clone())
        };
        if let Some(initial) = initial {
            intent.send_replace(initial);
        }
        elector.set_observer(self.election_observer.clone());
        let claims = LeaseClaims::new();
        elector.set_claims(&claims);
        let (new_timings, timings_rx) = watch::channel(lease.timings);
        elector.set_timings_source(timings_rx);
        if let Some(health) = &self.health {
            health.watch_lease(&lease.name, elector.heartbeat(), view.clone(), self.clock.clone());
        }
        let (name, ended_tx) = (lease.name.clone(), self.ended.clone());
        self.election.spawn(async move {
            // Ok: it returned as told; Err: why it failed (its own error or
            // a panic).
            let result = match AssertUnwindSafe(elector.run()).catch_unwind().await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(panic) => Err(format!("it panicked: {}", panic_message(panic))),
            };
            let _ = ended_tx.send((name, result));
        });
        LeaseRun {
            intent,
            view,
            supervisors: JoinSet::new(),
            timings: lease.timings,
            new_timings,
            handover_bound: handover_bound(&lease.timings),
            ended: false,
            retiring: false,
            claims,
        }
    }

    /// Starts contending for `lease`, added by a reload whose
    /// configuration spreads the leads with the settings `spread`: then
    /// deferring at first, and steered from its start by the spreader (it
    /// is told to contend at once if this host prefers the lease). A
    /// spreader that the reload starts takes it in at its start
    /// ([`Started::respread`]).
    fn added_lease(&self, lease: &LeaseConfig, spread: Option<&SpreadConfig>) -> LeaseRun {
        let initial = spread.map(|s| Intent::Defer {
            head_start: s.head_start,
        });
        let run = self.lease(lease, initial);
        if let Some(changes) = self.spread.as_ref().and_then(|s| s.changes.as_ref()) {
            let _ = changes.send(LeaseChange::Add(steered(&lease.name, &run)));
        }
        run
    }

    /// Starts a spreader doing `does` (its settings, and whether it steers
    /// the leases of `runs`).
    fn start_spreader(&self, does: (SpreadConfig, bool), runs: &BTreeMap<String, LeaseRun>) -> Spreading {
        let (cfg, steers) = does;
        let leases = runs
            .iter()
            .filter(|(_, run)| steers && !run.retiring)
            .map(|(name, run)| steered(name, run))
            .collect();
        let spreader = Spreader::new(
            &self.identity,
            self.store.clone(),
            cfg,
            leases,
            self.hosts.clone(),
        );
        // Leases a reload adds or removes, while it steers.
        let (spreader, changes) = if steers {
            let (changes, rx) = mpsc::unbounded_channel();
            (spreader.follow(rx), Some(changes))
        } else {
            (spreader, None)
        };
        let stop = CancellationToken::new();
        let task = self
            .election
            .spawn(spreader.run(self.clock.clone(), stop.clone()));
        Spreading {
            cfg,
            changes,
            stop,
            task,
        }
    }

    /// Makes the running spreader do `wanted` (see [`spread_for`]): at
    /// start, and after every applied reload. If it does something else (or
    /// none runs), it is replaced: the old one is stopped and awaited (its
    /// membership record released), the leases it steered are set back to
    /// [`Intent::Contend`] if the new one does not steer ([`unsteer`]:
    /// never over a stop, or a stand-by whose time is not up), and a new
    /// one is started with the leases of `runs` not being removed. It
    /// steers them from its first listing; until then they go on with the
    /// intents they had. Returns what changed, if anything.
    ///
    /// Between the two, this host's membership record is released and
    /// taken again (a few store writes): another host that lists the
    /// records then sees this host absent, and spreads the leases without
    /// it until its next listing. That is harmless: spreading decides only
    /// who tries first for a lease that is free (released, absent or
    /// expired), never who may take one, so at worst a lease freed in that
    /// moment goes to a host that does not prefer it and is handed over
    /// later; and a lease led here is handed over only after the view of
    /// the live hosts has been steady for the settle time (two retry
    /// periods), longer than the gap.
    async fn respread(
        &mut self,
        wanted: Option<(SpreadConfig, bool)>,
        runs: &BTreeMap<String, LeaseRun>,
    ) -> Option<&'static str> {
        let running = self.spread.as_ref().map(Spreading::does);
        if running == wanted {
            return None;
        }
        let steered = running.is_some_and(|(_, steers)| steers);
        let steers = wanted.is_some_and(|(_, steers)| steers);
        if let Some(old) = self.spread.take() {
            old.stop.cancel();
            let _ = old.task.await;
        }
        if steered && !steers {
            for run in runs.values().filter(|r| !r.retiring) {
                unsteer(&run.intent);
            }
        }
        if wanted.is_none() {
            // As on a host started without a spreader (no guest asks).
            self.hosts.send_replace(Hosts::default());
        }
        self.spread = wanted.map(|does| self.start_spreader(does, runs));
        let what = match (steered, steers, wanted) {
            (false, true, _) => "spreading on",
            (true, true, _) => "spreading: new settings",
            (true, false, _) => "spreading off",
            (false, false, Some(_)) if running.is_some() => "membership record: new settings",
            (false, false, Some(_)) => "membership record kept: a plugin counts the live hosts",
            (false, false, None) => "membership record released: no plugin counts the live hosts",
        };
        match &self.spread {
            Some(s) if s.changes.is_some() => {
                tracing::info!(leases = runs.values().filter(|r| !r.retiring).count(), spreading = %s.cfg, "{what}: the spreader steers the leases from its first listing")
            }
            Some(s) => {
                tracing::info!(spreading = %s.cfg, "{what}: a spreader keeps the membership record, steering no lease")
            }
            None => tracing::info!("{what}: no spreader; every lease is contended for"),
        }
        Some(what)
    }

    /// Stops contending for `lease`, removed by a reload: its elector hands
    /// it over (drain, release) and returns; the spreader no longer steers it.
    fn removed_lease(&self, lease: &str, run: &LeaseRun) {
        run.intent.send_replace(Intent::Stop);
        if let Some(changes) = self.spread.as_ref().and_then(|s| s.changes.as_ref()) {
            let _ = changes.send(LeaseChange::Remove(lease.to_owned()));
        }
    }

    /// Runs `plugin` (configured as `p`, its file's content hash `hash`)
    /// in every term of `run`.
    fn plugin(
        &self,
        run: &mut LeaseRun,
        p: &PluginConfig,
        plugin: Arc<Plugin>,
        hash: Option<u64>,
        after: Option<CancellationToken>,
    ) -> PluginRun {
        let (version, versions) = watch::channel(plugin);
        let gone = CancellationToken::new();
        let (view, observer, done) = (run.view.clone(), self.task_observer.clone(), gone.clone());
        let name = p.spec.name.clone();
        // Claimed from now until no task of it runs here.
        run.claims.add(&name);
        let admission = Admission {
            gate: self.gate.clone(),
            claims: run.claims.clone(),
            poll: run.timings.retry_period / 2,
        };
        run.supervisors.spawn(async move {
            let _done = done.drop_guard();
            let claims = admission.claims.clone();
            // A plugin of this name that a reload removed (or moved from
            // another lease) may still run its task in a term that is
            // being handed over: never beside it.
            if let Some(before) = after {
                before.cancelled().await;
            }
            run_leader_tasks_of(versions, view, observer, Some(admission)).await;
            claims.remove(&name);
        });
        PluginRun {
            lease: p.lease.clone(),
            version,
            spec: spec_key(p),
            hash,
            gone,
        }
    }
}

/// `run`, lease `name`, as a spreader steers it.
fn steered(name: &str, run: &LeaseRun) -> SteeredLease {
    SteeredLease {
        name: name.to_owned(),
        intent: run.intent.clone(),
        view: run.view.clone(),
    }
}

/// One plugin being served.
struct PluginRun {
    lease: String,
    /// Its current version; dropped, its supervisor returns once its task
    /// is gone.
    version: watch::Sender<Arc<Plugin>>,
    /// Its settings as configured (see [`spec_key`]).
    spec: String,
    /// Its file's content hash when loaded.
    hash: Option<u64>,
    /// Cancelled once its supervisor has returned: no task of it runs.
    gone: CancellationToken,
}

/// A plugin's settings, compared by reloads: every field of its spec.
fn spec_key(p: &PluginConfig) -> String {
    format!("{:?}", p.spec)
}

/// The control socket's leases: those of `runs` not being removed.
fn sync_controlled(controlled: &SharedLeases, runs: &BTreeMap<String, LeaseRun>) {
    let leases = runs
        .iter()
        .filter(|(_, r)| !r.retiring)
        .map(|(name, run)| {
            let lease = ControlledLease {
                intent: run.intent.clone(),
                view: run.view.clone(),
                timings: run.timings,
                handover_bound: run.handover_bound,
            };
            (name.clone(), lease)
        })
        .collect();
    *controlled.write().unwrap_or_else(|e| e.into_inner()) = leases;
}

/// The next reload request; pending forever without reloads.
async fn next_reload(reloads: &mut Option<reload::Reload>) -> Option<reload::Cause> {
    match reloads {
        Some(r) => r.requests.recv().await,
        None => std::future::pending().await,
    }
}

/// One reload (see [`crate::reload`]): reads the configuration, checks it
/// against the running one, compiles every new or changed plugin, and only
/// if all of that succeeds applies the changes. `Ok(None)`: nothing
/// changed; `Ok(Some(new))`: applied; `Err`: refused (nothing changed), and
/// why.
#[allow(clippy::too_many_arguments)]
async fn reload_once(
    cause: &reload::Cause,
    load: &reload::Loader,
    old: &Config,
    fixed: &reload::Fixed,
    runtime: &Arc<PluginRuntime>,
    started: &mut Started,
    runs: &mut BTreeMap<String, LeaseRun>,
    plugins: &mut BTreeMap<String, PluginRun>,
    retired: &mut BTreeMap<String, CancellationToken>,
) -> Result<Option<Config>, String> {
    tracing::info!(cause = %cause, "reloading: reading the configuration and plugin files again");
    let mut new = {
        let load = load.clone();
        tokio::task::spawn_blocking(move || load())
            .await
            .map_err(|e| format!("reading the configuration panicked: {e}"))??
    };
    if !new.identity_declared && !old.identity_declared {
        // Made up at random each time it is read: the running one stays.
        new.identity = old.identity.clone();
    }
    let mut why = reload::needs_restart(old, &new, fixed);
    // A lease a reload removed is contended for again only once its
    // elector has handed it over and returned.
    for lease in &new.leases {
        if runs.get(&lease.name).is_some_and(|r| r.retiring) {
            why.push(format!(
                "lease {:?} is still being handed over after a reload removed it; reload again once \
                 \"lease removed by a reload\" is logged",
                lease.name
            ));
        }
    }
    if let Err(e) = crate::own_files::check_grants(&new, &fixed.cache_dir, fixed.control_socket.as_deref()) {
        why.push(e);
    }
    if !why.is_empty() {
        let file = new
            .source
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        return Err(format!("{file}: {}", why.join("; ")));
    }
    // New and changed plugins, compiled before anything changes.
    let mut fresh: Vec<(PluginConfig, Option<u64>, Arc<Plugin>)> = Vec::new();
    for p in &new.plugins {
        let hash = reload::content_hash(&p.spec.path);
        if let Some(r) = plugins.get(&p.spec.name)
            && r.lease == p.lease
            && r.spec == spec_key(p)
            && hash.is_some()
            && r.hash == hash
        {
            continue;
        }
        let (rt, spec) = (runtime.clone(), p.spec.clone());
        let started_at = std::time::Instant::now();
        let plugin = tokio::task::spawn_blocking(move || rt.load(&spec))
            .await
            .map_err(|e| format!("plugin {:?}: loading it panicked: {e}", p.spec.name))?
            .map_err(|e| e.to_string())?;
        tracing::info!(plugin = %p.spec.name, lease = %p.lease, world = plugin.wit_world(), load_ms = crate::logging::ms(started_at.elapsed()), "new plugin version loaded");
        // What was compiled, which may be newer than what was hashed above.
        let hash = Some(plugin.content_hash());
        fresh.push((p.clone(), hash, Arc::new(plugin)));
    }
    let lease_changes = old.leases != new.leases;
    let spread_changes = old.spread != new.spread || old.membership != new.membership;
    if fresh.is_empty() && !lease_changes && !spread_changes && plugins.len() == new.plugins.len() {
        tracing::info!(cause = %cause, "reload: nothing changed");
        return Ok(Some(new));
    }

    // Applying: nothing below fails.
    let mut handover: std::collections::BTreeSet<String> = Default::default();
    let mut summary: Vec<String> = Vec::new();
    // Removed leases: handed over (drain, release), then no longer contended for.
    for (name, run) in runs.iter_mut() {
        if !run.retiring && !new.leases.iter().any(|l| &l.name == name) {
            run.retiring = true;
            started.removed_lease(name, run);
            if let Some(h) = &started.health {
                h.unwatch_lease(name);
            }
            summary.push(format!("lease {name} removed"));
        }
    }
    // Removed plugins (or moved to another lease): no new term of them;
    // a lease that runs one now is handed over so that it stops.
    let moved: Vec<String> = plugins
        .iter()
        .filter(|(name, r)| {
            !new.plugins
                .iter()
                .any(|p| &p.spec.name == *name && p.lease == r.lease)
        })
        .map(|(name, _)| name.clone())
        .collect();
    retired.retain(|_, gone| !gone.is_cancelled());
    for name in moved {
        let r = plugins.remove(&name).expect("present");
        retired.insert(name.clone(), r.gone.clone());
        handover.insert(r.lease.clone());
        summary.push(format!("plugin {name} removed from lease {}", r.lease));
    }
    // Timings: from each lease's next term.
    for lease in &new.leases {
        if let Some(run) = runs.get_mut(&lease.name).filter(|r| !r.retiring)
            && run.timings != lease.timings
        {
            run.timings = lease.timings;
            run.new_timings.send_replace(lease.timings);
            run.handover_bound = run.handover_bound.max(handover_bound(&lease.timings));
            summary.push(format!("lease {}: new timings from its next term", lease.name));
        }
    }
    // New leases.
    for lease in &new.leases {
        if !runs.contains_key(&lease.name) {
            runs.insert(
                lease.name.clone(),
                started.added_lease(lease, new.spread.as_ref()),
            );
            summary.push(format!("lease {} added", lease.name));
        }
    }
    // New and changed plugins.
    for (p, hash, plugin) in fresh {
        let name = p.spec.name.clone();
        match plugins.get_mut(&name) {
            Some(r) => {
                r.version.send_replace(plugin);
                r.spec = spec_key(&p);
                r.hash = hash;
                let when = match p.reload {
                    ReloadMode::NextTerm => "from the lease's next term",
                    ReloadMode::Now => {
                        handover.insert(p.lease.clone());
                        "at once (reload = \"now\": the lease is handed over and contended for again)"
                    }
                };
                tracing::info!(plugin = %name, lease = %p.lease, reload = ?p.reload, "plugin changed: its new version runs {when}");
                summary.push(format!("plugin {name} changed"));
            }
            None => {
                let Some(run) = runs.get_mut(&p.lease) else {
                    continue;
                };
                let after = retired.get(&name).filter(|g| !g.is_cancelled()).cloned();
                plugins.insert(name.clone(), started.plugin(run, &p, plugin, hash, after));
                summary.push(format!("plugin {name} added to lease {}", p.lease));
            }
        }
    }
    for lease in handover {
        let Some(run) = runs.get(&lease).filter(|r| !r.retiring) else {
            continue;
        };
        let Some(term) = run.view.borrow().leading_term().map(|t| t.number()) else {
            continue;
        };
        let until = tokio::time::Instant::now() + run.timings.retry_period;
        let set = run.intent.send_if_modified(|intent| {
            if *intent == Intent::Stop {
                return false;
            }
            *intent = Intent::StandBy { until };
            true
        });
        if set {
            tracing::info!(
                lease,
                term,
                "reload: handing the lease over (its tasks are told, then drained; the lease released) and contending for it again"
            );
        }
    }
    // Spreading, for the leases and plugins as they are now: the spreader
    // is replaced if it should do something else.
    let wanted = wanted_spread(&new, runs, plugins);
    if let Some(what) = started.respread(wanted, runs).await {
        summary.push(what.to_owned());
    }
    tracing::info!(cause = %cause, changes = %summary.join("; "), "reload applied");
    Ok(Some(new))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text, None).unwrap()
    }

    #[test]
    fn the_spreader_wanted_follows_the_configuration_the_leases_and_the_plugins() {
        let none = "identity = \"a\"\n";
        let one = format!("{none}[[lease]]\nname = \"x\"\n");
        let two = format!("{one}[[lease]]\nname = \"y\"\n");
        let off = format!("{two}[spread]\nenabled = false\n");
        let on = format!("{one}[spread]\nenabled = true\nsettle = \"9s\"\n");
        let steers =
            |text: &str, serving, wants_hosts| spread_for(&cfg(text), serving, wants_hosts).map(|(_, s)| s);
        // Spreading on (more than one lease, or enabled): it steers.
        assert_eq!(steers(&two, true, false), Some(true));
        assert_eq!(steers(&two, true, true), Some(true));
        let (settings, _) = spread_for(&cfg(&on), true, false).unwrap();
        assert_eq!(settings.settle, Duration::from_secs(9));
        // Off (one lease, or disabled): a record only for a plugin that
        // counts the live hosts, with the same settings, steering nothing.
        assert_eq!(steers(&one, true, false), None);
        assert_eq!(steers(&off, true, false), None);
        assert_eq!(steers(&one, true, true), Some(false));
        assert_eq!(
            spread_for(&cfg(&off), true, true),
            cfg(&two).spread.map(|s| (s, false))
        );
        // No lease served (none configured, or all being removed): none.
        assert_eq!(steers(none, false, true), None);
        assert_eq!(steers(&two, false, false), None);
    }
}
