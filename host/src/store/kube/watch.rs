//! Watching: one watch request per namespace, shared by every watch of the
//! store's leases, and a watch of its own for a lease whose Lease the
//! shared one cannot see; see [Watching](super#watching).
//!
//! The pieces, named as in the embedded store's watcher:
//!
//! - [`SharedWatch`]: the store's one watch of its namespace's Leases
//!   (label selector [`ROLE_LABEL`](super::ROLE_LABEL)`=`[`LEASE_ROLE`](super::LEASE_ROLE)
//!   and the configured labels). A task lists them, keeps the
//!   newest object of each (its *cache*), follows the watch, and hands each
//!   event to the watches of that lease only. It runs while at least one
//!   watch is registered. While it is in sync (and has delivered the
//!   store's own writes), its cache also serves the store's listings of
//!   membership records ([`SharedWatch::cached`]; see [Listing membership
//!   records](super#listing-membership-records)).
//! - [`Registration`]: a lease watch's place in it; dropping it leaves.
//! - [`Signal`]: how the task hands a lease watch its events: the newest
//!   one not taken yet (a newer event replaces an older one: the watch
//!   reports states, and the newest is the one that matters), or the error
//!   that ended the shared watch.
//! - [`LeaseStream`]: one lease's stream, fed by the shared watch while the
//!   Lease carries the labels, and by a watch of its own (field selector on
//!   its name) while it does not, or does not exist.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use rand::Rng;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::Inner;
use super::requests::{field_selector, map_error, rv_number};
use crate::store::{ANY_LEASE, StoreError, StoreTimings, Versioned};
use crate::support::rounding::human;

/// A watch the server ended sooner than this after it started, without a
/// single event, is reported as an error (the elector then backs off)
/// instead of being resumed at once: no request storms.
const MIN_QUIET_WATCH: Duration = Duration::from_secs(1);

/// How long a watch may stay silent past its own server-side timeout (plus
/// the request timeout) before it is taken as dead: the server ends a watch
/// on time to the second, so this only covers rounding and a busy server.
const WATCH_SILENCE_ALLOWANCE: Duration = Duration::from_secs(1);

/// How long after the answer to one of this store's writes the shared
/// watch may still not have delivered it (or anything newer) and still
/// serve [`SharedWatch::cached`]: the event of a write reaches a healthy
/// watch within milliseconds; one that lags by more than this is taken as
/// possibly dead (a half-open connection), and listings go to the API
/// server until it catches up or its silence ends it.
const WATCH_LAG_ALLOWANCE: Duration = Duration::from_secs(1);

type Events = BoxStream<'static, Result<WatchEvent<DynamicObject>, kube::Error>>;

/// What the watches of one store have in common: where and how to watch.
#[derive(Clone)]
pub(super) struct WatchConfig {
    pub api: Api<DynamicObject>,
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

/// One watch request at a time, resumed from the last resourceVersion seen
/// when the server ends it; bookmarks keep that version current. Yields
/// the events that carry an object, and bookmarks.
struct Follower {
    config: WatchConfig,
    /// The selector (label or field) of every request.
    params: WatchParams,
    /// Named in errors: a lease, or [`ANY_LEASE`] for the shared watch.
    lease: String,
    /// What it is, for messages.
    what: &'static str,
    /// The last resourceVersion seen; the next request starts there.
    resource_version: String,
    current: Option<Request>,
}

/// The watch request in flight.
struct Request {
    events: Events,
    started: Instant,
    /// Its server-side timeout.
    limit: Duration,
    /// It delivered at least one event (bookmarks count).
    active: bool,
}

impl Follower {
    fn new(
        config: WatchConfig,
        params: WatchParams,
        lease: &str,
        what: &'static str,
        from: String,
    ) -> Follower {
        Follower {
            config,
            params,
            lease: lease.to_owned(),
            what,
            resource_version: from,
            current: None,
        }
    }

