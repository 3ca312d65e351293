//! One instance's Store data, [`GuestState`]: its WASI context and
//! resources, its limits, its term and connections (what the fence asks),
//! and the context of every capability. The capabilities are registered
//! here, once, in the order they are linked and prepared; everything else
//! about one lives in its module under [`capability`](super::capability).

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::capability;
use super::capability::unit::{
    Capability, GrantError, GrantSite, LoadContext, RunStart, Setup, SetupError, Shared,
};
use super::fence::connections::Connections;
use super::store_term::StoreTerm;
use super::trap::GuestLimits;
use super::world::World;
use crate::support::raw_keys::RawKeys;

/// Declares the registry: a field per capability in [`RawGrants`],
/// [`Grants`], [`PluginParts`] and [`Contexts`], and the steps that go
/// through them in order.
macro_rules! capabilities {
    ($($name:ident: $cap:ty),* $(,)?) => {
        /// Every capability's keys of a plugin's table, as written.
        #[derive(Debug, Default)]
        pub struct RawGrants {
            $( $name: <$cap as Capability>::Raw, )*
        }

        impl RawGrants {
            /// Every capability's keys, in registration order.
            pub fn keys() -> Vec<&'static str> {
                let mut keys = Vec::new();
                $( keys.extend(<<$cap as Capability>::Raw as RawKeys>::keys()); )*
                keys
            }

            /// Reads the value of `key` into the capability whose key it
            /// is; `false` if it is none's.
            pub fn take<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<bool, A::Error> {
                $( if self.$name.take(key, map)? { return Ok(true); } )*
                Ok(false)
            }

            /// Each capability's grant from its keys.
            pub fn grants(self, site: &GrantSite<'_>) -> Result<Grants, GrantError> {
                Ok(Grants { $( $name: <$cap as Capability>::grant(self.$name, site)?, )* })
            }
        }

        /// What a plugin's table grants, one field per capability; the
        /// default grants nothing beyond each capability's default.
        #[derive(Clone, Debug, Default)]
        pub struct Grants {
            $(
                #[doc = concat!("The grant of [`", stringify!($cap), "`].")]
                pub $name: <$cap as Capability>::Grant,
            )*
        }

        /// What one plugin keeps of each capability across its instances.
        pub struct PluginParts {
            $( pub(crate) $name: <$cap as Capability>::Plugin, )*
        }

        /// One instance's part of each capability.
        pub struct Contexts {
            $( pub(crate) $name: <$cap as Capability>::Ctx, )*
        }

        impl Grants {
            /// Each capability's part of a plugin being loaded; `Err` says
            /// why it cannot be.
            pub fn load(&self, plugin: &LoadContext<'_>) -> Result<PluginParts, String> {
                Ok(PluginParts { $( $name: <$cap as Capability>::load(&self.$name, plugin)?, )* })
            }

            /// The grants in the `plugin loaded` log line.
            pub fn describe(&self) -> Vec<String> {
                let mut parts = Vec::new();
                $( parts.extend(<$cap as Capability>::describe(&self.$name)); )*
                parts
            }
        }

        impl PluginParts {
            /// Each capability's part of a new instance.
            pub(crate) fn prepare(&self, setup: &mut Setup<'_>) -> Result<Contexts, SetupError> {
                Ok(Contexts { $( $name: <$cap as Capability>::prepare(&self.$name, setup)?, )* })
            }
        }

        impl Contexts {
            /// Each capability's part finished as the instance's run starts.
            pub(crate) fn start(&mut self, parts: &PluginParts, run: &RunStart<'_>) -> Result<(), SetupError> {
                $( <$cap as Capability>::start(&mut self.$name, &parts.$name, run)?; )*
                Ok(())
            }
        }

        /// Links every capability into the linker of `world`.
        fn link_capabilities(linker: &mut Linker<GuestState>, world: World) -> wasmtime::Result<()> {
            $({
                fn get(s: &mut GuestState) -> <$cap as Capability>::View<'_> {
                    let shared = Shared {
                        table: &mut s.table,
                        wasi: &mut s.wasi,
                        term: &s.term,
                        connections: &s.connections,
                    };
                    <$cap as Capability>::view(&mut s.caps.$name, shared)
                }
                <$cap as Capability>::add_to_linker(linker, world, get)?;
            })*
            Ok(())
        }
    };
}

capabilities! {
    status: capability::status::CurrentStatus,
    membership: capability::membership::Membership,
    schedule: capability::schedule::CurrentRun,
    clocks: capability::clocks::Clocks,
    output: capability::output::Output,
    env: capability::env::Env,
    files: capability::files::Files,
    sockets: capability::sockets::Sockets,
    http: capability::http::Http,
    keyvalue: capability::keyvalue::KeyValue,
    config: capability::config::Config,
}

/// What one instance's Store holds.
pub struct GuestState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: GuestLimits,
    /// The term this instance runs in: every host call and epoch tick asks
    /// it whether the instance may still run. Unset (over) while the
    /// instance is prepared ahead of its term.
    pub(crate) term: StoreTerm,
    /// Its TCP connections, reset at the force-stop time (see
    /// [`Drop`](#impl-Drop-for-GuestState)).
    pub(crate) connections: Connections,
    pub(crate) caps: Contexts,
}

impl Drop for GuestState {
    /// Before the resources close its sockets in order (the queue, then a
    /// FIN), an instance dropped at its force-stop has them reset.
    fn drop(&mut self) {
        self.connections.instance_ended();
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The linker of `world`: WASI 0.2 (and 0.3's random in the future world),
/// then every capability in the order registered (those that replace
/// WASI's functions come after it).
pub(crate) fn linker(engine: &wasmtime::Engine, world: World) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    if world == World::Future {
        wasmtime_wasi::p3::random::add_to_linker(&mut linker)?;
    }
    link_capabilities(&mut linker, world)?;
    Ok(linker)
}
