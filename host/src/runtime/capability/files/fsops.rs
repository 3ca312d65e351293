//! Mutating file operations other than writes, made inside the window the
//! kernel closes at the force-stop time (Linux).
//!
//! wasmtime-wasi's `open-at` (creating or truncating), `rename-at`,
//! `link-at`, `symlink-at`, `unlink-file-at`, `create-directory-at`,
//! `remove-directory-at` and `set-size` pass only the host-call fence: a
//! thread held up between that check and the system call lands them after
//! the force-stop. Here each is replaced by the same steps as
//! wasmtime-wasi's (its permission checks, in its order, and its error
//! codes), ending in one system call made by [`fenced`](super::fenced):
//!
//! - what is resolved first is read-only: the parent directory of the path
//!   (the directories of both paths of a rename or link) is opened with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the guest's
//!   directory, as cap-std resolves it (an `O_PATH` descriptor of this
//!   call's own);
//! - the last, mutating system call (`renameat`, `linkat`, `symlinkat`,
//!   `unlinkat`, `mkdirat` on the parents' descriptors; `openat2` with the
//!   guest's flags on a duplicate of the guest's directory; `ftruncate` on
//!   the guest's file; `utimensat` on a duplicate of the guest's
//!   descriptor or on the parent) is made in the window, which points
//!   those descriptors at an empty pipe if the force-stop time passes
//!   first, so the call fails (`ENOTDIR`, `EINVAL`) or changes only the
//!   pipe instead of landing, and the guest traps.
//!
//! Invariant: no path given to the last call escapes its directory
//! descriptor: it is one component (never `..`; a symlink there is not
//! followed by these calls), or, for `open-at`, resolved by `openat2`
//! beneath the guest's directory, with `O_NOFOLLOW` where the guest asked
//! not to follow.
//!
//! Where `openat2` cannot be used (an old kernel, a seccomp filter:
//! `ENOSYS`, `EPERM`), the operation is left to wasmtime-wasi, check-then-act
//! as before. `open-at` that neither creates nor truncates is left to
//! wasmtime-wasi too, and so is `set-times-at` that follows a symlink in
//! its last component (`docs/architecture.md`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::Arc;

use std::time::SystemTime;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use wasmtime::StoreContextMut;
use wasmtime::component::{LinkerInstance, Resource};
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, FsPerms, OpenMode};
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, HostDescriptor, NewTimestamp, OpenFlags, PathFlags,
};

use wasmtime_wasi::WasiView;

use super::FilesView;
use crate::runtime::fence::{BLOCKING_FILE_IO, fenced};
use crate::runtime::trap::StoppedByHost;

type Fd = Resource<Descriptor>;

/// A guest's answer (or a trap); `None`: left to wasmtime-wasi.
type Outcome<T> = wasmtime::Result<Option<Result<T, ErrorCode>>>;

/// Replaces the operations named in the module docs in `types`
/// (`wasi:filesystem/types`).
pub fn add_to_linker<T: WasiView + 'static>(
    types: &mut LinkerInstance<'_, T>,
    get: for<'a> fn(&'a mut T) -> FilesView<'a>,
) -> wasmtime::Result<()> {
    add_renames_and_links(types, get)?;
    add_entry_removals_and_mkdir(types, get)?;
    add_open_and_set_size(types, get)?;
    add_set_times(types, get)
}

/// `set-times` (on the guest's descriptor) and `set-times-at` (an entry
/// of the path's parent).
fn add_set_times<T: WasiView + 'static>(
    types: &mut LinkerInstance<'_, T>,
    get: for<'a> fn(&'a mut T) -> FilesView<'a>,
) -> wasmtime::Result<()> {
    types.func_wrap_async(
        "[method]descriptor.set-times",
        move |mut store: StoreContextMut<'_, T>, (fd, atime, mtime): (Fd, NewTimestamp, NewTimestamp)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(done) = set_times(state, &fd, atime, mtime)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::set_times(&mut fs, fd, atime, mtime).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-times-at",
        move |mut store: StoreContextMut<'_, T>,
              (fd, flags, path, atime, mtime): (Fd, PathFlags, String, NewTimestamp, NewTimestamp)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(done) = set_times_at(state, &fd, flags, &path, atime, mtime)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::set_times_at(&mut fs, fd, flags, path, atime, mtime).await)
            })
        },
    )?;
    Ok(())
}

