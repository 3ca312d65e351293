//! The embedded store: lease records as JSON files in one local directory.
//!
//! This is the default store. It needs nothing installed, and several `baton`
//! processes on one machine (or several stores in one process) can contend
//! for the same leases through it.
//!
//! # Layout
//!
//! For a lease named `demo` the directory holds:
//!
//! - `demo.lease.json`: the record, as JSON: the [`LeaseRecord`] plus the
//!   version it was written at (a random *incarnation* id chosen when the
//!   record is created and a counter that grows with every write). The
//!   version string is `<incarnation>-<counter>`, so it never repeats for a
//!   lease, even when the file is deleted and the lease created again.
//! - `.demo.lock`: the file that writers lock (advisory `flock`) for the
//!   duration of one compare-and-swap. It is never deleted: deleting a lock
//!   file while someone waits on it would let two writers hold "the" lock.
//! - `.demo.floor`: two decimal numbers: the lease's *term floor*, the
//!   highest term ever written, so that terms survive the record's
//!   deletion, and how many times the record was created, so that a reader
//!   that finds no record twice knows whether it was created in between.
//!   Replaced whole, like the record (`.demo.floor.tmp` while it is being
//!   written). A lock file of an older baton holds these numbers itself; it
//!   is read while there is no floor file.
//! - `.demo.tmp`: the next record while it is being written; it exists only
//!   while a writer holds the lock, or after a writer died mid-write. Readers
//!   ignore it, and the next writer overwrites it.
//!
//! # Crash safety
//!
//! A write takes the lock, reads and compares the current version, writes the
//! new record to the temporary file, fsyncs it, renames it over the record
//! (atomic), fsyncs the directory and drops the lock. A process killed at any
//! point leaves either the old record or the new one, never a torn one, and
//! the kernel releases its lock.
//!
//! A *renewal* (same holder, same term) is not fsynced: the rename alone
//! makes it visible to every process, and what a crash of the machine could
//! lose of it (a later renew time) matters to no one, since every process
//! on the machine is gone with it. Fsync latency is the one stall of this
//! store that a healthy machine shows: under heavy writeback (right after
//! a build wrote gigabytes) renewals here took over 200 ms each, one after
//! another for more than a second, longer than a short renew deadline; with
//! 1.5 GB being written, a write-fsync-rename-fsync took 2 ms at the median
//! and 115 ms at most. A write that starts a term, changes
//! the holder or releases the lease is fsynced (file and directory), so
//! that terms never go back after a crash. Readers do not lock: they read whichever
//! complete file the name points to (only a reader that finds no record
//! takes a shared lock, to read the term floor).
//!
//! # Deleted records
//!
//! A record file deleted while it had a holder reads as a tombstone, as
//! described in [Deleted records](super#deleted-records): each store
//! remembers the last record it read or wrote of each lease, and a holder
//! whose record vanished writes it again (a new incarnation, same term) at
//! its next renewal. A tombstone gets a new version (`+N`), dated anew by
//! the elector, when the floor file's create count shows the record was
//! created again since the last read: written and deleted again in
//! between, which a reader may have missed.
//!
//! A missing record whose floor file holds a term floor (the lease existed
//! and was deleted) reads as a released record at that term, under the
//! version [`TOMBSTONE`]`term-<floor>`: free to take, and the next holder
//! writes the floor plus one. So a term number is never reused, even when
//! every process that knew the old terms is gone, as long as the floor file
//! is kept.
//!
//! # Watching
//!
//! [`LeaseStore::watch`] uses inotify (through the `notify` crate) on the
//! directory and re-reads the record whenever its name is created, replaced,
//! written or removed; there is no polling.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream;
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use serde::{Deserialize, Serialize};

use super::deleted::{DeletedRecords, Found};
use super::{
    ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, TOMBSTONE, Versioned, validate_lease_name,
};

/// File name suffix of lease records.
const RECORD_SUFFIX: &str = ".lease.json";

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
}

/// What is stored in a record file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredRecord {
    /// Chosen at random when the record is created.
    incarnation: String,
    /// 1 when created, plus one with each update.
    counter: u64,
    /// The lease record itself.
    record: LeaseRecord,
}

impl StoredRecord {
    fn version(&self) -> String {
        format!("{}-{}", self.incarnation, self.counter)
    }

    fn into_versioned(self) -> Versioned {
        Versioned {
            version: self.version(),
            record: self.record,
        }
    }
}

/// The files of one (validated) lease.
#[derive(Clone, Debug)]
struct LeaseFiles {
    lease: String,
    dir: PathBuf,
    record: PathBuf,
    temp: PathBuf,
    lock: PathBuf,
    floor: PathBuf,
    floor_temp: PathBuf,
}

