//! A subscription to one lease: the latest record a store has of it, kept
//! current by a task of its own, apart from whoever reads it.
//!
//! The subscription watches the lease ([`LeaseStore::watch`]); while a watch
//! cannot be had it polls ([`LeaseStore::get`]) and tries to watch again.
//! Readers (the lease's elector) never wait on any of this: they read the
//! newest [`Sighting`] and wake when there is a new one, so a watch that is
//! slow to set up or a store that does not answer never delays a renewal
//! or a step-down.
//!
//! Each subscription runs a watch of its own lease; the stores share what
//! is costly behind [`LeaseStore::watch`]: the embedded store one inotify
//! instance per directory, the Kubernetes store one watch request per
//! namespace, each waking only the watches an event is about. A failure of
//! the shared part ends the watch of every lease it serves, and each
//! subscription polls and watches again on its own jittered schedule.
//!
//! Its [`Cadence`] (how often it polls, how long a request may take) comes
//! from the lease's timings, which a reload may change: the elector hands
//! it the new one with [`Subscription::set_cadence`] when it adopts them,
//! and the task reads the current cadence at each use.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::{LeaseStore, LeaseWatch, StoreError, Versioned};
use crate::support::recurring::{Note, Recurring};
use crate::support::rounding::human;

/// A record as a store reported it, and when the answer arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// The record; `None` if the lease does not exist.
    pub record: Option<Versioned>,
    /// When the answer that carried it arrived (local monotonic time).
    pub at: Instant,
}

impl Sighting {
    /// The record's version, if there is a record.
    pub fn version(&self) -> Option<&str> {
        self.record.as_ref().map(|v| v.version.as_str())
    }
}

/// How often a subscription polls and retries, and how long one request
/// may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// A broken watch is retried after this times [1, 1.5], and the lease
    /// is read once in between.
    pub retry_period: Duration,
    /// The bound on each request.
    pub request_timeout: Duration,
}

/// The latest record of one lease; see the [module documentation](self).
/// Dropping it stops its task.
pub struct Subscription {
    latest: watch::Receiver<Option<Sighting>>,
    /// The cadence its task reads at each use.
    cadence: watch::Sender<Cadence>,
    /// [`Subscription::changed`] saw a sighting that was not taken yet.
    pending: bool,
    task: tokio::task::AbortHandle,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscription {
    /// Subscribes to `lease` in `store`: spawns the task that keeps the
    /// sighting current (on the current tokio runtime).
    pub fn start(store: Arc<dyn LeaseStore>, lease: &str, cadence: Cadence) -> Subscription {
        let (tx, latest) = watch::channel(None);
        let (cadence, cadence_rx) = watch::channel(cadence);
        let feed = Feed {
            store,
            lease: lease.to_owned(),
            cadence: cadence_rx,
            tx,
        };
        let task = tokio::spawn(feed.run()).abort_handle();
        Subscription {
            latest,
            cadence,
            pending: false,
            task,
        }
    }

    /// Polls and bounds requests with `cadence` from now on (new timings of
    /// the lease, after a reload). A poll that is waiting for its retry
    /// time stops waiting and tries to watch again at once, so that a
    /// shorter period does not wait out the longer one first.
    pub fn set_cadence(&self, cadence: Cadence) {
        self.cadence
            .send_if_modified(|c| std::mem::replace(c, cadence) != cadence);
    }

    /// The newest sighting, if there is one that was not taken yet.
    pub fn take_new(&mut self) -> Option<Sighting> {
        if std::mem::take(&mut self.pending) || self.latest.has_changed().unwrap_or(false) {
            self.latest.borrow_and_update().clone()
        } else {
            None
        }
    }

    /// Resolves when there is a sighting that was not taken yet (at once if
    /// there already is one), with `true`; with `false` if the task that
    /// keeps the sighting current has ended (it panicked: it ends in no
    /// other way while `self` lives). Cancel-safe.
    pub async fn changed(&mut self) -> bool {
        if self.pending {
            return true;
        }
        match self.latest.changed().await {
            Ok(()) => {
                self.pending = true;
                true
            }
            Err(_) => false,
        }
    }
}

struct Feed {
    store: Arc<dyn LeaseStore>,
    lease: String,
    /// Read at each use: a reload may change it.
    cadence: watch::Receiver<Cadence>,
    tx: watch::Sender<Option<Sighting>>,
}

impl Feed {
    /// The current cadence.
    fn cadence(&self) -> Cadence {
        *self.cadence.borrow()
    }

