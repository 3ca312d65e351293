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
//! - `demo.lease/`: the lease. Each write of its record adds a *version
//!   file* here, `00000000000000000042.json` (20 digits: the write's
//!   counter), holding the [`LeaseRecord`] as JSON with the version it was
//!   written at: a random *incarnation* id chosen when the lease is created
//!   and the counter. The newest version file is the record; older ones are
//!   removed a few writes later (their files taken for new versions, see
//!   [What a write costs](#what-a-write-costs)). The version string is
//!   `<incarnation>-<counter>`, so it never repeats for a lease, even when
//!   the lease is deleted and created again. Deleting the directory deletes
//!   the lease.
//! - `.demo.terms/`: empty files named by term, the highest of which is the
//!   lease's *term floor* (with the floor file's): the highest term ever
//!   written, so that terms survive the lease's deletion. Only the highest
//!   few are kept.
//! - `.demo.floor`: two decimal numbers: a term floor written when the lease
//!   is created, and how many times it was created, so that a reader that
//!   finds no record twice knows whether it was created in between.
//!   Replaced whole (`.demo.floor.tmp` while it is being written). A lock
//!   file of an older baton holds these numbers itself; it is read while
//!   there is no floor file.
//! - `.demo.lock`: locked (advisory `flock`) while the lease is created or
//!   deleted, never while it is written. It is never deleted: deleting a
//!   lock file while someone waits on it would let two writers hold "the"
//!   lock.
//!
//! An older baton kept the record in `demo.lease.json`, replaced whole under
//! the lock; [`EmbeddedStore::open`] moves such a record into `demo.lease/`
//! (same version). Every host of one directory must run a baton that agrees
//! on the layout: upgrade them together.
//!
//! # Compare-and-swap without a lock
//!
//! A write of version *n + 1* over version *n* creates the name of version
//! *n + 1* with `link(2)`, which fails if the name exists: of two writers
//! that read version *n*, one wins, whichever of them is slower. Nothing is
//! held across the write, so a writer stopped in the middle of it (`SIGSTOP`,
//! a frozen VM) blocks no one: the others go on writing, and take the lease
//! over once its holder's lease duration has passed. When the stopped
//! writer resumes, its write cannot land: either the name it links exists
//! (the link fails), or it was removed as an old version a while ago and the
//! link re-creates an old version below the newest, which the writer sees
//! right after linking and reports as a conflict (readers only ever read the
//! newest). Each version names the write it replaced (a random id per
//! write), so a writer can tell its own version replaced by the next one
//! from a stale link; in the one case it cannot tell (its version already
//! removed again, a dozen writes in the moment between its link and its
//! check), it reports the outcome unknown ([`StoreError::Unavailable`]),
//! as for a timeout. The lease's directory is opened once per write and the
//! link made in it, so a write cannot land in a lease deleted (and perhaps
//! created again) since it read the record: links into a removed directory
//! fail, and one moved away is told apart by its inode.
//!
//! A create (the first write of a lease, or the first after its deletion)
//! builds the new lease directory under another name and moves it into
//! place with `renameat2(RENAME_NOREPLACE)`, under the lock, which
//! serialises creates (they also check and raise the floor file). A process
//! stopped in the middle of a create delays the lease's creation, not its
//! take-over. Deleting, through [`EmbeddedStore::delete`], moves the
//! directory aside under the lock, then removes it.
//!
//! # Crash safety
//!
//! A version file is written whole before it gets its version's name: as
//! an unnamed temporary file (`O_TMPFILE`, in the lease's directory), then
//! linked through `/proc/self/fd/<fd>` (`linkat(AT_SYMLINK_FOLLOW)`, as
//! `open(2)` describes: no capability needed). A process killed at any
//! point leaves either the old newest version or the new one, never a torn
//! one, and nothing else: an unnamed file vanishes with its process. Where
//! that cannot be done (a file system without `O_TMPFILE`, a process
//! without `/proc`), the store falls back for good to a temporary name
//! (`.tmp-<random>`), linked and then removed; temporary files older than a
//! minute, left by a writer that died or stopped, are removed by the next
//! writer. A writer stopped between writing its file and linking it gets
//! the outcome described above either way (a stopped writer's named file
//! removed meanwhile makes its link fail; an unnamed one makes it land as a
//! stale version below the newest, reported as a conflict).
//!
//! A *renewal* (same holder, same term) is not fsynced: the link alone
//! makes it visible to every process, and what a crash of the machine could
//! lose of it (a later renew time) matters to no one, since every process
//! on the machine is gone with it. Fsync latency is the one stall of this
//! store that a healthy machine shows: under heavy writeback (right after
//! a build wrote gigabytes) renewals here took over 200 ms each, one after
//! another for more than a second, longer than a short renew deadline; with
//! 1.5 GB being written, a write-fsync-rename-fsync took 2 ms at the median
//! and 115 ms at most. A write that starts a term, changes the holder or
//! releases the lease is fsynced (file and directory), and a new term is
//! recorded in `.demo.terms/` (fsynced) before the version that starts it,
//! so that terms never go back after a crash. Readers do not lock: they
//! read the newest complete version (only a reader that finds no record
//! takes a shared lock, to read the floor file).
//!
//! After a crash of the machine, the newest versions, if renewals, may be
//! empty, cut short or hold an older version's bytes (their names
//! committed, their data not: delayed allocation, or a recycled file's old
//! block). A newest version that cannot be read is taken for such a
//! *torn renewal* when only an unsynced renewal can have written it: the
//! newest version below it that can be read names a holder, and the term
//! floor is not above that version's term (no write after it started a
//! term; a release is fsynced and is never torn). It then reads as that
//! version, renewed under the torn version's counter: readers date it when
//! they first see it, so the lease runs out a lease duration later unless
//! its holder (alive after all) renews, and the next write is the version
//! after the torn one (`link` as for any write), in a term above the
//! floor. So that some version is left to read, each version names the
//! newest fsynced one at or below it (`durable`), and that one's file is
//! never taken for a renewal nor removed until a newer fsynced version is
//! on disk: a lease keeps it beside the newest 17 (a real ext4 shutdown
//! after 8 s of renewals left 15 of 16 kept versions unreadable). Any other unreadable newest version (a garbled version with no
//! holder or a higher floor below it, the only version) stays an error:
//! baton never writes over what it cannot read.
//!
//! # Deleted records
//!
//! A lease deleted while it had a holder reads as a tombstone, as
//! described in [Deleted records](super#deleted-records): each store
//! remembers the last record it read or wrote of each lease, and a holder
//! whose record vanished writes it again (a new incarnation, same term) at
//! its next renewal. A tombstone gets a new version (`+N`), dated anew by
//! the elector, when the floor file's create count shows the lease was
//! created again since the last read: written and deleted again in
//! between, which a reader may have missed.
//!
//! A missing lease with a term floor (it existed and was deleted) reads as a
//! released record at that term, under the version
//! [`TOMBSTONE`]`term-<floor>`: free to take, and the next holder writes
//! the floor plus one. So a term number is never reused, even when every
//! process that knew the old terms is gone, as long as the floor is kept.
//!
//! # What a write costs
//!
//! An update that is not a renewal of this store's own last write opens
//! the lease's directory, lists it (`getdents64`) and reads the newest
//! version (then checks that the version's name is still that file's,
//! below); reads the floor file (and lists the term marks only if the floor
//! file is below the record's term); takes the file of the version the
//! write removes, writes and links it; checks that the directory is still
//! the lease's (`fstat`, `stat`), lists it again from its start through the
//! same descriptor, and removes any older version left: 25 system calls
//! (29 in a debug build, whose standard library checks each descriptor it
//! closes).
//!
//! # Renewals
//!
//! A renewal (same holder, instance and term) over the version this same
//! store wrote last, the store's steady work (one per lease per retry
//! period), reads nothing first: the store keeps what it wrote, with the
//! identity (inode and birth time, `statx`) of the lease's directory and of
//! the version's file. It opens the directory and checks that it is the
//! same one (a lease deleted and created again, even up to the same
//! counter, is another directory), takes the file of the version 17 below
//! (the oldest kept, if the versions are as it left them), writes and links
//! the next version, and then checks that the directory is still at the
//! lease's path and that its own last version still has its name. If it
//! does, no later version was removed before the link (versions are
//! removed lowest first), so the link made the version after its own: the
//! write landed over the record it expected. If it does not, the store
//! lists and checks as [`confirm`] does for every other write. 13 system
//! calls (15 in a debug build), and no JSON read. The floor is not read
//! either: a store keeps its last write only after it found the floor at
//! or above that write's term (raising it if it was not), and a renewal
//! keeps the term. A write of another store, or any write that fails,
//! makes the next write read first again. Temporary files left by writers
//! that died are removed by the next write that reads first (at the latest
//! the first write of the next term).

//! A write allocates no inode and frees none once a lease has its kept
//! versions: it renames the file of the version it removes (the oldest) to
//! a temporary name, overwrites it with the new version (cutting it to the
//! new length), and links it under the new version's name, as a named
//! temporary file. On ext4 without a journal, allocating an inode was the
//! biggest part of a renewal's CPU time: the allocator skips every free
//! inode of the block group that was freed within the last seconds
//! (minutes while the inode table is dirty), one lookup each, and each
//! write freed one. The price is on the reading side: a reader that opened
//! an old version just before its file was taken could read the new
//! version's contents, or a mix, under the old name. So every read checks,
//! after reading, that the version's name still refers to the file it read
//! (listed or opened): the name goes first, the contents change only after
//! that, and a name never comes back to the same file. A read that fails
//! the check starts over, as a read of a version removed meanwhile does.
//! The first writes of a lease, and a write that finds its version's file
//! taken by another writer first, use a new file (`O_TMPFILE`).

//! # Watching
//!
//! [`LeaseStore::watch`] uses inotify on the store's directory (for the
//! lease's directory appearing, vanishing or being replaced) and on the
//! lease's directory (for new versions), and re-reads the record on every
//! event that may have changed it; there is no polling. All the watches of
//! one store share one inotify instance and one thread, which wakes only
//! the watches an event may concern (see `watch.rs` for exactly which
//! events it ignores). The kernel reports no reads (opens, listings, closes
//! after reading), so reading wakes no one. A write of this same store
//! wakes none of its watches: its writer has the record already (the
//! creation of the name it links is matched, and read after all if its
//! link lost to another writer's, or if more than 32 writes of the lease
//! ran ahead of the inotify thread); the removal of old versions below one
//! known to exist wakes no one either. A renewal on an otherwise idle store
//! thus makes one wake-up of the inotify thread (its version's creation and
//! the old version's removal, in one read) and no read.

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
use crate::logging::human;

mod watch;

/// Name suffix of a lease's directory.
const LEASE_SUFFIX: &str = ".lease";

/// Name suffix of a lease's record in an older baton (see
/// [`EmbeddedStore::open`]).
const LEGACY_SUFFIX: &str = ".lease.json";

/// How many versions below the newest are kept. Enough that a writer can
/// tell, right after its link, whether the next version was written over
/// its own (see [`confirm`]) unless this many writes came in that moment;
/// few enough that reading the directory stays cheap.
const KEPT_VERSIONS: u64 = 16;

/// How many of the highest term marks are kept in `.<lease>.terms/`.
const KEPT_TERM_MARKS: usize = 4;

