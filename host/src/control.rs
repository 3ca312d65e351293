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
//! (the library's [`serve`](crate::serve::serve) in tests) has a socket only
//! if it sets one.
//!
//! The protocol: one JSON object on one line each way, one request per
//! connection. Requests: `{"command":"yield","lease":"demo","for_ms":30000}`
//! (`for_ms` optional: one lease duration of that lease) and
//! `{"command":"leases"}`; the answer is a [`Reply`].
//!
//! A yield (`baton yield LEASE [--for DURATION]`) sets the lease's elector
//! to [`Intent::StandBy`]: its term ends (the tasks are told at once), its
//! tasks stop (grace, then force), the lease is released saying who yielded
//! it and for how long, so another host takes it at once, and this host
//! does not contend for it until the time is up; then it follows and
//! contends again (see [`spread`](crate::election::spread) for how a yield
//! and spreading go together). The reply comes once the tasks are gone and
//! another host took the lease (or [`HANDOVER_WAIT`] passed).

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

use crate::election::spread::{MEMBER_PREFIX, member_lease};
use crate::election::{Intent, LeaseView, Role, Timings};
use crate::logging::{human, ms};

/// The protocol's version, in every reply.
pub const VERSION: u32 = 1;

/// How long a yield waits, after the tasks are gone, for another host to
/// take the lease before it replies without naming one.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// The longest request line.
const MAX_REQUEST: u64 = 64 * 1024;

/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest path a Unix socket address holds (`sun_path`, less its
/// terminating zero).
const MAX_SOCKET_PATH: usize = 107;

/// A request to a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    /// Hand the lease over and do not contend for it for `for_ms`
    /// milliseconds (default: one lease duration).
    Yield {
        /// The lease.
        lease: String,
        /// How long not to contend for it, in milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// The host's leases, its identity and configuration file.
    Leases,
}

/// Why a request was not done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Failure {
    /// The host does not lead the lease.
    NotLeader,
    /// The host has no such lease.
    NoSuchLease,
    /// The host is shutting down.
    ShuttingDown,
    /// The lease's tasks were not confirmed stopped: it was not released,
    /// and expires on its own.
    NotReleased,
    /// The request could not be read.
    BadRequest,
    /// The peer is neither this process's user nor root.
    Forbidden,
}

/// One lease of a host, in a reply to [`Request::Leases`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// The lease.
    pub lease: String,
    /// This host's role.
    pub role: Role,
    /// The holder, when known.
    pub holder: Option<String>,
    /// The newest term this host knows of.
    pub term: u64,
    /// While this host stands by after a yield: when it contends again
    /// (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yielded_until: Option<String>,
}

/// A host's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u32,
    /// Whether the request was done.
    pub ok: bool,
    /// The host's identity.
    pub identity: String,
    /// What happened, for people.
    pub message: String,
    /// Why not, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The lease asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// A yield: the term handed over. Not leading: the newest term known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// Not leading: who holds the lease, if anyone is known to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// A yield: how long the tasks took to stop, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_ms: Option<f64>,
    /// A yield: the host that took the lease, if one did within
    /// [`HANDOVER_WAIT`] of the release, and its term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_holder: Option<String>,
    /// See `new_holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_term: Option<u64>,
    /// A yield: milliseconds from the yield to the other host's taking the
    /// lease, as this host saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover_ms: Option<f64>,
    /// A yield: when this host contends for the lease again (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contend_again_at: Option<String>,
    /// A yield: how long it does not contend, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contend_again_in_ms: Option<u64>,
    /// Leases: the configuration file the host runs, as an absolute path
    /// (symbolic links not resolved: a client resolves both when it
    /// compares, so a file behind a link that changed since, as a
    /// Kubernetes ConfigMap's is, still matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Leases: each of its leases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseState>,
}

impl Reply {
    fn new(identity: &str) -> Reply {
        Reply {
            version: VERSION,
            identity: identity.to_owned(),
            ..Reply::default()
        }
    }

    fn failed(identity: &str, failure: Failure, message: String) -> Reply {
        Reply {
            failure: Some(failure),
            message,
            ..Reply::new(identity)
        }
    }
}

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

fn io_error(path: &Path, doing: &str, e: std::io::Error) -> ControlError {
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

/// The pid of the process at the other end of `fd` (a Unix socket), by
/// `SO_PEERCRED`.
fn peer_pid(fd: &impl AsRawFd) -> Option<i32> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes
    // into it.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let rc = libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        );
        (rc == 0 && cred.pid > 0).then_some(cred.pid)
    }
}

