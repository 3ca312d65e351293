//! The store's bound on its requests in flight, and who goes first when
//! it is reached: renewals and releases of held leases, then the elector's
//! other requests and the shared watch, then everything else.
//!
//! Every request of a store goes through its one *request gate*
//! ([`RequestGate`]), by the [`Gated`] API that wraps kube's. The bound
//! adapts to the API server as TCP's window does: it starts at
//! [`MIN_LIMIT`], grows by one for each answer within half the request
//! timeout (doubling each round trip) until a request times out, then by
//! one a round trip, and halves, once a round trip, when a request times
//! out. A quarter of the places are kept for renewals, and background
//! requests take half at most. A request waits its turn within its
//! caller's bound, and one that waited over half the request timeout is
//! *shed*, not sent ([`Shed`]): whatever is sent has time to be answered,
//! and the server never works on answers nobody waits for. Without a
//! bound, a host starting 100 leases on a busy machine sent 500 requests
//! at once, all timed out, and no lease was led for minutes; the designs
//! tried and their figures are in docs/performance-journal.md ("A bound on
//! requests in flight").
//!
//! A request's [`Class`] is set for the task that makes it
//! ([`Class::scope`]); a request made outside any scope (a task of the
//! store's own, a listing for a status report) is [`Class::Background`].

use std::collections::VecDeque;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectList, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::support::rounding::human;

/// The bound a store starts with, and the lowest it goes: below it, slow
/// answers on a starved machine let too few requests through.
pub const MIN_LIMIT: usize = 16;

/// The highest bound.
pub const MAX_LIMIT: usize = 256;

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
pub struct RequestGate {
    state: Mutex<State>,
    /// The request timeout, read at each request (a reload may change it).
    timeout: Box<dyn Fn() -> Duration + Send + Sync>,
}

/// The bound, what is in flight and who waits.
struct State {
    /// The bound on requests in flight, [`MIN_LIMIT`] to [`MAX_LIMIT`].
    limit: f64,
    /// Growing by one per quick answer (doubling each round trip) until
    /// the first sign of congestion; by one a round trip after.
    slow_start: bool,
    /// When the bound was last halved: answers to requests sent before
    /// that do not halve it again.
    halved: Option<Instant>,
    /// Requests in flight, by [`Class`].
    in_flight: [usize; 3],
    /// Requests waiting for a place, by [`Class`], oldest first.
    waiting: [VecDeque<oneshot::Sender<()>>; 3],
}

impl State {
    fn new() -> State {
        State {
            limit: MIN_LIMIT as f64,
            slow_start: true,
            halved: None,
            in_flight: [0; 3],
            waiting: Default::default(),
        }
    }

    fn limit(&self) -> usize {
        self.limit as usize
    }

    /// Whether a request of `class` may go now.
    fn fits(&self, class: Class) -> bool {
        let limit = self.limit();
        let [hold, elect, background] = self.in_flight;
        let others = limit.saturating_sub((limit / 4).max(1));
        let room = hold + elect + background < limit;
        match class {
            Class::Hold => room,
            Class::Elect => room && elect + background < others,
            Class::Background => room && elect + background < others && background < (limit / 2).max(1),
        }
    }

    /// Lets waiters go while they fit, renewals first.
    fn grant(&mut self) {
        for class in [Class::Hold, Class::Elect, Class::Background] {
            while self.fits(class) {
                let Some(waiter) = self.waiting[class as usize].pop_front() else {
                    break;
                };
                // A waiter that gave up is passed over.
                if waiter.send(()).is_ok() {
                    self.in_flight[class as usize] += 1;
                }
            }
        }
    }

    /// A request of `class` sent at `sent` ended: answered after `took`,
    /// or (`None`) given up by its caller before the answer.
    fn ended(&mut self, class: Class, sent: Instant, took: Option<Duration>, timeout: Duration) {
        self.in_flight[class as usize] -= 1;
        match took {
            Some(took) if took <= timeout / 2 => {
                let step = if self.slow_start { 1.0 } else { 1.0 / self.limit };
                self.limit = (self.limit + step).min(MAX_LIMIT as f64);
            }
            Some(_) => {}
            // Cut by its caller: the server is busier than this bound
            // lets it be. Once a round trip: what was in flight then
            // tells of the old bound. (Slow answers alone do not halve
            // it: at the server's capacity they are the rule, and a
            // smaller bound would only answer fewer.)
            None if self.halved.is_none_or(|at| sent > at) => {
                self.limit = (self.limit / 2.0).max(MIN_LIMIT as f64);
                self.slow_start = false;
                self.halved = Some(Instant::now());
                tracing::debug!(
                    limit = self.limit(),
                    "requests to the API server time out: fewer in flight"
                );
            }
            None => {}
        }
        self.grant();
    }
}