    /// Watches the lease and publishes what it sees; while it cannot
    /// watch, polls. Runs until the task is dropped.
    async fn run(mut self) {
        let mut polling = false;
        let mut unreadable = Recurring::default();
        loop {
            let started = Instant::now();
            match timeout(self.cadence().request_timeout, self.store.watch(&self.lease)).await {
                Ok(Ok(watch)) => {
                    if polling {
                        tracing::info!(lease = %self.lease, "watching the lease again");
                        polling = false;
                    }
                    let (broke, events) = self.follow(watch, &mut unreadable).await;
                    match broke {
                        Some(e) => {
                            tracing::warn!(lease = %self.lease, error = %e, "the lease watch broke; polling until it can be watched again");
                            polling = true;
                        }
                        // A watch that ended normally (a server-side
                        // timeout) is resumed at once, unless it ended as
                        // soon as it began: then no request storm.
                        None if events > 1 || started.elapsed() >= self.cadence().retry_period => {
                            tracing::debug!(lease = %self.lease, "the lease watch ended; watching again");
                            continue;
                        }
                        None => {
                            tracing::debug!(lease = %self.lease, "the lease watch ended at once; polling before watching again");
                        }
                    }
                }
                Ok(Err(e)) => {
                    // A refusal (permissions) needs an operator: say it each
                    // time; an outage once.
                    if !polling || matches!(e, StoreError::Refused { .. }) {
                        tracing::warn!(lease = %self.lease, error = %e, "cannot watch the lease; polling instead");
                        polling = true;
                    }
                }
                Err(_) => {
                    if !polling {
                        tracing::warn!(lease = %self.lease, timeout = %human(self.cadence().request_timeout), "watching the lease timed out; polling instead");
                        polling = true;
                    }
                }
            }
            self.poll().await;
        }
    }

    /// Publishes what `watch` sees until it ends: the error that broke it
    /// (`None`: it ended normally), and how many events it had.
    async fn follow(&self, mut watch: LeaseWatch, unreadable: &mut Recurring) -> (Option<StoreError>, u64) {
        let mut events = 0u64;
        loop {
            match watch.next().await {
                Some(Ok(record)) => {
                    events += 1;
                    self.publish(record);
                    if let Some(lasted) = unreadable.clear(std::time::Instant::now()) {
                        tracing::info!(lease = %self.lease, lasted = %human(lasted), "the lease's record can be read again");
                    }
                }
                // The record is there but cannot be read (a file garbled by
                // hand): the watch itself is sound and shows when it is
                // fixed. Nothing is published; the elector never overwrites
                // what it cannot read, and says so itself when it tries.
                Some(Err(e @ StoreError::Malformed { .. })) => {
                    events += 1;
                    self.unreadable(unreadable, &e);
                }
                Some(Err(e)) => return (Some(e), events),
                None => return (None, events),
            }
        }
    }

    /// Warns that the record cannot be read: the first time, then as a
    /// reminder now and then.
    fn unreadable(&self, unreadable: &mut Recurring, e: &StoreError) {
        match unreadable.note(&e.to_string(), std::time::Instant::now()) {
            Note::First => {
                tracing::warn!(lease = %self.lease, error = %e, "the lease's record cannot be read; it is left as it is until someone fixes or deletes it")
            }
            Note::Reminder { repeats, since } => {
                tracing::warn!(lease = %self.lease, error = %e, repeats, since = %human(since), "the lease's record still cannot be read")
            }
            Note::Quiet => {}
        }
    }

