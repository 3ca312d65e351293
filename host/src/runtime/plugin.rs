//! Plugins: loading and checking a component, and running its leader task
//! for one term in a fresh Store.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use wasmtime::Store;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use super::bindings::{WitStatus, v0_1, v0_2};
use super::compile::{CacheUse, Compile, CompileObserver, NoCompileObserver};
use super::connections::{self, Connections};
use super::engine::PluginEngine;
use super::fence;
use super::http::{GuestHttp, HttpPolicy};
use super::lookup;
use super::network::NetworkGrant;
use super::output::{GuestOutput, GuestStream, OutputBudget, OutputLimits, StderrTail};
use super::state::{CurrentStatus, GuestState, shown_status};
use super::trap::{GuestLimits, Trap};
use super::{PluginError, RuntimeError};
use crate::election::{Hosts, LeaseView, Term};
use crate::support::rounding::human;

/// The memory limit of one plugin instance unless configured otherwise
/// (and of `baton check`): room for the Python and JavaScript runtimes,
/// which need tens of MiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 256 * 1024 * 1024;

/// How long a task of a plugin that counts the live hosts waits, at its
/// start, for the membership listing to count this host: the first
/// listing follows this host's first membership write within a retry
/// period, so this is a bound for a store that cannot be reached, not a
/// delay a working host sees.
pub const FIRST_HOSTS_WAIT: Duration = Duration::from_secs(5);

/// The world a plugin targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// `baton:leader/future-plugin`: component-model async.
    Future,
    /// `baton:leader/pollable-plugin`: WASI 0.2 pollables.
    Pollable,
}

impl World {
    /// The world's WIT name in the newest version of the contract.
    pub fn wit_name(self) -> &'static str {
        self.wit_name_in(Contract::V0_2)
    }

    /// The world's WIT name in `contract`.
    pub fn wit_name_in(self, contract: Contract) -> &'static str {
        match (self, contract) {
            (World::Future, Contract::V0_1) => "baton:leader/future-plugin@0.1.0",
            (World::Pollable, Contract::V0_1) => "baton:leader/pollable-plugin@0.1.0",
            (World::Future, Contract::V0_2) => "baton:leader/future-plugin@0.2.0",
            (World::Pollable, Contract::V0_2) => "baton:leader/pollable-plugin@0.2.0",
        }
    }
}

/// The version of the contract (`baton:leader`) a plugin was built
/// against. Both are served: a 0.x minor version is a breaking one, so a
/// plugin of 0.1.0 cannot run as one of 0.2.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    /// `baton:leader@0.1.0` (`wit/leader-0.1.0.wit`).
    V0_1,
    /// `baton:leader@0.2.0` (`wit/leader.wit`): adds the live hosts.
    V0_2,
}

impl Contract {
    /// Which version an export's version suffix names, if one this host
    /// serves.
    fn of_version(version: &str) -> Option<Contract> {
        match version {
            "0.1.0" => Some(Contract::V0_1),
            "0.2.0" => Some(Contract::V0_2),
            _ => None,
        }
    }
}

/// The export that identifies each world (matched without its version).
const FUTURE_EXPORT: &str = "baton:leader/task-async";
const POLLABLE_EXPORT: &str = "baton:leader/task-sync";

/// The imports that give the live hosts (matched without their version).
const HOSTS_IMPORTS: &[&str] = &["baton:leader/hosts-future", "baton:leader/hosts-pollable"];

/// A directory a plugin may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
    /// Whether the guest may only read it.
    pub read_only: bool,
}

/// What the host needs to know to run one plugin.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// The plugin's name, used in logs and errors.
    pub name: String,
    /// The component file.
    pub path: PathBuf,
    /// The most linear memory one instance may use, in bytes.
    pub memory_limit: u64,
    /// Environment variables the guest sees (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Directories the guest may use (nothing else is visible).
    pub dirs: Vec<DirGrant>,
    /// Where the guest may connect (nowhere by default).
    pub network: NetworkGrant,
    /// Where the guest may send HTTP requests, and its limits (nowhere by
    /// default).
    pub http: HttpPolicy,
    /// How much the guest may print.
    pub output: OutputLimits,
    /// The send buffer of each of its TCP connections (`SO_SNDBUF`), in
    /// bytes: what one may still deliver if the host is paused or killed
    /// across its force-stop.
    pub send_buffer: u64,
}

