//! `PluginRuntime`: compiles each component once per content (one slot per
//! content, which concurrent loads of it wait on), remembers which file
//! held which content, and makes a `Plugin` of a checked component.
//!
//! Invariant: a file is read again only when its identity (device, inode,
//! length, modification time) changed; a content is compiled at most once
//! per runtime, and its result, a failure included, is shared by every
//! plugin that names it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

use super::component::{self, CompileError, Compiled, ContentKey};
use super::linkers::Linkers;
use super::spec::PluginSpec;
use super::task::Plugin;
use crate::election::Hosts;
use crate::runtime::capability::unit::LoadContext;
use crate::runtime::compile::{Compile, CompileObserver, NoCompileObserver};
use crate::runtime::engine::PluginEngine;
use crate::runtime::guest::Grants;
use crate::runtime::{PluginError, RuntimeError};
use crate::store::buckets::BucketStore;
use crate::support::rounding::human;

/// Links both worlds' imports (see `linkers`), compiles and checks
/// components, and makes plugins of them.
pub struct PluginRuntime {
    engine: PluginEngine,
    linkers: Linkers,
    /// Every component compiled so far, by content: plugins that name the
    /// same file (or files with the same bytes) share one compilation and
    /// one copy of the code. Concurrent loads of the same content wait for
    /// the first.
    compiled: Mutex<HashMap<ContentKey, CompiledSlot>>,
    /// The content of each file read so far, by its identity: a file named
    /// again, unchanged, is not read and hashed again (10,000 plugins of
    /// one 270 KB file would read and hash 2.7 GB).
    pub(super) files: Mutex<HashMap<FileId, ContentKey>>,
    /// The live hosts, as the host's membership keeps them; every plugin's
    /// instances read them (`current-hosts`).
    hosts: watch::Sender<Hosts>,
    /// Told of each compilation (see [`crate::runtime::compile`]).
    observer: Arc<dyn CompileObserver>,
    /// The lease store's buckets, for plugins' `wasi:keyvalue`.
    buckets: Option<Arc<dyn BucketStore>>,
}

/// A file's identity and version: device, inode, length and modification
/// time. A file rewritten in place changes its length or modification
/// time, and a file replaced by a rename changes its inode.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified: m.modified().ok(),
        })
    }
}

/// One content's compilation: done once, by the first load that needs it;
/// the error says why the component cannot run.
type CompiledSlot = Arc<OnceLock<Result<Compiled, CompileError>>>;

impl PluginRuntime {
    /// Linkers for both worlds, in every version of the contract, on
    /// `engine`.
    pub fn new(engine: PluginEngine) -> Result<PluginRuntime, RuntimeError> {
        Ok(PluginRuntime {
            linkers: Linkers::new(engine.engine())?,
            engine,
            compiled: Mutex::default(),
            files: Mutex::default(),
            hosts: watch::Sender::new(Hosts::default()),
            observer: Arc::new(NoCompileObserver),
            buckets: None,
        })
    }

    /// Tells `observer` of each compilation from now on, as it starts and
    /// ends (the log says so anyway; see [`crate::runtime::compile`]).
    pub fn set_compile_observer(&mut self, observer: Arc<dyn CompileObserver>) {
        self.observer = observer;
    }

    /// How many distinct components this runtime has compiled (or taken
    /// from the compiled-code cache) and found fit to run: one per
    /// content, however many plugins name it.
    pub fn components(&self) -> usize {
        let compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        compiled
            .values()
            .filter(|slot| slot.get().is_some_and(Result::is_ok))
            .count()
    }

    /// Serves plugins' `wasi:keyvalue` from `buckets` (without, every
    /// `open` is `no-such-store`).
    pub fn set_bucket_store(&mut self, buckets: Arc<dyn BucketStore>) {
        self.buckets = Some(buckets);
    }

    /// Where the live hosts are published for the plugins' instances (the
    /// host's membership keeps them; see [`crate::election::Spreader`]).
    pub fn hosts(&self) -> &watch::Sender<Hosts> {
        &self.hosts
    }

    /// The engine.
    pub fn engine(&self) -> &PluginEngine {
        &self.engine
    }

