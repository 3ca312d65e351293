//! `current-status` in every version and world: the status an instance is
//! shown, and a signal that fires once it is outdated. An instance never
//! sees `leading` outside its own term.

use std::sync::Arc;

use tokio::sync::watch;
use wasmtime::component::{Access, FutureReader, HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

use super::unit::{Capability, GrantError, GrantSite, LoadContext, RunStart, Setup, SetupError, Shared};
use crate::election::{LeaseView, Role, Status, Term};
use crate::runtime::bindings::{WitRole, WitStatus, WitStatus4, v0_1, v0_2, v0_3, v0_4};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;
use crate::support::raw_keys::NoKeys;

/// The capability: no grant; every plugin asks.
pub struct CurrentStatus;

/// One instance's part: the lease as this host sees it.
pub struct StatusCtx {
    view: watch::Receiver<LeaseView>,
}

/// What `current-status` sees of a Store.
pub struct StatusView<'a> {
    view: &'a mut watch::Receiver<LeaseView>,
    term: &'a StoreTerm,
    table: &'a mut ResourceTable,
}

impl Capability for CurrentStatus {
    type Raw = NoKeys;
    type Grant = ();
    type Plugin = ();
    type Ctx = StatusCtx;
    type View<'a> = StatusView<'a>;

    /// Nothing in the table: every plugin has it.
    fn grant(_: NoKeys, _: &GrantSite<'_>) -> Result<(), GrantError> {
        Ok(())
    }

    fn load(_: &(), _: &LoadContext<'_>) -> Result<(), String> {
        Ok(())
    }

    fn prepare(_: &(), setup: &mut Setup<'_>) -> Result<StatusCtx, SetupError> {
        Ok(StatusCtx {
            view: setup.view.clone(),
        })
    }

    fn start(ctx: &mut StatusCtx, _: &(), run: &RunStart<'_>) -> Result<(), SetupError> {
        ctx.view = run.view.clone();
        Ok(())
    }

    fn view<'a>(ctx: &'a mut StatusCtx, shared: Shared<'a>) -> StatusView<'a> {
        StatusView {
            view: &mut ctx.view,
            term: shared.term,
            table: shared.table,
        }
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        world: World,
        get: for<'a> fn(&'a mut T) -> StatusView<'a>,
    ) -> wasmtime::Result<()> {
        match world {
            World::Future => {
                v0_1::future_plugin::baton::leader::status_future::add_to_linker::<_, Self>(linker, get)?;
                v0_2::future_plugin::baton::leader::status_future::add_to_linker::<_, Self>(linker, get)?;
                v0_3::future_plugin::baton::leader::status_future::add_to_linker::<_, Self>(linker, get)?;
                v0_4::future_plugin::baton::leader::status_future::add_to_linker::<_, Self>(linker, get)?;
            }
            World::Pollable => {
                v0_1::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, Self>(linker, get)?;
                v0_2::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, Self>(linker, get)?;
                v0_3::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, Self>(linker, get)?;
                v0_4::pollable_plugin::baton::leader::status_pollable::add_to_linker::<_, Self>(linker, get)?;
            }
        }
        Ok(())
    }
}

impl StatusView<'_> {
    /// The current status as this instance is shown it, with the holder's
    /// address if its version of the contract has it (`with_address`).
    fn snapshot(&self, with_address: bool) -> Shown {
        Shown::of(&self.view.borrow(), self.term, with_address)
    }
}

/// The status as one version of the contract shows it: with the holder's
/// address from 0.4.0 (`holder-address`), without it before, so that a
/// change of the address alone is no change to an older guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) status: Status,
    /// The holder's address; none while no holder is shown.
    pub(crate) holder_address: Option<String>,
}

impl Shown {
    /// What an instance of `term` is shown of `view`, with the holder's
    /// address if `with_address`.
    pub(crate) fn of(view: &LeaseView, term: &Term, with_address: bool) -> Shown {
        let status = shown_status(view, term);
        let holder_address = view
            .holder_address
            .clone()
            .filter(|_| with_address && status.holder.is_some());
        Shown {
            status,
            holder_address,
        }
    }
}

