//! The shared watch's demultiplexing: its cache of the newest object of
//! every Lease it selects, and the routes that hand each event to the
//! watches of that lease only, through each watch's [`Signal`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{DynamicObject, WatchEvent};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::store::StoreError;
use crate::store::kube::requests::rv_number;
use crate::support::rounding::human;

/// How long after the answer to one of this store's writes the shared
/// watch may still not have delivered it (or anything newer) and still
/// serve [`SharedWatch::cached`](super::SharedWatch::cached): the event of a write reaches a healthy
/// watch within milliseconds; one that lags by more than this is taken as
/// possibly dead (a half-open connection), and listings go to the API
/// server until it catches up or its silence ends it.
pub(super) const WATCH_LAG_ALLOWANCE: Duration = Duration::from_secs(1);

/// What the shared watch hands a lease watch.
#[derive(Clone, Debug)]
pub(super) enum Delivery {
    /// The Lease was added or changed: its new state.
    Object(Arc<DynamicObject>),
    /// DELETED: the Lease was deleted, or it stopped carrying the labels.
    /// Its last state as the event told it.
    Deleted(Arc<DynamicObject>),
}

/// How the shared watch tells a lease watch that something happened.
#[derive(Default)]
pub(super) struct Signal {
    /// Woken on every delivery; wake-ups coalesce into one pending permit,
    /// which is all the stream needs since it takes the newest delivery.
    pub(super) wake: Notify,
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    /// The newest delivery not taken yet.
    delivery: Option<Delivery>,
    /// Set when the shared watch broke, with the reason.
    broken: Option<StoreError>,
}

/// What a lease watch found in its [`Signal`].
#[derive(Debug)]
pub(super) enum Taken {
    Delivery(Box<Delivery>),
    Broken(StoreError),
    Nothing,
}

impl Signal {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Every change is one assignment: a poisoned lock is used as is.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn deliver(&self, delivery: Delivery) {
        self.slot().delivery = Some(delivery);
        self.wake.notify_one();
    }

    pub(super) fn break_with(&self, error: StoreError) {
        self.slot().broken.get_or_insert(error);
        self.wake.notify_one();
    }

    /// Forgets what was delivered: the caller read the cache, which holds
    /// it.
    pub(super) fn clear(&self) {
        *self.slot() = Slot::default();
    }

    pub(super) fn take(&self) -> Taken {
        let mut slot = self.slot();
        if let Some(e) = slot.broken.take() {
            return Taken::Broken(e);
        }
        match slot.delivery.take() {
            Some(d) => Taken::Delivery(Box::new(d)),
            None => Taken::Nothing,
        }
    }
}

#[derive(Default)]
pub(super) struct SharedState {
    /// By lease name: the watches of that lease.
    pub(super) routes: HashMap<String, Vec<(u64, Arc<Signal>)>>,
    pub(super) next_id: u64,
    pub(super) next_generation: u64,
    /// The running watch, while at least one lease watch is registered
    /// and it has not failed.
    pub(super) run: Option<Run>,
}

/// One run of the shared watch: a list, then watch requests resumed one
/// after another, until an error.
pub(super) struct Run {
    /// Tells runs apart: a run that failed or was stopped leaves no trace
    /// in a later one.
    pub(super) generation: u64,
    /// The list is in the cache and the first watch request was accepted.
    pub(super) synced: bool,
    /// The newest object of every Lease the watch selects, by name, as of
    /// the last event applied.
    pub(super) cache: HashMap<String, Arc<DynamicObject>>,
    /// The highest resourceVersion the watch has reached (the list's, then
    /// every event's and bookmark's): the cache is current up to it.
    pub(super) reached: u64,
    /// The first of this store's writes (of a Lease the watch selects)
    /// that the watch had not reached when its answer arrived, and when
    /// that was; cleared once the watch reaches it. Older than
    /// [`WATCH_LAG_ALLOWANCE`]: the watch lags or is silently dead.
    pub(super) unconfirmed: Option<(u64, Instant)>,
    /// `Some(Ok)` once synced, `Some(Err)` once failed.
    pub(super) status: watch::Sender<Option<Result<(), StoreError>>>,
    pub(super) task: Option<tokio::task::AbortHandle>,
}

impl Run {
    /// The watch has reached resourceVersion `rv` (never moves back; one
    /// that is not a number changes nothing).
    fn reach(&mut self, rv: &str) {
        let Some(rv) = rv_number(rv) else { return };
        self.reached = self.reached.max(rv);
        if self.unconfirmed.is_some_and(|(w, _)| w <= self.reached) {
            self.unconfirmed = None;
        }
    }
}

/// Why [`SharedWatch::cached`](super::SharedWatch::cached) cannot serve a listing: the caller lists
/// from the API server instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::store::kube) enum Unserved {
    /// Nothing watches: no lease watch is registered, or the watch failed
    /// and no lease has watched again yet.
    NotRunning,
    /// Listing, or starting its first watch request.
    Syncing,
    /// One of this store's writes, at resourceVersion `rv`, has not come
    /// back through the watch for `lag`: the watch lags or is silently
    /// dead.
    Lagging { rv: u64, lag: Duration },
}

