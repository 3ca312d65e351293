//! The elector: one per lease, it acquires, renews and releases the lease
//! through a [`LeaseStore`] and publishes the resulting [`LeaseView`].
//!
//! It is a state machine with one step function per state:
//!
//! - **following** ([`Elector::follow`]): another host holds the lease, or
//!   nobody does yet. Waits until the lease is free (by the rule in
//!   [`follower_decision`]) and tries to take it.
//! - **leading** ([`Elector::lead`]): this host holds the lease in a
//!   [`Term`]. Renews it every retry period, each renewal bounded by the
//!   time left in the term, and steps down (ends the term) the moment the
//!   term's renew deadline passes or the record shows another holder.
//! - **resigning** ([`Elector::resign`]): this host still holds the lease
//!   but has ended the term, so that its tasks stop; it keeps renewing
//!   until every task of the term is gone ([`Term::drained`]), then
//!   releases the lease and goes back to following, or stops.
//!
//! What the store says of the lease arrives through a [`Subscription`],
//! which watches (or polls) apart from the elector: no step ever waits for a
//! watch to be set up. Each step waits for one event (a new sighting, a
//! timer, a change of [`Intent`]), makes its store requests, each bounded
//! by `request-timeout` and, while this host holds the lease, by the time
//! left in the term, and returns the next state. The decisions are plain
//! functions ([`follower_decision`], [`follower_status`], [`judge_sighting`])
//! and the elector sleeps on tokio's clock and the [term clock](TermClock),
//! so it runs under paused time in tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::claims::{self, Claim, LeaseClaims};
use super::clock::{Moment, TermClock};
use super::observe::{ElectionObserver, Heartbeat, NoObserver, StoreErrorKind};
use super::status::{LeaseView, Role, Status, YieldSeen};
use super::term::Term;
use super::timing::Timings;
use crate::store::subscription::{Cadence, Sighting, Subscription};
use crate::store::{LeaseRecord, LeaseStore, RELEASED_LEASE_DURATION, StoreError, Versioned, Yielded};
use crate::support::recurring::{Note, Recurring};
use crate::support::rounding::human;

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

/// Who an elector is in the records it writes: the configured identity and
/// a random instance id of its own, so that two processes started under
/// one identity never take each other's records for their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Me {
    /// The host's identity (`holder` in records).
    pub identity: String,
    /// Chosen at random when the elector is made (`instance` in records).
    pub instance: String,
}

impl Me {
    /// `identity` with a new random instance id.
    pub fn new(identity: &str) -> Me {
        Me {
            identity: identity.to_owned(),
            instance: format!("{:016x}", rand::random::<u64>()),
        }
    }
}

/// Why an elector stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum ElectorError {
    /// Another process holds the lease under this host's identity and kept
    /// renewing it while this one waited.
    #[error(
        "another process holds lease {lease:?} under this host's identity {identity:?} and renews it; \
         identities must be unique per process (give each its own `--identity`); this one stops \
         so the two never both lead"
    )]
    DuplicateIdentity {
        /// The lease.
        lease: String,
        /// The identity both processes use.
        identity: String,
    },
    /// The subscription that keeps the lease's record current ended.
    #[error("the subscription to lease {lease:?} ended unexpectedly")]
    SubscriptionEnded {
        /// The lease.
        lease: String,
    },
}

/// What the host wants of an elector; changed through the sender returned
/// by [`Elector::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Contend for the lease, and lead when it is won (the start).
    Contend,
    /// Another host is preferred (see [`spread`](super::spread)): lead on
    /// if this host leads; take the lease when it is released or absent
    /// only `head_start` after that was seen (at once if another host
    /// yielded it: [`LeaseRecord::yielded`]), and when it expires after
    /// `head_start` or half a retry period, whichever is shorter.
    Defer {
        /// The preferred host's head start after a release.
        head_start: Duration,
    },
    /// As [`Intent::Defer`], and hand term `term` over if this host leads
    /// in it (end the term, wait until its tasks are gone, release). A
    /// later term of this host is kept: a hand-over happens once.
    HandOver {
        /// The term to hand over.
        term: u64,
        /// The preferred host's head start after the release.
        head_start: Duration,
    },
    /// A yield (`baton yield`): hand the lead over if this host has it
    /// (end the term, wait until its tasks are gone, release, the release
    /// saying who yielded and for how long: [`LeaseRecord::yielded`]), then
    /// follow without contending until `until`.
    StandBy {
        /// When to contend again.
        until: Instant,
    },
    /// Hand the lead over if this host has it, then stop: [`Elector::run`]
    /// returns.
    Stop,
}

/// How long a resigning elector waits, past its term's force-stop time, for
/// the supervisors to confirm that every task is gone. A forced stop takes
/// milliseconds; a task still not gone by then is stuck in a host call, so
/// the lease is not released and expires normally instead.
pub const DRAIN_ALLOWANCE: Duration = Duration::from_secs(2);

