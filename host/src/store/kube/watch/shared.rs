//! The store's one watch of its namespace's Leases: started by the first
//! lease watch that joins, listed then followed by a task of its own, and
//! stopped when the last one leaves.

use std::sync::{Arc, Mutex};

use kube::api::{DynamicObject, ListParams, WatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::demux::{Delivery, SharedState, Signal, Taken, Unserved};
use super::follower::Follower;
use super::{WatchConfig, selects};
use crate::store::kube::gate::Class;
use crate::store::kube::requests::{map_error, rv_number, slim};
use crate::store::{ANY_LEASE, StoreError};
use crate::support::rounding::human;

/// The store's one watch of its namespace's Leases, shared by every watch
/// of its leases: see the [module documentation](self). One watch per
/// lease would cost a watch request per lease and host, each resumed once
/// per lease duration: with 100 leases on two hosts, about 200 watch
/// requests open and 35 new ones a second, for what one request per host
/// carries.
pub(in crate::store::kube) struct SharedWatch {
    config: WatchConfig,
    state: Mutex<SharedState>,
}

impl SharedWatch {
    pub(in crate::store::kube) fn new(config: WatchConfig) -> SharedWatch {
        SharedWatch {
            config,
            state: Mutex::default(),
        }
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
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

    pub(super) fn leave(&self, lease: &str, id: u64) {
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
    pub(in crate::store::kube) fn cached(&self, prefix: &str) -> Result<Vec<DynamicObject>, Unserved> {
        self.state().cached(prefix, Instant::now())
    }

    /// This store wrote `obj` (the API server's answer): if the watch
    /// selects it, the watch must deliver it, within
    /// [`WATCH_LAG_ALLOWANCE`](super::demux::WATCH_LAG_ALLOWANCE) for its cache to serve listings.
    pub(in crate::store::kube) fn wrote(&self, obj: &DynamicObject) {
        let rv = obj.metadata.resource_version.as_deref().and_then(rv_number);
        if let Some(rv) = rv
            && selects(&self.config.selector, obj)
        {
            self.state().wrote(rv, Instant::now());
        }
    }

    /// The current run, started if there is none: its generation and
    /// status.
    pub(super) fn ensure_run(self: &Arc<Self>) -> (u64, watch::Receiver<Option<Result<(), StoreError>>>) {
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
            Ok(Ok(mut list)) => {
                list.items.iter_mut().for_each(slim);
                list
            }
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
    // Every lease watch of the store waits for this one: it goes before
    // the background requests.
    let error = Class::Elect.scope(shared.follow(generation)).await;
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
    pub(super) async fn join(&self) -> Result<Option<Arc<DynamicObject>>, StoreError> {
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
    pub(super) async fn next(&self) -> Result<Delivery, StoreError> {
        loop {
            match self.signal.take() {
                Taken::Delivery(d) => return Ok(*d),
                Taken::Broken(e) => return Err(e.about(&self.lease)),
                Taken::Nothing => self.signal.wake.notified().await,
            }
        }
    }
}
