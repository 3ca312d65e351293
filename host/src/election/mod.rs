//! The election core: timing rules, the term clock, terms, the status the
//! elector publishes, and the elector itself.
//!
//! Nothing here does I/O of its own: the elector talks to a
//! [`LeaseStore`](crate::store::LeaseStore) and sleeps on tokio's clock and
//! the [`TermClock`], so its behaviour is tested with the in-memory store
//! and paused time.
//!
//! - [`timing`](Timings): the five timings of a lease and the rule that ties
//!   them together.
//! - [`TermClock`]: the clock of term deadlines, which counts a suspend.
//! - [`Term`]: one term of one lease on this host, shared by the elector,
//!   the supervisors and the guest Stores; the one place that says when a
//!   term's code must stop.
//! - [`LeaseView`], [`Status`]: what the elector publishes.
//! - [`Elector`]: following, leading, resigning.
//! - [`HostHandle`]: what this host says of itself (its address, whether
//!   it drains, its weight) in every record it holds.
//! - [`ElectionObserver`], [`Heartbeat`]: what an elector reports besides
//!   its status, for metrics and health checks at the edge.
//! - [`claims`]: which plugins a term's records list, and the check that
//!   no other lease's live record lists a plugin before its task starts.
//! - [`spread`]: which host prefers which lease, and the [`Spreader`]
//!   that *steers* this host's electors by it.

pub mod claims;
mod clock;
mod elector;
mod host;
mod report;
pub mod spread;
mod status;
mod term;
mod timing;

pub use crate::store::RELEASED_LEASE_DURATION;
pub use claims::{ClaimGate, LeaseClaims};
pub use clock::{Moment, TermClock};
pub use elector::{
    DRAIN_ALLOWANCE, Decision, Elector, ElectorConfig, ElectorError, Intent, Me, Verdict, contend_after,
    follower_decision, follower_status, judge_sighting, longest_step,
};
pub use host::HostHandle;
pub use report::{
    BeforeRelease, ElectionObserver, Heartbeat, NoObserver, StoreErrorKind, before_release_bound,
};
pub use spread::{Hosts, Spreader, assign, member_lease};
pub use status::{LeaseView, Role, Status, YieldSeen};
pub use term::{Term, TermTask};
pub use timing::{CLOCK_SKEW_DIVISOR, FORCED_STOP_ALLOWANCE, RENEW_ATTEMPTS_FACTOR, TimingError, Timings};

#[cfg(test)]
mod tests;
