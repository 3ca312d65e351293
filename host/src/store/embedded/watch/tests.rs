//! Tests of [`watch`](super).

use futures::FutureExt;

use super::*;

fn woken(signal: &Signal) -> bool {
    signal.wake.notified().now_or_never().is_some()
}

fn rewatch(signal: &Signal) -> bool {
    signal.rewatch.swap(false, Ordering::SeqCst)
}

const LEASE: &[u8] = b"demo.lease";
const STORE_WD: i32 = 1;
const LEASE_WD: i32 = 2;

/// Routes with one watch of `demo`, whose directory is watched.
fn routes() -> (Routes, Arc<Signal>, OwnedFd) {
    let signal = Arc::new(Signal::default());
    let mut routes = Routes {
        store_wds: vec![STORE_WD],
        ..Routes::default()
    };
    routes.leases.insert(
        LEASE.to_vec(),
        LeaseRoute {
            watches: vec![(1, signal.clone(), STORE_WD)],
            ..LeaseRoute::default()
        },
    );
    routes.dirs.insert(
        LEASE_WD,
        WatchedDir {
            lease: LEASE.to_vec(),
            newest: None,
        },
    );
    (routes, signal, inotify::init(CreateFlags::CLOEXEC).unwrap())
}

fn version(counter: u64) -> Vec<u8> {
    super::super::version_name(counter).into_bytes()
}

#[test]
fn temporary_files_and_other_names_wake_no_one() {
    let (mut routes, signal, fd) = routes();
    for name in [&b".tmp-0123456789abcdef"[..], b"#12345", b"notes.txt", b"1.json"] {
        for mask in [
            ReadFlags::CREATE,
            ReadFlags::DELETE,
            ReadFlags::CLOSE_WRITE,
            ReadFlags::MODIFY,
        ] {
            routes.route(fd.as_fd(), LEASE_WD, mask, Some(name));
        }
    }
    assert!(!woken(&signal));
    // The store directory's other files: floor, terms, lock, others.
    for name in [&b".demo.floor"[..], b".demo.terms", b".demo.lock", b"other.lease"] {
        routes.route(fd.as_fd(), STORE_WD, ReadFlags::CREATE, Some(name));
    }
    assert!(!woken(&signal));
}

#[test]
fn a_new_version_wakes_and_removing_older_ones_does_not() {
    let (mut routes, signal, fd) = routes();
    // Until a creation is seen, the newest is unknown: any removal wakes.
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::DELETE, Some(&version(3)));
    assert!(woken(&signal));
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::CREATE, Some(&version(20)));
    assert!(woken(&signal));
    // Old versions removed, or touched in place, after the write.
    for mask in [
        ReadFlags::DELETE,
        ReadFlags::MOVED_FROM,
        ReadFlags::CLOSE_WRITE,
        ReadFlags::ATTRIB,
    ] {
        routes.route(fd.as_fd(), LEASE_WD, mask, Some(&version(4)));
    }
    assert!(!woken(&signal));
    // The newest itself changed in place, or removed: the record changed.
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::CLOSE_WRITE, Some(&version(20)));
    assert!(woken(&signal));
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::DELETE, Some(&version(20)));
    assert!(woken(&signal));
    // Then the newest is unknown again: a removal below it wakes.
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::DELETE, Some(&version(5)));
    assert!(woken(&signal));
    // A stale writer re-creating an old name wakes (it reads, and finds
    // the newest unchanged).
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::CREATE, Some(&version(21)));
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::CREATE, Some(&version(2)));
    assert!(woken(&signal));
    assert!(!rewatch(&signal));
}

#[test]
fn the_lease_directory_changing_wakes_to_watch_again() {
    let (mut routes, signal, fd) = routes();
    for mask in [
        ReadFlags::MOVED_TO,
        ReadFlags::MOVED_FROM,
        ReadFlags::DELETE,
        ReadFlags::CREATE,
    ] {
        routes.route(fd.as_fd(), STORE_WD, mask | ReadFlags::ISDIR, Some(LEASE));
        assert!(woken(&signal) && rewatch(&signal), "{mask:?}");
    }
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::MOVE_SELF, None);
    assert!(woken(&signal) && rewatch(&signal));
    // No longer routed: events still queued from it go nowhere.
    routes.route(fd.as_fd(), LEASE_WD, ReadFlags::CREATE, Some(&version(9)));
    assert!(!woken(&signal));
    // Lost events: every watch reads and watches again.
    routes.route(fd.as_fd(), -1, ReadFlags::QUEUE_OVERFLOW, None);
    assert!(woken(&signal) && rewatch(&signal));
    // The store's directory removed: every watch breaks.
    routes.route(fd.as_fd(), STORE_WD, ReadFlags::DELETE_SELF, None);
    assert!(
        signal
            .take_broken()
            .is_some_and(|r| r.contains("removed or moved"))
    );
}