impl EmbeddedStore {
    /// Opens the store in `dir`, creating the directory (and its parents) if
    /// needed.
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
        Ok(Self {
            dir: Arc::new(dir),
            seen: Arc::default(),
        })
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
        locked(files, |files, _| match fs::remove_file(&files.record) {
            Ok(()) => {
                sync_dir(files)?;
                // A temporary file left by a writer that died.
                let _ = fs::remove_file(&files.temp);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error(&files.lease, "cannot remove", &files.record, e)),
        })
        .await
    }

    /// The files of `lease`, or [`StoreError::Refused`] if the name is invalid.
    fn files(&self, lease: &str) -> Result<LeaseFiles, StoreError> {
        validate_lease_name(lease).map_err(|detail| StoreError::Refused {
            lease: lease.into(),
            detail,
        })?;
        Ok(LeaseFiles {
            lease: lease.into(),
            dir: self.dir.to_path_buf(),
            record: self.dir.join(format!("{lease}{RECORD_SUFFIX}")),
            temp: self.dir.join(format!(".{lease}.tmp")),
            lock: self.dir.join(format!(".{lease}.lock")),
            floor: self.dir.join(format!(".{lease}.floor")),
            floor_temp: self.dir.join(format!(".{lease}.floor.tmp")),
        })
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
            return self.create_at(lease, record, floor).await;
        }
        let files = self.files(lease)?;
        let record = record.clone();
        let version = version.to_owned();
        let updated = locked(files, move |files, lock| {
            let Some(current) = read_record(files)? else {
                return Err(StoreError::Conflict {
                    lease: files.lease.clone(),
                    detail: format!("does not exist (expected version {version})"),
                });
            };
            let current_version = current.version();
            if current_version != version {
                return Err(StoreError::Conflict {
                    lease: files.lease.clone(),
                    detail: format!("version is {current_version}, not {version}"),
                });
            }
            // A new term must raise the floor. A renewal raises a floor
            // that was lost (emptied by hand, or never written by an older
            // baton), and goes on if the floor cannot be read: the next
            // new term reports it.
            let new_term = record.term > current.record.term;
            match read_lock_state(files, lock) {
                Ok(state) if state.floor < record.term => write_lock_state(
                    files,
                    LockState {
                        floor: record.term,
                        ..state
                    },
                )?,
                Ok(_) => {}
                Err(e) if new_term => return Err(e),
                Err(_) => {}
            }
            let renewal = !new_term
                && record.holder == current.record.holder
                && record.instance == current.record.instance;
            let stored = StoredRecord {
                incarnation: current.incarnation,
                counter: current.counter + 1,
                record,
            };
            write_record(
                files,
                &stored,
                if renewal {
                    Durability::Visible
                } else {
                    Durability::Durable
                },
            )?;
            Ok(stored.into_versioned())
        })
        .await?;
        self.seen.wrote(lease, &updated);
        Ok(updated)
    }

    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError> {
        let files = Arc::new(self.files(lease)?);
        let signal = Arc::new(Signal::default());
        let watcher = {
            let files = files.clone();
            let signal = signal.clone();
            blocking(&files.lease.clone(), move || start_watcher(&files, signal)).await?
        };
        let state = WatchState {
            _watcher: watcher,
            signal,
            files,
            seen: self.seen.clone(),
            first: true,
            done: false,
        };
        Ok(Box::pin(stream::unfold(state, next_observation)))
    }

    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError> {
        let store = self.clone();
        blocking(ANY_LEASE, move || {
            let entries =
                fs::read_dir(store.dir()).map_err(|e| io_error(ANY_LEASE, "cannot list", store.dir(), e))?;
            let mut leases = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| io_error(ANY_LEASE, "cannot list", store.dir(), e))?;
                let name = entry.file_name();
                let Some(lease) = name.to_str().and_then(|n| n.strip_suffix(RECORD_SUFFIX)) else {
                    continue;
                };
                // Files that no store of ours would have written.
                let Ok(files) = store.files(lease) else {
                    continue;
                };
                // `None`: deleted since the directory was read.
                if let Some(stored) = read_record(&files)? {
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
        let created = locked(files, move |files, lock| {
            if let Some(current) = read_record(files)? {
                return Err(StoreError::Conflict {
                    lease: files.lease.clone(),
                    detail: format!("already exists (version {})", current.version()),
                });
            }
            let state = read_lock_state(files, lock)?;
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
                incarnation: format!("{:016x}", rand::random::<u64>()),
                counter: 1,
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
            write_record(files, &stored, Durability::Durable)?;
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

/// Runs `work` on the blocking pool while holding the lease's lock.
///
/// If the caller drops the returned future while the lock is being waited
/// for, `work` does not run: a caller that gave up on a request (a timeout)
/// must not see it take effect much later.
async fn locked<T, F>(files: LeaseFiles, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&LeaseFiles, &File) -> Result<T, StoreError> + Send + 'static,
{
    let abandoned = Arc::new(AtomicBool::new(false));
    let _guard = AbandonOnDrop(abandoned.clone());
    let lease = files.lease.clone();
    blocking(&lease, move || {
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&files.lock)
            .map_err(|e| io_error(&files.lease, "cannot open lock file", &files.lock, e))?;
        take_lock(&files, &lock, false, || {
            abandoned
                .load(Ordering::SeqCst)
                .then(|| "request abandoned while waiting for the lock".into())
        })?;
        let result = if abandoned.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail: "request abandoned while waiting for the lock".into(),
            })
        } else {
            work(&files, &lock)
        };
        // Closing the file would release the lock too; be explicit.
        let _ = lock.unlock();
        result
    })
    .await
}

/// Reads a lease's record and, if there is none, its [`LockState`] (zeros
/// if it has none), under a shared lock so that a writer's state is never
/// read half-written.
fn observe(files: &LeaseFiles) -> Result<Found, StoreError> {
    let missing = |state: LockState| Found::Missing {
        last: None,
        floor: Some(state.floor),
        creates: Some(state.creates),
    };
    if let Some(stored) = read_record(files)? {
        return Ok(Found::Record(stored.into_versioned()));
    }
    let lock = match File::open(&files.lock) {
        Ok(lock) => lock,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(missing(LockState::default())),
        Err(e) => return Err(io_error(&files.lease, "cannot open lock file", &files.lock, e)),
    };
    // Give up after a while, as a timeout would.
    let deadline = std::time::Instant::now() + SHARED_LOCK_WAIT;
    take_lock(files, &lock, true, || {
        (std::time::Instant::now() >= deadline).then(|| {
            format!(
                "{} stayed locked by a writer for {SHARED_LOCK_WAIT:?}",
                files.lock.display()
            )
        })
    })?;
    // Created while we waited for the lock.
    if let Some(stored) = read_record(files)? {
        return Ok(Found::Record(stored.into_versioned()));
    }
    let state = read_lock_state(files, &lock)?;
    let _ = lock.unlock();
    Ok(missing(state))
}

/// What is kept of a lease besides its record: the term floor (the highest
/// term ever written) and how many times the record was created. Both only
/// grow. They live in the floor file, replaced whole (write, fsync, rename)
/// under the lease's lock, so that a writer killed at any point leaves the
/// old state or the new one. Before the floor file, they were written in
/// place into the lock file: such a lock file is read while there is no
/// floor file, and the next write moves them over. No state at all reads
/// as zeros; one written before the create count reads as count 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LockState {
    floor: u64,
    creates: u64,
}

