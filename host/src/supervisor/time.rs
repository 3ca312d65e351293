//! The time a scheduled plugin's supervisor runs by: the system's
//! ([`HostTime::System`], always in `baton run`), or a [`VirtualTime`]
//! that a harness moves on (`baton test`), so that a week of a cron
//! schedule runs in seconds and a change of daylight saving time is one
//! step.
//!
//! Virtual time flows at the real rate from a chosen start, and jumps
//! forward when told ([`VirtualTime::advance_to`]); it never goes back.
//! The schedule's waits announce themselves ([`HostTime::wait_until`]), so
//! that a jump stops at each due time and lets its run finish before it
//! goes on: every due time is seen, in order, as on a real clock.
//!
//! Invariant: nothing that guards a term reads this time. A term's end and
//! its force-stop are on [`TermClock`](crate::election::TermClock), the
//! host's monotonic clock, in every mode: virtual time cannot stretch a
//! term.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::runtime::GuestClock;

/// The time a supervisor's schedule runs by.
#[derive(Clone, Default)]
pub enum HostTime {
    /// The system's clocks and tokio's timers.
    #[default]
    System,
    /// A harness's time.
    Virtual(Arc<VirtualTime>),
}

impl std::fmt::Debug for HostTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostTime::System => f.write_str("HostTime::System"),
            HostTime::Virtual(v) => write!(f, "HostTime::Virtual({:?})", v.now()),
        }
    }
}

impl HostTime {
    /// The time now.
    pub fn now(&self) -> SystemTime {
        match self {
            HostTime::System => SystemTime::now(),
            HostTime::Virtual(v) => v.now(),
        }
    }

    /// Resolves at `at` (at once if it has passed).
    pub async fn sleep_until(&self, at: SystemTime) {
        match self {
            HostTime::System => {
                let left = at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                tokio::time::sleep(left).await;
            }
            HostTime::Virtual(v) => v.sleep_until(at).await,
        }
    }

    /// Resolves `span` from now.
    pub async fn sleep(&self, span: Duration) {
        match self {
            HostTime::System => tokio::time::sleep(span).await,
            HostTime::Virtual(v) => v.sleep_until(v.now() + span).await,
        }
    }

    /// A deadline `span` from now, to be moved on by periods: on tokio's
    /// clock for the system's time (a period is a span, not a wall-clock
    /// time), on the virtual time's otherwise.
    pub fn deadline(&self, span: Duration) -> Deadline {
        match self {
            HostTime::System => Deadline::Tokio(tokio::time::Instant::now() + span),
            HostTime::Virtual(v) => Deadline::Virtual(v.clone(), v.now() + span),
        }
    }

    /// The schedule's own wait: resolves at `until` (never if `None`), and
    /// tells a virtual time's harness that the schedule has nothing to do
    /// before then.
    pub async fn wait_until(&self, until: Option<SystemTime>) {
        if let HostTime::Virtual(v) = self {
            v.waiting(until);
        }
        match until {
            Some(at) => self.sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// A deadline on a [`HostTime`] ([`HostTime::deadline`]).
pub enum Deadline {
    /// On tokio's clock.
    Tokio(tokio::time::Instant),
    /// On a virtual time.
    Virtual(Arc<VirtualTime>, SystemTime),
}

impl Deadline {
    /// Resolves once it is reached.
    pub async fn reached(&self) {
        match self {
            Deadline::Tokio(at) => tokio::time::sleep_until(*at).await,
            Deadline::Virtual(v, at) => v.sleep_until(*at).await,
        }
    }

    /// Moves it on by `period`, to now at the earliest.
    pub fn next(&mut self, period: Duration) {
        match self {
            Deadline::Tokio(at) => *at = (*at + period).max(tokio::time::Instant::now()),
            Deadline::Virtual(v, at) => *at = (*at + period).max(v.now()),
        }
    }
}

/// Time that flows at the real rate from a start, and that its owner moves
/// forward.
pub struct VirtualTime {
    start: SystemTime,
    real_start: Instant,
    /// How far it was moved forward, in all; each jump is sent.
    offset: watch::Sender<Duration>,
    /// The schedule's last announced wait: a count (one per wait) and its
    /// end (`None`: nothing due).
    waits: watch::Sender<(u64, Option<SystemTime>)>,
    /// Serialises jumps.
    jumping: Mutex<()>,
}

impl std::fmt::Debug for VirtualTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualTime").field("now", &self.now()).finish()
    }
}

impl VirtualTime {
    /// Time that reads `start` now.
    pub fn starting_at(start: SystemTime) -> Arc<VirtualTime> {
        Arc::new(VirtualTime {
            start,
            real_start: Instant::now(),
            offset: watch::Sender::new(Duration::ZERO),
            waits: watch::Sender::new((0, None)),
            jumping: Mutex::new(()),
        })
    }

