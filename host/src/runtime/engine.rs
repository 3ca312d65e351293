//! The shared wasmtime engine: configuration, the compiled-code cache and
//! the epoch ticker that lets the host interrupt guests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Cache, CacheConfig, Config, Engine};

use super::RuntimeError;

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
    coredump_dir: Option<Arc<Path>>,
    _ticker: Arc<EpochTicker>,
}

impl PluginEngine {
    /// An engine with epoch interruption, component-model async, and, when
    /// `cache_dir` is given, an on-disk cache of compiled code (a restart
    /// does not recompile). When `coredump_dir` is given, an instance that
    /// traps leaves a core dump there (see [`PluginEngine::coredump_dir`]).
    pub fn new(
        cache_dir: Option<PathBuf>,
        coredump_dir: Option<PathBuf>,
    ) -> Result<PluginEngine, RuntimeError> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model_async(true);
        if let Some(dir) = &coredump_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                RuntimeError::Engine(format!(
                    "cannot create the core dump folder {}: {e}",
                    dir.display()
                ))
            })?;
            config.coredump_on_trap(true);
        }
        let cache = match cache_dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir).map_err(|e| {
                    RuntimeError::Engine(format!(
                        "cannot create the compiled-code cache {}: {e}",
                        dir.display()
                    ))
                })?;
                let mut cc = CacheConfig::new();
                cc.with_directory(&dir);
                let cache = Cache::new(cc).map_err(|e| {
                    RuntimeError::Engine(format!("compiled-code cache at {}: {e}", dir.display()))
                })?;
                config.cache(Some(cache.clone()));
                Some(cache)
            }
            None => None,
        };
        let engine = Engine::new(&config).map_err(|e| RuntimeError::Engine(e.to_string()))?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(PluginEngine {
            engine,
            cache,
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

    /// Compiled-code cache hits and misses so far, if a cache is in use.
    pub fn cache_stats(&self) -> Option<(usize, usize)> {
        self.cache.as_ref().map(|c| (c.cache_hits(), c.cache_misses()))
    }
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`].
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let weak = engine.weak();
        drop(engine);
        std::thread::Builder::new()
            .name("baton-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawn the epoch ticker thread");
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
