//! What a schedule's leader does next, from its progress and the time.

use std::time::{Duration, SystemTime};

use super::{CatchUp, Progress, Schedule, from_millis};

/// Why due times were skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// No host ran it within its starting deadline.
    Missed,
    /// A later due time runs instead (`catch-up = "latest"`).
    Superseded,
    /// It came while a run went on (`overlap = "skip"`, or all but the
    /// latest with `"queue-one"`).
    Overlap,
    /// Its run was cut off by its term's end, and it is now past its
    /// starting deadline.
    CutOff,
}

impl SkipReason {
    /// Its label in logs, metrics and the progress.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::Missed => "missed",
            SkipReason::Superseded => "superseded",
            SkipReason::Overlap => "overlap",
            SkipReason::CutOff => "cut-off",
        }
    }
}

/// What the leader does now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Runs the due time `due` now (after its jitter); `attempt` runs of it
    /// were started before.
    Run {
        /// The due time (for a run asked by `baton run-now`: when it was
        /// asked).
        due: SystemTime,
        /// Earlier runs of it (cut off).
        attempt: u32,
        /// Whether `baton run-now` asked for it: such a run, cut off and
        /// run again, is still one on demand.
        on_demand: bool,
    },
    /// A run asked by `baton run-now`, cut off by its term's end and now
    /// past its starting deadline: given up. Nothing of the schedule
    /// changes (no due time handled, no skip counted).
    GiveUp {
        /// When it was asked.
        due: SystemTime,
    },
    /// Records every due time up to `upto` (`count` of them) as skipped.
    Skip {
        /// The last due time skipped.
        upto: SystemTime,
        /// How many.
        count: u64,
        /// Why.
        reason: SkipReason,
    },
    /// Nothing is due before this time.
    Wait(SystemTime),
    /// Nothing will ever be due (suspended, or a pattern that never matches
    /// again): wait for a reload.
    Idle,
}

/// The most due times counted one by one in a skip (a cron pattern over a
/// long outage); the skip then covers these and the next decision the rest.
const MAX_COUNTED: u64 = super::when::MAX_COUNTED;

/// What the leader of `schedule` does at `now`, given `progress` (with no
/// run of this host going). See the [module documentation](super).
pub fn next(schedule: &Schedule, progress: &Progress, now: SystemTime) -> Next {
    if schedule.suspend {
        return Next::Idle;
    }
    if let Some(run) = &progress.running {
        let due = from_millis(run.due);
        return match (late(schedule, due, now), run.on_demand) {
            (true, true) => Next::GiveUp { due },
            (true, false) => Next::Skip {
                upto: due,
                count: 1,
                reason: SkipReason::CutOff,
            },
            (false, on_demand) => Next::Run {
                due,
                attempt: run.attempt + 1,
                on_demand,
            },
        };
    }
    let same = progress
        .when
        .as_ref()
        .is_none_or(|w| *w == schedule.when.to_string());
    let Some(handled) = progress.handled.map(from_millis).filter(|_| same) else {
        // Nothing yet: from the latest due time, as if it had been handled
        // just now (a new schedule does not run its past).
        return match schedule.when.last_at_or_before(now) {
            Some(last) => Next::Skip {
                upto: last,
                count: 0,
                reason: SkipReason::Missed,
            },
            None => wait_after(schedule, now),
        };
    };
    let Some(first) = schedule.when.next_after(handled) else {
        return Next::Idle;
    };
    if first > now {
        return Next::Wait(first);
    }
    let latest = schedule.when.last_at_or_before(now).unwrap_or(first);
    match schedule.catch_up {
        CatchUp::All => {
            if late(schedule, first, now) {
                let (upto, count) = late_run(schedule, first, now);
                return Next::Skip {
                    upto,
                    count,
                    reason: SkipReason::Missed,
                };
            }
            Next::Run {
                due: first,
                attempt: 0,
                on_demand: false,
            }
        }
        CatchUp::Latest if first < latest => {
            let before = schedule.when.last_before(latest).unwrap_or(first);
            let count = schedule.when.count_between(handled, before);
            Next::Skip {
                upto: before,
                count,
                reason: SkipReason::Superseded,
            }
        }
        CatchUp::Latest if late(schedule, latest, now) => Next::Skip {
            upto: latest,
            count: 1,
            reason: SkipReason::Missed,
        },
        CatchUp::Latest => Next::Run {
            due: latest,
            attempt: 0,
            on_demand: false,
        },
    }
}

/// Whether the run due at `due` may no longer start at `now`.
fn late(schedule: &Schedule, due: SystemTime, now: SystemTime) -> bool {
    now.duration_since(due).unwrap_or(Duration::ZERO) > schedule.deadline_of(due)
}

/// The due times from `first` on that are past their deadline at `now`:
/// the last of them and how many.
fn late_run(schedule: &Schedule, first: SystemTime, now: SystemTime) -> (SystemTime, u64) {
    let (mut upto, mut count) = (first, 1);
    while count < MAX_COUNTED {
        match schedule.when.next_after(upto) {
            Some(n) if n <= now && late(schedule, n, now) => {
                upto = n;
                count += 1;
            }
            _ => break,
        }
    }
    (upto, count)
}

fn wait_after(schedule: &Schedule, now: SystemTime) -> Next {
    schedule.when.next_after(now).map_or(Next::Idle, Next::Wait)
}
