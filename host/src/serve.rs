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
use crate::control::{ControlSocket, ControlledHost, ControlledLease};
use crate::election::spread::{Spreader, SteeredLease};
use crate::election::{
    DRAIN_ALLOWANCE, ElectionObserver, Elector, ElectorConfig, Intent, LeaseView, NoObserver, TermClock,
    Timings,
};
use crate::health::Health;
use crate::logging::human;
use crate::metrics::Metrics;
use crate::runtime::{
    EngineOptions, PluginEngine, PluginRuntime, PoolLimits, RuntimeError, default_cache_dir,
};
use crate::store::embedded::EmbeddedStore;
use crate::store::kube::{KubeOptions, KubeStore};
use crate::store::{LeaseStore, StoreError};
use crate::supervisor::{NoTaskObserver, TaskObserver, run_leader_tasks};

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
}

/// How [`serve_opts`] runs, beyond the configuration.
#[derive(Clone)]
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
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            store: None,
            clock: TermClock::system(),
            stall_election_after: None,
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
            let defaults = crate::election::Timings::default();
            let options = KubeOptions {
                namespace: namespace.clone(),
                kubeconfig: kubeconfig.clone(),
                labels: labels.clone(),
                fallback_duration: config
                    .leases
                    .iter()
                    .map(|l| l.timings.lease_duration)
                    .max()
                    .unwrap_or(defaults.lease_duration),
                request_timeout: config
                    .leases
                    .iter()
                    .map(|l| l.timings.request_timeout)
                    .min()
                    .unwrap_or(defaults.request_timeout),
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
    let mut loads = futures::stream::iter(specs.into_iter().map(move |spec| {
        let rt = loader.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let result = rt.load(&spec);
            (result, started.elapsed())
        })
    }))
    .buffered(parallel);
    for p in &config.plugins {
        let Some(result) = loads.next().await else {
            break;
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
                refusals.push(format!("{}: loading it panicked: {e}", p.spec.name));
                tracing::error!(plugin = %p.spec.name, error = %e, "loading the plugin panicked; the others go on");
            }
        }
    }
    drop(loads);
    progress.end();
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
    for lease in &config.leases {
        let configured = config.plugins.iter().filter(|p| p.lease == lease.name).count();
        if configured > 0 && !loaded.iter().any(|(l, _)| l == &lease.name) {
            // Holding a lease whose tasks cannot run would keep a healthy
            // standby from running them.
            tracing::error!(lease = %lease.name, "no plugin of this lease could be loaded; not contending for it");
            continue;
        }
        let cfg = ElectorConfig {
            lease: lease.name.clone(),
            identity: config.identity.clone(),
            timings: lease.timings,
        };
        // Built inside the election runtime: its subscription's task runs
        // there.
        let (mut elector, view, intent) = {
            let _inside = election.handle().enter();
            Elector::new(cfg, store.clone(), clock.clone())
        };
        elector.set_observer(election_observer.clone());
        if let Some(ops) = &ops {
            ops.health
                .watch_lease(&lease.name, elector.heartbeat(), view.clone(), clock.clone());
        }
        let (name, ended_tx) = (lease.name.clone(), ended_tx.clone());
        election.handle().spawn(async move {
            // Ok: it returned as told; Err: why it failed (its own error or
            // a panic).
            let result = match AssertUnwindSafe(elector.run()).catch_unwind().await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(panic) => Err(format!("it panicked: {}", panic_message(panic))),
            };
            let _ = ended_tx.send((name, result));
        });
        let mut supervisors = JoinSet::new();
        for (_, plugin) in loaded.iter().filter(|(l, _)| l == &lease.name) {
            supervisors.spawn(run_leader_tasks(
                plugin.clone(),
                view.clone(),
                task_observer.clone(),
            ));
        }
        runs.insert(
            lease.name.clone(),
            LeaseRun {
                intent,
                view,
                supervisors,
                timings: lease.timings,
                ended: false,
            },
        );
    }
    drop(ended_tx);

    if runs.is_empty() && failed > 0 {
        return Err(ServeError::NothingToRun(failed));
    }

    // Spreading: this host's membership record, and its electors steered
    // so that each host leads its share.
    let spread_stop = CancellationToken::new();
    // Without spreading, the record is kept (and no lease steered) only if
    // a plugin asks for the live hosts.
    let wants_hosts = loaded.iter().any(|(_, p)| p.uses_hosts());
    let membership = match config.spread {
        Some(cfg) => Some((cfg, true)),
        None => config.membership.filter(|_| wants_hosts).map(|cfg| (cfg, false)),
    };
    let spreader = membership.filter(|_| !runs.is_empty()).map(|(cfg, steer)| {
        let leases = runs
            .iter()
            .filter(|_| steer)
            .map(|(name, run)| SteeredLease {
                name: name.clone(),
                intent: run.intent.clone(),
                view: run.view.clone(),
            })
            .collect();
        let spreader = Spreader::new(
            &config.identity,
            store.clone(),
            cfg,
            leases,
            runtime.hosts().clone(),
        );
        election
            .handle()
            .spawn(spreader.run(clock.clone(), spread_stop.clone()))
    });

    // `baton yield` reaches the electors through the control socket.
    let control_stop = CancellationToken::new();
    let control = control.map(|socket| {
        let host = ControlledHost {
            identity: config.identity.clone(),
            config: config
                .source
                .as_ref()
                .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
            leases: runs
                .iter()
                .map(|(name, run)| {
                    let lease = ControlledLease {
                        intent: run.intent.clone(),
                        view: run.view.clone(),
                        timings: run.timings,
                    };
                    (name.clone(), lease)
                })
                .collect(),
        };
        tokio::spawn(socket.serve(host, control_stop.clone()))
    });

    // Until shutdown, an elector that ends (it never does on its own) or
    // panics has failed.
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut unconfirmed = Vec::new();
    tokio::select! {
        _ = shutdown.cancelled() => {}
        Some((lease, result)) = ended.recv() => {
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
        }
    }
    tracing::info!("shutting down: stopping leader tasks, then releasing leases");
    control_stop.cancel();
    // The membership record goes first, so that the other hosts prefer
    // this host's leases for themselves by the time they are released.
    spread_stop.cancel();
    for run in runs.values() {
        run.intent.send_replace(Intent::Stop);
    }
    // Each elector hands its lease over (drain, then release) and returns;
    // it bounds its own wait. The bound here only guards against a bug.
    let bound = runs
        .values()
        .map(|r| r.timings.grace + r.timings.renew_deadline + DRAIN_ALLOWANCE + r.timings.request_timeout * 2)
        .max()
        .unwrap_or_default();
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
    if let Some(spreader) = spreader {
        let _ = spreader.await;
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
    /// Its elector has returned.
    ended: bool,
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
