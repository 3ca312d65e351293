//! Writing a version: updating a record, committing a new version file by
//! `link` (recycling the oldest kept file), confirming it landed, and
//! pruning old versions.

use super::*;

/// An update: writes `record` over the current record if its version is
/// still `version`.
pub(super) fn update_record(
    files: &LeaseFiles,
    version: &str,
    record: LeaseRecord,
    abandoned: &AtomicBool,
    writer: &Writer,
) -> Result<Versioned, StoreError> {
    if let Some(last) = own_last_write(files, version, &record, writer)? {
        return renew_unread(files, last, record, abandoned, writer);
    }
    let (dir, current, listing) = read_at(files, version)?;
    let new_term = record.term > current.record.term;
    let floor_checked = floor_covers(files, record.term, new_term)?;
    let renewal =
        !new_term && record.holder == current.record.holder && record.instance == current.record.instance;
    // The newest durable version before this write.
    let durable = current.durable;
    let stored = next_version(current, record, renewal);
    if abandoned.load(Ordering::SeqCst) {
        return Err(abandoned_error(files));
    }
    let recycle = recyclable(&listing, durable, stored.counter);
    let durability = match renewal {
        true => Durability::Visible,
        false => Durability::Durable,
    };
    let file = commit(files, &dir, recycle, &stored, durability, writer, None)?;
    // Renewals over this version need not read first: the floor is known to
    // reach its term.
    if floor_checked && let (Some(dir), Some((file, contents))) = (file_id(&dir, ""), file_state(&file, "")) {
        writer.last_writes.keep(
            &files.lease,
            LastWrite {
                stored: stored.clone(),
                dir,
                file,
                contents,
            },
        );
    }
    Ok(stored.into_versioned())
}

/// The lease's directory, current record and listing, if the current
/// record is at `version`; a conflict if not, or if there is none.
fn read_at(files: &LeaseFiles, version: &str) -> Result<(OwnedFd, StoredRecord, Listing), StoreError> {
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
    Ok((dir, current, listing))
}

/// Makes sure the floor reaches `term` before a write in it; whether it is
/// known to. A new term must raise the floor first. A renewal raises a
/// floor that was lost (emptied by hand, or never written by an older
/// baton), and goes on if the floor cannot be read: the next new term
/// reports it.
fn floor_covers(files: &LeaseFiles, term: u64, new_term: bool) -> Result<bool, StoreError> {
    match floor_reaches(files, term) {
        Ok(false) => raise_floor(files, term).map(|()| true),
        Ok(true) => Ok(true),
        Err(e) if new_term => Err(e),
        Err(_) => Ok(false),
    }
}

/// The version after `current` holding `record`; a renewal keeps the
/// newest durable version it had.
fn next_version(current: StoredRecord, record: LeaseRecord, renewal: bool) -> StoredRecord {
    StoredRecord {
        incarnation: current.incarnation,
        counter: current.counter + 1,
        write: random_id(),
        replaced: current.write,
        durable: match renewal {
            true => current.durable,
            false => current.counter + 1,
        },
        record,
    }
}

/// The oldest version, if writing version `counter` makes it one to
/// remove: its file is taken for the new version's. Not the newest fsynced
/// one, `durable`: neither the one before this write (until this one is on
/// disk) nor this one's.
fn recyclable(listing: &Listing, durable: u64, counter: u64) -> Option<u64> {
    listing
        .counters
        .iter()
        .copied()
        .find(|&c| c != durable)
        .filter(|&oldest| oldest + KEPT_VERSIONS < counter)
}