/// Reads a lease's [`LockState`] (the caller holds the lock, shared or not):
/// from the floor file, or from the lock file of an older baton.
fn read_lock_state(files: &LeaseFiles, lock: &File) -> Result<LockState, StoreError> {
    use std::io::Read;
    // Two numbers of at most 20 digits each; anything longer is wrong.
    const MOST: u64 = 128;
    let (path, text) = match File::open(&files.floor) {
        Ok(file) => {
            let mut text = String::new();
            file.take(MOST)
                .read_to_string(&mut text)
                .map_err(|e| io_error(&files.lease, "cannot read", &files.floor, e))?;
            (&files.floor, text)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; MOST as usize];
            let n = lock
                .read_at(&mut buf, 0)
                .map_err(|e| io_error(&files.lease, "cannot read", &files.lock, e))?;
            (&files.lock, String::from_utf8_lossy(&buf[..n]).into_owned())
        }
        Err(e) => return Err(io_error(&files.lease, "cannot read", &files.floor, e)),
    };
    let bad = || StoreError::Refused {
        lease: files.lease.clone(),
        detail: format!(
            "{}: expected the term floor (the highest term the lease has had) and a create \
             count, two numbers, found {:?}; baton does not guess a floor: write the two \
             numbers there (the floor at least the `transitions` of the lease's record, \
             the count 0)",
            path.display(),
            text.trim()
        ),
    };
    let mut numbers = text
        .split_whitespace()
        .map(|t| t.parse::<u64>().map_err(|_| bad()));
    let state = LockState {
        floor: numbers.next().transpose()?.unwrap_or(0),
        creates: numbers.next().transpose()?.unwrap_or(0),
    };
    if numbers.next().is_some() {
        return Err(bad());
    }
    Ok(state)
}

/// Replaces a lease's [`LockState`] atomically and durably (the caller holds
/// the lock): the floor file is written whole and renamed into place.
fn write_lock_state(files: &LeaseFiles, state: LockState) -> Result<(), StoreError> {
    let text = format!("{} {}\n", state.floor, state.creates);
    replace_file(
        files,
        &files.floor_temp,
        &files.floor,
        text.as_bytes(),
        Durability::Durable,
    )
}

/// The longest a reader waits for a writer to release a lease's lock (a
/// compare-and-swap takes milliseconds; the elector's own request timeout
/// usually gives up sooner).
const SHARED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes `lock`, shared or exclusive, without pinning this thread for good
/// behind a holder that keeps it far longer than one compare-and-swap (a
/// stopped process, a stuck fsync): polls it, and fails with the reason
/// `give_up` returns once it returns one.
fn take_lock(
    files: &LeaseFiles,
    lock: &File,
    shared: bool,
    give_up: impl Fn() -> Option<String>,
) -> Result<(), StoreError> {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        if let Some(detail) = give_up() {
            return Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail,
            });
        }
        let attempt = if shared {
            lock.try_lock_shared()
        } else {
            lock.try_lock()
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_error(&files.lease, "cannot lock", &files.lock, e));
            }
        }
    }
}

/// Reads a lease's record; `None` if there is none.
fn read_record(files: &LeaseFiles) -> Result<Option<StoredRecord>, StoreError> {
    let bytes = match fs::read(&files.record) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&files.lease, "cannot read", &files.record, e)),
    };
    let malformed = |detail: String| StoreError::Malformed {
        lease: files.lease.clone(),
        detail: format!(
            "{}: {detail}; baton never overwrites a record it cannot read: restore the file \
             or delete it (the lease is then free, and its terms go on from the floor in {})",
            files.record.display(),
            files.floor.display()
        ),
    };
    let stored: StoredRecord = serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
    if stored.incarnation.is_empty() || !stored.incarnation.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(malformed(format!(
            "incarnation {:?} is not alphanumeric",
            stored.incarnation
        )));
    }
    Ok(Some(stored))
}

/// How far a write must have gone when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Visible to every process (renamed into place): a renewal.
    Visible,
    /// On disk too (fsynced, and the directory): everything else.
    Durable,
}

/// Replaces a lease's record atomically. The caller holds the lease's lock.
fn write_record(files: &LeaseFiles, stored: &StoredRecord, durability: Durability) -> Result<(), StoreError> {
    let mut json = serde_json::to_vec_pretty(stored).map_err(|e| StoreError::Refused {
        lease: files.lease.clone(),
        detail: format!("cannot encode record: {e}"),
    })?;
    json.push(b'\n');
    replace_file(files, &files.temp, &files.record, &json, durability)
}

/// Replaces `path` with `contents` atomically: writes `temp`, renames it
/// over `path`, and if `durability` asks, fsyncs the file before the rename
/// and the directory after. A process killed at any point leaves the old
/// file or the new one, never a torn one. The caller holds the lease's lock
/// (so `temp` is its own).
fn replace_file(
    files: &LeaseFiles,
    temp: &Path,
    path: &Path,
    contents: &[u8],
    durability: Durability,
) -> Result<(), StoreError> {
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp)
        .and_then(|mut file| {
            file.write_all(contents)?;
            if durability == Durability::Durable {
                file.sync_all()?;
            }
            Ok(())
        });
    if let Err(e) = written {
        let _ = fs::remove_file(temp);
        return Err(io_error(&files.lease, "cannot write", temp, e));
    }
    if let Err(e) = fs::rename(temp, path) {
        let _ = fs::remove_file(temp);
        return Err(io_error(&files.lease, "cannot replace", path, e));
    }
    match durability {
        Durability::Durable => sync_dir(files),
        Durability::Visible => Ok(()),
    }
}

