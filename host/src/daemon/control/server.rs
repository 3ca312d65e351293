//! The server side: the socket `baton run` listens on (owner-only, one
//! per host, a stale one replaced, a live one refused) and the answers to
//! its requests, a yield above all.

use super::*;

/// How long a yield waits, after the tasks are gone, for another host to
/// take the lease before it replies without naming one.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// How long a client may take to send its request.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The pid of the process at the other end of `fd` (a Unix socket), by
/// `SO_PEERCRED`.
pub(super) fn peer_pid(fd: &impl AsRawFd) -> Option<i32> {
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
        make_folder(path)?;
        let (lock, lock_path) = lock_beside(path, name)?;
        clear_stale(path)?;
        let listener = bind_owner_only(path, name)?;
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
    /// Its scheduled plugins: where `baton run-now` asks each for a run.
    pub run_now: BTreeMap<String, tokio::sync::mpsc::UnboundedSender<()>>,
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
    /// What it says of itself in its records: `baton drain` marks it
    /// draining there.
    pub host: crate::election::HostHandle,
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
            Ok(Request::RunNow { plugin }) => self.run_now(&plugin),
            Ok(Request::Drain { all_at_once, wait_ms }) => {
                self.drain(all_at_once, Duration::from_millis(wait_ms)).await
            }
            Ok(Request::Resume) => self.resume(),
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
            draining: Some(self.host.get().draining),
            ..Reply::new(&self.identity)
        }
    }

    /// `baton run-now`: asks the scheduled plugin's supervisor for one more
    /// run, if this host leads its lease.
    fn run_now(&self, plugin: &str) -> Reply {
        let id = &self.identity;
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some((lease, l, asked)) = all
            .iter()
            .find_map(|(name, l)| l.run_now.get(plugin).map(|tx| (name, l, tx)))
        else {
            let message = format!("host {id} has no scheduled plugin {plugin:?}");
            return Reply::failed(id, Failure::NoSuchSchedule, message);
        };
        let Some(term) = l.view.borrow().leading_term().map(|t| t.number()) else {
            return self.not_leader(lease, l);
        };
        if asked.send(()).is_err() {
            let message = format!("host {id}: plugin {plugin:?} is being removed");
            return Reply::failed(id, Failure::NoSuchSchedule, message);
        }
        tracing::info!(plugin, lease = %lease, term, "a run asked for (baton run-now)");
        Reply {
            ok: true,
            message: format!("host {id} runs plugin {plugin:?} once more now (lease {lease}, term {term})"),
            ..Reply::new(id)
        }
    }

    /// `baton yield`: stands the lease's elector by for `duration` (one
    /// lease duration if not given) and answers once the term's tasks are
    /// gone and another host took the lease, or [`HANDOVER_WAIT`] passed.
    async fn yield_lease(&self, lease: &str, duration: Option<Duration>) -> Reply {
        let id = &self.identity;
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(l) = all.get(lease) else {
            return self.no_such_lease(lease, &all);
        };
        let duration = duration.unwrap_or(l.timings.lease_duration);
        if duration.is_zero() {
            return Reply::failed(id, Failure::BadRequest, "a yield lasts longer than zero".into());
        }
        let term = l.view.borrow().leading_term().cloned();
        let Some(term) = term else {
            return self.not_leader(lease, l);
        };
        let number = term.number();
        let started = Instant::now();
        let until_wall = SystemTime::now() + duration;
        if !stand_by(&l.intent, started + duration) {
            return Reply::failed(
                id,
                Failure::ShuttingDown,
                format!("host {id} is shutting down or draining: it hands every lease over anyway"),
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
            return self.not_released(lease, number, bound);
        }
        let drained = started.elapsed();
        let taken = self.taken_after(l, number).await;
        let yielded = Yielded {
            lease,
            term: number,
            drained,
            handover: taken.as_ref().map(|_| started.elapsed()),
            taken,
            duration,
            until_wall,
        };
        yielded.reply(id)
    }

    /// The answer to a yield of a lease this host does not serve.
    fn no_such_lease(&self, lease: &str, all: &BTreeMap<String, ControlledLease>) -> Reply {
        let id = &self.identity;
        let names: Vec<&str> = all.keys().map(String::as_str).collect();
        let names = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        };
        Reply {
            lease: Some(lease.to_owned()),
            ..Reply::failed(
                id,
                Failure::NoSuchLease,
                format!("no such lease on host {id}: {lease:?} (its leases: {names})"),
            )
        }
    }

    /// The answer to a yield of a lease this host does not lead: who does,
    /// and whether this host stands by after an earlier yield.
    fn not_leader(&self, lease: &str, l: &ControlledLease) -> Reply {
        let id = &self.identity;
        let status = l.view.borrow().status.clone();
        let held = match &status.holder {
            Some(h) => format!("it is held by {h}, term {}", status.term),
            None if status.term == 0 => "nobody holds it".to_owned(),
            None => format!("nobody holds it (last term {})", status.term),
        };
        let standing = standing_by(&l.intent)
            .map(|until| {
                format!(
                    "; this host yielded it and contends again at {}",
                    rfc3339(wall(until))
                )
            })
            .unwrap_or_default();
        Reply {
            lease: Some(lease.to_owned()),
            term: Some(status.term),
            holder: status.holder.clone(),
            ..Reply::failed(
                id,
                Failure::NotLeader,
                format!("host {id} does not lead {lease}; {held}{standing}"),
            )
        }
    }

    /// The answer to a yield whose term's tasks were not confirmed stopped
    /// within `bound`: the lease was not released.
    fn not_released(&self, lease: &str, term: u64, bound: Duration) -> Reply {
        let id = &self.identity;
        Reply {
            lease: Some(lease.to_owned()),
            term: Some(term),
            ..Reply::failed(
                id,
                Failure::NotReleased,
                format!(
                    "host {id} ended term {term} of {lease}, but its tasks were not confirmed stopped \
                     within {}: the lease was not released and expires on its own",
                    human(bound)
                ),
            )
        }
    }

    /// Who took the lease after term `term`, and in which term, if another
    /// host did within [`HANDOVER_WAIT`].
    async fn taken_after(&self, l: &ControlledLease, term: u64) -> Option<(String, u64)> {
        let id = &self.identity;
        let mut view = l.view.clone();
        timeout(
            HANDOVER_WAIT,
            view.wait_for(|v| v.status.term > term && v.status.holder.as_deref().is_some_and(|h| h != id)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|v| (v.status.holder.clone().unwrap_or_default(), v.status.term))
    }
}

