//! The data of one instance's Store, and the host side of the
//! `current-status` imports of both worlds.

use tokio::sync::watch;
use wasmtime::StoreLimits;
use wasmtime::component::{Access, FutureReader, HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{WitStatus, future_plugin, pollable_plugin};
use crate::election::{LeaseView, Status};

/// What one instance's Store holds: its WASI context and resources, its
/// limits, and its view of the lease.
pub struct GuestState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: StoreLimits,
    pub(crate) status: watch::Receiver<LeaseView>,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GuestState {
    /// The current status and a receiver to wait on for a different one.
    fn snapshot(&self) -> (Status, watch::Receiver<LeaseView>) {
        let rx = self.status.clone();
        let status = rx.borrow().status.clone();
        (status, rx)
    }
}

/// Resolves once the lease's status differs from `seen`, with the new
/// status. Checks the current value first, so a change that happened before
/// the wait began is never missed. If the elector is gone, the status can
/// no longer change and this never resolves.
pub(crate) async fn changed_from(mut rx: watch::Receiver<LeaseView>, seen: &Status) -> Status {
    let next = rx.wait_for(|v| v.status != *seen).await.map(|v| v.status.clone());
    match next {
        Ok(status) => status,
        Err(_) => std::future::pending().await,
    }
}

/// Marker for the `status-future` host implementation.
pub struct StatusFuture;

impl HasData for StatusFuture {
    type Data<'a> = &'a mut GuestState;
}

impl<T: Send> future_plugin::baton::leader::status_future::HostWithStore<T> for StatusFuture {
    fn current_status(
        mut host: Access<'_, T, Self>,
    ) -> wasmtime::Result<(WitStatus, FutureReader<WitStatus>)> {
        let (status, rx) = host.get().snapshot();
        let seen = status.clone();
        let future = FutureReader::new(&mut host, async move {
            let next = changed_from(rx, &seen).await;
            wasmtime::error::Ok(WitStatus::from(&next))
        })?;
        Ok(((&status).into(), future))
    }
}

impl future_plugin::baton::leader::status_future::Host for GuestState {}
impl future_plugin::baton::leader::types::Host for GuestState {}

/// The pollable behind `status-pollable.current-status`.
pub struct StatusChange {
    rx: watch::Receiver<LeaseView>,
    seen: Status,
}

#[wasmtime_wasi::async_trait]
impl Pollable for StatusChange {
    async fn ready(&mut self) {
        changed_from(self.rx.clone(), &self.seen).await;
    }
}

impl pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let (status, rx) = self.snapshot();
        let change = self.table.push(StatusChange {
            rx,
            seen: status.clone(),
        })?;
        let pollable = subscribe(&mut self.table, change)?;
        Ok(((&status).into(), pollable))
    }
}
