//! Renewals over this store's own last write, which read nothing first:
//! what the store keeps of its last writes and the check that the write
//! landed over the record it expected.

use super::*;

/// What an update needs of its store besides the lease's files.
pub(super) struct Writer {
    /// To tell the store's watches which version is its own write.
    pub(super) watcher: Arc<DirWatcher>,
    /// See [`EmbeddedStore::unnamed_temps`].
    pub(super) unnamed_temps: Arc<AtomicBool>,
    /// See [`EmbeddedStore::last_writes`].
    pub(super) last_writes: Arc<LastWrites>,
}

/// A file's identity over time: its device and inode, and when it was
/// made, so that an inode number freed and given to a new file is told
/// apart from the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileId {
    pub(super) dev: (u32, u32),
    pub(super) ino: u64,
    pub(super) born: (i64, u32),
}

/// The identity of `name` in `dir` (of `dir` itself if `name` is empty),
/// without following a link; `None` if it cannot be had (no such file, or a
/// file system that does not keep birth times).
pub(super) fn file_id(dir: impl std::os::fd::AsFd, name: impl AsRef<Path>) -> Option<FileId> {
    file_state(dir, name).map(|(id, _)| id)
}

/// What a write in place changes of a file: when its inode last changed,
/// and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Contents {
    changed: (i64, u32),
    size: u64,
}

/// The identity and [`Contents`] of `name` in `dir`, as [`file_id`].
pub(super) fn file_state(dir: impl std::os::fd::AsFd, name: impl AsRef<Path>) -> Option<(FileId, Contents)> {
    use rustix::fs::StatxFlags;
    let name = name.as_ref();
    let flags = match name.as_os_str().is_empty() {
        true => AtFlags::EMPTY_PATH,
        false => AtFlags::SYMLINK_NOFOLLOW,
    };
    let wanted = StatxFlags::INO | StatxFlags::BTIME | StatxFlags::CTIME | StatxFlags::SIZE;
    let stat = rustix::fs::statx(dir, name, flags, wanted).ok()?;
    let id = FileId {
        dev: (stat.stx_dev_major, stat.stx_dev_minor),
        ino: stat.stx_ino,
        born: (stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec),
    };
    let contents = Contents {
        changed: (stat.stx_ctime.tv_sec, stat.stx_ctime.tv_nsec),
        size: stat.stx_size,
    };
    StatxFlags::from_bits_retain(stat.stx_mask)
        .contains(wanted)
        .then_some((id, contents))
}

/// What a store last wrote of a lease: the version, the lease directory it
/// was written in and its file, kept after a write whose lease's floor was
/// found at or above the record's term.
#[derive(Clone, Debug)]
pub(super) struct LastWrite {
    pub(super) stored: StoredRecord,
    pub(super) dir: FileId,
    pub(super) file: FileId,
    /// The file as this store left it: a version changed in place since
    /// (an operator's edit, a garbled file) is read before it is renewed
    /// over, so that baton never writes over what it cannot read.
    pub(super) contents: Contents,
}

/// The [`LastWrite`] of each lease a store wrote, for renewals.
#[derive(Debug, Default)]
pub(super) struct LastWrites {
    pub(super) by_lease: std::sync::Mutex<std::collections::HashMap<String, LastWrite>>,
    /// How many renewals did not read first.
    #[cfg(test)]
    pub(super) renewed_unread: std::sync::atomic::AtomicU64,
}

impl LastWrites {
    pub(super) fn take(&self, lease: &str) -> Option<LastWrite> {
        self.by_lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lease)
    }

    pub(super) fn keep(&self, lease: &str, last: LastWrite) {
        self.by_lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lease.to_owned(), last);
    }

    pub(super) fn forget(&self, lease: &str) {
        self.take(lease);
    }
}

/// The version this store wrote last of the lease, with the lease's
/// directory, if `record` renews it (see [Renewals](self#renewals)) and the
/// directory is the one it was written in; `None` if not: the caller then
/// reads and writes as for any update.
pub(super) fn own_last_write(
    files: &LeaseFiles,
    version: &str,
    record: &LeaseRecord,
    writer: &Writer,
) -> Result<Option<(LastWrite, OwnedFd)>, StoreError> {
    // Taken out: kept again only by a write that lands.
    let Some(last) = writer.last_writes.take(&files.lease) else {
        return Ok(None);
    };
    let held = &last.stored.record;
    if !last.stored.is_version(version)
        || record.term != held.term
        || record.holder != held.holder
        || record.instance != held.instance
    {
        return Ok(None);
    }
    let Some(dir) = open_lease_dir(files)? else {
        return Ok(None);
    };
    if file_id(&dir, "") != Some(last.dir)
        || file_state(&dir, version_name(last.stored.counter)) != Some((last.file, last.contents))
    {
        return Ok(None);
    }
    Ok(Some((last, dir)))
}

/// Writes `record` over `last`, this store's last write, in the lease's
/// directory `dir`, without reading first (see [`own_last_write`]).
pub(super) fn renew_unread(
    files: &LeaseFiles,
    (last, dir): (LastWrite, OwnedFd),
    record: LeaseRecord,
    abandoned: &AtomicBool,
    writer: &Writer,
) -> Result<Versioned, StoreError> {
    let stored = StoredRecord {
        incarnation: last.stored.incarnation.clone(),
        counter: last.stored.counter + 1,
        write: random_id(),
        replaced: last.stored.write.clone(),
        durable: last.stored.durable,
        record,
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
    if let Some((id, contents)) = file_state(&file, "") {
        writer.last_writes.keep(
            &files.lease,
            LastWrite {
                stored: stored.clone(),
                dir: last.dir,
                file: id,
                contents,
            },
        );
    }
    #[cfg(test)]
    writer.last_writes.renewed_unread.fetch_add(1, Ordering::Relaxed);
    Ok(stored.into_versioned())
}
