//! The etcd store's watching: one watch of the prefix's records per store,
//! shared by the streams of every lease watched.
//!
//! The shared watch lists the records, then watches from the revision after
//! the listing's; when its stream breaks it watches again from the revision
//! after the last event it delivered: no change is missed or delivered
//! twice. A watch from a revision compacted away is cancelled by the
//! server; the shared watch then lists again and delivers what changed. It
//! asks for a progress report every period and counts a watch that says
//! nothing for longer than the request timeout and a second after that as
//! dead: every lease's stream then ends with the error (their callers poll
//! and watch again, which starts a new shared watch).
//!
//! A lease's stream starts with a read of the record and its *floor*, then
//! yields the record after each change delivered: never one older than the
//! store already knew (its own writes included), and, for a deletion, a
//! read of the floor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions};
use futures::stream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{EtcdStore, layout};
use crate::store::{ANY_LEASE, LeaseWatch, StoreError, Versioned};

/// What the shared watch hands a lease's stream: the newest change not yet
/// taken, or the error that ended the shared watch.
#[derive(Clone, Debug, Default)]
enum Signal {
    #[default]
    Nothing,
    Change(Arc<Change>),
    Broken(StoreError),
}

/// A change of a record.
#[derive(Debug)]
struct Change {
    /// The revision of the change.
    revision: i64,
    /// The record after it; `None`: deleted.
    kv: Option<KeyValue>,
    /// The record before a deletion, if known.
    prev: Option<KeyValue>,
}

/// The store's one watch and the leases it feeds.
#[derive(Default)]
pub(super) struct SharedWatch {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, watch::Sender<Signal>>,
    /// The running watch: its generation.
    run: Option<u64>,
    generation: u64,
}

impl SharedWatch {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver of `lease`'s changes from now on, and the shared watch
    /// started if it does not run.
    fn register(self: &Arc<Self>, store: &EtcdStore, lease: &str) -> watch::Receiver<Signal> {
        let mut state = self.state();
        let rx = match state.routes.get(lease) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(Signal::Nothing);
                state.routes.insert(lease.to_owned(), tx);
                rx
            }
        };
        if state.run.is_none() {
            state.generation += 1;
            let generation = state.generation;
            state.run = Some(generation);
            let (shared, store) = (self.clone(), store.clone());
            tokio::spawn(async move {
                let error = follow(&store, &shared, generation).await;
                shared.end(generation, error);
            });
        }
        rx
    }

    /// Hands `change` to `lease`'s stream, if it is watched.
    fn deliver(&self, lease: &str, change: Change) {
        if let Some(tx) = self.state().routes.get(lease) {
            tx.send_replace(Signal::Change(Arc::new(change)));
        }
    }

    /// The watched leases; forgets those no stream watches any more.
    fn watched(&self) -> Vec<String> {
        let mut state = self.state();
        state.routes.retain(|_, tx| tx.receiver_count() > 0);
        state.routes.keys().cloned().collect()
    }

    /// Whether the shared watch of `generation` is still the store's.
    fn current(&self, generation: u64) -> bool {
        self.state().run == Some(generation)
    }

    /// Ends the running shared watch, if any: every stream hears `error`.
    pub(super) fn break_off(&self, error: StoreError) {
        let run = self.state().run;
        if let Some(generation) = run {
            self.end(generation, Some(error));
        }
    }

    /// The shared watch of `generation` ended: every stream hears `error`
    /// (none if no lease is watched any more).
    fn end(&self, generation: u64, error: Option<StoreError>) {
        let mut state = self.state();
        if state.run != Some(generation) {
            return;
        }
        state.run = None;
        let routes = std::mem::take(&mut state.routes);
        drop(state);
        if let Some(error) = error {
            tracing::debug!(%error, "the etcd store's watch ended");
            for (lease, tx) in routes {
                tx.send_replace(Signal::Broken(error.clone().about(&lease)));
            }
        }
    }
}

/// The lease a record's key names, under the store's prefix.
fn lease_of(prefix: &str, key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    Some(key.strip_prefix(&layout::leases_prefix(prefix))?.to_owned())
}

