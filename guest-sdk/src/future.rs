//! The `future-plugin` flavour: an `async` task and a `future<status>`
//! change signal (component-model async, WASI 0.3 style).
//!
//! Needs the `future` feature. A plugin implements [`LeaderTask`] and
//! exports it with [`export_future!`](crate::export_future). The task runs
//! on wit-bindgen's component-model executor: await the helpers here (and
//! other component-model async imports); blocking calls block the whole
//! task.
//!
//! # Example
//!
//! A task that does some work every second until its term is over:
//!
//! ```no_run
//! use std::time::Duration;
//! use baton_guest::{Status, future::{self, LeaderTask}};
//!
//! struct Ticker;
//!
//! impl LeaderTask for Ticker {
//!     async fn run(status: Status) -> Result<(), String> {
//!         let mut change = future::watch(&status);
//!         // `timeout` gives `Some(new status)` as soon as the status
//!         // changes, `None` when the second is up. `&mut change` keeps the
//!         // signal for the next round.
//!         while future::timeout(Duration::from_secs(1), &mut change).await.is_none() {
//!             println!("working in term {}", status.term);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! baton_guest::export_future!(Ticker);
//! ```

use std::future::{Future, IntoFuture};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::__private::future_bindings::baton::leader::{hosts_future, membership, status_future, types};
use crate::__private::future_bindings::wasi::clocks0_3_0::monotonic_clock;
use crate::__private::wit_bindgen::FutureRead;
use crate::{Hosts, Status};

/// The leader task of a `future-plugin`.
///
/// Export it with [`export_future!`](crate::export_future).
pub trait LeaderTask {
    /// Does this plugin's work for one term, while this host leads.
    ///
    /// The host calls `run` in a fresh instance each time this host starts
    /// leading, with `status.role` equal to [`Role::Leading`] and
    /// `status.term` the new term. The term is over as soon as the status
    /// changes (see [`watch`]); return promptly then. A task still running
    /// when the host's grace period has passed is stopped by force and its
    /// instance is discarded.
    ///
    /// Returning `Ok(())` ends the work for this term: `run` is not called
    /// again until a new term. Returning `Err` (or panicking) while the term
    /// lasts makes the host retry, in a fresh instance, after a back-off.
    ///
    /// [`Role::Leading`]: crate::Role::Leading
    // Component instances are single-threaded: no `Send` bound is wanted.
    #[allow(async_fn_in_trait)]
    async fn run(status: Status) -> Result<(), String>;

    /// Checks this plugin's health (`baton:leader@0.4.0`'s health check):
    /// `Ok(())` when this host can do the plugin's work, `Err` saying why
    /// not. The default says healthy.
    ///
    /// The host calls it only for a plugin configured with a `health-check`
    /// table, every period while this host leads and the task runs, and
    /// not in the task's instance: in an instance of its own, made for the
    /// term with the same grants (so statics set by `run` are not seen
    /// here). Check what the task needs (a service, a file), or a heartbeat
    /// the task writes where both can read it (its bucket, a granted
    /// directory). A check that fails, panics or outlasts its timeout
    /// `threshold` times in a row makes the host hand the lease over and
    /// stay out of contention for a while.
    #[allow(async_fn_in_trait)]
    async fn check() -> Result<(), String> {
        Ok(())
    }
}

/// A future that resolves, with the new status, once a lease status is
/// outdated.
///
/// Returned by [`current_status`] and [`watch`]. It is [`Unpin`], so it can
/// be awaited by reference (`(&mut change).await`, or
/// [`timeout`]`(d, &mut change)`) and survive a wait that ended for another
/// reason. Once resolved, polling it again gives the same status again.
/// Dropping it is fine.
pub struct Change {
    state: ChangeState,
}

enum ChangeState {
    Waiting(Pin<Box<FutureRead<types::Status>>>),
    Done(Status),
}

impl Change {
    /// A change signal that has already resolved with `status`.
    fn already(status: Status) -> Change {
        Change {
            state: ChangeState::Done(status),
        }
    }
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            ChangeState::Waiting(_) => f.write_str("Change(waiting)"),
            ChangeState::Done(status) => f.debug_tuple("Change").field(status).finish(),
        }
    }
}

impl Future for Change {
    type Output = Status;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Status> {
        let this = self.get_mut();
        match &mut this.state {
            ChangeState::Done(status) => Poll::Ready(status.clone()),
            ChangeState::Waiting(read) => match read.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(status) => {
                    let status = Status::from(status);
                    this.state = ChangeState::Done(status.clone());
                    Poll::Ready(status)
                }
            },
        }
    }
}

/// Returns the current status of this plugin's lease and a future that
/// resolves, with the new status, once that status is outdated.
///
/// The call never blocks. Each call returns a fresh future; it resolves
/// exactly when the status differs from the one returned with it (never for
/// an unchanged value, never missing a change). Changes in quick succession
/// may be coalesced; the future then carries the newest status.
pub fn current_status() -> (Status, Change) {
    let (status, reader) = status_future::current_status();
    let change = Change {
        state: ChangeState::Waiting(Box::pin(reader.into_future())),
    };
    (status.into(), change)
}

