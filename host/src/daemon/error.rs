//! Why `baton run` could not start, or ended in failure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::config::own_files::OwnFilesGranted;
use crate::daemon::control::ControlError;
use crate::runtime::RuntimeError;

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The wasm engine could not be set up.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The lease store could not be opened.
    #[error("{0}")]
    Store(String),
    /// No plugin can run (each was reported when it failed to load) and
    /// every lease has plugins, so no lease is contended for: there is
    /// nothing to serve, and a supervisor (systemd, Kubernetes) should see
    /// the host fail.
    #[error(
        "none of the {0} configured plugins can run (each is named in the errors above); nothing to serve"
    )]
    NothingToRun(usize),
    /// An elector panicked or ended on its own; its lease's tasks were
    /// stopped and the lease was not released.
    #[error(
        "the elector of lease {lease:?} failed: {reason}; its tasks were stopped and the lease was left to expire"
    )]
    ElectorFailed {
        /// The lease.
        lease: String,
        /// The panic message, or what happened.
        reason: String,
    },
    /// Shutting down, some leader tasks could not be confirmed stopped
    /// (stuck in a host call); their leases were left to expire.
    #[error("leader tasks of lease(s) {0} could not be confirmed stopped; those leases were left to expire")]
    TasksNotStopped(String),
    /// The election's runtime could not be started.
    #[error("cannot start the election runtime: {0}")]
    ElectionRuntime(std::io::Error),
    /// The admin endpoints could not listen on the configured address.
    #[error("admin-address {address}: cannot serve /metrics, /healthz and /readyz there: {error}")]
    Admin {
        /// The configured address.
        address: SocketAddr,
        /// Why not.
        error: std::io::Error,
    },
    /// The control socket could not be set up.
    #[error("{0}")]
    Control(ControlError),
    /// A plugin's `dirs` grant reaches the host's own files (see
    /// [`crate::config::own_files`]).
    #[error("{}{error}", file_prefix(.file.as_deref()))]
    Grants {
        /// The configuration file, if any.
        file: Option<PathBuf>,
        /// The grants refused.
        error: OwnFilesGranted,
    },
}

/// `FILE: `, for a message about the configuration file `file`; nothing
/// without one.
fn file_prefix(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display())).unwrap_or_default()
}
