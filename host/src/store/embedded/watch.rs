//! The embedded store's watches: one inotify instance and one thread per
//! store, shared by all the watches of its leases, waking only the watches
//! an event may concern.
//!
//! The store's directory is watched for a lease's directory appearing,
//! vanishing or being replaced (a create moves it into place, a delete moves
//! it aside) and for the directory itself going; the directory of every
//! watched lease is watched for its versions. The kernel reports only the
//! kinds of event that can change a record: names created, removed or moved,
//! files written or closed after writing, metadata changed ([`LEASE_DIR`],
//! [`STORE_DIR`]); never opens, reads or closes after reading, so that
//! reading a record (the watch's own reads, every writer's read before its
//! write) wakes no one (more in `docs/embedded-store.md`, "Watching").
//!
//! Of what the kernel reports, the thread ignores, without waking any
//! watch:
//!
//! - names in a lease's directory that are not version files (temporary
//!   files, anything else): readers never read them;
//! - the removal, or a change in place, of a version below one known to
//!   exist in the same directory (one whose creation the thread saw and
//!   whose removal it has not seen): the newest version, the record, is not
//!   touched. Writers remove old versions this way after each write;
//! - the creation of a version this same store just linked
//!   ([`DirWatcher::expect_own`]): its writer has that record already, and
//!   a watch that re-read it would yield the store's own write back to it.
//!   The name is matched before the writer knows whether its link won: if it
//!   did not (another writer linked that name first), the writer wakes the
//!   watches itself; the match is kept only once the writer's link is
//!   confirmed to be in the lease's current directory (see `confirm`), and
//!   until the first event of the lease that wakes its watches (whose read
//!   comes after it). At most [`MAX_LINKED`] confirmed writes of a lease
//!   wait for their creation to be seen; an older one is read.
//!
//! Anything else wakes the lease's watches, which re-read the record: no
//! event is ever taken for a change it cannot be, only some that can be
//! none are left out. Lost events (the kernel's queue overflowed) wake
//! every watch, which watches its lease's directory again.

use std::collections::HashMap;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use super::{LEASE_SUFFIX, LeaseFiles, StoreError, version_counter};

/// What the store's directory is watched for: entries created, removed,
/// moved or changed (a lease's directory appearing, vanishing, replaced),
/// and the directory itself removed or moved.
const STORE_DIR: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// What a lease's directory is watched for: the same, and files written
/// (a version edited in place by hand).
const LEASE_DIR: WatchFlags = STORE_DIR.union(WatchFlags::MODIFY).union(WatchFlags::CLOSE_WRITE);

/// Room for at least 60 events of the longest names.
const EVENT_BUFFER: usize = 16 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks leaves a consistent state.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How the inotify thread tells a watch stream that something happened.
#[derive(Default)]
pub(super) struct Signal {
    /// Woken on every relevant event; wake-ups coalesce into one pending
    /// permit, which is all the stream needs since it re-reads the record.
    pub(super) wake: tokio::sync::Notify,
    /// The lease's directory appeared, vanished or was replaced: the stream
    /// watches the one now at its name before it reads.
    pub(super) rewatch: AtomicBool,
    /// Set when the watch broke, with the reason.
    broken: Mutex<Option<String>>,
}

impl Signal {
    fn wake(&self, rewatch: bool) {
        if rewatch {
            self.rewatch.store(true, Ordering::SeqCst);
        }
        self.wake.notify_one();
    }

    fn break_with(&self, reason: String) {
        lock(&self.broken).get_or_insert(reason);
        self.wake.notify_one();
    }

    pub(super) fn take_broken(&self) -> Option<String> {
        lock(&self.broken).take()
    }
}

/// The store's one inotify instance and thread, shared by every watch of its
/// leases; see the [module documentation](self). They exist while at least
/// one watch does.
#[derive(Default)]
pub(super) struct DirWatcher {
    running: Mutex<Option<Running>>,
    routes: Arc<Mutex<Routes>>,
}