impl From<&Shown> for WitStatus {
    fn from(s: &Shown) -> Self {
        WitStatus::from(&s.status)
    }
}

impl From<&Shown> for WitStatus4 {
    fn from(s: &Shown) -> Self {
        use v0_4::future_plugin::baton::leader::types::Role;
        let WitStatus {
            role,
            holder,
            lease,
            term,
        } = WitStatus::from(&s.status);
        WitStatus4 {
            role: match role {
                WitRole::Pending => Role::Pending,
                WitRole::Leading => Role::Leading,
                WitRole::Following => Role::Following,
            },
            holder,
            lease,
            term,
            holder_address: s.holder_address.clone(),
        }
    }
}

/// The status an instance of `term` is shown: the elector's, except that
/// it never shows `leading` outside its own term. A lead in another term,
/// or in its own term once that is over (even before the elector has run,
/// for example right after the whole process was paused and resumed), is
/// shown as `pending`.
pub(crate) fn shown_status(view: &LeaseView, term: &Term) -> Status {
    let s = &view.status;
    if s.is_leading() && (s.term != term.number() || term.is_over()) {
        Status {
            role: Role::Pending,
            holder: None,
            ..s.clone()
        }
    } else {
        s.clone()
    }
}

/// Resolves once the status an instance of `term` is shown differs from
/// `seen`, with the new status. Checks the current value first, so a change
/// that happened before the wait began is never missed; wakes when the term
/// is over too, whether or not the elector has said so. If the elector is
/// gone and the term cannot end, this never resolves.
pub(crate) async fn changed_from(
    mut rx: watch::Receiver<LeaseView>,
    term: Arc<Term>,
    seen: &Shown,
    with_address: bool,
) -> Shown {
    let mut elector_gone = false;
    loop {
        let shown = Shown::of(&rx.borrow_and_update(), &term, with_address);
        if shown != *seen {
            return shown;
        }
        let status = &shown.status;
        let term_over = async {
            if status.is_leading() {
                term.over().await
            } else {
                std::future::pending().await
            }
        };
        let view_changed = async {
            if elector_gone || rx.changed().await.is_err() {
                elector_gone = true;
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = view_changed => {}
            _ = term_over => {}
        }
    }
}

/// The `HasData` marker of `current-status`.
impl HasData for CurrentStatus {
    type Data<'a> = StatusView<'a>;
}

/// `status-future.current-status`, in every version: `W` is the version's
/// status type, with the holder's address (`with_address`) from 0.4.0.
fn status_with_future<T: Send, W>(
    mut host: Access<'_, T, CurrentStatus>,
    with_address: bool,
) -> wasmtime::Result<(W, FutureReader<W>)>
where
    W: for<'a> From<&'a Shown>
        + wasmtime::component::Lift
        + wasmtime::component::Lower
        + Send
        + Sync
        + 'static,
{
    let (status, rx, term) = {
        let state = host.get();
        (
            state.snapshot(with_address),
            state.view.clone(),
            Arc::clone(state.term),
        )
    };
    let seen = status.clone();
    let future = FutureReader::new(&mut host, async move {
        let next = changed_from(rx, term, &seen, with_address).await;
        wasmtime::error::Ok(W::from(&next))
    })?;
    Ok(((&status).into(), future))
}

impl<T: Send> v0_1::future_plugin::baton::leader::status_future::HostWithStore<T> for CurrentStatus {
    fn current_status(host: Access<'_, T, Self>) -> wasmtime::Result<(WitStatus, FutureReader<WitStatus>)> {
        status_with_future(host, false)
    }
}

impl<T: Send> v0_2::future_plugin::baton::leader::status_future::HostWithStore<T> for CurrentStatus {
    fn current_status(host: Access<'_, T, Self>) -> wasmtime::Result<(WitStatus, FutureReader<WitStatus>)> {
        status_with_future(host, false)
    }
}

impl<T: Send> v0_3::future_plugin::baton::leader::status_future::HostWithStore<T> for CurrentStatus {
    fn current_status(host: Access<'_, T, Self>) -> wasmtime::Result<(WitStatus, FutureReader<WitStatus>)> {
        status_with_future(host, false)
    }
}

impl<T: Send> v0_4::future_plugin::baton::leader::status_future::HostWithStore<T> for CurrentStatus {
    fn current_status(host: Access<'_, T, Self>) -> wasmtime::Result<(WitStatus4, FutureReader<WitStatus4>)> {
        status_with_future(host, true)
    }
}

impl v0_1::future_plugin::baton::leader::status_future::Host for StatusView<'_> {}
impl v0_1::future_plugin::baton::leader::types::Host for StatusView<'_> {}
impl v0_2::future_plugin::baton::leader::status_future::Host for StatusView<'_> {}
impl v0_3::future_plugin::baton::leader::status_future::Host for StatusView<'_> {}
impl v0_4::future_plugin::baton::leader::status_future::Host for StatusView<'_> {}
impl v0_4::future_plugin::baton::leader::types::Host for StatusView<'_> {}

/// The pollable behind `status-pollable.current-status`.
pub struct StatusChange {
    rx: watch::Receiver<LeaseView>,
    term: Arc<Term>,
    seen: Shown,
    with_address: bool,
}

#[wasmtime_wasi::async_trait]
impl Pollable for StatusChange {
    async fn ready(&mut self) {
        changed_from(self.rx.clone(), self.term.clone(), &self.seen, self.with_address).await;
    }
}

impl StatusView<'_> {
    /// `status-pollable.current-status`, in every version: with the
    /// holder's address from 0.4.0 (`with_address`).
    fn status_with_pollable(
        &mut self,
        with_address: bool,
    ) -> wasmtime::Result<(Shown, Resource<DynPollable>)> {
        let status = self.snapshot(with_address);
        let change = self.table.push(StatusChange {
            rx: self.view.clone(),
            term: Arc::clone(self.term),
            seen: status.clone(),
            with_address,
        })?;
        let pollable = subscribe(self.table, change)?;
        Ok((status, pollable))
    }
}

