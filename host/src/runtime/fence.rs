//! The fence between a guest and the outside world: nothing of a term acts
//! after its force-stop time.
//!
//! Three things ask the instance's [`Term`] the one question,
//! [`Term::must_stop`]:
//!
//! - the **host-call fence** ([`call_fence`], a wasmtime call hook): every
//!   call from the guest into the host (WASI, `current-status`, a resource
//!   destructor, a runtime libcall) and every entry into guest code traps
//!   before it does anything once the term must stop;
//! - the **epoch callback** ([`epoch_check`]): at every epoch tick (10 ms)
//!   running guest code traps once the term must stop, or yields to the
//!   tokio scheduler otherwise, so a busy guest cannot starve the host;
//! - the **I/O the host would otherwise queue for later** checks again right
//!   before its system call: file output streams ([`add_fenced_file_streams`]
//!   replaces wasmtime-wasi's, which hand writes to the blocking pool after
//!   the host call returned, with streams that write inline), guest stdout
//!   and stderr ([`output`](super::output) logs inline, and checks).
//!
//! What remains is a check-then-act window: a host call that passed the
//! fence just before the force-stop time may still complete its system
//! call just after it (the thread was preempted or the process paused
//! between the check and the call, or the disk was slow). A TCP write that
//! the kernel could not take at once is finished by a background task of
//! wasmtime-wasi, which is aborted when the supervisor drops the Store at
//! the force-stop time; a name lookup runs on the blocking pool and is not
//! aborted. `docs/architecture.md` states these windows and why the timing
//! rule leaves room for them.

use std::io;
use std::os::fd::AsRawFd;
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

/// The call hook: traps a call into the host or into guest code once
/// `term` must stop. Generic so that benchmarks measure exactly this.
pub fn call_fence<T>(
    term: Arc<Term>,
) -> impl FnMut(StoreContextMut<'_, T>, CallHook) -> wasmtime::Result<()> + Send + Sync + 'static {
    move |_, hook| match hook {
        CallHook::CallingHost | CallHook::CallingWasm if term.must_stop() => {
            Err(StoppedByHost::of(&term).into())
        }
        _ => Ok(()),
    }
}

/// The epoch callback: traps running guest code once `term` must stop;
/// otherwise yields to the tokio scheduler (its own yield, so that the
/// worker polls timers and I/O before the guest runs again) and runs on.
pub fn epoch_check<T>(
    term: Arc<Term>,
) -> impl FnMut(StoreContextMut<'_, T>) -> wasmtime::Result<UpdateDeadline> + Send + Sync + 'static {
    move |_| {
        if term.must_stop() {
            Err(StoppedByHost::of(&term).into())
        } else {
            Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
        }
    }
}

/// The WASI 0.2 filesystem interface that [`add_fenced_file_streams`]
/// overrides (the version wasmtime-wasi 48 serves; guests asking for older
/// 0.2 versions are linked to it).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Replaces `descriptor.write-via-stream` and `descriptor.append-via-stream`
/// with versions whose streams write inline, inside the guest's host call,
/// after checking the term.
pub fn add_fenced_file_streams(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
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
    linker.allow_shadowing(false);
    Ok(())
}

fn open_stream(
    state: &mut GuestState,
    fd: Resource<Descriptor>,
    mode: Mode,
) -> wasmtime::Result<Result<Resource<DynOutputStream>, ErrorCode>> {
    let file = match state.table.get(&fd)? {
        Descriptor::File(f) => f.clone(),
        Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
    };
    if file.perms.write_not_permitted() {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    let stream: DynOutputStream = Box::new(FencedFile {
        file: file.file,
        mode,
        term: state.term.clone(),
        failed: false,
    });
    Ok(Ok(state.table.push(stream)?))
}

/// Where a file stream writes.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// At this offset, which moves on with each write.
    At(u64),
    /// At the end of the file, whatever others wrote meanwhile.
    Append,
}

/// A file output stream that writes inline, after checking the term.
struct FencedFile {
    file: Arc<std::fs::File>,
    mode: Mode,
    term: Arc<Term>,
    /// A write failed: the stream is closed.
    failed: bool,
}

impl FencedFile {
    fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = match &mut self.mode {
                Mode::At(offset) => {
                    let n = self.file.write_at(data, *offset)?;
                    *offset += n as u64;
                    n
                }
                Mode::Append => append(&self.file, data)?,
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            data = &data[n..];
        }
        Ok(())
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
        // before the system call.
        if self.term.must_stop() {
            return Err(StreamError::Trap(StoppedByHost::of(&self.term).into()));
        }
        self.write_all(&bytes).map_err(|e| {
            self.failed = true;
            StreamError::LastOperationFailed(e.into())
        })
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
