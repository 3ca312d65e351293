//! The embedded store: lease records as JSON files in one local directory.
//!
//! The default store. It needs nothing installed, and several `baton`
//! processes on one machine (or several stores in one process) contend for
//! the same leases through it. The design, with its argument, is in
//! `docs/embedded-store.md`; its invariants:
//!
//! - **Layout.** A lease `demo` is the directory `demo.lease/`, one version
//!   file per write (`00000000000000000042.json`), the newest being the
//!   record; `.demo.terms/` and `.demo.floor` keep its *term floor*, so terms
//!   survive the lease's deletion; `.demo.lock` serialises creates and
//!   deletes only, never writes.
//! - **Compare-and-swap without a lock.** Version *n + 1* is created with
//!   `link(2)`, which fails if the name exists: of two writers of one
//!   version one wins, and a writer stopped mid-write blocks no one; a stale
//!   link lands below the newest and is reported as a conflict.
//! - **Crash safety.** A version is written whole before it is named
//!   (`O_TMPFILE`, then `linkat`): a killed process leaves the old newest
//!   version or the new one. Writes that start a term, change the holder or
//!   release are fsynced, and a new term is recorded before the version
//!   that starts it; renewals are not fsynced, and a newest version torn by
//!   a machine crash is read as a renewal of the newest readable one only
//!   when only an unsynced renewal can have written it. baton never writes
//!   over what it cannot read.
//! - **Deleted records** read as tombstones or as a released record at the
//!   term floor ([`TOMBSTONE`]`term-<floor>`): a term is never reused.
//! - **Renewals** over this store's own last write, still as it left it
//!   (inode, birth and change times, size), read nothing first (14 system
//!   calls); every other write reads and checks (25).
//! - **Reads** take no lock and check, after reading, that the version's
//!   name still refers to the file read (files of removed versions are
//!   reused for new ones).
//! - **Watching** is inotify, one instance and thread per store (`watch`),
//!   waking only the watches an event may concern; a store's own writes
//!   wake none of its watches.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use self::watch::{DirWatcher, Registration, Signal};
use super::deleted::{DeletedRecords, Found};
use super::{
    ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, TOMBSTONE, Versioned, validate_lease_name,
};
use crate::support::rounding::human;

pub mod buckets;
mod commit;
mod floor;
mod layout;
mod lifecycle;
mod reads;
mod renewals;
mod watch;

use commit::*;
use floor::*;
use layout::*;
use lifecycle::*;
use reads::*;
use renewals::*;

/// Lease records as JSON files in a local directory; see the [module
/// documentation](self) for the layout and guarantees.
///
/// Cloning is cheap; clones share the directory name and the memory of the
/// records seen (for tombstones). Any number of stores, in this process or
/// others, may use the same directory.
#[derive(Clone, Debug)]
pub struct EmbeddedStore {
    dir: Arc<PathBuf>,
    /// What this store saw of each lease, for deleted records.
    seen: Arc<DeletedRecords>,
    /// The one inotify watcher of all its watches.
    watcher: Arc<DirWatcher>,
    /// Version files are written as unnamed temporary files (`O_TMPFILE`),
    /// then linked through `/proc/self/fd`; cleared for good when the file
    /// system or the process cannot (see [`new_version_file`]).
    unnamed_temps: Arc<AtomicBool>,
    /// What it last wrote of each lease, for renewals that need not read
    /// first (see [Renewals](self#renewals)).
    last_writes: Arc<LastWrites>,
}

