//! Watching: one watch request per namespace, shared by every watch of the
//! store's leases, and a watch of its own for a lease whose Lease the
//! shared one cannot see; see "Watching" in `docs/kubernetes.md`.
//!
//! The pieces, named as in the embedded store's watcher:
//!
//! - [`SharedWatch`] (`shared.rs`): the store's one watch of its
//!   namespace's Leases (label selector
//!   [`ROLE_LABEL`](super::ROLE_LABEL)`=`[`LEASE_ROLE`](super::LEASE_ROLE)
//!   and the configured labels). A task lists them and follows the watch.
//!   It runs while at least one watch is registered; a lease watch's
//!   [`Registration`](shared::Registration) is its place in it (dropping it
//!   leaves). While it is in sync (and has delivered the store's own
//!   writes), its cache also serves the store's listings of membership
//!   records ([`SharedWatch::cached`]).
//! - `demux.rs`: its cache (the newest object of each Lease) and its
//!   routes, which hand each event to the watches of that lease only,
//!   through a [`Signal`](demux::Signal): the newest event not taken yet (a
//!   newer one replaces an older one: the watch reports states, and the
//!   newest is the one that matters), or the error that ended the watch.
//! - [`LeaseStream`] (`lease.rs`): one lease's stream, fed by the shared
//!   watch while the Lease carries the labels, and by a watch of its own
//!   (field selector on its name) while it does not, or does not exist.
//! - `follower.rs`: one watch request at a time, resumed where the last
//!   one ended; behind the shared watch and every lease watched on its own.
//! - Here: what the watches share ([`WatchConfig`], [`LiveTimings`]) and
//!   what a Lease read tells a lease watch ([`Confirmed`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::DynamicObject;

use super::gate::Gated;
use rand::Rng;

use crate::store::StoreTimings;

mod demux;
mod follower;
mod lease;
mod shared;

pub(super) use self::follower::Follower;
pub(super) use self::lease::{LeaseStream, next_observation};
pub(super) use self::shared::SharedWatch;

/// What the watches of one store have in common: where and how to watch.
#[derive(Clone)]
pub(super) struct WatchConfig {
    pub api: Gated<DynamicObject>,
    /// The labels every Lease of this store carries (the store's constant
    /// one and the configured ones): the shared watch's selector.
    pub selector: BTreeMap<String, String>,
    /// Shared by every clone: a reload may change them.
    pub timings: Arc<LiveTimings>,
    pub watch_timeout_secs: Option<u32>,
}

/// The store's [`StoreTimings`], read at each use (one relaxed atomic load
/// each, cheap enough for every record read) and replaced after a reload
/// ([`LeaseStore::set_timings`](crate::store::LeaseStore::set_timings)).
/// The two values are independent: a reader that sees one new and the
/// other old for a moment uses two valid settings.
#[derive(Debug)]
pub(super) struct LiveTimings {
    fallback_nanos: AtomicU64,
    request_timeout_nanos: AtomicU64,
}

impl LiveTimings {
    pub(super) fn new(timings: StoreTimings) -> LiveTimings {
        let live = LiveTimings {
            fallback_nanos: AtomicU64::new(0),
            request_timeout_nanos: AtomicU64::new(0),
        };
        live.set(timings);
        live
    }

    pub(super) fn set(&self, timings: StoreTimings) {
        let request_timeout = timings.request_timeout.max(super::MIN_REQUEST_TIMEOUT);
        self.fallback_nanos
            .store(nanos(timings.fallback_duration), Ordering::Relaxed);
        self.request_timeout_nanos
            .store(nanos(request_timeout), Ordering::Relaxed);
    }

    /// The duration read for a Lease with a holder but no usable
    /// `leaseDurationSeconds`; also the base of a watch's server-side timeout.
    pub(super) fn fallback_duration(&self) -> Duration {
        Duration::from_nanos(self.fallback_nanos.load(Ordering::Relaxed))
    }

    /// The bound on the requests the store makes by itself (at least
    /// [`MIN_REQUEST_TIMEOUT`](super::MIN_REQUEST_TIMEOUT)).
    pub(super) fn request_timeout(&self) -> Duration {
        Duration::from_nanos(self.request_timeout_nanos.load(Ordering::Relaxed))
    }
}

/// A duration in nanoseconds; `u64::MAX` (584 years) for longer ones.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl WatchConfig {
    /// The bound on the requests the store makes by itself, now.
    pub(super) fn request_timeout(&self) -> Duration {
        self.timings.request_timeout()
    }

    /// The selector as the API server takes it: `k=v,k=v`.
    fn label_selector(&self) -> String {
        label_selector(&self.selector)
    }

    /// The server-side timeout of one watch request, in seconds.
    fn watch_timeout(&self) -> u32 {
        // One lease duration (the longest configured), x 1 to 1.25 so that
        // many hosts do not re-watch together: a watch that goes silent
        // (a half-open connection that TCP does not notice) is found dead
        // within about that, at the cost of one watch request per lease
        // duration per watch, the budget idle followers have.
        self.watch_timeout_secs.unwrap_or_else(|| {
            // Capped at an hour: a longer lease would only delay finding a
            // dead connection.
            let secs = self.timings.fallback_duration().as_secs().clamp(1, 3600) as u32;
            rand::rng().random_range(secs..=secs + secs / 4)
        })
    }
}

/// `k=v,k=v`, in key order.
pub(super) fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `obj` carries every label of `selector` with its value: whether
/// a watch with that selector sees it.
pub(super) fn selects(selector: &BTreeMap<String, String>, obj: &DynamicObject) -> bool {
    let labels = obj.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// What a read of one Lease found, for a lease watch deciding where its
/// events will come from.
#[derive(Debug)]
pub(super) enum Confirmed {
    /// The Lease, carrying the labels: the shared watch sees its changes.
    Selected(DynamicObject),
    /// The Lease, without (all) the labels: written by someone else who
    /// dropped them, or created by someone else. The shared watch cannot
    /// see it; the lease is watched on its own.
    Unselected(DynamicObject),
    /// No Lease: deleted. It may be created again by anyone, with or
    /// without the labels, so the lease is watched on its own.
    Gone,
}

impl Confirmed {
    /// Sorts what a read found. A shared watch reports a Lease that stops
    /// carrying the labels as DELETED, exactly as a deletion: only a read
    /// tells the two apart.
    pub(super) fn of(found: Option<DynamicObject>, selector: &BTreeMap<String, String>) -> Confirmed {
        match found {
            None => Confirmed::Gone,
            Some(obj) if selects(selector, &obj) => Confirmed::Selected(obj),
            Some(obj) => Confirmed::Unselected(obj),
        }
    }
}

#[cfg(test)]
mod tests;