/// A running inotify instance; dropping it stops its thread (which closes
/// the instance, and with it every kernel watch).
struct Running {
    inotify: Arc<OwnedFd>,
    /// An eventfd: written to stop the thread.
    stop: Arc<OwnedFd>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
    }
}

/// Which watches each event goes to, and what the thread knows of the
/// watched directories.
#[derive(Default)]
struct Routes {
    /// The store's directory, for messages.
    dir: PathBuf,
    /// Bumped for each inotify instance: a thread whose instance was
    /// replaced routes nothing more (watch descriptors are per instance).
    generation: u64,
    /// The thread of `generation` runs.
    alive: bool,
    next_id: u64,
    /// Watch descriptors of the store's directory (one made anew is another
    /// inode, watched by the next watch that starts).
    store_wds: Vec<i32>,
    /// By the name of a lease's directory in the store's (`demo.lease`).
    leases: HashMap<Vec<u8>, LeaseRoute>,
    /// By watch descriptor: the lease directories watched.
    dirs: HashMap<i32, WatchedDir>,
}

/// The watches of one lease.
#[derive(Default)]
struct LeaseRoute {
    /// Each watch's id and signal, and the watch descriptor of the store's
    /// directory it started in.
    watches: Vec<(u64, Arc<Signal>, i32)>,
    /// A version this store is linking (at most one at a time: a second
    /// write of the lease replaces it, see [`DirWatcher::expect_own`]).
    own: Option<Own>,
    /// Versions this store linked and confirmed whose creation was not
    /// seen yet (writes in quick succession, ahead of the thread), oldest
    /// first; at most [`MAX_LINKED`].
    linked: Vec<u64>,
}

/// How many confirmed versions of a lease wait for their creation to be
/// seen; beyond, the oldest is forgotten (its creation is read).
const MAX_LINKED: usize = 32;

impl LeaseRoute {
    /// Wakes every watch of the lease: they re-read the record after every
    /// event seen so far, so versions this store is linking or linked need
    /// no match any more.
    fn wake(&mut self, rewatch: bool) {
        self.own = None;
        self.linked.clear();
        for (_, signal, _) in &self.watches {
            signal.wake(rewatch);
        }
    }
}

/// A watched lease directory.
struct WatchedDir {
    /// The key of its lease in [`Routes::leases`].
    lease: Vec<u8>,
    /// The highest version known to be in it: seen created, and not seen
    /// removed since. `None` until a creation is seen, and again once that
    /// version is removed (or events were lost).
    newest: Option<u64>,
}

/// A version of a lease this store writes: the creation of its name is not
/// a change to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Own {
    counter: u64,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// About to link; the name's creation not seen yet.
    Linking,
    /// The name's creation seen (and not passed on) while the link's
    /// outcome is unknown: if it failed, it was another writer's, and the
    /// writer wakes the watches.
    Seen,
}

/// The key of a lease in [`Routes::leases`]: its directory's name.
fn lease_key(files: &LeaseFiles) -> Vec<u8> {
    format!("{}{LEASE_SUFFIX}", files.lease).into_bytes()
}

impl Routes {
    fn all(&self) -> impl Iterator<Item = &Arc<Signal>> {
        self.leases
            .values()
            .flat_map(|l| l.watches.iter().map(|(_, s, _)| s))
    }

    fn break_all(&self, reason: &str) {
        self.all().for_each(|s| s.break_with(reason.to_owned()));
    }

