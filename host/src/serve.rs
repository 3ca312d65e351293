//! `baton run`: joins the parts. One elector per lease, one supervisor per
//! plugin, and an orderly shutdown: tell the tasks, wait for them (grace,
//! then force), and only then release each lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, StoreConfig};
use crate::election::{Elector, ElectorConfig, ElectorControl};
use crate::runtime::{PluginEngine, PluginRuntime, RuntimeError, default_cache_dir};
use crate::store::embedded::EmbeddedStore;
use crate::store::kube::{KubeOptions, KubeStore};
use crate::store::{LeaseStore, StoreError};
use crate::supervisor::run_leader_tasks;

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
    let cache_dir = config.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let engine = PluginEngine::new(Some(cache_dir.clone()))?;
    let runtime = Arc::new(PluginRuntime::new(engine.clone())?);
    let store = open_store(&config).await?;
    tracing::info!(identity = %config.identity, store = %store.describe(), cache = %cache_dir.display(), "baton starting");

    // Compile every plugin before contending, so that winning a lease costs
    // an instantiation, not a compilation.
    let mut failed = 0;
    let mut loaded = Vec::new();
    for p in &config.plugins {
        let started = std::time::Instant::now();
        let rt = runtime.clone();
        let spec = p.spec.clone();
        let result = tokio::task::spawn_blocking(move || rt.load(&spec)).await;
        match result {
            Ok(Ok(plugin)) => {
                tracing::info!(
                    plugin = plugin.name(),
                    lease = %p.lease,
                    world = plugin.world().wit_name(),
                    grants = %p.spec.grants(),
                    load_ms = started.elapsed().as_secs_f64() * 1e3,
                    "plugin loaded"
                );
                loaded.push((p.lease.clone(), Arc::new(plugin)));
            }
            Ok(Err(e)) => {
                failed += 1;
                tracing::error!(plugin = %p.spec.name, error = %e, "plugin cannot run; the others go on");
            }
            Err(e) => {
                failed += 1;
                tracing::error!(plugin = %p.spec.name, error = %e, "loading the plugin panicked; the others go on");
            }
        }
    }
    if let Some((hits, misses)) = engine.cache_stats() {
        tracing::info!(hits, misses, "compiled-code cache");
    }

    struct LeaseRun {
        control: ElectorControl,
        elector: tokio::task::JoinHandle<()>,
        tasks: JoinSet<()>,
        grace: Duration,
    }
    let mut runs: BTreeMap<String, LeaseRun> = BTreeMap::new();
    for lease in &config.leases {
        let configured = config.plugins.iter().filter(|p| p.lease == lease.name).count();
        if configured > 0 && !loaded.iter().any(|(l, _)| l == &lease.name) {
            // Holding a lease whose tasks cannot run would keep a healthy
            // standby from running them.
            tracing::error!(lease = %lease.name, "no plugin of this lease could be loaded; not contending for it");
            continue;
        }
        let (elector, view) = Elector::new(
            ElectorConfig {
                lease: lease.name.clone(),
                identity: config.identity.clone(),
                timings: lease.timings,
            },
            store.clone(),
        );
        let control = ElectorControl::default();
        let mut tasks = JoinSet::new();
        for (_, plugin) in loaded.iter().filter(|(l, _)| l == &lease.name) {
            tasks.spawn(run_leader_tasks(
                plugin.clone(),
                view.clone(),
                lease.timings.grace,
                control.resign.clone(),
            ));
        }
        let elector = tokio::spawn(elector.run(control.clone()));
        runs.insert(
            lease.name.clone(),
            LeaseRun {
                control,
                elector,
                tasks,
                grace: lease.timings.grace,
            },
        );
    }

    if runs.is_empty() && failed > 0 {
        return Err(ServeError::NothingToRun(failed));
    }

    shutdown.cancelled().await;
    tracing::info!("shutting down: stopping leader tasks, then releasing leases");
    let mut releases = JoinSet::new();
    for (lease, mut run) in runs {
        run.control.resign.cancel();
        releases.spawn(async move {
            // Every task stops within its grace (then by force); the bound
            // below only guards against a bug, and is logged if hit.
            let bound = run.grace + Duration::from_secs(5);
            if tokio::time::timeout(bound, async { while run.tasks.join_next().await.is_some() {} })
                .await
                .is_err()
            {
                tracing::error!(lease = %lease, "leader tasks did not stop in time; aborting them");
                run.tasks.abort_all();
                while run.tasks.join_next().await.is_some() {}
            }
            run.control.drained.cancel();
            let _ = run.elector.await;
        });
    }
    while releases.join_next().await.is_some() {}
    tracing::info!("baton stopped");
    Ok(failed)
}