/// How old a temporary file must be before a writer removes it as left by
/// a writer that died or stopped. A write takes milliseconds; a writer
/// stopped for longer loses its write (its link finds no file), which is
/// what it would get anyway after its lease ran out.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// How many times a read starts over when the newest version it listed was
/// removed before it could open it (a dozen writes in between).
const READ_ATTEMPTS: usize = 100;

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

/// What is stored in a version file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredRecord {
    /// Chosen at random when the lease is created.
    incarnation: String,
    /// 1 when created, plus one with each update.
    counter: u64,
    /// Chosen at random for each write (empty in records of an older baton).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    write: String,
    /// The `write` id of the version this one replaced (empty for the first).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    replaced: String,
    /// The counter of the newest fsynced version at or below this one (its
    /// own if it was fsynced; 0: not known, written by an older baton). That
    /// version's file is never taken for a new version nor removed while it
    /// is the newest fsynced one, so that a crash that tears every renewal
    /// after it leaves it to read (see [Crash safety](self#crash-safety)).
    #[serde(default, skip_serializing_if = "is_zero")]
    durable: u64,
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

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A fresh random id, as 16 hex digits.
fn random_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The name of the version file of `counter`.
fn version_name(counter: u64) -> String {
    format!("{counter:020}.json")
}

/// The counter of a version file's name, if it is one.
fn version_counter(name: &[u8]) -> Option<u64> {
    // Run for every entry of every listing: plain arithmetic.
    let digits = name.strip_suffix(b".json")?;
    if digits.len() != 20 {
        return None;
    }
    let mut counter: u64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        counter = counter.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
    }
    Some(counter)
}

/// The files of one (validated) lease.
#[derive(Clone, Debug)]
struct LeaseFiles {
    lease: String,
    /// The store's directory.
    dir: PathBuf,
    /// The lease's directory, holding its versions.
    versions: PathBuf,
    /// The term marks.
    terms: PathBuf,
    lock: PathBuf,
    floor: PathBuf,
    floor_temp: PathBuf,
    /// The record of an older baton.
    legacy: PathBuf,
}

impl LeaseFiles {
    /// The path of a version file, for messages.
    fn version_path(&self, counter: u64) -> PathBuf {
        self.versions.join(version_name(counter))
    }
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
        validate_lease_name(lease).map_err(|detail| StoreError::Refused {
            lease: lease.into(),
            detail,
        })?;
        Ok(LeaseFiles {
            lease: lease.into(),
            dir: self.dir.to_path_buf(),
            versions: self.dir.join(format!("{lease}{LEASE_SUFFIX}")),
            terms: self.dir.join(format!(".{lease}.terms")),
            lock: self.dir.join(format!(".{lease}.lock")),
            floor: self.dir.join(format!(".{lease}.floor")),
            floor_temp: self.dir.join(format!(".{lease}.floor.tmp")),
            legacy: self.dir.join(format!("{lease}{LEGACY_SUFFIX}")),
        })
    }

    /// Moves every record of an older baton into its lease's directory.
    fn move_legacy_records(&self) -> Result<(), StoreError> {
        for files in self.leases_named(LEGACY_SUFFIX)? {
            with_lock(&files, &|| None, move_legacy_record)?;
        }
        Ok(())
    }

    /// The files of every lease with an entry named `<lease><suffix>` in
    /// the directory; names that no store of ours would have written are
    /// left out.
    fn leases_named(&self, suffix: &str) -> Result<Vec<LeaseFiles>, StoreError> {
        let cannot = |e| io_error(ANY_LEASE, "cannot list", self.dir(), e);
        let mut leases = Vec::new();
        for entry in fs::read_dir(self.dir()).map_err(cannot)? {
            let name = entry.map_err(cannot)?.file_name();
            if let Some(files) = name
                .to_str()
                .and_then(|n| n.strip_suffix(suffix))
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
            return self.create_at(lease, record, floor).await;
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
            for files in store.leases_named(LEASE_SUFFIX)? {
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
            let named = store.leases_named(LEASE_SUFFIX)?;
            for files in named.into_iter().filter(|f| f.lease.starts_with(&prefix)) {
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
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&files.lock)
        .map_err(|e| io_error(&files.lease, "cannot open lock file", &files.lock, e))?;
    take_lock(files, &lock, false, give_up)?;
    let result = work(files);
    // Closing the file would release the lock too; be explicit.
    let _ = lock.unlock();
    result
}

/// Reads a lease's record and, if there is none, its [`LockState`] (zeros
/// if it has none), the latter under a shared lock so that a create's state
/// is never read half-written.
fn observe(files: &LeaseFiles) -> Result<Found, StoreError> {
    let missing = |state: LockState| Found::Missing {
        last: None,
        floor: Some(state.floor),
        creates: Some(state.creates),
    };
    if let Some((_, stored, _)) = read_current(files)? {
        return Ok(Found::Record(stored.into_versioned()));
    }
    let lock = match File::open(&files.lock) {
        Ok(lock) => lock,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(missing(read_lock_state(files)?)),
        Err(e) => return Err(io_error(&files.lease, "cannot open lock file", &files.lock, e)),
    };
    // Give up after a while, as a timeout would.
    let deadline = Instant::now() + SHARED_LOCK_WAIT;
    take_lock(files, &lock, true, &|| {
        (Instant::now() >= deadline).then(|| {
            format!(
                "{} stayed locked by a create or delete for {}",
                files.lock.display(),
                human(SHARED_LOCK_WAIT)
            )
        })
    })?;
    let result = match read_current(files) {
        // Created while we waited for the lock.
        Ok(Some((_, stored, _))) => Ok(Found::Record(stored.into_versioned())),
        Ok(None) => read_lock_state(files).map(missing),
        Err(e) => Err(e),
    };
    let _ = lock.unlock();
    result
}

/// What is kept of a lease besides its record: the term floor (the highest
/// term ever written) and how many times the record was created. Both only
/// grow. The floor is the higher of the term marks (`.<lease>.terms/`) and
/// the floor file's; the count is the floor file's, replaced whole (write,
/// fsync, rename) under the lease's lock, so that a writer killed at any
/// point leaves the old state or the new one. Before the floor file, both
/// were written in place into the lock file: such a lock file is read
/// while there is no floor file, and the next create moves them over. No
/// state at all reads as zeros; one written before the create count reads
/// as count 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LockState {
    floor: u64,
    creates: u64,
}

/// Reads the [`LockState`] in a lease's floor file (or the lock file of an
/// older baton), without the term marks.
fn read_floor_file(files: &LeaseFiles) -> Result<LockState, StoreError> {
    // Two numbers of at most 20 digits each; anything longer is wrong.
    const MOST: u64 = 128;
    let read = |path: &Path| -> Result<Option<String>, StoreError> {
        match File::open(path) {
            Ok(file) => {
                let mut bytes = Vec::new();
                file.take(MOST)
                    .read_to_end(&mut bytes)
                    .map_err(|e| io_error(&files.lease, "cannot read", path, e))?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&files.lease, "cannot read", path, e)),
        }
    };
    let (path, text) = match read(&files.floor)? {
        Some(text) => (&files.floor, text),
        None => (&files.lock, read(&files.lock)?.unwrap_or_default()),
    };
    parse_lock_state(files, path, &text)
}

/// Reads a lease's [`LockState`]: the floor file (or the lock file of an
/// older baton) and the term marks.
fn read_lock_state(files: &LeaseFiles) -> Result<LockState, StoreError> {
    let state = read_floor_file(files)?;
    let marks = term_marks(files)?;
    Ok(LockState {
        floor: state.floor.max(marks.last().copied().unwrap_or(0)),
        ..state
    })
}

/// Whether the lease's term floor is at least `term`: the floor file's, or
/// else the term marks' (listed only then).
fn floor_reaches(files: &LeaseFiles, term: u64) -> Result<bool, StoreError> {
    if read_floor_file(files)?.floor >= term {
        return Ok(true);
    }
    Ok(term_marks(files)?.last().is_some_and(|&mark| mark >= term))
}

/// Parses the text of a floor file (or of an older baton's lock file).
fn parse_lock_state(files: &LeaseFiles, path: &Path, text: &str) -> Result<LockState, StoreError> {
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

/// Replaces a lease's floor file atomically and durably (the caller holds
/// the lock): written whole and renamed into place.
fn write_lock_state(files: &LeaseFiles, state: LockState) -> Result<(), StoreError> {
    let text = format!("{} {}\n", state.floor, state.creates);
    replace_file(files, &files.floor_temp, &files.floor, text.as_bytes())
}

/// The term marks of a lease, lowest first. Names that are not numbers
/// are not marks (an editor's backup file, say) and are left alone.
fn term_marks(files: &LeaseFiles) -> Result<Vec<u64>, StoreError> {
    let entries = match fs::read_dir(&files.terms) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(&files.lease, "cannot list", &files.terms, e)),
    };
    let mut marks = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(&files.lease, "cannot list", &files.terms, e))?;
        if let Some(term) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
            marks.push(term);
        }
    }
    marks.sort_unstable();
    Ok(marks)
}

/// Raises the lease's term floor to `term`, durably, without a lock: marks
/// only ever add a name, so of two writers raising it at once neither can
/// lower what the other wrote. Keeps the highest few marks.
fn raise_floor(files: &LeaseFiles, term: u64) -> Result<(), StoreError> {
    let cannot = |what: &str, path: &Path, e: io::Error| io_error(&files.lease, what, path, e);
    let fresh = match fs::create_dir(&files.terms) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(cannot("cannot create", &files.terms, e)),
    };
    let mark = files.terms.join(term.to_string());
    File::create(&mark).map_err(|e| cannot("cannot create", &mark, e))?;
    File::open(&files.terms)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| cannot("cannot sync", &files.terms, e))?;
    if fresh {
        sync_dir(files)?;
    }
    let marks = term_marks(files)?;
    for old in marks.iter().rev().skip(KEPT_TERM_MARKS) {
        let _ = fs::remove_file(files.terms.join(old.to_string()));
    }
    Ok(())
}

/// The longest a reader waits for a create or delete to release a lease's
/// lock (they take milliseconds; the elector's own request timeout usually
/// gives up sooner).
const SHARED_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes `lock`, shared or exclusive, without pinning this thread for good
/// behind a holder that keeps it far longer than one create (a stopped
/// process, a stuck fsync): polls it, and fails with the reason `give_up`
/// returns once it returns one.
fn take_lock(
    files: &LeaseFiles,
    lock: &File,
    shared: bool,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<(), StoreError> {
    let mut pause = Duration::from_millis(1);
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
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_error(&files.lease, "cannot lock", &files.lock, e));
            }
        }
    }
}

/// Opens the lease's directory; `None` if there is none.
fn open_lease_dir(files: &LeaseFiles) -> Result<Option<OwnedFd>, StoreError> {
    match rustix::fs::open(
        &files.versions,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => Ok(Some(dir)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::NOTDIR) => Err(StoreError::Malformed {
            lease: files.lease.clone(),
            detail: format!(
                "{} is not a directory; baton never overwrites what it cannot read: move it away \
                 (the lease is then free, and its terms go on from the floor)",
                files.versions.display()
            ),
        }),
        Err(e) => Err(errno_error(&files.lease, "cannot open", &files.versions, e)),
    }
}

/// What a lease's directory holds.
#[derive(Debug, Default)]
struct Listing {
    /// The counters of its version files, lowest first.
    counters: Vec<u64>,
    /// The inode of each of them (as listed), in the same order.
    inodes: Vec<u64>,
    /// The names of its temporary files.
    temps: Vec<OsString>,
}