/// Lists, then watches (again from the next revision whenever the stream
/// breaks, and after a listing when compacted past) until the watch fails
/// or no lease is watched: the error, if it failed.
async fn follow(store: &EtcdStore, shared: &SharedWatch, generation: u64) -> Option<StoreError> {
    let inner = &store.inner;
    let prefix = layout::leases_prefix(&inner.prefix);
    loop {
        let keys = prefix.clone();
        let mark = inner.mark();
        let request = inner.route.send(move |c| async move {
            c.kv_client()
                .get(keys, Some(GetOptions::new().with_prefix()))
                .await
        });
        let listed = inner
            .bounded(ANY_LEASE, "list the records to watch", request)
            .await;
        let mut listed = match listed {
            Ok(listed) => listed,
            Err(e) => return Some(e),
        };
        inner.observe(listed.header(), mark);
        if !shared.current(generation) {
            return None;
        }
        let revision = listed.header().map_or(0, |h| h.revision());
        let mut present: HashMap<String, KeyValue> = HashMap::new();
        for kv in listed.take_kvs() {
            if let Some(lease) = lease_of(&inner.prefix, kv.key()) {
                present.insert(lease, kv);
            }
        }
        // Each watched lease's state as listed: the changes a stream's own
        // first read did not see, or a compaction hid (each stream passes
        // on only what is newer than it knew).
        for lease in shared.watched() {
            let kv = present.remove(&lease);
            let revision = kv.as_ref().map_or(revision, KeyValue::mod_revision);
            shared.deliver(
                &lease,
                Change {
                    revision,
                    kv,
                    prev: None,
                },
            );
        }
        match watch_from(store, shared, generation, &prefix, revision + 1).await {
            Ok(Compacted::Yes) => continue,
            Ok(Compacted::Unwatched) => return None,
            Err(e) => return Some(e),
        }
    }
}

/// How a watch ended without an error.
enum Compacted {
    /// The server compacted past the revision to watch from.
    Yes,
    /// No lease is watched any more, or the watch was superseded.
    Unwatched,
}

/// Delivers the changes of one of the watch's answers, moving `next` past
/// them; how the watch ends, if the answer ends it.
async fn take(
    store: &EtcdStore,
    shared: &SharedWatch,
    answer: &etcd_client::WatchResponse,
    next: &mut i64,
) -> Option<Result<Compacted, StoreError>> {
    let inner = &store.inner;
    let now = answer
        .header()
        .map_or(*next - 1, etcd_client::ResponseHeader::revision);
    if answer.created() && now < *next - 1 && went_back(store, *next - 1).await {
        return Some(Err(StoreError::Unavailable {
            lease: ANY_LEASE.into(),
            detail: format!(
                "the etcd cluster went back to revision {now}, before {}: watching afresh",
                *next - 1
            ),
        }));
    }
    if answer.canceled() {
        if answer.compact_revision() > 0 {
            tracing::info!(
                from = *next,
                compacted = answer.compact_revision(),
                "the etcd store's watch was compacted past: listing again"
            );
            return Some(Ok(Compacted::Yes));
        }
        return Some(Err(StoreError::Unavailable {
            lease: ANY_LEASE.into(),
            detail: format!("the watch was cancelled: {}", answer.cancel_reason()),
        }));
    }
    for event in answer.events() {
        let Some(kv) = event.kv() else { continue };
        *next = (*next).max(kv.mod_revision() + 1);
        let Some(lease) = lease_of(&inner.prefix, kv.key()) else {
            continue;
        };
        let change = match event.event_type() {
            EventType::Put => Change {
                revision: kv.mod_revision(),
                kv: Some(kv.clone()),
                prev: None,
            },
            EventType::Delete => Change {
                revision: kv.mod_revision(),
                kv: None,
                prev: event.prev_kv().cloned(),
            },
        };
        shared.deliver(&lease, change);
    }
    None
}

