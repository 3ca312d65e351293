//! Files: the directories a plugin's `dirs` grant shows it (nothing else
//! is visible), with every mutating file operation fenced.
//!
//! wasmtime-wasi's `descriptor.write` and its file output streams hand
//! writes to the blocking pool after the host call returned; here they are
//! replaced with writes made inline, inside the guest's host call, right
//! after a last check of the term, in the window the kernel closes at the
//! force-stop time ([`fenced`]). On Linux the other mutating operations
//! (`open-at` that creates or truncates, `rename-at`, `link-at`,
//! `symlink-at`, `unlink-file-at`, `create-directory-at`,
//! `remove-directory-at`, `set-size`, `set-times`, `set-times-at`) end the
//! same way (`fsops`).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::filesystem::{Descriptor, FsPerms, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiView};

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::election::Term;
use crate::runtime::fence::{BLOCKING_FILE_IO, fenced, test_fs_delay};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::trap::StoppedByHost;
use crate::runtime::world::World;

#[cfg(target_os = "linux")]
mod fsops;

/// A directory a plugin may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
    /// Whether the guest may only read it.
    pub read_only: bool,
}

/// The capability.
pub struct Files;

/// A `dirs` entry, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawDir {
    host: PathBuf,
    guest: String,
    #[serde(default)]
    read_only: bool,
}

crate::raw_keys! {
    /// `dirs`.
    pub struct RawFiles {
        dirs: Vec<RawDir> = "dirs",
    }
}

/// What its host functions see of a Store.
pub struct FilesView<'a> {
    wasi: &'a mut WasiCtx,
    table: &'a mut ResourceTable,
    term: &'a StoreTerm,
}

impl FilesView<'_> {
    /// wasmtime-wasi's view of the instance's files.
    fn filesystem(&mut self) -> WasiFilesystemCtxView<'_> {
        WasiFilesystemCtxView {
            ctx: self.wasi.filesystem(),
            table: self.table,
        }
    }
}

/// The WASI 0.2 filesystem interface whose operations it replaces (the
/// version wasmtime-wasi 48 serves; guests asking for older 0.2 versions
/// are linked to it).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

impl Capability for Files {
    type Raw = RawFiles;
    /// The directories, in the order granted.
    type Grant = Vec<DirGrant>;
    type Plugin = Vec<DirGrant>;
    type Ctx = ();
    type View<'a> = FilesView<'a>;

    /// Host folders relative to the file's.
    fn grant(raw: RawFiles, site: &GrantSite<'_>) -> Result<Vec<DirGrant>, GrantError> {
        let dirs = raw.dirs.unwrap_or_default().into_iter();
        Ok(dirs
            .map(|d| DirGrant {
                host: site.resolve(&d.host),
                guest: d.guest,
                read_only: d.read_only,
            })
            .collect())
    }

    /// Fails now, not at the first term, if a granted directory is missing.
    fn load(dirs: &Vec<DirGrant>, _: &LoadContext<'_>) -> Result<Vec<DirGrant>, String> {
        match dirs.iter().find(|d| !d.host.is_dir()) {
            Some(d) => Err(format!("granted directory {} does not exist", d.host.display())),
            None => Ok(dirs.clone()),
        }
    }

    fn prepare(dirs: &Vec<DirGrant>, setup: &mut Setup<'_>) -> Result<(), SetupError> {
        // File operations run inside the guest's host call, where the fence
        // covers them, not later on the blocking pool. (Guests run on their
        // own runtime's workers; the election runs elsewhere.)
        setup.wasi.allow_blocking_current_thread(BLOCKING_FILE_IO);
        for d in dirs {
            let perms = if d.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            setup
                .wasi
                .preopened_dir(&d.host, &d.guest, perms)
                .map_err(|error| {
                    SetupError::new(GrantedDirError {
                        dir: d.host.clone(),
                        error,
                    })
                })?;
        }
        Ok(())
    }

