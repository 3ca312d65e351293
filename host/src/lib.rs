//! baton: runs WebAssembly plugin leader tasks only while this host holds a
//! lease.
#![deny(missing_docs)]

pub mod admin;
pub mod config;
pub mod control;
pub mod election;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod own_files;
pub mod progress;
pub mod recurring;
pub mod reload;
pub mod runtime;
pub mod scaffold;
pub mod serve;
pub mod status;
pub mod store;
pub mod supervisor;