    /// Reads the lease once, then waits a retry period x [1, 1.5] (the
    /// caller then tries to watch again), or until the cadence changes:
    /// one read per retry period while there is no watch, as often as
    /// client-go's followers poll.
    async fn poll(&mut self) {
        // Seen from here on: only a change made after this ends the wait.
        let cadence = *self.cadence.borrow_and_update();
        let retry_at = Instant::now() + cadence.retry_period.mul_f64(rand::rng().random_range(1.0..1.5));
        match timeout(cadence.request_timeout, self.store.get(&self.lease)).await {
            Ok(Ok(record)) => self.publish(record),
            Ok(Err(e @ StoreError::Refused { .. })) => {
                tracing::warn!(lease = %self.lease, error = %e, "cannot read the lease")
            }
            Ok(Err(e)) => tracing::debug!(lease = %self.lease, error = %e, "cannot read the lease"),
            Err(_) => tracing::debug!(lease = %self.lease, "reading the lease timed out"),
        }
        tokio::select! {
            _ = sleep_until(retry_at) => {}
            // Gone (the subscription is being dropped, which aborts this
            // task): the retry time, as before.
            Ok(()) = self.cadence.changed() => {}
        }
    }

    /// Publishes what the store said; a version already published is not
    /// published again (its arrival time stays the first one).
    fn publish(&self, record: Option<Versioned>) {
        let at = Instant::now();
        self.tx.send_if_modified(|latest| {
            let same = latest
                .as_ref()
                .is_some_and(|s| s.version() == record.as_ref().map(|v| v.version.as_str()));
            if same {
                return false;
            }
            *latest = Some(Sighting { record, at });
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseRecord;
    use crate::store::memory::MemoryStore;

    fn cadence() -> Cadence {
        Cadence {
            retry_period: Duration::from_secs(1),
            request_timeout: Duration::from_millis(500),
        }
    }

    fn record(holder: &str, term: u64) -> LeaseRecord {
        LeaseRecord::new(Some(holder), term, Duration::from_secs(10))
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_watch_and_dates_each_change_on_arrival() {
        let store = MemoryStore::new();
        let mut sub = Subscription::start(Arc::new(store.clone()), "demo", cadence());
        sub.changed().await;
        assert_eq!(sub.take_new().unwrap().record, None);
        assert!(sub.take_new().is_none(), "taken");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let written = store.write_raw("demo", record("a", 1));
        let at = Instant::now();
        sub.changed().await;
        let s = sub.take_new().unwrap();
        assert_eq!(s.record, Some(written));
        assert_eq!(s.at, at);
        assert_eq!(store.op_counts().get, 0, "no polling while watching");
    }

    #[tokio::test(start_paused = true)]
    async fn polls_while_the_watch_is_broken_and_watches_again() {
        let store = MemoryStore::new();
        let mut sub = Subscription::start(Arc::new(store.clone()), "demo", cadence());
        sub.changed().await;
        sub.take_new();
        store.set_unavailable(true);
        store.break_watches();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let counts = store.op_counts();
        // One watch attempt and one read per 1 to 1.5 s at most.
        assert!(counts.get >= 6 && counts.get <= 11, "{counts:?}");
        store.set_unavailable(false);
        store.write_raw("demo", record("b", 2));
        sub.changed().await;
        assert_eq!(sub.take_new().unwrap().record.unwrap().record.term, 2);
        let watches = store.op_counts().watch;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(store.op_counts().watch, watches, "watching again, steadily");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_cadence_sets_the_polling_period_at_once() {
        let store = MemoryStore::new();
        let sub = Subscription::start(Arc::new(store.clone()), "demo", cadence());
        store.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let gets = store.op_counts().get;
        // One read per 1 to 1.5 s.
        assert!((6..=11).contains(&gets), "{gets} reads in 10 s");
        sub.set_cadence(Cadence {
            retry_period: Duration::from_secs(4),
            request_timeout: Duration::from_millis(500),
        });
        store.reset_op_counts();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let gets = store.op_counts().get;
        // One read per 4 to 6 s, from the change on (the wait under way
        // ends at the change: one read at once).
        assert!((5..=9).contains(&gets), "{gets} reads in 30 s at the new period");
        sub.set_cadence(cadence());
        store.reset_op_counts();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let gets = store.op_counts().get;
        assert!(
            (6..=12).contains(&gets),
            "{gets} reads in 10 s, back at the first period"
        );
    }
}