    fn view<'a>(_: &'a mut (), shared: Shared<'a>) -> FilesView<'a> {
        FilesView {
            wasi: shared.wasi,
            table: shared.table,
            term: shared.term,
        }
    }

    /// Replaces `descriptor.write`, `descriptor.write-via-stream` and
    /// `descriptor.append-via-stream`, and on Linux the operations of
    /// `fsops`.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> FilesView<'a>,
    ) -> wasmtime::Result<()> {
        test_fs_delay();
        linker.allow_shadowing(true);
        let mut types = linker.instance(FILESYSTEM_TYPES)?;
        types.func_wrap(
            "[method]descriptor.write",
            move |mut store: StoreContextMut<'_, T>,
                  (fd, buffer, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
                Ok((write_at(&mut get(store.data_mut()), fd, &buffer, offset)?,))
            },
        )?;
        types.func_wrap(
            "[method]descriptor.write-via-stream",
            move |mut store: StoreContextMut<'_, T>, (fd, offset): (Resource<Descriptor>, u64)| {
                Ok((open_stream(&mut get(store.data_mut()), fd, Mode::At(offset))?,))
            },
        )?;
        types.func_wrap(
            "[method]descriptor.append-via-stream",
            move |mut store: StoreContextMut<'_, T>, (fd,): (Resource<Descriptor>,)| {
                Ok((open_stream(&mut get(store.data_mut()), fd, Mode::Append)?,))
            },
        )?;
        #[cfg(target_os = "linux")]
        fsops::add_to_linker(&mut types, get)?;
        linker.allow_shadowing(false);
        Ok(())
    }

    fn describe(dirs: &Vec<DirGrant>) -> Vec<String> {
        dirs.iter()
            .map(|d| {
                let mode = if d.read_only { "read-only" } else { "read-write" };
                format!("dir {} as {} ({mode})", d.host.display(), d.guest)
            })
            .collect()
    }
}

/// A granted directory that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open granted directory {}: {error}", dir.display())]
pub struct GrantedDirError {
    /// The directory on the host.
    pub dir: PathBuf,
    /// What opening it said.
    pub error: wasmtime::Error,
}

/// The file behind a descriptor the guest may write, or the error code.
fn writable(
    state: &mut FilesView<'_>,
    fd: &Resource<Descriptor>,
) -> wasmtime::Result<Result<Arc<std::fs::File>, ErrorCode>> {
    let file = match state.table.get(fd)? {
        Descriptor::File(f) => f.clone(),
        Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
    };
    if file.perms.write_not_permitted() {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    Ok(Ok(file.file))
}

/// `descriptor.write`: one positioned write, fenced.
fn write_at(
    state: &mut FilesView<'_>,
    fd: Resource<Descriptor>,
    buffer: &[u8],
    offset: u64,
) -> wasmtime::Result<Result<u64, ErrorCode>> {
    let file = match writable(state, &fd)? {
        Ok(file) => file,
        Err(code) => return Ok(Err(code)),
    };
    let term = Arc::clone(state.term);
    match fenced_write(file.as_raw_fd(), &term, || file.write_at(buffer, offset)) {
        None => Err(StoppedByHost::of(&term).into()),
        Some(Ok(n)) => Ok(Ok(n as u64)),
        Some(Err(e)) => Ok(Err(error_code(&e))),
    }
}

/// One write system call on `fd` for `term`: not made once the term must
/// stop, and unable to land after its force-stop time (see [`window`]).
/// `None` if the term stopped first.
fn fenced_write(
    fd: RawFd,
    term: &Term,
    write: impl FnOnce() -> io::Result<usize>,
) -> Option<io::Result<usize>> {
    fenced(&[fd], term, write)
}

fn open_stream(
    state: &mut FilesView<'_>,
    fd: Resource<Descriptor>,
    mode: Mode,
) -> wasmtime::Result<Result<Resource<DynOutputStream>, ErrorCode>> {
    let file = match writable(state, &fd)? {
        Ok(file) => file,
        Err(code) => return Ok(Err(code)),
    };
    // A descriptor of its own: the window may point it at its pipe.
    let file = match file.try_clone() {
        Ok(own) => own,
        Err(e) => return Ok(Err(error_code(&e))),
    };
    let stream: DynOutputStream = Box::new(FencedFile {
        file,
        mode,
        term: Arc::clone(state.term),
        failed: false,
    });
    Ok(Ok(state.table.push(stream)?))
}

/// The WASI error code of a failed write (the codes a write can fail
/// with; wasmtime-wasi's own mapping is private).
fn error_code(e: &io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::EPIPE) => ErrorCode::Pipe,
        Some(libc::EPERM) => ErrorCode::NotPermitted,
        Some(libc::EACCES) => ErrorCode::Access,
        Some(libc::EBADF) => ErrorCode::BadDescriptor,
        Some(libc::EISDIR) => ErrorCode::IsDirectory,
        Some(libc::EINVAL) => ErrorCode::Invalid,
        Some(libc::EFBIG) => ErrorCode::FileTooLarge,
        Some(libc::ENOSPC) => ErrorCode::InsufficientSpace,
        Some(libc::EDQUOT) => ErrorCode::Quota,
        Some(libc::ENOMEM) => ErrorCode::InsufficientMemory,
        Some(libc::EINTR) => ErrorCode::Interrupted,
        Some(libc::EOVERFLOW) => ErrorCode::Overflow,
        _ => ErrorCode::Io,
    }
}

