//! The data of one instance's Store, and the host side of the
//! `current-status` and `current-hosts` imports of every world (that of
//! `current-run` is in [`schedule`](super::schedule)).

use std::sync::Arc;

use tokio::sync::watch;
use wasmtime::component::{Access, FutureReader, HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{WitHosts, WitStatus, WitStatus4, v0_1, v0_2, v0_3, v0_4};
use super::connections::Connections;
use super::http::GuestHttp;
use super::keyvalue::KeyValueCtx;
use super::output::StderrTail;
use super::schedule::ScheduledRun;
use super::trap::GuestLimits;
use crate::election::{Hosts, LeaseView, Role, Status, Term};
use crate::runtime::store_term::StoreTerm;

/// What one instance's Store holds: its WASI context and resources, its
/// limits, its term, and its view of the lease.
pub struct GuestState {
    /// Its TCP connections, reset at the force-stop time (see
    /// [`Drop`](#impl-Drop-for-GuestState)).
    pub(crate) connections: Connections,
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: GuestLimits,
    /// The term this instance runs in: every host call and epoch tick asks
    /// it whether the instance may still run. Unset (over) while the
    /// instance is prepared ahead of its term.
    pub(crate) term: StoreTerm,
    /// Whether it may resolve names (its `name-lookup` grant; see
    /// [`lookup`](super::lookup)).
    pub(crate) name_lookup: bool,
    pub(crate) view: watch::Receiver<LeaseView>,
    /// The live hosts (`baton:leader@0.2.0`'s `current-hosts`).
    pub(crate) hosts: watch::Receiver<Hosts>,
    /// The scheduled run this instance is for (`baton:leader@0.3.0`'s
    /// `current-run`); none for a plugin without a schedule.
    pub(crate) scheduled: Option<ScheduledRun>,
    /// The last lines the instance wrote to stderr (a panic message), for
    /// the trap report.
    pub(crate) stderr_tail: StderrTail,
    /// `wasi:http`: its context, and the plugin's grants and limits.
    pub(crate) http: WasiHttpCtx,
    pub(crate) http_hooks: GuestHttp,
    /// `wasi:keyvalue`: the plugin's buckets and the instance's term.
    pub(crate) keyvalue: KeyValueCtx,
    /// `wasi:config`: the plugin's values as read for this run.
    pub(crate) config: wasmtime_wasi_config::WasiConfigVariables,
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

impl WasiHttpView for GuestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl GuestState {
    /// The current status as this instance is shown it, with the holder's
    /// address if its version of the contract has it (`with_address`).
    fn snapshot(&self, with_address: bool) -> Shown {
        Shown::of(&self.view.borrow(), &self.term, with_address)
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

/// The host side of `current-status` and `current-hosts` in the worlds
/// with a `future` signal (the `HasData` marker of the generated bindings).
pub struct CurrentStatus;

impl HasData for CurrentStatus {
    type Data<'a> = &'a mut GuestState;
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
            Arc::clone(&state.term),
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

/// `hosts-future.current-hosts`, in every version that has it.
fn hosts_with_future<T: Send>(
    mut host: Access<'_, T, CurrentStatus>,
) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
    let mut rx = host.get().hosts.clone();
    let seen = *rx.borrow_and_update();
    let future = FutureReader::new(&mut host, async move {
        let next = hosts_changed_from(rx, seen).await;
        wasmtime::error::Ok(WitHosts::from(next))
    })?;
    Ok((seen.into(), future))
}

impl<T: Send> v0_2::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentStatus {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl<T: Send> v0_3::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentStatus {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl<T: Send> v0_4::future_plugin::baton::leader::hosts_future::HostWithStore<T> for CurrentStatus {
    fn current_hosts(host: Access<'_, T, Self>) -> wasmtime::Result<(WitHosts, FutureReader<WitHosts>)> {
        hosts_with_future(host)
    }
}

impl v0_1::future_plugin::baton::leader::status_future::Host for GuestState {}
impl v0_1::future_plugin::baton::leader::types::Host for GuestState {}
impl v0_2::future_plugin::baton::leader::status_future::Host for GuestState {}
impl v0_2::future_plugin::baton::leader::hosts_future::Host for GuestState {}
impl v0_2::future_plugin::baton::leader::membership::Host for GuestState {}
impl v0_3::future_plugin::baton::leader::status_future::Host for GuestState {}
impl v0_3::future_plugin::baton::leader::hosts_future::Host for GuestState {}
impl v0_4::future_plugin::baton::leader::status_future::Host for GuestState {}
impl v0_4::future_plugin::baton::leader::hosts_future::Host for GuestState {}
impl v0_4::future_plugin::baton::leader::types::Host for GuestState {}

/// Resolves once the live hosts differ from `seen`, with the new value;
/// never, if nobody keeps them any more (the host is shutting down).
async fn hosts_changed_from(mut rx: watch::Receiver<Hosts>, seen: Hosts) -> Hosts {
    let changed = rx.wait_for(|h| *h != seen).await.map(|h| *h);
    match changed {
        Ok(h) => h,
        Err(_) => std::future::pending().await,
    }
}

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

impl GuestState {
    /// `status-pollable.current-status`, in every version: with the
    /// holder's address from 0.4.0 (`with_address`).
    fn status_with_pollable(
        &mut self,
        with_address: bool,
    ) -> wasmtime::Result<(Shown, Resource<DynPollable>)> {
        let status = self.snapshot(with_address);
        let change = self.table.push(StatusChange {
            rx: self.view.clone(),
            term: Arc::clone(&self.term),
            seen: status.clone(),
            with_address,
        })?;
        let pollable = subscribe(&mut self.table, change)?;
        Ok((status, pollable))
    }

    /// `hosts-pollable.current-hosts`, in every version that has it.
    fn hosts_with_pollable(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        let seen = *self.hosts.borrow();
        let change = self.table.push(HostsChange {
            rx: self.hosts.clone(),
            seen,
        })?;
        let pollable = subscribe(&mut self.table, change)?;
        Ok((seen.into(), pollable))
    }
}

impl v0_1::pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_2::pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_2::pollable_plugin::baton::leader::hosts_pollable::Host for GuestState {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
    }
}

impl v0_3::pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(false)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_3::pollable_plugin::baton::leader::hosts_pollable::Host for GuestState {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
    }
}

impl v0_4::pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus4, Resource<DynPollable>)> {
        let (status, pollable) = self.status_with_pollable(true)?;
        Ok(((&status).into(), pollable))
    }
}

impl v0_4::pollable_plugin::baton::leader::hosts_pollable::Host for GuestState {
    fn current_hosts(&mut self) -> wasmtime::Result<(WitHosts, Resource<DynPollable>)> {
        self.hosts_with_pollable()
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