impl PluginSpec {
    /// What the plugin is granted, in one line for the log: environment
    /// variable names (not values), directories, network.
    ///
    /// ```
    /// use baton::runtime::{DirGrant, HttpPolicy, NetworkGrant, PluginSpec};
    ///
    /// let spec = PluginSpec {
    ///     name: "sync".into(),
    ///     path: "sync.wasm".into(),
    ///     memory_limit: 64 << 20,
    ///     env: vec![("TOKEN".into(), "secret".into())],
    ///     dirs: vec![DirGrant { host: "/srv/data".into(), guest: "/data".into(), read_only: true }],
    ///     network: NetworkGrant { connect: vec!["10.0.0.0/8:5432".parse().unwrap()], name_lookup: false },
    ///     http: HttpPolicy::new(&["https://api.example.com".parse().unwrap()], Default::default()).unwrap(),
    ///     output: Default::default(),
    ///     send_buffer: 64 << 10,
    /// };
    /// assert_eq!(
    ///     spec.grants(),
    ///     "env TOKEN; dir /srv/data as /data (read-only); connect 10.0.0.0/8:5432; http https://api.example.com"
    /// );
    /// ```
    pub fn grants(&self) -> String {
        let mut parts = Vec::new();
        if !self.env.is_empty() {
            let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
            parts.push(format!("env {}", names.join(",")));
        }
        for d in &self.dirs {
            let mode = if d.read_only { "read-only" } else { "read-write" };
            parts.push(format!("dir {} as {} ({mode})", d.host.display(), d.guest));
        }
        if !self.network.connect.is_empty() {
            let to: Vec<String> = self.network.connect.iter().map(|g| g.to_string()).collect();
            parts.push(format!("connect {}", to.join(",")));
        }
        if self.network.name_lookup {
            parts.push("name-lookup".into());
        }
        let http: Vec<String> = self.http.grants().map(|g| g.to_string()).collect();
        if !http.is_empty() {
            parts.push(format!("http {}", http.join(",")));
        }
        if let Some(k) = self.http.kubernetes() {
            let rules: Vec<String> = k
                .rules
                .iter()
                .map(|r| {
                    format!(
                        "{} {} in {}",
                        r.verbs.join("/"),
                        r.resources.join("/"),
                        r.namespaces.join("/")
                    )
                })
                .collect();
            parts.push(format!("kubernetes {}", rules.join(",")));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join("; ")
        }
    }
}

/// Links both worlds' imports: WASI 0.2 (with file streams that write
/// inline; see [`fence`]), `wasi:http` 0.2 (outgoing requests under the
/// plugin's grants; see [`super::http`]), the WASI 0.3 clocks and random
/// interfaces, and `current-status`.
///
/// Other WASI 0.3 interfaces (filesystem, sockets, cli) are not offered:
/// their host tasks act after the import has returned, outside the
/// host-call fence.
pub struct PluginRuntime {
    engine: PluginEngine,
    future: Linker<GuestState>,
    pollable: Linker<GuestState>,
    /// Every component compiled so far, by content: plugins that name the
    /// same file (or files with the same bytes) share one compilation and
    /// one copy of the code. Concurrent loads of the same content wait for
    /// the first.
    compiled: Mutex<HashMap<ContentKey, CompiledSlot>>,
    /// The content of each file read so far, by its identity: a file named
    /// again, unchanged, is not read and hashed again (10,000 plugins of
    /// one 270 KB file would read and hash 2.7 GB).
    files: Mutex<HashMap<FileId, ContentKey>>,
    /// The live hosts, as the host's membership keeps them; every plugin's
    /// instances read them (`current-hosts`).
    hosts: watch::Sender<Hosts>,
    /// Told of each compilation (see [`super::compile`]).
    observer: Arc<dyn CompileObserver>,
}

/// A file's identity and version: device, inode, length and modification
/// time. A file rewritten in place changes its length or modification
/// time, and a file replaced by a rename changes its inode.
#[derive(Clone, PartialEq, Eq, Hash)]
struct FileId {
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
type CompiledSlot = Arc<OnceLock<Result<Compiled, String>>>;

/// A component's identity by content: its length and a hash of its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ContentKey {
    len: usize,
    hash: u64,
}

impl ContentKey {
    fn of(bytes: &[u8]) -> ContentKey {
        let mut hasher = std::hash::DefaultHasher::new();
        bytes.hash(&mut hasher);
        ContentKey {
            len: bytes.len(),
            hash: hasher.finish(),
        }
    }
}