impl EmbeddedStore {
    /// Opens the store in `dir`, creating the directory (and its parents) if
    /// needed. Records of an older baton (`<lease>.lease.json`) are moved
    /// into the current layout, keeping their versions.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| io_error(ANY_LEASE, "cannot create", &dir, e))?;
        let dir = std::path::absolute(&dir).map_err(|e| io_error(ANY_LEASE, "cannot resolve", &dir, e))?;
        let meta = fs::metadata(&dir).map_err(|e| io_error(ANY_LEASE, "cannot read", &dir, e))?;
        if !meta.is_dir() {
            return Err(StoreError::Refused {
                lease: ANY_LEASE.into(),
                detail: format!("{} is not a directory", dir.display()),
            });
        }
        let store = Self {
            dir: Arc::new(dir),
            seen: Arc::default(),
            watcher: Arc::default(),
            unnamed_temps: Arc::new(AtomicBool::new(Path::new(PROC_FDS).is_dir())),
            last_writes: Arc::default(),
        };
        store.move_legacy_records()?;
        Ok(store)
    }

    /// The directory holding the records (made absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Deletes a lease record, whatever its version; returns whether it
    /// existed. Meant for operators and tests; the elector never deletes.
    ///
    /// A lease created again afterwards gets versions that never equal the
    /// deleted record's.
    pub async fn delete(&self, lease: &str) -> Result<bool, StoreError> {
        let files = self.files(lease)?;
        self.last_writes.forget(lease);
        locked(files, remove_lease_dir).await
    }

    /// The files of `lease`, or [`StoreError::Refused`] if the name is invalid.
    fn files(&self, lease: &str) -> Result<LeaseFiles, StoreError> {
        validate_lease_name(lease).map_err(|e| StoreError::Refused {
            lease: lease.into(),
            detail: e.to_string(),
        })?;
        Ok(LeaseFiles::new(self.dir.clone(), lease))
    }

    /// Moves every record of an older baton into its lease's directory.
    fn move_legacy_records(&self) -> Result<(), StoreError> {
        for files in self.leases_named("", LEGACY_SUFFIX)? {
            with_lock(&files, &|| None, move_legacy_record)?;
        }
        Ok(())
    }

    /// The files of every lease with an entry named `<lease><suffix>` in
    /// the directory whose name starts with `prefix`; names that no store of
    /// ours would have written are left out.
    fn leases_named(&self, prefix: &str, suffix: &str) -> Result<Vec<LeaseFiles>, StoreError> {
        let cannot = |e| io_error(ANY_LEASE, "cannot list", self.dir(), e);
        let mut leases = Vec::new();
        for entry in fs::read_dir(self.dir()).map_err(cannot)? {
            let name = entry.map_err(cannot)?.file_name();
            if let Some(files) = name
                .to_str()
                .and_then(|n| n.strip_suffix(suffix))
                .filter(|lease| lease.starts_with(prefix))
                .and_then(|lease| self.files(lease).ok())
            {
                leases.push(files);
            }
        }
        Ok(leases)
    }
}