/// `rename-at`, `link-at` and `symlink-at`: a new name, in the parent
/// of each path.
fn add_renames_and_links<T: WasiView + 'static>(
    types: &mut LinkerInstance<'_, T>,
    get: for<'a> fn(&'a mut T) -> FilesView<'a>,
) -> wasmtime::Result<()> {
    types.func_wrap_async(
        "[method]descriptor.rename-at",
        move |mut store: StoreContextMut<'_, T>, (fd, old, new_fd, new): (Fd, String, Fd, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(done) = rename_at(state, &fd, &old, &new_fd, &new)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::rename_at(&mut fs, fd, old, new_fd, new).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        move |mut store: StoreContextMut<'_, T>,
              (fd, flags, old, new_fd, new): (Fd, PathFlags, String, Fd, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(done) = link_at(state, &fd, flags, &old, &new_fd, &new)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::link_at(&mut fs, fd, flags, old, new_fd, new).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        move |mut store: StoreContextMut<'_, T>, (fd, target, path): (Fd, String, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(done) = symlink_at(state, &fd, &target, &path)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::symlink_at(&mut fs, fd, target, path).await)
            })
        },
    )?;
    Ok(())
}

/// `unlink-file-at`, `remove-directory-at` and `create-directory-at`: one
/// entry of the path's parent.
fn add_entry_removals_and_mkdir<T: WasiView + 'static>(
    types: &mut LinkerInstance<'_, T>,
    get: for<'a> fn(&'a mut T) -> FilesView<'a>,
) -> wasmtime::Result<()> {
    types.func_wrap_async(
        "[method]descriptor.unlink-file-at",
        move |mut store: StoreContextMut<'_, T>, (fd, path): (Fd, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                let unlink = |dir: &OwnedFd, name: &OsStr| rustix::fs::unlinkat(dir, name, AtFlags::empty());
                if let Some(done) = at_parent(state, &fd, Path::new(&path), unlink)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::unlink_file_at(&mut fs, fd, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.remove-directory-at",
        move |mut store: StoreContextMut<'_, T>, (fd, path): (Fd, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                let rmdir = |dir: &OwnedFd, name: &OsStr| rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR);
                if let Some(done) = at_parent(state, &fd, Path::new(&path), rmdir)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::remove_directory_at(&mut fs, fd, path).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        move |mut store: StoreContextMut<'_, T>, (fd, path): (Fd, String)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                let mkdir = |dir: &OwnedFd, name: &OsStr| {
                    rustix::fs::mkdirat(dir, name, Mode::from_bits_truncate(0o777))
                };
                let stripped = strip_dir_suffix(Path::new(&path));
                if let Some(done) = at_parent(state, &fd, Path::new(&stripped), mkdir)? {
                    return Ok((done,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::create_directory_at(&mut fs, fd, path).await)
            })
        },
    )?;
    Ok(())
}

/// `set-size` (truncating the guest's file) and `open-at` (creating or
/// truncating a file).
fn add_open_and_set_size<T: WasiView + 'static>(
    types: &mut LinkerInstance<'_, T>,
    get: for<'a> fn(&'a mut T) -> FilesView<'a>,
) -> wasmtime::Result<()> {
    types.func_wrap_async(
        "[method]descriptor.set-size",
        move |mut store: StoreContextMut<'_, T>, (fd, size): (Fd, u64)| {
            Box::new(async move { Ok((set_size(&mut get(store.data_mut()), &fd, size)?,)) })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        move |mut store: StoreContextMut<'_, T>,
         (fd, path_flags, path, oflags, flags): (Fd, PathFlags, String, OpenFlags, DescriptorFlags)| {
            Box::new(async move {
                let state = &mut get(store.data_mut());
                if let Some(opened) = open_at(state, &fd, path_flags, &path, oflags, flags)? {
                    return Ok((opened,));
                }
                let mut fs = state.filesystem();
                answer(HostDescriptor::open_at(&mut fs, fd, path_flags, path, oflags, flags).await)
            })
        },
    )?;
    Ok(())
}