/// What every plugin of one component shares: the checked world, the
/// linked instance factory, and what the component imports that needs a
/// grant.
#[derive(Clone)]
struct Compiled {
    world: World,
    contract: Contract,
    pre: Pre,
    capabilities: Vec<Capability>,
    /// It imports `current-hosts`.
    uses_hosts: bool,
}

impl PluginRuntime {
    /// Linkers for both worlds, in every version of the contract, on
    /// `engine`.
    pub fn new(engine: PluginEngine) -> Result<PluginRuntime, RuntimeError> {
        let link = |e: wasmtime::Error| RuntimeError::Engine(format!("linking host functions: {e}"));
        let mut future = Linker::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut future).map_err(link)?;
        fence::add_fenced_file_writes(&mut future).map_err(link)?;
        connections::add_to_linker(&mut future).map_err(link)?;
        lookup::add_to_linker(&mut future).map_err(link)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut future).map_err(link)?;
        wasmtime_wasi::p3::clocks::add_to_linker(&mut future).map_err(link)?;
        wasmtime_wasi::p3::random::add_to_linker(&mut future).map_err(link)?;
        v0_1::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(
            &mut future,
            |s| s,
        )
        .map_err(link)?;
        v0_2::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(
            &mut future,
            |s| s,
        )
        .map_err(link)?;
        v0_2::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentStatus>(
            &mut future,
            |s| s,
        )
        .map_err(link)?;
        let mut pollable = Linker::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut pollable).map_err(link)?;
        fence::add_fenced_file_writes(&mut pollable).map_err(link)?;
        connections::add_to_linker(&mut pollable).map_err(link)?;
        lookup::add_to_linker(&mut pollable).map_err(link)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut pollable).map_err(link)?;
        v0_1::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
            &mut pollable,
            |s| s,
        )
        .map_err(link)?;
        v0_2::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
            &mut pollable,
            |s| s,
        )
        .map_err(link)?;
        v0_2::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentStatus>(
            &mut pollable,
            |s| s,
        )
        .map_err(link)?;
        Ok(PluginRuntime {
            engine,
            future,
            pollable,
            compiled: Mutex::default(),
            files: Mutex::default(),
            hosts: watch::Sender::new(Hosts::default()),
            observer: Arc::new(NoCompileObserver),
        })
    }

    /// Tells `observer` of each compilation from now on, as it starts and
    /// ends (the log says so anyway; see [`super::compile`]).
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
        let fail = |reason: String| PluginError::new(name, path, reason);
        match classify(bytes) {
            Binary::NotWasm => {
                return Err(fail(
                    "not a WebAssembly file (it does not start with the `\\0asm` magic)".into(),
                ));
            }
            Binary::CoreModule => {
                return Err(fail(
                    "a core WebAssembly module, not a component; build it for a component target \
                     (e.g. `cargo build --target wasm32-wasip2`) or wrap it with `wasm-tools component new`"
                        .into(),
                ));
            }
            Binary::UnknownVersion(v) => {
                return Err(fail(format!(
                    "an unsupported WebAssembly binary version or layer ({v:02x?})"
                )));
            }
            Binary::Component => {}
        }
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
        Plugin {
            content: key,
            capabilities: compiled.capabilities,
            output: OutputBudget::new(name.clone(), OutputLimits::default()),
            name,
            path: path.to_owned(),
            world: compiled.world,
            contract: compiled.contract,
            uses_hosts: compiled.uses_hosts,
            hosts: self.hosts.subscribe(),
            pre: compiled.pre,
            spec: None,
            engine: self.engine.clone(),
            memory: Default::default(),
        }
    }

    /// [`compile`](Self::compile), said in the log and to the observer as
    /// it starts and when it is done (see [`super::compile`]).
    fn compile_announced(&self, name: &str, path: &Path, bytes: &[u8]) -> Result<Compiled, String> {
        let compile = Compile::new(name, path, bytes.len());
        tracing::info!(plugin = name, path = %path.display(), size = %compile.size(), "compiling plugin");
        self.observer.compiling(&compile);
        let mut cache = None;
        let result = self.compile(bytes, &mut cache);
        let took = compile.started.elapsed();
        let cache = cache.filter(|_| result.is_ok());
        if let Some(cache) = cache {
            tracing::info!(plugin = name, took = %human(took), %cache, "plugin compiled");
        }
        self.observer.compiled(&compile, took, cache);
        result
    }

    /// Compiles a component and checks its world and imports; the error
    /// says why it cannot run (the caller names the plugin and file).
    /// `cache` is set to where its code came from once it is compiled.
    fn compile(&self, bytes: &[u8], cache: &mut Option<CacheUse>) -> Result<Compiled, String> {
        let component = Component::new(self.engine.engine(), bytes)
            .map_err(|e| format!("not a valid component: {}", error_chain(&e)))?;
        *cache = Some(self.engine.cache_use());
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(self.engine.engine())
            .map(|(n, _)| n.to_owned())
            .collect();
        let find = |prefix: &str| exports.iter().find(|e| unversioned(e) == prefix);
        let (world, export) = match (find(FUTURE_EXPORT), find(POLLABLE_EXPORT)) {
            (Some(e), None) => (World::Future, e),
            (None, Some(e)) => (World::Pollable, e),
            (Some(_), Some(_)) => {
                return Err(format!(
                    "exports both `{FUTURE_EXPORT}` and `{POLLABLE_EXPORT}`; a plugin targets exactly one world"
                ));
            }
            (None, None) => {
                let list = if exports.is_empty() {
                    "nothing".to_owned()
                } else {
                    exports.join(", ")
                };
                return Err(format!(
                    "targets another world: it exports {list}, but a plugin must export `{FUTURE_EXPORT}` \
                     (world {}) or `{POLLABLE_EXPORT}` (world {})",
                    World::Future.wit_name(),
                    World::Pollable.wit_name()
                ));
            }
        };
        let version = export.split_once('@').map_or("", |(_, v)| v);
        let contract = Contract::of_version(version).ok_or_else(|| {
            format!(
                "exports `{export}`, a version of the contract this host does not serve (it serves \
                 baton:leader@0.1.0 and @0.2.0)"
            )
        })?;
        let linker = match world {
            World::Future => &self.future,
            World::Pollable => &self.pollable,
        };
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| missing_import_message(&e))?;
        let checked = |e: wasmtime::Error| error_chain(&e).to_string();
        let pre = match (world, contract) {
            (World::Future, Contract::V0_1) => {
                Pre::Future01(v0_1::future_plugin::FuturePluginPre::new(pre).map_err(checked)?)
            }
            (World::Pollable, Contract::V0_1) => {
                Pre::Pollable01(v0_1::pollable_plugin::PollablePluginPre::new(pre).map_err(checked)?)
            }
            (World::Future, Contract::V0_2) => {
                Pre::Future02(v0_2::future_plugin::FuturePluginPre::new(pre).map_err(checked)?)
            }
            (World::Pollable, Contract::V0_2) => {
                Pre::Pollable02(v0_2::pollable_plugin::PollablePluginPre::new(pre).map_err(checked)?)
            }
        };
        let mut capabilities: Vec<Capability> = ty
            .imports(self.engine.engine())
            .filter_map(|(n, _)| Capability::of_import(n))
            .collect();
        capabilities.sort();
        capabilities.dedup();
        let uses_hosts = ty
            .imports(self.engine.engine())
            .any(|(n, _)| HOSTS_IMPORTS.contains(&unversioned(n)));
        Ok(Compiled {
            world,
            contract,
            pre,
            capabilities,
            uses_hosts,
        })
    }

    /// Loads a configured plugin: [`check`](Self::check) plus its grants.
    pub fn load(&self, spec: &PluginSpec) -> Result<Plugin, PluginError> {
        let mut plugin = self.check(&spec.name, &spec.path)?;
        // Fail now, not at the first term, if a granted directory is missing.
        for dir in &spec.dirs {
            if !dir.host.is_dir() {
                return Err(PluginError::new(
                    &spec.name,
                    &spec.path,
                    format!("granted directory {} does not exist", dir.host.display()),
                ));
            }
        }
        plugin.output = OutputBudget::new(plugin.name.clone(), spec.output);
        plugin.spec = Some(spec.clone());
        Ok(plugin)
    }
}

