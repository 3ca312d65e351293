//! A plugin's `health-check` table: how often its health check is called
//! while this host leads, how long one may take, how many failures in a
//! row hand the lease over, and how long the host then stays out.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, parse::Source};
use crate::runtime::HealthCheck;

/// `health-check = { period = "5s", timeout = "1s", threshold = 3,
/// back-off = "1m" }`: every field optional.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(super) struct RawHealthCheck {
    #[serde(default, with = "humantime_serde")]
    period: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    threshold: Option<i64>,
    #[serde(default, with = "humantime_serde")]
    back_off: Option<Duration>,
}

impl Source<'_> {
    /// `health-check`, checked: a period above zero, a timeout above zero
    /// and below the period, a threshold of at least 1. Whether the
    /// component exports a check is known once it is loaded.
    pub(super) fn health_check(
        &self,
        at: usize,
        name: &str,
        raw: Option<&RawHealthCheck>,
    ) -> Result<Option<HealthCheck>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let err = self.plugin_field_err(at, name);
        let d = HealthCheck::DEFAULT;
        let period = raw.period.unwrap_or(d.period);
        let timeout = raw.timeout.unwrap_or(d.timeout.min(period / 2));
        let back_off = raw.back_off.unwrap_or(d.back_off);
        if period.is_zero() {
            return Err(err("health-check.period", "must be above 0".into()));
        }
        if timeout.is_zero() || timeout >= period {
            return Err(err(
                "health-check.timeout",
                format!(
                    "{} must be above 0 and below the period ({}): one check at a time",
                    humantime::format_duration(timeout),
                    humantime::format_duration(period)
                ),
            ));
        }
        let threshold = match raw.threshold {
            None => d.threshold,
            Some(t) if (1..=i64::from(u32::MAX)).contains(&t) => t as u32,
            Some(t) => {
                return Err(err(
                    "health-check.threshold",
                    format!("{t}: the failures in a row that hand the lease over; at least 1"),
                ));
            }
        };
        Ok(Some(HealthCheck {
            period,
            timeout,
            threshold,
            back_off,
        }))
    }
}