/// The longest one step of an elector with timings `t` lasts when its
/// store, its runtime and its tasks behave (see [`Heartbeat`]), with a
/// second to spare: a follower with nothing to do wakes once a lease
/// duration; a leader renews every retry period, each request and the read
/// after a conflict bounded by the request timeout; a resigning host waits
/// at most for its term's force-stop time (at most renew-deadline + grace
/// away) and [`DRAIN_ALLOWANCE`], and releases before its renew deadline.
pub fn longest_step(t: &Timings) -> Duration {
    t.lease_duration
        + t.renew_deadline * 2
        + t.grace
        + t.request_timeout * 2
        + DRAIN_ALLOWANCE
        + Duration::from_secs(1)
}

/// How the subscription of a lease with timings `t` polls while it cannot
/// watch, and bounds its requests.
fn cadence(t: &Timings) -> Cadence {
    Cadence {
        retry_period: t.retry_period,
        request_timeout: t.request_timeout,
    }
}

/// Resolves when `timings` holds timings not taken yet; never without a
/// source (or once its sender is gone).
async fn timings_changed(timings: &mut Option<watch::Receiver<Timings>>) {
    let Some(t) = timings else {
        return std::future::pending().await;
    };
    if t.changed().await.is_err() {
        std::future::pending().await
    }
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
/// The lease is free when it does not exist, has no holder, is held by this
/// very process (its identity and instance), or has expired: expiry is judged from the local
/// time at which the record was *seen to change* plus the duration written
/// in the record, never from timestamps inside it (immune to clock offsets
/// between hosts, and to candidates configured with other durations).
pub fn follower_decision(known: &Sighting, me: &Me, now: Instant) -> Decision {
    let Some(current) = &known.record else {
        return Decision::Acquire;
    };
    match current.record.holder() {
        None => Decision::Acquire,
        Some(_) if current.record.held_by(&me.identity, &me.instance) => Decision::Acquire,
        // Another holder, or another process under this identity.
        Some(_) => {
            let expiry = known.at + current.record.lease_duration;
            if now >= expiry {
                Decision::Acquire
            } else {
                Decision::WaitUntil(expiry)
            }
        }
    }
}

/// The status a host that does not lead reports.
pub fn follower_status(known: Option<&Sighting>, lease: &str, me: &Me, known_term: u64) -> Status {
    let record = known.and_then(|k| k.record.as_ref()).map(|v| &v.record);
    let term = record.map_or(0, |r| r.term).max(known_term);
    match record
        .filter(|r| !r.held_by(&me.identity, &me.instance))
        .and_then(|r| r.holder())
    {
        Some(holder) => Status {
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

/// What a record seen while this host holds the lease means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The record this host last wrote: nothing new.
    Same,
    /// A later version still held by this host in its term (a write whose
    /// answer was missed, or the record deleted while held, read as its
    /// tombstone): adopt it and lead on.
    Ours(Versioned),
    /// Another holder, no holder, or no record: the lease is lost.
    Lost,
}

/// Judges what a store reports while this host holds the lease in `term`,
/// its last write being `current`.
pub fn judge_sighting(record: Option<&Versioned>, current: &Versioned, me: &Me, term: u64) -> Verdict {
    match record {
        Some(r) if r.version == current.version => Verdict::Same,
        Some(r) if r.record.held_by(&me.identity, &me.instance) && r.record.term == term => {
            Verdict::Ours(r.clone())
        }
        _ => Verdict::Lost,
    }
}

/// The states of an elector; see the [module documentation](self).
enum State {
    Following(Following),
    Leading(Lead),
    Resigning(Lead),
    Stopped,
}

/// What a host that does not lead keeps.
struct Following {
    /// No acquisition attempt before this (a back-off after a failure).
    not_before: Instant,
}

/// What a host that holds the lease keeps.
struct Lead {
    term: Arc<Term>,
    /// When it began (tokio's clock, as intents' times are).
    began: Instant,
    /// The record as this host last wrote (or adopted) it.
    current: Versioned,
    /// When to renew next, on the term clock.
    next_renew: Moment,
    /// Whether the lease is still this host's, as far as it knows (a
    /// resigning host may lose it while its tasks stop).
    held: bool,
}

/// The elector of one lease. Create it with [`Elector::new`], then drive it
/// with [`Elector::run`].
pub struct Elector {
    cfg: ElectorConfig,
    store: Arc<dyn LeaseStore>,
    clock: TermClock,
    feed: Subscription,
    tx: watch::Sender<LeaseView>,
    intent: watch::Receiver<Intent>,
    /// The record as this host last knew it, and when that version was
    /// first seen.
    known: Option<Sighting>,
    /// The highest term seen, so a re-created record never reuses a term.
    known_term: u64,
    /// Earlier terms of this host whose tasks may still run: the lease is
    /// not released until they are gone too.
    retired: Vec<Arc<Term>>,
    /// A store fault met at every attempt (an unreadable record, a
    /// refusal): said once, then recalled now and then.
    trouble: Recurring,
    /// Who this elector is in records.
    me: Me,
    /// Why the elector stops on its own, once it must.
    failure: Option<ElectorError>,
    /// Told of status changes, renewals and store errors (metrics).
    observer: Arc<dyn ElectionObserver>,
    /// When the current step began (health checks).
    heartbeat: Arc<Heartbeat>,
    /// New timings (a reload), taken while following: they apply from the
    /// next term.
    timings: Option<watch::Receiver<Timings>>,
    /// The plugins this host claims under the lease, written into every
    /// record it leads with (see [`super::claims`]); none without.
    claims: Option<watch::Receiver<BTreeMap<String, Claim>>>,
}

/// Resolves when the claims change; never without claims (or once their
/// sender is gone).
async fn claims_changed(claims: &mut Option<watch::Receiver<BTreeMap<String, Claim>>>) {
    if let Some(c) = claims
        && c.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Why a leader steps down.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// Its term ran out (no renewal confirmed in time): nobody else may
    /// lead before the force-stop time, so its tasks get their grace.
    Deadline(&'static str),
    /// The record shows another holder while the term still held it: a
    /// writer that did not wait for it to expire (a foreign client, or a
    /// clock far off) may lead already, so its tasks are stopped at once.
    Taken(&'static str),
}

impl Loss {
    fn reason(self) -> &'static str {
        match self {
            Loss::Deadline(reason) | Loss::Taken(reason) => reason,
        }
    }
}

impl Elector {
    /// An elector, the receiving end of its status channel, and the sender
    /// of its [`Intent`] (it starts contending). Subscribes to the lease at
    /// once (on the current tokio runtime).
    pub fn new(
        cfg: ElectorConfig,
        store: Arc<dyn LeaseStore>,
        clock: TermClock,
    ) -> (Elector, watch::Receiver<LeaseView>, watch::Sender<Intent>) {
        let (tx, rx) = watch::channel(LeaseView {
            status: Status::initial(&cfg.lease),
            term: None,
            since: clock.now(),
            yielded: None,
        });
        let (intent_tx, intent) = watch::channel(Intent::Contend);
        let feed = Subscription::start(store.clone(), &cfg.lease, cadence(&cfg.timings));
        let cfg_identity = cfg.identity.clone();
        let heartbeat = Arc::new(Heartbeat::new(longest_step(&cfg.timings)));
        let elector = Elector {
            cfg,
            store,
            clock,
            feed,
            tx,
            intent,
            known: None,
            known_term: 0,
            retired: Vec::new(),
            trouble: Recurring::default(),
            me: Me::new(&cfg_identity),
            failure: None,
            observer: Arc::new(NoObserver),
            heartbeat,
            timings: None,
            claims: None,
        };
        (elector, rx, intent_tx)
    }

    /// Tells `observer` of status changes, renewals and store errors from
    /// now on (instead of nobody).
    pub fn set_observer(&mut self, observer: Arc<dyn ElectionObserver>) {
        self.observer = observer;
    }

    /// Takes new timings (validated by the sender) from `timings` whenever
    /// it follows, so that they apply from its next term; the current term
    /// keeps the timings it began with.
    pub fn set_timings_source(&mut self, timings: watch::Receiver<Timings>) {
        self.timings = Some(timings);
    }

    /// Writes `claims` into every record it leads with from now on, and
    /// renews at once when they change while it leads.
    pub fn set_claims(&mut self, claims: &LeaseClaims) {
        self.claims = Some(claims.subscribe());
    }

    /// The claims to write now (marked seen).
    fn claimed(&mut self) -> Option<Vec<String>> {
        self.claims
            .as_mut()
            .map(|c| claims::listed(&c.borrow_and_update()))
    }

    /// Its heartbeat: when its current step began, and whether the store
    /// has answered it.
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// Runs the election until the intent is [`Intent::Stop`] and the lead,
    /// if held, has been handed over (or the intent's sender is dropped).
    pub async fn run(mut self) -> Result<(), ElectorError> {
        let mut state = State::Following(Following {
            not_before: Instant::now(),
        });
        loop {
            self.heartbeat.beat();
            state = match state {
                State::Following(f) => self.follow(f).await,
                State::Leading(l) => self.lead(l).await,
                State::Resigning(l) => self.resign(l).await,
                State::Stopped => return self.failure.map_or(Ok(()), Err),
            };
        }
    }

    /// What the host wants; a dropped sender means stop.
    fn intent(&self) -> Intent {
        if self.intent.has_changed().is_err() {
            return Intent::Stop;
        }
        *self.intent.borrow()
    }

    /// Whether this host should go on leading in `term` (a stand-by whose
    /// time has come contends again).
    fn keeps(&self, term: u64) -> bool {
        match self.intent() {
            Intent::Contend | Intent::Defer { .. } => true,
            Intent::HandOver { term: t, .. } => t != term,
            Intent::StandBy { until } => Instant::now() >= until,
            Intent::Stop => false,
        }
    }

    /// Following: wait for the lease to be free, then try to take it.
    async fn follow(&mut self, f: Following) -> State {
        self.take_sighting();
        // Compared, not asked whether changed: waiting for a change (below)
        // marks it seen.
        if let Some(t) = self.timings.as_mut() {
            let timings = *t.borrow_and_update();
            if timings != self.cfg.timings {
                tracing::info!(lease = %self.cfg.lease, timings = %timings, "new timings apply from the next term");
                self.cfg.timings = timings;
                self.heartbeat.set_longest_step(longest_step(&timings));
                self.feed.set_cadence(cadence(&timings));
            }
        }
        if self.failure.is_some() {
            return State::Stopped;
        }
        let now = Instant::now();
        let not_before = match self.intent() {
            Intent::Stop => return State::Stopped,
            Intent::StandBy { until } => f.not_before.max(until),
            Intent::Contend => f.not_before,
            Intent::Defer { head_start } | Intent::HandOver { head_start, .. } => match &self.known {
                Some(k) => match k.record.as_ref().filter(|v| v.record.holder().is_some()) {
                    // Yielded by another host: it does not want the lease
                    // now, so nobody waits for it.
                    None if k.record.as_ref().is_some_and(|v| {
                        v.record
                            .yielded
                            .as_ref()
                            .is_some_and(|y| y.by != self.me.identity)
                    }) =>
                    {
                        f.not_before
                    }
                    // Released or absent: the preferred host goes first.
                    None => f.not_before.max(k.at + head_start),
                    Some(v) if v.record.held_by(&self.me.identity, &self.me.instance) => f.not_before,
                    // Once expired, the preferred host gets half a retry
                    // period at most, so that failover stays within LD + RP
                    // even if the preferred host is gone too.
                    Some(v) => {
                        let grace = head_start.min(self.cfg.timings.retry_period / 2);
                        f.not_before.max(k.at + v.record.lease_duration + grace)
                    }
                },
                None => f.not_before,
            },
        };
        let wake = match &self.known {
            // Nothing is known yet: the subscription reads or watches.
            None => None,
            Some(known) => match follower_decision(known, &self.me, now) {
                Decision::Acquire if now >= not_before => {
                    if let Some(earlier) = self.undrained() {
                        return self.await_drained(earlier, f).await;
                    }
                    return self.try_acquire().await;
                }
                Decision::Acquire => Some(not_before),
                Decision::WaitUntil(t) => Some(t.max(not_before)),
            },
        };
        // At least once a lease duration, even with nothing to wait for:
        // the heartbeat shows a follower alive (nothing else changes).
        let wake = wake.map_or(now + self.cfg.timings.lease_duration, |t| {
            t.min(now + self.cfg.timings.lease_duration)
        });
        let timer = sleep_until(wake);
        tokio::select! {
            alive = self.feed.changed() => {
                if !alive {
                    return self.feed_gone();
                }
            }
            changed = self.intent.changed() => {
                if changed.is_err() {
                    return State::Stopped;
                }
            }
            // Taken at the top of the next step.
            _ = timings_changed(&mut self.timings) => {}
            _ = timer => {}
        }
        State::Following(f)
    }

    /// An earlier term of this host whose tasks may still run.
    fn undrained(&mut self) -> Option<Arc<Term>> {
        self.retired.retain(|t| !(t.is_over() && t.tasks() == 0));
        self.retired.first().cloned()
    }

    /// Waits until the tasks of an earlier term are gone before contending:
    /// a term of this host starts no task while one of an earlier term runs,
    /// just as no other host may lead before that term's force-stop time.
    /// So no task of an older term ever runs beside one of a newer term,
    /// and records tagged with terms never go back. The wait ends at the
    /// earlier term's force-stop time at the latest, when the supervisor
    /// drops its tasks.
    async fn await_drained(&mut self, earlier: Arc<Term>, f: Following) -> State {
        tracing::debug!(lease = %self.cfg.lease, term = earlier.number(), "waiting for the tasks of an earlier term to stop before taking the lease again");
        tokio::select! {
            _ = earlier.drained() => {}
            changed = self.intent.changed() => {
                if changed.is_err() {
                    return State::Stopped;
                }
            }
        }
        State::Following(f)
    }

    /// The subscription's task ended (it panicked): without news of the
    /// lease the elector cannot go on. It stops; the host notices, ends the
    /// term if there is one, and exits without releasing.
    fn feed_gone(&mut self) -> State {
        tracing::error!(lease = %self.cfg.lease, "the lease's subscription ended unexpectedly; the elector stops");
        self.failure.get_or_insert(ElectorError::SubscriptionEnded {
            lease: self.cfg.lease.clone(),
        });
        State::Stopped
    }

    /// Leading: renew on time; step down when the term's deadline passes
    /// or the lease is seen in other hands.
    async fn lead(&mut self, mut l: Lead) -> State {
        if !self.keeps(l.term.number()) {
            return self.start_resigning(l);
        }
        tokio::select! {
            biased;
            changed = self.intent.changed() => {
                if changed.is_err() {
                    return self.start_resigning(l);
                }
                // A stand-by asked for in this term hands the lease over
                // even if a renewal slower than it let its time pass
                // before this was seen.
                let intent = *self.intent.borrow_and_update();
                if let Intent::StandBy { until } = intent
                    && until > l.began
                {
                    return self.start_resigning(l);
                }
                State::Leading(l)
            }
            _ = l.term.over() => self.step_down(l, Loss::Deadline("no renewal was confirmed within the renew deadline")),
            _ = self.clock.sleep_until(l.next_renew) => match self.renew(&mut l).await {
                Ok(()) => State::Leading(l),
                Err(loss) => self.step_down(l, loss),
            },
            _ = claims_changed(&mut self.claims) => {
                // Written at once: a plugin added waits for it to start.
                l.next_renew = self.clock.now();
                State::Leading(l)
            }
            alive = self.feed.changed() => {
                if !alive {
                    return self.feed_gone();
                }
                match self.judge_feed(&mut l) {
                    Ok(()) => State::Leading(l),
                    Err(loss) => self.step_down(l, loss),
                }
            }
        }
    }

    /// Ends the term (its tasks are told now) but keeps the lease until
    /// they are gone.
    fn start_resigning(&mut self, l: Lead) -> State {
        l.term.end(self.clock.now());
        let status = Status {
            role: Role::Pending,
            holder: None,
            ..self.tx.borrow().status.clone()
        };
        self.publish(status, None);
        tracing::info!(lease = %self.cfg.lease, term = l.term.number(), force_stop_at = %l.term.stop_at_wall(), "resigning: leader tasks are told to stop; the lease is kept until they have");
        State::Resigning(l)
    }

    /// Resigning: keep the lease until the term's tasks, and those of any
    /// earlier term of this host, are gone, then release it.
    async fn resign(&mut self, mut l: Lead) -> State {
        self.retired.retain(|t| !(t.is_over() && t.tasks() == 0));
        let terms: Vec<Arc<Term>> = self.retired.iter().cloned().chain([l.term.clone()]).collect();
        let last_stop = terms.iter().map(|t| t.stop_at()).max().unwrap_or_default();
        let give_up_at = last_stop + DRAIN_ALLOWANCE;
        let held = l.held && self.clock.now() < l.term.lead_until();
        let drained = async {
            for t in &terms {
                t.drained().await;
            }
        };
        tokio::select! {
            biased;
            _ = drained => {
                if held {
                    self.release(&l).await;
                } else {
                    tracing::info!(lease = %self.cfg.lease, term = l.term.number(), "the lease was lost while the tasks stopped; nothing to release");
                }
                self.after_resigning()
            }
            _ = self.clock.sleep_until(give_up_at) => {
                let tasks: usize = terms.iter().map(|t| t.tasks()).sum();
                tracing::error!(
                    lease = %self.cfg.lease,
                    term = l.term.number(),
                    tasks,
                    "leader tasks are not confirmed stopped; not releasing the lease, which expires on its own"
                );
                self.retired.push(l.term);
                self.after_resigning()
            }
            _ = self.clock.sleep_until(l.next_renew), if held => {
                if let Err(loss) = self.renew(&mut l).await {
                    self.lost_while_resigning(&mut l, loss);
                }
                State::Resigning(l)
            }
            alive = self.feed.changed(), if held => {
                if !alive {
                    return self.feed_gone();
                }
                if let Err(loss) = self.judge_feed(&mut l) {
                    self.lost_while_resigning(&mut l, loss);
                }
                State::Resigning(l)
            }
        }
    }

    fn after_resigning(&mut self) -> State {
        match self.intent() {
            Intent::Stop => State::Stopped,
            _ => {
                self.publish_follower();
                State::Following(Following {
                    not_before: Instant::now(),
                })
            }
        }
    }

    /// Takes the subscription's newest sighting, if there is one.
    fn take_sighting(&mut self) {
        if let Some(s) = self.feed.take_new() {
            self.observe(s.record, s.at);
            self.publish_follower();
        }
    }

    /// While holding the lease: what the subscription saw.
    fn judge_feed(&mut self, l: &mut Lead) -> Result<(), Loss> {
        let Some(s) = self.feed.take_new() else {
            return Ok(());
        };
        match judge_sighting(s.record.as_ref(), &l.current, &self.me, l.term.number()) {
            Verdict::Same => Ok(()),
            Verdict::Ours(adopted) => {
                l.current = adopted.clone();
                self.observe(Some(adopted), s.at);
                Ok(())
            }
            Verdict::Lost => {
                self.observe(s.record, s.at);
                Err(Loss::Taken("the lease was taken over, overwritten or deleted"))
            }
        }
    }

    /// Records what this host learned of the record; the time it was seen
    /// only moves when the version changed.
    fn observe(&mut self, record: Option<Versioned>, at: Instant) {
        self.heartbeat.answer();
        if let Some(r) = &record {
            self.known_term = self.known_term.max(r.record.term);
        }
        let changed = match &self.known {
            None => true,
            Some(k) => k.version() != record.as_ref().map(|v| v.version.as_str()),
        };
        if changed {
            let namesake = |k: Option<&Versioned>| {
                k.is_some_and(|v| v.record.held_by_namesake(&self.me.identity, &self.me.instance))
            };
            let before = namesake(self.known.as_ref().and_then(|k| k.record.as_ref()));
            // A tombstone (the record of a lease deleted while held) gets
            // versions of its own from the store that reads it: a deletion,
            // not a write by the namesake.
            let written = record
                .as_ref()
                .is_some_and(|v| !v.version.starts_with(crate::store::TOMBSTONE));
            if namesake(record.as_ref()) {
                if before && written {
                    // Written again by the other process: it is alive.
                    self.failure.get_or_insert(ElectorError::DuplicateIdentity {
                        lease: self.cfg.lease.clone(),
                        identity: self.me.identity.clone(),
                    });
                } else {
                    tracing::warn!(
                        lease = %self.cfg.lease,
                        identity = %self.me.identity,
                        "the lease is held by another process under this host's identity; waiting \
                         for its lease to run out (this one stops if the other renews it)"
                    );
                }
            }
            if let Some(y) = record.as_ref().and_then(|v| v.record.yielded.as_ref()) {
                let seen = YieldSeen {
                    by: y.by.clone(),
                    until: at + y.duration,
                };
                self.tx.send_if_modified(|view| {
                    view.yielded = Some(seen);
                    false
                });
            }
            self.known = Some(Sighting { record, at });
        }
    }

    /// Publishes a status; observers wake only if it differs.
    fn publish(&self, status: Status, term: Option<Arc<Term>>) {
        let lease = &self.cfg.lease;
        let since = self.clock.now();
        let observer = &self.observer;
        self.tx.send_if_modified(|view| {
            if view.status == status {
                view.term = term;
                return false;
            }
            observer.status_changed(&view.status, &status);
            tracing::info!(
                lease = %lease,
                role = %status.role,
                holder = status.holder.as_deref().unwrap_or(""),
                term = status.term,
                "lease status changed"
            );
            view.status = status;
            view.term = term;
            view.since = since;
            true
        });
    }

    fn publish_follower(&self) {
        let status = follower_status(self.known.as_ref(), &self.cfg.lease, &self.me, self.known_term);
        self.publish(status, None);
    }

    /// Reads the lease now (bounded by `limit`), dating the answer on
    /// arrival. `None` if it failed.
    async fn read(&mut self, limit: Duration) -> Option<Option<Versioned>> {
        match timeout(limit, self.store.get(&self.cfg.lease)).await {
            Ok(Ok(record)) => {
                // A change is dated when we learn of it, never earlier: a
                // later date only makes this host wait longer.
                self.observe(record.clone(), Instant::now());
                self.trouble_over();
                Some(record)
            }
            Ok(Err(e)) => {
                self.store_fault("read", &e);
                None
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, timeout = %human(limit), "reading the lease timed out");
                None
            }
        }
    }

    /// A store fault met while trying to `doing` the lease. Met at every
    /// attempt while it lasts (a record that cannot be read is never
    /// overwritten, a refusal stays): said once, then recalled now and then.
    fn store_fault(&mut self, doing: &str, e: &StoreError) {
        self.failed_request(StoreErrorKind::of(e));
        let lease = &self.cfg.lease;
        match self.trouble.note(&e.to_string(), Instant::now().into_std()) {
            Note::First => tracing::warn!(lease = %lease, error = %e, "cannot {doing} the lease"),
            Note::Reminder { repeats, since } => {
                tracing::warn!(lease = %lease, error = %e, repeats, since = %human(since), "still cannot {doing} the lease")
            }
            Note::Quiet => tracing::debug!(lease = %lease, error = %e, "cannot {doing} the lease"),
        }
    }

    /// A store request failed: the observer counts it.
    fn failed_request(&self, kind: StoreErrorKind) {
        self.observer.store_error(&self.cfg.lease, kind);
    }

    /// The store answered: a lasting fault, if there was one, is over.
    fn trouble_over(&mut self) {
        if let Some(lasted) = self.trouble.clear(Instant::now().into_std()) {
            tracing::info!(lease = %self.cfg.lease, lasted = %human(lasted), "the lease's store answers again");
        }
    }

    fn jittered_retry(&self) -> Duration {
        self.cfg
            .timings
            .retry_period
            .mul_f64(rand::rng().random_range(1.0..1.5))
    }

    fn backoff(&self) -> State {
        State::Following(Following {
            not_before: Instant::now() + self.jittered_retry(),
        })
    }

    async fn try_acquire(&mut self) -> State {
        let t = self.cfg.timings;
        let previous = self.known.as_ref().and_then(|k| k.record.clone());
        let term = previous
            .as_ref()
            .map_or(0, |p| p.record.term)
            .max(self.known_term)
            + 1;
        let wall = SystemTime::now();
        let record = LeaseRecord {
            plugins: self.claimed(),
            yielded: None,
            instance: Some(self.me.instance.clone()),
            holder: Some(self.cfg.identity.clone()),
            lease_duration: t.lease_duration,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            term,
        };
        let started = self.clock.now();
        let started_at = Instant::now();
        let request = async {
            match &previous {
                Some(p) => self.store.update(&self.cfg.lease, &p.version, &record).await,
                None => self.store.create(&self.cfg.lease, &record).await,
            }
        };
        match timeout(t.request_timeout, request).await {
            Ok(Ok(written)) => {
                self.observe(Some(written.clone()), started_at);
                self.trouble_over();
                let term = Term::begin(
                    &self.cfg.lease,
                    term,
                    t.grace,
                    self.clock.clone(),
                    started + t.renew_deadline,
                );
                term.confirm_claims(written.record.plugins.as_deref().unwrap_or_default());
                let status = Status {
                    role: Role::Leading,
                    holder: Some(self.cfg.identity.clone()),
                    lease: self.cfg.lease.clone(),
                    term: term.number(),
                };
                self.publish(status, Some(term.clone()));
                State::Leading(Lead {
                    term,
                    began: started_at,
                    current: written,
                    next_renew: started + t.retry_period,
                    held: true,
                })
            }
            Ok(Err(e)) if e.is_conflict() => {
                self.failed_request(StoreErrorKind::Conflict);
                tracing::debug!(lease = %self.cfg.lease, "another host wrote first; reading the lease again");
                let read = self.read(t.request_timeout).await;
                self.publish_follower();
                match read {
                    // The store refuses what it still shows: do not spin on
                    // it; try again after a retry period. A record read
                    // with a higher term than before (a term floor found
                    // above the Lease's own, which another contender may
                    // just have raised) is news: the next attempt starts
                    // above it, at once.
                    Some(r)
                        if r.as_ref().map(|v| (&v.version, v.record.term))
                            == previous.as_ref().map(|v| (&v.version, v.record.term)) =>
                    {
                        tracing::warn!(lease = %self.cfg.lease, error = %e, "the lease reads the same after a conflict; backing off");
                        self.backoff()
                    }
                    Some(_) => State::Following(Following {
                        not_before: Instant::now(),
                    }),
                    None => self.backoff(),
                }
            }
            Ok(Err(e)) => {
                self.store_fault("acquire", &e);
                self.backoff()
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, timeout = %human(t.request_timeout), "acquiring the lease timed out");
                // The write may have landed: read again before the next
                // attempt (which then conflicts if the read fails too).
                let _ = self.read(t.request_timeout).await;
                self.publish_follower();
                self.backoff()
            }
        }
    }

    /// Renews the lease, bounded by `request-timeout` and by the time left
    /// in the term. `Err` with the reason if the lease is lost.
    async fn renew(&mut self, l: &mut Lead) -> Result<(), Loss> {
        let t = self.cfg.timings;
        let started = self.clock.now();
        let until = l.term.lead_until();
        if started >= until {
            return Err(Loss::Deadline(
                "no renewal was confirmed within the renew deadline",
            ));
        }
        let limit = t.request_timeout.min(until - started);
        let version = l.current.version.clone();
        let record = LeaseRecord {
            plugins: self.claimed(),
            yielded: None,
            renew_time: Some(SystemTime::now()),
            ..l.current.record.clone()
        };
        let result = timeout(limit, self.store.update(&self.cfg.lease, &version, &record)).await;
        let retry_soon = |clock: &TermClock| clock.now() + t.retry_period / 2;
        match result {
            Ok(Ok(written)) => {
                self.trouble_over();
                self.observer
                    .renewed(&self.cfg.lease, self.clock.now().since(started));
                if !l.term.extend(started + t.renew_deadline) {
                    return Err(Loss::Deadline(
                        "the renewal was confirmed only after the renew deadline",
                    ));
                }
                l.next_renew = started + t.retry_period;
                l.term
                    .confirm_claims(written.record.plugins.as_deref().unwrap_or_default());
                l.current = written.clone();
                self.observe(Some(written), Instant::now());
                Ok(())
            }
            Ok(Err(e)) if e.is_conflict() => {
                self.failed_request(StoreErrorKind::Conflict);
                // Someone wrote after our last write. If it is still ours
                // (a write whose answer we missed), adopt it; otherwise the
                // lease was taken: stop at once. The read is bounded by the
                // term too.
                let left = l.term.lead_until() - self.clock.now();
                match self.read(t.request_timeout.min(left)).await {
                    Some(current) => {
                        match judge_sighting(current.as_ref(), &l.current, &self.me, l.term.number()) {
                            Verdict::Ours(current) => {
                                // Renew it at once, unless it is the very
                                // version that conflicted (then not in a loop).
                                l.next_renew = if current.version == version {
                                    retry_soon(&self.clock)
                                } else {
                                    self.clock.now()
                                };
                                l.term
                                    .confirm_claims(current.record.plugins.as_deref().unwrap_or_default());
                                l.current = current;
                                Ok(())
                            }
                            Verdict::Same => {
                                l.next_renew = retry_soon(&self.clock);
                                Ok(())
                            }
                            Verdict::Lost => Err(Loss::Taken("the lease was written by another host")),
                        }
                    }
                    None => {
                        l.next_renew = retry_soon(&self.clock);
                        tracing::warn!(lease = %self.cfg.lease, "renewal conflicted and the lease cannot be read; retrying");
                        Ok(())
                    }
                }
            }
            Ok(Err(e)) => {
                self.failed_request(StoreErrorKind::of(&e));
                let remaining = until - self.clock.now();
                match self.trouble.note(&e.to_string(), Instant::now().into_std()) {
                    Note::Quiet => {
                        tracing::debug!(lease = %self.cfg.lease, error = %e, remaining = %human(remaining), "renewal failed; still leading until the renew deadline")
                    }
                    _ => {
                        tracing::warn!(lease = %self.cfg.lease, error = %e, remaining = %human(remaining), "renewal failed; still leading until the renew deadline")
                    }
                }
                l.next_renew = retry_soon(&self.clock);
                Ok(())
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, remaining = %human(until - self.clock.now()), "renewal timed out; still leading until the renew deadline");
                l.next_renew = retry_soon(&self.clock);
                Ok(())
            }
        }
    }

    /// The lease was lost while the term's tasks stop (resigning): nothing
    /// to release any more, and if it was taken, no grace either.
    fn lost_while_resigning(&mut self, l: &mut Lead, loss: Loss) {
        if let Loss::Taken(_) = loss {
            l.term.end_without_grace(self.clock.now());
        }
        tracing::warn!(lease = %self.cfg.lease, term = l.term.number(), reason = loss.reason(), force_stop_at = %l.term.stop_at_wall(), "lost the lease while its tasks stop");
        l.held = false;
    }

    /// Stops leading at once: the term ends now. Its tasks may run until its
    /// force-stop time (now, if the lease was taken: see [`Loss`]); it is
    /// kept among the retired terms until they are gone, so that a later
    /// release waits for them too.
    fn step_down(&mut self, l: Lead, loss: Loss) -> State {
        match loss {
            Loss::Deadline(_) => l.term.end(self.clock.now()),
            Loss::Taken(_) => l.term.end_without_grace(self.clock.now()),
        }
        let reason = loss.reason();
        tracing::warn!(lease = %self.cfg.lease, term = l.term.number(), reason, force_stop_at = %l.term.stop_at_wall(), "stepping down");
        self.retired.retain(|t| !(t.is_over() && t.tasks() == 0));
        self.retired.push(l.term);
        self.publish_follower();
        State::Following(Following {
            not_before: Instant::now(),
        })
    }

    /// Gives the lease up after its tasks have drained: an empty holder and
    /// a short duration, so a standby takes over at once. Retried on
    /// conflict (an in-flight renewal) while the lease is still ours, and
    /// never past the term's renew deadline.
    async fn release(&mut self, l: &Lead) {
        let t = self.cfg.timings;
        let term = l.term.number();
        let mut current = l.current.clone();
        loop {
            let now = self.clock.now();
            let until = l.term.lead_until();
            if now >= until {
                tracing::warn!(lease = %self.cfg.lease, term, "could not release the lease before the renew deadline; it will expire");
                return;
            }
            // A release standing by is a yield: the others take the lease
            // at once, and know this host stays out until then.
            let yielded = match self.intent() {
                Intent::StandBy { until } if until > Instant::now() => Some(Yielded {
                    by: self.cfg.identity.clone(),
                    duration: until - Instant::now(),
                }),
                _ => None,
            };
            let record = LeaseRecord {
                yielded,
                plugins: None,
                instance: None,
                holder: None,
                lease_duration: RELEASED_LEASE_DURATION,
                acquire_time: None,
                renew_time: Some(SystemTime::now()),
                term,
            };
            let limit = t.request_timeout.min(until - now);
            match timeout(
                limit,
                self.store.update(&self.cfg.lease, &current.version, &record),
            )
            .await
            {
                Ok(Ok(written)) => {
                    self.observe(Some(written), Instant::now());
                    tracing::info!(lease = %self.cfg.lease, term, "released the lease");
                    return;
                }
                Ok(Err(e)) if e.is_conflict() => {
                    self.failed_request(StoreErrorKind::Conflict);
                    let left = l.term.lead_until() - self.clock.now();
                    match self.read(t.request_timeout.min(left)).await {
                        Some(read) => match judge_sighting(read.as_ref(), &current, &self.me, term) {
                            Verdict::Ours(v) => current = v,
                            Verdict::Same => self.pause(t.retry_period / 4).await,
                            Verdict::Lost => {
                                tracing::info!(lease = %self.cfg.lease, term, "the lease is no longer ours; nothing to release");
                                return;
                            }
                        },
                        None => self.pause(t.retry_period / 4).await,
                    }
                }
                Ok(Err(e)) => {
                    self.failed_request(StoreErrorKind::of(&e));
                    tracing::warn!(lease = %self.cfg.lease, error = %e, "releasing the lease failed; retrying");
                    self.pause(t.retry_period / 4).await;
                }
                Err(_) => {
                    self.failed_request(StoreErrorKind::Timeout);
                    tracing::warn!(lease = %self.cfg.lease, "releasing the lease timed out; retrying");
                }
            }
        }
    }

    async fn pause(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}
