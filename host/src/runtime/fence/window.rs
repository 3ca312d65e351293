//! Closing the check-then-act window of file operations (Linux).
//!
//! A write, a rename, a create (any mutating file operation) that passed
//! its term's last check can still be held up between the check and its
//! system call (the process is stopped with SIGSTOP, the thread is
//! preempted, the machine sleeps) and land after the force-stop time. Here
//! the kernel closes that window. Before the check, the calling thread
//! arms a timer of its own: `CLOCK_BOOTTIME`, absolute, at the force-stop
//! time, its signal directed at that thread. If the timer fires before the
//! operation is done, its handler points the file descriptors the system
//! call is about to use (the file written; the parent directory, or both
//! parents of a rename or link) at the read end of an empty pipe nobody
//! writes (`dup2`), so the call lands nowhere: a write fails (`EBADF`), a
//! call relative to a directory fails (`ENOTDIR`), a truncate fails
//! (`EINVAL`), and setting times changes only the pipe's. A thread that was stopped or descheduled in the
//! window runs that handler before it runs another instruction of its own:
//! the kernel delivers pending signals first when the thread resumes. So no
//! operation of a term reaches the file system after the force-stop time,
//! unless its system call was already under way at that time.
//!
//! Invariant: the operation is one system call on the descriptors named,
//! which are the caller's own (a directory descriptor resolved for this
//! call, or the file the guest writes): redirecting them harms nothing else.
//!
//! The cost is one `timer_settime` call per operation (see
//! `benches/fence.rs`). Where the timer or the signal handler cannot be set
//! up, operations fall back to check-then-act, and the window stays open
//! (logged once).

use std::cell::Cell;
use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;

/// The timers' signal: a realtime signal that wasmtime, tokio and the
/// standard library leave alone (glibc reserves the first few, which
/// `SIGRTMIN()` already skips).
fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 7
}

/// Set up once per process: the pipe to point descriptors at, and the
/// handler.
struct Setup {
    /// The read end of a pipe whose write end is closed.
    sink: RawFd,
}

static SETUP: OnceLock<Option<Setup>> = OnceLock::new();

/// The most descriptors one operation uses (a rename: two parents).
pub const MAX_FDS: usize = 2;

thread_local! {
    /// The descriptors of the operation in this thread's window, or -1.
    /// (Const-initialised, without a destructor: safe to read in a signal
    /// handler.)
    static FDS: [Cell<RawFd>; MAX_FDS] = const { [Cell::new(-1), Cell::new(-1)] };
    /// Set by the handler when it redirected `FD`.
    static REDIRECTED: Cell<bool> = const { Cell::new(false) };
    /// This thread's timer, created on first use.
    static TIMER: ThreadTimer = ThreadTimer::create();
}

fn setup() -> Option<&'static Setup> {
    SETUP
        .get_or_init(|| {
            // SAFETY: open(2) of a constant path; sigaction(2) installing a
            // handler that only touches async-signal-safe state (below).
            unsafe {
                let mut ends = [-1; 2];
                if libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                    tracing::warn!(error = %io::Error::last_os_error(), "cannot make the write window's pipe: file writes keep a check-then-act window");
                    return None;
                }
                libc::close(ends[1]);
                let sink = ends[0];
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_timer as *const () as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(signal(), &action, std::ptr::null_mut()) != 0 {
                    tracing::warn!(error = %io::Error::last_os_error(), "cannot install the write-window signal handler: file writes keep a check-then-act window");
                    libc::close(sink);
                    return None;
                }
                Some(Setup { sink })
            }
        })
        .as_ref()
}

extern "C" fn on_timer(_: libc::c_int) {
    // SAFETY: only async-signal-safe calls (dup2), const thread-locals and
    // an already initialised OnceLock are used; errno is restored.
    unsafe {
        let errno = *libc::__errno_location();
        let mut any = false;
        FDS.with(|fds| {
            for fd in fds.iter().map(Cell::get).filter(|fd| *fd >= 0) {
                if let Some(Some(setup)) = SETUP.get() {
                    libc::dup2(setup.sink, fd);
                }
                any = true;
            }
        });
        if any {
            REDIRECTED.with(|r| r.set(true));
        }
        *libc::__errno_location() = errno;
    }
}

/// A POSIX timer that signals the thread that created it.
struct ThreadTimer(Option<libc::timer_t>);

impl ThreadTimer {
    fn create() -> ThreadTimer {
        // SAFETY: timer_create(2) with a sigevent naming this thread; the
        // timer is deleted when the thread exits (Drop).
        unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = signal();
            event.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_BOOTTIME, &mut event, &mut timer) != 0 {
                tracing::warn!(error = %io::Error::last_os_error(), "cannot create a write-window timer: file writes of this thread keep a check-then-act window");
                return ThreadTimer(None);
            }
            ThreadTimer(Some(timer))
        }
    }

    /// Arms the timer at `at` nanoseconds of `CLOCK_BOOTTIME`.
    fn set(timer: libc::timer_t, at: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as _, // time_t, deprecated by name on musl
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: a timer this thread created and still owns.
        unsafe {
            libc::timer_settime(timer, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut());
        }
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        if let Some(timer) = self.0 {
            // SAFETY: deleting the timer this thread created, once.
            unsafe {
                libc::timer_delete(timer);
            }
        }
    }
}

