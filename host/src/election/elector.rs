//! The elector: one per lease, it acquires, renews and releases the lease
//! through a [`LeaseStore`] and publishes the resulting [`LeaseView`].
//!
//! The decisions are plain functions of what was observed and when
//! ([`follower_decision`], [`follower_status`]); the loop around them only
//! performs store requests (each bounded by `request-timeout`) and sleeps on
//! tokio's clock, so the whole elector runs under paused time in tests.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use rand::Rng;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use super::status::{LeaseView, Role, Status, TermDeadline};
use super::timing::Timings;
use crate::store::{LeaseRecord, LeaseStore, LeaseWatch, StoreError, Versioned};

/// The duration written on release: others may take over at once. Zero is
/// not a valid Kubernetes lease duration (client-go#754), hence one second.
pub const RELEASED_LEASE_DURATION: Duration = Duration::from_secs(1);

/// client-go's jitter factor: followers without a watch poll every
/// retry-period x [1, 2.2].
const POLL_JITTER: f64 = 1.2;

/// What an elector needs to know about itself.
#[derive(Clone, Debug)]
pub struct ElectorConfig {
    /// The lease to contend for.
    pub lease: String,
    /// This host's identity; must be unique per process.
    pub identity: String,
    /// The lease's timings; validated by the caller.
    pub timings: Timings,
}

/// How the host tells an elector to stop.
///
/// Shutdown has two steps so that tasks stop *before* the lease is
/// released: `resign` makes the elector report `pending` (guests are told
/// to stop) while it keeps renewing; `drained` says every task of the lease
/// has stopped, and the elector then releases the lease and returns.
#[derive(Clone, Debug, Default)]
pub struct ElectorControl {
    /// Stop leading: report `pending`, acquire nothing new, keep renewing.
    pub resign: CancellationToken,
    /// Every task of this lease has stopped: release and return.
    pub drained: CancellationToken,
}

/// A record as last observed, and when it was first seen in that version.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The record; `None` if the lease does not exist.
    pub record: Option<Versioned>,
    /// When this version was first seen (local monotonic time).
    pub seen_at: Instant,
}

/// What a host that does not lead should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Try to take the lease now.
    Acquire,
    /// The holder's lease is valid until then.
    WaitUntil(Instant),
}

/// Decides whether a host that does not lead may try to take the lease.
///
/// The lease is free when it does not exist, has no holder, is held under
/// this host's own identity, or has expired: expiry is judged from the local
/// time at which the record was *seen to change* plus the duration written
/// in the record, never from timestamps inside it (immune to clock offsets
/// between hosts, and to candidates configured with other durations).
pub fn follower_decision(obs: &Observation, identity: &str, now: Instant) -> Decision {
    let Some(current) = &obs.record else {
        return Decision::Acquire;
    };
    match current.record.holder() {
        None => Decision::Acquire,
        Some(holder) if holder == identity => Decision::Acquire,
        Some(_) => {
            let expiry = obs.seen_at + current.record.lease_duration;
            if now >= expiry {
                Decision::Acquire
            } else {
                Decision::WaitUntil(expiry)
            }
        }
    }
}

/// The status a host that does not lead reports for an observation.
pub fn follower_status(obs: Option<&Observation>, lease: &str, identity: &str, known_term: u64) -> Status {
    let record = obs.and_then(|o| o.record.as_ref()).map(|v| &v.record);
    let term = record.map_or(0, |r| r.transitions).max(known_term);
    match record.and_then(|r| r.holder()) {
        Some(holder) if holder != identity => Status {
            role: Role::Following,
            holder: Some(holder.to_owned()),
            lease: lease.to_owned(),
            term,
        },
        _ => Status {
            role: Role::Pending,
            holder: None,
            lease: lease.to_owned(),
            term,
        },
    }
}

/// What this host knows while it leads.
#[derive(Debug)]
struct Leadership {
    deadline: Arc<TermDeadline>,
    current: Versioned,
    next_renew: Instant,
}

