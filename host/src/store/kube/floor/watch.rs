//! The namespace's *term floors*, listed once and then watched (label
//! `baton.dev/role=term-floor`) by a store that holds a lease: while the
//! watch is in sync, the floors seen are the floors as they are, give or
//! take the watch's delay. So a holder learns of a floor deleted under its
//! live Lease from the watch instead of reading the floor once per lease
//! duration, and needs no *read ahead* of the leases it follows.
//!
//! Started in place of the holder's first periodic read of its floor, a
//! lease duration after its term start wrote or read the floor: out of
//! the way of the term start, whose requests would otherwise wait for a
//! new connection (a store that only follows keeps one spare, see
//! [`ahead`](super::ahead)).
//!
//! Only a cache: nothing decides on it that a stale floor could make
//! wrong. Without `list` and `watch` on ConfigMaps (an older Role), or
//! while the watch is down, the store falls back to reading: each holder
//! reads its floor once per lease duration, and a follower reads its
//! leases' floors ahead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};

use super::{FLOOR_LEASE_ANNOTATION, Floors};
use crate::store::kube::ROLE_LABEL;
use crate::store::kube::requests::map_error;
use crate::store::kube::watch::{Follower, LiveTimings, WatchConfig};
use crate::store::{ANY_LEASE, StoreError};

/// The label value of every floor ConfigMap.
pub(super) const FLOOR_ROLE: &str = "term-floor";

/// The shortest pause before the floors are listed again after an error.
const MIN_PAUSE: Duration = Duration::from_secs(5);

/// The floor watch of one store: its state, and the end of its task when
/// the store is gone.
#[derive(Default)]
pub(super) struct FloorWatch {
    state: Arc<State>,
    /// Set when the task starts; dropped with the store (the task's copy
    /// has none), which ends the task.
    alive: std::sync::OnceLock<tokio::sync::oneshot::Sender<()>>,
}

/// What the store and the watch's task share.
#[derive(Default)]
struct State {
    synced: AtomicBool,
    /// A refusal (403) was logged: said once.
    refused: AtomicBool,
}

impl Floors {
    /// Whether the floors seen are the floors as they are (the watch is in
    /// sync).
    pub(super) fn watched(&self) -> bool {
        self.watch.state.synced.load(Ordering::Acquire)
    }

    /// Starts the floor watch, once per store, in `runtime`.
    pub(in crate::store::kube) fn start_watch(
        &self,
        runtime: &tokio::runtime::Handle,
        timings: &Arc<LiveTimings>,
    ) {
        if self.watch.alive.get().is_some() {
            return;
        }
        let (alive, gone) = tokio::sync::oneshot::channel();
        if self.watch.alive.set(alive).is_err() {
            return;
        }
        let floors = Floors {
            ahead: Arc::default(),
            watch: Arc::new(FloorWatch {
                state: self.watch.state.clone(),
                alive: std::sync::OnceLock::new(),
            }),
            ..self.clone()
        };
        let timings = timings.clone();
        runtime.spawn(async move {
            tokio::select! {
                () = floors.follow_floors(timings) => {}
                _ = gone => {}
            }
        });
    }

    /// Lists and follows the floors, again after each error, for as long
    /// as the store lives.
    async fn follow_floors(&self, timings: Arc<LiveTimings>) {
        let resource = ApiResource::erase::<ConfigMap>(&());
        let api = self
            .api
            .other(|client| Api::namespaced_with(client, &self.namespace, &resource));
        let selector = std::collections::BTreeMap::from([(ROLE_LABEL.to_owned(), FLOOR_ROLE.to_owned())]);
        let config = WatchConfig {
            api,
            selector,
            timings: timings.clone(),
            watch_timeout_secs: None,
        };
        loop {
            let error = self.list_and_watch(&config).await;
            self.watch.state.synced.store(false, Ordering::Release);
            self.log(&error);
            tokio::time::sleep(timings.fallback_duration().max(MIN_PAUSE)).await;
        }
    }

    /// One run: lists the floors, then follows the watch until an error.
    async fn list_and_watch(&self, config: &WatchConfig) -> StoreError {
        let selector = format!("{ROLE_LABEL}={FLOOR_ROLE}");
        let bound = config.request_timeout();
        let listed =
            tokio::time::timeout(bound, self.api.list(&ListParams::default().labels(&selector))).await;
        let list = match listed {
            Err(_) => return self.unavailable(format!("listing the term floors timed out after {bound:?}")),
            Ok(Err(e)) => return map_error(ANY_LEASE, "list", e),
            Ok(Ok(list)) => list,
        };
        for object in &list.items {
            self.seen_object(object);
        }
        self.watch.state.synced.store(true, Ordering::Release);
        tracing::debug!(floors = list.items.len(), namespace = %self.namespace, "the term floors are listed; watching them");
        let from = list.metadata.resource_version.unwrap_or_default();
        let params = WatchParams::default().labels(&selector);
        let mut follower = Follower::new(config.clone(), params, ANY_LEASE, "the term floors' watch", from);
        loop {
            match follower.next().await {
                Err(e) => return e,
                Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                    if let Some(object) = config_map(object) {
                        self.seen_object(&object);
                    }
                }
                Ok(WatchEvent::Deleted(object)) => {
                    if let Some(lease) = config_map(object).as_ref().and_then(lease_of) {
                        self.forget(&lease);
                    }
                }
                Ok(WatchEvent::Bookmark(_) | WatchEvent::Error(_)) => {}
            }
        }
    }

    /// A floor ConfigMap as listed or watched, remembered (one garbled by
    /// hand is left to the reads, which report it).
    fn seen_object(&self, object: &ConfigMap) {
        let Some(lease) = lease_of(object) else { return };
        if let Ok(floor) = self.parse(&lease, object) {
            self.remember(&lease, &floor, Some(object));
        }
    }

    fn unavailable(&self, detail: String) -> StoreError {
        StoreError::Unavailable {
            lease: ANY_LEASE.into(),
            detail,
        }
    }

    /// Why the watch stopped: a refusal once at warn (the Role lacks
    /// `list` or `watch` on ConfigMaps), anything else at debug.
    fn log(&self, error: &StoreError) {
        if matches!(error, StoreError::Refused { .. }) {
            if !self.watch.state.refused.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    namespace = %self.namespace,
                    error = %error,
                    "cannot list and watch the term floors (ConfigMaps): each holder reads its \
                     lease's floor once per lease duration instead (deploy/kubernetes/role.yaml \
                     grants list and watch on configmaps)"
                );
            }
        } else {
            tracing::debug!(namespace = %self.namespace, error = %error, "the term floors' watch stopped; listing them again");
        }
    }
}

/// A watched object as a ConfigMap.
fn config_map(object: DynamicObject) -> Option<ConfigMap> {
    serde_json::to_value(object)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The lease a floor ConfigMap belongs to: its annotation.
fn lease_of(object: &ConfigMap) -> Option<String> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(FLOOR_LEASE_ANNOTATION)
        .cloned()
}
