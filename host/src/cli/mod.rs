//! The commands of the `baton` binary, one module each: the binary's
//! `main.rs` parses the command line, handles the signals, and calls each
//! command's `execute`.
//!
//! - [`run`]: `baton run`, the configuration with the command line's
//!   settings handed to [`daemon`](crate::daemon), which serves it.
//! - [`check`]: `baton check`, which world each component targets.
//! - [`scaffold`]: `baton new`, a plugin project from a template.
//! - [`status`]: `baton status`, of either store, as text or JSON.
//! - [`yield_lease`]: `baton yield`, a lease handed over on request.
//! - [`run_now`]: `baton run-now`, one extra run of a scheduled plugin.
//! - [`drain`], [`resume`]: `baton drain` and `baton resume`, a host that
//!   hands every lease over and takes none, and back.
//! - [`kv`]: `baton kv`, the plugins' buckets, read and written by an
//!   operator.
//! - [`registry`]: `baton pull` and `baton push`, components in OCI
//!   registries.
//! - [`test_plugin`]: `baton test`, one plugin through scripted terms
//!   ([`harness`](crate::harness)).

pub mod check;
pub mod drain;
pub mod kv;
pub mod registry;
pub mod resume;
pub mod run;
pub mod run_now;
pub mod scaffold;
pub mod status;
pub mod test_plugin;
pub mod yield_lease;