    /// Routes one event of the inotify instance: wakes the watches it may
    /// concern. `inotify` is the instance (to drop the watch of a lease
    /// directory moved away).
    fn route(&mut self, inotify: BorrowedFd<'_>, wd: i32, mask: ReadFlags, name: Option<&[u8]>) {
        if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
            // Events were lost; any watch's may have been among them.
            for dir in self.dirs.values_mut() {
                dir.newest = None;
            }
            for lease in self.leases.values_mut() {
                lease.wake(true);
            }
            return;
        }
        if self.store_wds.contains(&wd) {
            if mask.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::UNMOUNT) {
                // The watches that started in it (not those that started in
                // a directory made anew at its name since).
                let reason = format!("{} was removed or moved", self.dir.display());
                for (_, signal, _) in self
                    .leases
                    .values()
                    .flat_map(|l| &l.watches)
                    .filter(|w| w.2 == wd)
                {
                    signal.break_with(reason.clone());
                }
            } else if mask.contains(ReadFlags::IGNORED) {
                self.store_wds.retain(|w| *w != wd);
            } else if let Some(lease) = name.and_then(|n| self.leases.get_mut(n)) {
                // A lease's directory created, removed, moved or changed.
                lease.wake(true);
            }
            return;
        }
        let Some(dir) = self.dirs.get_mut(&wd) else {
            // A directory no longer watched (events still queued).
            return;
        };
        if mask.intersects(
            ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::IGNORED | ReadFlags::UNMOUNT,
        ) {
            // The lease's directory left its place. Its watch is dropped (a
            // directory moved back is watched anew after the store
            // directory's event).
            let lease = dir.lease.clone();
            self.dirs.remove(&wd);
            if mask.contains(ReadFlags::MOVE_SELF) {
                let _ = inotify::remove_watch(inotify, wd);
            }
            if let Some(route) = self.leases.get_mut(&lease) {
                route.wake(true);
            }
            return;
        }
        let Some(route) = self.leases.get_mut(&dir.lease) else {
            return;
        };
        let Some(name) = name else {
            // The directory itself (its permissions, say).
            route.wake(false);
            return;
        };
        // Not a version (a temporary file, anything else): never read.
        let Some(counter) = version_counter(name) else {
            return;
        };
        if version_event(&mut dir.newest, route, mask, counter) {
            route.wake(false);
        }
    }
}

/// Whether an event `mask` about version `counter`, in a lease directory
/// whose highest known version is `newest`, of a lease this store may be
/// writing (`route`), may change the lease's record; updates both.
fn version_event(newest: &mut Option<u64>, route: &mut LeaseRoute, mask: ReadFlags, counter: u64) -> bool {
    let below_newest = newest.is_some_and(|n| counter < n);
    if mask.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
        *newest = Some(newest.map_or(counter, |n| n.max(counter)));
        if !mask.contains(ReadFlags::CREATE) {
            return true;
        }
        if let Some(at) = route.linked.iter().position(|&c| c == counter) {
            route.linked.remove(at);
            return false;
        }
        if let Some(own) = &mut route.own
            && own.counter == counter
            && own.stage == Stage::Linking
        {
            own.stage = Stage::Seen;
            return false;
        }
        // (Created twice while linking: not both ours.)
        return true;
    }
    if below_newest {
        // Removed or changed below a version known to exist: not the record.
        return false;
    }
    if mask.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) && *newest == Some(counter) {
        *newest = None;
    }
    true
}

