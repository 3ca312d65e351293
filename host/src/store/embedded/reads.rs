//! Reading a lease: listing its directory, reading the newest complete
//! version (checked to be still that version's file after reading), and a
//! torn newest version read as a renewal of the newest readable one.

use super::*;

/// Reads a lease's record and, if there is none, its [`LockState`] (zeros
/// if it has none), the latter under a shared lock so that a create's state
/// is never read half-written.
pub(super) fn observe(files: &LeaseFiles) -> Result<Found, StoreError> {
    let missing = |state: LockState| Found::Missing {
        last: None,
        floor: Some(state.floor),
        creates: Some(state.creates),
    };
    if let Some((_, stored, _)) = read_current(files)? {
        return Ok(Found::Record(stored.into_versioned()));
    }
    let lock = match File::open(files.lock()) {
        Ok(lock) => lock,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(missing(read_lock_state(files)?)),
        Err(e) => return Err(io_error(&files.lease, "cannot open lock file", &files.lock(), e)),
    };
    // Give up after a while, as a timeout would.
    let deadline = Instant::now() + SHARED_LOCK_WAIT;
    take_lock(files, &lock, true, &|| {
        (Instant::now() >= deadline).then(|| {
            format!(
                "{} stayed locked by a create or delete for {}",
                files.lock().display(),
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

/// Opens the lease's directory; `None` if there is none.
pub(super) fn open_lease_dir(files: &LeaseFiles) -> Result<Option<OwnedFd>, StoreError> {
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
pub(super) struct Listing {
    /// The counters of its version files, lowest first.
    pub(super) counters: Vec<u64>,
    /// The inode of each of them (as listed), in the same order.
    pub(super) inodes: Vec<u64>,
    /// The names of its temporary files.
    pub(super) temps: Vec<OsString>,
}

/// Lists the lease directory `dir`, from its start: reads it through `dir`
/// itself (no other descriptor), from the start if `rewind` (else `dir` was
/// just opened).
pub(super) fn list_versions(files: &LeaseFiles, dir: &OwnedFd, rewind: bool) -> Result<Listing, StoreError> {
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
pub(super) fn read_version(
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
pub(super) fn read_to_end(file: &OwnedFd) -> Result<Vec<u8>, Errno> {
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
pub(super) fn parse_record(
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
pub(super) fn read_current(
    files: &LeaseFiles,
) -> Result<Option<(OwnedFd, StoredRecord, Listing)>, StoreError> {
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
pub(super) fn read_torn(
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
