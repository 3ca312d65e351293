//! The shared wasmtime engine: configuration, the compiled-code cache and
//! the epoch ticker that lets the host interrupt guests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wasmtime::{Cache, CacheConfig, Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::RuntimeError;
use super::compile::CacheUse;

/// How often the engine's epoch advances. Every running guest yields to the
/// host's scheduler once per tick and is checked against its term deadline,
/// so this bounds both how long a busy guest can hold a thread and how late
/// a forced stop can land (Spin uses the same 10 ms).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Where compiled code is cached, unless configured otherwise.
pub fn default_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("baton")
        .join("compiled")
}

/// The engine every plugin of this host shares, with its epoch ticker.
///
/// Dropping the last clone stops the ticker.
#[derive(Clone)]
pub struct PluginEngine {
    engine: Engine,
    cache: Option<Cache>,
    /// The cache's hits and misses already told to a compilation (see
    /// [`PluginEngine::cache_use`]).
    claimed: Arc<Mutex<(usize, usize)>>,
    coredump_dir: Option<Arc<Path>>,
    _ticker: Arc<EpochTicker>,
}

/// How a [`PluginEngine`] is made.
///
/// ```
/// use baton::runtime::EngineOptions;
/// let options = EngineOptions {
///     largest_memory: Some(256 << 20),
///     ..EngineOptions::default()
/// };
/// assert!(options.cache_dir.is_none());
/// ```
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// An on-disk cache of compiled code (a restart does not recompile).
    pub cache_dir: Option<PathBuf>,
    /// Where an instance that traps leaves a core dump (see
    /// [`PluginEngine::coredump_dir`]).
    pub coredump_dir: Option<PathBuf>,
    /// The largest memory limit of the plugins the engine will run. Each
    /// linear memory then reserves that much address space, rounded up to
    /// a power of two, plus a guard, instead of wasmtime's 4 GiB: 1,000
    /// running instances reserve about 300 GB, not 4 TB (on demand; a pool
    /// reserves its slots up front, see [`PoolLimits`]). Generated code
    /// checks bounds explicitly then. On demand, a memory that must grow
    /// past its reservation (a plugin with a larger limit, added later)
    /// moves, so nothing breaks; in a pool it cannot. `None`: wasmtime's
    /// defaults.
    pub largest_memory: Option<u64>,
    /// Run instances from a pool of this many slots (wasmtime's pooling
    /// instance allocator) instead of allocating each on demand; see
    /// [`PoolLimits`]. `None`: on demand (`baton check`, tests of the
    /// runtime alone).
    pub pool_slots: Option<u32>,
}

/// What one slot of the instance pool holds: the most any one plugin
/// instance may use of each resource. Every slot reserves address space
/// for all of it up front (each memory: the slot's memory size plus a
/// guard), not resident memory. A component that needs more than a slot
/// holds is refused when it is loaded, with wasmtime's message naming the
/// limit (for example "the component transitively contains 3 Wasm linear
/// memories, which exceeds the configured maximum of 2"). Measured on every
/// toolchain baton is tested with: Rust, C, componentize-py and
/// componentize-js components have one linear memory, componentize-qjs
/// ones two; componentize-py's CPython links about a dozen core modules.
#[derive(Clone, Copy, Debug)]
pub struct PoolLimits;

impl PoolLimits {
    /// Core module instances per component instance.
    pub const CORE_INSTANCES: u32 = 64;
    /// Linear memories per component instance: two, the most of any tested
    /// toolchain's (each reserves the slot's memory size, 256 MiB by
    /// default, plus a guard: 1,000 plugins reserve about 0.7 TB of address
    /// space, none of it resident until used).
    pub const MEMORIES: u32 = 2;
    /// Tables per component instance.
    pub const TABLES: u32 = 16;
    /// Elements per table: CPython's function table has about 12,000.
    pub const TABLE_ELEMENTS: usize = 100_000;
    /// The runtime's metadata of one component instance and of its core
    /// instances together (wasmtime's default is 1 MiB; CPython's needs
    /// more). Reserved, not resident, until used.
    pub const INSTANCE_METADATA: usize = 16 << 20;
    /// Fiber stacks per component instance: component-model async runs each
    /// guest task on a stack of its own.
    pub const STACKS: u32 = 4;

    /// The slots for `plugins` plugins: one per plugin (a plugin runs at
    /// most one instance at a time), plus a quarter and 16 more, so that a
    /// configuration reloaded with more plugins still finds room.
    pub fn slots_for(plugins: usize) -> u32 {
        let plugins = u32::try_from(plugins).unwrap_or(u32::MAX / 2);
        plugins.saturating_add(plugins / 4).saturating_add(16)
    }
}

