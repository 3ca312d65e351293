//! baton: runs WebAssembly plugin leader tasks only while this host holds a
//! lease.
//!
//! The modules are layers; each uses only those below it (the unit test
//! in `layers.rs` checks every path into the crate):
//!
//! | Layer | Modules |
//! |---|---|
//! | edges | [`cli`] (commands), [`daemon`] (`baton run`'s wiring), [`harness`] (`baton test`'s), [`config`], [`ops`] (log, metrics, health, admin) |
//! | tasks | [`supervisor`]: each plugin's task per term |
//! | guests | [`runtime`]: wasmtime, the contract's host side, grants, the fence |
//! | election | [`election`]: terms, the elector, spreading; [`schedule`]: when scheduled runs are due; decisions without I/O of their own |
//! | storage | [`store`]: the `LeaseStore` trait and its backends; [`oci`]: components from OCI registries |
//! | base | [`support`]: rounding, recurring warnings |
#![deny(missing_docs)]
// Tests may be long; production functions may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cli;
pub mod config;
pub mod daemon;
pub mod election;
pub mod harness;
pub mod oci;
pub mod ops;
pub mod runtime;
pub mod schedule;
pub mod store;
pub mod supervisor;
pub mod support;

#[cfg(test)]
mod docs_check;
#[cfg(test)]
mod imports;
#[cfg(test)]
mod layers;
#[cfg(test)]
mod shape;
