//! The fence between a guest and the outside world: nothing of a term acts
//! after its force-stop time. It applies to every capability in one place:
//! each instance's Store gets the hook and the callback when it is made
//! (`Plugin::new_store`), and the capabilities' effects that may come after
//! their host call returned ask the same term.
//!
//! Everything asks the instance's [`Term`] the one question,
//! [`Term::must_stop`]:
//!
//! - the **host-call fence** ([`call_fence`], a wasmtime call hook): every
//!   call from the guest into the host (WASI, `current-status`, a resource
//!   destructor, a runtime libcall) traps before it does anything once the
//!   term must stop;
//! - the **epoch callback** ([`epoch_check`]): at every epoch tick (10 ms)
//!   running guest code traps once the term must stop, or yields to the
//!   tokio scheduler otherwise, so a busy guest cannot starve the host;
//! - **system calls made after a last check** ([`fenced`]): file writes and
//!   the other mutating file operations (the files capability), each name
//!   lookup's query datagram (sockets), made inside a window the kernel
//!   closes at the force-stop time ([`window`]: a call held up between the
//!   check and its system call goes nowhere);
//! - **TCP connections** ([`connections`]): every connection of an instance,
//!   a socket's or an HTTP request's, reset at the force-stop time;
//! - guest stdout and stderr are logged inline, and checked (the output
//!   capability).
//!
//! What remains is a check-then-act window for the other host calls: one
//! that passed the fence just before the force-stop time may still make its
//! system call just after it, if the thread is held up in between (setting
//! times through a symlink; any file operation where `openat2` is refused;
//! a TCP write). A TCP write that the kernel could not take at once is
//! finished by a background task of wasmtime-wasi, which is aborted when
//! the supervisor drops the Store at the force-stop time.
//! `docs/architecture.md` states these windows.

use std::io;
use std::os::fd::RawFd;

use wasmtime::{CallHook, StoreContextMut, UpdateDeadline};

use super::trap::StoppedByHost;
use crate::election::Term;
use crate::runtime::store_term::StoreTerm;

pub mod connections;

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

/// File operations run inside the guest's host call, where the fence
/// covers them, not later on the blocking pool (wasmtime-wasi's
/// `allow_blocking_current_thread`; descriptors opened here say the same).
pub const BLOCKING_FILE_IO: bool = true;

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
/// once, at the first call, which the files capability's link step makes
/// when the host starts). Read only in a build with the `test-hooks`
/// feature.
pub fn test_fs_delay() -> Option<std::time::Duration> {
    if !cfg!(feature = "test-hooks") {
        return None;
    }
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