/// The elector of one lease. Create it with [`Elector::new`], then drive it
/// with [`Elector::run`].
pub struct Elector {
    cfg: ElectorConfig,
    store: Arc<dyn LeaseStore>,
    tx: watch::Sender<LeaseView>,
    observed: Option<Observation>,
    leading: Option<Leadership>,
    /// The highest term seen, so a re-created record never reuses a term.
    known_term: u64,
    /// No acquisition attempt before this (back-off after a failure).
    not_before: Instant,
    resigning: bool,
}

impl Elector {
    /// An elector and the receiving end of its status channel.
    pub fn new(cfg: ElectorConfig, store: Arc<dyn LeaseStore>) -> (Elector, watch::Receiver<LeaseView>) {
        let (tx, rx) = watch::channel(LeaseView {
            status: Status::initial(&cfg.lease),
            deadline: None,
            since: Instant::now(),
        });
        let elector = Elector {
            cfg,
            store,
            tx,
            observed: None,
            leading: None,
            known_term: 0,
            not_before: Instant::now(),
            resigning: false,
        };
        (elector, rx)
    }

    /// Runs the election until `control` says the lease's tasks have
    /// drained (then the lease is released), or until `resign` is fired
    /// while this host does not lead.
    pub async fn run(mut self, control: ElectorControl) {
        let mut watch: Option<LeaseWatch> = None;
        let mut watch_retry_at = Instant::now();
        let mut poll_at = Instant::now();
        loop {
            let now = Instant::now();
            if watch.is_none() && now >= watch_retry_at {
                match timeout_at(
                    now + self.cfg.timings.request_timeout,
                    self.store.watch(&self.cfg.lease),
                )
                .await
                {
                    Ok(Ok(w)) => watch = Some(w),
                    Ok(Err(e)) => {
                        tracing::warn!(lease = %self.cfg.lease, error = %e, "cannot watch the lease; polling instead");
                        watch_retry_at = now + self.jittered_retry();
                    }
                    Err(_) => {
                        tracing::warn!(lease = %self.cfg.lease, "watching the lease timed out; polling instead");
                        watch_retry_at = now + self.jittered_retry();
                    }
                }
            }
            if control.resign.is_cancelled() && !self.resigning {
                self.resigning = true;
                let current = self.tx.borrow().status.clone();
                self.publish(
                    Status {
                        role: Role::Pending,
                        holder: None,
                        ..current
                    },
                    None,
                );
                tracing::info!(lease = %self.cfg.lease, "resigning: leader tasks are told to stop; the lease is kept until they have");
            }
            if self.resigning && self.leading.is_none() {
                return;
            }
            if self.resigning && control.drained.is_cancelled() {
                self.release().await;
                return;
            }

            if let Some(l) = &self.leading {
                let (renew_at, until) = (l.next_renew, l.deadline.until());
                tokio::select! {
                    biased;
                    _ = control.resign.cancelled(), if !self.resigning => {}
                    _ = control.drained.cancelled(), if self.resigning => {}
                    _ = sleep_until(until) => {
                        self.step_down("no renewal was confirmed within the renew deadline");
                    }
                    _ = sleep_until(renew_at) => self.renew().await,
                    event = next_event(&mut watch) => self.on_watch_event(event, &mut watch, &mut watch_retry_at),
                }
                continue;
            }

            // Not leading.
            let decision = match &self.observed {
                Some(obs) => follower_decision(obs, &self.cfg.identity, now),
                None => Decision::WaitUntil(now), // read first
            };
            if self.observed.is_none() {
                if now < self.not_before {
                    // The last read failed: back off before reading again.
                    tokio::select! {
                        _ = control.resign.cancelled(), if !self.resigning => {}
                        _ = sleep_until(self.not_before) => {}
                    }
                    continue;
                }
                self.refresh().await;
                poll_at = Instant::now() + self.jittered_poll();
                continue;
            }
            let mut wake = match decision {
                Decision::Acquire if self.resigning => None,
                Decision::Acquire if now >= self.not_before => {
                    self.try_acquire().await;
                    continue;
                }
                Decision::Acquire => Some(self.not_before),
                Decision::WaitUntil(t) => Some(t),
            };
            if watch.is_none() {
                wake = Some(wake.map_or(poll_at, |w| w.min(poll_at)).min(watch_retry_at));
            }
            let sleep = async {
                match wake {
                    Some(t) => sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = control.resign.cancelled(), if !self.resigning => {}
                event = next_event(&mut watch) => self.on_watch_event(event, &mut watch, &mut watch_retry_at),
                _ = sleep => {
                    if watch.is_none() && Instant::now() >= poll_at {
                        self.refresh().await;
                        poll_at = Instant::now() + self.jittered_poll();
                    }
                }
            }
        }
    }

    fn jittered_retry(&self) -> Duration {
        self.cfg
            .timings
            .retry_period
            .mul_f64(rand::rng().random_range(1.0..1.5))
    }

    fn jittered_poll(&self) -> Duration {
        self.cfg
            .timings
            .retry_period
            .mul_f64(rand::rng().random_range(1.0..1.0 + POLL_JITTER))
    }

    /// Records an observation; the time it was seen only moves when the
    /// version changed.
    fn observe(&mut self, record: Option<Versioned>, at: Instant) {
        if let Some(r) = &record {
            self.known_term = self.known_term.max(r.record.transitions);
        }
        let changed = match &self.observed {
            None => true,
            Some(o) => o.record.as_ref().map(|v| &v.version) != record.as_ref().map(|v| &v.version),
        };
        if changed {
            self.observed = Some(Observation { record, seen_at: at });
        }
    }

    /// Publishes a status; observers wake only if it differs.
    fn publish(&self, status: Status, deadline: Option<Arc<TermDeadline>>) {
        let lease = &self.cfg.lease;
        self.tx.send_if_modified(|view| {
            if view.status == status {
                view.deadline = deadline;
                return false;
            }
            tracing::info!(
                lease = %lease,
                role = %status.role,
                holder = status.holder.as_deref().unwrap_or(""),
                term = status.term,
                "lease status changed"
            );
            *view = LeaseView {
                status,
                deadline,
                since: Instant::now(),
            };
            true
        });
    }

    fn publish_follower(&self) {
        if self.resigning {
            return;
        }
        let status = follower_status(
            self.observed.as_ref(),
            &self.cfg.lease,
            &self.cfg.identity,
            self.known_term,
        );
        self.publish(status, None);
    }

    async fn refresh(&mut self) {
        let at = Instant::now();
        match timeout_at(
            at + self.cfg.timings.request_timeout,
            self.store.get(&self.cfg.lease),
        )
        .await
        {
            Ok(Ok(record)) => {
                // A change is dated when we learn of it, never earlier: a
                // later date only makes this host wait longer.
                self.observe(record, Instant::now());
                if self.leading.is_none() {
                    self.publish_follower();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.lease, error = %e, "cannot read the lease");
                self.not_before = Instant::now() + self.jittered_retry();
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.lease, timeout = ?self.cfg.timings.request_timeout, "reading the lease timed out");
                self.not_before = Instant::now() + self.jittered_retry();
            }
        }
    }

