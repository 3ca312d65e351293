//! The data of one instance's Store, and the host side of the
//! `current-status` imports of both worlds.

use std::sync::Arc;

use tokio::sync::watch;
use wasmtime::component::{Access, FutureReader, HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{WitStatus, future_plugin, pollable_plugin};
use super::http::GuestHttp;
use super::output::StderrTail;
use super::trap::GuestLimits;
use crate::election::{LeaseView, Role, Status, Term};

/// What one instance's Store holds: its WASI context and resources, its
/// limits, its term, and its view of the lease.
pub struct GuestState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: GuestLimits,
    /// The term this instance runs in: every host call and epoch tick asks
    /// it whether the instance may still run.
    pub(crate) term: Arc<Term>,
    pub(crate) view: watch::Receiver<LeaseView>,
    /// The last lines the instance wrote to stderr (a panic message), for
    /// the trap report.
    pub(crate) stderr_tail: StderrTail,
    /// `wasi:http`: its context, and the plugin's grants and limits.
    pub(crate) http: WasiHttpCtx,
    pub(crate) http_hooks: GuestHttp,
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
    /// The current status as this instance is shown it.
    fn snapshot(&self) -> Status {
        shown_status(&self.view.borrow(), &self.term)
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
    seen: &Status,
) -> Status {
    let mut elector_gone = false;
    loop {
        let status = shown_status(&rx.borrow_and_update(), &term);
        if status != *seen {
            return status;
        }
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

/// The host side of `current-status` in both worlds (the `HasData` marker
/// of the generated bindings).
pub struct CurrentStatus;

impl HasData for CurrentStatus {
    type Data<'a> = &'a mut GuestState;
}

impl<T: Send> future_plugin::baton::leader::status_future::HostWithStore<T> for CurrentStatus {
    fn current_status(
        mut host: Access<'_, T, Self>,
    ) -> wasmtime::Result<(WitStatus, FutureReader<WitStatus>)> {
        let (status, rx, term) = {
            let state = host.get();
            (state.snapshot(), state.view.clone(), state.term.clone())
        };
        let seen = status.clone();
        let future = FutureReader::new(&mut host, async move {
            let next = changed_from(rx, term, &seen).await;
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
    term: Arc<Term>,
    seen: Status,
}

#[wasmtime_wasi::async_trait]
impl Pollable for StatusChange {
    async fn ready(&mut self) {
        changed_from(self.rx.clone(), self.term.clone(), &self.seen).await;
    }
}

impl pollable_plugin::baton::leader::status_pollable::Host for GuestState {
    fn current_status(&mut self) -> wasmtime::Result<(WitStatus, Resource<DynPollable>)> {
        let status = self.snapshot();
        let change = self.table.push(StatusChange {
            rx: self.view.clone(),
            term: self.term.clone(),
            seen: status.clone(),
        })?;
        let pollable = subscribe(&mut self.table, change)?;
        Ok(((&status).into(), pollable))
    }
}