/// Lists the lease directory `dir`, from its start: reads it through `dir`
/// itself (no other descriptor), from the start if `rewind` (else `dir` was
/// just opened).
fn list_versions(files: &LeaseFiles, dir: &OwnedFd, rewind: bool) -> Result<Listing, StoreError> {
    use std::os::unix::ffi::OsStringExt;
    let cannot = |e| errno_error(&files.lease, "cannot list", &files.versions, e);
    if rewind {
        rustix::fs::seek(dir, rustix::fs::SeekFrom::Start(0)).map_err(cannot)?;
    }
    // Room for a hundred entries per read; any one entry fits.
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
    let mut entries = rustix::fs::RawDir::new(dir, &mut buf);
    let mut listing = Listing::default();
    let mut versions = Vec::new();
    while let Some(entry) = entries.next() {
        let entry = entry.map_err(cannot)?;
        let name = entry.file_name().to_bytes();
        if let Some(counter) = version_counter(name) {
            versions.push((counter, entry.ino()));
        } else if name.starts_with(b".tmp-") {
            listing.temps.push(OsString::from_vec(name.to_vec()));
        }
    }
    versions.sort_unstable();
    (listing.counters, listing.inodes) = versions.into_iter().unzip();
    Ok(listing)
}

/// Reads the version `counter` in the lease directory `dir`; `None` if it
/// is not there (any more), or is no longer the file `listed` (its inode, as
/// a listing saw it) or the file this read opened.
///
/// The file of an old version may be taken for a new version's (see
/// [`recycle_version_file`]) while it is being read, so what was read is
/// that version only if the file still has the version's name afterwards:
/// the name goes first (renamed aside), the contents change only after
/// that, and a name never comes back to the same file.
fn read_version(
    files: &LeaseFiles,
    dir: &OwnedFd,
    counter: u64,
    listed: Option<u64>,
) -> Result<Option<StoredRecord>, StoreError> {
    let path = files.version_path(counter);
    let name = version_name(counter);
    let file = match rustix::fs::openat(
        dir,
        &name,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    ) {
        Ok(file) => file,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(errno_error(&files.lease, "cannot open", &path, e)),
    };
    let bytes = read_to_end(&file).map_err(|e| errno_error(&files.lease, "cannot read", &path, e))?;
    let inode = match listed {
        Some(inode) => inode,
        None => {
            rustix::fs::fstat(&file)
                .map_err(|e| errno_error(&files.lease, "cannot stat", &path, e))?
                .st_ino
        }
    };
    match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(named) if named.st_ino == inode => {}
        Ok(_) | Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(errno_error(&files.lease, "cannot stat", &path, e)),
    }
    parse_record(files, &path, &bytes, Some(counter)).map(Some)
}

