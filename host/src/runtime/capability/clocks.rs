//! Clocks: the wall clock and the monotonic clock a guest reads (WASI 0.2's
//! `wasi:clocks`, and 0.3's in the future world). By default the host's
//! own; a [`ClockGrant`] may hand a guest other clocks (a harness's virtual
//! time). The host's timers (the grace, the force-stop) never read these:
//! a guest's clock cannot stretch its term.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::runtime::world::World;
use crate::support::raw_keys::NoKeys;

/// A source of time for a guest.
pub trait GuestClock: Send + Sync {
    /// The wall clock: the time since the Unix epoch.
    fn wall(&self) -> Duration;
    /// The monotonic clock, in nanoseconds from an arbitrary start.
    fn monotonic(&self) -> u64;
}

/// The clocks a plugin's guests read: the host's (the default), or a
/// source of its own.
#[derive(Clone, Default)]
pub struct ClockGrant {
    source: Option<Arc<dyn GuestClock>>,
}

impl ClockGrant {
    /// Guests read `source` instead of the host's clocks.
    pub fn from_source(source: Arc<dyn GuestClock>) -> ClockGrant {
        ClockGrant { source: Some(source) }
    }

    /// Whether guests read the host's own clocks.
    pub fn is_host(&self) -> bool {
        self.source.is_none()
    }
}

impl fmt::Debug for ClockGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_host() {
            "ClockGrant(host)"
        } else {
            "ClockGrant(source)"
        })
    }
}

impl PartialEq for ClockGrant {
    fn eq(&self, other: &ClockGrant) -> bool {
        match (&self.source, &other.source) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A [`GuestClock`] as WASI's clocks.
struct Source(Arc<dyn GuestClock>);

impl HostWallClock for Source {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        self.0.wall()
    }
}

impl HostMonotonicClock for Source {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.0.monotonic()
    }
}

/// The capability.
pub struct Clocks;

impl Capability for Clocks {
    type Raw = NoKeys;
    type Grant = ClockGrant;
    type Plugin = ClockGrant;
    type Ctx = ();
    type View<'a> = ();

    /// Nothing in the table: every plugin has it.
    fn grant(_: NoKeys, _: &GrantSite<'_>) -> Result<ClockGrant, GrantError> {
        Ok(Default::default())
    }

    fn load(grant: &ClockGrant, _: &LoadContext<'_>) -> Result<ClockGrant, String> {
        Ok(grant.clone())
    }

    fn prepare(grant: &ClockGrant, setup: &mut Setup<'_>) -> Result<(), SetupError> {
        if let Some(source) = &grant.source {
            setup.wasi.wall_clock(Source(source.clone()));
            setup.wasi.monotonic_clock(Source(source.clone()));
        }
        Ok(())
    }

    fn view<'a>(_: &'a mut (), _: Shared<'a>) {}

    /// WASI 0.3's clocks in the future world (0.2's come with WASI); both
    /// read the instance's WASI context.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        world: World,
        _: for<'a> fn(&'a mut T),
    ) -> wasmtime::Result<()> {
        match world {
            World::Future => wasmtime_wasi::p3::clocks::add_to_linker(linker),
            World::Pollable => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl GuestClock for Fixed {
        fn wall(&self) -> Duration {
            Duration::from_secs(1_774_746_000)
        }
        fn monotonic(&self) -> u64 {
            42
        }
    }

    #[test]
    fn a_granted_source_is_what_wasi_reads() {
        let source = Source(Arc::new(Fixed));
        assert_eq!(HostWallClock::now(&source), Duration::from_secs(1_774_746_000));
        assert_eq!(HostMonotonicClock::now(&source), 42);
        assert!(ClockGrant::default().is_host());
        let grant = ClockGrant::from_source(Arc::new(Fixed));
        assert_eq!(grant, grant.clone());
        assert_ne!(grant, ClockGrant::default());
    }
}