/// A request that waited for its place longer than half the request
/// timeout, and was not sent: by the time the API server answered, its
/// caller would most likely have given up.
#[derive(Debug, thiserror::Error)]
#[error(
    "not sent: the host waited {} for a place in flight to the API server (now {limit}), over half the request timeout ({})",
    human(*.waited),
    human(*.timeout)
)]
pub struct Shed {
    waited: Duration,
    timeout: Duration,
    limit: usize,
}

/// A request's place in flight; dropping it frees the place and tells the
/// gate how the request went.
pub struct Admitted<'a> {
    gate: &'a RequestGate,
    class: Class,
    sent: Instant,
    /// How long the answer took; `None`: none came.
    answered: Option<Duration>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let timeout = (self.gate.timeout)();
        let mut state = self.gate.state();
        state.ended(self.class, self.sent, self.answered, timeout);
    }
}

/// A request waiting for its place: dropped before it took one (its
/// caller gave up), it hands back a place granted meanwhile.
struct Waiting<'a> {
    gate: &'a RequestGate,
    class: Class,
    granted: oneshot::Receiver<()>,
    taken: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        self.granted.close();
        if self.granted.try_recv().is_ok() {
            let mut state = self.gate.state();
            state.in_flight[self.class as usize] -= 1;
            state.grant();
        }
    }
}