/// Reads a small file whole: straight into a buffer that usually holds it,
/// without asking its size first (as [`Read::read_to_end`] does on a
/// [`File`]: two more system calls).
fn read_to_end(file: &OwnedFd) -> Result<Vec<u8>, Errno> {
    let mut bytes = Vec::with_capacity(1024);
    loop {
        if bytes.len() == bytes.capacity() {
            bytes.reserve(bytes.capacity());
        }
        match rustix::io::read(file, rustix::buffer::spare_capacity(&mut bytes)) {
            Ok(0) => return Ok(bytes),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Parses a version file (or an older baton's record) read from `path`;
/// `counter` is the one its name says, if it has one.
fn parse_record(
    files: &LeaseFiles,
    path: &Path,
    bytes: &[u8],
    counter: Option<u64>,
) -> Result<StoredRecord, StoreError> {
    let malformed = |detail: String| StoreError::Malformed {
        lease: files.lease.clone(),
        detail: format!(
            "{}: {detail}; baton never overwrites a record it cannot read: restore the file, \
             or delete the lease's directory {} (the lease is then free, and its terms go on \
             from the floor)",
            path.display(),
            files.versions.display()
        ),
    };
    let stored: StoredRecord = serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
    if stored.incarnation.is_empty() || !stored.incarnation.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(malformed(format!(
            "incarnation {:?} is not alphanumeric",
            stored.incarnation
        )));
    }
    if let Some(counter) = counter
        && stored.counter != counter
    {
        return Err(malformed(format!(
            "holds counter {} under the name of counter {counter}",
            stored.counter
        )));
    }
    Ok(stored)
}

/// Reads a lease's record: its newest version, with the lease directory it
/// was read from and the listing it was found in. `None` if the lease has
/// no directory or no version in it.
fn read_current(files: &LeaseFiles) -> Result<Option<(OwnedFd, StoredRecord, Listing)>, StoreError> {
    for _ in 0..READ_ATTEMPTS {
        let Some(dir) = open_lease_dir(files)? else {
            return Ok(None);
        };
        let listing = list_versions(files, &dir, false)?;
        let (Some(&newest), Some(&inode)) = (listing.counters.last(), listing.inodes.last()) else {
            return Ok(None);
        };
        // `None`: removed or taken as old since it was listed; list again.
        match read_version(files, &dir, newest, Some(inode)) {
            Ok(Some(stored)) => return Ok(Some((dir, stored, listing))),
            Ok(None) => {}
            Err(e @ StoreError::Malformed { .. }) => {
                if let Some(stored) = read_torn(files, &dir, &listing, e)? {
                    return Ok(Some((dir, stored, listing)));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Unavailable {
        lease: files.lease.clone(),
        detail: format!(
            "the newest version in {} was replaced {READ_ATTEMPTS} times before it could be read",
            files.versions.display()
        ),
    })
}

/// The record of a lease whose newest version `listing` shows could not be
/// read (`unreadable`, a [`StoreError::Malformed`]), if only an unsynced
/// renewal can have written it (see [Crash safety](self#crash-safety)):
/// the newest readable version below it names a holder, and the lease's
/// term floor is not above that version's term, so no write after it
/// started a term (a new term is marked, fsynced, before its version is
/// written) and none but that holder's renewals and its release (fsynced,
/// so never torn by a crash) can have followed it. It is read as that
/// version renewed under the newest version's counter: readers date it
/// when they first see it, and the next write is the version after the
/// newest. Otherwise `unreadable` itself; `None` if the versions changed
/// while they were read (the caller lists again).
fn read_torn(
    files: &LeaseFiles,
    dir: &OwnedFd,
    listing: &Listing,
    unreadable: StoreError,
) -> Result<Option<StoredRecord>, StoreError> {
    let Some(&newest) = listing.counters.last() else {
        return Err(unreadable);
    };
    let below = listing.counters.iter().zip(&listing.inodes).rev().skip(1);
    let mut readable = None;
    for (&counter, &inode) in below {
        match read_version(files, dir, counter, Some(inode)) {
            Ok(Some(stored)) => {
                readable = Some(stored);
                break;
            }
            Ok(None) => return Ok(None),
            Err(StoreError::Malformed { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let Some(last) = readable else {
        return Err(unreadable);
    };
    if last.record.holder().is_none() || read_lock_state(files)?.floor > last.record.term {
        return Err(unreadable);
    }
    Ok(Some(StoredRecord {
        counter: newest,
        write: String::new(),
        replaced: last.write,
        ..last
    }))
}

/// An update: writes `record` over the current record if its version is
/// still `version`.
fn update_record(
    files: &LeaseFiles,
    version: &str,
    record: LeaseRecord,
    abandoned: &AtomicBool,
    writer: &Writer,
) -> Result<Versioned, StoreError> {
    if let Some(renewed) = renew_unread(files, version, &record, abandoned, writer)? {
        return Ok(renewed);
    }
    let Some((dir, current, listing)) = read_current(files)? else {
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
    // A new term must raise the floor first. A renewal raises a floor that
    // was lost (emptied by hand, or never written by an older baton), and
    // goes on if the floor cannot be read: the next new term reports it.
    let new_term = record.term > current.record.term;
    let floor_checked = match floor_reaches(files, record.term) {
        Ok(false) => raise_floor(files, record.term).map(|()| true)?,
        Ok(true) => true,
        Err(e) if new_term => return Err(e),
        Err(_) => false,
    };
    let renewal =
        !new_term && record.holder == current.record.holder && record.instance == current.record.instance;
    let stored = StoredRecord {
        incarnation: current.incarnation,
        counter: current.counter + 1,
        write: random_id(),
        replaced: current.write,
        durable: match renewal {
            true => current.durable,
            false => current.counter + 1,
        },
        record,
    };
    if abandoned.load(Ordering::SeqCst) {
        return Err(abandoned_error(files));
    }
    // The oldest version, if this write makes it one to remove: its file is
    // taken for the new version's. Not the newest fsynced one: neither the
    // one before this write (until this one is on disk) nor this one's.
    let recycle = listing
        .counters
        .iter()
        .copied()
        .find(|&c| c != current.durable)
        .filter(|&oldest| oldest + KEPT_VERSIONS < stored.counter);
    let file = commit(
        files,
        &dir,
        recycle,
        &stored,
        if renewal {
            Durability::Visible
        } else {
            Durability::Durable
        },
        writer,
        None,
    )?;
    // Renewals over this version need not read first: the floor is known to
    // reach its term.
    if floor_checked && let (Some(dir), Some(file)) = (file_id(&dir, ""), file_id(&file, "")) {
        writer.last_writes.keep(
            &files.lease,
            LastWrite {
                stored: stored.clone(),
                dir,
                file,
            },
        );
    }
    Ok(stored.into_versioned())
}

/// What an update needs of its store besides the lease's files.
struct Writer {
    /// To tell the store's watches which version is its own write.
    watcher: Arc<DirWatcher>,
    /// See [`EmbeddedStore::unnamed_temps`].
    unnamed_temps: Arc<AtomicBool>,
    /// See [`EmbeddedStore::last_writes`].
    last_writes: Arc<LastWrites>,
}

/// A file's identity over time: its device and inode, and when it was
/// made, so that an inode number freed and given to a new file is told
/// apart from the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: (u32, u32),
    ino: u64,
    born: (i64, u32),
}

/// The identity of `name` in `dir` (of `dir` itself if `name` is empty),
/// without following a link; `None` if it cannot be had (no such file, or a
/// file system that does not keep birth times).
fn file_id(dir: impl std::os::fd::AsFd, name: impl AsRef<Path>) -> Option<FileId> {
    use rustix::fs::StatxFlags;
    let name = name.as_ref();
    let flags = match name.as_os_str().is_empty() {
        true => AtFlags::EMPTY_PATH,
        false => AtFlags::SYMLINK_NOFOLLOW,
    };
    let wanted = StatxFlags::INO | StatxFlags::BTIME;
    let stat = rustix::fs::statx(dir, name, flags, wanted).ok()?;
    StatxFlags::from_bits_retain(stat.stx_mask)
        .contains(wanted)
        .then_some(FileId {
            dev: (stat.stx_dev_major, stat.stx_dev_minor),
            ino: stat.stx_ino,
            born: (stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec),
        })
}

/// What a store last wrote of a lease: the version, the lease directory it
/// was written in and its file, kept after a write whose lease's floor was
/// found at or above the record's term.
#[derive(Clone, Debug)]
struct LastWrite {
    stored: StoredRecord,
    dir: FileId,
    file: FileId,
}

/// The [`LastWrite`] of each lease a store wrote, for renewals.
#[derive(Debug, Default)]
struct LastWrites {
    by_lease: std::sync::Mutex<std::collections::HashMap<String, LastWrite>>,
    /// How many renewals did not read first.
    #[cfg(test)]
    renewed_unread: std::sync::atomic::AtomicU64,
}

impl LastWrites {
    fn take(&self, lease: &str) -> Option<LastWrite> {
        self.by_lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lease)
    }

    fn keep(&self, lease: &str, last: LastWrite) {
        self.by_lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lease.to_owned(), last);
    }

    fn forget(&self, lease: &str) {
        self.take(lease);
    }
}

/// A renewal over the version this store wrote last, without reading the
/// record or the floor first (see [Renewals](self#renewals)); `None` if it
/// is not one, or the lease's directory is not the one that version was
/// written in: the caller then reads and writes as for any update.
fn renew_unread(
    files: &LeaseFiles,
    version: &str,
    record: &LeaseRecord,
    abandoned: &AtomicBool,
    writer: &Writer,
) -> Result<Option<Versioned>, StoreError> {
    // Taken out: kept again only by a write that lands.
    let Some(last) = writer.last_writes.take(&files.lease) else {
        return Ok(None);
    };
    let held = &last.stored.record;
    if last.stored.version() != version
        || record.term != held.term
        || record.holder != held.holder
        || record.instance != held.instance
    {
        return Ok(None);
    }
    let Some(dir) = open_lease_dir(files)? else {
        return Ok(None);
    };
    if file_id(&dir, "") != Some(last.dir) {
        return Ok(None);
    }
    let stored = StoredRecord {
        incarnation: last.stored.incarnation.clone(),
        counter: last.stored.counter + 1,
        write: random_id(),
        replaced: last.stored.write.clone(),
        durable: last.stored.durable,
        record: record.clone(),
    };
    if abandoned.load(Ordering::SeqCst) {
        return Err(abandoned_error(files));
    }
    // The oldest kept version, if the versions are as this store left them.
    let recycle = stored
        .counter
        .checked_sub(KEPT_VERSIONS + 1)
        .filter(|&c| c > 0 && c != stored.durable);
    let file = commit(
        files,
        &dir,
        recycle,
        &stored,
        Durability::Visible,
        writer,
        Some(&last),
    )?;
    if let Some(id) = file_id(&file, "") {
        writer.last_writes.keep(
            &files.lease,
            LastWrite {
                stored: stored.clone(),
                dir: last.dir,
                file: id,
            },
        );
    }
    #[cfg(test)]
    writer.last_writes.renewed_unread.fetch_add(1, Ordering::Relaxed);
    Ok(Some(stored.into_versioned()))
}

/// Encodes a version file.
fn encode(files: &LeaseFiles, stored: &StoredRecord) -> Result<Vec<u8>, StoreError> {
    let mut json = serde_json::to_vec_pretty(stored).map_err(|e| StoreError::Refused {
        lease: files.lease.clone(),
        detail: format!("cannot encode record: {e}"),
    })?;
    json.push(b'\n');
    Ok(json)
}

/// Writes the version `stored` into the lease directory `dir`, over the
/// version before it, in the file of the old version `recycle` if it can
/// take it (see [`recycle_version_file`]), else in a new one: see
/// [Compare-and-swap without a lock](self#compare-and-swap-without-a-lock).
/// `over`: the version it replaces, written by this store, if it was not
/// read (a [renewal](self#renewals)). Returns the new version's file.
fn commit(
    files: &LeaseFiles,
    dir: &OwnedFd,
    recycle: Option<u64>,
    stored: &StoredRecord,
    durability: Durability,
    writer: &Writer,
    over: Option<&LastWrite>,
) -> Result<File, StoreError> {
    let json = encode(files, stored)?;
    let recycled = recycle.and_then(|counter| recycle_version_file(dir, counter));
    let (file, temp) = match recycled {
        Some(taken) => taken,
        None => new_version_file(files, dir, &writer.unnamed_temps)?,
    };
    let written = (&file).write_all(&json).and_then(|()| match &temp {
        // The old version may have been longer.
        Temp::Recycled(_) => file.set_len(json.len() as u64),
        Temp::Unnamed | Temp::Named(_) => Ok(()),
    });
    let written = written.and_then(|()| match durability {
        Durability::Durable => file.sync_all(),
        Durability::Visible => Ok(()),
    });
    if let Err(e) = written {
        if let Some(name) = temp.name() {
            let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
        }
        return Err(io_error(&files.lease, "cannot write", &temp.path(files), e));
    }
    #[cfg(test)]
    tests::before_link();
    let name = version_name(stored.counter);
    let own = writer.watcher.expect_own(files, stored.counter);
    match link_version(dir, &file, &temp, &name) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            return Err(StoreError::Conflict {
                lease: files.lease.clone(),
                detail: format!(
                    "version {}-{} was replaced by another writer first",
                    stored.incarnation,
                    stored.counter - 1
                ),
            });
        }
        // Not through /proc/self/fd, though the directory is there: later
        // writes of this store use named temporary files. This one was not
        // written.
        Err(Errno::NOENT)
            if temp == Temp::Unnamed && rustix::fs::fstat(dir).is_ok_and(|d| d.st_nlink > 0) =>
        {
            writer.unnamed_temps.store(false, Ordering::Relaxed);
            return Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail: format!(
                    "cannot link an unnamed file into {} through {PROC_FDS}; \
                     later writes use named temporary files",
                    files.versions.display()
                ),
            });
        }
        // The directory was removed, or the temporary file was (taken for
        // one left by a dead writer: this one was stopped for a minute).
        Err(Errno::NOENT) => return Err(deleted_meanwhile(files)),
        Err(e) => {
            return Err(errno_error(
                &files.lease,
                "cannot link",
                &files.version_path(stored.counter),
                e,
            ));
        }
    }
    // Over a version of this store's not read first: the version replaced
    // still has its name (so none of the later ones was removed, see
    // [`confirm`]), and the lease's directory is still the one it was in.
    let confirmed = over.is_some_and(|last| {
        file_id(rustix::fs::CWD, &files.versions) == Some(last.dir)
            && file_id(dir, version_name(last.stored.counter)) == Some(last.file)
    });
    let listing = match confirmed {
        true => None,
        false => Some(confirm(files, dir, &file, stored)?),
    };
    own.confirmed();
    if durability == Durability::Durable {
        rustix::fs::fsync(dir).map_err(|e| errno_error(&files.lease, "cannot sync", &files.versions, e))?;
    }
    if let Some(listing) = listing {
        prune(dir, &listing, stored.counter, stored.durable);
    }
    Ok(file)
}

/// Where an unnamed file's descriptors are linked from.
const PROC_FDS: &str = "/proc/self/fd";

/// A new version's file before it is linked under the version's name.
#[derive(Debug, PartialEq, Eq)]
enum Temp {
    /// An unnamed temporary file (`O_TMPFILE`): nothing to remove, nothing
    /// left behind by a writer that dies.
    Unnamed,
    /// A temporary name in the lease's directory (`.tmp-<random>`), removed
    /// once linked.
    Named(String),
    /// The file of an old version, under a temporary name as [`Temp::Named`]
    /// (see [`recycle_version_file`]).
    Recycled(String),
}

impl Temp {
    /// Its temporary name, if it has one.
    fn name(&self) -> Option<&str> {
        match self {
            Temp::Unnamed => None,
            Temp::Named(name) | Temp::Recycled(name) => Some(name),
        }
    }

    /// For messages.
    fn path(&self, files: &LeaseFiles) -> PathBuf {
        match self.name() {
            None => files.versions.clone(),
            Some(name) => files.versions.join(name),
        }
    }
}

/// Takes the file of the old version `counter` (one the write removes) for
/// a new version, so that a write allocates no inode and frees none: on
/// ext4 without a journal, allocating one is most of a renewal's cost (see
/// [What a write costs](self#what-a-write-costs)). The file is renamed to
/// a temporary name first (a reader that opened it as that version then
/// finds the name gone, see [`read_version`]), then opened to be
/// overwritten. `None` if it is gone (another writer took or removed it):
/// the write then uses a new file.
fn recycle_version_file(dir: &OwnedFd, counter: u64) -> Option<(File, Temp)> {
    let temp = format!(".tmp-{}", random_id());
    rustix::fs::renameat_with(dir, version_name(counter), dir, &temp, RenameFlags::NOREPLACE).ok()?;
    match rustix::fs::openat(
        dir,
        &temp,
        OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    ) {
        Ok(file) => Some((File::from(file), Temp::Recycled(temp))),
        Err(_) => {
            let _ = rustix::fs::unlinkat(dir, &temp, AtFlags::empty());
            None
        }
    }
}

/// Creates a new version's file in the lease directory `dir`: unnamed if
/// `unnamed` says the store may (cleared for good if the file system cannot),
/// else under a temporary name.
fn new_version_file(
    files: &LeaseFiles,
    dir: &OwnedFd,
    unnamed: &AtomicBool,
) -> Result<(File, Temp), StoreError> {
    let mode = Mode::from_raw_mode(0o644);
    if unnamed.load(Ordering::Relaxed) {
        match rustix::fs::openat(dir, ".", OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC, mode) {
            Ok(file) => return Ok((File::from(file), Temp::Unnamed)),
            Err(Errno::NOENT) => return Err(deleted_meanwhile(files)),
            // The file system cannot (EOPNOTSUPP), or the kernel does not
            // know O_TMPFILE (EISDIR).
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => unnamed.store(false, Ordering::Relaxed),
            Err(e) => {
                return Err(errno_error(
                    &files.lease,
                    "cannot create a file in",
                    &files.versions,
                    e,
                ));
            }
        }
    }
    let temp = format!(".tmp-{}", random_id());
    match rustix::fs::openat(
        dir,
        &temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        mode,
    ) {
        Ok(file) => Ok((File::from(file), Temp::Named(temp))),
        Err(Errno::NOENT) => Err(deleted_meanwhile(files)),
        Err(e) => Err(errno_error(
            &files.lease,
            "cannot create",
            &files.versions.join(&temp),
            e,
        )),
    }
}

/// Links `file` into the lease directory `dir` under `name` (failing if the
/// name exists), and removes its temporary name if it has one.
fn link_version(dir: &OwnedFd, file: &File, temp: &Temp, name: &str) -> Result<(), Errno> {
    match temp {
        Temp::Unnamed => {
            use std::os::fd::AsRawFd;
            let path = format!("{PROC_FDS}/{}", file.as_raw_fd());
            rustix::fs::linkat(rustix::fs::CWD, &path, dir, name, AtFlags::SYMLINK_FOLLOW)
        }
        Temp::Named(temp) | Temp::Recycled(temp) => {
            let linked = rustix::fs::linkat(dir, temp, dir, name, AtFlags::empty());
            let _ = rustix::fs::unlinkat(dir, temp, AtFlags::empty());
            linked
        }
    }
}

/// The conflict of a write into a lease deleted since it was read.
fn deleted_meanwhile(files: &LeaseFiles) -> StoreError {
    StoreError::Conflict {
        lease: files.lease.clone(),
        detail: "deleted while being written".into(),
    }
}

/// Right after linking `stored` (whose file is still open as `file`):
/// whether it is the lease's record, or was, or was a stale write that
/// re-created an old version's name. Returns the listing it read.
fn confirm(
    files: &LeaseFiles,
    dir: &OwnedFd,
    file: &File,
    stored: &StoredRecord,
) -> Result<Listing, StoreError> {
    // The directory is still the lease's, not one moved away.
    let live =
        rustix::fs::fstat(dir).map_err(|e| errno_error(&files.lease, "cannot stat", &files.versions, e))?;
    match rustix::fs::stat(&files.versions) {
        Ok(named) if named.st_ino == live.st_ino && named.st_dev == live.st_dev => {}
        _ => return Err(deleted_meanwhile(files)),
    }
    let listing = list_versions(files, dir, true)?;
    if listing.counters.last() == Some(&stored.counter) {
        return Ok(listing);
    }
    let stale = || StoreError::Conflict {
        lease: files.lease.clone(),
        detail: format!(
            "version {}-{} was replaced long ago: this write was stale and is not the record",
            stored.incarnation,
            stored.counter - 1
        ),
    };
    let unknown = |why: String| StoreError::Unavailable {
        lease: files.lease.clone(),
        detail: format!(
            "wrote version {}, then {why}: it may have been the record for a moment",
            stored.version()
        ),
    };
    // Newer versions exist. Ours was the record if the next one replaced
    // it; a stale write re-created the name of a version removed as old.
    match read_version(files, dir, stored.counter + 1, None) {
        Ok(Some(next)) if next.replaced == stored.write => Ok(listing),
        Ok(Some(_)) => Err(stale()),
        // Versions are removed (or taken for new ones) lowest first: had
        // the next one replaced ours and been removed, ours would have been
        // removed before it. Ours still has its name if it is the same file.
        // (The newest fsynced version is kept out of that order; while it
        // is, only its own holder's renewals follow it, and they come after
        // this check, unless this write was abandoned: then its answer
        // reaches no one.)
        Ok(None) => match (
            rustix::fs::fstat(file),
            rustix::fs::statat(dir, version_name(stored.counter), AtFlags::SYMLINK_NOFOLLOW),
        ) {
            (Ok(ours), Ok(named)) if ours.st_ino == named.st_ino => Err(stale()),
            (Ok(_), Ok(_) | Err(Errno::NOENT)) => Err(unknown("more than a dozen newer ones".into())),
            (Err(e), _) | (_, Err(e)) => Err(unknown(format!("could not check it: {e}"))),
        },
        Err(e) => Err(unknown(format!("could not read the next one: {e}"))),
    }
}

/// Removes, lowest first, the versions older than the kept ones below
/// `newest` but the newest fsynced one (`durable`), and temporary files
/// left by writers that died or stopped.
fn prune(dir: &OwnedFd, listing: &Listing, newest: u64, durable: u64) {
    for &counter in &listing.counters {
        if counter + KEPT_VERSIONS < newest && counter != durable {
            let _ = rustix::fs::unlinkat(dir, version_name(counter), AtFlags::empty());
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // A recycled version's file (see [`recycle_version_file`]) keeps its
    // old modification time for the moment between its rename and its
    // write: removed then, its write reports a conflict, as any write that
    // loses its file does, and the caller reads and tries again.
    for temp in &listing.temps {
        if let Ok(stat) = rustix::fs::statat(dir, temp.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
            && now.saturating_sub(Duration::from_secs(stat.st_mtime.max(0) as u64)) > STALE_TEMP_AGE
        {
            let _ = rustix::fs::unlinkat(dir, temp.as_os_str(), AtFlags::empty());
        }
    }
}

/// Moves a new lease directory holding `stored` into place (the caller
/// holds the lock and found no record). A directory without versions (its
/// files removed by hand) is no record and is replaced.
fn install_lease_dir(files: &LeaseFiles, stored: &StoredRecord) -> Result<(), StoreError> {
    remove_leftovers(files);
    let staging = files.dir.join(format!(".{}.new-{}", files.lease, random_id()));
    let installed = (|| {
        fs::create_dir(&staging).map_err(|e| io_error(&files.lease, "cannot create", &staging, e))?;
        let path = staging.join(version_name(stored.counter));
        let mut file = File::create(&path).map_err(|e| io_error(&files.lease, "cannot create", &path, e))?;
        file.write_all(&encode(files, stored)?)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error(&files.lease, "cannot write", &path, e))?;
        File::open(&staging)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io_error(&files.lease, "cannot sync", &staging, e))?;
        let rename = || {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &staging,
                rustix::fs::CWD,
                &files.versions,
                RenameFlags::NOREPLACE,
            )
        };
        match rename() {
            Ok(()) => {}
            Err(Errno::EXIST | Errno::NOTEMPTY) => {
                match rustix::fs::unlinkat(rustix::fs::CWD, &files.versions, AtFlags::REMOVEDIR) {
                    Ok(()) => {
                        rename().map_err(|e| errno_error(&files.lease, "cannot rename", &staging, e))?
                    }
                    Err(Errno::NOTEMPTY | Errno::EXIST) => {
                        return Err(StoreError::Conflict {
                            lease: files.lease.clone(),
                            detail: "written while it was being created".into(),
                        });
                    }
                    Err(e) => return Err(errno_error(&files.lease, "cannot replace", &files.versions, e)),
                }
            }
            Err(Errno::INVAL) => {
                return Err(StoreError::Refused {
                    lease: files.lease.clone(),
                    detail: format!(
                        "the file system of {} cannot rename without replacing \
                         (renameat2 RENAME_NOREPLACE); the embedded store needs one that can \
                         (a local file system such as ext4, xfs, btrfs or tmpfs)",
                        files.dir.display()
                    ),
                });
            }
            Err(e) => return Err(errno_error(&files.lease, "cannot rename", &staging, e)),
        }
        sync_dir(files)
    })();
    if installed.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    installed
}

/// Removes what a create or delete killed half-way left in the store's
/// directory (the caller holds the lock).
fn remove_leftovers(files: &LeaseFiles) {
    let Ok(entries) = fs::read_dir(&files.dir) else {
        return;
    };
    let new = format!(".{}.new-", files.lease);
    let deleted = format!(".{}.deleted-", files.lease);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(&new) || name.starts_with(&deleted) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Deletes a lease's directory (the caller holds the lock): moves it aside,
/// so that no write lands in it from then on, then removes it.
fn remove_lease_dir(files: &LeaseFiles) -> Result<bool, StoreError> {
    let trash = files
        .dir
        .join(format!(".{}.deleted-{}", files.lease, random_id()));
    match fs::rename(&files.versions, &trash) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(&files.lease, "cannot move", &files.versions, e)),
    }
    sync_dir(files)?;
    let _ = fs::remove_dir_all(&trash);
    Ok(true)
}

/// Moves the record of an older baton, `<lease>.lease.json`, into a lease
/// directory under the same version (the caller holds the lock).
fn move_legacy_record(files: &LeaseFiles) -> Result<(), StoreError> {
    let bytes = match fs::read(&files.legacy) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(&files.lease, "cannot read", &files.legacy, e)),
    };
    // Moved already, by a process that died before removing the old file.
    if open_lease_dir(files)?.is_none() {
        let stored = parse_record(files, &files.legacy, &bytes, None)?;
        install_lease_dir(files, &stored)?;
    }
    fs::remove_file(&files.legacy).map_err(|e| io_error(&files.lease, "cannot remove", &files.legacy, e))?;
    let _ = fs::remove_file(files.dir.join(format!(".{}.tmp", files.lease)));
    sync_dir(files)
}

/// How far a write must have gone when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Visible to every process (linked into place): a renewal.
    Visible,
    /// On disk too (fsynced, and the directory): everything else.
    Durable,
}