/// wasmtime-wasi's answer, in the shape of the guest's.
fn answer<T>(r: FsResult<T>) -> wasmtime::Result<(Result<T, ErrorCode>,)> {
    match r {
        Ok(v) => Ok((Ok(v),)),
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

/// The guest's directory behind `fd`, with its permissions.
fn dir(
    state: &mut FilesView<'_>,
    fd: &Fd,
) -> wasmtime::Result<Result<(Arc<std::fs::File>, FsPerms), ErrorCode>> {
    Ok(match state.table.get(fd)? {
        Descriptor::Dir(d) => Ok((d.dir.clone(), d.perms)),
        Descriptor::File(_) => Err(ErrorCode::NotDirectory),
    })
}

/// The guest's directory behind `fd`, if it may be changed.
fn mutable_dir(
    state: &mut FilesView<'_>,
    fd: &Fd,
) -> wasmtime::Result<Result<(Arc<std::fs::File>, FsPerms), ErrorCode>> {
    Ok(match dir(state, fd)? {
        Ok((_, perms)) if perms.write_not_permitted() => Err(ErrorCode::NotPermitted),
        other => other,
    })
}

/// Makes `act` on the caller's own descriptors `fds`, fenced: a trap if
/// the term stopped first.
fn fence_call<T>(
    state: &FilesView<'_>,
    fds: &[&OwnedFd],
    act: impl FnOnce() -> io::Result<T>,
) -> wasmtime::Result<Result<T, ErrorCode>> {
    let raw: Vec<_> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    match fenced(&raw, state.term, act) {
        None => Err(StoppedByHost::of(state.term).into()),
        Some(Ok(v)) => Ok(Ok(v)),
        Some(Err(e)) => Ok(Err(ErrorCode::from(&e))),
    }
}

/// `act` on the parent directory of `path` and its last component.
fn at_parent(
    state: &mut FilesView<'_>,
    fd: &Fd,
    path: &Path,
    act: impl FnOnce(&OwnedFd, &OsStr) -> rustix::io::Result<()>,
) -> Outcome<()> {
    let start = match mutable_dir(state, fd)? {
        Ok((start, _)) => start,
        Err(code) => return Ok(Some(Err(code))),
    };
    let (parent, name) = match parent(&start, path) {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
    };
    Ok(Some(fence_call(state, &[&parent], || Ok(act(&parent, name)?))?))
}

/// `rename-at`, as wasmtime-wasi's `Dir::rename_at` and cap-std's
/// `rename` do it.
fn rename_at(state: &mut FilesView<'_>, fd: &Fd, old: &str, new_fd: &Fd, new: &str) -> Outcome<()> {
    let (old_start, new_start) = match two_dirs(state, fd, new_fd)? {
        Ok(dirs) => dirs,
        Err(code) => return Ok(Some(Err(code))),
    };
    let (old, new) = (Path::new(old), Path::new(new));
    let requires_dir = has_trailing_slash(old) || has_trailing_slash(new);
    let (old, new) = (strip_dir_suffix(old), strip_dir_suffix(new));
    let ((old_dir, old_name), (new_dir, new_name)) =
        match two_parents(&old_start, Path::new(&old), &new_start, Path::new(&new)) {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(None),
            Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
        };
    let mut old_name = old_name.to_owned();
    if requires_dir {
        old_name.push("/");
    }
    let rename = || Ok(rustix::fs::renameat(&old_dir, &old_name, &new_dir, new_name)?);
    Ok(Some(fence_call(state, &[&old_dir, &new_dir], rename)?))
}

/// `link-at`, as wasmtime-wasi's `Dir::link_at` does it.
fn link_at(
    state: &mut FilesView<'_>,
    fd: &Fd,
    flags: PathFlags,
    old: &str,
    new_fd: &Fd,
    new: &str,
) -> Outcome<()> {
    let (old_start, new_start) = match two_dirs(state, fd, new_fd)? {
        Ok(_) if flags.contains(PathFlags::SYMLINK_FOLLOW) => return Ok(Some(Err(ErrorCode::Invalid))),
        Ok(dirs) => dirs,
        Err(code) => return Ok(Some(Err(code))),
    };
    let ((old_dir, old_name), (new_dir, new_name)) =
        match two_parents(&old_start, Path::new(old), &new_start, Path::new(new)) {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(None),
            Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
        };
    let link = || {
        Ok(rustix::fs::linkat(
            &old_dir,
            old_name,
            &new_dir,
            new_name,
            AtFlags::empty(),
        )?)
    };
    Ok(Some(fence_call(state, &[&old_dir, &new_dir], link)?))
}

/// `symlink-at`: no link to an absolute path (as cap-std refuses it).
fn symlink_at(state: &mut FilesView<'_>, fd: &Fd, target: &str, path: &str) -> Outcome<()> {
    if let Ok((_, perms)) = dir(state, fd)?
        && !perms.write_not_permitted()
        && Path::new(target).has_root()
    {
        return Ok(Some(Err(ErrorCode::NotPermitted)));
    }
    let symlink = |dir: &OwnedFd, name: &OsStr| rustix::fs::symlinkat(target, dir, name);
    at_parent(state, fd, Path::new(path), symlink)
}

/// Both directories of a rename or link, as wasmtime-wasi checks them:
/// both changeable, with the same permissions.
#[allow(clippy::type_complexity)]
fn two_dirs(
    state: &mut FilesView<'_>,
    fd: &Fd,
    new_fd: &Fd,
) -> wasmtime::Result<Result<(Arc<std::fs::File>, Arc<std::fs::File>), ErrorCode>> {
    let (old, new) = (dir(state, fd)?, dir(state, new_fd)?);
    let ((old, old_perms), (new, new_perms)) = match (old, new) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(code), _) | (_, Err(code)) => return Ok(Err(code)),
    };
    if old_perms.write_not_permitted() || new_perms.write_not_permitted() || old_perms != new_perms {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    Ok(Ok((old, new)))
}

/// The parents of two paths; `None` if `openat2` cannot be used.
#[allow(clippy::type_complexity)]
fn two_parents<'a>(
    old_start: &std::fs::File,
    old: &'a Path,
    new_start: &std::fs::File,
    new: &'a Path,
) -> io::Result<Option<((OwnedFd, &'a OsStr), (OwnedFd, &'a OsStr))>> {
    let Some(old) = parent(old_start, old)? else {
        return Ok(None);
    };
    let Some(new) = parent(new_start, new)? else {
        return Ok(None);
    };
    Ok(Some((old, new)))
}