#[async_trait::async_trait]
impl LeaseStore for EmbeddedStore {
    fn describe(&self) -> String {
        format!("embedded store at {}", self.dir.display())
    }

    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        let files = self.files(lease)?;
        let ticket = self.seen.ticket(lease);
        let found = blocking(&files.lease.clone(), move || observe(&files)).await?;
        Ok(self.seen.found_since(lease, ticket, found))
    }

    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError> {
        self.create_at(lease, record, 0).await
    }

    /// Under the lease's lock, as [`EmbeddedStore::delete`]: a create or
    /// another delete cannot interleave. A renewal takes no lock; one
    /// linked in between the read and the delete is deleted with the rest,
    /// and its writer finds the record gone at its next write (and creates
    /// it again). That is why only records that gate no task are deleted.
    async fn delete_if(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        let files = self.files(lease)?;
        let version = version.to_owned();
        let deleted = locked(files, move |files| match read_current(files)? {
            Some((_, stored, _)) if stored.version() == version => remove_lease_dir(files),
            _ => Ok(false),
        })
        .await?;
        if deleted {
            self.last_writes.forget(lease);
        }
        Ok(deleted)
    }

    async fn update(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        if version.starts_with(TOMBSTONE) {
            // The record was deleted: write it again, if the lease's highest
            // term is still the one the caller saw (a conflict if another
            // store wrote it since, even if that record is gone again).
            let floor = self.seen.create_floor(lease, version)?;
            let created = self.create_at(lease, record, floor).await;
            if created.as_ref().is_err_and(StoreError::is_conflict) {
                self.seen.create_refused(lease, version);
            }
            return created;
        }
        let files = self.files(lease)?;
        let record = record.clone();
        let version = version.to_owned();
        let abandoned = Arc::new(AtomicBool::new(false));
        let _guard = AbandonOnDrop(abandoned.clone());
        let writer = Writer {
            watcher: self.watcher.clone(),
            unnamed_temps: self.unnamed_temps.clone(),
            last_writes: self.last_writes.clone(),
        };
        let updated = blocking(&files.lease.clone(), move || {
            update_record(&files, &version, record, &abandoned, &writer)
        })
        .await?;
        self.seen.wrote(lease, &updated);
        Ok(updated)
    }

    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError> {
        let files = Arc::new(self.files(lease)?);
        let signal = Arc::new(Signal::default());
        let registration = {
            let files = files.clone();
            let signal = signal.clone();
            let watcher = self.watcher.clone();
            blocking(&files.lease.clone(), move || watcher.register(&files, signal)).await?
        };
        let state = WatchState {
            registration: Arc::new(registration),
            signal,
            files,
            seen: self.seen.clone(),
            first: true,
            done: false,
        };
        Ok(Box::pin(stream::unfold(state, next_observation)))
    }

    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.list_prefixed("").await
    }

    async fn list_readable(&self) -> Result<(Vec<(String, Versioned)>, Vec<(String, String)>), StoreError> {
        let store = self.clone();
        blocking(ANY_LEASE, move || {
            let (mut leases, mut unreadable) = (Vec::new(), Vec::new());
            for files in store.leases_named("", LEASE_SUFFIX)? {
                match read_current(&files) {
                    // `None`: deleted since the directory was read.
                    Ok(None) => {}
                    Ok(Some((_, stored, _))) => leases.push((files.lease, stored.into_versioned())),
                    Err(StoreError::Malformed { detail, .. }) => unreadable.push((files.lease, detail)),
                    Err(e) => return Err(e),
                }
            }
            leases.sort_by(|a, b| a.0.cmp(&b.0));
            unreadable.sort();
            Ok((leases, unreadable))
        })
        .await
    }

    async fn list_prefixed(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let store = self.clone();
        let prefix = prefix.to_owned();
        blocking(ANY_LEASE, move || {
            let mut leases = Vec::new();
            for files in store.leases_named(&prefix, LEASE_SUFFIX)? {
                // `None`: deleted since the directory was read.
                if let Some((_, stored, _)) = read_current(&files)? {
                    leases.push((files.lease, stored.into_versioned()));
                }
            }
            leases.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(leases)
        })
        .await
    }
}

impl EmbeddedStore {
    /// Creates the record if there is none and the lease's highest term is
    /// still `floor` (0: the lease never had a term).
    async fn create_at(
        &self,
        lease: &str,
        record: &LeaseRecord,
        floor: u64,
    ) -> Result<Versioned, StoreError> {
        let files = self.files(lease)?;
        let record = record.clone();
        let created = locked(files, move |files| {
            if let Some((_, current, _)) = read_current(files)? {
                return Err(StoreError::Conflict {
                    lease: files.lease.clone(),
                    detail: format!("already exists (version {})", current.version()),
                });
            }
            let state = read_lock_state(files)?;
            let highest = state.floor;
            if highest > floor {
                return Err(StoreError::Conflict {
                    lease: files.lease.clone(),
                    detail: format!(
                        "the lease's highest term is {highest}, not {floor}: it was written since"
                    ),
                });
            }
            // (A floor below the caller's was lost: emptied by hand, or
            // written by an older baton. It is raised below.)
            if record.term < highest {
                return Err(StoreError::Refused {
                    lease: files.lease.clone(),
                    detail: format!(
                        "term {} is below the lease's highest term {highest}: terms never go back",
                        record.term
                    ),
                });
            }
            let stored = StoredRecord {
                incarnation: random_id(),
                counter: 1,
                write: random_id(),
                replaced: String::new(),
                durable: 1,
                record,
            };
            // Counted before the record appears, so that a reader that
            // finds no record again knows it was created in between.
            write_lock_state(
                files,
                LockState {
                    floor: highest.max(stored.record.term),
                    // Only ever compared for a change.
                    creates: state.creates.wrapping_add(1),
                },
            )?;
            install_lease_dir(files, &stored)?;
            Ok(stored.into_versioned())
        })
        .await?;
        self.seen.wrote(lease, &created);
        Ok(created)
    }
}