    /// How much time has passed since the start, real and jumped.
    fn elapsed(&self) -> Duration {
        self.real_start.elapsed() + *self.offset.borrow()
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        self.start + self.elapsed()
    }

    /// Moves the time forward to `at` at once (nothing if it is past).
    pub fn jump_to(&self, at: SystemTime) {
        let _one = self.jumping.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(ahead) = at.duration_since(self.now()) {
            self.offset.send_modify(|o| *o += ahead);
        }
    }

    /// Resolves once the time reads `at` or later, by its flow or a jump.
    pub async fn sleep_until(&self, at: SystemTime) {
        let mut jumps = self.offset.subscribe();
        loop {
            let Ok(left) = at.duration_since(self.now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                changed = jumps.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn waiting(&self, until: Option<SystemTime>) {
        self.waits.send_modify(|(count, end)| {
            *count += 1;
            *end = until;
        });
    }

    /// The schedule's waits so far, and the end of the last.
    pub fn last_wait(&self) -> (u64, Option<SystemTime>) {
        *self.waits.borrow()
    }

    /// Waits up to `limit` (real time) for the schedule to announce a wait
    /// after the `seen`th; returns it, or `None` if none came.
    pub async fn next_wait(&self, seen: u64, limit: Duration) -> Option<(u64, Option<SystemTime>)> {
        let mut waits = self.waits.subscribe();
        let found = tokio::time::timeout(limit, waits.wait_for(|(count, _)| *count > seen)).await;
        match found {
            Ok(Ok(wait)) => Some(*wait),
            _ => None,
        }
    }

    /// Moves the time forward to `target`, stopping at each wait the
    /// schedule announces on the way: it jumps to the wait's end, then lets
    /// the schedule do what is due (its runs take real time) until it
    /// announces its next wait, at most `settle` each. Returns how many
    /// waits it ended, and whether the schedule settled each time.
    pub async fn advance_to(&self, target: SystemTime, scheduled: bool, settle: Duration) -> (u64, bool) {
        let mut ended = 0;
        if !scheduled {
            self.jump_to(target);
            return (ended, true);
        }
        // Let the schedule get to its wait first (it may be reading).
        let (mut seen, mut until) = self.last_wait();
        if seen == 0 {
            match self.next_wait(0, settle).await {
                Some(w) => (seen, until) = w,
                None => {
                    self.jump_to(target);
                    return (ended, false);
                }
            }
        }
        loop {
            match until {
                Some(end) if end <= target => {
                    self.jump_to(end);
                    ended += 1;
                    match self.next_wait(seen, settle).await {
                        Some(w) => (seen, until) = w,
                        None => {
                            self.jump_to(target);
                            return (ended, false);
                        }
                    }
                }
                _ => {
                    self.jump_to(target);
                    return (ended, true);
                }
            }
        }
    }
}

impl GuestClock for VirtualTime {
    fn wall(&self) -> Duration {
        self.now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO)
    }

    fn monotonic(&self) -> u64 {
        u64::try_from(self.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[tokio::test]
    async fn it_flows_jumps_forward_only_and_wakes_sleepers_on_a_jump() {
        let v = VirtualTime::starting_at(at(1_000_000));
        assert!(v.now() >= at(1_000_000) && v.now() < at(1_000_010));
        let sleeper = {
            let v = v.clone();
            tokio::spawn(async move { v.sleep_until(at(1_003_600)).await })
        };
        v.jump_to(at(1_003_600));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woken by the jump")
            .unwrap();
        let before = v.now();
        v.jump_to(at(10));
        assert!(v.now() >= before, "never back");
        let mono = v.monotonic();
        assert!(mono >= 3_600 * 1_000_000_000);
    }

    #[tokio::test]
    async fn advancing_stops_at_each_announced_wait() {
        let v = VirtualTime::starting_at(at(0));
        let time = HostTime::Virtual(v.clone());
        // A schedule due every hour: records the time at each wake.
        let woke = Arc::new(Mutex::new(Vec::new()));
        let (w, t) = (woke.clone(), time.clone());
        let schedule = tokio::spawn(async move {
            loop {
                let now = t.now().duration_since(UNIX_EPOCH).unwrap().as_secs();
                let next = at((now / 3600 + 1) * 3600);
                t.wait_until(Some(next)).await;
                w.lock()
                    .unwrap()
                    .push(t.now().duration_since(UNIX_EPOCH).unwrap().as_secs() / 3600);
            }
        });
        let (ended, settled) = v
            .advance_to(at(5 * 3600 + 60), true, Duration::from_secs(5))
            .await;
        assert_eq!((ended, settled), (5, true));
        assert_eq!(*woke.lock().unwrap(), vec![1, 2, 3, 4, 5]);
        schedule.abort();
    }
}