/// Makes a rename or removal in the directory durable.
fn sync_dir(files: &LeaseFiles) -> Result<(), StoreError> {
    File::open(&files.dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io_error(&files.lease, "cannot sync", &files.dir, e))
}

/// Maps an I/O error: permission problems are refusals, the rest are taken
/// as transient.
fn io_error(lease: &str, what: &str, path: &Path, err: io::Error) -> StoreError {
    let detail = format!("{what} {}: {err}", path.display());
    match err.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => StoreError::Refused {
            lease: lease.into(),
            detail,
        },
        _ => StoreError::Unavailable {
            lease: lease.into(),
            detail,
        },
    }
}

/// How the inotify thread tells a watch stream that something happened.
#[derive(Default)]
struct Signal {
    /// Woken on every relevant event; wake-ups coalesce into one pending
    /// permit, which is all the stream needs since it re-reads the record.
    wake: tokio::sync::Notify,
    /// Set when the watch broke, with the reason.
    broken: Mutex<Option<String>>,
}

impl Signal {
    fn break_with(&self, reason: String) {
        let mut broken = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        broken.get_or_insert(reason);
        drop(broken);
        self.wake.notify_one();
    }

    fn take_broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Starts an inotify watch on the directory that wakes `signal` whenever the
/// lease's record may have changed.
fn start_watcher(files: &LeaseFiles, signal: Arc<Signal>) -> Result<notify::RecommendedWatcher, StoreError> {
    let record_name: OsString = files
        .record
        .file_name()
        .expect("record path has a file name")
        .to_owned();
    let dir = files.dir.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                signal.break_with(format!("watch on {} failed: {e}", dir.display()));
                return;
            }
        };
        if event.need_rescan() {
            // Events were lost; ours may have been among them.
            signal.wake.notify_one();
            return;
        }
        let about_dir = event.paths.contains(&dir);
        if about_dir
            && matches!(
                event.kind,
                EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
            )
        {
            signal.break_with(format!("{} was removed or moved", dir.display()));
            return;
        }
        let about_record = event
            .paths
            .iter()
            .any(|p| p.file_name() == Some(record_name.as_os_str()));
        if about_record && may_change_content(&event.kind) {
            signal.wake.notify_one();
        }
    };
    let mut watcher = notify::recommended_watcher(handler).map_err(|e| StoreError::Unavailable {
        lease: files.lease.clone(),
        detail: format!("cannot start watching {}: {e}", files.dir.display()),
    })?;
    watcher
        .watch(&files.dir, RecursiveMode::NonRecursive)
        .map_err(|e| StoreError::Unavailable {
            lease: files.lease.clone(),
            detail: format!("cannot watch {}: {e}", files.dir.display()),
        })?;
    Ok(watcher)
}

/// Whether an event on the record file may mean its content changed.
/// Reads (opening, closing after reading, access times) do not: reacting to
/// them would make every read of the watch trigger the next.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    }
}

/// The state of a watch stream. Dropping it drops the inotify watcher.
struct WatchState {
    _watcher: notify::RecommendedWatcher,
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
    let ticket = state.seen.ticket(&files.lease);
    let observed = blocking(&files.lease.clone(), move || observe(&files))
        .await
        .map(|found| state.seen.found_since(&state.files.lease, ticket, found));
    Some((observed, state))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use futures::StreamExt;

    use super::*;
    use crate::store::deleted::floor_record;

    fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
        LeaseRecord {
            instance: None,
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(15),
            acquire_time: None,
            renew_time: Some(std::time::SystemTime::now()),
            term,
        }
    }

    fn store() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path().join("leases")).unwrap();
        (dir, store)
    }

    /// The watch's next observation that differs from `previous` (a watch
    /// may yield the same record again).
    async fn next_change(watch: &mut LeaseWatch, previous: &Option<Versioned>) -> Option<Versioned> {
        loop {
            let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
                .await
                .expect("watch yielded in time")
                .expect("watch still open")
                .expect("watch yielded a record");
            if &next != previous {
                return next;
            }
        }
    }

    /// The term floor in a floor file, as text.
    fn floor_in(lock: &Path) -> String {
        let text = fs::read_to_string(lock).unwrap();
        text.split_whitespace().next().unwrap_or_default().to_owned()
    }

    /// Writes `record` to a lease that has none: a create, or an update of
    /// what the store reads for a deleted lease (a tombstone or the term
    /// floor).
    async fn recreate(store: &EmbeddedStore, lease: &str, record: &LeaseRecord) -> Versioned {
        match store.get(lease).await.unwrap() {
            Some(gone) => store.update(lease, &gone.version, record).await.unwrap(),
            None => store.create(lease, record).await.unwrap(),
        }
    }

    /// The next item of a watch, failing the test after `secs` seconds.
    async fn next_within(watch: &mut LeaseWatch, secs: u64) -> Option<Versioned> {
        tokio::time::timeout(Duration::from_secs(secs), watch.next())
            .await
            .expect("watch yielded in time")
            .expect("watch still open")
            .expect("watch yielded a record")
    }

    #[test]
    fn lease_names() {
        for ok in ["a", "demo", "jobs.billing-1", "0", "a-b.c-d.e", &"a".repeat(253)] {
            assert_eq!(validate_lease_name(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "",
            "Demo",
            "-a",
            "a-",
            ".a",
            "a.",
            "a..b",
            "a.-b",
            "a_b",
            "a/b",
            "..",
            "a b",
            "é",
            &"a".repeat(254),
        ] {
            let err = validate_lease_name(bad).unwrap_err();
            assert!(err.contains("invalid lease name"), "{bad:?}: {err}");
        }
    }

    #[tokio::test]
    async fn invalid_names_are_refused() {
        let (_dir, store) = store();
        let r = record(Some("a"), 1);
        for bad in ["../escape", "UPPER", ""] {
            let errors = [
                store.get(bad).await.unwrap_err(),
                store.create(bad, &r).await.unwrap_err(),
                store.update(bad, "x-1", &r).await.unwrap_err(),
                store.watch(bad).await.err().unwrap(),
                store.delete(bad).await.unwrap_err(),
            ];
            for err in errors {
                match err {
                    StoreError::Refused { lease, .. } => assert_eq!(lease, bad),
                    other => panic!("{bad:?}: expected Refused, got {other:?}"),
                }
            }
        }
        assert!(fs::read_dir(store.dir()).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn create_get_update_conflict() {
        let (_dir, store) = store();
        assert!(store.describe().starts_with("embedded store at /"));
        assert_eq!(store.get("demo").await.unwrap(), None);

        let r1 = record(Some("host-a"), 1);
        let v1 = store.create("demo", &r1).await.unwrap();
        assert_eq!(v1.record, r1);
        assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));

        let err = store
            .create("demo", &record(Some("host-b"), 1))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));

        let r2 = record(Some("host-a"), 2);
        let v2 = store.update("demo", &v1.version, &r2).await.unwrap();
        assert_ne!(v2.version, v1.version);
        assert_eq!(v2.record, r2);
        assert_eq!(store.get("demo").await.unwrap(), Some(v2.clone()));

        // A stale version loses.
        let err = store
            .update("demo", &v1.version, &record(None, 9))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(store.get("demo").await.unwrap(), Some(v2.clone()));

        // Updating a lease that does not exist is a conflict too.
        let err = store.update("other", &v2.version, &r2).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(store.get("other").await.unwrap(), None);

        // Another store on the same directory sees the same thing.
        let again = EmbeddedStore::open(store.dir()).unwrap();
        assert_eq!(again.get("demo").await.unwrap(), Some(v2.clone()));

        // Deleted while held: read as its tombstone by the stores that saw
        // it, as free by one that did not.
        assert!(store.delete("demo").await.unwrap());
        assert!(!store.delete("demo").await.unwrap());
        let tombstone = Versioned {
            version: format!("{TOMBSTONE}{}", v2.version),
            record: r2,
        };
        assert_eq!(store.get("demo").await.unwrap(), Some(tombstone));
        let stranger = EmbeddedStore::open(store.dir()).unwrap();
        assert_eq!(stranger.get("demo").await.unwrap(), Some(floor_record(2)));
    }

    #[tokio::test]
    async fn list_returns_every_lease_and_ignores_other_files() {
        let (_dir, store) = store();
        assert!(store.list().await.unwrap().is_empty());
        let b = store.create("b.jobs", &record(Some("x"), 1)).await.unwrap();
        let a = store.create("a", &record(None, 0)).await.unwrap();
        fs::write(store.dir().join("README"), "hello").unwrap();
        fs::write(store.dir().join("Bad_Name.lease.json"), "{}").unwrap();
        fs::write(store.dir().join(".c.tmp"), "{").unwrap();
        fs::create_dir(store.dir().join("sub")).unwrap();
        let listed = store.list().await.unwrap();
        assert_eq!(listed, vec![("a".to_string(), a), ("b.jobs".to_string(), b)]);
    }

    /// One compare-and-swap increment of `term`, retried on conflict.
    /// Returns the version written.
    async fn increment(store: &EmbeddedStore, lease: &str) -> String {
        loop {
            let current = store.get(lease).await.unwrap().unwrap();
            let mut next = current.record.clone();
            next.term += 1;
            match store.update(lease, &current.version, &next).await {
                Ok(written) => return written.version,
                Err(e) if e.is_conflict() => tokio::task::yield_now().await,
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_updaters_lose_no_update() {
        const TASKS: usize = 3;
        const THREADS: usize = 3;
        const EACH: usize = 30;
        let (_dir, store) = store();
        store.create("counter", &record(None, 0)).await.unwrap();

        // Tasks sharing one store instance...
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut versions = Vec::new();
                for _ in 0..EACH {
                    versions.push(increment(&store, "counter").await);
                }
                versions
            }));
        }
        // ...and threads, each with its own runtime and store instance (its
        // own lock file descriptions, as a separate process would have).
        let mut threads = Vec::new();
        for _ in 0..THREADS {
            let dir = store.dir().to_path_buf();
            threads.push(std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let store = EmbeddedStore::open(dir).unwrap();
                    let mut versions = Vec::new();
                    for _ in 0..EACH {
                        versions.push(increment(&store, "counter").await);
                    }
                    versions
                })
            }));
        }

        let mut versions = HashSet::new();
        for task in tasks {
            for v in task.await.unwrap() {
                assert!(versions.insert(v), "version repeated");
            }
        }
        for thread in threads {
            for v in tokio::task::spawn_blocking(move || thread.join().unwrap())
                .await
                .unwrap()
            {
                assert!(versions.insert(v), "version repeated");
            }
        }
        let last = store.get("counter").await.unwrap().unwrap();
        assert_eq!(last.record.term as usize, (TASKS + THREADS) * EACH);
        assert_eq!(versions.len(), (TASKS + THREADS) * EACH);
    }

    #[tokio::test]
    async fn a_record_deleted_while_held_reads_as_a_tombstone_until_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let holder = EmbeddedStore::open(dir.path()).unwrap();
        let follower = EmbeddedStore::open(dir.path()).unwrap();
        let held = holder.create("demo", &record(Some("a"), 7)).await.unwrap();
        let mut watch = follower.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 5).await, Some(held.clone()));
        fs::remove_file(dir.path().join("demo.lease.json")).unwrap();

        // Every reader that saw the record reads the same tombstone, again
        // and again.
        let tomb_version = format!("{TOMBSTONE}{}", held.version);
        let tombstone = Some(Versioned {
            version: tomb_version.clone(),
            record: held.record.clone(),
        });
        assert_eq!(next_change(&mut watch, &Some(held.clone())).await, tombstone);
        assert_eq!(follower.get("demo").await.unwrap(), tombstone);
        assert_eq!(holder.get("demo").await.unwrap(), tombstone);
        assert_eq!(holder.get("demo").await.unwrap(), tombstone);
        // One that never saw it finds the lease free, at the highest term
        // it ever had.
        let stranger = EmbeddedStore::open(dir.path()).unwrap();
        assert_eq!(stranger.get("demo").await.unwrap(), Some(floor_record(7)));

        // Updating the tombstone writes the record again; updating it once
        // more, or updating a tombstone this store never reported, conflicts.
        let again = holder
            .update("demo", &tomb_version, &record(Some("a"), 7))
            .await
            .unwrap();
        assert_ne!(again.version, held.version);
        // (The watch may yield the tombstone again first.)
        let mut seen = next_within(&mut watch, 5).await;
        while seen != Some(again.clone()) {
            assert!(
                seen.as_ref()
                    .is_some_and(|v| v.version.starts_with(&tomb_version)),
                "{seen:?}"
            );
            seen = next_within(&mut watch, 5).await;
        }
        let err = follower
            .update("demo", &tomb_version, &record(Some("b"), 8))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        let err = stranger
            .update("demo", &tomb_version, &record(Some("b"), 8))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(holder.get("demo").await.unwrap(), Some(again));

        // A record deleted without a holder reads as released at its term.
        let released = holder
            .update(
                "demo",
                &holder.get("demo").await.unwrap().unwrap().version,
                &record(None, 7),
            )
            .await
            .unwrap();
        assert_eq!(follower.get("demo").await.unwrap(), Some(released));
        fs::remove_file(dir.path().join("demo.lease.json")).unwrap();
        assert_eq!(follower.get("demo").await.unwrap(), Some(floor_record(7)));
        assert_eq!(holder.get("demo").await.unwrap(), Some(floor_record(7)));

        // Taking it over is a create, at a higher term; the floor follows.
        let taken = stranger
            .update("demo", &floor_record(7).version, &record(Some("c"), 8))
            .await
            .unwrap();
        assert_eq!(taken.record.term, 8);
        assert!(
            stranger
                .update("demo", &floor_record(7).version, &record(Some("d"), 8))
                .await
                .unwrap_err()
                .is_conflict()
        );
        fs::remove_file(dir.path().join("demo.lease.json")).unwrap();
        assert_eq!(
            EmbeddedStore::open(dir.path())
                .unwrap()
                .get("demo")
                .await
                .unwrap(),
            Some(floor_record(8))
        );
        // A lease that never existed is just missing.
        assert_eq!(stranger.get("never").await.unwrap(), None);
    }

    #[tokio::test]
    async fn terms_never_go_back_or_repeat_across_deletions() {
        let dir = tempfile::tempdir().unwrap();
        let a = EmbeddedStore::open(dir.path()).unwrap();
        let b = EmbeddedStore::open(dir.path()).unwrap();
        let record_file = dir.path().join("demo.lease.json");
        a.create("demo", &record(None, 5)).await.unwrap();
        fs::remove_file(&record_file).unwrap();
        // b sees the lease released at term 5; a plain create is refused.
        let seen_by_b = b.get("demo").await.unwrap().unwrap();
        assert_eq!(seen_by_b, floor_record(5));
        assert!(
            b.create("demo", &record(Some("b"), 1))
                .await
                .unwrap_err()
                .is_conflict()
        );
        // a takes term 6 and its record is deleted before b reads again:
        // b's take-over at term 6 conflicts, and its next read shows 6.
        let seen_by_a = a.get("demo").await.unwrap().unwrap();
        a.update("demo", &seen_by_a.version, &record(Some("a"), 6))
            .await
            .unwrap();
        fs::remove_file(&record_file).unwrap();
        let err = b
            .update("demo", &seen_by_b.version, &record(Some("b"), 6))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        let again = b.get("demo").await.unwrap().unwrap();
        assert_eq!(again, floor_record(6));
        // A term below the floor is refused outright.
        let err = b
            .update("demo", &again.version, &record(Some("b"), 2))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("terms never go back"), "{err}");
        let taken = b
            .update("demo", &again.version, &record(Some("b"), 7))
            .await
            .unwrap();

        // A floor that is not a number (garbled by hand): renewals go on
        // (they do not touch the floor), a new term is refused naming the
        // file and the fix, and the floor is left as it is.
        fs::write(dir.path().join(".demo.floor"), "not a number\n").unwrap();
        let renewed = b
            .update("demo", &taken.version, &record(Some("b"), 7))
            .await
            .unwrap();
        let err = b
            .update("demo", &renewed.version, &record(Some("c"), 8))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, StoreError::Refused { .. })
                && text.contains(".demo.floor")
                && text.contains("expected the term floor")
                && text.contains("write the two numbers there"),
            "{text}"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join(".demo.floor")).unwrap(),
            "not a number\n"
        );
    }

    #[tokio::test]
    async fn the_floor_in_an_older_lock_file_is_read_and_moved_to_the_floor_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        // An older baton kept the numbers in the lock file, padded.
        fs::write(dir.path().join(".demo.lock"), format!("{:>20} {:>20}\n", 12, 3)).unwrap();
        assert_eq!(store.get("demo").await.unwrap(), Some(floor_record(12)));
        let err = store.create("demo", &record(Some("a"), 1)).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
        store
            .update("demo", &floor_record(12).version, &record(Some("a"), 13))
            .await
            .unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join(".demo.floor")).unwrap(),
            "13 4\n"
        );
    }

    #[tokio::test]
    async fn a_poller_that_misses_a_rewrite_and_second_deletion_dates_the_holder_again() {
        let dir = tempfile::tempdir().unwrap();
        let holder = EmbeddedStore::open(dir.path()).unwrap();
        let poller = EmbeddedStore::open(dir.path()).unwrap();
        let record_file = dir.path().join("demo.lease.json");
        let held = holder.create("demo", &record(Some("h"), 4)).await.unwrap();
        assert_eq!(poller.get("demo").await.unwrap(), Some(held));
        fs::remove_file(&record_file).unwrap();
        let first = poller.get("demo").await.unwrap().unwrap();
        assert!(first.version.starts_with(TOMBSTONE));
        assert_eq!(
            poller.get("demo").await.unwrap(),
            Some(first.clone()),
            "no change, same version"
        );
        // The holder writes its record again; it is deleted again before
        // the poller reads: the poller's next read is a new version, so it
        // dates the holder's lease from then, not from the first deletion.
        let tomb = holder.get("demo").await.unwrap().unwrap();
        holder
            .update("demo", &tomb.version, &record(Some("h"), 4))
            .await
            .unwrap();
        fs::remove_file(&record_file).unwrap();
        let second = poller.get("demo").await.unwrap().unwrap();
        assert_ne!(second.version, first.version);
        assert_eq!(second.record, first.record);
        assert_eq!(poller.get("demo").await.unwrap(), Some(second));
    }

    /// The child's half of the test below: raises the floor of lease
    /// `demo` in `dir` without end, under the lock, as every writer does.
    fn raise_the_floor_forever(dir: &Path) -> ! {
        let store = EmbeddedStore::open(dir).unwrap();
        let files = store.files("demo").unwrap();
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&files.lock)
            .unwrap();
        loop {
            take_lock(&files, &lock, false, || None).unwrap();
            let state = read_lock_state(&files, &lock).unwrap();
            write_lock_state(
                &files,
                LockState {
                    floor: state.floor + 1,
                    creates: state.creates + 1,
                },
            )
            .unwrap();
            lock.unlock().unwrap();
        }
    }

    #[test]
    fn a_writer_killed_at_any_point_leaves_a_readable_floor() {
        const CHILD: &str = "BATON_TEST_FLOOR_WRITER";
        const NAME: &str = "store::embedded::tests::a_writer_killed_at_any_point_leaves_a_readable_floor";
        if let Some(dir) = std::env::var_os(CHILD) {
            raise_the_floor_forever(Path::new(&dir));
        }
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let files = store.files("demo").unwrap();
        let mut last = 0;
        for round in 0..40 {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, dir.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // Killed at a random moment: in a write, a rename, an fsync or
            // between them.
            std::thread::sleep(Duration::from_micros(rand::random_range(20_000..60_000)));
            child.kill().unwrap();
            child.wait().unwrap();
            let lock = File::open(&files.lock).unwrap();
            let state = read_lock_state(&files, &lock)
                .unwrap_or_else(|e| panic!("after the writer was killed in round {round}: {e}"));
            assert!(
                state.floor >= last,
                "the floor went back from {last} to {}",
                state.floor
            );
            assert_eq!(state.floor, state.creates, "the two numbers were written apart");
            last = state.floor;
        }
        // (The child did write: the test is not vacuous.)
        assert!(last > 40, "the writers raised the floor only to {last}");
        println!("a writer killed 40 times: the floor reads {last}, never torn");
    }

    #[tokio::test]
    async fn a_lost_floor_is_restored_and_never_blocks_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let lock = dir.path().join(".demo.floor");
        let record_file = dir.path().join("demo.lease.json");
        let held = store.create("demo", &record(Some("a"), 9)).await.unwrap();
        // The floor emptied by hand:
        // a renewal writes it again.
        fs::write(&lock, "").unwrap();
        let renewed = store
            .update("demo", &held.version, &record(Some("a"), 9))
            .await
            .unwrap();
        assert_eq!(floor_in(&lock), "9");
        // Emptied again, then the record deleted while held: the holder
        // still writes it again in its term, and the floor is back.
        fs::write(&lock, "").unwrap();
        fs::remove_file(&record_file).unwrap();
        let tombstone = store.get("demo").await.unwrap().unwrap();
        assert_eq!(tombstone.version, format!("{TOMBSTONE}{}", renewed.version));
        store
            .update("demo", &tombstone.version, &record(Some("a"), 9))
            .await
            .unwrap();
        assert_eq!(floor_in(&lock), "9");
    }

    #[tokio::test]
    async fn versions_never_repeat_after_delete_and_recreate() {
        let (_dir, store) = store();
        let mut seen = HashSet::new();
        let mut stale = Vec::new();
        for round in 0..3 {
            let mut v = recreate(&store, "demo", &record(None, 3 * round)).await;
            assert!(seen.insert(v.version.clone()));
            for i in 0..3 {
                stale.push(v.version.clone());
                v = store
                    .update("demo", &v.version, &record(None, 3 * round + i))
                    .await
                    .unwrap();
                assert!(seen.insert(v.version.clone()));
            }
            stale.push(v.version.clone());
            // Delete through the store, then behind its back.
            if round % 2 == 0 {
                assert!(store.delete("demo").await.unwrap());
            } else {
                fs::remove_file(store.dir().join("demo.lease.json")).unwrap();
            }
        }
        let current = recreate(&store, "demo", &record(None, 9)).await;
        assert!(!seen.contains(&current.version));
        for old in stale {
            let err = store.update("demo", &old, &record(None, 7)).await.unwrap_err();
            assert!(err.is_conflict(), "{err}");
        }
    }

    #[tokio::test]
    async fn malformed_record_is_reported_with_lease_and_path() {
        let (_dir, store) = store();
        let v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let path = store.dir().join("demo.lease.json");
        let full = fs::read(&path).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("truncated", full[..full.len() / 2].to_vec()),
            ("garbage", b"\x00\xffnot json".to_vec()),
            ("wrong shape", br#"{"holder": "a"}"#.to_vec()),
            (
                "bad incarnation",
                String::from_utf8(full.clone())
                    .unwrap()
                    .replace(&v.version[..16], "../x")
                    .into_bytes(),
            ),
        ];
        for (what, bytes) in cases {
            fs::write(&path, &bytes).unwrap();
            let errors = [
                store.get("demo").await.unwrap_err(),
                store.create("demo", &v.record).await.unwrap_err(),
                store.update("demo", &v.version, &v.record).await.unwrap_err(),
                store.list().await.unwrap_err(),
                store
                    .watch("demo")
                    .await
                    .unwrap()
                    .next()
                    .await
                    .unwrap()
                    .unwrap_err(),
            ];
            for err in errors {
                match &err {
                    StoreError::Malformed { lease, detail } => {
                        assert_eq!(lease, "demo", "{what}");
                        assert!(detail.contains(&path.display().to_string()), "{what}: {detail}");
                    }
                    other => panic!("{what}: expected Malformed, got {other:?}"),
                }
            }
            // Nothing was overwritten.
            assert_eq!(fs::read(&path).unwrap(), bytes, "{what}");
        }
        // An operator can clear it.
        assert!(store.delete("demo").await.unwrap());
        recreate(&store, "demo", &v.record).await;
    }

    #[tokio::test]
    async fn leftover_temp_file_is_ignored_and_replaced() {
        let (_dir, store) = store();
        let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        // As if a writer died after writing half of its temporary file.
        let temp = store.dir().join(".demo.tmp");
        fs::write(&temp, "{\"incarnation\": \"dead").unwrap();
        assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));
        assert_eq!(
            store.list().await.unwrap(),
            vec![("demo".to_string(), v1.clone())]
        );
        let v2 = store
            .update("demo", &v1.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(store.get("demo").await.unwrap(), Some(v2));
        assert!(!temp.exists(), "the next write cleaned it up");

        // A temporary file of a lease that has no record yet.
        fs::write(store.dir().join(".fresh.tmp"), "junk").unwrap();
        assert_eq!(store.get("fresh").await.unwrap(), None);
        store.create("fresh", &record(None, 0)).await.unwrap();
        assert!(!store.dir().join(".fresh.tmp").exists());
    }

    #[tokio::test]
    async fn abandoned_update_does_not_write() {
        let (_dir, store) = store();
        let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        // Hold the lease's lock as another process would.
        let lock = File::options()
            .read(true)
            .write(true)
            .open(store.dir().join(".demo.lock"))
            .unwrap();
        lock.lock().unwrap();
        let attempt = tokio::time::timeout(
            Duration::from_millis(100),
            store.update("demo", &v1.version, &record(Some("b"), 2)),
        )
        .await;
        assert!(attempt.is_err(), "the update waits for the lock");
        lock.unlock().unwrap();
        // Give the blocked thread time to get the lock and give up.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.get("demo").await.unwrap(), Some(v1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_sees_changes_from_another_store() {
        let (_dir, watcher_store) = store();
        let writer = EmbeddedStore::open(watcher_store.dir()).unwrap();
        let mut watch = watcher_store.watch("demo").await.unwrap();

        // First the current state: nothing yet.
        assert_eq!(next_within(&mut watch, 1).await, None);

        let created = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        // The create may surface as more than one event; wait for its record.
        let mut seen = next_within(&mut watch, 1).await;
        while seen.as_ref() != Some(&created) {
            seen = next_within(&mut watch, 1).await;
        }

        // Reading the record (opening it) is not a change.
        writer.get("demo").await.unwrap();
        watcher_store.get("demo").await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(200), async {
            loop {
                let seen = watch.next().await.unwrap().unwrap();
                // Leftover wake-ups from the create may re-yield it.
                assert_eq!(seen.as_ref(), Some(&created));
            }
        })
        .await;
        assert!(quiet.is_err(), "the watch stays quiet without writes");

        let mut latencies = Vec::new();
        let mut current = created;
        for i in 0..20 {
            let started = Instant::now();
            let updated = writer
                .update("demo", &current.version, &record(Some("a"), 2 + i))
                .await
                .unwrap();
            let written = started.elapsed();
            let mut seen = next_within(&mut watch, 1).await;
            while seen.as_ref() != Some(&updated) {
                seen = next_within(&mut watch, 1).await;
            }
            let latency = started.elapsed();
            assert!(latency < Duration::from_secs(1));
            latencies.push((latency, written));
            current = updated;
        }
        latencies.sort();
        println!(
            "watch latency from start of update (update call itself): min {:?} ({:?}), \
             median {:?} ({:?}), max {:?} ({:?})",
            latencies[0].0,
            latencies[0].1,
            latencies[10].0,
            latencies[10].1,
            latencies[19].0,
            latencies[19].1,
        );

        // Deletion through a store, and behind its back: a record deleted
        // while held is seen as its tombstone, one without a holder as gone.
        let started = Instant::now();
        assert!(writer.delete("demo").await.unwrap());
        while next_within(&mut watch, 1)
            .await
            .is_none_or(|v| !v.version.starts_with(TOMBSTONE))
        {}
        println!("watch saw deletion after {:?}", started.elapsed());

        let again = recreate(&writer, "demo", &record(None, 21)).await;
        while next_within(&mut watch, 1).await != Some(again.clone()) {}
        fs::remove_file(writer.dir().join("demo.lease.json")).unwrap();
        while next_within(&mut watch, 1).await != Some(floor_record(21)) {}
    }

    #[tokio::test]
    async fn watch_yields_current_record_first_and_ignores_other_leases() {
        let (_dir, store) = store();
        let v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let other = store.create("demo.other", &record(None, 0)).await.unwrap();
        let mut watch = store.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 1).await, Some(v.clone()));
        store
            .update("demo.other", &other.version, &record(None, 1))
            .await
            .unwrap();
        store.create("demox", &record(None, 0)).await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(200), watch.next()).await;
        assert!(quiet.is_err(), "other leases do not wake the watch");
    }

    #[tokio::test]
    async fn watch_breaks_when_directory_is_removed() {
        let (_dir, store) = store();
        let mut watch = store.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 1).await, None);
        fs::remove_dir(store.dir()).unwrap();
        let item = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match watch.next().await {
                    Some(Ok(_)) => continue,
                    other => return other,
                }
            }
        })
        .await
        .unwrap();
        match item {
            Some(Err(StoreError::Unavailable { lease, .. })) => assert_eq!(lease, "demo"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(watch.next().await.is_none(), "the stream ends after the error");
    }
}