/// A control socket this process listens on; removed (with its lock file)
/// when dropped.
pub struct ControlSocket {
    path: PathBuf,
    lock_path: PathBuf,
    /// Held (flock) for the socket's lifetime.
    _lock: std::fs::File,
    listener: Option<std::os::unix::net::UnixListener>,
    /// The socket file's device and inode, so that only it is removed.
    id: (u64, u64),
}

impl std::fmt::Debug for ControlSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlSocket").field("path", &self.path).finish()
    }
}

impl ControlSocket {
    /// Creates the socket at `path` (its folder too, if missing), mode
    /// 0600. A socket file there on which nobody answers (left by a dead
    /// process) is replaced; anything else there is an error.
    pub fn bind(path: &Path) -> Result<ControlSocket, ControlError> {
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(ControlError::Io {
                path: path.to_owned(),
                detail: format!(
                    "the path is {len} bytes long; a Unix socket's path holds at most {MAX_SOCKET_PATH}: \
                     choose a shorter one (`control-socket`, or --control-socket)"
                ),
            });
        }
        let name = path.file_name().ok_or_else(|| ControlError::Io {
            path: path.to_owned(),
            detail: "not a file path".into(),
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        if !dir.as_os_str().is_empty() && !dir.is_dir() {
            // Its parents as any folder, itself owner-only.
            let made = match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(parent) => std::fs::create_dir_all(parent),
                None => Ok(()),
            }
            .and_then(|()| std::fs::DirBuilder::new().mode(0o700).create(dir));
            match made {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io_error(
                        path,
                        &format!("creating its folder {}", dir.display()),
                        e,
                    ));
                }
            }
        }
        let mut lock_name = name.to_owned();
        lock_name.push(".lock");
        let lock_path = path.with_file_name(lock_name);
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_error(path, &format!("opening its lock file {}", lock_path.display()), e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::WouldBlock {
                let pid = std::os::unix::net::UnixStream::connect(path)
                    .ok()
                    .and_then(|s| peer_pid(&s));
                return Err(ControlError::InUse {
                    path: path.to_owned(),
                    pid,
                });
            }
            return Err(io_error(path, "locking its lock file", e));
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => {
                    return Err(ControlError::InUse {
                        path: path.to_owned(),
                        pid: peer_pid(&s),
                    });
                }
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "replacing a control socket left by a process that is gone");
                    std::fs::remove_file(path).map_err(|e| io_error(path, "removing the stale socket", e))?;
                }
                Err(e) => return Err(io_error(path, "checking the socket already there", e)),
            },
            Ok(_) => {
                return Err(ControlError::Io {
                    path: path.to_owned(),
                    detail: "something that is not a socket is there; not replacing it".into(),
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(path, "checking the path", e)),
        }
        // Bound under a temporary name and made owner-only before it
        // appears under its own.
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let _ = std::fs::remove_file(&tmp);
        let listener =
            std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| io_error(path, "binding", e))?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_error(path, "setting its mode and moving it into place", e));
        }
        let meta = std::fs::symlink_metadata(path).map_err(|e| io_error(path, "reading it back", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_error(path, "setting it non-blocking", e))?;
        Ok(ControlSocket {
            path: path.to_owned(),
            lock_path,
            _lock: lock,
            listener: Some(listener),
            id: (meta.dev(), meta.ino()),
        })
    }

    /// The default socket of `identity` (see the [module
    /// documentation](self)): in the first of the [`default_dirs`] where it
    /// can be created. `Ok(None)` (logged) if a live process answers on
    /// it (it runs under the same identity) or if it can be created
    /// nowhere.
    pub fn bind_default(
        config: Option<&Path>,
        identity: &str,
    ) -> Result<Option<ControlSocket>, ControlError> {
        let mut failures = Vec::new();
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        for dir in default_dirs(config) {
            let path = dir.join(socket_name(identity));
            // A shared folder (the temp dir's) may have been made by another
            // user, who could then replace the socket.
            if let Ok(meta) = std::fs::metadata(&dir)
                && (meta.uid() != me || meta.mode() & 0o022 != 0)
            {
                failures.push(format!(
                    "{}: the folder belongs to user {} or others may write to it (mode {:o}); not using it",
                    dir.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ));
                continue;
            }
            match ControlSocket::bind(&path) {
                Ok(s) => return Ok(Some(s)),
                // Another process beside this configuration under this
                // identity: it is not this host's to take. The electors
                // deal with the duplicate identity (the second process to
                // see the other renew a lease stops, saying why).
                Err(e @ ControlError::InUse { .. }) => {
                    tracing::warn!(
                        identity,
                        error = %e,
                        "another live process runs under this host's identity beside this configuration \
                         (identities must be unique per process): this host runs without a control socket"
                    );
                    return Ok(None);
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        tracing::warn!(
            tried = %failures.join("; "),
            "no control socket (baton yield cannot reach this host): set `control-socket` to a path this user may create"
        );
        Ok(None)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers requests about `leases` until `stop` is cancelled, then
    /// removes the socket.
    pub async fn serve(mut self, host: ControlledHost, stop: CancellationToken) {
        let listener = match self.listener.take().map(UnixListener::from_std).transpose() {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "the control socket cannot be served");
                return;
            }
        };
        tracing::info!(path = %self.path.display(), "control socket ready (baton yield)");
        let host = std::sync::Arc::new(host);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let host = host.clone();
                        tokio::spawn(async move { host.answer(stream).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting on the control socket failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        // Only the file this process bound (it holds the lock, so no other
        // host put one there since).
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// One lease as the control channel reaches it.
#[derive(Clone)]
pub struct ControlledLease {
    /// Its elector's intent.
    pub intent: watch::Sender<Intent>,
    /// Its elector's status.
    pub view: watch::Receiver<LeaseView>,
    /// Its timings.
    pub timings: Timings,
    /// How long its elector may take to end a term, drain it and release
    /// the lease, by the longest timings the lease has had: after a reload
    /// that shortened them, the current term keeps the ones it began with.
    pub handover_bound: Duration,
}

/// What the control channel of a host reaches.
pub struct ControlledHost {
    /// The host's identity.
    pub identity: String,
    /// The configuration file it runs.
    pub config: Option<PathBuf>,
    /// Its leases, by name (a reload adds and removes some).
    pub leases: SharedLeases,
}

/// A host's leases as its control channel reaches them, updated by reloads.
pub type SharedLeases = std::sync::Arc<std::sync::RwLock<BTreeMap<String, ControlledLease>>>;

impl ControlledHost {
    async fn answer(&self, mut stream: UnixStream) {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let reply = match stream.peer_cred() {
            Ok(cred) if cred.uid() == me || cred.uid() == 0 => self.read_and_do(&mut stream).await,
            Ok(cred) => Reply::failed(
                &self.identity,
                Failure::Forbidden,
                format!(
                    "user {} may not control this host (only user {me}, who runs it, and root may)",
                    cred.uid()
                ),
            ),
            Err(e) => Reply::failed(
                &self.identity,
                Failure::Forbidden,
                format!("the peer's credentials cannot be read: {e}"),
            ),
        };
        let mut line = serde_json::to_vec(&reply).expect("a reply serializes");
        line.push(b'\n');
        let _ = stream.write_all(&line).await;
        let _ = stream.shutdown().await;
    }

    async fn read_and_do(&self, stream: &mut UnixStream) -> Reply {
        let mut line = String::new();
        let mut reader = BufReader::new((&mut *stream).take(MAX_REQUEST));
        match timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Reply::failed(
                    &self.identity,
                    Failure::BadRequest,
                    format!("reading the request: {e}"),
                );
            }
            Err(_) => {
                return Reply::failed(
                    &self.identity,
                    Failure::BadRequest,
                    format!("no request within {}", human(REQUEST_TIMEOUT)),
                );
            }
        }
        match serde_json::from_str::<Request>(line.trim()) {
            Ok(Request::Leases) => self.leases(),
            Ok(Request::Yield { lease, for_ms }) => {
                self.yield_lease(&lease, for_ms.map(Duration::from_millis)).await
            }
            Err(e) => Reply::failed(&self.identity, Failure::BadRequest, format!("not a request: {e}")),
        }
    }

    fn leases(&self) -> Reply {
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        let leases = all
            .iter()
            .map(|(name, l)| {
                let status = l.view.borrow().status.clone();
                LeaseState {
                    lease: name.clone(),
                    role: status.role,
                    holder: status.holder,
                    term: status.term,
                    yielded_until: standing_by(&l.intent).map(|until| rfc3339(wall(until))),
                }
            })
            .collect();
        Reply {
            ok: true,
            message: format!("host {} serves {} lease(s)", self.identity, all.len()),
            config: self.config.as_ref().map(|c| c.display().to_string()),
            leases,
            ..Reply::new(&self.identity)
        }
    }

    async fn yield_lease(&self, lease: &str, duration: Option<Duration>) -> Reply {
        let id = &self.identity;
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(l) = all.get(lease) else {
            let names: Vec<&str> = all.keys().map(String::as_str).collect();
            return Reply {
                lease: Some(lease.to_owned()),
                ..Reply::failed(
                    id,
                    Failure::NoSuchLease,
                    format!(
                        "no such lease on host {id}: {lease:?} (its leases: {})",
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    ),
                )
            };
        };
        let duration = duration.unwrap_or(l.timings.lease_duration);
        if duration.is_zero() {
            return Reply::failed(id, Failure::BadRequest, "a yield lasts longer than zero".into());
        }
        let (status, term) = {
            let v = l.view.borrow();
            (v.status.clone(), v.leading_term().cloned())
        };
        let Some(term) = term else {
            let held = match (&status.holder, status.role) {
                (Some(h), _) => format!("it is held by {h}, term {}", status.term),
                (None, _) if status.term == 0 => "nobody holds it".to_owned(),
                (None, _) => format!("nobody holds it (last term {})", status.term),
            };
            let standing = standing_by(&l.intent)
                .map(|until| {
                    format!(
                        "; this host yielded it and contends again at {}",
                        rfc3339(wall(until))
                    )
                })
                .unwrap_or_default();
            return Reply {
                lease: Some(lease.to_owned()),
                term: Some(status.term),
                holder: status.holder.clone(),
                ..Reply::failed(
                    id,
                    Failure::NotLeader,
                    format!("host {id} does not lead {lease}; {held}{standing}"),
                )
            };
        };
        let number = term.number();
        let started = Instant::now();
        let until = started + duration;
        let until_wall = SystemTime::now() + duration;
        let set = l.intent.send_if_modified(|intent| {
            if *intent == Intent::Stop {
                return false;
            }
            *intent = Intent::StandBy { until };
            true
        });
        if !set {
            return Reply::failed(
                id,
                Failure::ShuttingDown,
                format!("host {id} is shutting down: it hands every lease over anyway"),
            );
        }
        tracing::info!(
            lease,
            term = number,
            r#for = %human(duration),
            until = %rfc3339(until_wall),
            "yielding the lease (baton yield): its tasks are told to stop, then it is released; not contending for it until then"
        );
        // The elector releases once the term's tasks are gone; it gives up
        // (and leaves the lease to expire) past the force-stop time plus
        // the drain allowance.
        let bound = l.handover_bound;
        if timeout(bound, term.drained()).await.is_err() {
            return Reply {
                lease: Some(lease.to_owned()),
                term: Some(number),
                ..Reply::failed(
                    id,
                    Failure::NotReleased,
                    format!(
                        "host {id} ended term {number} of {lease}, but its tasks were not confirmed stopped \
                         within {}: the lease was not released and expires on its own",
                        human(bound)
                    ),
                )
            };
        }
        let drained = started.elapsed();
        let mut view = l.view.clone();
        let taken = timeout(
            HANDOVER_WAIT,
            view.wait_for(|v| v.status.term > number && v.status.holder.as_deref().is_some_and(|h| h != id)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|v| (v.status.holder.clone().unwrap_or_default(), v.status.term));
        let handover = taken.as_ref().map(|_| started.elapsed());
        let next = match &taken {
            Some((holder, new_term)) => format!(
                "{holder} took it in term {new_term} {} after the yield",
                human(handover.unwrap_or_default())
            ),
            None => format!("no other host took it within {}", human(HANDOVER_WAIT)),
        };
        let message = format!(
            "host {id} yielded {lease}: the tasks of term {number} stopped in {} and the lease was released; \
             {next}; {id} does not contend for it until {} ({} from the yield)",
            human(drained),
            rfc3339(until_wall),
            human(duration)
        );
        tracing::info!(
            lease,
            term = number,
            drained_ms = ms(drained),
            new_holder = taken.as_ref().map_or("", |t| t.0.as_str()),
            "yielded the lease"
        );
        Reply {
            ok: true,
            message,
            lease: Some(lease.to_owned()),
            term: Some(number),
            drained_ms: Some(ms(drained)),
            new_holder: taken.as_ref().map(|t| t.0.clone()),
            new_term: taken.as_ref().map(|t| t.1),
            handover_ms: handover.map(ms),
            contend_again_at: Some(rfc3339(until_wall)),
            contend_again_in_ms: Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
            ..Reply::new(id)
        }
    }
}

/// When a yield's stand-by ends, if the elector stands by now.
fn standing_by(intent: &watch::Sender<Intent>) -> Option<Instant> {
    match *intent.borrow() {
        Intent::StandBy { until } if until > Instant::now() => Some(until),
        _ => None,
    }
}

/// `at` on the wall clock.
fn wall(at: Instant) -> SystemTime {
    SystemTime::now() + at.saturating_duration_since(Instant::now())
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Sends `request` to the host listening on `path` and returns its reply,
/// waiting at most `limit` for it.
pub async fn request(path: &Path, request: &Request, limit: Duration) -> Result<Reply, ClientError> {
    let exchange = async {
        let mut stream = UnixStream::connect(path).await.map_err(|e| match e.kind() {
            ErrorKind::ConnectionRefused => ClientError::Gone(path.to_owned()),
            ErrorKind::NotFound => ClientError::Missing(path.to_owned()),
            _ => ClientError::Io(path.to_owned(), format!("connecting: {e}")),
        })?;
        let mut line = serde_json::to_vec(request).expect("a request serializes");
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| ClientError::Io(path.to_owned(), format!("sending the request: {e}")))?;
        let mut answer = String::new();
        BufReader::new(stream.take(16 * 1024 * 1024))
            .read_line(&mut answer)
            .await
            .map_err(|e| ClientError::Io(path.to_owned(), format!("reading the reply: {e}")))?;
        serde_json::from_str::<Reply>(answer.trim()).map_err(|e| {
            ClientError::Io(
                path.to_owned(),
                format!("the reply is not one of baton's ({e}): {:?}", answer.trim()),
            )
        })
    };
    timeout(limit, exchange)
        .await
        .map_err(|_| ClientError::Io(path.to_owned(), format!("no reply within {}", human(limit))))?
}

/// The control socket of the host of `config_file` that `baton yield
/// LEASE --config FILE` means: `socket` (the file's `control-socket`) if
/// set; otherwise, among the live default sockets of hosts running that
/// file on this machine (of `identity` only, if given), the only one, or
/// the one that leads `lease`. The error says what was found.
pub async fn find_socket(
    config_file: &Path,
    socket: Option<&Path>,
    identity: Option<&str>,
    lease: &str,
) -> Result<PathBuf, String> {
    if let Some(p) = socket {
        return Ok(p.to_owned());
    }
    let want = std::fs::canonicalize(config_file).unwrap_or_else(|_| config_file.to_owned());
    let dirs = default_dirs(Some(config_file));
    let mut candidates = Vec::new();
    for dir in &dirs {
        match identity {
            Some(id) => candidates.push(dir.join(socket_name(id))),
            None => {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                let mut paths: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                    .collect();
                paths.sort();
                candidates.extend(paths);
            }
        }
    }
    let mut found: Vec<(PathBuf, Reply)> = Vec::new();
    for path in candidates {
        if let Ok(reply) = request(&path, &Request::Leases, Duration::from_secs(5)).await
            && reply.ok
            && reply
                .config
                .as_deref()
                .map(|c| std::fs::canonicalize(c).unwrap_or_else(|_| PathBuf::from(c)))
                .as_deref()
                == Some(want.as_path())
        {
            found.push((path, reply));
        }
    }
    let places = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ");
    if found.len() == 1 {
        return Ok(found.remove(0).0);
    }
    if found.is_empty() {
        return Err(format!(
            "no running host of {} found on this machine{}: no control socket in {places} answers for it \
             (give --socket PATH, or set `control-socket` in the file)",
            config_file.display(),
            identity
                .map(|i| format!(" under identity {i}"))
                .unwrap_or_default()
        ));
    }
    let leads = |r: &Reply| {
        r.leases
            .iter()
            .any(|l| l.lease == lease && l.role == Role::Leading)
    };
    let leaders: Vec<&(PathBuf, Reply)> = found.iter().filter(|(_, r)| leads(r)).collect();
    if let [(path, _)] = leaders[..] {
        return Ok(path.clone());
    }
    let each: Vec<String> = found
        .iter()
        .map(|(_, r)| match r.leases.iter().find(|l| l.lease == lease) {
            None => format!("{}: no such lease", r.identity),
            Some(l) => match &l.holder {
                Some(h) => format!("{}: {} (held by {h}, term {})", r.identity, l.role, l.term),
                None => format!("{}: {} (term {})", r.identity, l.role, l.term),
            },
        })
        .collect();
    Err(format!(
        "{} hosts of {} run on this machine and {} of them leads {lease} ({}); name one with --identity \
         or --socket",
        found.len(),
        config_file.display(),
        if leaders.is_empty() {
            "none"
        } else {
            "more than one"
        },
        each.join("; ")
    ))
}

/// Why a host could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the path.
    #[error("no control socket at {0}: is the host running, with this socket?")]
    Missing(PathBuf),
    /// A socket file nobody listens on (its process is gone).
    #[error("nobody answers on the control socket {0}: the host that made it is gone")]
    Gone(PathBuf),
    /// Anything else.
    #[error("control socket {0}: {1}")]
    Io(PathBuf, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_are_file_names_and_distinct() {
        assert_eq!(socket_name("host-a"), "host-a.sock");
        let odd = socket_name("../x/Y");
        assert!(!odd.contains('/'), "{odd}");
        assert_ne!(socket_name("Node_A"), socket_name("node_a"));
    }

    #[test]
    fn the_protocol_reads_as_documented() {
        let r: Request =
            serde_json::from_str(r#"{"command":"yield","lease":"demo","for_ms":30000}"#).unwrap();
        assert_eq!(
            r,
            Request::Yield {
                lease: "demo".into(),
                for_ms: Some(30000)
            }
        );
        let r: Request = serde_json::from_str(r#"{"command":"yield","lease":"demo"}"#).unwrap();
        assert_eq!(
            r,
            Request::Yield {
                lease: "demo".into(),
                for_ms: None
            }
        );
        let r: Request = serde_json::from_str(r#"{"command":"leases"}"#).unwrap();
        assert_eq!(r, Request::Leases);
        let reply = Reply::failed("a", Failure::NotLeader, "no".into());
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            text,
            r#"{"version":1,"ok":false,"identity":"a","message":"no","failure":"not-leader"}"#
        );
    }

    #[tokio::test]
    async fn a_socket_is_owner_only_stale_ones_are_replaced_live_ones_kept_and_it_is_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("h.sock");
        let first = ControlSocket::bind(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let stop = CancellationToken::new();
        let host = ControlledHost {
            identity: "h".into(),
            config: None,
            leases: SharedLeases::default(),
        };
        let served = tokio::spawn(first.serve(host, stop.clone()));
        // A second host on the same path is refused, naming it and the pid.
        let e = ControlSocket::bind(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("in use by a live process"), "{e}");
        // It answers.
        let reply = request(&path, &Request::Leases, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(reply.ok && reply.identity == "h", "{reply:?}");
        let reply = request(
            &path,
            &Request::Yield {
                lease: "nope".into(),
                for_ms: None,
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(reply.failure, Some(Failure::NoSuchLease));
        assert!(
            reply.message.starts_with("no such lease on host h"),
            "{}",
            reply.message
        );
        stop.cancel();
        served.await.unwrap();
        assert!(!path.exists(), "removed on exit");
        assert!(!path.with_file_name("h.sock.lock").exists());

        // A socket file left by a dead process (bound, never removed) is
        // replaced; a file that is no socket is not.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let again = ControlSocket::bind(&path).unwrap();
        drop(again);
        std::fs::write(&path, "not a socket").unwrap();
        let e = ControlSocket::bind(&path).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        // Too long a path is named.
        let long = dir.path().join("x".repeat(120));
        let e = ControlSocket::bind(&long).unwrap_err().to_string();
        assert!(e.contains("at most 107"), "{e}");
    }

    #[test]
    fn a_default_socket_goes_beside_the_file_or_else_to_the_runtime_folder_never_into_a_shared_folder() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("baton.toml");
        let id = format!("test-{:08x}", rand::random::<u32>());
        let s = ControlSocket::bind_default(Some(&cfg), &id).unwrap().unwrap();
        assert_eq!(
            s.path(),
            dir.path().join(".baton/control").join(format!("{id}.sock"))
        );
        let mode = std::fs::metadata(dir.path().join(".baton/control"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Taken (by a process under the same identity): none, not another.
        assert!(ControlSocket::bind_default(Some(&cfg), &id).unwrap().is_none());
        drop(s);
        // Others may write to it: not used; the runtime folder is.
        std::fs::set_permissions(
            dir.path().join(".baton/control"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let s = ControlSocket::bind_default(Some(&cfg), &id).unwrap().unwrap();
        assert_eq!(s.path(), default_dirs(None)[0].join(format!("{id}.sock")));
        let path = s.path().to_owned();
        drop(s);
        assert!(!path.exists());
    }
}