    async fn try_acquire(&mut self) {
        let t = self.cfg.timings;
        let previous = self.observed.as_ref().and_then(|o| o.record.clone());
        let term = previous
            .as_ref()
            .map_or(0, |p| p.record.transitions)
            .max(self.known_term)
            + 1;
        let wall = SystemTime::now();
        let record = LeaseRecord {
            holder: Some(self.cfg.identity.clone()),
            lease_duration: t.lease_duration,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: term,
        };
        let started = Instant::now();
        let request = async {
            match &previous {
                Some(p) => self.store.update(&self.cfg.lease, &p.version, &record).await,
                None => self.store.create(&self.cfg.lease, &record).await,
            }
        };
        match timeout_at(started + t.request_timeout, request).await {
            Ok(Ok(written)) => {
                self.observe(Some(written.clone()), started);
                let deadline = TermDeadline::new(term, started + t.renew_deadline);
                self.leading = Some(Leadership {
                    deadline: deadline.clone(),
                    current: written,
                    next_renew: started + t.retry_period,
                });
                let status = Status {
                    role: Role::Leading,
                    holder: Some(self.cfg.identity.clone()),
                    lease: self.cfg.lease.clone(),
                    term,
                };
                self.publish(status, Some(deadline));
            }
            Ok(Err(e)) if e.is_conflict() => {
                tracing::debug!(lease = %self.cfg.lease, "another host wrote first; reading the lease again");
                self.refresh().await;
                let unchanged = |o: &Observation| {
                    o.record.as_ref().map(|v| &v.version) == previous.as_ref().map(|v| &v.version)
                };
                if self.observed.as_ref().is_some_and(unchanged) {
                    // The store refuses what it still shows: do not spin
                    // on it; try again after a retry period.
                    tracing::warn!(lease = %self.cfg.lease, error = %e, "the lease reads the same after a conflict; backing off");
                    self.not_before = Instant::now() + self.jittered_retry();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.lease, error = %e, "cannot acquire the lease");
                self.not_before = Instant::now() + self.jittered_retry();
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.lease, timeout = ?t.request_timeout, "acquiring the lease timed out");
                // The write may have landed; read again before the next try.
                self.observed = None;
                self.not_before = Instant::now() + self.jittered_retry();
            }
        }
    }

    async fn renew(&mut self) {
        let t = self.cfg.timings;
        let Some(l) = &self.leading else { return };
        let until = l.deadline.until();
        let term = l.deadline.term();
        let version = l.current.version.clone();
        let record = LeaseRecord {
            renew_time: Some(SystemTime::now()),
            ..l.current.record.clone()
        };
        let started = Instant::now();
        let limit = (started + t.request_timeout).min(until);
        let result = timeout_at(limit, self.store.update(&self.cfg.lease, &version, &record)).await;
        let Some(l) = &mut self.leading else { return };
        match result {
            Ok(Ok(written)) => {
                l.deadline.extend_to(started + t.renew_deadline);
                l.next_renew = started + t.retry_period;
                l.current = written.clone();
                self.observe(Some(written), started);
            }
            Ok(Err(e)) if e.is_conflict() => {
                // Someone wrote after our last write. If it is still ours
                // (a write whose answer we missed), adopt it; otherwise the
                // lease was taken: stop at once.
                let at = Instant::now();
                match timeout_at(at + t.request_timeout, self.store.get(&self.cfg.lease)).await {
                    Ok(Ok(Some(current)))
                        if current.record.holder() == Some(self.cfg.identity.as_str())
                            && current.record.transitions == term =>
                    {
                        // Ours: renew it at once, unless it is the very
                        // version that conflicted (then not in a loop).
                        l.next_renew = if current.version == version {
                            Instant::now() + t.retry_period / 2
                        } else {
                            Instant::now()
                        };
                        l.current = current.clone();
                        self.observe(Some(current), Instant::now());
                    }
                    Ok(Ok(current)) => {
                        // Dated on arrival, as every read (see `refresh`).
                        self.observe(current, Instant::now());
                        self.step_down("the lease was written by another host");
                    }
                    _ => {
                        l.next_renew = Instant::now() + t.retry_period / 2;
                        tracing::warn!(lease = %self.cfg.lease, "renewal conflicted and the lease cannot be read; retrying");
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.lease, error = %e, remaining = ?until.saturating_duration_since(Instant::now()), "renewal failed; still leading until the renew deadline");
                l.next_renew = Instant::now() + t.retry_period / 2;
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.lease, remaining = ?until.saturating_duration_since(Instant::now()), "renewal timed out; still leading until the renew deadline");
                l.next_renew = Instant::now() + t.retry_period / 2;
            }
        }
    }

    /// Stops leading at once: the term ends now.
    fn step_down(&mut self, reason: &str) {
        if let Some(l) = self.leading.take() {
            l.deadline.end_by(Instant::now());
            tracing::warn!(lease = %self.cfg.lease, term = l.deadline.term(), reason, "stepping down");
        }
        if self.resigning {
            // Guests were already told; nothing to release any more.
            return;
        }
        self.publish_follower();
    }

    fn on_watch_event(
        &mut self,
        event: Option<Result<Option<Versioned>, StoreError>>,
        watch: &mut Option<LeaseWatch>,
        watch_retry_at: &mut Instant,
    ) {
        let now = Instant::now();
        match event {
            Some(Ok(record)) => {
                if let Some(l) = &self.leading {
                    let ours = record.as_ref().is_some_and(|r| {
                        r.version == l.current.version
                            || (r.record.holder() == Some(self.cfg.identity.as_str())
                                && r.record.transitions == l.deadline.term())
                    });
                    if !ours {
                        self.observe(record, now);
                        self.step_down("the lease was taken over, overwritten or deleted");
                        return;
                    }
                    if let Some(r) = record.filter(|r| r.version != l.current.version) {
                        // Our own write whose answer we missed: adopt it.
                        if let Some(l) = &mut self.leading {
                            l.current = r.clone();
                        }
                        self.observe(Some(r), now);
                    }
                    return;
                }
                self.observe(record, now);
                self.publish_follower();
            }
            Some(Err(e)) => {
                tracing::warn!(lease = %self.cfg.lease, error = %e, "the lease watch broke; watching again");
                *watch = None;
                *watch_retry_at = now + self.jittered_retry();
            }
            None => {
                tracing::debug!(lease = %self.cfg.lease, "the lease watch ended; watching again");
                *watch = None;
                *watch_retry_at = now;
            }
        }
    }

    /// Gives the lease up after its tasks have drained: an empty holder and
    /// a short duration, so a standby takes over at once. Retried on
    /// conflict (an in-flight renewal) while the lease is still ours.
    async fn release(&mut self) {
        let t = self.cfg.timings;
        let Some(l) = self.leading.take() else { return };
        let term = l.deadline.term();
        let mut current = l.current;
        loop {
            let now = Instant::now();
            if now >= l.deadline.until() {
                tracing::warn!(lease = %self.cfg.lease, term, "could not release the lease before the renew deadline; it will expire");
                return;
            }
            let record = LeaseRecord {
                holder: None,
                lease_duration: RELEASED_LEASE_DURATION,
                acquire_time: None,
                renew_time: Some(SystemTime::now()),
                transitions: term,
            };
            let limit = (now + t.request_timeout).min(l.deadline.until());
            match timeout_at(
                limit,
                self.store.update(&self.cfg.lease, &current.version, &record),
            )
            .await
            {
                Ok(Ok(_)) => {
                    l.deadline.end_by(Instant::now());
                    tracing::info!(lease = %self.cfg.lease, term, "released the lease");
                    return;
                }
                Ok(Err(e)) if e.is_conflict() => {
                    match timeout_at(
                        Instant::now() + t.request_timeout,
                        self.store.get(&self.cfg.lease),
                    )
                    .await
                    {
                        Ok(Ok(Some(v)))
                            if v.record.holder() == Some(self.cfg.identity.as_str())
                                && v.record.transitions == term =>
                        {
                            current = v;
                        }
                        Ok(Ok(_)) => {
                            tracing::info!(lease = %self.cfg.lease, term, "the lease is no longer ours; nothing to release");
                            return;
                        }
                        _ => tokio::time::sleep(t.retry_period / 4).await,
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.cfg.lease, error = %e, "releasing the lease failed; retrying");
                    tokio::time::sleep(t.retry_period / 4).await;
                }
                Err(_) => {
                    tracing::warn!(lease = %self.cfg.lease, "releasing the lease timed out; retrying");
                }
            }
        }
    }
}

async fn next_event(watch: &mut Option<LeaseWatch>) -> Option<Result<Option<Versioned>, StoreError>> {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}
