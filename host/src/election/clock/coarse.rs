//! The cheap answer to "is this deadline still far off?" (Linux).
//!
//! Reading `CLOCK_BOOTTIME` costs about 34 ns here, half of what the
//! host-call fence costs. The kernel's coarse clocks cost a few: they read
//! the time of the last tick from the vDSO page without touching the
//! hardware clock. Neither counts a suspend on its own, so two are read:
//! `CLOCK_MONOTONIC_COARSE` (which stops while the machine sleeps) and
//! `CLOCK_REALTIME_COARSE` (which the kernel moves on by the time slept,
//! and which anyone may set). Their difference changes only when the
//! machine wakes or the wall clock is set.
//!
//! [`far_before`] says a deadline (on `CLOCK_BOOTTIME`) is far off only
//! when all of these hold, and otherwise the caller reads the exact clock:
//!
//! - the difference of the two coarse clocks is within [`DRIFT`] of the
//!   one recorded with the offset of `CLOCK_BOOTTIME` over
//!   `CLOCK_MONOTONIC` (so the machine has not slept more than [`DRIFT`]
//!   since, nor was the wall clock set);
//! - the coarse monotonic time plus that offset plus [`MARGIN`] is before
//!   the deadline.
//!
//! Invariant: a `true` answer is never wrong while the coarse clock lags
//! the exact one by less than [`MARGIN`] − [`DRIFT`] (430 ms). The kernel
//! moves it on at every tick (1 to 10 ms) and forces a stalled update after
//! a few ticks; [`check_lag`], run by the suspend detector every 100 ms and
//! at every new record, turns the fast answer off for good (logged) if the
//! lag is ever seen above 100 ms, or the coarse resolution is coarser than
//! 10 ms.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};
use std::time::Duration;

use super::read_nanos;

/// How far ahead of a deadline the coarse clocks answer at all.
pub const MARGIN: Duration = Duration::from_millis(450);

/// A change of realtime − monotonic larger than this is a suspend or a
/// wall clock set (a tick between the two reads accounts for at most 10 ms).
pub const DRIFT: Duration = Duration::from_millis(20);

/// The largest coarse lag seen before the fast answer is turned off.
const MAX_LAG: Duration = Duration::from_millis(100);

/// The coarsest coarse clock resolution the fast answer accepts.
const MAX_RESOLUTION: Duration = Duration::from_millis(10);

/// The offsets recorded, under a sequence lock: `SEQ` is odd while they
/// are written and 0 before the first record.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// `CLOCK_BOOTTIME` − `CLOCK_MONOTONIC`, in nanoseconds.
static BOOT_OVER_MONO: AtomicU64 = AtomicU64::new(0);
/// `CLOCK_REALTIME_COARSE` − `CLOCK_MONOTONIC_COARSE`, in nanoseconds.
static REAL_OVER_MONO: AtomicI64 = AtomicI64::new(0);
/// When the offsets were recorded (monotonic nanoseconds).
static RECORDED_AT: AtomicU64 = AtomicU64::new(0);
/// Set for good when the coarse clock cannot be trusted.
static OFF: AtomicBool = AtomicBool::new(false);
/// Serialises writers.
static WRITER: Mutex<()> = Mutex::new(());

/// Readings of the two coarse clocks, nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coarse {
    pub mono: u64,
    pub real: i64,
}

/// The offsets a verdict is made against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offsets {
    pub boot_over_mono: u64,
    pub real_over_mono: i64,
}

/// What the coarse clocks say of a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// More than [`MARGIN`] off: no need to read the exact clock.
    Far,
    /// Within [`MARGIN`], or past: read the exact clock.
    Near,
    /// The machine slept or the wall clock was set since the offsets were
    /// recorded (or none were): read the exact clock, and record anew.
    Stale,
}

/// The decision, without I/O: `at` is a `CLOCK_BOOTTIME` deadline.
pub(crate) fn verdict(at: u64, now: Coarse, offsets: Offsets) -> Verdict {
    let drift = now
        .real
        .wrapping_sub(now.mono as i64)
        .wrapping_sub(offsets.real_over_mono);
    if drift.unsigned_abs() > DRIFT.as_nanos() as u64 {
        return Verdict::Stale;
    }
    let boot = now.mono.saturating_add(offsets.boot_over_mono);
    if boot.saturating_add(MARGIN.as_nanos() as u64) < at {
        Verdict::Far
    } else {
        Verdict::Near
    }
}

/// Whether the `CLOCK_BOOTTIME` deadline `at` is certainly more than
/// [`MARGIN`] off, from the coarse clocks alone; `false` when unsure.
#[inline]
pub fn far_before(at: u64) -> bool {
    let Some(offsets) = offsets() else {
        record();
        return false;
    };
    match verdict(at, coarse(), offsets) {
        Verdict::Far => true,
        Verdict::Near => false,
        Verdict::Stale => {
            record();
            false
        }
    }
}