impl std::fmt::Display for Unserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unserved::NotRunning => f.write_str("the namespace's shared watch is not running"),
            Unserved::Syncing => f.write_str("the namespace's shared watch is still listing"),
            Unserved::Lagging { rv, lag } => write!(
                f,
                "the namespace's shared watch has not delivered this host's write at \
                 resourceVersion {rv} for {}",
                human(*lag)
            ),
        }
    }
}

impl SharedState {
    /// Routes `lease`'s events to `signal`; the route's id.
    pub(super) fn route(&mut self, lease: &str, signal: Arc<Signal>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.routes
            .entry(lease.to_owned())
            .or_default()
            .push((id, signal));
        id
    }

    pub(super) fn new_run(&mut self) -> &mut Run {
        self.next_generation += 1;
        self.run.insert(Run {
            generation: self.next_generation,
            synced: false,
            cache: HashMap::new(),
            reached: 0,
            unconfirmed: None,
            status: watch::channel(None).0,
            task: None,
        })
    }

    pub(super) fn run_of(&mut self, generation: u64) -> Option<&mut Run> {
        self.run.as_mut().filter(|r| r.generation == generation)
    }

    /// The list of run `generation` is in, as of resourceVersion `rv`:
    /// fills the cache.
    pub(super) fn synced(&mut self, generation: u64, items: Vec<DynamicObject>, rv: &str) {
        let Some(run) = self.run_of(generation) else {
            return;
        };
        run.cache = items
            .into_iter()
            .filter_map(|o| Some((o.metadata.name.clone()?, Arc::new(o))))
            .collect();
        run.synced = true;
        run.reach(rv);
        run.status.send_replace(Some(Ok(())));
    }

    /// Applies an event of run `generation` to the cache and hands it to
    /// the watches of its lease, and to no other.
    pub(super) fn apply(&mut self, generation: u64, event: WatchEvent<DynamicObject>) {
        let Some(run) = self
            .run
            .as_mut()
            .filter(|r| r.generation == generation && r.synced)
        else {
            return;
        };
        let rv = match &event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                o.metadata.resource_version.as_deref()
            }
            WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.as_str()),
            WatchEvent::Error(_) => None,
        };
        run.reach(rv.unwrap_or_default());
        let (name, delivery) = match event {
            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                let Some(name) = obj.metadata.name.clone() else {
                    return;
                };
                // One object, shared by the cache and every delivery.
                let obj = Arc::new(obj);
                run.cache.insert(name.clone(), obj.clone());
                (name, Delivery::Object(obj))
            }
            WatchEvent::Deleted(obj) => {
                let Some(name) = obj.metadata.name.clone() else {
                    return;
                };
                run.cache.remove(&name);
                (name, Delivery::Deleted(Arc::new(obj)))
            }
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => return,
        };
        for (_, signal) in self.routes.get(&name).into_iter().flatten() {
            signal.deliver(delivery.clone());
        }
    }

    /// This store wrote a Lease the watch selects, at resourceVersion
    /// `rv`, answered at `at`: unless the watch has reached it already, it
    /// is the write the watch must deliver (if no earlier one is awaited).
    pub(super) fn wrote(&mut self, rv: u64, at: Instant) {
        let Some(run) = self.run.as_mut().filter(|r| r.synced) else {
            return;
        };
        if run.reached < rv && run.unconfirmed.is_none() {
            run.unconfirmed = Some((rv, at));
        }
    }

    /// The cached objects whose names start with `prefix`, if the cache is
    /// current at `now`: the watch is running, in sync, and has delivered
    /// this store's writes answered more than [`WATCH_LAG_ALLOWANCE`] ago.
    pub(super) fn cached(&self, prefix: &str, now: Instant) -> Result<Vec<DynamicObject>, Unserved> {
        let run = self.run.as_ref().ok_or(Unserved::NotRunning)?;
        if !run.synced {
            return Err(Unserved::Syncing);
        }
        if let Some((rv, at)) = run.unconfirmed {
            let lag = now.saturating_duration_since(at);
            if lag > WATCH_LAG_ALLOWANCE {
                return Err(Unserved::Lagging { rv, lag });
            }
        }
        Ok(run
            .cache
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, obj)| DynamicObject::clone(obj))
            .collect())
    }

    /// Run `generation` failed: every watch hears of it, and the next one
    /// to join starts a new run (listing afresh). Returns the run, to be
    /// dropped outside the lock.
    pub(super) fn fail(&mut self, generation: u64, error: &StoreError) -> Option<Run> {
        self.run_of(generation)?;
        let run = self.run.take()?;
        run.status.send_replace(Some(Err(error.clone())));
        for (_, signal) in self.routes.values().flatten() {
            signal.break_with(error.clone());
        }
        Some(run)
    }
}
