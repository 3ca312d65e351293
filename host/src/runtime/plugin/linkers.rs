//! The host's imports, linked once for each world: WASI 0.2 and every
//! capability registered in [`crate::runtime::guest`] (WASI 0.3's clocks
//! and random in the future world only; the contract's interfaces in every
//! version that has them).
//!
//! Other WASI 0.3 interfaces (filesystem, sockets, cli) are not offered:
//! their host tasks act after the import has returned, outside the
//! host-call fence.

use wasmtime::Engine;
use wasmtime::component::Linker;

use super::World;
use crate::runtime::RuntimeError;
use crate::runtime::guest::{self, GuestState};

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
            future: guest::linker(engine, World::Future).map_err(link)?,
            pollable: guest::linker(engine, World::Pollable).map_err(link)?,
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
