//! A lease's creation, deletion and migration from the older layout, and
//! the file helpers they use (replacing a file whole, syncing a folder,
//! errors naming the file).

use super::*;

/// Moves a new lease directory holding `stored` into place (the caller
/// holds the lock and found no record). A directory without versions (its
/// files removed by hand) is no record and is replaced.
pub(super) fn install_lease_dir(files: &LeaseFiles, stored: &StoredRecord) -> Result<(), StoreError> {
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
pub(super) fn remove_leftovers(files: &LeaseFiles) {
    let Ok(entries) = fs::read_dir(files.dir.as_path()) else {
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
pub(super) fn remove_lease_dir(files: &LeaseFiles) -> Result<bool, StoreError> {
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
pub(super) fn move_legacy_record(files: &LeaseFiles) -> Result<(), StoreError> {
    let legacy = files.legacy();
    let bytes = match fs::read(&legacy) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(&files.lease, "cannot read", &legacy, e)),
    };
    // Moved already, by a process that died before removing the old file.
    if open_lease_dir(files)?.is_none() {
        let stored = parse_record(files, &legacy, &bytes, None)?;
        install_lease_dir(files, &stored)?;
    }
    fs::remove_file(&legacy).map_err(|e| io_error(&files.lease, "cannot remove", &legacy, e))?;
    let _ = fs::remove_file(files.dir.join(format!(".{}.tmp", files.lease)));
    sync_dir(files)
}

/// How far a write must have gone when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Durability {
    /// Visible to every process (linked into place): a renewal.
    Visible,
    /// On disk too (fsynced, and the directory): everything else.
    Durable,
}

/// Replaces `path` with `contents` atomically and durably: writes `temp`,
/// fsyncs it, renames it over `path` and fsyncs the directory. A process
/// killed at any point leaves the old file or the new one, never a torn
/// one. The caller holds the lease's lock (so `temp` is its own).
pub(super) fn replace_file(
    files: &LeaseFiles,
    temp: &Path,
    path: &Path,
    contents: &[u8],
) -> Result<(), StoreError> {
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
pub(super) fn sync_dir(files: &LeaseFiles) -> Result<(), StoreError> {
    File::open(files.dir.as_path())
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io_error(&files.lease, "cannot sync", &files.dir, e))
}

/// [`io_error`] for a system call's error number.
pub(super) fn errno_error(lease: &str, what: &str, path: &Path, err: Errno) -> StoreError {
    io_error(lease, what, path, io::Error::from(err))
}

/// Maps an I/O error: permission problems are refusals, the rest are taken
/// as transient.
pub(super) fn io_error(lease: &str, what: &str, path: &Path, err: io::Error) -> StoreError {
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
