//! A term: one stretch of this host leading one lease, from the write that
//! won it to the moment nothing of it may act any more.
//!
//! One [`Term`] value is shared by the elector (which moves its deadline
//! after each confirmed renewal and ends it), the supervisors (which run the
//! lease's tasks in it and stop them by force when it says so) and every
//! guest Store of the term (whose epoch callback and host-call fence ask it
//! whether the guest may still run). They all ask it the same question,
//! [`Term::must_stop`], so there is one answer to "may this term's code
//! still act?" and one moment when it turns: the *force-stop time*,
//!
//! ```text
//! stop_at = min(lead_until, ended_at) + grace
//! ```
//!
//! - `lead_until` is the renew deadline: the start of the last renewal the
//!   store confirmed plus renew-deadline. Only the elector moves it, and
//!   only forward, and never once it has passed (see [`Term::extend`]).
//! - `ended_at` is when the term was ended on purpose: the lead was lost or
//!   given up, or the host is shutting down. It only ever moves earlier.
//! - `grace` is the time a task has to return by itself once its term is
//!   over.
//!
//! The term is *over* from `min(lead_until, ended_at)` on: its tasks are
//! told (their change signal fires) and no new task starts in it. From
//! `stop_at` on, it *must stop*: guest code traps at its next host call or
//! epoch tick, and supervisors drop the guests' Stores. Both are read from
//! the [term clock](super::clock), so neither depends on the elector having
//! run: a stuck elector, a paused process or a suspended machine cannot
//! stretch a term.
//!
//! A term also counts the tasks running in it ([`Term::enter`]), so that a
//! lease is released only once every task of its term is gone
//! ([`Term::drained`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::clock::{Moment, TermClock};

/// Not yet ended.
const NEVER: u64 = u64::MAX;

/// One term of one lease on this host; see the [module documentation](self).
pub struct Term {
    lease: Arc<str>,
    number: u64,
    grace: Duration,
    clock: TermClock,
    /// Renew deadline, as nanoseconds on `clock`.
    lead_until: AtomicU64,
    /// When the term was ended on purpose, or [`NEVER`].
    ended_at: AtomicU64,
    /// `min(lead_until, ended_at) + grace`: kept in one atomic so that the
    /// question asked at every host call is one load and one clock read.
    stop_at: AtomicU64,
    /// The grace was cut ([`Term::end_without_grace`]): the force-stop
    /// time is the end of the term.
    grace_cut: std::sync::atomic::AtomicBool,
    /// Tasks running in this term. The lock also orders the writers of the
    /// three times above.
    tasks: Mutex<usize>,
    /// Wakes waiters when the term is ended or a task leaves. Renewals wake
    /// nobody: a waiter sleeps until the deadline it read and looks again.
    events: watch::Sender<()>,
    /// The plugins the last confirmed write of this term listed (its
    /// claims, see [`super::claims`]).
    claimed: watch::Sender<Arc<[String]>>,
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("lease", &self.lease)
            .field("number", &self.number)
            .field("lead_until", &self.lead_until())
            .field("ended_at", &self.ended_at())
            .field("stop_at", &self.stop_at())
            .finish()
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease {:?} term {}", self.lease, self.number)
    }
}

/// A task's place in a term, from [`Term::enter`]; dropping it says the task
/// is gone.
#[derive(Debug)]
pub struct TermTask {
    term: Arc<Term>,
}

impl Drop for TermTask {
    fn drop(&mut self) {
        let mut tasks = self.term.lock();
        *tasks -= 1;
        drop(tasks);
        self.term.events.send_replace(());
    }
}

impl Term {
    /// A term of `lease` numbered `number`, valid until `lead_until` on
    /// `clock`, whose tasks get `grace` to stop by themselves.
    pub fn begin(
        lease: &str,
        number: u64,
        grace: Duration,
        clock: TermClock,
        lead_until: Moment,
    ) -> Arc<Term> {
        let term = Term {
            lease: Arc::from(lease),
            number,
            grace,
            clock,
            lead_until: AtomicU64::new(lead_until.as_nanos()),
            ended_at: AtomicU64::new(NEVER),
            stop_at: AtomicU64::new(0),
            grace_cut: std::sync::atomic::AtomicBool::new(false),
            tasks: Mutex::new(0),
            events: watch::Sender::new(()),
            claimed: watch::Sender::new(Arc::from([])),
        };
        term.update_stop_at();
        Arc::new(term)
    }

    /// Records that a write of this term, confirmed by the store, listed
    /// `plugins` as its claims (the elector, after each write it leads with).
    pub fn confirm_claims(&self, plugins: &[String]) {
        self.claimed.send_if_modified(|c| {
            let changed = **c != *plugins;
            if changed {
                *c = Arc::from(plugins);
            }
            changed
        });
    }

    /// The plugins the last confirmed write of this term listed, and news
    /// of the next: see [`super::claims`].
    pub fn claimed(&self) -> watch::Receiver<Arc<[String]>> {
        self.claimed.subscribe()
    }

    /// The lease.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The term number: the fencing token.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The grace its tasks get once it is over.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The clock its times are measured on.
    pub fn clock(&self) -> &TermClock {
        &self.clock
    }

    /// The renew deadline: until when this host holds the lease in this
    /// term, unless a renewal moves it.
    pub fn lead_until(&self) -> Moment {
        Moment::from_nanos(self.lead_until.load(Ordering::Acquire))
    }

    /// When the term was ended on purpose, if it was.
    pub fn ended_at(&self) -> Option<Moment> {
        match self.ended_at.load(Ordering::Acquire) {
            NEVER => None,
            n => Some(Moment::from_nanos(n)),
        }
    }

