//! The store's bound on its requests in flight, and who goes first when
//! it is reached: renewals and releases of held leases, then the elector's
//! other requests and the shared watch, then everything else.
//!
//! Every request of a store goes through its one [`RequestGate`], by the
//! [`Gated`] API that wraps kube's: at most [`IN_FLIGHT`] are in flight,
//! at most [`ELECT_IN_FLIGHT`] of them other than renewals, at most
//! [`BACKGROUND_IN_FLIGHT`] of them background ones; a request waits its
//! turn within its caller's bound. So a host with many leases never offers
//! the API server more than it can answer within the request timeout: a
//! request that times out while it waits here cost the server nothing,
//! and [`IN_FLIGHT`] slots always serve whatever does get through.
//!
//! Without the bound a host starting 100 leases sent about 500 requests at
//! once (per lease: a listing, a floor read, a watch, an acquisition). On
//! a busy 2-core machine the API server answered them in 1 to 5 s, past
//! the 500 ms request timeout: every request timed out, was retried a
//! retry period later, and the server spent itself on answers nobody
//! waited for. No lease was led for minutes.
//!
//! A request's [`Class`] is set for the task that makes it
//! ([`Class::scope`]); a request made outside any scope (a task of the
//! store's own, a listing for a status report) is [`Class::Background`].

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectList, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{AcquireError, Semaphore, SemaphorePermit};

/// The most requests of one store in flight at once. On the test API
/// server (2 cores, loopback) a write takes 2 to 5 ms when the server is
/// idle: 16 in flight carry 3,000 to 8,000 a second, above what the server
/// answers (about 1,000 writes a second: docs/performance.md).
pub const IN_FLIGHT: usize = 16;

/// The most in flight other than renewals and releases: the other 4 are
/// kept for renewals, so a burst of acquisitions and reads never makes a
/// holder wait past its renew deadline.
pub const ELECT_IN_FLIGHT: usize = 12;

/// The most background requests in flight (watches started, listings,
/// term floors read ahead, plugins' buckets, pod labels).
pub const BACKGROUND_IN_FLIGHT: usize = 8;

tokio::task_local! {
    static CLASS: Class;
}

/// What a request is for, which decides its place in the [`RequestGate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A write that keeps or gives up a lease this host holds (a renewal,
    /// a release), and the reads it needs: what stands between a holder
    /// and its renew deadline.
    Hold,
    /// The elector's other requests (reads, acquisitions, creates,
    /// deletes, the claim gate's listing) and the shared watch's listing
    /// and start, which every lease watch of the store waits for.
    Elect,
    /// Everything else.
    Background,
}

impl Class {
    /// Runs `f` with its requests in this class.
    pub async fn scope<F: Future>(self, f: F) -> F::Output {
        CLASS.scope(self, f).await
    }

    /// The class of the current task's requests.
    fn current() -> Class {
        CLASS.try_with(|c| *c).unwrap_or(Class::Background)
    }
}

/// A store's bound on its requests in flight; see the [module
/// documentation](self).
#[derive(Debug)]
pub struct RequestGate {
    all: Semaphore,
    elect: Semaphore,
    background: Semaphore,
}

impl Default for RequestGate {
    fn default() -> RequestGate {
        RequestGate {
            all: Semaphore::new(IN_FLIGHT),
            elect: Semaphore::new(ELECT_IN_FLIGHT),
            background: Semaphore::new(BACKGROUND_IN_FLIGHT),
        }
    }
}

/// A request's place in flight; dropping it frees the place.
pub struct Admitted<'a> {
    _permits: [Option<SemaphorePermit<'a>>; 3],
}

impl RequestGate {
    /// Waits until a request of `class` may go. The permits are taken in
    /// one order (background, elect, all), so no two waiters deadlock.
    pub async fn admit(&self, class: Class) -> Admitted<'_> {
        let background = match class {
            Class::Background => Some(permit(self.background.acquire().await)),
            _ => None,
        };
        let elect = match class {
            Class::Hold => None,
            _ => Some(permit(self.elect.acquire().await)),
        };
        let all = permit(self.all.acquire().await);
        Admitted {
            _permits: [background, elect, Some(all)],
        }
    }

    /// Sends `request` once it is admitted, in the current task's class.
    pub async fn send<T>(&self, request: impl Future<Output = T>) -> T {
        let _admitted = self.admit(Class::current()).await;
        request.await
    }
}

