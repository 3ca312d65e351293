//! Checking a component as it is compiled: that it is a component at all,
//! which world it targets (by its one task export), which version of the
//! contract, whether it exports a health check (0.4.0, the flavour of its
//! world), and that this host provides every import. The error
//! ([`CompileError`]) says why it cannot run; the caller names the plugin
//! and the file.

use std::hash::{Hash, Hasher};

use wasmtime::component::{Component, InstancePre};

use super::linkers::Linkers;
use super::{Contract, GrantedImport, World, unversioned};
use crate::runtime::bindings::{v0_1, v0_2, v0_3, v0_4};
use crate::runtime::compile::CacheUse;
use crate::runtime::engine::PluginEngine;
use crate::runtime::guest::GuestState;

/// The export that identifies each world (matched without its version).
const FUTURE_EXPORT: &str = "baton:leader/task-async";
const POLLABLE_EXPORT: &str = "baton:leader/task-sync";

/// The health check's export in each world (from 0.4.0).
const FUTURE_HEALTH: &str = "baton:leader/health-async";
const POLLABLE_HEALTH: &str = "baton:leader/health-sync";

/// The imports that give the live hosts (matched without their version).
const HOSTS_IMPORTS: &[&str] = &["baton:leader/hosts-future", "baton:leader/hosts-pollable"];

/// Hints for imports that toolchains add unless told not to.
const IMPORT_HINTS: &[(&str, &str)] = &[(
    "wasi:http/",
    "componentize-js adds wasi:http unless told not to: build with `-d http fetch-event`",
)];

/// Why a component cannot run. Cloned into every load of the same
/// content, so wasmtime's errors are kept as their rendered chain.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The file does not start with the WebAssembly magic.
    #[error("not a WebAssembly file (it does not start with the `\\0asm` magic)")]
    NotWasm,
    /// A core module, not a component.
    #[error(
        "a core WebAssembly module, not a component; build it for a component target \
         (e.g. `cargo build --target wasm32-wasip2`) or wrap it with `wasm-tools component new`"
    )]
    CoreModule,
    /// A binary version or layer wasmtime does not know.
    #[error("an unsupported WebAssembly binary version or layer ({0:02x?})")]
    UnknownVersion([u8; 4]),
    /// wasmtime refused to compile it (the error chain).
    #[error("not a valid component: {0}")]
    Invalid(String),
    /// It exports the task of both worlds.
    #[error("exports both `{FUTURE_EXPORT}` and `{POLLABLE_EXPORT}`; a plugin targets exactly one world")]
    BothWorlds,
    /// It exports the task of neither world.
    #[error(
        "targets another world: it exports {exports}, but a plugin must export `{FUTURE_EXPORT}` \
         (world {future}) or `{POLLABLE_EXPORT}` (world {pollable})",
        future = World::Future.wit_name(),
        pollable = World::Pollable.wit_name()
    )]
    OtherWorld {
        /// What it exports, listed (or `nothing`).
        exports: String,
    },
    /// Its task export names a version of the contract this host does not
    /// serve.
    #[error(
        "exports `{export}`, a version of the contract this host does not serve (it serves \
         baton:leader@0.1.0, @0.2.0, @0.3.0 and @0.4.0)"
    )]
    UnservedContract {
        /// The export, version included.
        export: String,
    },
    /// It exports a health check of the other world's flavour, or one in
    /// a version of the contract without health checks.
    #[error(
        "exports `{export}`, but a plugin of {world} exports its health check as `{wanted}@0.4.0` \
         (health checks are new in baton:leader@0.4.0)"
    )]
    WrongHealth {
        /// The health export, version included.
        export: String,
        /// The world and version of its task.
        world: &'static str,
        /// The health export its world has.
        wanted: &'static str,
    },
    /// It imports something this host does not provide.
    #[error(
        "imports `{import}`, which this host does not provide ({chain}){}",
        hint_of(import)
    )]
    MissingImport {
        /// The import wasmtime named.
        import: String,
        /// wasmtime's error chain.
        chain: String,
    },
    /// It cannot be linked, for a reason wasmtime names no import for.
    #[error("cannot be linked: {0}")]
    Unlinkable(String),
    /// Its exports do not have the types of its world (the error chain).
    #[error("{0}")]
    WrongTypes(String),
}

/// `; ` and the hint for `import`, if a toolchain adds it unasked.
fn hint_of(import: &str) -> String {
    IMPORT_HINTS
        .iter()
        .find(|(prefix, _)| import.starts_with(prefix))
        .map(|(_, h)| format!("; {h}"))
        .unwrap_or_default()
}

/// A component's identity by content: its length and a hash of its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ContentKey {
    len: usize,
    pub(super) hash: u64,
}