/// The recorded offsets, or `None` (none yet, being written, or off).
#[inline]
fn offsets() -> Option<Offsets> {
    let seq = SEQ.load(Ordering::Acquire);
    if seq == 0 || seq % 2 == 1 {
        return None;
    }
    let offsets = Offsets {
        boot_over_mono: BOOT_OVER_MONO.load(Ordering::Relaxed),
        real_over_mono: REAL_OVER_MONO.load(Ordering::Relaxed),
    };
    fence(Ordering::Acquire);
    // OFF is read after the offsets: once set, no later call answers fast.
    (SEQ.load(Ordering::Relaxed) == seq && !OFF.load(Ordering::Relaxed)).then_some(offsets)
}

/// Records the offsets anew (at most once a second, so a wall clock set
/// over and over costs exact reads, not records), after checking the lag.
fn record() {
    if OFF.load(Ordering::Relaxed) {
        return;
    }
    let Ok(_writer) = WRITER.try_lock() else {
        return;
    };
    let last = RECORDED_AT.load(Ordering::Relaxed);
    if SEQ.load(Ordering::Relaxed) != 0
        && read_nanos(libc::CLOCK_MONOTONIC).saturating_sub(last) < 1_000_000_000
    {
        return;
    }
    if !check_lag() {
        return;
    }
    // Monotonic first: the offset errs large (deadlines look nearer), never
    // small.
    let mono = read_nanos(libc::CLOCK_MONOTONIC);
    let boot = read_nanos(libc::CLOCK_BOOTTIME);
    let now = coarse();
    let seq = SEQ.load(Ordering::Relaxed);
    SEQ.store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    BOOT_OVER_MONO.store(boot.saturating_sub(mono), Ordering::Relaxed);
    REAL_OVER_MONO.store(now.real.wrapping_sub(now.mono as i64), Ordering::Relaxed);
    RECORDED_AT.store(mono, Ordering::Relaxed);
    SEQ.store(seq + 2, Ordering::Release);
}

/// Checks the coarse clock against the exact one; turns the fast answer
/// off for good (logged) if it lags more than [`MAX_LAG`] or its resolution
/// is coarser than [`MAX_RESOLUTION`]. Returns whether the fast answer is
/// still on.
pub fn check_lag() -> bool {
    if OFF.load(Ordering::Relaxed) {
        return false;
    }
    let coarse_mono = coarse().mono;
    let exact = read_nanos(libc::CLOCK_MONOTONIC);
    let lag = Duration::from_nanos(exact.saturating_sub(coarse_mono));
    let resolution = resolution();
    if lag > MAX_LAG || resolution > MAX_RESOLUTION {
        OFF.store(true, Ordering::SeqCst);
        tracing::warn!(
            lag_ms = lag.as_secs_f64() * 1e3,
            resolution_ms = resolution.as_secs_f64() * 1e3,
            "the kernel's coarse clock lags or is too coarse: every guest host call reads the exact clock from now on"
        );
        return false;
    }
    true
}

fn coarse() -> Coarse {
    let mono = read_nanos(libc::CLOCK_MONOTONIC_COARSE);
    let real = read_nanos(libc::CLOCK_REALTIME_COARSE);
    Coarse {
        mono,
        real: i64::try_from(real).unwrap_or(i64::MAX),
    }
}

fn resolution() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_getres writes one timespec to the valid pointer.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return Duration::MAX;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn offsets() -> Offsets {
        Offsets {
            boot_over_mono: 5_000 * MS,
            real_over_mono: 1_700_000_000_000 * MS as i64,
        }
    }

    fn at(mono: u64) -> Coarse {
        Coarse {
            mono,
            real: mono as i64 + offsets().real_over_mono,
        }
    }

    #[test]
    fn far_only_beyond_the_margin() {
        // Boot time is mono + 5 s: a deadline at boot 10 s is 5 s off at mono 0.
        let deadline = 10_000 * MS;
        assert_eq!(verdict(deadline, at(0), offsets()), Verdict::Far);
        assert_eq!(verdict(deadline, at(4_500 * MS), offsets()), Verdict::Far);
        assert_eq!(verdict(deadline, at(4_560 * MS), offsets()), Verdict::Near);
        assert_eq!(verdict(deadline, at(6_000 * MS), offsets()), Verdict::Near);
        assert_eq!(verdict(u64::MAX, at(u64::MAX - 1), offsets()), Verdict::Near);
    }

    #[test]
    fn a_suspend_or_a_clock_set_is_stale() {
        let deadline = 100_000 * MS;
        // The machine slept 30 s: realtime moved on, monotonic did not.
        let mut slept = at(0);
        slept.real += 30_000 * MS as i64;
        assert_eq!(verdict(deadline, slept, offsets()), Verdict::Stale);
        // The wall clock was set back a minute.
        let mut set = at(0);
        set.real -= 60_000 * MS as i64;
        assert_eq!(verdict(deadline, set, offsets()), Verdict::Stale);
        // A tick between the two reads is not.
        let mut tick = at(0);
        tick.real += 4 * MS as i64;
        assert_eq!(verdict(deadline, tick, offsets()), Verdict::Far);
    }

    #[test]
    fn the_fast_answer_agrees_with_the_clock() {
        let now = read_nanos(libc::CLOCK_BOOTTIME);
        assert!(check_lag(), "this machine's coarse clock is usable");
        // The first call records; later ones answer.
        far_before(now + 10_000 * MS);
        assert!(far_before(now + 10_000 * MS));
        assert!(!far_before(now + 100 * MS), "within the margin");
        assert!(!far_before(now), "past");
    }
}
