//! The election core: timing rules, the status the elector publishes, and
//! the elector itself.
//!
//! Nothing here does I/O of its own: the elector talks to a
//! [`LeaseStore`](crate::store::LeaseStore) and sleeps on tokio's clock, so
//! its behaviour is tested with the in-memory store and paused time.

mod elector;
mod status;
mod timing;

pub use elector::{
    Decision, Elector, ElectorConfig, ElectorControl, Observation, RELEASED_LEASE_DURATION,
    follower_decision, follower_status,
};
pub use status::{LeaseView, Role, Status, TermDeadline};
pub use timing::{CLOCK_SKEW_DIVISOR, FORCED_STOP_ALLOWANCE, RENEW_ATTEMPTS_FACTOR, TimingError, Timings};

#[cfg(test)]
mod tests;
