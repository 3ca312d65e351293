//! What an elector tells the rest of the host besides its status: events
//! for metrics ([`ElectionObserver`]) and a [`Heartbeat`] for health checks.
//!
//! Both are plain values the edge reads or implements: nothing here knows
//! of a metrics library, an HTTP server or a registry. An elector calls its
//! observer synchronously on its own task, so an observer must be cheap and
//! never block (count, set an atomic, take an uncontended lock).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::status::Status;
use crate::store::StoreError;

/// Why a store request of an elector failed, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreErrorKind {
    /// Someone else wrote first ([`StoreError::Conflict`]).
    Conflict,
    /// The store could not be reached ([`StoreError::Unavailable`]).
    Unavailable,
    /// The record could not be read ([`StoreError::Malformed`]).
    Malformed,
    /// The store refused the request ([`StoreError::Refused`]).
    Refused,
    /// No answer within the request's bound (`request-timeout`, or the time
    /// left in the term).
    Timeout,
}

impl StoreErrorKind {
    /// Every kind, in order.
    pub const ALL: [StoreErrorKind; 5] = [
        StoreErrorKind::Conflict,
        StoreErrorKind::Unavailable,
        StoreErrorKind::Malformed,
        StoreErrorKind::Refused,
        StoreErrorKind::Timeout,
    ];

    /// The kind of a store error.
    pub fn of(e: &StoreError) -> StoreErrorKind {
        match e {
            StoreError::Conflict { .. } => StoreErrorKind::Conflict,
            StoreError::Unavailable { .. } => StoreErrorKind::Unavailable,
            StoreError::Malformed { .. } => StoreErrorKind::Malformed,
            StoreError::Refused { .. } => StoreErrorKind::Refused,
        }
    }

    /// Its name in metrics: `conflict`, `unavailable`, `malformed`,
    /// `refused`, `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Conflict => "conflict",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Malformed => "malformed",
            StoreErrorKind::Refused => "refused",
            StoreErrorKind::Timeout => "timeout",
        }
    }
}

/// What an elector reports as it goes. Every method has an empty default,
/// so an observer implements what it uses; [`NoObserver`] uses nothing.
pub trait ElectionObserver: Send + Sync + 'static {
    /// The status it publishes changed from `before` to `after` (each
    /// change once, as the elector publishes it: none is coalesced).
    fn status_changed(&self, before: &Status, after: &Status) {
        let _ = (before, after);
    }

    /// The store confirmed a renewal of `lease` by this host, `latency`
    /// after the request started.
    fn renewed(&self, lease: &str, latency: Duration) {
        let _ = (lease, latency);
    }

    /// A request of the elector of `lease` to the store failed (a read, an
    /// acquisition, a renewal or a release).
    fn store_error(&self, lease: &str, kind: StoreErrorKind) {
        let _ = (lease, kind);
    }
}

/// What the host does between the end of a term and the release of its
/// lease, once every task of the term is gone: it takes the route label
/// off its pod (docs/kubernetes.md, "Traffic only to the leader"). The
/// elector awaits it at most a short bound ([`before_release_bound`]) and
/// releases the lease whatever it did: a hook delays a release, never
/// prevents it.
#[async_trait::async_trait]
pub trait BeforeRelease: Send + Sync + 'static {
    /// Every task of term `term` of `lease` is gone; the lease is released
    /// next.
    async fn before_release(&self, lease: &str, term: u64);
}

/// How long an elector awaits its [`BeforeRelease`] hook when `left` is
/// the time until its renew deadline: the request timeout, at most half
/// of what is left (the release needs the rest).
pub fn before_release_bound(request_timeout: Duration, left: Duration) -> Duration {
    request_timeout.min(left / 2)
}

/// An observer that ignores everything: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl ElectionObserver for NoObserver {}

/// An elector's heartbeat: when it last began a step, and whether the store
/// has answered it yet. Read by health checks from any thread.
///
/// A step of an elector whose store, runtime and tasks behave never lasts
/// longer than [`Heartbeat::longest_step`] (a follower with nothing to do
/// wakes at least once a lease duration): an elector whose last step began
/// longer ago than that is stuck (its runtime is blocked, or it waits for
/// tasks that cannot be stopped).
#[derive(Debug)]
pub struct Heartbeat {
    /// When the current step began (tokio's monotonic clock: a suspended
    /// machine's sleep does not count, so a resume is no stall).
    last_step: Mutex<Instant>,
    answered: AtomicBool,
    /// In nanoseconds: a reload may change the lease's timings.
    longest_step: std::sync::atomic::AtomicU64,
}

impl Heartbeat {
    pub(crate) fn new(longest_step: Duration) -> Heartbeat {
        Heartbeat {
            last_step: Mutex::new(Instant::now()),
            answered: AtomicBool::new(false),
            longest_step: std::sync::atomic::AtomicU64::new(nanos(longest_step)),
        }
    }

    pub(crate) fn set_longest_step(&self, longest_step: Duration) {
        self.longest_step.store(nanos(longest_step), Ordering::Relaxed);
    }

    pub(crate) fn beat(&self) {
        *self.last_step.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub(crate) fn answer(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// When the elector began its current step.
    pub fn last_step(&self) -> Instant {
        *self.last_step.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the store has answered the elector at least once (a record,
    /// or that there is none).
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// The longest a step lasts when nothing is wrong; see the [type
    /// documentation](Heartbeat).
    pub fn longest_step(&self) -> Duration {
        Duration::from_nanos(self.longest_step.load(Ordering::Relaxed))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
