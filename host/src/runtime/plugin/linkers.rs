//! The host's imports, linked once for each world: WASI 0.2 (with file
//! streams that write inline; see [`fence`]), `wasi:http` 0.2 (outgoing
//! requests under the plugin's grants; see [`crate::runtime::http`]),
//! `wasi:keyvalue` and `wasi:config` (see [`keyvalue`], [`config`]), the
//! WASI 0.3 clocks and random interfaces (the future world only), and
//! `current-status`, `current-hosts` and `current-run` in every version of
//! the contract that has them.
//!
//! Other WASI 0.3 interfaces (filesystem, sockets, cli) are not offered:
//! their host tasks act after the import has returned, outside the
//! host-call fence.

use wasmtime::Engine;
use wasmtime::component::Linker;

use super::World;
use crate::runtime::RuntimeError;
use crate::runtime::bindings::{v0_1, v0_2, v0_3, v0_4};
use crate::runtime::state::{CurrentStatus, GuestState};
use crate::runtime::{config, connections, fence, keyvalue, lookup};

/// One linker per world, on one engine.
pub(super) struct Linkers {
    future: Linker<GuestState>,
    pollable: Linker<GuestState>,
}

impl Linkers {
    /// Both worlds' linkers, in every version of the contract.
    pub(super) fn new(engine: &Engine) -> Result<Linkers, RuntimeError> {
        let link = |e: wasmtime::Error| RuntimeError::Engine(format!("linking host functions: {e}"));
        Ok(Linkers {
            future: future_linker(engine).map_err(link)?,
            pollable: pollable_linker(engine).map_err(link)?,
        })
    }

    /// The linker of `world`.
    pub(super) fn of(&self, world: World) -> &Linker<GuestState> {
        match world {
            World::Future => &self.future,
            World::Pollable => &self.pollable,
        }
    }
}

/// What both worlds import: WASI 0.2 with the fenced file writes, the
/// connections and name lookups under grants, and `wasi:http`.
fn add_shared(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    fence::add_fenced_file_writes(linker)?;
    connections::add_to_linker(linker)?;
    lookup::add_to_linker(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    keyvalue::add_to_linker(linker)?;
    config::add_to_linker(linker)?;
    Ok(())
}

/// `future-plugin`: the shared imports, WASI 0.3 clocks and random, and the
/// contract's `status-future` (every version), `hosts-future` (from 0.2.0)
/// and `schedule` (from 0.3.0).
fn future_linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    add_shared(&mut linker)?;
    wasmtime_wasi::p3::clocks::add_to_linker(&mut linker)?;
    wasmtime_wasi::p3::random::add_to_linker(&mut linker)?;
    v0_1::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_2::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_2::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_3::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_3::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_3::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_4::future_plugin::baton::leader::status_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_4::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_4::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    Ok(linker)
}

/// `pollable-plugin`: the shared imports and the contract's
/// `status-pollable` (every version), `hosts-pollable` (from 0.2.0) and
/// `schedule` (from 0.3.0, the same interface as the future world's).
fn pollable_linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    add_shared(&mut linker)?;
    v0_1::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_2::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_2::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_3::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_3::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_3::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    v0_4::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_4::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentStatus>(
        &mut linker,
        |s| s,
    )?;
    v0_4::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentStatus>(&mut linker, |s| s)?;
    Ok(linker)
}