/// Reserves `largest` bytes of address space (rounded up to a power of
/// two) for each linear memory, and, with `pool_slots`, runs instances
/// from a pool of that many slots (see [`PoolLimits`]).
fn reserve_memory(config: &mut Config, largest: u64, pool_slots: Option<u32>) {
    // A power of two, so that a small change of a limit keeps the
    // compiled code (the cache's key includes the reservation).
    let reservation = largest.max(1 << 20).next_power_of_two();
    config.memory_reservation(reservation);
    // A memory whose declared maximum exceeds the reservation (a
    // Rust guest's has none) reserves its size plus this.
    config.memory_reservation_for_growth(reservation);
    if let Some(slots) = pool_slots {
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool(slots, reservation)));
    }
}

/// A pool of `slots` slots, each holding what [`PoolLimits`] allows one
/// instance. Each slot's memories are exactly `reservation`: a memory in
/// a pool cannot move, so none grows past it (the plugin's own limit, at
/// most that, applies first).
fn pool(slots: u32, reservation: u64) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(PoolLimits::CORE_INSTANCES))
        .total_memories(slots.saturating_mul(PoolLimits::MEMORIES))
        .total_tables(slots.saturating_mul(PoolLimits::TABLES))
        .total_stacks(slots.saturating_mul(PoolLimits::STACKS))
        .max_core_instances_per_component(PoolLimits::CORE_INSTANCES)
        .max_memories_per_component(PoolLimits::MEMORIES)
        .max_tables_per_component(PoolLimits::TABLES)
        .table_elements(PoolLimits::TABLE_ELEMENTS)
        .max_component_instance_size(PoolLimits::INSTANCE_METADATA)
        .max_core_instance_size(PoolLimits::INSTANCE_METADATA)
        .max_memory_size(usize::try_from(reservation).unwrap_or(usize::MAX));
    pool
}

/// Creates `dir` and has a trapping instance leave a core dump (written
/// there by the plugin's run).
fn keep_coredumps(config: &mut Config, dir: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        RuntimeError::Engine(format!(
            "cannot create the core dump folder {}: {e}",
            dir.display()
        ))
    })?;
    config.coredump_on_trap(true);
    Ok(())
}

/// Creates `dir` and keeps the compiled code there.
fn open_cache(config: &mut Config, dir: &Path) -> Result<Cache, RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        RuntimeError::Engine(format!(
            "cannot create the compiled-code cache {}: {e}",
            dir.display()
        ))
    })?;
    let mut cc = CacheConfig::new();
    cc.with_directory(dir);
    let cache = Cache::new(cc)
        .map_err(|e| RuntimeError::Engine(format!("compiled-code cache at {}: {e}", dir.display())))?;
    config.cache(Some(cache.clone()));
    Ok(cache)
}

/// About how many memory mappings one pool slot takes (its stacks and
/// their guard pages, its memories and tables): 140,671 for 12,516 slots,
/// measured with 10,000 plugins (2026-12-08).
const MAPPINGS_PER_SLOT: u64 = 12;

/// `error`, and, for a pool that the kernel's limit on memory mappings
/// (`vm.max_map_count`) may not allow, what to do about it: wasmtime says
/// only "failed to protect stack guard page".
fn pool_hint(error: String, pool_slots: Option<u32>) -> String {
    let Some(slots) = pool_slots else { return error };
    let needed = u64::from(slots) * MAPPINGS_PER_SLOT;
    let allowed = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    match allowed {
        Some(allowed) if needed * 10 >= allowed * 9 => format!(
            "{error}: the instance pool's {slots} slots (one per plugin, and a quarter more) need about \
             {needed} memory mappings, and this machine allows {allowed} (vm.max_map_count): raise it \
             (sysctl -w vm.max_map_count={}) or run fewer plugins on one host",
            (needed * 2).next_power_of_two()
        ),
        _ => error,
    }
}

