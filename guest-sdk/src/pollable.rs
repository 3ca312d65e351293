//! The `pollable-plugin` flavour: a plain (blocking) task and a
//! `wasi:io/poll` change signal (WASI 0.2 style).
//!
//! Needs the `pollable` feature. A plugin implements [`LeaderTask`] and
//! exports it with [`export_pollable!`](crate::export_pollable).
//!
//! # Example
//!
//! A task that does some work every second until its term is over:
//!
//! ```no_run
//! use std::time::Duration;
//! use baton_guest::{Status, pollable::{self, LeaderTask}};
//!
//! struct Ticker;
//!
//! impl LeaderTask for Ticker {
//!     fn run(status: Status) -> Result<(), String> {
//!         let change = pollable::watch(&status);
//!         // `wait_timeout` returns true as soon as the status changes,
//!         // false when the second is up.
//!         while !change.wait_timeout(Duration::from_secs(1)) {
//!             println!("working in term {}", status.term);
//!         }
//!         Ok(())
//!     }
//! }
//!
//! baton_guest::export_pollable!(Ticker);
//! ```

use std::time::Duration;

use crate::__private::pollable_bindings::baton::leader::{hosts_pollable, status_pollable};
use crate::__private::wasi_bindings::wasi::clocks0_2_12::monotonic_clock;
use crate::__private::wasi_bindings::wasi::io::poll;
use crate::{Hosts, Status};

/// The leader task of a `pollable-plugin`.
///
/// Export it with [`export_pollable!`](crate::export_pollable).
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
    fn run(status: Status) -> Result<(), String>;

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
    fn check() -> Result<(), String> {
        Ok(())
    }
}

/// A signal that becomes ready once a lease status (or the live hosts) is
/// outdated.
///
/// Returned by [`current_status`] and [`watch`] (and by [`current_hosts`]).
/// Once ready it stays ready; call [`current_status`] (or
/// [`current_hosts`]) to read the new value. Dropping it is fine.
#[derive(Debug)]
pub struct Change {
    pollable: poll::Pollable,
}

impl Change {
    /// Whether the status has changed, without blocking.
    pub fn is_ready(&self) -> bool {
        self.pollable.ready()
    }

    /// Blocks until the status has changed.
    pub fn wait(&self) {
        self.pollable.block();
    }

    /// Blocks until the status has changed or `timeout` has passed,
    /// whichever comes first; returns whether the status has changed.
    ///
    /// The change and a monotonic-clock timer are polled together, so a
    /// change ends the wait at once.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let timer = monotonic_clock::subscribe_duration(crate::nanos(timeout));
        let ready = poll::poll(&[&self.pollable, &timer]);
        // `poll` returns the indexes of every ready pollable; the timer may
        // be ready too, but a change wins.
        ready.contains(&0) || self.pollable.ready()
    }

    /// The underlying `wasi:io/poll` pollable, for polling it together with
    /// other pollables with [`wasi:io/poll.poll`](poll_with).
    pub fn as_pollable(&self) -> &Pollable {
        &self.pollable
    }

    /// A change signal that is ready at once.
    fn already() -> Change {
        Change {
            pollable: monotonic_clock::subscribe_duration(0),
        }
    }
}

/// The `wasi:io/poll@0.2.12` pollable resource, for use with [`poll_with`].
pub use crate::__private::wasi_bindings::wasi::io::poll::Pollable;

/// Blocks until at least one of `pollables` is ready and returns the
/// indexes of the ready ones (`wasi:io/poll.poll`).
///
/// [`Change::wait_timeout`] covers the common case of a change and a timer;
/// use this to wait on more, e.g. a change and a stream:
///
/// ```no_run
/// # use baton_guest::pollable;
/// # fn other() -> &'static pollable::Pollable { unimplemented!() }
/// let (_, change) = pollable::current_status();
/// let ready = pollable::poll_with(&[change.as_pollable(), other()]);
/// if ready.contains(&0) {
///     // the status changed
/// }
/// ```
pub fn poll_with(pollables: &[&Pollable]) -> Vec<u32> {
    poll::poll(pollables)
}

/// Returns the current status of this plugin's lease and a signal that
/// becomes ready once that status is outdated.
///
/// The call never blocks. Each call returns a fresh signal; it becomes ready
/// exactly when the status differs from the one returned with it (never for
/// an unchanged value, never missing a change). Changes in quick succession
/// may be coalesced.
pub fn current_status() -> (Status, Change) {
    let (status, pollable) = status_pollable::current_status();
    (status.into(), Change { pollable })
}

/// Returns a signal that becomes ready once the lease status differs from
/// `status`: at once if it already does.
///
/// Call this at the start of [`LeaderTask::run`] with the status `run` got,
/// so that a change that happened before the task started is not missed.
pub fn watch(status: &Status) -> Change {
    let (current, change) = current_status();
    if current == *status {
        change
    } else {
        Change::already()
    }
}

/// Returns the live hosts and a signal that becomes ready once they are
/// outdated (see [`Hosts`]).
///
/// The same rules hold as for [`current_status`]. A plugin that calls it
/// makes its host keep a membership record even when it does not spread
/// its leases.
///
/// ```no_run
/// # use std::time::Duration;
/// # use baton_guest::pollable;
/// let (hosts, change) = pollable::current_hosts();
/// println!("{} hosts share the work", hosts.live);
/// if change.wait_timeout(Duration::from_secs(1)) {
///     println!("now {}", pollable::current_hosts().0.live);
/// }
/// ```
pub fn current_hosts() -> (Hosts, Change) {
    let (hosts, pollable) = hosts_pollable::current_hosts();
    (hosts.into(), Change { pollable })
}

/// Whether this host still leads in term `term`, i.e. whether a task for
/// that term may go on working.
///
/// ```no_run
/// # use baton_guest::{Status, pollable};
/// # fn write_batch(_: u64) {}
/// # let status: Status = unimplemented!();
/// while pollable::still_leading(status.term) {
///     write_batch(status.term);
/// }
/// ```
pub fn still_leading(term: u64) -> bool {
    current_status().0.is_leading_term(term)
}

/// Blocks for `duration`, ignoring status changes.
///
/// To wait for a time *or* a change, use [`Change::wait_timeout`].
pub fn sleep(duration: Duration) {
    monotonic_clock::subscribe_duration(crate::nanos(duration)).block();
}