    /// Compiles (or takes from the cache) and checks a component: which
    /// world it targets, and whether this host provides everything it
    /// imports. The error names the plugin and says exactly why it cannot
    /// run.
    pub fn check(&self, name: &str, path: &Path) -> Result<Plugin, PluginError> {
        let id = FileId::of(path);
        if let Some((key, compiled)) = id.as_ref().and_then(|id| self.compiled_file(id)) {
            return Ok(self.plugin(name, path, key, compiled));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| PluginError::new(name, path, format!("cannot read the file: {e}")))?;
        if let Some(id) = id {
            let key = ContentKey::of(&bytes);
            self.files
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, key);
        }
        self.check_bytes(name, path, &bytes)
    }

    /// The compilation of a file read before and found fit to run, if it
    /// has not changed since.
    fn compiled_file(&self, id: &FileId) -> Option<(ContentKey, Compiled)> {
        let key = *self.files.lock().unwrap_or_else(|e| e.into_inner()).get(id)?;
        let slot = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)?
            .clone();
        slot.get()?.as_ref().ok().cloned().map(|compiled| (key, compiled))
    }

    /// As [`check`](Self::check), for bytes already read from `path`.
    pub fn check_bytes(&self, name: &str, path: &Path, bytes: &[u8]) -> Result<Plugin, PluginError> {
        let fail = |e: CompileError| PluginError::new(name, path, e.to_string());
        component::check_binary(bytes).map_err(fail)?;
        let key = ContentKey::of(bytes);
        let slot = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .clone();
        let compiled = slot
            .get_or_init(|| self.compile_announced(name, path, bytes))
            .clone()
            .map_err(fail)?;
        Ok(self.plugin(name, path, key, compiled))
    }

    /// A plugin named `name` of the component at `path`, compiled from
    /// the bytes of `key`.
    fn plugin(&self, name: &str, path: &Path, key: ContentKey, compiled: Compiled) -> Plugin {
        let name: Arc<str> = Arc::from(name);
        // A plugin only checked has every capability's default, and no
        // buckets (see `load`).
        let no_buckets = LoadContext {
            plugin: &name,
            buckets: None,
        };
        let parts = Grants::default()
            .load(&no_buckets)
            .expect("the default grants load");
        Plugin {
            content: key,
            capabilities: compiled.capabilities,
            parts,
            name,
            path: path.to_owned(),
            world: compiled.world,
            contract: compiled.contract,
            uses_hosts: compiled.uses_hosts,
            health: compiled.health,
            hosts: self.hosts.subscribe(),
            pre: compiled.pre,
            spec: None,
            engine: self.engine.clone(),
            memory: Default::default(),
        }
    }

    /// Compiles `bytes` (see `component::compile`), said in the log and to
    /// the observer as it starts and when it is done (see
    /// [`crate::runtime::compile`]).
    fn compile_announced(&self, name: &str, path: &Path, bytes: &[u8]) -> Result<Compiled, CompileError> {
        let compile = Compile::new(name, path, bytes.len());
        tracing::info!(plugin = name, path = %path.display(), size = %compile.size(), "compiling plugin");
        self.observer.compiling(&compile);
        let mut cache = None;
        let result = component::compile(&self.engine, &self.linkers, bytes, &mut cache);
        let took = compile.started.elapsed();
        let cache = cache.filter(|_| result.is_ok());
        if let Some(cache) = cache {
            tracing::info!(plugin = name, took = %human(took), %cache, "plugin compiled");
        }
        self.observer.compiled(&compile, took, cache);
        result
    }

    /// Loads a configured plugin: [`check`](Self::check) plus its grants.
    pub fn load(&self, spec: &PluginSpec) -> Result<Plugin, PluginError> {
        let mut plugin = self.check(&spec.name, &spec.path)?;
        let load = LoadContext {
            plugin: &plugin.name,
            buckets: self.buckets.as_ref(),
        };
        plugin.parts = spec
            .grants
            .load(&load)
            .map_err(|reason| PluginError::new(&spec.name, &spec.path, reason))?;
        if spec.health_check.is_some() && plugin.health.is_none() {
            return Err(PluginError::new(
                &spec.name,
                &spec.path,
                format!(
                    "has a `health-check` table, but its component exports no health check \
                     (it targets {}; a check is `baton:leader/health-sync` or `health-async`, \
                     from baton:leader@0.4.0): remove the table or export the check",
                    plugin.wit_world()
                ),
            ));
        }
        plugin.spec = Some(spec.clone());
        Ok(plugin)
    }
}
