//! Plugins: loading and checking a component, and running its leader task
//! for one term in a fresh Store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Store, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::bindings::{WitStatus, future_plugin, pollable_plugin};
use super::engine::PluginEngine;
use super::network::NetworkGrant;
use super::output::{GuestOutput, GuestStream};
use super::state::{GuestState, StatusFuture};
use super::{PluginError, RuntimeError};
use crate::election::{LeaseView, Status, TermDeadline};

/// The world a plugin targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// `baton:leader/future-plugin`: component-model async.
    Future,
    /// `baton:leader/pollable-plugin`: WASI 0.2 pollables.
    Pollable,
}

impl World {
    /// The world's WIT name.
    pub fn wit_name(self) -> &'static str {
        match self {
            World::Future => "baton:leader/future-plugin@0.1.0",
            World::Pollable => "baton:leader/pollable-plugin@0.1.0",
        }
    }
}

/// The export that identifies each world (matched without its version).
const FUTURE_EXPORT: &str = "baton:leader/task-async";
const POLLABLE_EXPORT: &str = "baton:leader/task-sync";

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
}

impl PluginSpec {
    /// What the plugin is granted, in one line for the log: environment
    /// variable names (not values), directories, network.
    ///
    /// ```
    /// use baton::runtime::{DirGrant, NetworkGrant, PluginSpec};
    ///
    /// let spec = PluginSpec {
    ///     name: "sync".into(),
    ///     path: "sync.wasm".into(),
    ///     memory_limit: 64 << 20,
    ///     env: vec![("TOKEN".into(), "secret".into())],
    ///     dirs: vec![DirGrant { host: "/srv/data".into(), guest: "/data".into(), read_only: true }],
    ///     network: NetworkGrant { connect: vec!["10.0.0.0/8:5432".parse().unwrap()], name_lookup: false },
    /// };
    /// assert_eq!(
    ///     spec.grants(),
    ///     "env TOKEN; dir /srv/data as /data (read-only); connect 10.0.0.0/8:5432"
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
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join("; ")
        }
    }
}

/// Links both worlds' imports: WASI 0.2 and 0.3, and `current-status`.
pub struct PluginRuntime {
    engine: PluginEngine,
    future: Linker<GuestState>,
    pollable: Linker<GuestState>,
}

