//! The elector: one per lease, it acquires, renews and releases the lease
//! through a [`LeaseStore`] and publishes the resulting [`LeaseView`].
//!
//! It is a state machine with one step function per state:
//!
//! - **following** ([`Elector::follow`], in `follow.rs`): another host
//!   holds the lease, or nobody does yet. Waits until the lease is free (by
//!   the rule in [`follower_decision`]) and tries to take it.
//! - **leading** ([`Elector::lead`], in `lead.rs`): this host holds the
//!   lease in a [`Term`]. Renews it every retry period, each renewal bounded
//!   by the time left in the term, and steps down (ends the term) the
//!   moment the term's renew deadline passes or the record shows another
//!   holder.
//! - **resigning** ([`Elector::resign`], in `lead.rs`): this host still
//!   holds the lease but has ended the term, so that its tasks stop; it
//!   keeps renewing until every task of the term is gone
//!   ([`Term::drained`]), then releases the lease and follows, or stops.
//!
//! What the store says of the lease arrives through a [`Subscription`]
//! (taken in by `news.rs`), which watches (or polls) apart from the
//! elector: no step ever waits for a watch to be set up. Each step waits
//! for one event (a new sighting, a timer, a change of [`Intent`]), makes
//! its store requests, each bounded by `request-timeout` and, while this
//! host holds the lease, by the time left in the term, and returns the next
//! state. The decisions are plain functions without I/O (`decide.rs`:
//! [`follower_decision`], [`contend_after`], [`follower_status`],
//! [`judge_sighting`]) and the elector sleeps on tokio's clock and the
//! [term clock](TermClock), so it runs under paused time in tests.

mod decide;
mod follow;
mod lead;
mod news;

pub use decide::{
    Decision, Verdict, contend_after, follower_decision, follower_status, judge_sighting, keeps_leading,
};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::claims::{self, Claim, LeaseClaims};
use super::clock::{Moment, TermClock};
use super::report::{BeforeRelease, ElectionObserver, Heartbeat, NoObserver};
use super::status::{LeaseView, Status};
use super::term::Term;
use super::timing::Timings;
use crate::store::subscription::{Cadence, Sighting, Subscription};
use crate::store::{HostInfo, LeaseStore, Versioned};
use crate::support::recurring::Recurring;

/// What an elector needs to know about itself.
#[derive(Clone, Debug)]
pub struct ElectorConfig {
    /// The lease to contend for.
    pub lease: String,
    /// This host's identity; must be unique per process.
    pub identity: String,
    /// The lease's timings; validated by the caller.
    pub timings: Timings,
    /// What this host says of itself in every record it holds (from the
    /// daemon's [`HostHandle`](super::super::HostHandle)), read at each
    /// write.
    pub host: watch::Receiver<HostInfo>,
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
    /// yielded it: [`LeaseRecord::yielded`](crate::store::LeaseRecord::yielded)), and when it expires after
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
    /// saying who yielded and for how long: [`LeaseRecord::yielded`](crate::store::LeaseRecord::yielded)), then
    /// follow without contending until `until`.
    StandBy {
        /// When to contend again.
        until: Instant,
    },
    /// The host drains (`baton drain`): hand the lead over if this host
    /// has it (end the term, wait until its tasks are gone, release, the
    /// release saying who yielded it, so others take it at once), then
    /// follow without contending until the intent changes (`baton resume`).
    Drain,
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
    subscription: Subscription,
    tx: watch::Sender<LeaseView>,
    intent: watch::Receiver<Intent>,
    /// The record as this host last knew it, and when that version was
    /// first seen.
    known: Option<Sighting>,
    /// The highest term seen, so a re-created record never reuses a term.
    known_term: u64,
    /// Earlier terms of this host whose tasks may still run: the lease is
    /// not released until they are gone too.
    draining: Vec<Arc<Term>>,
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
    /// Awaited (bounded) once a term's tasks are gone, before the release.
    before_release: Option<Arc<dyn BeforeRelease>>,
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
            holder_address: None,
        });
        let (intent_tx, intent) = watch::channel(Intent::Contend);
        let subscription = Subscription::start(store.clone(), &cfg.lease, cadence(&cfg.timings));
        let cfg_identity = cfg.identity.clone();
        let heartbeat = Arc::new(Heartbeat::new(longest_step(&cfg.timings)));
        let elector = Elector {
            cfg,
            store,
            clock,
            subscription,
            tx,
            intent,
            known: None,
            known_term: 0,
            draining: Vec::new(),
            trouble: Recurring::default(),
            me: Me::new(&cfg_identity),
            failure: None,
            observer: Arc::new(NoObserver),
            heartbeat,
            timings: None,
            claims: None,
            before_release: None,
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

    /// Awaits `hook` (bounded) between the end of each term whose tasks
    /// are gone and the release of the lease.
    pub fn set_before_release(&mut self, hook: Arc<dyn BeforeRelease>) {
        self.before_release = Some(hook);
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

    /// What this host says of itself in the record it writes now.
    fn host_info(&self) -> Option<HostInfo> {
        Some(self.cfg.host.borrow().clone())
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

    /// Whether this host should go on leading in `l` ([`keeps_leading`]).
    fn keeps(&self, l: &Lead) -> bool {
        keeps_leading(self.intent(), l.term.number(), l.began, Instant::now())
    }
}