/// A watcher with the routes of [`routes`], for own writes.
fn watcher() -> (DirWatcher, Arc<Signal>, OwnedFd, LeaseFiles) {
    let (routes, signal, fd) = routes();
    let watcher = DirWatcher {
        running: Mutex::default(),
        routes: Arc::new(Mutex::new(routes)),
    };
    let store = super::super::EmbeddedStore {
        dir: Arc::new(PathBuf::from("/nonexistent")),
        seen: Arc::default(),
        watcher: Arc::default(),
        unnamed_temps: Arc::default(),
        last_writes: Arc::default(),
    };
    (watcher, signal, fd, store.files("demo").unwrap())
}

fn event(watcher: &DirWatcher, fd: &OwnedFd, mask: ReadFlags, counter: u64) {
    watcher
        .routes()
        .route(fd.as_fd(), LEASE_WD, mask, Some(&version(counter)));
}

#[test]
fn an_own_write_is_not_read_back_whichever_comes_first() {
    let (watcher, signal, fd, files) = watcher();
    // The event before the write is confirmed.
    let own = watcher.expect_own(&files, 7);
    event(&watcher, &fd, ReadFlags::CREATE, 7);
    own.confirmed();
    assert!(!woken(&signal));
    // The event after.
    watcher.expect_own(&files, 8).confirmed();
    event(&watcher, &fd, ReadFlags::CREATE, 8);
    assert!(!woken(&signal));
    // Matched once only: the same name created again is read.
    event(&watcher, &fd, ReadFlags::CREATE, 8);
    assert!(woken(&signal));
    // Writes in quick succession, ahead of their events.
    for counter in 20..20 + MAX_LINKED as u64 {
        watcher.expect_own(&files, counter).confirmed();
    }
    for counter in 20..20 + MAX_LINKED as u64 {
        event(&watcher, &fd, ReadFlags::CREATE, counter);
    }
    assert!(!woken(&signal));
    // More than are remembered: the oldest is read.
    for counter in 30..31 + MAX_LINKED as u64 {
        watcher.expect_own(&files, counter).confirmed();
    }
    event(&watcher, &fd, ReadFlags::CREATE, 30);
    assert!(woken(&signal));
    // Another version than the one written is read.
    watcher.expect_own(&files, 9).confirmed();
    event(&watcher, &fd, ReadFlags::CREATE, 10);
    assert!(woken(&signal));
    event(&watcher, &fd, ReadFlags::CREATE, 9);
    assert!(woken(&signal), "the match went with the wake-up");
}

#[test]
fn a_name_another_writer_linked_first_is_read() {
    let (watcher, signal, fd, files) = watcher();
    // Seen while linking, and the link failed: the writer wakes.
    let own = watcher.expect_own(&files, 7);
    event(&watcher, &fd, ReadFlags::CREATE, 7);
    assert!(!woken(&signal));
    drop(own);
    assert!(woken(&signal));
    // Not seen, and the link failed: nothing to read; the creation,
    // seen later, is read.
    drop(watcher.expect_own(&files, 8));
    assert!(!woken(&signal));
    event(&watcher, &fd, ReadFlags::CREATE, 8);
    assert!(woken(&signal));
    // A second write of this store replaces the first's match: if the
    // first's creation was seen, the watches read.
    let first = watcher.expect_own(&files, 9);
    event(&watcher, &fd, ReadFlags::CREATE, 9);
    let second = watcher.expect_own(&files, 10);
    assert!(woken(&signal));
    drop(first);
    second.confirmed();
    event(&watcher, &fd, ReadFlags::CREATE, 10);
    assert!(!woken(&signal));
    // Two writes of the same version: one links; the name is ours.
    let a = watcher.expect_own(&files, 11);
    let b = watcher.expect_own(&files, 11);
    event(&watcher, &fd, ReadFlags::CREATE, 11);
    a.confirmed();
    drop(b);
    assert!(!woken(&signal));
}

#[test]
fn a_lease_not_watched_records_no_own_write() {
    let (watcher, signal, fd, _) = watcher();
    let store = super::super::EmbeddedStore {
        dir: Arc::new(PathBuf::from("/nonexistent")),
        seen: Arc::default(),
        watcher: Arc::default(),
        unnamed_temps: Arc::default(),
        last_writes: Arc::default(),
    };
    watcher.expect_own(&store.files("other").unwrap(), 1).confirmed();
    assert!(!watcher.routes().leases.contains_key(&b"other.lease"[..]));
    event(&watcher, &fd, ReadFlags::CREATE, 1);
    assert!(woken(&signal));
}