/// Where a file stream writes.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// At this offset, which moves on with each write.
    At(u64),
    /// At the end of the file, whatever others wrote meanwhile.
    Append,
}

/// A file output stream that writes inline, fenced (see [`fenced_write`]).
struct FencedFile {
    /// A descriptor of its own (a `dup` of the guest's file).
    file: std::fs::File,
    mode: Mode,
    term: Arc<Term>,
    /// A write failed, or the term stopped: the stream is closed.
    failed: bool,
}

impl FencedFile {
    /// Writes all of `data`; `None` if the term stopped first.
    fn write_all(&mut self, mut data: &[u8]) -> Option<io::Result<()>> {
        while !data.is_empty() {
            let (file, mode) = (&self.file, self.mode);
            let n = match fenced_write(file.as_raw_fd(), &self.term, || match mode {
                Mode::At(offset) => file.write_at(data, offset),
                Mode::Append => append(file, data),
            })? {
                Ok(0) => return Some(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => n,
                Err(e) => return Some(Err(e)),
            };
            if let Mode::At(offset) = &mut self.mode {
                *offset += n as u64;
            }
            data = &data[n..];
        }
        Some(Ok(()))
    }
}

/// Writes at the end of the file atomically (`pwritev2` with
/// `RWF_APPEND`), as wasmtime-wasi's own append stream does, falling back to
/// switching the file description to append mode where that is missing.
fn append(file: &std::fs::File, data: &[u8]) -> io::Result<usize> {
    let fd = file.as_raw_fd();
    #[cfg(target_os = "linux")]
    {
        let iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: one iovec that points into `data`, which outlives the call.
        let n = unsafe { libc::pwritev2(fd, &iov, 1, -1, libc::RWF_APPEND) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)) {
            return Err(e);
        }
    }
    // SAFETY: fcntl and write on a file descriptor `file` owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_APPEND) < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr() as *const libc::c_void, data.len());
        let result = if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        };
        libc::fcntl(fd, libc::F_SETFL, flags);
        result
    }
}

impl OutputStream for FencedFile {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.failed {
            return Err(StreamError::Closed);
        }
        // The fence let the host call in; the term is asked again right
        // before each system call.
        match self.write_all(&bytes) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => {
                self.failed = true;
                Err(StreamError::LastOperationFailed(e.into()))
            }
            None => {
                self.failed = true;
                Err(StreamError::Trap(StoppedByHost::of(&self.term).into()))
            }
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if self.failed {
            return Err(StreamError::Closed);
        }
        // What wasmtime-wasi allows per write.
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for FencedFile {
    async fn ready(&mut self) {}
}