/// `set-times`: `futimens` on a duplicate of the guest's descriptor (the
/// window may point it at its pipe); wasmtime-wasi's permission check.
fn set_times(state: &mut FilesView<'_>, fd: &Fd, atime: NewTimestamp, mtime: NewTimestamp) -> Outcome<()> {
    let (file, perms) = match state.table.get(fd)? {
        Descriptor::File(f) => (f.file.clone(), f.perms.write_not_permitted()),
        Descriptor::Dir(d) => (d.dir.clone(), d.perms.write_not_permitted()),
    };
    if perms {
        return Ok(Some(Err(ErrorCode::NotPermitted)));
    }
    let times = match timestamps(atime, mtime) {
        Ok(times) => times,
        Err(code) => return Ok(Some(Err(code))),
    };
    let own = match file.try_clone() {
        Ok(own) => OwnedFd::from(own),
        Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
    };
    Ok(Some(fence_call(state, &[&own], || {
        Ok(rustix::fs::futimens(&own, &times)?)
    })?))
}

/// `set-times-at`: `utimensat` of the last component in its parent,
/// never following a symlink there. One that would follow a symlink is
/// left to wasmtime-wasi.
fn set_times_at(
    state: &mut FilesView<'_>,
    fd: &Fd,
    flags: PathFlags,
    path: &str,
    atime: NewTimestamp,
    mtime: NewTimestamp,
) -> Outcome<()> {
    let times = match timestamps(atime, mtime) {
        Ok(times) => times,
        Err(code) => return Ok(Some(Err(code))),
    };
    let follow = flags.contains(PathFlags::SYMLINK_FOLLOW);
    let mut symlink = false;
    let outcome = at_parent(state, fd, Path::new(path), |dir: &OwnedFd, name: &OsStr| {
        if follow
            && rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink())
        {
            symlink = true;
            return Ok(());
        }
        rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)
    })?;
    Ok(if symlink { None } else { outcome })
}

/// The guest's new timestamps as `utimensat` takes them (wasmtime-wasi's
/// conversion: `now` is read here, an overflow is `overflow`).
fn timestamps(atime: NewTimestamp, mtime: NewTimestamp) -> Result<Timestamps, ErrorCode> {
    let one = |t: NewTimestamp| -> Result<Timespec, ErrorCode> {
        let (secs, nanos) = match t {
            NewTimestamp::NoChange => {
                return Ok(Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                });
            }
            NewTimestamp::Now => {
                let since = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_err(|_| ErrorCode::Overflow)?;
                (since.as_secs(), since.subsec_nanos())
            }
            NewTimestamp::Timestamp(d) => (
                d.seconds
                    .checked_add(u64::from(d.nanoseconds / 1_000_000_000))
                    .ok_or(ErrorCode::Overflow)?,
                d.nanoseconds % 1_000_000_000,
            ),
        };
        Ok(Timespec {
            tv_sec: i64::try_from(secs).map_err(|_| ErrorCode::Overflow)?,
            tv_nsec: i64::from(nanos),
        })
    };
    Ok(Timestamps {
        last_access: one(atime)?,
        last_modification: one(mtime)?,
    })
}