    /// From when the term is over: `min(lead_until, ended_at)`.
    pub fn over_at(&self) -> Moment {
        let until = self.lead_until.load(Ordering::Acquire);
        Moment::from_nanos(until.min(self.ended_at.load(Ordering::Acquire)))
    }

    /// The force-stop time: `over_at + grace`.
    pub fn stop_at(&self) -> Moment {
        Moment::from_nanos(self.stop_at.load(Ordering::Acquire))
    }

    /// `at` as wall-clock time (for logs: readers check records against
    /// it), converted through the current offset between the two clocks.
    pub fn wall_time(&self, at: Moment) -> std::time::SystemTime {
        let now = self.clock.now();
        let wall = std::time::SystemTime::now();
        if at >= now {
            wall + (at - now)
        } else {
            wall - (now - at)
        }
    }

    /// The force-stop time as RFC 3339 wall-clock time, for logs.
    pub fn stop_at_wall(&self) -> String {
        humantime::format_rfc3339_micros(self.wall_time(self.stop_at())).to_string()
    }

    /// Whether the term is over: its tasks must wind down, and no new task
    /// starts in it.
    pub fn is_over(&self) -> bool {
        self.clock.now() >= self.over_at()
    }

    /// Whether nothing of this term may act any more: its force-stop time
    /// has come. The epoch callback, the host-call fence and the
    /// supervisor's forced stop all ask this.
    #[inline]
    pub fn must_stop(&self) -> bool {
        self.clock
            .reached(Moment::from_nanos(self.stop_at.load(Ordering::Acquire)))
    }

    /// Moves the renew deadline to `until` after a confirmed renewal.
    ///
    /// Returns `false`, and ends the term at its old deadline, if that
    /// deadline had already passed when the new one was written: someone
    /// may have seen the term over by then (a guest was told, a supervisor
    /// started its forced stop), and a term that was over never comes back.
    pub(crate) fn extend(&self, until: Moment) -> bool {
        let writer = self.lock();
        let old = self.lead_until();
        // Decided under the lock, so no `enter` sees the term revived; and
        // checked again after the store, in case the old deadline passed in
        // between (then the term ends at it, as if never extended).
        let ended = if self.clock.now() >= old {
            true
        } else {
            if until > old {
                self.lead_until.store(until.as_nanos(), Ordering::Release);
                self.update_stop_at();
            }
            self.clock.now() >= old
        };
        if ended {
            let at = self.ended_at.load(Ordering::Acquire).min(old.as_nanos());
            self.ended_at.store(at, Ordering::Release);
            self.update_stop_at();
        }
        drop(writer);
        if ended {
            self.events.send_replace(());
        }
        !ended
    }

    /// Ends the term no later than `at`: its tasks are told at once (if `at`
    /// is now) and stopped by force at `at + grace`.
    pub fn end(&self, at: Moment) {
        {
            let _writer = self.lock();
            let ended = self.ended_at.load(Ordering::Acquire).min(at.as_nanos());
            self.ended_at.store(ended, Ordering::Release);
            self.update_stop_at();
        }
        self.events.send_replace(());
    }

    /// Ends the term no later than `at` with no grace: its tasks are told
    /// and stopped by force at once. For a lease found in other hands while
    /// this term still held it (a writer that did not wait for it to
    /// expire): its new holder may act already, so no time is left to
    /// give.
    pub fn end_without_grace(&self, at: Moment) {
        {
            let _writer = self.lock();
            self.grace_cut.store(true, Ordering::Release);
            let ended = self.ended_at.load(Ordering::Acquire).min(at.as_nanos());
            self.ended_at.store(ended, Ordering::Release);
            self.update_stop_at();
        }
        self.events.send_replace(());
    }

    /// Registers a task of this term; `None` if the term is already over
    /// (then the task must not start). The lease is not released while a
    /// [`TermTask`] lives.
    pub fn enter(self: &Arc<Self>) -> Option<TermTask> {
        let mut tasks = self.lock();
        if self.is_over() {
            return None;
        }
        *tasks += 1;
        Some(TermTask { term: self.clone() })
    }

    /// How many tasks are in the term.
    pub fn tasks(&self) -> usize {
        *self.lock()
    }

    /// Resolves once the term is over.
    pub async fn over(&self) {
        self.wait_for(|t| (t.is_over(), Some(t.over_at()))).await
    }

    /// Resolves at the force-stop time.
    pub async fn stop_due(&self) {
        self.wait_for(|t| (t.must_stop(), Some(t.stop_at()))).await
    }

    /// Resolves once the term is over and no task is left in it.
    pub async fn drained(&self) {
        // Once over, only a task leaving can change the answer.
        self.wait_for(|t| {
            let over = t.is_over();
            (over && t.tasks() == 0, (!over).then(|| t.over_at()))
        })
        .await
    }

    /// Waits until `check` says done; `check` also says when to look again
    /// if nothing is announced before then (`None`: only on an event).
    async fn wait_for(&self, check: impl Fn(&Term) -> (bool, Option<Moment>)) {
        let mut events = self.events.subscribe();
        loop {
            let (done, look_at) = check(self);
            if done {
                return;
            }
            let timer = async {
                match look_at {
                    Some(at) => self.clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = timer => {}
                // The sender lives in `self`: this never fails.
                _ = events.changed() => {}
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        // A panic while holding the lock cannot leave the count wrong
        // (it is changed in one step), so a poisoned lock is used as is.
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Recomputes `stop_at`; called with the lock held.
    fn update_stop_at(&self) {
        let over = self.over_at();
        let grace = if self.grace_cut.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            self.grace
        };
        self.stop_at.store((over + grace).as_nanos(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
