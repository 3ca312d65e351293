//! The fence between a guest and the outside world: nothing of a term acts
//! after its force-stop time.
//!
//! Three things ask the instance's [`Term`] the one question,
//! [`Term::must_stop`]:
//!
//! - the **host-call fence** ([`call_fence`], a wasmtime call hook): every
//!   call from the guest into the host (WASI, `current-status`, a resource
//!   destructor, a runtime libcall) traps before it does anything once the
//!   term must stop;
//! - the **epoch callback** ([`epoch_check`]): at every epoch tick (10 ms)
//!   running guest code traps once the term must stop, or yields to the
//!   tokio scheduler otherwise, so a busy guest cannot starve the host;
//! - **file writes**: [`add_fenced_file_writes`] replaces wasmtime-wasi's
//!   `descriptor.write` and its file output streams (which hand writes to
//!   the blocking pool after the host call returned) with writes made
//!   inline, right after a last check of the term, inside a window the
//!   kernel closes at the force-stop time ([`window`]: a write held up
//!   between the check and its system call goes nowhere);
//! - **other mutating file operations** (Linux): `open-at` that creates or
//!   truncates, `rename-at`, `link-at`, `symlink-at`, `unlink-file-at`,
//!   `create-directory-at`, `remove-directory-at`, `set-size`, `set-times`
//!   and `set-times-at` end in one
//!   system call made in the same window, on descriptors of their own
//!   (`fsops`: the parents are resolved first, read-only);
//! - guest stdout and stderr ([`output`](super::output)) are logged inline,
//!   and checked.
//!
//! What remains is a check-then-act window for the other host calls: one
//! that passed the fence just before the force-stop time may still make its
//! system call just after it, if the thread is held up in between (setting
//! times through a symlink; any file operation where `openat2` is refused;
//! a TCP write). A TCP write that the kernel could not take at once is finished by a
//! background task of wasmtime-wasi, which is aborted when the supervisor
//! drops the Store at the force-stop time. A name lookup's queries are sent
//! in the window too ([`lookup`](super::lookup)). `docs/architecture.md`
//! states these windows.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::{Linker, Resource};
use wasmtime::{CallHook, StoreContextMut, UpdateDeadline};
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};

use super::state::GuestState;
use super::trap::StoppedByHost;
use crate::election::Term;
use crate::runtime::store_term::StoreTerm;

/// The call hook: traps a call into the host once `term` must stop, before
/// the host does anything. (Entering guest code is not checked: guest code
/// reaches the outside only through host calls, and running guest code is
/// stopped by the epoch check.) Generic so that benchmarks measure exactly
/// this.
pub fn call_fence<T>(
    term: StoreTerm,
) -> impl FnMut(StoreContextMut<'_, T>, CallHook) -> wasmtime::Result<()> + Send + Sync + 'static {
    move |_, hook| match hook {
        CallHook::CallingHost if term.must_stop() => Err(StoppedByHost::of(&term).into()),
        _ => Ok(()),
    }
}

/// The epoch callback: traps running guest code once `term` must stop;
/// otherwise yields to the tokio scheduler (its own yield, so that the
/// worker polls timers and I/O before the guest runs again) and runs on.
pub fn epoch_check<T>(
    term: StoreTerm,
) -> impl FnMut(StoreContextMut<'_, T>) -> wasmtime::Result<UpdateDeadline> + Send + Sync + 'static {
    move |_| {
        if term.must_stop() {
            Err(StoppedByHost::of(&term).into())
        } else {
            Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
        }
    }
}

#[cfg(target_os = "linux")]
pub mod window;

#[cfg(target_os = "linux")]
mod fsops;

/// File operations run inside the guest's host call, where the fence
/// covers them, not later on the blocking pool (wasmtime-wasi's
/// `allow_blocking_current_thread`; descriptors opened here say the same).
pub const BLOCKING_FILE_IO: bool = true;

/// The WASI 0.2 filesystem interface that [`add_fenced_file_writes`]
/// overrides (the version wasmtime-wasi 48 serves; guests asking for older
/// 0.2 versions are linked to it).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Replaces `descriptor.write`, `descriptor.write-via-stream` and
/// `descriptor.append-via-stream` with versions that write inline, inside
/// the guest's host call, after a last check of the term, in a window the
/// kernel closes at the force-stop time; on Linux, the other mutating file
/// operations too (`fsops`).
pub fn add_fenced_file_writes(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    test_fs_delay();
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap(
        "[method]descriptor.write",
        |mut store: StoreContextMut<'_, GuestState>,
         (fd, buffer, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Ok((write_at(store.data_mut(), fd, &buffer, offset)?,))
        },
    )?;
    types.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store: StoreContextMut<'_, GuestState>, (fd, offset): (Resource<Descriptor>, u64)| {
            Ok((open_stream(store.data_mut(), fd, Mode::At(offset))?,))
        },
    )?;
    types.func_wrap(
        "[method]descriptor.append-via-stream",
        |mut store: StoreContextMut<'_, GuestState>, (fd,): (Resource<Descriptor>,)| {
            Ok((open_stream(store.data_mut(), fd, Mode::Append)?,))
        },
    )?;
    #[cfg(target_os = "linux")]
    fsops::add_to_linker(&mut types)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The file behind a descriptor the guest may write, or the error code.
fn writable(
    state: &mut GuestState,
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
    state: &mut GuestState,
    fd: Resource<Descriptor>,
    buffer: &[u8],
    offset: u64,
) -> wasmtime::Result<Result<u64, ErrorCode>> {
    let file = match writable(state, &fd)? {
        Ok(file) => file,
        Err(code) => return Ok(Err(code)),
    };
    let term = Arc::clone(&state.term);
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

/// One mutating system call on `fds` (the caller's own descriptors, at
/// most two) for `term`: not made once the term must stop, and, on Linux
/// with the system clock, unable to take effect after its force-stop time
/// (see [`window`]); check-then-act elsewhere. `None` if the term stopped
/// first. The test hook [`test_fs_delay`] sleeps between the last check
/// and the call.
pub(crate) fn fenced<T>(
    fds: &[RawFd],
    term: &Term,
    act: impl FnOnce() -> io::Result<T>,
) -> Option<io::Result<T>> {
    let act = || {
        if let Some(delay) = test_fs_delay() {
            std::thread::sleep(delay);
        }
        act()
    };
    #[cfg(target_os = "linux")]
    if term.clock().is_system() {
        return window::act_before(fds, term.stop_at().as_nanos(), || term.must_stop(), act);
    }
    let _ = fds;
    (!term.must_stop()).then(act)
}

/// The test hook `BATON_TEST_FS_DELAY_MS`: how long every fenced mutating
/// file operation sleeps between the term's last check and its system call,
/// widening on purpose the window the kernel must close (tests only; read
/// once, at the first call, which [`add_fenced_file_writes`] makes when
/// the host starts).
pub fn test_fs_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms: u64 = std::env::var("BATON_TEST_FS_DELAY_MS").ok()?.parse().ok()?;
        tracing::warn!(
            ms,
            "test hook: every mutating file operation sleeps between its term check and its system call"
        );
        Some(std::time::Duration::from_millis(ms))
    })
}

fn open_stream(
    state: &mut GuestState,
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
        term: Arc::clone(&state.term),
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