/// Encodes a version file.
pub(super) fn encode(files: &LeaseFiles, stored: &StoredRecord) -> Result<Vec<u8>, StoreError> {
    // A renewal's record is about 500 bytes: written without growing (and
    // under glibc's 1 KiB, above which an allocation consolidates its
    // free lists).
    let mut json = Vec::with_capacity(768);
    serde_json::to_writer_pretty(&mut json, stored).map_err(|e| StoreError::Refused {
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
pub(super) fn commit(
    files: &LeaseFiles,
    dir: &OwnedFd,
    recycle: Option<u64>,
    stored: &StoredRecord,
    durability: Durability,
    writer: &Writer,
    over: Option<&LastWrite>,
) -> Result<File, StoreError> {
    let (file, temp) = write_version_file(files, dir, recycle, stored, durability, writer)?;
    #[cfg(test)]
    tests::before_link();
    let own = writer.watcher.expect_own(files, stored.counter);
    link_new_version(files, dir, &file, &temp, stored, writer)?;
    let listing = match replaced_in_place(files, dir, over) {
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

/// Writes the version `stored` into a file not linked yet: the old
/// version `recycle`'s if it can take it, else a new one; synced if it is
/// to be durable. A temporary name is removed if the write fails.
fn write_version_file(
    files: &LeaseFiles,
    dir: &OwnedFd,
    recycle: Option<u64>,
    stored: &StoredRecord,
    durability: Durability,
    writer: &Writer,
) -> Result<(File, Temp), StoreError> {
    let mut json = encode(files, stored)?;
    let recycled = recycle.and_then(|counter| recycle_version_file(dir, counter));
    let (file, temp) = match recycled {
        Some(taken) => taken,
        None => new_version_file(files, dir, &writer.unnamed_temps)?,
    };
    let written = match &temp {
        Temp::Recycled(_) => overwrite(&file, &mut json),
        Temp::Unnamed | Temp::Named(_) => (&file).write_all(&json),
    };
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
    Ok((file, temp))
}

/// Writes `json` over the old version in `file`. An old version as long
/// or a little longer (renewals of one lease differ by a few bytes) is
/// overwritten whole, `json` padded with spaces (JSON ignores trailing
/// white space): a file cut to length costs a second change of the inode,
/// and a second event for every watcher of the directory.
fn overwrite(file: &File, json: &mut Vec<u8>) -> io::Result<()> {
    /// The most padding kept rather than cutting the file.
    const MOST_PADDING: u64 = 256;
    let old = rustix::fs::fstat(file).map_err(io::Error::from)?.st_size.max(0) as u64;
    let len = json.len() as u64;
    let pad = old >= len && old - len <= MOST_PADDING;
    if pad {
        // Before the final newline.
        json.pop();
        json.resize(old as usize - 1, b' ');
        json.push(b'\n');
    }
    (&*file).write_all(json)?;
    match old > len && !pad {
        true => file.set_len(len),
        false => Ok(()),
    }
}

/// Links the written `file` under the name of version `stored`: the
/// compare-and-swap, which fails if another writer linked that version
/// first.
fn link_new_version(
    files: &LeaseFiles,
    dir: &OwnedFd,
    file: &File,
    temp: &Temp,
    stored: &StoredRecord,
    writer: &Writer,
) -> Result<(), StoreError> {
    match link_version(dir, file, temp, &version_name(stored.counter)) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(StoreError::Conflict {
            lease: files.lease.clone(),
            detail: format!(
                "version {}-{} was replaced by another writer first",
                stored.incarnation,
                stored.counter - 1
            ),
        }),
        // Not through /proc/self/fd, though the directory is there: later
        // writes of this store use named temporary files. This one was not
        // written.
        Err(Errno::NOENT)
            if *temp == Temp::Unnamed && rustix::fs::fstat(dir).is_ok_and(|d| d.st_nlink > 0) =>
        {
            writer.unnamed_temps.store(false, Ordering::Relaxed);
            Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail: format!(
                    "cannot link an unnamed file into {} through {PROC_FDS}; \
                     later writes use named temporary files",
                    files.versions.display()
                ),
            })
        }
        // The directory was removed, or the temporary file was (taken for
        // one left by a dead writer: this one was stopped for a minute).
        Err(Errno::NOENT) => Err(deleted_meanwhile(files)),
        Err(e) => Err(errno_error(
            &files.lease,
            "cannot link",
            &files.version_path(stored.counter),
            e,
        )),
    }
}

/// Whether the write was over `over`, a version of this store's not read
/// first, that still has its name (so none of the later ones was removed,
/// see [`confirm`]), in the lease's directory as it was: then it needs no
/// confirming.
fn replaced_in_place(files: &LeaseFiles, dir: &OwnedFd, over: Option<&LastWrite>) -> bool {
    over.is_some_and(|last| {
        file_id(rustix::fs::CWD, &files.versions) == Some(last.dir)
            && file_id(dir, version_name(last.stored.counter)) == Some(last.file)
    })
}

/// Where an unnamed file's descriptors are linked from.
pub(super) const PROC_FDS: &str = "/proc/self/fd";

/// A new version's file before it is linked under the version's name.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Temp {
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
    pub(super) fn name(&self) -> Option<&str> {
        match self {
            Temp::Unnamed => None,
            Temp::Named(name) | Temp::Recycled(name) => Some(name),
        }
    }

    /// For messages.
    pub(super) fn path(&self, files: &LeaseFiles) -> PathBuf {
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
pub(super) fn recycle_version_file(dir: &OwnedFd, counter: u64) -> Option<(File, Temp)> {
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
pub(super) fn new_version_file(
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
pub(super) fn link_version(dir: &OwnedFd, file: &File, temp: &Temp, name: &str) -> Result<(), Errno> {
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
pub(super) fn deleted_meanwhile(files: &LeaseFiles) -> StoreError {
    StoreError::Conflict {
        lease: files.lease.clone(),
        detail: "deleted while being written".into(),
    }
}

/// Right after linking `stored` (whose file is still open as `file`):
/// whether it is the lease's record, or was, or was a stale write that
/// re-created an old version's name. Returns the listing it read.
pub(super) fn confirm(
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
pub(super) fn prune(dir: &OwnedFd, listing: &Listing, newest: u64, durable: u64) {
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
