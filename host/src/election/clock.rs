//! The term clock: the clock on which this host measures how long it may
//! still lead.
//!
//! tokio's timers, like `std::time::Instant`, run on `CLOCK_MONOTONIC`,
//! which stops while the machine is suspended. A leader whose machine (or
//! VM) slept past its lease would wake believing it still has time, while
//! the other hosts' clocks kept counting and one of them took over. The
//! term clock keeps counting through a suspend: on Linux it is
//! `CLOCK_BOOTTIME`. Every term deadline, the checks made inside guest
//! execution (the epoch callback and the host-call fence), and the
//! leader's side of the elector (renewal times, the renew deadline) are
//! measured on it. A follower judges another holder's expiry on tokio's
//! clock: after a suspend it waits longer than it had to, never shorter.
//!
//! Sleeping still goes through tokio's timer, which cannot know about a
//! suspend: a timer that was due during the suspend would fire late, by the
//! length of the suspend. So a thread of its own (`baton-suspend`) compares
//! the two clocks every [`SUSPEND_CHECK`]; when the term clock has gained
//! on the monotonic one, the machine slept, and every sleep on the term
//! clock ([`TermClock::sleep_until`]) wakes and looks again. Until then
//! (at most [`SUSPEND_CHECK`] after waking), guest code is held by its own
//! checks: every host call and every epoch tick reads the term clock.
//!
//! A hypervisor that pauses a VM stops both clocks. Then nothing inside the
//! VM can know that time passed; only the term as a fencing token protects
//! the outside world from such a leader (see `docs/architecture.md`).
//!
//! Asking whether a deadline has come ([`TermClock::reached`]) reads the
//! exact clock only within half a second of the deadline or after the
//! machine slept: further off, two coarse clocks answer for a fraction of
//! the cost ([`coarse`]).
//!
//! Tests use [`TermClock::paused`], which follows tokio's clock (so paused
//! time works) and can be told that the machine slept.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

#[cfg(any(target_os = "linux", target_os = "android"))]
pub mod coarse;

/// How often the suspend detector compares the clocks; the longest a sleep
/// on the term clock can oversleep after the machine wakes.
pub const SUSPEND_CHECK: Duration = Duration::from_millis(100);

/// A gain of the term clock over the monotonic clock larger than this, from
/// one check to the next, is a suspend (reading the two clocks one after
/// the other differs by nanoseconds).
const SUSPEND_THRESHOLD: Duration = Duration::from_millis(20);

/// A point in time on a [`TermClock`], as the time since the clock's
/// origin (boot, for the system clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Moment(Duration);

impl Moment {
    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Moment) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// As whole nanoseconds since the origin (what [`Term`](super::Term)
    /// keeps in its atomics; for the system clock, a `CLOCK_BOOTTIME`
    /// reading).
    pub fn as_nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The inverse of [`Moment::as_nanos`].
    pub(crate) fn from_nanos(nanos: u64) -> Moment {
        Moment(Duration::from_nanos(nanos))
    }
}

impl Add<Duration> for Moment {
    type Output = Moment;
    fn add(self, d: Duration) -> Moment {
        Moment(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for Moment {
    type Output = Moment;
    fn sub(self, d: Duration) -> Moment {
        Moment(self.0.saturating_sub(d))
    }
}

impl Sub<Moment> for Moment {
    type Output = Duration;
    /// Saturating: zero if `rhs` is later.
    fn sub(self, rhs: Moment) -> Duration {
        self.since(rhs)
    }
}

/// The clock of term deadlines; see the [module documentation](self).
///
/// Cloning is cheap; clones read the same clock.
///
/// ```
/// use std::time::Duration;
/// use baton::election::TermClock;
///
/// # tokio_test_block_on(async {
/// let clock = TermClock::paused();
/// let before = clock.now();
/// // The machine sleeps for a minute: tokio's timers did not see it, the
/// // term clock did.
/// clock.suspend(Duration::from_secs(60));
/// assert!(clock.now() - before >= Duration::from_secs(60));
/// # });
/// # fn tokio_test_block_on(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct TermClock {
    source: Source,
}

#[derive(Clone)]
enum Source {
    /// `CLOCK_BOOTTIME` (Linux), else `CLOCK_MONOTONIC`.
    System,
    /// tokio's clock plus the suspends a test announced.
    Paused(Arc<PausedClock>),
}

struct PausedClock {
    origin: tokio::time::Instant,
    slept_nanos: AtomicU64,
    suspends: watch::Sender<u64>,
}

/// Counts the suspends the detector thread has seen (started on first use).
fn system_suspends() -> &'static watch::Sender<u64> {
    static SUSPENDS: OnceLock<watch::Sender<u64>> = OnceLock::new();
    SUSPENDS.get_or_init(|| {
        let tx = watch::Sender::new(0);
        let notify = tx.clone();
        std::thread::Builder::new()
            .name("baton-suspend".into())
            .spawn(move || {
                let gain = || system_now().saturating_sub(monotonic_now());
                let mut last = gain();
                loop {
                    std::thread::sleep(SUSPEND_CHECK);
                    #[cfg(any(target_os = "linux", target_os = "android"))]
                    coarse::check_lag();
                    let now = gain();
                    if now.saturating_sub(last) > SUSPEND_THRESHOLD {
                        notify.send_modify(|n| *n += 1);
                    }
                    last = now;
                }
            })
            .expect("spawn the suspend detector thread");
        tx
    })
}

impl fmt::Debug for TermClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::System => f.write_str("TermClock::system"),
            Source::Paused(p) => write!(
                f,
                "TermClock::paused(slept {:?})",
                Duration::from_nanos(p.slept_nanos.load(Ordering::Relaxed))
            ),
        }
    }
}