/// Replaces `path` with `contents` atomically and durably: writes `temp`,
/// fsyncs it, renames it over `path` and fsyncs the directory. A process
/// killed at any point leaves the old file or the new one, never a torn
/// one. The caller holds the lease's lock (so `temp` is its own).
fn replace_file(files: &LeaseFiles, temp: &Path, path: &Path, contents: &[u8]) -> Result<(), StoreError> {
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp)
        .and_then(|mut file| {
            file.write_all(contents)?;
            file.sync_all()
        });
    if let Err(e) = written {
        let _ = fs::remove_file(temp);
        return Err(io_error(&files.lease, "cannot write", temp, e));
    }
    if let Err(e) = fs::rename(temp, path) {
        let _ = fs::remove_file(temp);
        return Err(io_error(&files.lease, "cannot replace", path, e));
    }
    sync_dir(files)
}

/// Makes a rename or removal in the store's directory durable.
fn sync_dir(files: &LeaseFiles) -> Result<(), StoreError> {
    File::open(&files.dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io_error(&files.lease, "cannot sync", &files.dir, e))
}

/// [`io_error`] for a system call's error number.
fn errno_error(lease: &str, what: &str, path: &Path, err: Errno) -> StoreError {
    io_error(lease, what, path, io::Error::from(err))
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
mod tests {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use futures::StreamExt;

    use super::*;
    use crate::store::deleted::floor_record;

    fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
        LeaseRecord {
            plugins: None,
            yielded: None,
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

    /// Deletes a lease behind the store's back, as an operator would.
    fn remove_lease(dir: &Path, lease: &str) {
        fs::remove_dir_all(dir.join(format!("{lease}.lease"))).unwrap();
    }

    /// The file of a lease's newest version.
    fn newest_version(dir: &Path, lease: &str) -> PathBuf {
        let versions = dir.join(format!("{lease}.lease"));
        let mut names: Vec<_> = fs::read_dir(&versions)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        versions.join(names.last().expect("a version"))
    }

    /// The term floor of a lease, as the store reads it.
    fn floor_of(store: &EmbeddedStore, lease: &str) -> u64 {
        read_lock_state(&store.files(lease).unwrap()).unwrap().floor
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
    fn version_names() {
        assert_eq!(version_counter(version_name(42).as_bytes()), Some(42));
        assert_eq!(version_counter(version_name(u64::MAX).as_bytes()), Some(u64::MAX));
        for bad in [
            "99999999999999999999.json",
            "0000000000000000042.json",
            "000000000000000000042.json",
            "0000000000000000004a.json",
            "00000000000000000042.jso",
            "00000000000000000042",
            ".tmp-00000000000000000042",
            "",
        ] {
            assert_eq!(version_counter(bad.as_bytes()), None, "{bad:?}");
        }
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
        fs::create_dir(store.dir().join("Bad_Name.lease")).unwrap();
        fs::write(store.dir().join("Bad_Name.lease/00000000000000000001.json"), "{}").unwrap();
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
        for t in 0..THREADS {
            let dir = store.dir().to_path_buf();
            threads.push(std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let store = EmbeddedStore::open(dir).unwrap();
                    // Both ways of writing a version, side by side.
                    store.unnamed_temps.store(t % 2 == 0, Ordering::Relaxed);
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
        remove_lease(dir.path(), "demo");

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
        remove_lease(dir.path(), "demo");
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
        remove_lease(dir.path(), "demo");
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
        a.create("demo", &record(None, 5)).await.unwrap();
        remove_lease(dir.path(), "demo");
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
        remove_lease(dir.path(), "demo");
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
        let held = holder.create("demo", &record(Some("h"), 4)).await.unwrap();
        assert_eq!(poller.get("demo").await.unwrap(), Some(held));
        remove_lease(dir.path(), "demo");
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
        remove_lease(dir.path(), "demo");
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
            take_lock(&files, &lock, false, &|| None).unwrap();
            let state = read_lock_state(&files).unwrap();
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
            let state = read_lock_state(&files)
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

    /// Set in a child process of the tests below: it stops itself
    /// (`SIGSTOP`) in the middle of each write, its version written and not
    /// yet linked.
    const STOP_BEFORE_LINK: &str = "BATON_TEST_STOP_BEFORE_LINK";

    /// Set for a child that writes through named temporary files.
    const NAMED_TEMPS: &str = "BATON_TEST_NAMED_TEMPS";

    /// Called by [`commit`] between writing a version and linking it.
    pub(super) fn before_link() {
        if std::env::var_os(STOP_BEFORE_LINK).is_some() {
            // SAFETY: raise has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    }

    /// The child's half of the tests below: `attempts` increments of lease
    /// `demo` in `dir` (or as many as fit in `for_ms` milliseconds), one
    /// line per outcome on stdout, then a summary line.
    fn increment_as_a_child(dir: &Path) -> ! {
        use std::io::Write as _;
        let attempts: usize = std::env::var("BATON_TEST_ATTEMPTS").map_or(usize::MAX, |a| a.parse().unwrap());
        let until = std::env::var("BATON_TEST_FOR_MS")
            .map(|ms| Instant::now() + Duration::from_millis(ms.parse().unwrap()))
            .ok();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = EmbeddedStore::open(dir).unwrap();
        if std::env::var_os(NAMED_TEMPS).is_some() {
            store.unnamed_temps.store(false, Ordering::Relaxed);
        }
        let (mut ok, mut conflict, mut unknown) = (0, 0, 0);
        let mut out = std::io::stdout().lock();
        // The test harness has written "test <name> ... " without a newline.
        writeln!(out).unwrap();
        for _ in 0..attempts {
            if until.is_some_and(|until| Instant::now() >= until) {
                break;
            }
            let current = rt.block_on(store.get("demo")).unwrap().unwrap();
            let mut next = current.record.clone();
            next.term += 1;
            let outcome = match rt.block_on(store.update("demo", &current.version, &next)) {
                Ok(_) => {
                    ok += 1;
                    "ok".to_string()
                }
                Err(e) if e.is_conflict() => {
                    conflict += 1;
                    format!("conflict {e}")
                }
                Err(StoreError::Unavailable { detail, .. }) => {
                    unknown += 1;
                    format!("unknown {detail}")
                }
                Err(e) => panic!("{e}"),
            };
            if until.is_none() {
                writeln!(out, "attempt {outcome}").unwrap();
                out.flush().unwrap();
            }
        }
        writeln!(out, "done {ok} {conflict} {unknown}").unwrap();
        out.flush().unwrap();
        std::process::exit(0)
    }

    /// Starts this test binary as a child running [`increment_as_a_child`].
    fn spawn_child(test: &str, dir: &Path, env: &[(&str, String)]) -> std::process::Child {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("BATON_TEST_INCREMENTER", dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Waits until process `pid` is stopped.
    fn wait_stopped(pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            // "pid (comm) S ...": the state follows the last parenthesis.
            let state = stat.rsplit(')').next().unwrap().trim_start().chars().next();
            if state == Some('T') {
                return;
            }
            assert!(Instant::now() < deadline, "the child never stopped: {stat}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn signal(child: &std::process::Child, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    }

    /// `n` increments by this process, each retried on conflict, each
    /// bounded by `within` (the lock of an older baton would hold them
    /// until the stopped writer resumed).
    fn increments(
        rt: &tokio::runtime::Runtime,
        store: &EmbeddedStore,
        n: usize,
        within: Duration,
    ) -> Duration {
        let started = Instant::now();
        for _ in 0..n {
            rt.block_on(async {
                tokio::time::timeout(within, increment(store, "demo"))
                    .await
                    .expect("an increment finished while the other writer was stopped")
            });
        }
        started.elapsed()
    }

    #[test]
    fn a_writer_stopped_in_the_middle_of_its_write_blocks_no_one_and_its_write_fails() {
        const NAME: &str = "store::embedded::tests::a_writer_stopped_in_the_middle_of_its_write_blocks_no_one_and_its_write_fails";
        if let Some(dir) = std::env::var_os("BATON_TEST_INCREMENTER") {
            increment_as_a_child(Path::new(&dir));
        }
        // The child writes through unnamed temporary files, then named ones.
        for named in [false, true] {
            a_writer_stopped_in_the_middle_of_its_write(NAME, named);
        }
    }

    fn a_writer_stopped_in_the_middle_of_its_write(name: &str, named: bool) {
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        rt.block_on(store.create("demo", &record(None, 0))).unwrap();
        // How many writes this process makes while the child is stopped in
        // each of its writes: none (its write lands), one (its link finds
        // the name taken), and more than the versions kept (its link
        // re-creates the name of a version removed long ago).
        let rounds = [
            0,
            1,
            0,
            3,
            KEPT_VERSIONS as usize,
            0,
            2 * KEPT_VERSIONS as usize + 5,
            1,
        ];
        let mut env = vec![
            (STOP_BEFORE_LINK, "1".to_string()),
            ("BATON_TEST_ATTEMPTS", rounds.len().to_string()),
        ];
        if named {
            env.push((NAMED_TEMPS, "1".into()));
        }
        let mut child = spawn_child(name, dir.path(), &env);
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map(|l| l.unwrap())
            .filter(|l| l.starts_with("attempt ") || l.starts_with("done "));
        let mut mine = 0;
        let mut slowest = Duration::ZERO;
        for (round, &writes) in rounds.iter().enumerate() {
            wait_stopped(child.id());
            slowest = slowest.max(increments(&rt, &store, writes, Duration::from_secs(5)));
            mine += writes;
            signal(&child, libc::SIGCONT);
            let outcome = lines.next().expect("the child reports each attempt");
            if writes == 0 {
                assert_eq!(outcome, "attempt ok", "round {round}: nobody wrote meanwhile");
            } else {
                assert!(
                    outcome.starts_with("attempt conflict"),
                    "round {round}: {writes} writes came while the child was stopped, yet: {outcome}"
                );
            }
            println!(
                "round {round}: {writes} writes while stopped -> child's write (named temporary files: {named}): {outcome}"
            );
        }
        let done = lines.next().unwrap();
        assert!(child.wait().unwrap().success());
        let landed = rounds.iter().filter(|&&w| w == 0).count();
        assert_eq!(done, format!("done {landed} {} 0", rounds.len() - landed));
        let last = rt.block_on(store.get("demo")).unwrap().unwrap();
        assert_eq!(
            last.record.term as usize,
            mine + landed,
            "no write lost, none stale landed"
        );
        println!("slowest batch of writes while the other writer was stopped: {slowest:?}");
    }

    #[test]
    fn writers_stopped_at_random_moments_block_no_one_and_lose_no_update() {
        const NAME: &str =
            "store::embedded::tests::writers_stopped_at_random_moments_block_no_one_and_lose_no_update";
        if let Some(dir) = std::env::var_os("BATON_TEST_INCREMENTER") {
            increment_as_a_child(Path::new(&dir));
        }
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        // Both ways of writing a version, one in each process.
        store.unnamed_temps.store(false, Ordering::Relaxed);
        rt.block_on(store.create("demo", &record(None, 0))).unwrap();
        let mut child = spawn_child(NAME, dir.path(), &[("BATON_TEST_FOR_MS", "1500".into())]);
        let mut mine = 0;
        let mut times = Vec::new();
        let started = Instant::now();
        // Stopped at random moments while it writes as fast as it can; each
        // time, this process writes twice before letting it go on.
        while started.elapsed() < Duration::from_millis(1200) {
            std::thread::sleep(Duration::from_micros(rand::random_range(0..20_000)));
            signal(&child, libc::SIGSTOP);
            wait_stopped(child.id());
            times.push(increments(&rt, &store, 2, Duration::from_secs(5)));
            mine += 2;
            signal(&child, libc::SIGCONT);
        }
        let all: Vec<String> = std::io::BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map(|l| l.unwrap())
            .collect();
        let status = child.wait().unwrap();
        assert!(status.success(), "the child failed ({status}): {all:?}");
        let out = all
            .iter()
            .find(|l| l.starts_with("done "))
            .cloned()
            .unwrap_or_default();
        let counts: Vec<usize> = out
            .split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect();
        let [ok, conflict, unknown] = counts[..] else {
            panic!("no summary from the child: {all:?}")
        };
        assert!(ok > 100, "the child wrote only {ok} times");
        let last = rt.block_on(store.get("demo")).unwrap().unwrap().record.term as usize;
        assert!(
            (mine + ok..=mine + ok + unknown).contains(&last),
            "the counter is {last}: {mine} by this process, {ok} by the child and {unknown} that may have landed"
        );
        times.sort();
        println!(
            "{} stops; two writes while stopped took {:?} at the median, {:?} at most; \
             the child: {ok} written, {conflict} conflicts, {unknown} unknown",
            times.len(),
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }

    #[tokio::test]
    async fn a_lost_floor_is_restored_and_never_blocks_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let lock = dir.path().join(".demo.floor");
        let held = store.create("demo", &record(Some("a"), 9)).await.unwrap();
        // The floor emptied by hand:
        // a renewal writes it again.
        fs::write(&lock, "").unwrap();
        assert_eq!(floor_of(&store, "demo"), 0);
        let renewed = store
            .update("demo", &held.version, &record(Some("a"), 9))
            .await
            .unwrap();
        assert_eq!(floor_of(&store, "demo"), 9);
        // Emptied again, then the record deleted while held: the holder
        // still writes it again in its term, and the floor is back.
        fs::write(&lock, "").unwrap();
        fs::remove_dir_all(dir.path().join(".demo.terms")).unwrap();
        remove_lease(dir.path(), "demo");
        let tombstone = store.get("demo").await.unwrap().unwrap();
        assert_eq!(tombstone.version, format!("{TOMBSTONE}{}", renewed.version));
        store
            .update("demo", &tombstone.version, &record(Some("a"), 9))
            .await
            .unwrap();
        assert_eq!(floor_in(&lock), "9");
        assert_eq!(floor_of(&store, "demo"), 9);
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
                remove_lease(store.dir(), "demo");
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
        let path = newest_version(store.dir(), "demo");
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

    /// What a crash can leave of an unsynced renewal's version file (`full`
    /// its bytes as written, `older` an older version's, as a recycled
    /// file's old block holds them).
    fn torn_cases(full: &[u8], older: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("empty", Vec::new()),
            ("truncated", full[..full.len() / 2].to_vec()),
            ("garbled", b"\x00\xffnot json".to_vec()),
            ("zeros", vec![0; full.len()]),
            ("an older version's bytes", older.to_vec()),
        ]
    }

    /// Creates `demo` held by `a` in term 1 and renews it `renewals` times
    /// (through `store`); returns every version, oldest first.
    async fn held_with_renewals(store: &EmbeddedStore, renewals: usize) -> Vec<Versioned> {
        let mut versions = vec![store.create("demo", &record(Some("a"), 1)).await.unwrap()];
        for _ in 0..renewals {
            let last = versions.last().unwrap().version.clone();
            versions.push(store.update("demo", &last, &record(Some("a"), 1)).await.unwrap());
        }
        versions
    }

    #[tokio::test]
    async fn a_torn_renewal_reads_as_a_renewal_of_the_version_below_and_is_written_over() {
        for torn in 1..=2 {
            let (dir, writer) = store();
            let versions = held_with_renewals(&writer, 3).await;
            let newest = versions.last().unwrap();
            let path = newest_version(writer.dir(), "demo");
            let full = fs::read(&path).unwrap();
            let older = fs::read(path.with_file_name(version_name(1))).unwrap();
            for (what, bytes) in torn_cases(&full, &older) {
                // The newest `torn` versions lost their bytes, as a crash
                // of the machine leaves unsynced renewals.
                for counter in 5 - torn..=4 {
                    fs::write(path.with_file_name(version_name(counter)), &bytes).unwrap();
                }
                // A reader started after the crash (no memory of the lease).
                let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
                let readable = &versions[3 - torn as usize];
                let got = reader.get("demo").await.unwrap().expect("a record");
                assert_eq!(got.record, readable.record, "{what}, {torn} torn");
                assert_eq!(got.version, newest.version, "{what}: the torn version's own");
                let watched = reader.watch("demo").await.unwrap().next().await.unwrap().unwrap();
                assert_eq!(watched, Some(got.clone()), "{what}");
                assert_eq!(reader.list().await.unwrap(), vec![("demo".into(), got.clone())]);
                // Read again, the same version: dated once, at first sight.
                assert_eq!(reader.get("demo").await.unwrap(), Some(got.clone()), "{what}");
            }
            // Taken over after it ran out: the version after the torn one,
            // in a term above it (and the floor).
            let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
            let got = reader.get("demo").await.unwrap().unwrap();
            let taken = reader
                .update("demo", &got.version, &record(Some("b"), 2))
                .await
                .unwrap();
            assert!(taken.version.ends_with("-5"), "{}", taken.version);
            assert_eq!(reader.get("demo").await.unwrap(), Some(taken.clone()));
            assert_eq!(floor_of(&reader, "demo"), 2);
            // A second contender that read the torn version lost the race.
            let lost = writer.update("demo", &got.version, &record(Some("c"), 2)).await;
            assert!(lost.unwrap_err().is_conflict());
        }
    }

    #[tokio::test]
    async fn the_newest_fsynced_version_is_kept_to_read_when_every_renewal_is_torn() {
        let (dir, writer) = store();
        let files = writer.files("demo").unwrap();
        let versions = |store: &EmbeddedStore| {
            let dir = open_lease_dir(&files).unwrap().unwrap();
            list_versions(&store.files("demo").unwrap(), &dir, false)
                .unwrap()
                .counters
        };
        // A term far longer than the versions kept: its first version (the
        // create, fsynced) is neither taken for a renewal nor removed.
        let all = held_with_renewals(&writer, 3 * KEPT_VERSIONS as usize).await;
        assert_eq!(versions(&writer)[0], 1, "{:?}", versions(&writer));
        // A crash tore every renewal kept (unread and read-first alike).
        for counter in versions(&writer).into_iter().skip(1) {
            fs::write(files.version_path(counter), b"").unwrap();
        }
        let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
        let got = reader.get("demo").await.unwrap().expect("a record");
        assert_eq!(got.record, all[0].record);
        assert_eq!(got.version, all.last().unwrap().version);
        // Taken over: that write is the newest fsynced one from then on,
        // and the old one goes once it is old.
        let mut v = reader
            .update("demo", &got.version, &record(Some("b"), 2))
            .await
            .unwrap();
        let taken = v.version.rsplit('-').next().unwrap().parse::<u64>().unwrap();
        for _ in 0..=KEPT_VERSIONS {
            v = reader
                .update("demo", &v.version, &record(Some("b"), 2))
                .await
                .unwrap();
        }
        let kept = versions(&reader);
        assert_eq!(kept[0], taken, "{kept:?}");
        assert!(!kept.contains(&1), "{kept:?}");
    }

    #[tokio::test]
    async fn a_live_holder_renews_over_its_torn_version_and_readers_follow() {
        for read_first in [false, true] {
            let (dir, holder) = store();
            let versions = held_with_renewals(&holder, 2).await;
            let newest = versions.last().unwrap();
            let path = newest_version(holder.dir(), "demo");
            fs::write(&path, b"").unwrap();
            let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
            let mut watch = reader.watch("demo").await.unwrap();
            let seen = next_within(&mut watch, 5).await.expect("a record");
            assert_eq!(seen.record.holder(), Some("a"));
            assert_eq!(seen.version, newest.version);
            let over = if read_first {
                // A holder that lost its answer reads first: its own record.
                let again = EmbeddedStore::open(dir.path().join("leases")).unwrap();
                let current = again.get("demo").await.unwrap().unwrap();
                assert_eq!(current.version, newest.version);
                again
                    .update("demo", &current.version, &record(Some("a"), 1))
                    .await
                    .unwrap()
            } else {
                holder
                    .update("demo", &newest.version, &record(Some("a"), 1))
                    .await
                    .unwrap()
            };
            assert!(over.version.ends_with("-4"), "{}", over.version);
            let next = next_change(&mut watch, &Some(seen)).await.expect("a record");
            assert_eq!(next, over, "read first: {read_first}");
            assert_eq!(reader.get("demo").await.unwrap(), Some(over));
        }
    }

    #[tokio::test]
    async fn an_unreadable_version_that_no_unsynced_renewal_wrote_stays_an_error() {
        // Below it: a release (the next write starts a term), and a version
        // under a floor raised for a new term (the next write may have been
        // that term's, fsynced).
        for case in ["released below", "floor above"] {
            let (_dir, store) = store();
            let versions = held_with_renewals(&store, 1).await;
            let files = store.files("demo").unwrap();
            match case {
                "released below" => {
                    let last = versions.last().unwrap().version.clone();
                    store.update("demo", &last, &record(None, 1)).await.unwrap();
                    // Nothing but a new term (fsynced) follows a release.
                    fs::write(files.version_path(4), b"").unwrap();
                }
                _ => {
                    raise_floor(&files, 2).unwrap();
                    fs::write(newest_version(store.dir(), "demo"), b"").unwrap();
                }
            }
            let fresh = EmbeddedStore::open(store.dir()).unwrap();
            let path = newest_version(store.dir(), "demo");
            for err in [
                fresh.get("demo").await.unwrap_err(),
                fresh.list().await.unwrap_err(),
                fresh
                    .update("demo", "x-9", &record(Some("c"), 3))
                    .await
                    .unwrap_err(),
            ] {
                match &err {
                    StoreError::Malformed { lease, detail } => {
                        assert_eq!(lease, "demo", "{case}");
                        assert!(detail.contains(&path.display().to_string()), "{case}: {detail}");
                    }
                    other => panic!("{case}: expected Malformed, got {other:?}"),
                }
            }
            assert_eq!(fs::read(&path).unwrap(), b"", "{case}: nothing written over it");
        }
    }

    #[tokio::test]
    async fn a_missing_newest_version_leaves_the_one_below_as_the_record() {
        // A crash after a write took the oldest file (renamed it aside) but
        // before its link was on disk: the newest name is simply not there.
        let (dir, writer) = store();
        let versions = held_with_renewals(&writer, 20).await;
        let files = writer.files("demo").unwrap();
        let newest = versions.last().unwrap();
        fs::rename(
            files.version_path(21),
            files.versions.join(".tmp-0123456789abcdef"),
        )
        .unwrap();
        let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
        let got = reader.get("demo").await.unwrap().unwrap();
        assert_eq!(got, versions[19]);
        let taken = reader
            .update("demo", &got.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(taken.version, newest.version, "the version after the one below");
        assert_eq!(reader.get("demo").await.unwrap(), Some(taken));
    }

    #[tokio::test]
    async fn leftover_temp_files_are_ignored_and_removed_once_old() {
        let (_dir, store) = store();
        let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        // As if writers died after writing half of their temporary files:
        // one a while ago, one just now (perhaps only stopped).
        let versions = store.dir().join("demo.lease");
        let old = versions.join(".tmp-dead");
        let young = versions.join(".tmp-young");
        for temp in [&old, &young] {
            fs::write(temp, "{\"incarnation\": \"dead").unwrap();
        }
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - 2 * STALE_TEMP_AGE)
            .unwrap();
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
        assert!(!old.exists(), "the next write removed the old one");
        assert!(young.exists(), "a young one may be a stopped writer's: kept");
    }

    #[tokio::test]
    async fn old_versions_are_removed_lowest_first_and_never_read() {
        let (_dir, store) = store();
        let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        for _ in 0..40 {
            v = store
                .update("demo", &v.version, &record(Some("a"), 1))
                .await
                .unwrap();
        }
        let files = store.files("demo").unwrap();
        let dir = open_lease_dir(&files).unwrap().unwrap();
        let counters = list_versions(&files, &dir, false).unwrap().counters;
        assert_eq!(
            counters,
            std::iter::once(1).chain(25..=41).collect::<Vec<_>>(),
            "the newest fsynced (the create), the newest and 16 before it"
        );
        assert_eq!(store.get("demo").await.unwrap(), Some(v));
    }

    #[tokio::test]
    async fn an_abandoned_create_does_not_write() {
        let (_dir, store) = store();
        // Hold the lease's lock as another process creating it would.
        let lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(store.dir().join(".demo.lock"))
            .unwrap();
        lock.lock().unwrap();
        let attempt = tokio::time::timeout(
            Duration::from_millis(100),
            store.create("demo", &record(Some("b"), 2)),
        )
        .await;
        assert!(attempt.is_err(), "the create waits for the lock");
        lock.unlock().unwrap();
        // Give the blocked thread time to get the lock and give up.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.get("demo").await.unwrap(), None);
    }

    #[tokio::test]
    async fn updates_do_not_wait_for_the_lock() {
        let (_dir, store) = store();
        let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let lock = File::options()
            .read(true)
            .write(true)
            .open(store.dir().join(".demo.lock"))
            .unwrap();
        lock.lock().unwrap();
        let v2 = tokio::time::timeout(
            Duration::from_secs(1),
            store.update("demo", &v1.version, &record(Some("b"), 2)),
        )
        .await
        .expect("an update takes no lock")
        .unwrap();
        assert_eq!(store.get("demo").await.unwrap(), Some(v2));
        lock.unlock().unwrap();
    }

    #[tokio::test]
    async fn a_record_of_an_older_baton_is_moved_keeping_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(Some("a"), 3);
        let legacy = serde_json::json!({
            "incarnation": "00aa11bb22cc33dd",
            "counter": 41,
            "record": r,
        });
        fs::write(dir.path().join("demo.lease.json"), legacy.to_string()).unwrap();
        fs::write(dir.path().join(".demo.lock"), format!("{:>20} {:>20}\n", 3, 1)).unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        assert!(!dir.path().join("demo.lease.json").exists());
        let current = store.get("demo").await.unwrap().unwrap();
        assert_eq!(current.version, "00aa11bb22cc33dd-41");
        assert_eq!(current.record, r);
        let next = store
            .update("demo", &current.version, &record(Some("b"), 4))
            .await
            .unwrap();
        assert_eq!(next.version, "00aa11bb22cc33dd-42");
        assert_eq!(floor_of(&store, "demo"), 4);
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
        remove_lease(writer.dir(), "demo");
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_watch_sees_a_store_directory_made_anew_while_an_old_watch_lives() {
        // All watches of a store share one inotify watcher: a watch made
        // after the directory was removed and made again must watch the
        // new directory, though an older watch (broken) still holds the
        // watcher.
        let (_dir, store) = store();
        let mut old = store.watch("old").await.unwrap();
        assert_eq!(next_within(&mut old, 1).await, None);
        fs::remove_dir(store.dir()).unwrap();
        fs::create_dir(store.dir()).unwrap();
        let mut watch = store.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 1).await, None);
        let writer = EmbeddedStore::open(store.dir()).unwrap();
        let created = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut seen = next_within(&mut watch, 1).await;
        while seen.as_ref() != Some(&created) {
            seen = next_within(&mut watch, 1).await;
        }
        drop(old);
    }

    /// The names in a lease's directory.
    fn names_in(dir: &Path, lease: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir.join(format!("{lease}.lease")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn versions_are_written_through_unnamed_files_or_named_ones_alike() {
        let (_dir, store) = store();
        assert!(
            store.unnamed_temps.load(Ordering::Relaxed),
            "this file system and process can (O_TMPFILE, /proc/self/fd)"
        );
        let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        for (i, named) in [false, true, false, true].into_iter().enumerate() {
            store.unnamed_temps.store(!named, Ordering::Relaxed);
            v = store
                .update("demo", &v.version, &record(Some("a"), 1))
                .await
                .unwrap();
            assert_eq!(
                store.get("demo").await.unwrap(),
                Some(v.clone()),
                "named: {named}"
            );
            // Nothing but versions left behind, either way.
            let expected: Vec<String> = (1..=i as u64 + 2).map(version_name).collect();
            assert_eq!(names_in(store.dir(), "demo"), expected, "named: {named}");
            // A stale write fails either way.
            let err = store
                .update(
                    "demo",
                    &format!("{}-1", v.version.split('-').next().unwrap()),
                    &record(None, 1),
                )
                .await
                .unwrap_err();
            assert!(err.is_conflict(), "{err}");
        }
        // A write into a lease deleted since it was read fails, whichever
        // file it writes: unnamed, named, or an old version's taken.
        for (named, recycle) in [(false, false), (true, false), (false, true)] {
            store.unnamed_temps.store(!named, Ordering::Relaxed);
            let files = store.files("demo").unwrap();
            let (dir, current, listing) = read_current(&files).unwrap().unwrap();
            let recycle = recycle.then(|| listing.counters[0]);
            fs::rename(&files.versions, store.dir().join(".demo.aside")).unwrap();
            let stored = StoredRecord {
                counter: current.counter + 1,
                write: random_id(),
                replaced: current.write.clone(),
                ..current
            };
            let writer = Writer {
                watcher: store.watcher.clone(),
                unnamed_temps: store.unnamed_temps.clone(),
                last_writes: store.last_writes.clone(),
            };
            let err = commit(&files, &dir, recycle, &stored, Durability::Visible, &writer, None).unwrap_err();
            assert!(err.to_string().contains("deleted while being written"), "{err}");
            fs::rename(store.dir().join(".demo.aside"), &files.versions).unwrap();
        }
    }

    /// The inode of each version file of `lease`, by counter.
    fn inodes_in(dir: &Path, lease: &str) -> std::collections::BTreeMap<u64, u64> {
        use std::os::unix::fs::MetadataExt;
        fs::read_dir(dir.join(format!("{lease}{LEASE_SUFFIX}")))
            .unwrap()
            .filter_map(|entry| {
                let entry = entry.unwrap();
                let counter = version_counter(entry.file_name().as_encoded_bytes())?;
                Some((counter, entry.metadata().unwrap().ino()))
            })
            .collect()
    }

    #[tokio::test]
    async fn a_write_takes_the_file_of_the_version_it_removes() {
        let (_dir, store) = store();
        let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut files_ever = std::collections::BTreeSet::new();
        for _ in 0..3 * KEPT_VERSIONS {
            v = store
                .update("demo", &v.version, &record(Some("a"), 1))
                .await
                .unwrap();
            let inodes = inodes_in(store.dir(), "demo");
            assert!(inodes.len() as u64 <= KEPT_VERSIONS + 2, "{inodes:?}");
            files_ever.extend(inodes.values().copied());
        }
        // The first KEPT_VERSIONS + 2 versions got files of their own (the
        // first, fsynced, is kept); every later write took the file of the
        // version it removed.
        assert_eq!(files_ever.len() as u64, KEPT_VERSIONS + 2, "{files_ever:?}");
        assert_eq!(store.get("demo").await.unwrap(), Some(v));
        assert_eq!(
            names_in(store.dir(), "demo").len() as u64,
            KEPT_VERSIONS + 2,
            "no temporary file left behind"
        );
    }

    #[test]
    fn a_reader_never_reads_a_version_whose_file_is_taken_meanwhile() {
        // One thread writes as fast as it can (each write taking the file of
        // the oldest version); another reads the oldest version, the one
        // about to be taken, over and over. Every version it reads must be
        // that version whole: its lease duration is its counter in ms,
        // written in texts of varying length ("999ms", "1s", "1s 1ms"), so
        // that a longer old file is cut too.
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let marked = |counter: u64| LeaseRecord {
            plugins: None,
            yielded: None,
            lease_duration: Duration::from_millis(counter),
            ..record(Some("a"), 1)
        };
        let mut v = runtime.block_on(store.create("demo", &marked(1))).unwrap();
        let files = store.files("demo").unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (files, done) = (files.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut read, mut gone) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    let dir = open_lease_dir(&files).unwrap().unwrap();
                    let listing = list_versions(&files, &dir, false).unwrap();
                    let (Some(&counter), Some(&inode)) = (listing.counters.first(), listing.inodes.first())
                    else {
                        continue;
                    };
                    match read_version(&files, &dir, counter, Some(inode)) {
                        Ok(Some(stored)) => {
                            assert_eq!(stored.record.lease_duration, Duration::from_millis(counter));
                            read += 1;
                        }
                        Ok(None) => gone += 1,
                        Err(e) => panic!("reading version {counter}: {e}"),
                    }
                }
                (read, gone)
            })
        };
        for counter in 2..2_000 {
            v = runtime
                .block_on(store.update("demo", &v.version, &marked(counter)))
                .unwrap();
        }
        done.store(true, Ordering::Relaxed);
        let (read, gone) = reader.join().unwrap();
        assert!(read > 0, "read {read}, gone {gone}");
        eprintln!("read {read} versions whole, {gone} taken or removed before read");
    }

    /// How many renewals of `store` did not read first.
    fn renewed_unread(store: &EmbeddedStore) -> u64 {
        store.last_writes.renewed_unread.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn renewals_over_the_stores_own_version_do_not_read_first() {
        let (_dir, store) = store();
        let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        // The first update reads (the store did not write version 1 through
        // an update); the renewals after it do not.
        for _ in 0..3 * KEPT_VERSIONS {
            v = store
                .update("demo", &v.version, &record(Some("a"), 1))
                .await
                .unwrap();
        }
        assert_eq!(renewed_unread(&store), 3 * KEPT_VERSIONS - 1);
        assert_eq!(store.get("demo").await.unwrap(), Some(v.clone()));
        assert_eq!(
            EmbeddedStore::open(store.dir())
                .unwrap()
                .get("demo")
                .await
                .unwrap(),
            Some(v.clone()),
            "another store reads the same"
        );
        let names = names_in(store.dir(), "demo");
        // The newest fsynced version (the create) is kept too.
        assert_eq!(names.len() as u64, KEPT_VERSIONS + 2, "{names:?}");
        // A new term or holder is read first, as every write of another store.
        let before = renewed_unread(&store);
        v = store
            .update("demo", &v.version, &record(Some("b"), 2))
            .await
            .unwrap();
        store
            .update("demo", &v.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(
            renewed_unread(&store),
            before + 1,
            "the holder's change was read first"
        );
    }

    #[tokio::test]
    async fn a_renewal_not_read_first_never_lands_over_another_stores_write() {
        let (_dir, a) = store();
        let b = EmbeddedStore::open(a.dir()).unwrap();
        let v1 = a.create("demo", &record(Some("a"), 1)).await.unwrap();
        let va = a
            .update("demo", &v1.version, &record(Some("a"), 1))
            .await
            .unwrap();
        // b writes the next version: a's renewal over its own finds it there.
        let mut vb = b
            .update("demo", &va.version, &record(Some("b"), 2))
            .await
            .unwrap();
        let err = a
            .update("demo", &va.version, &record(Some("a"), 1))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(a.get("demo").await.unwrap(), Some(vb.clone()));
        // a renews again, and is told that b wrote since.
        let va = a
            .update("demo", &vb.version, &record(Some("a"), 2))
            .await
            .unwrap();
        let va = a
            .update("demo", &va.version, &record(Some("a"), 2))
            .await
            .unwrap();
        // b writes so many versions over a's that the one after a's is gone:
        // a's renewal, not read first, re-creates that name, and must find
        // out that it is stale.
        // (A release first: the version that starts b's term is kept as
        // the newest fsynced one, the release is not.)
        vb = b.update("demo", &va.version, &record(None, 2)).await.unwrap();
        vb = b
            .update("demo", &vb.version, &record(Some("b"), 3))
            .await
            .unwrap();
        for _ in 0..KEPT_VERSIONS + 4 {
            vb = b
                .update("demo", &vb.version, &record(Some("b"), 3))
                .await
                .unwrap();
        }
        let unread = renewed_unread(&a);
        let err = a
            .update("demo", &va.version, &record(Some("a"), 2))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert!(err.to_string().contains("stale"), "{err}");
        assert_eq!(renewed_unread(&a), unread, "it did not count as renewed");
        assert_eq!(a.get("demo").await.unwrap(), Some(vb.clone()));
        assert_eq!(b.get("demo").await.unwrap(), Some(vb.clone()));
        // Deleted and created again up to the same counter by b: a's
        // renewal over its own old version writes nothing.
        let va = a
            .update("demo", &vb.version, &record(Some("a"), 4))
            .await
            .unwrap();
        let va = a
            .update("demo", &va.version, &record(Some("a"), 4))
            .await
            .unwrap();
        let counter = |v: &Versioned| v.version.rsplit('-').next().unwrap().parse::<u64>().unwrap();
        assert_eq!(b.get("demo").await.unwrap(), Some(va.clone()));
        assert!(b.delete("demo").await.unwrap());
        let mut vb = recreate(&b, "demo", &record(Some("b"), 5)).await;
        while counter(&vb) < counter(&va) {
            vb = b
                .update("demo", &vb.version, &record(Some("b"), 5))
                .await
                .unwrap();
        }
        let err = a
            .update("demo", &va.version, &record(Some("a"), 4))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(b.get("demo").await.unwrap(), Some(vb));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_does_not_read_back_its_own_stores_writes() {
        let (_dir, store) = store();
        let other = EmbeddedStore::open(store.dir()).unwrap();
        let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut watch = store.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 1).await, Some(v.clone()));
        for _ in 0..KEPT_VERSIONS + 3 {
            v = store
                .update("demo", &v.version, &record(Some("a"), 1))
                .await
                .unwrap();
            // (Renewals come seconds apart; a burst of more writes than
            // are remembered, ahead of the inotify thread, would be read.)
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Its own writes, and the old versions they removed: nothing.
        let quiet = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
        assert!(quiet.is_err(), "the store's own writes wake no read: {quiet:?}");
        // Another store's write is read.
        let theirs = other
            .update("demo", &v.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(
            next_change(&mut watch, &Some(v.clone())).await,
            Some(theirs.clone())
        );
        // A write of this store that loses to another's (the same name)
        // does not hide the other's.
        let ours = store.update("demo", &v.version, &record(Some("a"), 1)).await;
        assert!(ours.unwrap_err().is_conflict());
        let newer = other
            .update("demo", &theirs.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(next_change(&mut watch, &Some(theirs)).await, Some(newer));
    }
}