impl DirWatcher {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        lock(&self.routes)
    }

    /// Adds a watch of `files`' lease, woken through `signal`; dropping
    /// the returned registration removes it. Watches the store's directory
    /// again (adding a watch that exists changes nothing): if it was
    /// removed and made anew while older watches lived on, this is the new
    /// one.
    pub(super) fn register(
        self: &Arc<Self>,
        files: &LeaseFiles,
        signal: Arc<Signal>,
    ) -> Result<Registration, StoreError> {
        let mut running = lock(&self.running);
        if running.is_none() || !self.routes().alive {
            *running = Some(self.start().map_err(|e| StoreError::Unavailable {
                lease: files.lease.clone(),
                detail: format!("cannot start watching {}: {e}", files.dir.display()),
            })?);
        }
        let inotify = running.as_ref().expect("started above").inotify.clone();
        let mut routes = self.routes();
        routes.dir = files.dir.to_path_buf();
        let store_wd = match inotify::add_watch(&*inotify, files.dir.as_path(), STORE_DIR) {
            Ok(wd) => {
                if !routes.store_wds.contains(&wd) {
                    routes.store_wds.push(wd);
                }
                wd
            }
            Err(e) => {
                if routes.leases.is_empty() {
                    routes.stop();
                    drop(routes);
                    *running = None;
                }
                return Err(StoreError::Unavailable {
                    lease: files.lease.clone(),
                    detail: format!(
                        "cannot watch {}: {}",
                        files.dir.display(),
                        std::io::Error::from(e)
                    ),
                });
            }
        };
        routes.next_id += 1;
        let id = routes.next_id;
        let key = lease_key(files);
        routes
            .leases
            .entry(key.clone())
            .or_default()
            .watches
            .push((id, signal, store_wd));
        Ok(Registration {
            watcher: self.clone(),
            key,
            id,
        })
    }

    /// Starts an inotify instance and its thread.
    fn start(&self) -> std::io::Result<Running> {
        let inotify = Arc::new(inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?);
        let stop = Arc::new(eventfd()?);
        let generation = {
            let mut routes = self.routes();
            routes.stop();
            routes.alive = true;
            routes.generation
        };
        let (fd, stopped, routes) = (inotify.clone(), stop.clone(), self.routes.clone());
        let spawned = std::thread::Builder::new()
            .name("baton-inotify".into())
            .spawn(move || run(&fd, &stopped, &routes, generation));
        if let Err(e) = spawned {
            self.routes().stop();
            return Err(e);
        }
        Ok(Running { inotify, stop })
    }

    /// Watches the lease's directory now at its name, if there is one (a
    /// directory replaced since it was watched is a new inode).
    pub(super) fn watch_lease_dir(&self, files: &LeaseFiles) -> Result<(), StoreError> {
        let running = lock(&self.running);
        let Some(running) = running.as_ref() else {
            return Ok(());
        };
        // Under the routes' lock: the thread routes nothing of the new
        // watch before it is known.
        let mut routes = self.routes();
        match inotify::add_watch(&*running.inotify, &files.versions, LEASE_DIR) {
            Ok(wd) => {
                routes.dirs.insert(
                    wd,
                    WatchedDir {
                        lease: lease_key(files),
                        newest: None,
                    },
                );
                Ok(())
            }
            // No lease directory (yet): its creation wakes the store's
            // watch. Not a directory: the read says so; its replacement
            // wakes the store's watch.
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(()),
            Err(e) => Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail: format!(
                    "cannot watch {}: {}",
                    files.versions.display(),
                    std::io::Error::from(e)
                ),
            }),
        }
    }

    /// Called by this store right before it links version `counter` into
    /// `files`' lease directory: the creation of that name will be its own
    /// write, not a change to read (see the [module documentation](self)).
    /// Call [`OwnWrite::confirmed`] once the link is made and confirmed;
    /// dropping the guard otherwise wakes the lease's watches if the
    /// creation was seen meanwhile (it was another writer's).
    pub(super) fn expect_own(&self, files: &LeaseFiles, counter: u64) -> OwnWrite<'_> {
        let key = lease_key(files);
        let mut routes = self.routes();
        let Some(route) = routes.leases.get_mut(&key) else {
            // Not watched: nothing to match.
            return OwnWrite {
                watcher: self,
                key: None,
                counter,
            };
        };
        match route.own {
            // Another write of this store, with the same counter: whichever
            // links, the name is this store's; keep what was seen.
            Some(o) if o.counter == counter => {}
            // Another write's creation seen, its outcome unknown: read.
            Some(Own {
                stage: Stage::Seen, ..
            }) => {
                route.wake(false);
                route.own = Some(Own {
                    counter,
                    stage: Stage::Linking,
                });
            }
            _ => {
                route.own = Some(Own {
                    counter,
                    stage: Stage::Linking,
                })
            }
        }
        OwnWrite {
            watcher: self,
            key: Some(key),
            counter,
        }
    }

    /// The number of leases watched, for tests and debugging.
    fn leases(&self) -> usize {
        self.routes().leases.len()
    }
}

impl Routes {
    /// Forgets the current instance's watch descriptors; its thread routes
    /// nothing more.
    fn stop(&mut self) {
        self.generation += 1;
        self.alive = false;
        self.store_wds.clear();
        self.dirs.clear();
    }
}

impl std::fmt::Debug for DirWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatcher")
            .field("leases", &self.leases())
            .finish()
    }
}

