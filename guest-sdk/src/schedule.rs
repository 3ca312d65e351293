//! The scheduled run a task was started for (`schedule.current-run`, from
//! `baton:leader@0.3.0`), in either world.
//!
//! Needs the `future` or the `pollable` feature. A plugin with a schedule
//! in its host's configuration (`schedule = "*/5 * * * *"` or
//! `every = "30s"`) is run once per due time, each run in a fresh instance;
//! [`current_run`] tells the task which due time its run is for. A plugin
//! without a schedule gets `None` and runs once per term, as before.
//!
//! A run cut off by the end of its term is started again by the next
//! leader, with a higher [`attempt`](ScheduledRun::attempt): make the work
//! of one due time safe to repeat, or fence it by the term. Once a run of a
//! due time has returned `Ok`, that due time is never started again.
//!
//! ```no_run
//! use std::time::UNIX_EPOCH;
//! # fn report_for(_: u64, _: u64) {}
//! # let status: baton_guest::Status = unimplemented!();
//! match baton_guest::schedule::current_run() {
//!     Some(run) => {
//!         // The due time names the period this run covers.
//!         let due = run.due.duration_since(UNIX_EPOCH).unwrap().as_secs();
//!         report_for(due, status.term);
//!     }
//!     None => println!("no schedule: once per term"),
//! }
//! ```

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// Either world's bindings give the same import
// (`baton:leader/schedule@0.4.0`); with both features on, the pollable
// world's are used, which a future plugin imports just the same.
#[cfg(all(feature = "future", not(feature = "pollable")))]
use crate::__private::future_bindings::baton::leader::schedule;
#[cfg(feature = "pollable")]
use crate::__private::pollable_bindings::baton::leader::schedule;

/// One run of a scheduled plugin (the contract's `scheduled-run`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScheduledRun {
    /// The due time this run is for (for `baton run-now`: when it was
    /// asked), on the wall clock. The run may start later than this (a
    /// hand-over, a run still going); compare with [`SystemTime::now`] to
    /// see how late.
    pub due: SystemTime,
    /// How many runs for this due time were started before this one: 0 for
    /// the first; a run cut off by its term's end is started again by the
    /// next leader with attempt 1, and so on.
    pub attempt: u32,
    /// Whether `baton run-now` asked for this run.
    pub on_demand: bool,
}

impl ScheduledRun {
    /// The due time in milliseconds since the Unix epoch (0 for a time
    /// before it): a compact name for the run, say in a record's key.
    pub fn due_unix_millis(&self) -> u64 {
        let since = self.due.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for ScheduledRun {
    /// Formats as `due=UNIX_MS attempt=N on-demand=BOOL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "due={} attempt={} on-demand={}",
            self.due_unix_millis(),
            self.attempt,
            self.on_demand
        )
    }
}

/// The run this instance was started for; `None` for a plugin without a
/// schedule (its task runs once per term).
///
/// The call never blocks and gives the same answer throughout the
/// instance's life: each run has an instance of its own.
pub fn current_run() -> Option<ScheduledRun> {
    schedule::current_run().map(|run| ScheduledRun {
        due: UNIX_EPOCH + Duration::new(run.due.seconds, run.due.nanoseconds),
        attempt: run.attempt,
        on_demand: run.on_demand,
    })
}
