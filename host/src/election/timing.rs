//! The timings that guard safety, and the rule that ties them together.
//!
//! Four durations decide whether two hosts can ever run a leader task at
//! the same time:
//!
//! - **lease duration** (LD): how long others wait, from the moment they saw
//!   the record change, before they may take the lease over;
//! - **renew deadline** (RD): how long the leader keeps leading, from the
//!   start of its last renewal the store confirmed, before it gives up;
//! - **retry period** (RP): how often the leader renews, and how long
//!   candidates wait between failed attempts;
//! - **grace**: how long a leader task may take to stop by itself after the
//!   lead is lost, before the host stops it by force.
//!
//! A host stops leading at RD after its last confirmed renewal began, and
//! force-stops its tasks by RD + grace. Another host can only take over LD
//! after it saw that renewal, which was no earlier than it began. So tasks
//! never overlap as long as RD + grace, plus a margin for clock-rate skew
//! and the time a forced stop takes, stays below LD.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a forced stop may take once it is due: one or two epoch ticks
/// plus scheduling (measured: under 2 ms; 50 ms leaves ample room on a
/// loaded machine).
pub const FORCED_STOP_ALLOWANCE: Duration = Duration::from_millis(50);

/// The clock-rate skew between hosts that the rule tolerates, as a divisor
/// of LD (20 means 5 %): each host measures its own intervals, so a host
/// whose clock runs slow stretches RD + grace in real time.
pub const CLOCK_SKEW_DIVISOR: u32 = 20;

/// client-go's rule: RD must exceed RP times this factor, so that a leader
/// gets more than one renewal attempt before it gives up.
pub const RENEW_ATTEMPTS_FACTOR: f64 = 1.2;

/// The election timings of one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Timings {
    /// LD: how long a holder may go without renewing before others may take
    /// the lease over. Written into the record; readers use the record's.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// RD: how long the leader keeps leading without a confirmed renewal.
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
    /// RP: how often the leader renews; how long candidates wait between
    /// failed attempts (with jitter).
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
    /// How long leader tasks may take to stop by themselves after the lead
    /// is lost, before they are stopped by force.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// The longest any single store request may take.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl fmt::Display for Timings {
    /// In words, for the log: `lease 15s, renew deadline 10s, retry
    /// period 2s, grace 3s, request timeout 2s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = |d: Duration| humantime::format_duration(d).to_string();
        write!(
            f,
            "lease {}, renew deadline {}, retry period {}, grace {}, request timeout {}",
            h(self.lease_duration),
            h(self.renew_deadline),
            h(self.retry_period),
            h(self.grace),
            h(self.request_timeout)
        )
    }
}

impl Default for Timings {
    /// client-go's defaults for LD, RD and RP (as used by
    /// kube-controller-manager), a grace that fits inside them, and
    /// requests bounded by RP.
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            grace: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// A set of timings that would allow two leaders at once, or an election
/// that cannot work; each names the rule broken and shows the timings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// A timing is zero.
    #[error("{name} must be greater than zero ({})", DisplayTimings(timings))]
    Zero {
        /// The timing's name in the configuration.
        name: &'static str,
        /// The timings refused.
        timings: Timings,
    },
    /// The leader would get one renewal attempt at most.
    #[error(
        "renew-deadline must exceed {RENEW_ATTEMPTS_FACTOR} x retry-period, so that the leader \
         gets more than one renewal attempt before it gives up ({}); \
         raise renew-deadline or lower retry-period",
        DisplayTimings(.0)
    )]
    OneAttempt(Timings),
    /// A request could outlive the renew deadline.
    #[error(
        "request-timeout must be shorter than renew-deadline: a request that outlives the \
         renew deadline cannot keep the lead, and one that outlives the lease lets two \
         hosts lead at once ({})",
        DisplayTimings(.0)
    )]
    RequestOutlivesDeadline(Timings),
    /// The tasks could still run when another host may take over.
    #[error("{}", stop_after_expiry(.0))]
    StopAfterExpiry(Timings),
}