impl ContentKey {
    pub(super) fn of(bytes: &[u8]) -> ContentKey {
        let mut hasher = std::hash::DefaultHasher::new();
        bytes.hash(&mut hasher);
        ContentKey {
            len: bytes.len(),
            hash: hasher.finish(),
        }
    }
}

/// Refuses what is not a component by its first bytes, before wasmtime
/// sees it.
pub(super) fn check_binary(bytes: &[u8]) -> Result<(), CompileError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(CompileError::NotWasm);
    }
    match [bytes[4], bytes[5], bytes[6], bytes[7]] {
        [1, 0, 0, 0] => Err(CompileError::CoreModule),
        [_, _, 1, 0] => Ok(()),
        other => Err(CompileError::UnknownVersion(other)),
    }
}

/// What every plugin of one component shares: the checked world, the
/// linked instance factory, and what the component imports that needs a
/// grant.
#[derive(Clone)]
pub(super) struct Compiled {
    pub(super) world: World,
    pub(super) contract: Contract,
    pub(super) pre: Pre,
    pub(super) capabilities: Vec<GrantedImport>,
    /// It imports `current-hosts`.
    pub(super) uses_hosts: bool,
    /// The instance factory for its health check, if it exports one.
    pub(super) health: Option<HealthPre>,
}

/// The instance factory of a world with a health check (0.4.0).
#[derive(Clone)]
pub(super) enum HealthPre {
    Future(v0_4::future_health::FuturePluginWithHealthPre<GuestState>),
    Pollable(v0_4::pollable_health::PollablePluginWithHealthPre<GuestState>),
}

/// The instance factory of one world in one version of the contract.
#[derive(Clone)]
pub(super) enum Pre {
    Future01(v0_1::future_plugin::FuturePluginPre<GuestState>),
    Pollable01(v0_1::pollable_plugin::PollablePluginPre<GuestState>),
    Future02(v0_2::future_plugin::FuturePluginPre<GuestState>),
    Pollable02(v0_2::pollable_plugin::PollablePluginPre<GuestState>),
    Future03(v0_3::future_plugin::FuturePluginPre<GuestState>),
    Pollable03(v0_3::pollable_plugin::PollablePluginPre<GuestState>),
    Future04(v0_4::future_plugin::FuturePluginPre<GuestState>),
    Pollable04(v0_4::pollable_plugin::PollablePluginPre<GuestState>),
}

impl Pre {
    /// The world's untyped instance factory: what a prepared instance is
    /// made from (its typed exports are looked up when it starts).
    pub(super) fn instance_pre(&self) -> &InstancePre<GuestState> {
        match self {
            Pre::Future01(p) => p.instance_pre(),
            Pre::Pollable01(p) => p.instance_pre(),
            Pre::Future02(p) => p.instance_pre(),
            Pre::Pollable02(p) => p.instance_pre(),
            Pre::Future03(p) => p.instance_pre(),
            Pre::Pollable03(p) => p.instance_pre(),
            Pre::Future04(p) => p.instance_pre(),
            Pre::Pollable04(p) => p.instance_pre(),
        }
    }
}

/// Compiles a component and checks its world and imports. `cache` is set
/// to where its code came from once it is compiled.
pub(super) fn compile(
    engine: &PluginEngine,
    linkers: &Linkers,
    bytes: &[u8],
    cache: &mut Option<CacheUse>,
) -> Result<Compiled, CompileError> {
    let component =
        Component::new(engine.engine(), bytes).map_err(|e| CompileError::Invalid(error_chain(&e)))?;
    *cache = Some(engine.cache_use());
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine.engine()).map(|(n, _)| n.to_owned()).collect();
    let (world, export) = world_of(&exports)?;
    let version = export.split_once('@').map_or("", |(_, v)| v);
    let contract = Contract::of_version(version).ok_or(CompileError::UnservedContract { export })?;
    let checks_health = health_export(&exports, world, contract)?;
    let linked = linkers
        .of(world)
        .instantiate_pre(&component)
        .map_err(|e| missing_import(&e))?;
    // The memory images every instance maps copy-on-write, made now rather
    // than by the first instance: a term's start then only maps them (a
    // 20 MB Python component's images took about 5 ms to write).
    component
        .initialize_copy_on_write_image()
        .map_err(|e| CompileError::Invalid(error_chain(&e)))?;
    let health = match checks_health {
        true => Some(health_pre(world, linked.clone())?),
        false => None,
    };
    let imports: Vec<&str> = ty.imports(engine.engine()).map(|(n, _)| n).collect();
    let mut capabilities: Vec<GrantedImport> = imports
        .iter()
        .filter_map(|n| GrantedImport::of_import(n))
        .collect();
    capabilities.sort();
    capabilities.dedup();
    Ok(Compiled {
        world,
        contract,
        pre: typed_pre(world, contract, linked)?,
        capabilities,
        uses_hosts: imports.iter().any(|n| HOSTS_IMPORTS.contains(&unversioned(n))),
        health,
    })
}