impl PluginRuntime {
    /// Linkers for both worlds on `engine`.
    pub fn new(engine: PluginEngine) -> Result<PluginRuntime, RuntimeError> {
        let link = |e: wasmtime::Error| RuntimeError::Engine(format!("linking host functions: {e}"));
        let mut future = Linker::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut future).map_err(link)?;
        wasmtime_wasi::p3::add_to_linker(&mut future).map_err(link)?;
        future_plugin::baton::leader::status_future::add_to_linker::<_, StatusFuture>(&mut future, |s| s)
            .map_err(link)?;
        let mut pollable = Linker::new(engine.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut pollable).map_err(link)?;
        pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, StatusFuture>(
            &mut pollable,
            |s| s,
        )
        .map_err(link)?;
        Ok(PluginRuntime {
            engine,
            future,
            pollable,
        })
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
        let bytes = std::fs::read(path)
            .map_err(|e| PluginError::new(name, path, format!("cannot read the file: {e}")))?;
        self.check_bytes(name, path, &bytes)
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
        let component = Component::new(self.engine.engine(), bytes)
            .map_err(|e| fail(format!("not a valid component: {}", error_chain(&e))))?;
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(self.engine.engine())
            .map(|(n, _)| n.to_owned())
            .collect();
        let has = |prefix: &str| exports.iter().any(|e| unversioned(e) == prefix);
        let world = match (has(FUTURE_EXPORT), has(POLLABLE_EXPORT)) {
            (true, false) => World::Future,
            (false, true) => World::Pollable,
            (true, true) => {
                return Err(fail(format!(
                    "exports both `{FUTURE_EXPORT}` and `{POLLABLE_EXPORT}`; a plugin targets exactly one world"
                )));
            }
            (false, false) => {
                let list = if exports.is_empty() {
                    "nothing".to_owned()
                } else {
                    exports.join(", ")
                };
                return Err(fail(format!(
                    "targets another world: it exports {list}, but a plugin must export `{FUTURE_EXPORT}` \
                     (world {}) or `{POLLABLE_EXPORT}` (world {})",
                    World::Future.wit_name(),
                    World::Pollable.wit_name()
                )));
            }
        };
        let linker = match world {
            World::Future => &self.future,
            World::Pollable => &self.pollable,
        };
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| fail(missing_import_message(&e)))?;
        let pre = match world {
            World::Future => Pre::Future(
                future_plugin::FuturePluginPre::new(pre).map_err(|e| fail(error_chain(&e).to_string()))?,
            ),
            World::Pollable => Pre::Pollable(
                pollable_plugin::PollablePluginPre::new(pre)
                    .map_err(|e| fail(error_chain(&e).to_string()))?,
            ),
        };
        Ok(Plugin {
            name: Arc::from(name),
            path: path.to_owned(),
            world,
            pre,
            spec: None,
            engine: self.engine.clone(),
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

enum Pre {
    Future(future_plugin::FuturePluginPre<GuestState>),
    Pollable(pollable_plugin::PollablePluginPre<GuestState>),
}

/// A checked, compiled plugin, ready to instantiate.
pub struct Plugin {
    name: Arc<str>,
    path: PathBuf,
    world: World,
    pre: Pre,
    spec: Option<PluginSpec>,
    engine: PluginEngine,
}

/// How one run of a leader task ended.
#[derive(Debug)]
pub enum TaskOutcome {
    /// `run` returned `ok`.
    Finished,
    /// `run` returned `error`.
    Failed(String),
    /// The guest trapped, or could not be instantiated.
    Trapped(String),
}

/// When the host must stop a task by force, checked inside guest execution
/// at every epoch tick.
#[derive(Clone, Debug)]
pub struct TaskGuard {
    /// The term's deadline.
    pub deadline: Arc<TermDeadline>,
    /// The grace after the deadline.
    pub grace: Duration,
    /// Set by the supervisor to stop the task at the next tick.
    pub kill: Arc<AtomicBool>,
}

impl TaskGuard {
    /// Whether the task must stop now: it was told to, or its term's
    /// deadline plus grace has passed (even if the elector has not run yet,
    /// e.g. right after the process was paused and resumed).
    pub fn must_stop(&self) -> bool {
        self.kill.load(Ordering::Relaxed) || Instant::now() > self.deadline.until() + self.grace
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

    fn new_store(
        &self,
        view: watch::Receiver<LeaseView>,
        guard: TaskGuard,
    ) -> Result<Store<GuestState>, String> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(GuestOutput::new(self.name.clone(), GuestStream::Stdout));
        wasi.stderr(GuestOutput::new(self.name.clone(), GuestStream::Stderr));
        let mut memory_limit = DEFAULT_MEMORY_LIMIT;
        if let Some(spec) = &self.spec {
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
        let state = GuestState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size(memory_limit as usize)
                .build(),
            status: view,
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if guard.must_stop() {
                Err(wasmtime::format_err!(
                    "stopped by the host: the term is over and the grace period has passed"
                ))
            } else {
                // tokio's own yield lets the worker poll its timers and I/O
                // before the guest runs again, so the elector's timers and
                // the supervisor's force-stop fire on time even while every
                // worker thread runs a busy guest.
                Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
            }
        });
        Ok(store)
    }

    /// Runs the leader task once, in a fresh instance and Store, until it
    /// returns or traps. Dropping the returned future drops the Store and
    /// so ends the task wherever it is.
    pub async fn run_task(
        &self,
        status: Status,
        view: watch::Receiver<LeaseView>,
        guard: TaskGuard,
    ) -> TaskOutcome {
        let mut store = match self.new_store(view, guard) {
            Ok(s) => s,
            Err(e) => return TaskOutcome::Trapped(e),
        };
        let arg = WitStatus::from(&status);
        let result = match &self.pre {
            Pre::Future(pre) => match pre.instantiate_async(&mut store).await {
                Ok(instance) => store
                    .run_concurrent(async |a| instance.baton_leader_task_async().call_run(a, arg).await)
                    .await
                    .and_then(|r| r),
                Err(e) => Err(e),
            },
            Pre::Pollable(pre) => match pre.instantiate_async(&mut store).await {
                Ok(instance) => instance.baton_leader_task_sync().call_run(&mut store, &arg).await,
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(Ok(())) => TaskOutcome::Finished,
            Ok(Err(message)) => TaskOutcome::Failed(message),
            Err(e) => TaskOutcome::Trapped(error_chain(&e)),
        }
    }
}

/// The memory limit of a plugin loaded without a configuration (`baton
/// check`): generous enough for the Python and JavaScript runtimes.
pub const DEFAULT_MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