/// Returns a future that resolves once the lease status differs from
/// `status`: at once (with the current status) if it already does.
///
/// Call this at the start of [`LeaderTask::run`] with the status `run` got,
/// so that a change that happened before the task started is not missed.
pub fn watch(status: &Status) -> Change {
    let (current, change) = current_status();
    if current == *status {
        change
    } else {
        Change::already(current)
    }
}

/// A future that resolves, with the new value, once the live hosts are
/// outdated: returned by [`current_hosts`]. Like [`Change`], it is
/// [`Unpin`] and gives the same value again once resolved.
pub struct HostsChange {
    state: HostsChangeState,
}

enum HostsChangeState {
    Waiting(Pin<Box<FutureRead<membership::Hosts>>>),
    Done(Hosts),
}

impl std::fmt::Debug for HostsChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            HostsChangeState::Waiting(_) => f.write_str("HostsChange(waiting)"),
            HostsChangeState::Done(hosts) => f.debug_tuple("HostsChange").field(hosts).finish(),
        }
    }
}

impl Future for HostsChange {
    type Output = Hosts;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Hosts> {
        let this = self.get_mut();
        match &mut this.state {
            HostsChangeState::Done(hosts) => Poll::Ready(*hosts),
            HostsChangeState::Waiting(read) => match read.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(hosts) => {
                    let hosts = Hosts::from(hosts);
                    this.state = HostsChangeState::Done(hosts);
                    Poll::Ready(hosts)
                }
            },
        }
    }
}

/// Returns the live hosts and a future that resolves, with the new value,
/// once they are outdated (see [`Hosts`]).
///
/// The same rules hold as for [`current_status`]. A plugin that calls it
/// makes its host keep a membership record even when it does not spread
/// its leases.
///
/// ```no_run
/// # use baton_guest::future;
/// # async fn f() {
/// let (hosts, change) = future::current_hosts();
/// println!("{} hosts share the work", hosts.live);
/// let now = change.await;
/// println!("now {}", now.live);
/// # }
/// ```
pub fn current_hosts() -> (Hosts, HostsChange) {
    let (hosts, reader) = hosts_future::current_hosts();
    let change = HostsChange {
        state: HostsChangeState::Waiting(Box::pin(reader.into_future())),
    };
    (hosts.into(), change)
}

/// Whether this host still leads in term `term`, i.e. whether a task for
/// that term may go on working.
///
/// ```no_run
/// # use baton_guest::{Status, future};
/// # async fn write_batch(_: u64) {}
/// # async fn f(status: Status) {
/// while future::still_leading(status.term) {
///     write_batch(status.term).await;
/// }
/// # }
/// ```
pub fn still_leading(term: u64) -> bool {
    current_status().0.is_leading_term(term)
}

/// Waits for `duration` (`wasi:clocks/monotonic-clock@0.3.0.wait-for`).
///
/// To wait for a time *or* a change, use [`timeout`].
pub async fn sleep(duration: Duration) {
    monotonic_clock::wait_for(crate::nanos(duration)).await;
}

/// Runs `future` until it finishes or `change` resolves, whichever comes
/// first: `Ok(output)`, or `Err(new status)` once the status changed (the
/// future is dropped then, and with it, say, an HTTP request in flight).
///
/// ```no_run
/// # use baton_guest::{Status, future};
/// # async fn work() {}
/// # async fn f(status: Status) -> Result<(), String> {
/// let mut change = future::watch(&status);
/// loop {
///     if future::until_change(&mut change, work()).await.is_err() {
///         return Ok(()); // the term is over
///     }
/// }
/// # }
/// ```
pub async fn until_change<F: IntoFuture>(change: &mut Change, future: F) -> Result<F::Output, Status> {
    let mut future = pin!(future.into_future());
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(status) = Pin::new(&mut *change).poll(cx) {
            return Poll::Ready(Err(status));
        }
        future.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// Runs `future` for at most `duration`: `Some(output)` if it finished in
/// time, `None` (dropping the future) if the time ran out first.
///
/// Pass a future by reference (`&mut change`) to keep it when the time runs
/// out.
///
/// ```no_run
/// # use std::time::Duration;
/// # use baton_guest::future;
/// # async fn f() {
/// let (_, mut change) = future::current_status();
/// match future::timeout(Duration::from_secs(1), &mut change).await {
///     Some(new) => println!("status changed: {new}"),
///     None => println!("no change within a second"),
/// }
/// # }
/// ```
pub async fn timeout<F: IntoFuture>(duration: Duration, future: F) -> Option<F::Output> {
    let mut future = pin!(future.into_future());
    let mut timer = pin!(sleep(duration));
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}
