//! Commands of the `baton` binary other than `run` (which is
//! [`daemon`](crate::daemon)): the binary's `main.rs` parses the command
//! line and calls them.
//!
//! - [`status`]: `baton status`, of either store, as text or JSON.
//! - [`scaffold`]: `baton new`, a plugin project from a template.

pub mod scaffold;
pub mod status;
