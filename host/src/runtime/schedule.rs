//! The host side of `schedule.current-run` (`baton:leader@0.3.0` and on): which
//! scheduled run an instance was started for. The run is fixed when the
//! instance's Store is made (`Plugin::run_scheduled`) and never changes in
//! its life; a plugin without a schedule, or a run of an older contract,
//! has none.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime_wasi::p2::bindings::clocks::wall_clock::Datetime;

use super::bindings::{WitScheduledRun, WitScheduledRun4, v0_3, v0_4};
use super::state::GuestState;

/// One run of a scheduled plugin, as its task is told it
/// (`schedule.scheduled-run`).
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

/// `due` as a WASI datetime: seconds and nanoseconds since the Unix epoch,
/// 0 for a time before it (a wall clock set far back; WASI has no negative
/// datetime).
fn datetime(due: SystemTime) -> Datetime {
    let since = due.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    Datetime {
        seconds: since.as_secs(),
        nanoseconds: since.subsec_nanos(),
    }
}

impl From<&ScheduledRun> for WitScheduledRun {
    fn from(run: &ScheduledRun) -> Self {
        WitScheduledRun {
            due: datetime(run.due),
            attempt: run.attempt,
            on_demand: run.on_demand,
        }
    }
}

impl v0_3::future_plugin::baton::leader::schedule::Host for GuestState {
    fn current_run(&mut self) -> wasmtime::Result<Option<WitScheduledRun>> {
        Ok(self.scheduled.as_ref().map(WitScheduledRun::from))
    }
}

impl v0_4::future_plugin::baton::leader::schedule::Host for GuestState {
    fn current_run(&mut self) -> wasmtime::Result<Option<WitScheduledRun4>> {
        Ok(self.scheduled.as_ref().map(|run| {
            let WitScheduledRun {
                due,
                attempt,
                on_demand,
            } = run.into();
            WitScheduledRun4 {
                due,
                attempt,
                on_demand,
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_due_time_is_told_in_seconds_and_nanoseconds_since_the_epoch() {
        let run = ScheduledRun {
            due: UNIX_EPOCH + Duration::new(1_700_000_000, 250_000_000),
            attempt: 2,
            on_demand: true,
        };
        let wit = WitScheduledRun::from(&run);
        assert_eq!(
            (wit.due.seconds, wit.due.nanoseconds),
            (1_700_000_000, 250_000_000)
        );
        assert_eq!((wit.attempt, wit.on_demand), (2, true));
        // Before the epoch: 0, not a wrapped value.
        let early = ScheduledRun {
            due: UNIX_EPOCH - Duration::from_secs(5),
            ..run
        };
        let wit = WitScheduledRun::from(&early);
        assert_eq!((wit.due.seconds, wit.due.nanoseconds), (0, 0));
    }
}
