//! A schedule's progress as stored (JSON in the lease's fenced bucket of
//! schedules, one key per plugin), and its changes: a run started, ended,
//! due times skipped.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{SkipReason, millis};

/// How many ended runs a progress keeps.
pub const HISTORY: usize = 20;

/// One run, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The due time it ran for (for a run asked by `baton run-now`: when it
    /// was asked), in ms since the Unix epoch.
    pub due: u64,
    /// Runs of the same due time started before it.
    pub attempt: u32,
    /// Whether `baton run-now` asked for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_demand: bool,
    /// When it started, in ms since the Unix epoch.
    pub started: u64,
    /// When it ended, if it did (`None`: still running, or cut off by its
    /// term's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<u64>,
    /// How it ended: `ok`, `failed: ...`, `trapped: ...`, `replaced`, `cut off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The host that ran it.
    pub host: String,
    /// The term it ran in.
    pub term: u64,
}

/// What the leaders did so far; see the [module documentation](super).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The schedule it was kept under, in words (`cron "..." in ZONE`,
    /// `every 30s`): a new schedule starts from the time it is first led,
    /// not from the old one's due times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Every due time at or before this one (ms since the Unix epoch) is
    /// done: run, or skipped with its reason. `None`: nothing yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled: Option<u64>,
    /// A run started and not recorded as ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<RunRecord>,
    /// The last ended runs, oldest first, at most [`HISTORY`].
    #[serde(default)]
    pub history: Vec<RunRecord>,
    /// Due times skipped so far, by reason (`missed`, `superseded`,
    /// `overlap`, `cut-off`).
    #[serde(default)]
    pub skipped: std::collections::BTreeMap<String, u64>,
    /// The last skip: up to which due time, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skip: Option<(u64, String)>,
    /// The term that wrote it last: with the rest, it tells a writer whose
    /// write went unanswered whether that write landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_in: Option<u64>,
}

impl Progress {
    /// Reads stored bytes; a progress that cannot be read is an error
    /// naming what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Progress, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a schedule's progress: {e}"))
    }

    /// The bytes stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// `run` started: recorded as running. A scheduled run (not on demand)
    /// moves `handled` to its due time once it ends.
    pub fn started(&mut self, run: RunRecord) {
        self.running = Some(run);
    }

    /// The running run ended at `at` with `outcome`: into the history, and
    /// its due time handled (unless it was on demand).
    pub fn ended(&mut self, at: SystemTime, outcome: &str) {
        let Some(mut run) = self.running.take() else {
            return;
        };
        run.ended = Some(millis(at));
        run.outcome = Some(outcome.to_owned());
        if !run.on_demand {
            self.handled = Some(self.handled.map_or(run.due, |h| h.max(run.due)));
        }
        self.history.push(run);
        let extra = self.history.len().saturating_sub(HISTORY);
        self.history.drain(..extra);
    }

    /// A run recorded as running, whose term ended under it: recorded as
    /// cut off (its due time is not handled: it runs again while within its
    /// deadline).
    pub fn cut_off(&mut self) -> Option<RunRecord> {
        let mut run = self.running.take()?;
        run.outcome = Some("cut off".into());
        self.history.push(run.clone());
        let extra = self.history.len().saturating_sub(HISTORY);
        self.history.drain(..extra);
        Some(run)
    }

    /// `count` due times up to `upto` skipped for `reason`.
    pub fn skipped(&mut self, upto: SystemTime, count: u64, reason: SkipReason) {
        let upto = millis(upto);
        self.handled = Some(self.handled.map_or(upto, |h| h.max(upto)));
        if count == 0 {
            return;
        }
        *self.skipped.entry(reason.label().to_owned()).or_default() += count;
        self.last_skip = Some((upto, reason.label().to_owned()));
    }

    /// The last ended run.
    pub fn last(&self) -> Option<&RunRecord> {
        self.history.last()
    }
}