    /// Starts a watch request from the last resourceVersion seen, bounded
    /// by the request timeout.
    async fn start(&mut self) -> Result<(), StoreError> {
        let secs = self.config.watch_timeout();
        let params = self.params.clone().timeout(secs);
        let bound = self.config.request_timeout();
        let events = tokio::time::timeout(bound, self.config.api.watch(&params, &self.resource_version))
            .await
            .map_err(|_| StoreError::Unavailable {
                lease: self.lease.clone(),
                detail: format!("starting {} timed out after {}", self.what, human(bound)),
            })?
            .map_err(|e| map_error(&self.lease, "watch", e))?;
        self.current = Some(Request {
            events: events.boxed(),
            started: Instant::now(),
            limit: Duration::from_secs(secs.into()),
            active: false,
        });
        Ok(())
    }

    /// Moves the resume point to `rv`, never back: an event may carry an
    /// older version than one seen (the DELETED event of an object that
    /// stopped matching the selector carries its previous state on some
    /// API servers), and resuming from it would replay history.
    fn advance(&mut self, rv: &str) {
        if moves_forward(&self.resource_version, rv) {
            self.resource_version = rv.to_owned();
        }
    }

    /// The next ADDED, MODIFIED, DELETED or BOOKMARK event, resuming the
    /// watch as needed; any error ends it (the caller drops the follower).
    async fn next(&mut self) -> Result<WatchEvent<DynamicObject>, StoreError> {
        loop {
            if self.current.is_none() {
                self.start().await?;
            }
            let request = self.current.as_mut().expect("started above");
            let silence =
                (request.started + request.limit + self.config.request_timeout() + WATCH_SILENCE_ALLOWANCE)
                    .saturating_duration_since(Instant::now());
            let unavailable = |detail: String| StoreError::Unavailable {
                lease: self.lease.clone(),
                detail,
            };
            let event = match tokio::time::timeout(silence, request.events.next()).await {
                Err(_) => {
                    let limit = request.limit;
                    return Err(unavailable(format!(
                        "{} was silent past its {} timeout",
                        self.what,
                        human(limit)
                    )));
                }
                Ok(event) => event,
            };
            match event {
                None => {
                    // The server ended the watch (its timeout, or the
                    // connection closed cleanly): resume from the last
                    // version seen, unless it ended at once, which would
                    // turn into a request storm.
                    if !request.active && request.started.elapsed() < MIN_QUIET_WATCH {
                        return Err(unavailable(format!("{} ended as soon as it started", self.what)));
                    }
                    self.current = None;
                }
                Some(Err(e)) => return Err(map_error(&self.lease, "watch", e)),
                Some(Ok(event)) => {
                    request.active = true;
                    match event {
                        WatchEvent::Bookmark(ref b) => {
                            self.advance(&b.metadata.resource_version);
                            return Ok(event);
                        }
                        WatchEvent::Error(status) => {
                            return Err(map_error(&self.lease, "watch", kube::Error::Api(status)));
                        }
                        WatchEvent::Added(ref obj)
                        | WatchEvent::Modified(ref obj)
                        | WatchEvent::Deleted(ref obj) => {
                            let rv = obj.metadata.resource_version.clone().unwrap_or_default();
                            self.advance(&rv);
                            return Ok(event);
                        }
                    }
                }
            }
        }
    }
}

/// Whether resuming from `to` rather than `from` moves forward: `to` is
/// set, and not below `from` when both are numbers (resourceVersions that
/// are not numbers cannot be compared, and the newest wins).
fn moves_forward(from: &str, to: &str) -> bool {
    if to.is_empty() {
        return false;
    }
    !matches!((rv_number(from), rv_number(to)), (Some(old), Some(new)) if new < old)
}

/// What the shared watch hands a lease watch.
#[derive(Clone, Debug)]
pub(super) enum Delivery {
    /// The Lease was added or changed: its new state.
    Object(DynamicObject),
    /// DELETED: the Lease was deleted, or it stopped carrying the labels.
    /// Its last state as the event told it.
    Deleted(DynamicObject),
}

/// How the shared watch tells a lease watch that something happened.
#[derive(Default)]
pub(super) struct Signal {
    /// Woken on every delivery; wake-ups coalesce into one pending permit,
    /// which is all the stream needs since it takes the newest delivery.
    wake: Notify,
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
enum Taken {
    Delivery(Box<Delivery>),
    Broken(StoreError),
    Nothing,
}

impl Signal {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Every change is one assignment: a poisoned lock is used as is.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, delivery: Delivery) {
        self.slot().delivery = Some(delivery);
        self.wake.notify_one();
    }