/// `set-size`: `ftruncate` on the guest's file, fenced.
fn set_size(state: &mut FilesView<'_>, fd: &Fd, size: u64) -> wasmtime::Result<Result<(), ErrorCode>> {
    let file = match state.table.get(fd)? {
        Descriptor::File(f) if f.perms.write_not_permitted() => return Ok(Err(ErrorCode::NotPermitted)),
        Descriptor::File(f) => f.file.clone(),
        Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
    };
    match fenced(&[file.as_raw_fd()], state.term, || file.set_len(size)) {
        None => Err(StoppedByHost::of(state.term).into()),
        Some(Ok(())) => Ok(Ok(())),
        Some(Err(e)) => Ok(Err(ErrorCode::from(&e))),
    }
}

/// `open-at` that creates or truncates, as wasmtime-wasi's `Dir::open_at`
/// does it (with `BLOCKING_FILE_IO`); any other open is left to it.
fn open_at(
    state: &mut FilesView<'_>,
    fd: &Fd,
    path_flags: PathFlags,
    path: &str,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> Outcome<Resource<Descriptor>> {
    if !oflags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE) {
        return Ok(None);
    }
    let (start, perms) = match dir(state, fd)? {
        Ok(found) => found,
        Err(code) => return Ok(Some(Err(code))),
    };
    let sync = DescriptorFlags::FILE_INTEGRITY_SYNC
        | DescriptorFlags::DATA_INTEGRITY_SYNC
        | DescriptorFlags::REQUESTED_WRITE_SYNC;
    if flags.intersects(sync) {
        return Ok(Some(Err(ErrorCode::Unsupported)));
    }
    if oflags.contains(OpenFlags::DIRECTORY) {
        return Ok(Some(Err(ErrorCode::Invalid)));
    }
    if perms.write_not_permitted() {
        return Ok(Some(Err(ErrorCode::NotPermitted)));
    }
    let read = flags.contains(DescriptorFlags::READ) || !flags.contains(DescriptorFlags::WRITE);
    let (os_flags, open_mode) = open_flags(path_flags, oflags, read);
    // A descriptor of this call's own: the window may point it at its pipe.
    let own = match start.try_clone() {
        Ok(own) => OwnedFd::from(own),
        Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
    };
    let open = || beneath(&own, Path::new(path), os_flags, Mode::from_bits_truncate(0o666));
    let opened = match fence_call(state, &[&own], open)? {
        Ok(Some(opened)) => std::fs::File::from(opened),
        Ok(None) => return Ok(None),
        Err(code) => return Ok(Some(Err(code))),
    };
    let descriptor = match opened.metadata() {
        Ok(m) if m.is_dir() => Descriptor::Dir(Dir::new(opened, perms, open_mode, BLOCKING_FILE_IO)),
        Ok(_) => Descriptor::File(File::new(opened, perms, open_mode, BLOCKING_FILE_IO)),
        Err(e) => return Ok(Some(Err(ErrorCode::from(&e)))),
    };
    Ok(Some(Ok(state.table.push(descriptor)?)))
}

/// The system's open flags for a creating or truncating `open-at` (always
/// for writing), and the mode recorded in the descriptor.
fn open_flags(path_flags: PathFlags, oflags: OpenFlags, read: bool) -> (OFlags, OpenMode) {
    let mut os = OFlags::CLOEXEC;
    let mut mode = OpenMode::WRITE;
    if read {
        os |= OFlags::RDWR;
        mode |= OpenMode::READ;
    } else {
        os |= OFlags::WRONLY;
    }
    os |= match (
        oflags.contains(OpenFlags::CREATE),
        oflags.contains(OpenFlags::EXCLUSIVE),
    ) {
        (true, true) => OFlags::CREATE | OFlags::EXCL,
        (true, false) => OFlags::CREATE,
        (false, _) => OFlags::empty(),
    };
    if oflags.contains(OpenFlags::TRUNCATE) && !os.contains(OFlags::EXCL) {
        os |= OFlags::TRUNC;
    }
    if !path_flags.contains(PathFlags::SYMLINK_FOLLOW) {
        os |= OFlags::NOFOLLOW;
    }
    (os, mode)
}