/// Creates the socket's folder if missing: its parents as any folder,
/// itself owner-only.
fn make_folder(path: &Path) -> Result<(), ControlError> {
    let dir = path.parent().unwrap_or(Path::new(""));
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let made = match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => std::fs::create_dir_all(parent),
        None => Ok(()),
    }
    .and_then(|()| std::fs::DirBuilder::new().mode(0o700).create(dir));
    match made {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error(
            path,
            &format!("creating its folder {}", dir.display()),
            e,
        )),
    }
}

/// Takes the lock file beside the socket (`NAME.lock`, held for the
/// process's lifetime): a host that holds it already is in use.
fn lock_beside(path: &Path, name: &std::ffi::OsStr) -> Result<(std::fs::File, PathBuf), ControlError> {
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
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok((lock, lock_path));
    }
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
    Err(io_error(path, "locking its lock file", e))
}

/// Removes a socket at `path` that nobody answers on (left by a process
/// that is gone); one a live process answers on, or anything that is not
/// a socket, is an error.
fn clear_stale(path: &Path) -> Result<(), ControlError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => Err(ControlError::InUse {
                path: path.to_owned(),
                pid: peer_pid(&s),
            }),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), "replacing a control socket left by a process that is gone");
                std::fs::remove_file(path).map_err(|e| io_error(path, "removing the stale socket", e))
            }
            Err(e) => Err(io_error(path, "checking the socket already there", e)),
        },
        Ok(_) => Err(ControlError::Io {
            path: path.to_owned(),
            detail: "something that is not a socket is there; not replacing it".into(),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(path, "checking the path", e)),
    }
}

/// Binds the socket under a temporary name and makes it owner-only
/// before it appears under its own.
fn bind_owner_only(
    path: &Path,
    name: &std::ffi::OsStr,
) -> Result<std::os::unix::net::UnixListener, ControlError> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| io_error(path, "binding", e))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_error(path, "setting its mode and moving it into place", e));
    }
    Ok(listener)
}

/// Sets the elector to stand by until `until`, unless it is stopping.
/// `false` if it is.
fn stand_by(intent: &watch::Sender<Intent>, until: Instant) -> bool {
    intent.send_if_modified(|intent| {
        if matches!(*intent, Intent::Stop | Intent::Drain) {
            return false;
        }
        *intent = Intent::StandBy { until };
        true
    })
}

/// A yield done: what its reply and its log line say.
struct Yielded<'a> {
    lease: &'a str,
    term: u64,
    /// From the yield until the term's tasks were gone.
    drained: Duration,
    /// From the yield until another host led, if one did.
    handover: Option<Duration>,
    /// That host and its term.
    taken: Option<(String, u64)>,
    duration: Duration,
    until_wall: SystemTime,
}

impl Yielded<'_> {
    /// Logs it and says it to the client of host `id`.
    fn reply(self, id: &str) -> Reply {
        let Yielded {
            lease,
            term,
            drained,
            handover,
            taken,
            duration,
            until_wall,
        } = self;
        let next = match &taken {
            Some((holder, new_term)) => format!(
                "{holder} took it in term {new_term} {} after the yield",
                human(handover.unwrap_or_default())
            ),
            None => format!("no other host took it within {}", human(HANDOVER_WAIT)),
        };
        let message = format!(
            "host {id} yielded {lease}: the tasks of term {term} stopped in {} and the lease was released; \
             {next}; {id} does not contend for it until {} ({} from the yield)",
            human(drained),
            rfc3339(until_wall),
            human(duration)
        );
        tracing::info!(
            lease,
            term,
            drained_ms = ms(drained),
            new_holder = taken.as_ref().map_or("", |t| t.0.as_str()),
            "yielded the lease"
        );
        Reply {
            ok: true,
            message,
            lease: Some(lease.to_owned()),
            term: Some(term),
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
pub(super) fn standing_by(intent: &watch::Sender<Intent>) -> Option<Instant> {
    match *intent.borrow() {
        Intent::StandBy { until } if until > Instant::now() => Some(until),
        _ => None,
    }
}

/// `at` on the wall clock.
pub(super) fn wall(at: Instant) -> SystemTime {
    SystemTime::now() + at.saturating_duration_since(Instant::now())
}

pub(super) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