impl v0_1::pollable_plugin::baton::leader::status_pollable::Host for StatusView<'_> {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_2::pollable_plugin::baton::leader::status_pollable::Host for StatusView<'_> {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_3::pollable_plugin::baton::leader::status_pollable::Host for StatusView<'_> {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_4::pollable_plugin::baton::leader::status_pollable::Host for StatusView<'_> {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus4, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(true)?;
        Ok(((&status).into(), pollable))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::election::TermClock;

    /// A view of lease "demo" led here in term 3, the holder at `address`.
    fn view(term: &Arc<Term>, address: &str) -> LeaseView {
        LeaseView {
            status: Status {
                role: Role::Leading,
                holder: Some("me".into()),
                lease: "demo".into(),
                term: 3,
            },
            term: Some(term.clone()),
            since: term.clock().now(),
            yielded: None,
            holder_address: Some(address.into()),
        }
    }

    #[tokio::test]
    async fn a_new_address_alone_wakes_only_guests_that_see_it() {
        let clock = TermClock::system();
        let term = Term::begin(
            "demo",
            3,
            Duration::from_millis(500),
            clock.clone(),
            clock.now() + Duration::from_secs(60),
        );
        let (tx, rx) = watch::channel(view(&term, "10.0.0.1:80"));
        let old = Shown::of(&rx.borrow(), &term, false);
        let new = Shown::of(&rx.borrow(), &term, true);
        assert_eq!(old.holder_address, None);
        assert_eq!(new.holder_address.as_deref(), Some("10.0.0.1:80"));
        tx.send_replace(view(&term, "10.0.0.2:80"));
        let woke = changed_from(rx.clone(), term.clone(), &new, true).await;
        assert_eq!(woke.holder_address.as_deref(), Some("10.0.0.2:80"));
        let older = tokio::time::timeout(
            Duration::from_millis(200),
            changed_from(rx.clone(), term.clone(), &old, false),
        );
        assert!(
            older.await.is_err(),
            "a guest before 0.4.0 was woken by the address alone"
        );
        // A status shown as not leading (its term over) carries no address.
        term.end(clock.now());
        let ended = changed_from(rx, term.clone(), &new, true).await;
        assert_eq!((ended.status.role, ended.holder_address), (Role::Pending, None));
    }
}
