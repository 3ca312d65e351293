//! The control channel of `baton run`, and `baton yield`, which uses it.
//!
//! Each `baton run` process listens on a Unix socket of its own, which only
//! its owner can use: the file is created with mode 0600 (bound under a
//! temporary name, its mode set, then renamed into place), and every
//! connection's peer credentials (`SO_PEERCRED`) are checked: the process's
//! own user, or root. The socket is removed on exit. A socket file left by
//! a dead process is replaced; one on which a live process answers is not:
//! the host refuses to start, naming the path (a default socket is per
//! identity, so a live process there runs under this host's identity: the
//! host says so and runs without, leaving the duplicate identity to the
//! electors, as before there were sockets). A lock file beside it
//! (`PATH.lock`, `flock`ed for the process's lifetime) settles two hosts
//! starting at once on one path.
//!
//! Where: `control-socket` in the configuration, or `--control-socket`; by
//! default `<identity>.sock` (the identity made a file name as for a
//! membership record) in `.baton/control/` beside the configuration file
//! (the embedded store's default directory is `.baton/leases` there), or,
//! where that cannot be created, in `$XDG_RUNTIME_DIR/baton`, else in
//! `<temp dir>/baton-<uid>` (mode 0700). A host that cannot create its
//! default socket says so and runs without; one whose configured socket
//! cannot be created does not start. A configuration given without a file
//! (the library's [`serve`](crate::daemon::serve::serve) in tests) has a socket only
//! if it sets one.
//!
//! The protocol: one JSON object on one line each way, one request per
//! connection. Requests: `{"command":"yield","lease":"demo","for_ms":30000}`
//! (`for_ms` optional: one lease duration of that lease),
//! `{"command":"leases"}`, `{"command":"drain","wait_ms":60000}` and
//! `{"command":"resume"}` (`drain.rs`); the answer is a [`Reply`].
//!
//! A yield (`baton yield LEASE [--for DURATION]`) sets the lease's elector
//! to [`Intent::StandBy`]: its term ends (the tasks are told at once), its
//! tasks stop (grace, then force), the lease is released saying who yielded
//! it and for how long, so another host takes it at once, and this host
//! does not contend for it until the time is up; then it follows and
//! contends again (see [`spread`](crate::election::spread) for how a yield
//! and spreading go together). The reply comes once the tasks are gone and
//! another host took the lease (or [`HANDOVER_WAIT`] passed).

mod client;
mod drain;
mod protocol;
mod server;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

pub use client::{ClientError, FindError, find_host_socket, find_socket, request};
pub use protocol::{Failure, HandedOver, LeaseState, Reply, Request, VERSION};
pub use server::{ControlSocket, ControlledHost, ControlledLease, HANDOVER_WAIT, SharedLeases};

use crate::election::spread::{MEMBER_PREFIX, member_lease};
use crate::election::{Intent, LeaseView, Role, Timings};
use crate::support::rounding::{human, ms};
use protocol::*;

/// The longest path a Unix socket address holds (`sun_path`, less its
/// terminating zero).
pub(super) const MAX_SOCKET_PATH: usize = 107;

/// Why a control socket could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A live process answers on the path.
    #[error(
        "control socket {path} is in use by a live process{}: give each host its own \
         (`control-socket` in the configuration, or --control-socket), or stop that process",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    InUse {
        /// The socket's path.
        path: PathBuf,
        /// The process that answers, if known.
        pid: Option<i32>,
    },
    /// Anything else, with what was being done.
    #[error("control socket {path}: {detail}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

pub(super) fn io_error(path: &Path, doing: &str, e: std::io::Error) -> ControlError {
    ControlError::Io {
        path: path.to_owned(),
        detail: format!("{doing}: {e}"),
    }
}

/// The socket's file name for `identity`: the identity made a file name
/// as for a membership record ([`member_lease`]), and `.sock`.
pub fn socket_name(identity: &str) -> String {
    let name = member_lease(identity);
    format!("{}.sock", name.strip_prefix(MEMBER_PREFIX).unwrap_or(&name))
}

/// The folders a default socket goes in, in order: `.baton/control`
/// beside the configuration file (if there is one), then the runtime
/// folder (`$XDG_RUNTIME_DIR/baton`, else `<temp dir>/baton-<uid>`).
pub fn default_dirs(config: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(c) = config {
        dirs.push(c.parent().unwrap_or(Path::new("")).join(".baton").join("control"));
    }
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    dirs.push(match runtime {
        Some(dir) => dir.join("baton"),
        // SAFETY: geteuid cannot fail.
        None => std::env::temp_dir().join(format!("baton-{}", unsafe { libc::geteuid() })),
    });
    dirs
}

#[cfg(test)]
mod tests;