/// The message of [`TimingError::StopAfterExpiry`].
fn stop_after_expiry(t: &Timings) -> String {
    let margin = t.safety_margin();
    format!(
        "renew-deadline + grace + margin must be shorter than lease-duration: this host \
         stops leading at renew-deadline after its last confirmed renewal and stops its \
         tasks by force at renew-deadline + grace, while another host may take over at \
         lease-duration; here {} + {} + {} (margin: {} forced-stop allowance + 1/{} of \
         lease-duration for clock-rate skew) = {} is not below {} ({}); lower \
         renew-deadline or grace, or raise lease-duration",
        fmt_d(t.renew_deadline),
        fmt_d(t.grace),
        fmt_d(margin),
        fmt_d(FORCED_STOP_ALLOWANCE),
        CLOCK_SKEW_DIVISOR,
        fmt_d(t.stop_bound() + margin),
        fmt_d(t.lease_duration),
        DisplayTimings(t),
    )
}

impl Timings {
    /// The margin the rule keeps between RD + grace and LD: the forced-stop
    /// allowance plus the tolerated clock-rate skew.
    pub fn safety_margin(&self) -> Duration {
        FORCED_STOP_ALLOWANCE + self.lease_duration / CLOCK_SKEW_DIVISOR
    }

    /// The latest moment, after the start of the last confirmed renewal, at
    /// which this host's tasks are certainly stopped: RD + grace.
    pub fn stop_bound(&self) -> Duration {
        self.renew_deadline + self.grace
    }

    /// Checks the timings together; the error explains the invariant that
    /// was broken and what would satisfy it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::election::Timings;
    ///
    /// assert!(Timings::default().validate().is_ok());
    /// let unsafe_grace = Timings { grace: Duration::from_secs(6), ..Timings::default() };
    /// let err = unsafe_grace.validate().unwrap_err().to_string();
    /// assert!(err.contains("renew-deadline + grace"), "{err}");
    /// ```
    pub fn validate(&self) -> Result<(), TimingError> {
        for (name, value) in [
            ("lease-duration", self.lease_duration),
            ("renew-deadline", self.renew_deadline),
            ("retry-period", self.retry_period),
            ("request-timeout", self.request_timeout),
        ] {
            if value == Duration::ZERO {
                return Err(TimingError::Zero { name, timings: *self });
            }
        }
        if self.renew_deadline.as_secs_f64() <= RENEW_ATTEMPTS_FACTOR * self.retry_period.as_secs_f64() {
            return Err(TimingError::OneAttempt(*self));
        }
        if self.request_timeout >= self.renew_deadline {
            return Err(TimingError::RequestOutlivesDeadline(*self));
        }
        if self.stop_bound() + self.safety_margin() >= self.lease_duration {
            return Err(TimingError::StopAfterExpiry(*self));
        }
        Ok(())
    }
}

fn fmt_d(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

struct DisplayTimings<'a>(&'a Timings);

impl fmt::Display for DisplayTimings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0;
        write!(
            f,
            "lease-duration {}, renew-deadline {}, retry-period {}, grace {}, request-timeout {}",
            fmt_d(t.lease_duration),
            fmt_d(t.renew_deadline),
            fmt_d(t.retry_period),
            fmt_d(t.grace),
            fmt_d(t.request_timeout)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_safe() {
        Timings::default().validate().unwrap();
    }

    #[test]
    fn short_test_timings_are_safe() {
        let t = Timings {
            lease_duration: ms(2000),
            renew_deadline: ms(1000),
            retry_period: ms(200),
            grace: ms(500),
            request_timeout: ms(200),
        };
        t.validate().unwrap();
    }

    #[test]
    fn grace_that_reaches_the_lease_is_refused() {
        let t = Timings {
            grace: ms(4500),
            ..Timings::default()
        };
        // 10 s + 4.5 s + (50 ms + 750 ms) = 15.3 s >= 15 s
        let err = t.validate().unwrap_err().to_string();
        assert!(err.contains("lease-duration"), "{err}");
        assert!(err.contains("15s"), "{err}");
    }

    #[test]
    fn renew_deadline_must_allow_retries() {
        let t = Timings {
            retry_period: ms(9000),
            ..Timings::default()
        };
        let err = t.validate().unwrap_err().to_string();
        assert!(err.contains("1.2 x retry-period"), "{err}");
    }

    #[test]
    fn request_timeout_must_fit_inside_renew_deadline() {
        let t = Timings {
            request_timeout: Duration::from_secs(20),
            ..Timings::default()
        };
        let err = t.validate().unwrap_err().to_string();
        assert!(
            err.contains("request-timeout must be shorter than renew-deadline"),
            "{err}"
        );
    }

    #[test]
    fn zero_is_refused() {
        let t = Timings {
            retry_period: ms(0),
            ..Timings::default()
        };
        assert!(
            t.validate()
                .unwrap_err()
                .to_string()
                .contains("retry-period must be greater")
        );
    }
}