/// The parent directory of `path` beneath `start` (an `O_PATH` descriptor
/// of its own) and the last component, as cap-std's `open_parent` splits
/// it; `None` if `openat2` cannot be used here.
fn parent<'p>(start: &std::fs::File, path: &'p Path) -> io::Result<Option<(OwnedFd, &'p OsStr)>> {
    let (dirname, name) = split_parent(path).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let dirname = if dirname.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dirname
    };
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(beneath(start, dirname, flags, Mode::empty())?.map(|dir| (dir, name)))
}

/// `openat2` of `path` beneath `start`, as cap-std's `open_beneath` makes
/// it (retrying a race with a rename; an escape is refused); `None` if
/// `openat2` cannot be used (`ENOSYS`, `EPERM`, races that go on).
fn beneath(start: impl AsFd, path: &Path, flags: OFlags, mode: Mode) -> io::Result<Option<OwnedFd>> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    for _ in 0..4 {
        match rustix::fs::openat2(&start, path, flags, mode, resolve) {
            Ok(fd) => return Ok(Some(fd)),
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::PERM | rustix::io::Errno::NOSYS) => return Ok(None),
            Err(rustix::io::Errno::XDEV) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "a path led outside of the filesystem",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// Splits `path` into its parent and last component as cap-std does: a
/// path ending in `/` or `/.` (or `..`) names the directory itself (`.`).
/// `None` for an empty path.
fn split_parent(path: &Path) -> Option<(&Path, &OsStr)> {
    if path.as_os_str().is_empty() {
        return None;
    }
    let bytes = path.as_os_str().as_bytes();
    let requires_dir = bytes.ends_with(b"/") || bytes.ends_with(b"/.");
    if !requires_dir {
        let mut components = path.components();
        match components.next_back() {
            Some(Component::Normal(name)) => return Some((components.as_path(), name)),
            Some(Component::CurDir) => return Some((components.as_path(), OsStr::new("."))),
            _ => {}
        }
    }
    Some((path, OsStr::new(".")))
}

fn has_trailing_slash(path: &Path) -> bool {
    path.as_os_str().as_bytes().ends_with(b"/")
}

/// `path` without its trailing slashes (`/` stays `/`).
fn strip_dir_suffix(path: &Path) -> OsString {
    let mut bytes = path.as_os_str().as_bytes();
    while bytes.len() > 1 && bytes.ends_with(b"/") {
        bytes = &bytes[..bytes.len() - 1];
    }
    OsStr::from_bytes(bytes).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_as_cap_std_splits_them() {
        let split = |p: &str| {
            split_parent(Path::new(p))
                .map(|(d, n)| (d.to_str().unwrap().to_owned(), n.to_str().unwrap().to_owned()))
        };
        let pair = |d: &str, n: &str| Some((d.to_owned(), n.to_owned()));
        assert_eq!(split(""), None);
        assert_eq!(split("foo"), pair("", "foo"));
        assert_eq!(split("foo/bar/qux"), pair("foo/bar", "qux"));
        assert_eq!(split("foo/"), pair("foo/", "."));
        assert_eq!(split("foo/."), pair("foo/.", "."));
        assert_eq!(split("."), pair("", "."));
        assert_eq!(split(".."), pair("..", "."));
        assert_eq!(split("foo/.."), pair("foo/..", "."));
        assert_eq!(split("../foo"), pair("..", "foo"));
        assert_eq!(strip_dir_suffix(Path::new("foo//")), "foo");
        assert_eq!(strip_dir_suffix(Path::new("/")), "/");
    }

    #[test]
    fn a_parent_is_never_outside_its_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("inner/sub")).unwrap();
        let start = std::fs::File::open(dir.path().join("inner")).unwrap();
        for escape in ["../x", "/tmp/x", "sub/../../x"] {
            let e = parent(&start, Path::new(escape)).unwrap_err();
            assert_eq!(ErrorCode::from(&e), ErrorCode::NotPermitted, "{escape}");
        }
        std::os::unix::fs::symlink("..", dir.path().join("inner/up")).unwrap();
        let e = parent(&start, Path::new("up/x")).unwrap_err();
        assert_eq!(ErrorCode::from(&e), ErrorCode::NotPermitted);
        let (_, name) = parent(&start, Path::new("x")).unwrap().unwrap();
        assert_eq!(name, "x");
    }
}