impl PluginEngine {
    /// An engine with epoch interruption, component-model async, and what
    /// `options` asks for.
    pub fn new(options: EngineOptions) -> Result<PluginEngine, RuntimeError> {
        let EngineOptions {
            cache_dir,
            coredump_dir,
            largest_memory,
            pool_slots,
        } = options;
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model_async(true);
        // A pool's slots need a size: the default limit at least.
        let largest_memory = largest_memory.or(pool_slots.map(|_| super::DEFAULT_MEMORY_LIMIT));
        if let Some(largest) = largest_memory {
            reserve_memory(&mut config, largest, pool_slots);
        }
        if let Some(dir) = &coredump_dir {
            keep_coredumps(&mut config, dir)?;
        }
        let cache = cache_dir.map(|dir| open_cache(&mut config, &dir)).transpose()?;
        let engine =
            Engine::new(&config).map_err(|e| RuntimeError::Engine(pool_hint(e.to_string(), pool_slots)))?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(PluginEngine {
            engine,
            cache,
            claimed: Arc::default(),
            coredump_dir: coredump_dir.map(Arc::from),
            _ticker: Arc::new(ticker),
        })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Where a trapping instance's core dump goes, if anywhere: a file in
    /// the [standard format] with the instance's linear memories as they
    /// were at the trap, for `wasm-tools` or a debugger (and for tests that
    /// check what a guest's memory holds). Off unless configured: a dump is
    /// as large as the guest's memory.
    ///
    /// [standard format]: https://github.com/WebAssembly/tool-conventions/blob/main/Coredump.md
    pub fn coredump_dir(&self) -> Option<&Path> {
        self.coredump_dir.as_deref()
    }

    /// Keeps the epoch advancing until the returned guard is dropped (see
    /// [`EpochTicking`]); the first guard wakes the ticker at once.
    pub fn ticking(&self) -> EpochTicking {
        let shared = self._ticker.shared.clone();
        let mut state = shared.lock();
        state.active += 1;
        if state.active == 1 {
            shared.wake.notify_one();
        }
        drop(state);
        EpochTicking { shared }
    }

    /// Compiled-code cache hits and misses so far, if a cache is in use.
    pub fn cache_stats(&self) -> Option<(usize, usize)> {
        self.cache.as_ref().map(|c| (c.cache_hits(), c.cache_misses()))
    }

    /// Where the code of the component just made (call it right after
    /// `Component::new` returned it) came from.
    ///
    /// wasmtime counts the cache's hits and misses, not whose they were, so
    /// each compilation claims one of those not claimed yet: a hit if only
    /// hits are left, else a miss. wasmtime counts a compilation's hit or
    /// miss as it returns the component, so what is left is almost always
    /// the caller's own; only two compilations, one hit and one miss, that
    /// return within the same instant can be told apart wrongly (the totals
    /// stay exact). A miss whose code could not be written to the cache is
    /// not counted by wasmtime: with nothing left to claim, a miss.
    pub(crate) fn cache_use(&self) -> CacheUse {
        let Some(cache) = &self.cache else {
            return CacheUse::Off;
        };
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (hits, misses) = (cache.cache_hits(), cache.cache_misses());
        if hits > claimed.0 && misses <= claimed.1 {
            claimed.0 += 1;
            return CacheUse::Hit;
        }
        if misses > claimed.1 {
            claimed.1 += 1;
        }
        CacheUse::Miss
    }
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`] while
/// any guest may run (an [`EpochTicking`] exists), and sleeps otherwise: a
/// host whose leases have no running task does not wake 100 times a
/// second.
struct EpochTicker {
    shared: Arc<TickerShared>,
}

#[derive(Default)]
struct TickerShared {
    state: Mutex<TickerState>,
    wake: Condvar,
}

#[derive(Default)]
struct TickerState {
    /// Live [`EpochTicking`] guards.
    active: usize,
    stop: bool,
}

impl TickerShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let shared = Arc::new(TickerShared::default());
        let ticker = shared.clone();
        let weak = engine.weak();
        drop(engine);
        std::thread::Builder::new()
            .name("baton-epoch".into())
            .spawn(move || {
                loop {
                    {
                        let mut state = ticker.lock();
                        while state.active == 0 && !state.stop {
                            state = ticker.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                        }
                        if state.stop {
                            break;
                        }
                    }
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawn the epoch ticker thread");
        EpochTicker { shared }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
    }
}

/// Keeps the engine's epoch advancing while it lives: hold one for as long
/// as a Store of the engine may run guest code, since the epoch is what
/// interrupts a busy guest (and so what stops one by force).
pub struct EpochTicking {
    shared: Arc<TickerShared>,
}

impl Drop for EpochTicking {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.active = state.active.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pool_past_the_mapping_limit_is_told_what_to_raise() {
        let allowed: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        let slots = u32::try_from(allowed / super::MAPPINGS_PER_SLOT + 1).unwrap_or(u32::MAX);
        let said = super::pool_hint("failed to protect stack guard page".into(), Some(slots));
        if allowed > 0 {
            assert!(
                said.starts_with("failed to protect stack guard page: the instance pool's ")
                    && said.contains("(vm.max_map_count): raise it (sysctl -w vm.max_map_count="),
                "{said}"
            );
        }
        assert_eq!(super::pool_hint("other".into(), Some(16)), "other");
        assert_eq!(super::pool_hint("other".into(), None), "other");
    }
}