/// Whether the component exports a health check: the flavour of `world`,
/// in 0.4.0 or later.
fn health_export(exports: &[String], world: World, contract: Contract) -> Result<bool, CompileError> {
    let wanted = match world {
        World::Future => FUTURE_HEALTH,
        World::Pollable => POLLABLE_HEALTH,
    };
    let found = exports
        .iter()
        .find(|e| matches!(unversioned(e), FUTURE_HEALTH | POLLABLE_HEALTH));
    match found {
        None => Ok(false),
        Some(e) if unversioned(e) == wanted && contract.has_health_check() => Ok(true),
        Some(e) => Err(CompileError::WrongHealth {
            export: e.clone(),
            world: world.wit_name_in(contract),
            wanted,
        }),
    }
}

/// The linked component as the instance factory of `world` with a health
/// check, its exports' types checked.
fn health_pre(world: World, linked: InstancePre<GuestState>) -> Result<HealthPre, CompileError> {
    let checked = |e: wasmtime::Error| CompileError::WrongTypes(error_chain(&e));
    Ok(match world {
        World::Future => {
            HealthPre::Future(v0_4::future_health::FuturePluginWithHealthPre::new(linked).map_err(checked)?)
        }
        World::Pollable => HealthPre::Pollable(
            v0_4::pollable_health::PollablePluginWithHealthPre::new(linked).map_err(checked)?,
        ),
    })
}

/// The world whose task the component exports, and that export.
fn world_of(exports: &[String]) -> Result<(World, String), CompileError> {
    let find = |prefix: &str| exports.iter().find(|e| unversioned(e) == prefix).cloned();
    match (find(FUTURE_EXPORT), find(POLLABLE_EXPORT)) {
        (Some(e), None) => Ok((World::Future, e)),
        (None, Some(e)) => Ok((World::Pollable, e)),
        (Some(_), Some(_)) => Err(CompileError::BothWorlds),
        (None, None) if exports.is_empty() => Err(CompileError::OtherWorld {
            exports: "nothing".to_owned(),
        }),
        (None, None) => Err(CompileError::OtherWorld {
            exports: exports.join(", "),
        }),
    }
}

/// The linked component as the instance factory of `world` in `contract`,
/// its exports' types checked.
fn typed_pre(world: World, contract: Contract, linked: InstancePre<GuestState>) -> Result<Pre, CompileError> {
    let checked = |e: wasmtime::Error| CompileError::WrongTypes(error_chain(&e));
    Ok(match (world, contract) {
        (World::Future, Contract::V0_1) => {
            Pre::Future01(v0_1::future_plugin::FuturePluginPre::new(linked).map_err(checked)?)
        }
        (World::Pollable, Contract::V0_1) => {
            Pre::Pollable01(v0_1::pollable_plugin::PollablePluginPre::new(linked).map_err(checked)?)
        }
        (World::Future, Contract::V0_2) => {
            Pre::Future02(v0_2::future_plugin::FuturePluginPre::new(linked).map_err(checked)?)
        }
        (World::Pollable, Contract::V0_2) => {
            Pre::Pollable02(v0_2::pollable_plugin::PollablePluginPre::new(linked).map_err(checked)?)
        }
        (World::Future, Contract::V0_3) => {
            Pre::Future03(v0_3::future_plugin::FuturePluginPre::new(linked).map_err(checked)?)
        }
        (World::Pollable, Contract::V0_3) => {
            Pre::Pollable03(v0_3::pollable_plugin::PollablePluginPre::new(linked).map_err(checked)?)
        }
        (World::Future, Contract::V0_4) => {
            Pre::Future04(v0_4::future_plugin::FuturePluginPre::new(linked).map_err(checked)?)
        }
        (World::Pollable, Contract::V0_4) => {
            Pre::Pollable04(v0_4::pollable_plugin::PollablePluginPre::new(linked).map_err(checked)?)
        }
    })
}

/// Every message in an error's chain, joined.
fn error_chain(e: &wasmtime::Error) -> String {
    e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ")
}

/// A link error: the import wasmtime names (between backticks), if it
/// names one.
fn missing_import(e: &wasmtime::Error) -> CompileError {
    let chain = error_chain(e);
    let import = chain
        .split('`')
        .nth(1)
        .filter(|s| s.contains(':') || s.contains('/'))
        .map(str::to_owned);
    match import {
        Some(import) => CompileError::MissingImport { import, chain },
        None => CompileError::Unlinkable(chain),
    }
}
