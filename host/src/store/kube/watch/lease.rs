//! One lease's stream of observations, fed by the shared watch while its
//! Lease carries the labels, and by a watch of its own (field selector on
//! its name) while it does not, or does not exist.

use std::sync::Arc;

use kube::api::{DynamicObject, ListParams, WatchEvent, WatchParams};

use super::demux::Delivery;
use super::follower::Follower;
use super::shared::Registration;
use super::{Confirmed, selects};
use crate::store::kube::Inner;
use crate::store::kube::requests::{field_selector, map_error, slim};
use crate::store::{StoreError, Versioned};
use crate::support::rounding::human;

/// What a lease watch yields: the lease's record (`None`: no record), or
/// the error that ends the stream.
type Observation = Result<Option<Versioned>, StoreError>;

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
pub(in crate::store::kube) struct LeaseStream {
    inner: Arc<Inner>,
    lease: String,
    /// Held in both modes: the shared watch runs while the store watches
    /// anything.
    registration: Registration,
    mode: Mode,
    /// What to yield next: an observation, and the resourceVersion it is
    /// as of (to tell whether the caller has learned something newer).
    first: Option<(Observation, String)>,
    /// The version last yielded: an event of the same version is not news.
    yielded: Option<String>,
    /// The stream has ended with an error.
    done: bool,
}

impl LeaseStream {
    /// A watch of `lease`: joined, with its first observation ready, and
    /// any watch request it needs started, so that the caller's bound
    /// covers them and a refusal (RBAC) surfaces here.
    pub(in crate::store::kube) async fn open(
        inner: Arc<Inner>,
        lease: &str,
    ) -> Result<LeaseStream, StoreError> {
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
                self.first = Some(self.accepted(obj));
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
            .find(|o| o.metadata.name.as_deref() == Some(self.lease.as_str()))
            .map(|mut o| {
                slim(&mut o);
                o
            });
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
                self.first = Some(self.accepted(Arc::new(obj)));
                self.mode = Mode::Shared;
            }
            Confirmed::Unselected(obj) => {
                tracing::debug!(lease = %self.lease, "the Lease lacks baton's labels: watching it on its own until it has them again");
                self.first = Some(self.accepted(Arc::new(obj)));
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
    fn accepted(&self, obj: Arc<DynamicObject>) -> (Observation, String) {
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        (self.inner.accept(&self.lease, obj).map(Some), rv)
    }

    /// Whether an object at `rv` is news: nothing newer was learned (by a
    /// read or a write of the caller's) and it was not yielded already.
    fn is_news(&self, rv: &str) -> bool {
        !self.inner.is_stale(&self.lease, rv) && self.yielded.as_deref() != Some(rv)
    }

    /// An event's object, accepted, if it is news.
    fn event(&mut self, obj: Arc<DynamicObject>) -> Option<Observation> {
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        if !self.is_news(&rv) {
            return None;
        }
        Some(self.inner.accept(&self.lease, obj).map(Some))
    }

    /// Hands `observation` out; an error ends the stream.
    fn yielding(mut self, observation: Observation) -> Option<(Observation, LeaseStream)> {
        match &observation {
            Ok(v) => self.yielded = v.as_ref().map(|v| v.version.clone()),
            Err(_) => self.done = true,
        }
        Some((observation, self))
    }

    /// A lease deleted (seen by the lease's own watch): reads its floor.
    async fn gone(&mut self, last: &DynamicObject) -> Observation {
        let rv = last.metadata.resource_version.clone().unwrap_or_default();
        let bound = self.inner.watch.request_timeout();
        tokio::time::timeout(bound, self.inner.deleted(&self.lease, Some(last), Some(&rv)))
            .await
            .unwrap_or_else(|_| {
                Err(self.unavailable(format!("reading the term floor timed out after {}", human(bound))))
            })
    }

    /// Whether the first observation, read at `rv`, is history: the
    /// caller learned something newer (by a read or a write) since the
    /// read, or this very version was yielded.
    fn is_history(&self, first: &Observation, rv: &str) -> bool {
        first.as_ref().is_ok_and(|v| {
            self.inner.is_stale(&self.lease, rv)
                || v.as_ref()
                    .is_some_and(|v| self.yielded.as_deref() == Some(v.version.as_str()))
        })
    }

    /// One step of the current mode: an observation to yield, if any.
    async fn step(&mut self) -> Option<Observation> {
        match &mut self.mode {
            Mode::Join => self.join().await.err().map(Err),
            Mode::Shared => self.shared_step().await,
            Mode::Own(follower) => {
                let event = follower.next().await;
                self.own_step(event).await
            }
        }
    }

    /// The next delivery of the shared watch, as an observation if it is
    /// news.
    async fn shared_step(&mut self) -> Option<Observation> {
        match self.registration.next().await {
            Err(e) => Some(Err(e)),
            Ok(Delivery::Object(obj)) => self.event(obj),
            // Deleted, or no longer carrying the labels: a read tells
            // (even for a stale event: the Lease may lack the labels
            // now, and the shared watch would not see its changes).
            Ok(Delivery::Deleted(obj)) => self.confirm(Some(Arc::unwrap_or_clone(obj))).await.err().map(Err),
        }
    }

    /// An event of the lease's own watch, as an observation if it is news.
    async fn own_step(
        &mut self,
        event: Result<WatchEvent<DynamicObject>, StoreError>,
    ) -> Option<Observation> {
        match event {
            Err(e) => Some(Err(e)),
            Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                // Carrying the labels again (baton's next write puts them
                // back): back to the shared watch.
                if selects(&self.inner.watch.selector, &obj) {
                    tracing::debug!(lease = %self.lease, "the Lease carries baton's labels again: back to the shared watch");
                    self.mode = Mode::Join;
                }
                self.event(Arc::new(obj))
            }
            Ok(WatchEvent::Deleted(obj)) => {
                let rv = obj.metadata.resource_version.clone().unwrap_or_default();
                if self.inner.is_stale(&self.lease, &rv) {
                    return None;
                }
                Some(self.gone(&obj).await)
            }
            Ok(WatchEvent::Bookmark(_) | WatchEvent::Error(_)) => None,
        }
    }
}

/// The stream's step: the next observation worth yielding.
pub(in crate::store::kube) async fn next_observation(
    mut s: LeaseStream,
) -> Option<(Observation, LeaseStream)> {
    loop {
        if s.done {
            return None;
        }
        if let Some((first, rv)) = s.first.take() {
            if s.is_history(&first, &rv) {
                continue;
            }
            return s.yielding(first);
        }
        if let Some(observation) = s.step().await {
            return s.yielding(observation);
        }
    }
}
