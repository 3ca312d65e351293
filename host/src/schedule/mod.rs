//! Schedules: when a scheduled plugin's runs are due, and what its leader
//! does next, from the progress kept in the lease's fenced buckets.
//! Decisions only; no I/O, no clock of its own (every function takes
//! `now`).
//!
//! - [`Schedule`]: a plugin's `schedule` (cron, with seconds optional, in a
//!   time zone) or `every`, and its policies (starting deadline, catch-up,
//!   overlap, jitter, suspend).
//! - [`Progress`]: what the leaders did so far, as stored: every due time at
//!   or before `handled` is done (run or skipped, with a reason), `running`
//!   is a run started and not yet recorded as ended, and the last runs.
//! - [`next`]: what the leader does now: run a due time, skip some, or
//!   wait.
//!
//! Invariants: a due time at or before `handled` is never run again; a run
//! recorded as started but not ended (its term ended under it) is run
//! again while within its starting deadline; a due time not run within its
//! deadline is skipped, and the skip is recorded with its reason.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod plan;
mod progress;
mod when;

pub use plan::{Next, SkipReason, next};
pub use progress::{HISTORY, Progress, RunRecord};
pub use when::{When, WhenError};

/// One run of a scheduled plugin, as its task is told it
/// (`schedule.scheduled-run` of the contract).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledRun {
    /// The due time this run is for (for `baton run-now`: when it was
    /// asked).
    pub due: SystemTime,
    /// How many runs for this due time were started before this one: 0 for
    /// the first.
    pub attempt: u32,
    /// Whether `baton run-now` asked for this run.
    pub on_demand: bool,
}

/// What a run still going does to the next due time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlap {
    /// The due times that come while a run goes are skipped (the default).
    #[default]
    Skip,
    /// The latest of them runs once the run ends; the others are skipped.
    QueueOne,
    /// The running instance is stopped and the new due time runs.
    Replace,
}

/// Which missed due times a new leader runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CatchUp {
    /// Only the latest within its starting deadline (the default).
    #[default]
    Latest,
    /// Each within its starting deadline, in order.
    All,
}

/// A plugin's schedule and its policies.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// When runs are due.
    pub when: When,
    /// How late a run may start after its due time; `None`: one period
    /// (from the due time to the next).
    pub starting_deadline: Option<Duration>,
    /// Which missed due times run.
    pub catch_up: CatchUp,
    /// What a run still going does to the next.
    pub overlap: Overlap,
    /// Each run starts up to this long after its due time, at random.
    pub jitter: Duration,
    /// No run starts while set (a reload clears it).
    pub suspend: bool,
}

impl Schedule {
    /// A schedule of `when` with the default policies.
    pub fn new(when: When) -> Schedule {
        Schedule {
            when,
            starting_deadline: None,
            catch_up: CatchUp::default(),
            overlap: Overlap::default(),
            jitter: Duration::ZERO,
            suspend: false,
        }
    }

    /// How late the run due at `due` may start.
    pub fn deadline_of(&self, due: SystemTime) -> Duration {
        self.starting_deadline.unwrap_or_else(|| {
            self.when
                .next_after(due)
                .and_then(|n| n.duration_since(due).ok())
                .unwrap_or(Duration::from_secs(60))
        })
    }
}

/// A time as milliseconds since the Unix epoch (0 before it).
pub fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds since the Unix epoch as a time.
pub fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests;