enum Binary {
    NotWasm,
    CoreModule,
    Component,
    UnknownVersion([u8; 4]),
}

fn classify(bytes: &[u8]) -> Binary {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Binary::NotWasm;
    }
    match [bytes[4], bytes[5], bytes[6], bytes[7]] {
        [1, 0, 0, 0] => Binary::CoreModule,
        [_, _, 1, 0] => Binary::Component,
        other => Binary::UnknownVersion(other),
    }
}

fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Every message in an error's chain, joined.
pub(crate) fn error_chain(e: &wasmtime::Error) -> String {
    e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ")
}

/// Hints for imports that toolchains add unless told not to.
const IMPORT_HINTS: &[(&str, &str)] = &[(
    "wasi:http/",
    "componentize-js adds wasi:http unless told not to: build with `-d http fetch-event`",
)];

fn missing_import_message(e: &wasmtime::Error) -> String {
    let chain = error_chain(e);
    // wasmtime names the import between backticks.
    let import = chain
        .split('`')
        .nth(1)
        .filter(|s| s.contains(':') || s.contains('/'));
    match import {
        Some(import) => {
            let hint = IMPORT_HINTS
                .iter()
                .find(|(prefix, _)| import.starts_with(prefix))
                .map(|(_, h)| format!("; {h}"))
                .unwrap_or_default();
            format!("imports `{import}`, which this host does not provide ({chain}){hint}")
        }
        None => format!("cannot be linked: {chain}"),
    }
}