/// This store's write of one version, while it links it: see
/// [`DirWatcher::expect_own`].
pub(super) struct OwnWrite<'a> {
    watcher: &'a DirWatcher,
    /// `None` if the lease is not watched, or once settled.
    key: Option<Vec<u8>>,
    counter: u64,
}

impl OwnWrite<'_> {
    /// The version was linked, and is (or was) the lease's record in the
    /// directory now at the lease's name.
    pub(super) fn confirmed(mut self) {
        let Some(key) = self.key.take() else { return };
        let mut routes = self.watcher.routes();
        if let Some(route) = routes.leases.get_mut(&key)
            && let Some(own) = route.own
            && own.counter == self.counter
        {
            route.own = None;
            if own.stage == Stage::Linking {
                if route.linked.len() == MAX_LINKED {
                    route.linked.remove(0);
                }
                route.linked.push(own.counter);
            }
        }
    }
}

impl Drop for OwnWrite<'_> {
    /// Not confirmed: the name's creation, if seen, was another writer's,
    /// or is of no interest (a stale link below the newest version).
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut routes = self.watcher.routes();
        if let Some(route) = routes.leases.get_mut(&key)
            && let Some(own) = route.own
            && own.counter == self.counter
        {
            match own.stage {
                Stage::Seen => route.wake(false),
                Stage::Linking => route.own = None,
            }
        }
    }
}

/// A watch's place in the [`DirWatcher`]; dropping it leaves.
pub(super) struct Registration {
    pub(super) watcher: Arc<DirWatcher>,
    key: Vec<u8>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut running = lock(&self.watcher.running);
        let mut routes = self.watcher.routes();
        let Some(route) = routes.leases.get_mut(&self.key) else {
            return;
        };
        route.watches.retain(|(id, _, _)| *id != self.id);
        if !route.watches.is_empty() {
            return;
        }
        routes.leases.remove(&self.key);
        if routes.leases.is_empty() {
            // The thread and the inotify instance go.
            routes.stop();
            drop(routes);
            *running = None;
            return;
        }
        let wds: Vec<i32> = routes
            .dirs
            .iter()
            .filter(|(_, d)| d.lease == self.key)
            .map(|(wd, _)| *wd)
            .collect();
        for wd in wds {
            routes.dirs.remove(&wd);
            if let Some(running) = running.as_ref() {
                // (Fails if the directory is gone: nothing to undo then.)
                let _ = inotify::remove_watch(&*running.inotify, wd);
            }
        }
    }
}

/// An eventfd (close-on-exec, non-blocking) that stops the thread: through
/// libc, as rustix's `event` feature would change the build of the rustix
/// that wasmtime shares.
fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The thread of one inotify instance: routes its events until stopped;
/// if reading fails, breaks every watch.
fn run(inotify: &OwnedFd, stop: &OwnedFd, routes: &Mutex<Routes>, generation: u64) {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); EVENT_BUFFER];
    let failure = 'run: loop {
        let pollfd = |fd: &OwnedFd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [pollfd(inotify), pollfd(stop)];
        // SAFETY: `fds` is a valid array of two pollfd for the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = Errno::from_raw_os_error(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            );
            if e == Errno::INTR {
                continue;
            }
            break e;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let mut reader = inotify::Reader::new(inotify, &mut buf);
        let mut routes = lock(routes);
        if routes.generation != generation {
            return;
        }
        // What one read returned; more wait for the next poll.
        loop {
            match reader.next() {
                Ok(event) => {
                    let name = event.file_name().map(CStr::to_bytes);
                    routes.route(inotify.as_fd(), event.wd(), event.events(), name);
                }
                Err(Errno::AGAIN | Errno::INTR) => break,
                Err(e) => break 'run e,
            }
            if reader.is_buffer_empty() {
                break;
            }
        }
    };
    let mut routes = lock(routes);
    if routes.generation == generation {
        routes.alive = false;
        let reason = format!(
            "watch on {} failed: {}",
            routes.dir.display(),
            std::io::Error::from(failure)
        );
        routes.break_all(&reason);
    }
}

#[cfg(test)]
mod tests;
