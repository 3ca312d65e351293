//! The data of one instance's Store, and the host side of the
//! `current-status` imports of both worlds.

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use wasmtime::StoreLimits;
use wasmtime::component::{Access, FutureReader, HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{WitStatus, future_plugin, pollable_plugin};
use crate::election::{LeaseView, Role, Status};

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
        let status = effective_status(&rx.borrow(), Instant::now());
        (status, rx)
    }
}

/// The status a guest is shown: the elector's, except that a lead whose
/// term deadline has passed is shown as lost at once, even before the
/// elector has run (for example right after the whole process was paused
/// and resumed). Guests never see a lead this host may no longer claim.
pub(crate) fn effective_status(view: &LeaseView, now: Instant) -> Status {
    match &view.deadline {
        Some(d) if view.status.is_leading() && now >= d.until() => Status {
            role: Role::Pending,
            holder: None,
            ..view.status.clone()
        },
        _ => view.status.clone(),
    }
}

/// Resolves once the status a guest is shown differs from `seen`, with the
/// new status. Checks the current value first, so a change that happened
/// before the wait began is never missed; wakes at the term deadline too.
/// If the elector is gone, the status can no longer change and this never
/// resolves.
pub(crate) async fn changed_from(mut rx: watch::Receiver<LeaseView>, seen: &Status) -> Status {
    loop {
        let (status, until) = {
            let view = rx.borrow_and_update();
            let until = view
                .deadline
                .as_ref()
                .filter(|_| view.status.is_leading())
                .map(|d| d.until());
            (effective_status(&view, Instant::now()), until)
        };
        if status != *seen {
            return status;
        }
        let at_deadline = async {
            match until {
                Some(t) => sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            _ = at_deadline => {}
        }
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
