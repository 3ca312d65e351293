//! A verdict: a step, whether what was expected happened, and what did;
//! and how times and spans are written in one.

use std::time::{Duration, SystemTime};

/// One step's verdict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// The step, in words.
    pub step: String,
    /// Whether what was expected happened.
    pub passed: bool,
    /// What happened.
    pub detail: String,
}

impl Verdict {
    /// A verdict on `step`.
    pub fn new(step: impl Into<String>, passed: bool, detail: impl Into<String>) -> Verdict {
        Verdict {
            step: step.into(),
            passed,
            detail: detail.into(),
        }
    }
}

/// A span as written in a scenario (`26h`, `1s`, `500ms`).
pub fn spoken(span: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(span)
}

/// `at` as RFC 3339, in UTC.
pub fn stamp(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at).map_or_else(|_| format!("{at:?}"), |t| t.to_string())
}