/// Runs blocking file work on tokio's blocking pool.
async fn blocking<T, F>(lease: &str, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(StoreError::Unavailable {
            lease: lease.into(),
            detail: format!("store task failed: {e}"),
        })
    })
}

/// Sets its flag when dropped: tells blocking work that its caller is gone
/// (for example, timed out), so it must not write any more.
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The error of a request whose caller gave up on it.
fn abandoned_error(files: &LeaseFiles) -> StoreError {
    StoreError::Unavailable {
        lease: files.lease.clone(),
        detail: "request abandoned before it was written".into(),
    }
}

/// Runs `work` on the blocking pool while holding the lease's lock (for a
/// create or a delete).
///
/// If the caller drops the returned future while the lock is being waited
/// for, `work` does not run: a caller that gave up on a request (a timeout)
/// must not see it take effect much later.
async fn locked<T, F>(files: LeaseFiles, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&LeaseFiles) -> Result<T, StoreError> + Send + 'static,
{
    let abandoned = Arc::new(AtomicBool::new(false));
    let _guard = AbandonOnDrop(abandoned.clone());
    let lease = files.lease.clone();
    blocking(&lease, move || {
        let give_up = || {
            abandoned
                .load(Ordering::SeqCst)
                .then(|| "request abandoned while waiting for the lock".into())
        };
        with_lock(&files, &give_up, |files| {
            if abandoned.load(Ordering::SeqCst) {
                return Err(abandoned_error(files));
            }
            work(files)
        })
    })
    .await
}

/// Runs `work` while holding the lease's lock, waiting for it until
/// `give_up` says why not.
fn with_lock<T>(
    files: &LeaseFiles,
    give_up: &dyn Fn() -> Option<String>,
    work: impl FnOnce(&LeaseFiles) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let path = files.lock();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io_error(&files.lease, "cannot open lock file", &path, e))?;
    take_lock(files, &lock, false, give_up)?;
    let result = work(files);
    // Closing the file would release the lock too; be explicit.
    let _ = lock.unlock();
    result
}

/// The state of a watch stream. Dropping it leaves the store's watcher.
struct WatchState {
    registration: Arc<Registration>,
    signal: Arc<Signal>,
    files: Arc<LeaseFiles>,
    seen: Arc<DeletedRecords>,
    /// The current record has not been yielded yet.
    first: bool,
    /// The watch broke and said so; the stream ends.
    done: bool,
}

/// Waits for the next change (except the first time) and reads the record.
async fn next_observation(
    mut state: WatchState,
) -> Option<(Result<Option<Versioned>, StoreError>, WatchState)> {
    if state.done {
        return None;
    }
    if state.first {
        state.first = false;
        state.signal.rewatch.store(true, Ordering::SeqCst);
    } else {
        state.signal.wake.notified().await;
    }
    if let Some(reason) = state.signal.take_broken() {
        state.done = true;
        let error = StoreError::Unavailable {
            lease: state.files.lease.clone(),
            detail: reason,
        };
        return Some((Err(error), state));
    }
    let files = state.files.clone();
    let registration = state.registration.clone();
    let rewatch = state.signal.rewatch.swap(false, Ordering::SeqCst);
    let ticket = state.seen.ticket(&files.lease);
    let observed = blocking(&files.lease.clone(), move || {
        // Watched before it is read, so no version written in between is
        // missed.
        if rewatch {
            registration.watcher.watch_lease_dir(&files)?;
        }
        observe(&files)
    })
    .await
    .map(|found| state.seen.found_since(&state.files.lease, ticket, found));
    Some((observed, state))
}

#[cfg(test)]
mod tests;