#[derive(Clone)]
enum Pre {
    Future01(v0_1::future_plugin::FuturePluginPre<GuestState>),
    Pollable01(v0_1::pollable_plugin::PollablePluginPre<GuestState>),
    Future02(v0_2::future_plugin::FuturePluginPre<GuestState>),
    Pollable02(v0_2::pollable_plugin::PollablePluginPre<GuestState>),
}

/// A checked, compiled plugin, ready to instantiate.
pub struct Plugin {
    name: Arc<str>,
    path: PathBuf,
    world: World,
    contract: Contract,
    uses_hosts: bool,
    /// The live hosts, for `current-hosts`.
    hosts: watch::Receiver<Hosts>,
    pre: Pre,
    spec: Option<PluginSpec>,
    engine: PluginEngine,
    /// Shared by all its instances.
    output: Arc<OutputBudget>,
    /// What it imports that only a grant makes useful.
    capabilities: Vec<Capability>,
    /// The linear memory of its running instances, in bytes.
    memory: Arc<std::sync::atomic::AtomicU64>,
    /// The bytes it was compiled from.
    content: ContentKey,
}

/// Something a component imports that does nothing without a grant of its
/// plugin's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// `wasi:http/outgoing-handler`: the `http` grants.
    Http,
    /// `wasi:sockets`: the `connect` and `name-lookup` grants.
    Sockets,
    /// `wasi:filesystem`: the `dirs` grants.
    Files,
}

