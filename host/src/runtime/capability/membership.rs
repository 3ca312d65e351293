//! Membership: `current-hosts` (`baton:leader@0.2.0` and on), the live
//! hosts and a signal that fires once they change, in both worlds.

use wasmtime::component::{Access, FutureReader, HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::election::Hosts;
use crate::runtime::bindings::{WitHosts, v0_2, v0_3, v0_4};
use crate::runtime::world::World;
use crate::support::raw_keys::NoKeys;
use tokio::sync::watch;

/// The capability: no grant; every plugin of 0.2.0 and on may ask.
pub struct Membership;

/// One instance's part: the live hosts as this host keeps them.
pub struct MembershipCtx {
    hosts: watch::Receiver<Hosts>,
}

/// What `current-hosts` sees of a Store.
pub struct MembershipView<'a> {
    hosts: &'a mut watch::Receiver<Hosts>,
    table: &'a mut ResourceTable,
}

impl Capability for Membership {
    type Raw = NoKeys;
    type Grant = ();
    type Plugin = ();
    type Ctx = MembershipCtx;
    type View<'a> = MembershipView<'a>;

    /// Nothing in the table: every plugin has it.
    fn grant(_: NoKeys, _: &GrantSite<'_>) -> Result<(), GrantError> {
        Ok(())
    }

    fn load(_: &(), _: &LoadContext<'_>) -> Result<(), String> {
        Ok(())
    }

    fn prepare(_: &(), setup: &mut Setup<'_>) -> Result<MembershipCtx, SetupError> {
        Ok(MembershipCtx {
            hosts: setup.hosts.clone(),
        })
    }

    fn view<'a>(ctx: &'a mut MembershipCtx, shared: Shared<'a>) -> MembershipView<'a> {
        MembershipView {
            hosts: &mut ctx.hosts,
            table: shared.table,
        }
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        world: World,
        get: for<'a> fn(&'a mut T) -> MembershipView<'a>,
    ) -> wasmtime::Result<()> {
        match world {
            World::Future => {
                v0_2::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
                v0_3::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
                v0_4::future_plugin::baton::leader::hosts_future::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
            }
            World::Pollable => {
                v0_2::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
                v0_3::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
                v0_4::pollable_plugin::baton::leader::hosts_pollable::add_to_linker::<_, CurrentHosts>(
                    linker, get,
                )?;
            }
        }
        Ok(())
    }
}

/// The `HasData` marker of `current-hosts`.
pub struct CurrentHosts;

impl HasData for CurrentHosts {
    type Data<'a> = MembershipView<'a>;
}

/// Resolves once the live hosts differ from `seen`, with the new value;
/// never, if nobody keeps them any more (the host is shutting down).
async fn hosts_changed_from(mut rx: watch::Receiver<Hosts>, seen: Hosts) -> Hosts {
    let changed = rx.wait_for(|h| *h != seen).await.map(|h| *h);
    match changed {
        Ok(h) => h,
        Err(_) => std::future::pending().await,
    }
}

/// `hosts-future.current-hosts`, in every version that has it.
fn hosts_with_future<T: Send>(
    mut host: Access<'_, T, CurrentHosts>,
) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
    let mut rx = host.get().hosts.clone();
    let seen = *rx.borrow_and_update();
    let future = FutureReader::new(&mut host, async move {
        let next = hosts_changed_from(rx, seen).await;
        wasmtime::error::Ok(WitHosts::from(next))
    })?;
    Ok((seen.into(), future))
}

impl<T: Send> v0_2::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentHosts {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl<T: Send> v0_3::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentHosts {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl<T: Send> v0_4::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentHosts {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl v0_2::future_plugin::baton::leader::hosts_future::Host for MembershipView<'_> {}
impl v0_2::future_plugin::baton::leader::membership::Host for MembershipView<'_> {}
impl v0_3::future_plugin::baton::leader::hosts_future::Host for MembershipView<'_> {}
impl v0_4::future_plugin::baton::leader::hosts_future::Host for MembershipView<'_> {}

/// The pollable behind `hosts-pollable.current-hosts`.
pub struct HostsChange {
    rx: watch::Receiver<Hosts>,
    seen: Hosts,
}

#[wasmtime_wasi::async_trait]
impl Pollable for HostsChange {
    async fn ready(&mut self) {
        hosts_changed_from(self.rx.clone(), self.seen).await;
    }
}

impl MembershipView<'_> {
    /// `hosts-pollable.current-hosts`, in every version that has it.
    fn hosts_with_pollable(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        let seen = *self.hosts.borrow();
        let change = self.table.push(HostsChange {
            rx: self.hosts.clone(),
            seen,
        })?;
        let pollable = subscribe(self.table, change)?;
        Ok((seen.into(), pollable))
    }
}

impl v0_2::pollable_plugin::baton::leader::hosts_pollable::Host for MembershipView<'_> {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
    }
}

impl v0_3::pollable_plugin::baton::leader::hosts_pollable::Host for MembershipView<'_> {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
    }
}

impl v0_4::pollable_plugin::baton::leader::hosts_pollable::Host for MembershipView<'_> {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
    }
}