impl RequestGate {
    /// A gate for requests bounded by `timeout()`.
    pub fn new(timeout: impl Fn() -> Duration + Send + Sync + 'static) -> RequestGate {
        RequestGate {
            state: Mutex::new(State::new()),
            timeout: Box::new(timeout),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change is complete under the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a request of `class` may go.
    pub async fn admit(&self, class: Class) -> Admitted<'_> {
        let waiting = {
            let mut state = self.state();
            if state.waiting[class as usize].is_empty() && state.fits(class) {
                state.in_flight[class as usize] += 1;
                None
            } else {
                let (tx, granted) = oneshot::channel();
                state.waiting[class as usize].push_back(tx);
                Some(Waiting {
                    gate: self,
                    class,
                    granted,
                    taken: false,
                })
            }
        };
        if let Some(mut waiting) = waiting {
            // Senders are dropped unsent only with the gate.
            let _ = (&mut waiting.granted).await;
            waiting.taken = true;
        }
        Admitted {
            gate: self,
            class,
            sent: Instant::now(),
            answered: None,
        }
    }

    /// Sends `request` once it is admitted, in the current task's class,
    /// unless it waited over half the request timeout for it.
    pub async fn send<T>(&self, request: impl Future<Output = kube::Result<T>>) -> kube::Result<T> {
        let asked = Instant::now();
        let mut admitted = self.admit(Class::current()).await;
        let timeout = (self.timeout)();
        let waited = asked.elapsed();
        if waited > timeout / 2 {
            // Not sent: no news of the server.
            admitted.answered = Some(timeout);
            let limit = self.state().limit();
            return Err(kube::Error::Service(Box::new(Shed {
                waited,
                timeout,
                limit,
            })));
        }
        let answer = request.await;
        admitted.answered = Some(admitted.sent.elapsed());
        answer
    }
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
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// Takes places of `class` while they fit; how many it took.
    fn fill(state: &mut State, class: Class) -> usize {
        let mut n = 0;
        while state.fits(class) {
            state.in_flight[class as usize] += 1;
            n += 1;
        }
        n
    }

    #[test]
    fn a_quarter_of_the_places_is_kept_for_renewals_and_half_at_most_goes_to_the_background() {
        let mut s = State::new();
        assert_eq!(fill(&mut s, Class::Background), 8);
        assert_eq!(fill(&mut s, Class::Elect), 4);
        assert_eq!(fill(&mut s, Class::Hold), 4);
        s.limit = 4.0;
        s.in_flight = [0; 3];
        assert_eq!(fill(&mut s, Class::Background), 2);
        assert_eq!(fill(&mut s, Class::Elect), 1);
        assert_eq!(fill(&mut s, Class::Hold), 1);
    }

    #[test]
    fn the_bound_grows_with_answers_and_halves_once_a_round_trip_when_none_comes() {
        let timeout = Duration::from_millis(1000);
        let mut s = State::new();
        let quick = Some(Duration::from_millis(500));
        let t0 = Instant::now();
        let end = |s: &mut State, class: Class, sent: Instant, took: Option<Duration>| {
            s.in_flight[class as usize] += 1;
            s.ended(class, sent, took, timeout);
        };
        for _ in 0..16 {
            end(&mut s, Class::Hold, t0, quick);
        }
        assert_eq!(
            s.limit(),
            32,
            "slow start: one more per answer within half the timeout"
        );
        end(&mut s, Class::Hold, t0, Some(Duration::from_millis(900)));
        assert_eq!(s.limit(), 32, "a slower answer: no change");
        end(&mut s, Class::Hold, t0, None);
        assert_eq!(s.limit(), 16, "no answer halves it");
        for _ in 0..17 {
            end(&mut s, Class::Elect, t0, quick);
        }
        assert_eq!(s.limit(), 17, "past slow start: one more a round trip");
        s.limit = 40.0;
        end(&mut s, Class::Hold, t0, None);
        assert_eq!(
            s.limit(),
            40,
            "a cut request sent before the halving does not halve it"
        );
        let later = Instant::now() + Duration::from_millis(1);
        end(&mut s, Class::Hold, later, None);
        assert_eq!(s.limit(), 20, "one sent after it does");
        for _ in 0..10 {
            s.halved = None;
            end(&mut s, Class::Background, t0, None);
        }
        assert_eq!(s.limit(), MIN_LIMIT);
    }

    async fn current() -> kube::Result<Class> {
        Ok(Class::current())
    }

    fn wait(gate: &Arc<RequestGate>, class: Class) -> tokio::task::JoinHandle<kube::Result<Class>> {
        let gate = gate.clone();
        tokio::spawn(class.scope(async move { gate.send(current()).await }))
    }

    /// Sets the bound (0: nothing goes) and lets waiters go.
    fn set_limit(gate: &RequestGate, limit: usize) {
        let mut state = gate.state();
        state.limit = limit as f64;
        state.grant();
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_goes_to_a_waiting_renewal_before_earlier_waiters() {
        let gate = Arc::new(RequestGate::new(|| HOUR));
        set_limit(&gate, 0);
        let background = wait(&gate, Class::Background);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let renewal = wait(&gate, Class::Hold);
        tokio::time::sleep(Duration::from_millis(1)).await;
        // One place, kept for renewals: the renewal has it, the earlier
        // background request waits on.
        set_limit(&gate, 1);
        assert_eq!(gate.state().in_flight, [1, 0, 0]);
        assert_eq!(gate.state().waiting[Class::Background as usize].len(), 1);
        assert_eq!(renewal.await.unwrap().unwrap(), Class::Hold);
        // Its quick answer makes room for another.
        assert_eq!(background.await.unwrap().unwrap(), Class::Background);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_leaves_no_place_taken() {
        let gate = Arc::new(RequestGate::new(|| HOUR));
        set_limit(&gate, 0);
        let gave_up = tokio::time::timeout(Duration::from_millis(5), gate.admit(Class::Elect)).await;
        assert!(gave_up.is_err());
        set_limit(&gate, 16);
        let state = gate.state();
        assert_eq!(state.in_flight, [0; 3]);
        assert!(state.waiting.iter().all(VecDeque::is_empty));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waited_over_half_the_timeout_is_not_sent() {
        let gate = Arc::new(RequestGate::new(|| Duration::from_secs(10)));
        set_limit(&gate, 0);
        let early = wait(&gate, Class::Background);
        tokio::time::sleep(Duration::from_secs(4)).await;
        set_limit(&gate, 16);
        assert!(early.await.unwrap().is_ok(), "waited 4 s of 10: sent");
        set_limit(&gate, 0);
        let late = wait(&gate, Class::Background);
        tokio::time::sleep(Duration::from_secs(6)).await;
        set_limit(&gate, 16);
        let shed = late.await.unwrap().unwrap_err().to_string();
        assert!(shed.contains("not sent") && shed.contains("6s"), "{shed}");
    }
}
