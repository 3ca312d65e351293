//! baton: runs WebAssembly plugin leader tasks only while this host holds a
//! lease.
#![deny(missing_docs)]

pub mod election;
pub mod runtime;
pub mod store;
pub mod config;
pub mod serve;
pub mod supervisor;