/// Runs `write`, one system call on `fd`, unless `must_stop` says the term
/// must stop, so that it cannot reach the file after `stop_at`
/// (`CLOCK_BOOTTIME` nanoseconds). `None` if the term stopped first: the
/// write was not made, or failed (and `fd` now points at the pipe).
pub fn write_before(
    fd: RawFd,
    stop_at: u64,
    must_stop: impl Fn() -> bool,
    write: impl FnOnce() -> io::Result<usize>,
) -> Option<io::Result<usize>> {
    act_before(&[fd], stop_at, must_stop, write)
}

/// Runs `act`, one system call on `fds` (at most [`MAX_FDS`], the
/// caller's own), unless `must_stop` says the term must stop, so that it
/// cannot take effect after `stop_at` (`CLOCK_BOOTTIME` nanoseconds).
/// `None` if the term stopped first: the call was not made, or was made on
/// the pipe (and `fds` now point there).
pub fn act_before<T>(
    fds: &[RawFd],
    stop_at: u64,
    must_stop: impl Fn() -> bool,
    act: impl FnOnce() -> io::Result<T>,
) -> Option<io::Result<T>> {
    assert!(
        fds.len() <= MAX_FDS,
        "at most {MAX_FDS} descriptors per operation"
    );
    let timer = setup().and_then(|_| TIMER.with(|t| t.0));
    let Some(timer) = timer else {
        return (!must_stop()).then(act);
    };
    // Armed first: setting the timer replaces whatever expiry it had (an
    // earlier window's, of another term), and a signal of that expiry is
    // delivered when the call returns, before `FDS` name this operation's
    // descriptors. The timer is not disarmed after the call (that would
    // cost a second system call per operation): when it fires later,
    // outside any window, the handler finds no descriptor and does nothing.
    ThreadTimer::set(timer, stop_at.max(1));
    REDIRECTED.with(|r| r.set(false));
    FDS.with(|cells| {
        for (cell, fd) in cells.iter().zip(fds) {
            cell.set(*fd);
        }
    });
    let result = (!must_stop()).then(act);
    FDS.with(|cells| cells.iter().for_each(|c| c.set(-1)));
    if REDIRECTED.with(Cell::get) {
        return None;
    }
    result
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    use std::time::Duration;

    use super::*;
    use crate::election::TermClock;

    #[test]
    fn a_write_held_up_past_the_deadline_goes_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let clock = TermClock::system();
        // In time: written.
        let stop_at = (clock.now() + Duration::from_secs(5)).as_nanos();
        let written = write_before(
            file.as_raw_fd(),
            stop_at,
            || false,
            || file.write_at(b"early ", 0),
        );
        assert_eq!(written.unwrap().unwrap(), 6);
        // Held up past the deadline between the check and the system call
        // (as a stopped process would be): the write goes nowhere.
        let stop_at = (clock.now() + Duration::from_millis(30)).as_nanos();
        let late = write_before(
            file.as_raw_fd(),
            stop_at,
            || false,
            || {
                std::thread::sleep(Duration::from_millis(100));
                file.write_at(b"late", 6)
            },
        );
        assert!(late.is_none(), "reported as stopped");
        let mut text = String::new();
        std::fs::File::open(&path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "early ", "the late write did not land");
        // A deadline already past: not written at all.
        let stop_at = clock.now().as_nanos();
        let other = std::fs::File::create(dir.path().join("g")).unwrap();
        let never = write_before(other.as_raw_fd(), stop_at, || true, || other.write_at(b"x", 0));
        assert!(never.is_none());
        assert_eq!(std::fs::metadata(dir.path().join("g")).unwrap().len(), 0);
    }

    #[test]
    fn setting_times_held_up_past_the_deadline_changes_nothing() {
        use std::os::fd::OwnedFd;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let old = rustix::fs::Timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        };
        let times = rustix::fs::Timestamps {
            last_access: old,
            last_modification: old,
        };
        let clock = TermClock::system();
        let own = OwnedFd::from(file.try_clone().unwrap());
        let stop_at = (clock.now() + Duration::from_millis(30)).as_nanos();
        let late = act_before(
            &[own.as_raw_fd()],
            stop_at,
            || false,
            || {
                std::thread::sleep(Duration::from_millis(100));
                Ok(rustix::fs::futimens(&own, &times)?)
            },
        );
        assert!(late.is_none(), "reported as stopped");
        let meta = std::fs::metadata(&path).unwrap();
        assert_ne!(meta.mtime(), 1_000_000_000, "the file's times did not change");
        // In time: changed.
        let stop_at = (clock.now() + Duration::from_secs(5)).as_nanos();
        let own = OwnedFd::from(file.try_clone().unwrap());
        let done = act_before(
            &[own.as_raw_fd()],
            stop_at,
            || false,
            || Ok(rustix::fs::futimens(&own, &times)?),
        );
        done.unwrap().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mtime(), 1_000_000_000);
    }
}