/// Watches the records from `next` on, delivering each change, and again
/// from the revision after the last one whenever the stream ends.
async fn watch_from(
    store: &EtcdStore,
    shared: &SharedWatch,
    generation: u64,
    prefix: &str,
    mut next: i64,
) -> Result<Compacted, StoreError> {
    let inner = &store.inner;
    let mut resumed = false;
    loop {
        if resumed {
            // Not in a tight loop if the server keeps ending the stream.
            tokio::time::sleep(Duration::from_millis(100)).await;
            tracing::debug!(from = next, "the etcd store's watch stream ended: watching again");
        }
        resumed = true;
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_progress_notify()
            .with_start_revision(next);
        // The member the stream is on: a silence moves the store on.
        let mut attempt = inner
            .route
            .attempt()
            .await
            .map_err(|e| super::map_error(ANY_LEASE, "watch", e))?;
        let mut client = attempt.client().watch_client();
        let mut stream = inner
            .bounded(ANY_LEASE, "watch", client.watch(prefix, Some(options)))
            .await?;
        attempt.succeeded();
        let member = attempt.index();
        drop(attempt);
        let period = inner.request_timeout().max(Duration::from_millis(500));
        let silence = period + inner.request_timeout() + Duration::from_secs(1);
        let mut heard = Instant::now();
        let mut ask = tokio::time::interval(period);
        ask.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = stream.message() => {
                    let answer = match message {
                        Ok(Some(answer)) => answer,
                        // The stream ended: watch again from `next`.
                        Ok(None) | Err(_) => {
                            inner.route.failed(member);
                            break;
                        }
                    };
                    heard = Instant::now();
                    if let Some(end) = take(store, shared, &answer, &mut next).await {
                        return end;
                    }
                }
                _ = ask.tick() => {
                    if !shared.current(generation) || shared.watched().is_empty() {
                        return Ok(Compacted::Unwatched);
                    }
                    if heard.elapsed() > silence {
                        inner.route.failed(member);
                        return Err(StoreError::Unavailable {
                            lease: ANY_LEASE.into(),
                            detail: format!("the watch said nothing for {}", crate::support::rounding::human(heard.elapsed())),
                        });
                    }
                    // Answered (with no events) when the watch is alive;
                    // not asked while events come (a leader's renewals).
                    if heard.elapsed() >= period {
                        let _ = stream.request_progress().await;
                    }
                }
            }
        }
    }
}

/// Whether the cluster went back from `reached`, a revision this store
/// saw, by a linearizable read (a watch's own header may come from a
/// member that lags).
async fn went_back(store: &EtcdStore, reached: i64) -> bool {
    let inner = &store.inner;
    let key = inner.prefix.clone();
    let mark = inner.mark().at_least(reached);
    let request = inner.route.send(move |c| async move {
        c.kv_client()
            .get(key, Some(GetOptions::new().with_count_only()))
            .await
    });
    match inner.bounded(ANY_LEASE, "read the revision", request).await {
        Ok(answer) => inner.observe(answer.header(), mark),
        Err(_) => false,
    }
}

/// A watch of `lease`: its state now, then after each change.
pub(super) async fn open(store: &EtcdStore, lease: &str) -> Result<LeaseWatch, StoreError> {
    let mut rx = store.inner.shared.register(store, lease);
    rx.borrow_and_update();
    let first = store.read(lease, true).await?;
    let stream = LeaseStream {
        store: store.clone(),
        lease: lease.to_owned(),
        rx,
        first: Some(first),
        done: false,
    };
    Ok(Box::pin(stream::unfold(stream, LeaseStream::next)))
}

/// One lease's stream; see the [module documentation](self).
struct LeaseStream {
    store: EtcdStore,
    lease: String,
    rx: watch::Receiver<Signal>,
    first: Option<Option<Versioned>>,
    done: bool,
}

type Observation = Result<Option<Versioned>, StoreError>;

impl LeaseStream {
    async fn next(mut self) -> Option<(Observation, LeaseStream)> {
        if let Some(first) = self.first.take() {
            return Some((Ok(first), self));
        }
        if self.done {
            return None;
        }
        loop {
            if self.rx.changed().await.is_err() {
                // The route was dropped: the shared watch ended without an
                // error for it.
                return None;
            }
            let signal = self.rx.borrow_and_update().clone();
            let observation = match signal {
                Signal::Nothing => continue,
                Signal::Broken(e) => {
                    self.done = true;
                    Err(e)
                }
                Signal::Change(change) => match self.changed(&change).await {
                    Some(observation) => observation,
                    None => continue,
                },
            };
            return Some((observation, self));
        }
    }

    /// What `change` makes of the lease, if it is news.
    async fn changed(&self, change: &Change) -> Option<Observation> {
        let (inner, lease) = (&self.store.inner, self.lease.as_str());
        if !inner.advance(lease, change.revision) {
            return None;
        }
        let Some(kv) = &change.kv else {
            let last = change
                .prev
                .as_ref()
                .and_then(|kv| inner.decoded(lease, kv, 0).ok());
            return Some(self.store.read_after(lease, true, last).await);
        };
        let floor = inner
            .recent()
            .get(lease)
            .and_then(|r| r.floor.flatten())
            .unwrap_or(0);
        Some(inner.decoded(lease, kv, floor).map(|v| {
            inner.remember(lease, &v.version, Arc::from(kv.value()), change.revision);
            inner.seen.found(lease, crate::store::deleted::Found::Record(v))
        }))
    }
}
