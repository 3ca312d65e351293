//! When runs are due: a cron pattern in a time zone (croner on jiff, with
//! the bundled time-zone database), or every fixed period counted from the
//! Unix epoch, so every host computes the same due times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use croner::Cron;
use croner::parser::CronParser;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// The most due times [`When::count_between`] counts one by one.
pub const MAX_COUNTED: u64 = 100_000;

/// The shortest `every`.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);

/// When a plugin's runs are due.
#[derive(Clone, Debug)]
pub enum When {
    /// A cron pattern (five fields, or six with seconds first) in a time
    /// zone.
    Cron {
        /// The pattern as written.
        pattern: String,
        /// The parsed pattern.
        cron: Box<Cron>,
        /// The time zone's name (`UTC` by default).
        zone_name: String,
        /// The time zone.
        zone: TimeZone,
    },
    /// Every period: due at each multiple of it since the Unix epoch.
    Every(Duration),
}

impl PartialEq for When {
    fn eq(&self, other: &When) -> bool {
        match (self, other) {
            (
                When::Cron {
                    pattern: a,
                    zone_name: za,
                    ..
                },
                When::Cron {
                    pattern: b,
                    zone_name: zb,
                    ..
                },
            ) => a == b && za == zb,
            (When::Every(a), When::Every(b)) => a == b,
            _ => false,
        }
    }
}

/// Why a schedule cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WhenError {
    /// The cron pattern does not parse.
    #[error("cron pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// croner's reason.
        reason: String,
    },
    /// The time zone is unknown.
    #[error(
        "time zone {0:?} is not in the time-zone database (write an IANA name such as \"Europe/Berlin\")"
    )]
    Zone(String),
    /// The period is too short.
    #[error("every {0:?} is shorter than the shortest period, 100ms")]
    Period(Duration),
}

impl When {
    /// A cron pattern in the time zone named `zone` (`None`: UTC).
    ///
    /// ```
    /// use baton::schedule::When;
    ///
    /// let when = When::cron("*/5 * * * *", Some("Europe/Berlin")).unwrap();
    /// assert_eq!(when.to_string(), "cron \"*/5 * * * *\" in Europe/Berlin");
    /// assert!(When::cron("*/5 * * *", None).is_err());
    /// ```
    pub fn cron(pattern: &str, zone: Option<&str>) -> Result<When, WhenError> {
        let cron = CronParser::builder()
            .build()
            .parse(pattern)
            .map_err(|e| WhenError::Pattern {
                pattern: pattern.to_owned(),
                reason: e.to_string(),
            })?;
        let zone_name = zone.unwrap_or("UTC").to_owned();
        let zone = TimeZone::get(&zone_name).map_err(|_| WhenError::Zone(zone_name.clone()))?;
        Ok(When::Cron {
            pattern: pattern.to_owned(),
            cron: Box::new(cron),
            zone_name,
            zone,
        })
    }

    /// Every `period`.
    pub fn every(period: Duration) -> Result<When, WhenError> {
        if period < MIN_PERIOD {
            return Err(WhenError::Period(period));
        }
        Ok(When::Every(period))
    }

    /// The first due time strictly after `t`; `None` if there is none (a
    /// cron pattern that never matches again).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            When::Every(period) => {
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let p = period.as_nanos();
                let next = (since / p + 1) * p;
                Some(UNIX_EPOCH + Duration::from_nanos(u64::try_from(next).ok()?))
            }
            When::Cron { cron, zone, .. } => {
                // croner works in whole seconds: from the second that holds
                // `t`, strictly after it, which is after `t` too.
                let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
                let from = Zoned::new(
                    Timestamp::from_second(i64::try_from(secs).ok()?).ok()?,
                    zone.clone(),
                );
                let next = cron.find_next_occurrence(&from, false).ok()?;
                let next = u64::try_from(next.timestamp().as_second()).ok()?;
                Some(UNIX_EPOCH + Duration::from_secs(next))
            }
        }
    }

    /// The latest due time at or before `t`, if any within a year of it.
    pub fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            When::Every(period) => {
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let p = period.as_nanos();
                Some(UNIX_EPOCH + Duration::from_nanos(u64::try_from(since / p * p).ok()?))
            }
            When::Cron { cron, zone, .. } => {
                let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
                let from = Zoned::new(
                    Timestamp::from_second(i64::try_from(secs).ok()?).ok()?,
                    zone.clone(),
                );
                let last = cron.find_previous_occurrence(&from, true).ok()?;
                let last = u64::try_from(last.timestamp().as_second()).ok()?;
                Some(UNIX_EPOCH + Duration::from_secs(last))
            }
        }
    }

    /// How many due times lie in `(after, upto]`, counted up to
    /// [`MAX_COUNTED`].
    pub fn count_between(&self, after: SystemTime, upto: SystemTime) -> u64 {
        let mut count = 0;
        let mut t = after;
        while count < MAX_COUNTED {
            match self.next_after(t) {
                Some(n) if n <= upto => {
                    t = n;
                    count += 1;
                }
                _ => break,
            }
        }
        count
    }

    /// The latest due time strictly before `t`.
    pub fn last_before(&self, t: SystemTime) -> Option<SystemTime> {
        self.last_at_or_before(t.checked_sub(Duration::from_millis(1))?)
    }
}

impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Cron {
                pattern, zone_name, ..
            } => write!(f, "cron {pattern:?} in {zone_name}"),
            When::Every(period) => write!(f, "every {}", humantime::format_duration(*period)),
        }
    }
}
