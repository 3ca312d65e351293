//! `schedule.current-run` (`baton:leader@0.3.0` and on): which scheduled
//! run an instance was started for. The run is fixed as the instance's run
//! starts (`Plugin::run_scheduled`) and never changes in its life; a
//! plugin without a schedule, or a run of an older contract, has none.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime_wasi::p2::bindings::clocks::wall_clock::Datetime;

use wasmtime::component::{HasData, Linker};
use wasmtime_wasi::WasiView;

use super::unit::{Capability, GrantError, GrantSite, LoadContext, RunStart, Setup, SetupError, Shared};
use crate::runtime::bindings::{WitScheduledRun, WitScheduledRun4, v0_3, v0_4};
use crate::runtime::world::World;
pub use crate::schedule::ScheduledRun;
use crate::support::raw_keys::NoKeys;

/// The capability: no grant; a scheduled plugin's runs are told theirs.
pub struct CurrentRun;

/// One instance's part: the run it is for, set as the run starts.
#[derive(Default)]
pub struct ScheduleCtx {
    run: Option<ScheduledRun>,
}

impl Capability for CurrentRun {
    type Raw = NoKeys;
    type Grant = ();
    type Plugin = ();
    type Ctx = ScheduleCtx;
    type View<'a> = &'a mut ScheduleCtx;

    /// Nothing in the table: every plugin has it.
    fn grant(_: NoKeys, _: &GrantSite<'_>) -> Result<(), GrantError> {
        Ok(())
    }

    fn load(_: &(), _: &LoadContext<'_>) -> Result<(), String> {
        Ok(())
    }

    fn prepare(_: &(), _: &mut Setup<'_>) -> Result<ScheduleCtx, SetupError> {
        Ok(ScheduleCtx::default())
    }

    fn start(ctx: &mut ScheduleCtx, _: &(), run: &RunStart<'_>) -> Result<(), SetupError> {
        ctx.run = run.scheduled.cloned();
        Ok(())
    }

    fn view<'a>(ctx: &'a mut ScheduleCtx, _: Shared<'a>) -> &'a mut ScheduleCtx {
        ctx
    }

    /// The same interface in both worlds (`schedule` has no signal).
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> &'a mut ScheduleCtx,
    ) -> wasmtime::Result<()> {
        v0_3::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentRun>(linker, get)?;
        v0_4::future_plugin::baton::leader::schedule::add_to_linker::<_, CurrentRun>(linker, get)
    }
}

impl HasData for CurrentRun {
    type Data<'a> = &'a mut ScheduleCtx;
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

impl v0_3::future_plugin::baton::leader::schedule::Host for ScheduleCtx {
    fn current_run(&mut self) -> wasmtime::Result<Option<WitScheduledRun>> {
        Ok(self.run.as_ref().map(WitScheduledRun::from))
    }
}

impl v0_4::future_plugin::baton::leader::schedule::Host for ScheduleCtx {
    fn current_run(&mut self) -> wasmtime::Result<Option<WitScheduledRun4>> {
        Ok(self.run.as_ref().map(|run| {
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
