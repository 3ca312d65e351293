//! `Plugin`, a checked component with its grants, and one run of its
//! leader task: a fresh Store and instance per run, in one term, dropped
//! when the run ends or the term's force-stop comes. The instance of a
//! term's first run may be [`Prepared`] while this host follows.
//!
//! Invariants: `run` is called only if the lease is still led in the term
//! once the instance exists; every call into the host is fenced by the
//! term (see [`fence`]); a prepared instance ran no guest code but its
//! component's start functions, and any host call made then trapped (its
//! Store's term was unset: over), so it was never kept.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use wasmtime::Store;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::WasiCtxBuilder;

use super::component::{ContentKey, HealthPre, Pre};
use super::spec::PluginSpec;
use super::{Contract, DEFAULT_MEMORY_LIMIT, FIRST_HOSTS_WAIT, GrantedImport, World};
use crate::election::{Hosts, LeaseView, Term};
use crate::runtime::bindings::{WitStatus, WitStatus4};
use crate::runtime::capability::keyvalue::BucketCounts;
use crate::runtime::capability::output::OutputBudget;
use crate::runtime::capability::schedule::ScheduledRun;
use crate::runtime::capability::status::Shown;
use crate::runtime::capability::unit::{RunStart, Setup, SetupError};
use crate::runtime::engine::PluginEngine;
use crate::runtime::fence;
use crate::runtime::fence::connections::{Connections, DEFAULT_SEND_BUFFER};
use crate::runtime::guest::{GuestState, PluginParts};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::trap::{GuestLimits, Trap};
use crate::support::rounding::human;

/// A checked, compiled plugin, ready to instantiate.
pub struct Plugin {
    pub(super) name: Arc<str>,
    pub(super) path: PathBuf,
    pub(super) world: World,
    pub(super) contract: Contract,
    pub(super) uses_hosts: bool,
    /// The live hosts, for `current-hosts`.
    pub(super) hosts: watch::Receiver<Hosts>,
    pub(super) pre: Pre,
    /// The instance factory of its health check, if it exports one.
    pub(super) health: Option<HealthPre>,
    pub(super) spec: Option<PluginSpec>,
    pub(super) engine: PluginEngine,
    /// What it keeps of each capability across its instances (its output
    /// budget, its buckets).
    pub(super) parts: PluginParts,
    /// What it imports that only a grant makes useful.
    pub(super) capabilities: Vec<GrantedImport>,
    /// The linear memory of its running instances, in bytes.
    pub(super) memory: Arc<std::sync::atomic::AtomicU64>,
    /// The bytes it was compiled from.
    pub(super) content: ContentKey,
}

/// How many epoch ticks (of [`EPOCH_TICK`](crate::runtime::EPOCH_TICK))
/// an instance being prepared may run its start functions before it traps
/// and is not kept.
const PREPARE_TICKS: u64 = 10;

/// An instance made ahead of its term, while this host follows the lease
/// ([`Plugin::prepare`]): taking the lead then costs only the call into
/// `run`. Its Store's term is unset until the run starts; its memory is
/// counted as the plugin's from then on. Dropping it frees the instance.
pub struct Prepared {
    store: Store<GuestState>,
    instance: wasmtime::component::Instance,
}

/// How one run of a leader task ended.
#[derive(Debug)]
pub enum TaskOutcome {
    /// `run` returned `ok`.
    Finished,
    /// The term was over before `run` could be called (while the instance
    /// was being created): `run` was not called.
    NotStarted,
    /// `run` returned `error`.
    Failed(String),
    /// The guest trapped, or could not be instantiated.
    Trapped(Trap),
}

impl TaskOutcome {
    /// Whether the host stopped the task because its term's force-stop
    /// time had come (the fence or the epoch check trapped it).
    pub fn stopped_by_host(&self) -> bool {
        matches!(self, TaskOutcome::Trapped(t) if t.stopped_by_host())
    }
}

impl fmt::Display for TaskOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskOutcome::Finished => f.write_str("ok"),
            TaskOutcome::NotStarted => f.write_str("not started: the term was over first"),
            TaskOutcome::Failed(e) => write!(f, "error: {e}"),
            TaskOutcome::Trapped(t) => write!(f, "trap: {t}"),
        }
    }
}

impl Plugin {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The component file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The manifest digest it was pulled under, for a component from a
    /// registry.
    pub fn digest(&self) -> Option<&str> {
        self.spec.as_ref()?.digest.as_deref()
    }

    /// The world it targets.
    pub fn world(&self) -> World {
        self.world
    }

    /// The version of the contract it was built against.
    pub fn contract(&self) -> Contract {
        self.contract
    }

    /// A hash of the bytes it was compiled from (`std`'s `DefaultHasher`
    /// over the file's bytes as a slice): what a reload compares a file's
    /// content with, taken from the bytes compiled rather than read again,
    /// so that a file replaced while it was being loaded is seen as changed.
    pub fn content_hash(&self) -> u64 {
        self.content.hash
    }