fn permit(acquired: Result<SemaphorePermit<'_>, AcquireError>) -> SemaphorePermit<'_> {
    acquired.expect("the gate's semaphores are never closed")
}

/// kube's [`Api`] with every request through a [`RequestGate`].
pub struct Gated<K> {
    api: Api<K>,
    gate: Arc<RequestGate>,
}

impl<K: Clone> Clone for Gated<K> {
    fn clone(&self) -> Self {
        Gated {
            api: self.api.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<K> Gated<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + 'static,
{
    /// `api`'s requests through `gate`.
    pub fn new(api: Api<K>, gate: Arc<RequestGate>) -> Gated<K> {
        Gated { api, gate }
    }

    /// Another kind of object (in `namespace`) through the same client
    /// and gate.
    pub fn other<O: kube::Resource>(&self, api: impl FnOnce(kube::Client) -> Api<O>) -> Gated<O> {
        Gated {
            api: api(self.api.clone().into_client()),
            gate: self.gate.clone(),
        }
    }

    /// The URL of the objects, for logs.
    pub fn resource_url(&self) -> &str {
        self.api.resource_url()
    }

    /// [`Api::get_opt`].
    pub async fn get_opt(&self, name: &str) -> kube::Result<Option<K>> {
        self.gate.send(self.api.get_opt(name)).await
    }

    /// [`Api::list`].
    pub async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<K>> {
        self.gate.send(self.api.list(params)).await
    }

    /// [`Api::create`].
    pub async fn create(&self, params: &PostParams, object: &K) -> kube::Result<K>
    where
        K: Serialize,
    {
        self.gate.send(self.api.create(params, object)).await
    }

    /// [`Api::replace`].
    pub async fn replace(&self, name: &str, params: &PostParams, object: &K) -> kube::Result<K>
    where
        K: Serialize,
    {
        self.gate.send(self.api.replace(name, params, object)).await
    }

    /// [`Api::patch`].
    pub async fn patch<P: Serialize + Debug>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> kube::Result<K> {
        self.gate.send(self.api.patch(name, params, patch)).await
    }

    /// [`Api::delete`], without the answer's body.
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> kube::Result<()> {
        self.gate.send(self.api.delete(name, params)).await.map(drop)
    }

    /// [`Api::watch`]: in flight until the API server accepts the watch,
    /// not while its events stream.
    pub async fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<K>>>> {
        let events = self.gate.send(self.api.watch(params, version)).await?;
        Ok(events.boxed())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Holds `n` places of `class` until the returned sender is dropped.
    fn hold(gate: &Arc<RequestGate>, class: Class, n: usize) -> Vec<tokio::sync::oneshot::Sender<()>> {
        (0..n)
            .map(|_| {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let gate = gate.clone();
                tokio::spawn(async move {
                    let _in = gate.admit(class).await;
                    let _ = rx.await;
                });
                tx
            })
            .collect()
    }

    async fn admitted_within(gate: &RequestGate, class: Class) -> bool {
        tokio::time::timeout(Duration::from_millis(10), gate.admit(class))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn background_requests_leave_room_for_the_elector_and_renewals() {
        let gate = Arc::new(RequestGate::default());
        let _bg = hold(&gate, Class::Background, BACKGROUND_IN_FLIGHT + 5);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!admitted_within(&gate, Class::Background).await);
        assert!(admitted_within(&gate, Class::Elect).await);
        let _elect = hold(&gate, Class::Elect, 20);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!admitted_within(&gate, Class::Elect).await);
        // Four places are left for renewals, whatever waits.
        let _hold = hold(&gate, Class::Hold, IN_FLIGHT - ELECT_IN_FLIGHT - 1);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(admitted_within(&gate, Class::Hold).await);
        let _last = hold(&gate, Class::Hold, 1);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!admitted_within(&gate, Class::Hold).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_place_goes_to_a_waiter_and_the_class_follows_the_task() {
        let gate = Arc::new(RequestGate::default());
        let held = hold(&gate, Class::Background, BACKGROUND_IN_FLIGHT);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.send(async { Class::current() }).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            !waiting.is_finished(),
            "a background request waits when eight are in flight"
        );
        drop(held);
        assert_eq!(waiting.await.unwrap(), Class::Background);
        let class = Class::Hold.scope(gate.send(async { Class::current() })).await;
        assert_eq!(class, Class::Hold);
    }
}