    fn break_with(&self, error: StoreError) {
        self.slot().broken.get_or_insert(error);
        self.wake.notify_one();
    }

    /// Forgets what was delivered: the caller read the cache, which holds
    /// it.
    fn clear(&self) {
        *self.slot() = Slot::default();
    }

    fn take(&self) -> Taken {
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

/// The store's one watch of its namespace's Leases, shared by every watch
/// of its leases: see the [module documentation](self). One watch per
/// lease would cost a watch request per lease and host, each resumed once
/// per lease duration: with 100 leases on two hosts, about 200 watch
/// requests open and 35 new ones a second, for what one request per host
/// carries.
pub(super) struct SharedWatch {
    config: WatchConfig,
    state: Mutex<SharedState>,
}

#[derive(Default)]
struct SharedState {
    /// By lease name: the watches of that lease.
    routes: HashMap<String, Vec<(u64, Arc<Signal>)>>,
    next_id: u64,
    next_generation: u64,
    /// The running watch, while at least one lease watch is registered
    /// and it has not failed.
    run: Option<Run>,
}

/// One run of the shared watch: a list, then watch requests resumed one
/// after another, until an error.
struct Run {
    /// Tells runs apart: a run that failed or was stopped leaves no trace
    /// in a later one.
    generation: u64,
    /// The list is in the cache and the first watch request was accepted.
    synced: bool,
    /// The newest object of every Lease the watch selects, by name, as of
    /// the last event applied.
    cache: HashMap<String, DynamicObject>,
    /// The highest resourceVersion the watch has reached (the list's, then
    /// every event's and bookmark's): the cache is current up to it.
    reached: u64,
    /// The first of this store's writes (of a Lease the watch selects)
    /// that the watch had not reached when its answer arrived, and when
    /// that was; cleared once the watch reaches it. Older than
    /// [`WATCH_LAG_ALLOWANCE`]: the watch lags or is silently dead.
    unconfirmed: Option<(u64, Instant)>,
    /// `Some(Ok)` once synced, `Some(Err)` once failed.
    status: watch::Sender<Option<Result<(), StoreError>>>,
    task: Option<tokio::task::AbortHandle>,
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

/// Why [`SharedWatch::cached`] cannot serve a listing: the caller lists
/// from the API server instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Unserved {
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
    fn route(&mut self, lease: &str, signal: Arc<Signal>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.routes
            .entry(lease.to_owned())
            .or_default()
            .push((id, signal));
        id
    }

    fn new_run(&mut self) -> &mut Run {
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

    fn run_of(&mut self, generation: u64) -> Option<&mut Run> {
        self.run.as_mut().filter(|r| r.generation == generation)
    }

    /// The list of run `generation` is in, as of resourceVersion `rv`:
    /// fills the cache.
    fn synced(&mut self, generation: u64, items: Vec<DynamicObject>, rv: &str) {
        let Some(run) = self.run_of(generation) else {
            return;
        };
        run.cache = items
            .into_iter()
            .filter_map(|o| Some((o.metadata.name.clone()?, o)))
            .collect();
        run.synced = true;
        run.reach(rv);
        run.status.send_replace(Some(Ok(())));
    }

    /// Applies an event of run `generation` to the cache and hands it to
    /// the watches of its lease, and to no other.
    fn apply(&mut self, generation: u64, event: WatchEvent<DynamicObject>) {
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
                run.cache.insert(name.clone(), obj.clone());
                (name, Delivery::Object(obj))
            }
            WatchEvent::Deleted(obj) => {
                let Some(name) = obj.metadata.name.clone() else {
                    return;
                };
                run.cache.remove(&name);
                (name, Delivery::Deleted(obj))
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
    fn wrote(&mut self, rv: u64, at: Instant) {
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
    fn cached(&self, prefix: &str, now: Instant) -> Result<Vec<DynamicObject>, Unserved> {
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
            .map(|(_, obj)| obj.clone())
            .collect())
    }

    /// Run `generation` failed: every watch hears of it, and the next one
    /// to join starts a new run (listing afresh). Returns the run, to be
    /// dropped outside the lock.
    fn fail(&mut self, generation: u64, error: &StoreError) -> Option<Run> {
        self.run_of(generation)?;
        let run = self.run.take()?;
        run.status.send_replace(Some(Err(error.clone())));
        for (_, signal) in self.routes.values().flatten() {
            signal.break_with(error.clone());
        }
        Some(run)
    }
}

impl SharedWatch {
    pub(super) fn new(config: WatchConfig) -> SharedWatch {
        SharedWatch {
            config,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
        // Every change is complete under the lock: a poisoned lock is used
        // as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a watch of `lease`; dropping the registration removes it, and
    /// the last one stops the shared watch. Starts nothing yet: see
    /// [`Registration::join`].
    pub(super) fn register(self: &Arc<Self>, lease: &str) -> Registration {
        let signal = Arc::new(Signal::default());
        let id = self.state().route(lease, signal.clone());
        Registration {
            shared: self.clone(),
            lease: lease.to_owned(),
            id,
            signal,
        }
    }

    fn leave(&self, lease: &str, id: u64) {
        let stopped = {
            let mut state = self.state();
            if let Some(list) = state.routes.get_mut(lease) {
                list.retain(|(i, _)| *i != id);
                if list.is_empty() {
                    state.routes.remove(lease);
                }
            }
            if state.routes.is_empty() {
                state.run.take()
            } else {
                None
            }
        };
        // Nobody watches any more: the watch request and the cache go.
        if let Some(task) = stopped.and_then(|run| run.task) {
            task.abort();
        }
    }

    /// The objects of the Leases the watch selects whose names start with
    /// `prefix`, as of every event received, if the watch is running, in
    /// sync, and not lagging behind this store's writes; see [`Unserved`]
    /// for when it is not. Starts nothing: the watch runs while some lease
    /// is watched.
    pub(super) fn cached(&self, prefix: &str) -> Result<Vec<DynamicObject>, Unserved> {
        self.state().cached(prefix, Instant::now())
    }

    /// This store wrote `obj` (the API server's answer): if the watch
    /// selects it, the watch must deliver it, within
    /// [`WATCH_LAG_ALLOWANCE`] for its cache to serve listings.
    pub(super) fn wrote(&self, obj: &DynamicObject) {
        let rv = obj.metadata.resource_version.as_deref().and_then(rv_number);
        if let Some(rv) = rv
            && selects(&self.config.selector, obj)
        {
            self.state().wrote(rv, Instant::now());
        }
    }

    /// The current run, started if there is none: its generation and
    /// status.
    fn ensure_run(self: &Arc<Self>) -> (u64, watch::Receiver<Option<Result<(), StoreError>>>) {
        let mut state = self.state();
        if let Some(run) = &state.run {
            return (run.generation, run.status.subscribe());
        }
        let run = state.new_run();
        let generation = run.generation;
        let status = run.status.subscribe();
        // Spawned under the lock: the task's first step waits for it, so
        // it finds its run in place.
        let task = tokio::spawn(run_shared(self.clone(), generation));
        run.task = Some(task.abort_handle());
        tracing::debug!(leases = %self.config.api.resource_url(), selector = %self.config.label_selector(), "starting the shared lease watch");
        (generation, status)
    }

    /// Lists, then follows the watch until an error, which it returns.
    async fn follow(&self, generation: u64) -> StoreError {
        let selector = self.config.label_selector();
        let bound = self.config.request_timeout();
        let listed = tokio::time::timeout(
            bound,
            self.config.api.list(&ListParams::default().labels(&selector)),
        )
        .await;
        let list = match listed {
            Err(_) => {
                return StoreError::Unavailable {
                    lease: ANY_LEASE.into(),
                    detail: format!(
                        "listing the namespace's Leases ({selector}) timed out after {}",
                        human(bound)
                    ),
                };
            }
            Ok(Err(e)) => return map_error(ANY_LEASE, "list", e),
            Ok(Ok(list)) => list,
        };
        let mut follower = Follower::new(
            self.config.clone(),
            WatchParams::default().labels(&selector),
            ANY_LEASE,
            "the namespace's shared watch",
            list.metadata.resource_version.clone().unwrap_or_default(),
        );
        // Synced once the watch request is accepted, so that a refusal
        // (RBAC) reaches the watches that wait for it.
        if let Err(e) = follower.start().await {
            return e;
        }
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        self.state().synced(generation, list.items, &rv);
        loop {
            match follower.next().await {
                Ok(event) => self.state().apply(generation, event),
                Err(e) => return e,
            }
        }
    }
}

/// The task of one run of the shared watch.
async fn run_shared(shared: Arc<SharedWatch>, generation: u64) {
    /// Fails the run however the task ends: by an error, or dropped (its
    /// runtime shut down), so that no watch waits for it forever.
    struct Ended(Arc<SharedWatch>, u64, Option<StoreError>);
    impl Drop for Ended {
        fn drop(&mut self) {
            let error = self.2.take().unwrap_or_else(|| StoreError::Unavailable {
                lease: ANY_LEASE.into(),
                detail: "the namespace's shared watch stopped".into(),
            });
            let run = self.0.state().fail(self.1, &error);
            drop(run);
        }
    }
    let mut ended = Ended(shared.clone(), generation, None);
    // Wait for the spawner to put the run in place (it holds the lock).
    drop(shared.state());
    let error = shared.follow(generation).await;
    tracing::debug!(error = %error, "the shared lease watch ended");
    ended.2 = Some(error);
}

/// A lease watch's place in the [`SharedWatch`]; dropping it leaves.
pub(super) struct Registration {
    shared: Arc<SharedWatch>,
    lease: String,
    id: u64,
    signal: Arc<Signal>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.leave(&self.lease, self.id);
    }
}

impl Registration {
    /// Joins the shared watch, starting it if it is not running, and
    /// returns its newest object of the lease (`None` if it has none: the
    /// Lease is missing, or lacks the labels, or is too new for the
    /// watch). From then on every event about the lease is delivered: the
    /// cache and the deliveries leave no gap.
    async fn join(&self) -> Result<Option<DynamicObject>, StoreError> {
        let (generation, mut status) = self.shared.ensure_run();
        let outcome = status
            .wait_for(Option::is_some)
            .await
            .map(|s| s.clone().expect("waited for it"));
        let ended = || StoreError::Unavailable {
            lease: self.lease.clone(),
            detail: "the namespace's shared watch stopped".into(),
        };
        match outcome {
            Err(_) => return Err(ended()),
            Ok(Err(e)) => return Err(e.about(&self.lease)),
            Ok(Ok(())) => {}
        }
        let mut state = self.shared.state();
        match state.run_of(generation) {
            Some(run) => {
                self.signal.clear();
                Ok(run.cache.get(&self.lease).cloned())
            }
            // Failed since it synced.
            None => Err(match status.borrow().clone() {
                Some(Err(e)) => e.about(&self.lease),
                _ => ended(),
            }),
        }
    }

    /// The next delivery, or the error that broke the shared watch.
    async fn next(&self) -> Result<Delivery, StoreError> {
        loop {
            match self.signal.take() {
                Taken::Delivery(d) => return Ok(*d),
                Taken::Broken(e) => return Err(e.about(&self.lease)),
                Taken::Nothing => self.signal.wake.notified().await,
            }
        }
    }
}

/// Where a lease watch's events come from.
enum Mode {
    /// The shared watch: the Lease carries the labels.
    Shared,
    /// A watch of its own (field selector on the name): the Lease is
    /// missing or lacks the labels.
    Own(Box<Follower>),
    /// The Lease was seen with the labels again: join the shared watch.
    Join,
}

/// One lease's stream; see the [module documentation](self).
pub(super) struct LeaseStream {
    inner: Arc<Inner>,
    lease: String,
    /// Held in both modes: the shared watch runs while the store watches
    /// anything.
    registration: Registration,
    mode: Mode,
    /// What to yield next: an observation, and the resourceVersion it is
    /// as of (to tell whether the caller has learned something newer).
    first: Option<(Result<Option<Versioned>, StoreError>, String)>,
    /// The version last yielded: an event of the same version is not news.
    yielded: Option<String>,
    /// The stream has ended with an error.
    done: bool,
}

impl LeaseStream {
    /// A watch of `lease`: joined, with its first observation ready, and
    /// any watch request it needs started, so that the caller's bound
    /// covers them and a refusal (RBAC) surfaces here.
    pub(super) async fn open(inner: Arc<Inner>, lease: &str) -> Result<LeaseStream, StoreError> {
        let registration = inner.shared.register(lease);
        let mut stream = LeaseStream {
            inner,
            lease: lease.to_owned(),
            registration,
            mode: Mode::Join,
            first: None,
            yielded: None,
            done: false,
        };
        stream.join().await?;
        if let Mode::Own(follower) = &mut stream.mode
            && stream.first.as_ref().is_some_and(|(first, _)| first.is_ok())
        {
            follower.start().await?;
        }
        Ok(stream)
    }

    fn unavailable(&self, detail: String) -> StoreError {
        StoreError::Unavailable {
            lease: self.lease.clone(),
            detail,
        }
    }

    /// Joins the shared watch: its cached object is the first observation;
    /// without one, a read of the Lease decides.
    async fn join(&mut self) -> Result<(), StoreError> {
        match self.registration.join().await? {
            Some(obj) => {
                self.first = Some(self.accepted(&obj));
                self.mode = Mode::Shared;
                Ok(())
            }
            None => self.confirm(None).await,
        }
    }

    /// Lists the one Lease (field selector on its name) and decides where
    /// its events come from; the list is the next observation. `deleted`:
    /// the DELETED event that asked, whose object is the Lease's last state
    /// if it is gone.
    async fn confirm(&mut self, deleted: Option<DynamicObject>) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let bound = inner.watch.request_timeout();
        let params = ListParams::default().fields(&field_selector(&self.lease));
        let list = tokio::time::timeout(bound, inner.api.list(&params))
            .await
            .map_err(|_| self.unavailable(format!("listing the Lease timed out after {}", human(bound))))?
            .map_err(|e| map_error(&self.lease, "list", e))?;
        let list_rv = list.metadata.resource_version.clone().unwrap_or_default();
        let found = list
            .items
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some(self.lease.as_str()));
        let own = |lease: &str| {
            let params = WatchParams::default().fields(&field_selector(lease));
            Mode::Own(Box::new(Follower::new(
                inner.watch.clone(),
                params,
                lease,
                "the watch",
                list_rv.clone(),
            )))
        };
        match Confirmed::of(found, &inner.watch.selector) {
            Confirmed::Selected(obj) => {
                self.first = Some(self.accepted(&obj));
                self.mode = Mode::Shared;
            }
            Confirmed::Unselected(obj) => {
                tracing::debug!(lease = %self.lease, "the Lease lacks baton's labels: watching it on its own until it has them again");
                self.first = Some(self.accepted(&obj));
                self.mode = own(&self.lease);
            }
            Confirmed::Gone => {
                let last = tokio::time::timeout(
                    bound,
                    inner.deleted(&self.lease, deleted.as_ref(), Some(&list_rv)),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(self.unavailable(format!("reading the term floor timed out after {}", human(bound))))
                });
                self.first = Some((last, list_rv.clone()));
                self.mode = own(&self.lease);
            }
        }
        Ok(())
    }

    /// An object the API server sent in answer to a read, accepted, as the
    /// next observation.
    fn accepted(&self, obj: &DynamicObject) -> (Result<Option<Versioned>, StoreError>, String) {
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        (self.inner.accept(&self.lease, obj).map(Some), rv)
    }

    /// Whether an object at `rv` is news: nothing newer was learned (by a
    /// read or a write of the caller's) and it was not yielded already.
    fn is_news(&self, rv: &str) -> bool {
        !self.inner.is_stale(&self.lease, rv) && self.yielded.as_deref() != Some(rv)
    }

    /// An event's object, accepted, if it is news.
    fn event(&mut self, obj: &DynamicObject) -> Option<Result<Option<Versioned>, StoreError>> {
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        if !self.is_news(&rv) {
            return None;
        }
        Some(self.inner.accept(&self.lease, obj).map(Some))
    }

    /// Hands `observation` out; an error ends the stream.
    fn yielding(
        mut self,
        observation: Result<Option<Versioned>, StoreError>,
    ) -> Option<(Result<Option<Versioned>, StoreError>, LeaseStream)> {
        match &observation {
            Ok(v) => self.yielded = v.as_ref().map(|v| v.version.clone()),
            Err(_) => self.done = true,
        }
        Some((observation, self))
    }

    /// A lease deleted (seen by the lease's own watch): reads its floor.
    async fn gone(&mut self, last: &DynamicObject) -> Result<Option<Versioned>, StoreError> {
        let rv = last.metadata.resource_version.clone().unwrap_or_default();
        let bound = self.inner.watch.request_timeout();
        tokio::time::timeout(bound, self.inner.deleted(&self.lease, Some(last), Some(&rv)))
            .await
            .unwrap_or_else(|_| {
                Err(self.unavailable(format!("reading the term floor timed out after {}", human(bound))))
            })
    }
}

/// The stream's step: the next observation worth yielding.
pub(super) async fn next_observation(
    mut s: LeaseStream,
) -> Option<(Result<Option<Versioned>, StoreError>, LeaseStream)> {
    loop {
        if s.done {
            return None;
        }
        if let Some((first, rv)) = s.first.take() {
            // The caller learned something newer (by a read or a write)
            // since the read, or this very version was yielded: what was
            // read is history.
            let history = first.as_ref().is_ok_and(|v| {
                s.inner.is_stale(&s.lease, &rv)
                    || v.as_ref()
                        .is_some_and(|v| s.yielded.as_deref() == Some(v.version.as_str()))
            });
            if history {
                continue;
            }
            return s.yielding(first);
        }
        match &mut s.mode {
            Mode::Join => {
                if let Err(e) = s.join().await {
                    return s.yielding(Err(e));
                }
            }
            Mode::Shared => match s.registration.next().await {
                Err(e) => return s.yielding(Err(e)),
                Ok(Delivery::Object(obj)) => {
                    if let Some(observation) = s.event(&obj) {
                        return s.yielding(observation);
                    }
                }
                // Deleted, or no longer carrying the labels: a read tells
                // (even for a stale event: the Lease may lack the labels
                // now, and the shared watch would not see its changes).
                Ok(Delivery::Deleted(obj)) => {
                    if let Err(e) = s.confirm(Some(obj)).await {
                        return s.yielding(Err(e));
                    }
                }
            },
            Mode::Own(follower) => {
                let event = follower.next().await;
                match event {
                    Err(e) => return s.yielding(Err(e)),
                    Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                        // Carrying the labels again (baton's next write
                        // puts them back): back to the shared watch.
                        if selects(&s.inner.watch.selector, &obj) {
                            tracing::debug!(lease = %s.lease, "the Lease carries baton's labels again: back to the shared watch");
                            s.mode = Mode::Join;
                        }
                        if let Some(observation) = s.event(&obj) {
                            return s.yielding(observation);
                        }
                    }
                    Ok(WatchEvent::Deleted(obj)) => {
                        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
                        if s.inner.is_stale(&s.lease, &rv) {
                            continue;
                        }
                        let last = s.gone(&obj).await;
                        return s.yielding(last);
                    }
                    Ok(WatchEvent::Bookmark(_) | WatchEvent::Error(_)) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