    /// The full WIT name of its world, version included.
    pub fn wit_world(&self) -> &'static str {
        self.world.wit_name_in(self.contract)
    }

    /// Whether it asks for the live hosts (`current-hosts`, from
    /// `baton:leader@0.2.0`): the host then keeps its membership record
    /// even when it does not spread its leases.
    pub fn uses_hosts(&self) -> bool {
        self.uses_hosts
    }

    /// Whether its component exports a health check (`baton:leader@0.4.0`).
    pub fn exports_health_check(&self) -> bool {
        self.health.is_some()
    }

    /// The WIT name of the health check it exports, if one.
    pub fn health_export(&self) -> Option<&'static str> {
        self.health.as_ref().map(|h| match h {
            HealthPre::Future(_) => "baton:leader/health-async@0.4.0",
            HealthPre::Pollable(_) => "baton:leader/health-sync@0.4.0",
        })
    }

    /// Its health check's settings, if it is configured with one (the
    /// component then exports one).
    pub fn health_check(&self) -> Option<&super::HealthCheck> {
        self.spec.as_ref()?.health_check.as_ref()
    }

    /// What it imports beyond its world that only a grant makes useful.
    pub fn capabilities(&self) -> &[GrantedImport] {
        &self.capabilities
    }

    /// Its output budget (shared by all its instances).
    pub fn output(&self) -> &Arc<OutputBudget> {
        &self.parts.output
    }

    /// The linear memory its running instances use now, in bytes (0 while
    /// none runs).
    pub fn memory_bytes(&self) -> u64 {
        self.memory.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A fresh Store for one run in `term`, its memory counted as the
    /// plugin's: see [`new_store`](Self::new_store).
    pub(super) fn store_for(
        &self,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
    ) -> Result<Store<GuestState>, SetupError> {
        let mut store = self.new_store(StoreTerm::of(term.clone()), view.clone())?;
        self.start_in(&mut store, &term, &view, None)?;
        Ok(store)
    }

    /// A fresh Store for one run in `term` (unset for an instance prepared
    /// ahead): each capability's part, made from the plugin's grants, its
    /// memory limit, and the fence (see [`fence`]).
    fn new_store(
        &self,
        term: StoreTerm,
        view: watch::Receiver<LeaseView>,
    ) -> Result<Store<GuestState>, SetupError> {
        let mut wasi = WasiCtxBuilder::new();
        let connections = Connections::new(self.name.clone(), term.clone(), DEFAULT_SEND_BUFFER);
        let lease = view.borrow().status.lease.clone();
        let caps = self.parts.prepare(&mut Setup {
            plugin: &self.name,
            lease: &lease,
            term: &term,
            connections: &connections,
            view: &view,
            hosts: &self.hosts,
            wasi: &mut wasi,
        })?;
        let memory_limit = self
            .spec
            .as_ref()
            .map_or(DEFAULT_MEMORY_LIMIT, |s| s.memory_limit);
        let state = GuestState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: GuestLimits::new(memory_limit),
            term: term.clone(),
            connections,
            caps,
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(fence::epoch_check(term.clone()));
        store.call_hook(fence::call_fence(term));
        Ok(store)
    }

    /// Writes the core dump that `error` carries (a trap's, with the
    /// engine's `coredump_on_trap`) to `dir`, as
    /// `PLUGIN.termT.UNIX_MS.coredump`. A failure to write is logged, never
    /// more: the dump is for debugging.
    fn write_coredump(
        &self,
        dir: &Path,
        store: &mut Store<GuestState>,
        term: &Term,
        error: &wasmtime::Error,
    ) {
        let Some(dump) = error.downcast_ref::<wasmtime::WasmCoreDump>() else {
            return;
        };
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let path = dir.join(format!("{}.term{}.{millis}.coredump", self.name, term.number()));
        let bytes = dump.serialize(&mut *store, &self.name);
        match std::fs::write(&path, &bytes) {
            Ok(()) => tracing::info!(plugin = %self.name, term = term.number(), path = %path.display(),
                bytes = bytes.len(), "core dump of the trapped instance written"),
            Err(e) => tracing::warn!(plugin = %self.name, path = %path.display(), error = %e,
                "cannot write the core dump of the trapped instance"),
        }
    }

    /// Claims the plugin's buckets for `term` before its guest runs, if it
    /// imports `wasi:keyvalue`: from then on no older term writes them.
    pub(super) async fn claim_buckets(
        &self,
        term: &Term,
        view: &watch::Receiver<LeaseView>,
    ) -> Result<(), SetupError> {
        let Some(buckets) = &self.parts.keyvalue else {
            return Ok(());
        };
        if !self.capabilities.contains(&GrantedImport::KeyValue) {
            return Ok(());
        }
        let lease = view.borrow().status.lease.clone();
        let claimed = buckets.claim(&lease, term.number()).await;
        claimed.map_err(|e| SetupError::new(format!("cannot claim the plugin's buckets for the term: {e}")))
    }

    /// Its bucket operations, counted (none where there is no lease store).
    pub fn bucket_counts(&self) -> Option<&Arc<BucketCounts>> {
        self.parts.keyvalue.as_ref().map(|b| &b.counts)
    }

    /// Waits until the live hosts count this host, so that a task's first
    /// `current-hosts` reading does, as long as the lease is led here and
    /// for [`FIRST_HOSTS_WAIT`] at most (then the task starts with what
    /// the store showed, and the log says so).
    async fn await_counted(&self, view: &watch::Receiver<LeaseView>) {
        let mut hosts = self.hosts.clone();
        let mut view = view.clone();
        let counted = hosts.wait_for(|h| h.this_host_live);
        let lost = view.wait_for(|v| !v.status.is_leading());
        tokio::select! {
            _ = counted => {}
            _ = lost => {}
            _ = tokio::time::sleep(FIRST_HOSTS_WAIT) => {
                tracing::warn!(plugin = %self.name, waited = %human(FIRST_HOSTS_WAIT),
                    "leader task starts before the live hosts count this host: its membership record was not listed");
            }
        }
    }

    /// Prepares an instance for the plugin's next term, while this host
    /// follows the lease behind `view`: its Store and grants as for a run,
    /// its term unset, the component instantiated. `None` if that cannot be
    /// done now (a grant cannot be opened, or instantiating trapped or
    /// called the host): the term then makes its instance as it starts, and
    /// says what failed.
    pub async fn prepare(&self, view: &watch::Receiver<LeaseView>) -> Option<Prepared> {
        // The epoch advances while it is instantiated: a start function that
        // does not return traps at the next tick (its term is unset).
        let _ticking = self.engine.ticking();
        let lease = view.borrow().status.lease.clone();
        let made = match self.new_store(StoreTerm::unset(&lease), view.clone()) {
            Ok(mut store) => {
                // Room for a large component's start functions, where a
                // run's instance gets one tick before it is checked (and
                // yields).
                store.set_epoch_deadline(PREPARE_TICKS);
                let instantiated = self.pre.instance_pre().instantiate_async(&mut store).await;
                instantiated
                    .map(|instance| Prepared { store, instance })
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        made.inspect_err(|error| {
            tracing::debug!(plugin = %self.name, error, "no instance prepared ahead of the term");
        })
        .ok()
    }

    /// Runs the leader task once, in a fresh instance and Store, in `term`,
    /// until it returns or traps. Dropping the returned future drops the
    /// Store and so ends the task wherever it is.
    pub async fn run_task(&self, term: Arc<Term>, view: watch::Receiver<LeaseView>) -> TaskOutcome {
        self.run_once(term, view, None, None).await
    }

    /// Runs the leader task once in `prepared`, an instance of this plugin
    /// made ahead (see [`prepare`](Self::prepare)), or in a fresh one if
    /// none, as [`run_task`](Self::run_task) does.
    pub async fn run_task_in(
        &self,
        prepared: Option<Prepared>,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
    ) -> TaskOutcome {
        self.run_once(term, view, None, prepared).await
    }

    /// Runs the leader task once for the scheduled run `run`, as
    /// [`run_task`](Self::run_task) does; the instance's `current-run`
    /// (`baton:leader@0.3.0`) returns `run`. A plugin of an older contract
    /// runs the same, without being told.
    pub async fn run_scheduled(
        &self,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
        run: ScheduledRun,
    ) -> TaskOutcome {
        self.run_once(term, view, Some(run), None).await
    }

    /// One run of the task, for `scheduled` if it is a scheduled run, in
    /// `prepared` if an instance was made ahead.
    async fn run_once(
        &self,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
        scheduled: Option<ScheduledRun>,
        prepared: Option<Prepared>,
    ) -> TaskOutcome {
        // Declared before the Store, so dropped after it: the epoch
        // advances for as long as this instance may run.
        let _ticking = self.engine.ticking();
        if self.uses_hosts {
            self.await_counted(&view).await;
        }
        let (mut store, instance) = match prepared {
            Some(p) => (p.store, Some(p.instance)),
            None => match self.new_store(StoreTerm::of(term.clone()), view.clone()) {
                Ok(s) => (s, None),
                Err(e) => return TaskOutcome::Trapped(Trap::setup(e.to_string())),
            },
        };
        if let Err(e) = self.start_in(&mut store, &term, &view, scheduled) {
            return TaskOutcome::Trapped(Trap::setup(e.to_string()));
        }
        if let Err(e) = self.claim_buckets(&term, &view).await {
            return TaskOutcome::Trapped(Trap::setup(e.to_string()));
        }
        match self.instantiate_and_run(&mut store, instance, &term, &view).await {
            Ok(outcome) => outcome,
            Err(e) => self.trapped(&mut store, &term, e),
        }
    }

    /// Makes `store` one of a run in `term` seen through `view` (for
    /// `scheduled`, if one): if it was prepared ahead (its term unset), its
    /// term set; each capability's part finished (configuration values are read as
    /// the run starts); its memory counted, its epoch deadline from now.
    fn start_in(
        &self,
        store: &mut Store<GuestState>,
        term: &Arc<Term>,
        view: &watch::Receiver<LeaseView>,
        scheduled: Option<ScheduledRun>,
    ) -> Result<(), SetupError> {
        let state = store.data_mut();
        if !state.term.is_set() {
            // Set once, here: the Store was prepared with it unset.
            let _ = state.term.set(term.clone());
        }
        let run = RunStart {
            term,
            view,
            scheduled: scheduled.as_ref(),
        };
        state.caps.start(&self.parts, &run)?;
        state.limits.count_in(self.memory.clone());
        store.set_epoch_deadline(1);
        Ok(())
    }

    /// Calls `run` in `instance` (one prepared ahead), or in an instance of
    /// the component made in `store` now, with the status as it is once the
    /// instance exists (creating it takes a while for a large guest):
    /// `leading`, or not called.
    async fn instantiate_and_run(
        &self,
        store: &mut Store<GuestState>,
        instance: Option<wasmtime::component::Instance>,
        term: &Term,
        view: &watch::Receiver<LeaseView>,
    ) -> wasmtime::Result<TaskOutcome> {
        // The status as of now, with the holder's address (which versions
        // before 0.4.0 leave out): `leading`, or `run` is not called.
        let status = || {
            let shown = Shown::of(&view.borrow(), term, true);
            shown.status.is_leading().then_some(shown)
        };
        // The typed exports: of the prepared instance, or of a new one.
        macro_rules! instance {
            ($pre:expr, $bindings:ty) => {
                match instance {
                    Some(i) => <$bindings>::new(&mut *store, &i)?,
                    None => $pre.instantiate_async(&mut *store).await?,
                }
            };
        }
        // One arm per world and version; the generated types differ, the
        // calls do not.
        macro_rules! run_future {
            ($pre:expr, $version:ident, $status:ty) => {{
                let instance = instance!($pre, $version::future_plugin::FuturePlugin);
                let Some(shown) = status() else {
                    return Ok(TaskOutcome::NotStarted);
                };
                let arg = <$status>::from(&shown);
                store
                    .run_concurrent(async |a| instance.baton_leader_task_async().call_run(a, arg).await)
                    .await??
            }};
        }
        macro_rules! run_pollable {
            ($pre:expr, $version:ident, $status:ty) => {{
                let instance = instance!($pre, $version::pollable_plugin::PollablePlugin);
                let Some(shown) = status() else {
                    return Ok(TaskOutcome::NotStarted);
                };
                let arg = <$status>::from(&shown);
                instance
                    .baton_leader_task_sync()
                    .call_run(&mut *store, &arg)
                    .await?
            }};
        }
        use crate::runtime::bindings::{v0_1, v0_2, v0_3, v0_4};
        let returned = match &self.pre {
            Pre::Future01(pre) => run_future!(pre, v0_1, WitStatus),
            Pre::Pollable01(pre) => run_pollable!(pre, v0_1, WitStatus),
            Pre::Future02(pre) => run_future!(pre, v0_2, WitStatus),
            Pre::Pollable02(pre) => run_pollable!(pre, v0_2, WitStatus),
            Pre::Future03(pre) => run_future!(pre, v0_3, WitStatus),
            Pre::Pollable03(pre) => run_pollable!(pre, v0_3, WitStatus),
            Pre::Future04(pre) => run_future!(pre, v0_4, WitStatus4),
            Pre::Pollable04(pre) => run_pollable!(pre, v0_4, WitStatus4),
        };
        Ok(match returned {
            Ok(()) => TaskOutcome::Finished,
            Err(message) => TaskOutcome::Failed(message),
        })
    }

    /// The trap `error` of the instance in `store`, with the end of its
    /// stderr and its memory; its core dump written first if the engine
    /// keeps them.
    pub(super) fn trapped(
        &self,
        store: &mut Store<GuestState>,
        term: &Term,
        error: wasmtime::Error,
    ) -> TaskOutcome {
        if let Some(dir) = self.engine.coredump_dir() {
            self.write_coredump(dir, store, term, &error);
        }
        let state = store.data();
        let tail: Vec<String> = state
            .caps
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        TaskOutcome::Trapped(Trap::from_error(error, &tail, &state.limits))
    }
}