impl Capability {
    /// The interfaces and the grant, for `baton check`.
    pub fn describe(self) -> &'static str {
        match self {
            Capability::Http => "wasi:http/outgoing-handler (needs `http` grants)",
            Capability::Sockets => "wasi:sockets (needs `connect` or `name-lookup` grants)",
            Capability::Files => "wasi:filesystem (needs `dirs` grants; Rust's std imports it anyway)",
        }
    }

    fn of_import(name: &str) -> Option<Capability> {
        let name = unversioned(name);
        if name == "wasi:http/outgoing-handler" {
            Some(Capability::Http)
        } else if name.starts_with("wasi:sockets/") {
            Some(Capability::Sockets)
        } else if name.starts_with("wasi:filesystem/") {
            Some(Capability::Files)
        } else {
            None
        }
    }
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

    /// What it imports beyond its world that only a grant makes useful.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// Its output budget (shared by all its instances).
    pub fn output(&self) -> &Arc<OutputBudget> {
        &self.output
    }

    /// The linear memory its running instances use now, in bytes (0 while
    /// none runs).
    pub fn memory_bytes(&self) -> u64 {
        self.memory.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A fresh Store for one run in `term`: WASI with the plugin's grants,
    /// its memory limit, and the fence (see [`fence`]).
    fn new_store(
        &self,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
    ) -> Result<Store<GuestState>, String> {
        let tail = StderrTail::default();
        let mut wasi = WasiCtxBuilder::new();
        let output = |stream| GuestOutput::new(self.output.clone(), stream, term.clone(), tail.clone());
        wasi.stdout(output(GuestStream::Stdout));
        wasi.stderr(output(GuestStream::Stderr));
        // File operations run inside the guest's host call, where the fence
        // covers them, not later on the blocking pool. (Guests run on their
        // own runtime's workers; the election runs elsewhere.)
        wasi.allow_blocking_current_thread(fence::BLOCKING_FILE_IO);
        let mut memory_limit = DEFAULT_MEMORY_LIMIT;
        let mut http = HttpPolicy::default();
        let mut send_buffer = connections::DEFAULT_SEND_BUFFER;
        let mut name_lookup = false;
        if let Some(spec) = &self.spec {
            http = spec.http.clone();
            name_lookup = spec.network.name_lookup;
            send_buffer = spec.send_buffer;
            memory_limit = spec.memory_limit;
            for (k, v) in &spec.env {
                wasi.env(k, v);
            }
            for d in &spec.dirs {
                let perms = if d.read_only {
                    FsPerms::ReadOnly
                } else {
                    FsPerms::ReadWrite
                };
                wasi.preopened_dir(&d.host, &d.guest, perms)
                    .map_err(|e| format!("cannot open granted directory {}: {e}", d.host.display()))?;
            }
            spec.network.add_to_wasi(&mut wasi);
        }
        let connections = Connections::new(self.name.clone(), term.clone(), send_buffer);
        let state = GuestState {
            connections: connections.clone(),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: GuestLimits::new(memory_limit).counting(self.memory.clone()),
            term: term.clone(),
            name_lookup,
            view,
            hosts: self.hosts.clone(),
            stderr_tail: tail,
            http: WasiHttpCtx::new(),
            http_hooks: GuestHttp::new(self.name.clone(), http, term.clone(), connections),
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

    /// Runs the leader task once, in a fresh instance and Store, in `term`,
    /// until it returns or traps. Dropping the returned future drops the
    /// Store and so ends the task wherever it is.
    pub async fn run_task(&self, term: Arc<Term>, view: watch::Receiver<LeaseView>) -> TaskOutcome {
        // Declared before the Store, so dropped after it: the epoch
        // advances for as long as this instance may run.
        let _ticking = self.engine.ticking();
        if self.uses_hosts {
            self.await_counted(&view).await;
        }
        let mut store = match self.new_store(term.clone(), view.clone()) {
            Ok(s) => s,
            Err(e) => return TaskOutcome::Trapped(Trap::setup(e)),
        };
        // `run` gets the status as it is once the instance exists (creating
        // it takes a while for a large guest): `leading`, or not called.
        let status = |term: &Term| {
            let status = shown_status(&view.borrow(), term);
            status.is_leading().then(|| WitStatus::from(&status))
        };
        // One arm per world and version; the generated types differ, the
        // calls do not.
        macro_rules! run_future {
            ($pre:expr, $task:ident) => {
                match $pre.instantiate_async(&mut store).await {
                    Ok(instance) => {
                        let Some(arg) = status(&term) else {
                            return TaskOutcome::NotStarted;
                        };
                        store
                            .run_concurrent(async |a| instance.$task().call_run(a, arg).await)
                            .await
                            .and_then(|r| r)
                    }
                    Err(e) => Err(e),
                }
            };
        }
        macro_rules! run_pollable {
            ($pre:expr, $task:ident) => {
                match $pre.instantiate_async(&mut store).await {
                    Ok(instance) => {
                        let Some(arg) = status(&term) else {
                            return TaskOutcome::NotStarted;
                        };
                        instance.$task().call_run(&mut store, &arg).await
                    }
                    Err(e) => Err(e),
                }
            };
        }
        let result = match &self.pre {
            Pre::Future01(pre) => run_future!(pre, baton_leader_task_async),
            Pre::Pollable01(pre) => run_pollable!(pre, baton_leader_task_sync),
            Pre::Future02(pre) => run_future!(pre, baton_leader_task_async),
            Pre::Pollable02(pre) => run_pollable!(pre, baton_leader_task_sync),
        };
        match result {
            Ok(Ok(())) => TaskOutcome::Finished,
            Ok(Err(message)) => TaskOutcome::Failed(message),
            Err(e) => {
                if let Some(dir) = self.engine.coredump_dir() {
                    self.write_coredump(dir, &mut store, &term, &e);
                }
                let state = store.data();
                let tail: Vec<String> = state
                    .stderr_tail
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                TaskOutcome::Trapped(Trap::from_error(e, &tail, &state.limits))
            }
        }
    }
}

#[cfg(test)]
mod tests;