impl TermClock {
    /// The machine's clock that counts suspended time.
    pub fn system() -> TermClock {
        TermClock {
            source: Source::System,
        }
    }

    /// A clock for tests: tokio's clock (so `tokio::time::pause` applies),
    /// plus whatever [`TermClock::suspend`] adds.
    pub fn paused() -> TermClock {
        TermClock {
            source: Source::Paused(Arc::new(PausedClock {
                origin: tokio::time::Instant::now(),
                slept_nanos: AtomicU64::new(0),
                suspends: watch::Sender::new(0),
            })),
        }
    }

    /// Tells a [`paused`](TermClock::paused) clock that the machine was
    /// suspended for `d`: the term clock moves on by `d`, tokio's clock does
    /// not (as with a real suspend). Does nothing to the system clock.
    pub fn suspend(&self, d: Duration) {
        if let Source::Paused(p) = &self.source {
            let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            p.slept_nanos.fetch_add(nanos, Ordering::SeqCst);
            p.suspends.send_modify(|n| *n += 1);
        }
    }

    /// Whether this is the machine's clock (its moments are
    /// `CLOCK_BOOTTIME` readings), not a test's.
    pub fn is_system(&self) -> bool {
        matches!(self.source, Source::System)
    }

    /// The current time.
    pub fn now(&self) -> Moment {
        match &self.source {
            Source::System => Moment(system_now()),
            Source::Paused(p) => {
                Moment(p.origin.elapsed() + Duration::from_nanos(p.slept_nanos.load(Ordering::SeqCst)))
            }
        }
    }

    /// Whether `at` has come: the same answer as `self.now() >= at`, from
    /// the coarse clocks alone while `at` is far off (see [`coarse`]).
    #[inline]
    pub fn reached(&self, at: Moment) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if matches!(self.source, Source::System) && coarse::far_before(at.as_nanos()) {
            return false;
        }
        self.now() >= at
    }

    /// Sleeps until `at` on this clock: on tokio's timer, and woken early
    /// to look again when the machine was suspended (see the module
    /// documentation).
    pub async fn sleep_until(&self, at: Moment) {
        let mut suspends = match &self.source {
            Source::System => system_suspends().subscribe(),
            Source::Paused(p) => p.suspends.subscribe(),
        };
        loop {
            let left = at - self.now();
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                // The senders live as long as the clock: this never fails.
                _ = suspends.changed() => {}
            }
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
// Elsewhere the monotonic clock is the best there is (on macOS it does
// count sleep); see the module documentation.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

fn system_now() -> Duration {
    read_clock(CLOCK)
}

fn monotonic_now() -> Duration {
    read_clock(libc::CLOCK_MONOTONIC)
}

fn read_clock(clock: libc::clockid_t) -> Duration {
    let ts = read_timespec(clock);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Nanoseconds of `clock` (what [`coarse`] reads its clocks with).
#[inline]
fn read_nanos(clock: libc::clockid_t) -> u64 {
    let ts = read_timespec(clock);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[inline]
fn read_timespec(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to the valid pointer it is
    // given; the clocks used here exist on every supported kernel.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_moves_forward() {
        let c = TermClock::system();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = c.now();
        assert!(b - a >= Duration::from_millis(2), "{a:?} {b:?}");
        assert_eq!(a - b, Duration::ZERO, "saturating");
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_follows_tokio_and_counts_suspends() {
        let c = TermClock::paused();
        let a = c.now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(c.now() - a, Duration::from_secs(3));
        c.suspend(Duration::from_secs(60));
        assert_eq!(c.now() - a, Duration::from_secs(63));
        // A sleep until a moment the suspend already passed returns at once.
        let before = tokio::time::Instant::now();
        c.sleep_until(a + Duration::from_secs(30)).await;
        assert_eq!(tokio::time::Instant::now(), before);
        // A sleep under way when the machine sleeps wakes at once, not when
        // tokio's timer (which did not see the suspend) would have fired.
        let sleeper = {
            let c = c.clone();
            tokio::spawn(async move { c.sleep_until(c.now() + Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        c.suspend(Duration::from_secs(20));
        sleeper.await.unwrap();
        assert_eq!(tokio::time::Instant::now(), before, "woke on the suspend");
    }
}
