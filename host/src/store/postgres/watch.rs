//! The PostgreSQL store's watching: one `LISTEN` per store, on a
//! connection of its own, shared by the streams of every lease watched.
//!
//! Every change of a record notifies the schema's channel (by the trigger,
//! whoever wrote): the row itself when it fits in a notification, else
//! its name. Notifications sent while the connection was down are lost,
//! so after it (re)connects the shared watch reads every watched lease
//! afresh. A connection that says nothing for a period is asked a query;
//! one that does not answer within the request timeout is dropped, and
//! every stream ends with the error (its caller reads and watches again).
//!
//! Before relying on notifications the store sends one to itself from
//! another connection: a pooler in transaction mode (PgBouncer) does not
//! deliver them. If it does not arrive the store says so and polls the
//! watched leases every poll interval instead, as with `watch = "poll"`.
//!
//! A lease's stream starts with a read, then yields the record after each
//! change heard: never one older than the store already knew (its write
//! counter), its own writes included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;
use tokio_postgres::types::Type;

use super::reads::{LeaseRows, RecordRow};
use super::schema::channel;
use super::{PostgresStore, WatchMode, map_error};
use crate::store::deleted::Found;
use crate::store::{ANY_LEASE, LeaseWatch, StoreError, Versioned};

/// What the shared watch hands a lease's stream.
#[derive(Clone, Debug, Default)]
enum Signal {
    #[default]
    Nothing,
    Change(Arc<Change>),
    Broken(StoreError),
}

/// A change heard.
#[derive(Debug)]
enum Change {
    /// The lease as read (after a reconnect, or polling).
    Rows(LeaseRows),
    /// A record written, from its notification.
    Row { seq: i64, row: RecordRow },
    /// Something changed at `seq` that the notification did not carry (a
    /// deletion, a record too long): read it.
    Read { seq: i64 },
}

/// The store's one watch and the leases it feeds.
#[derive(Default)]
pub(super) struct SharedWatch {
    state: Mutex<State>,
    /// Notifications were found not to arrive: poll.
    polling: AtomicBool,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, watch::Sender<Signal>>,
    run: Option<u64>,
    generation: u64,
}

impl SharedWatch {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver of `lease`'s changes from now on, and the shared watch
    /// started if it does not run.
    fn register(self: &Arc<Self>, store: &PostgresStore, lease: &str) -> watch::Receiver<Signal> {
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

    fn end(&self, generation: u64, error: Option<StoreError>) {
        let mut state = self.state();
        if state.run != Some(generation) {
            return;
        }
        state.run = None;
        let routes = std::mem::take(&mut state.routes);
        drop(state);
        if let Some(error) = error {
            tracing::debug!(%error, "the postgres store's watch ended");
            for (lease, tx) in routes {
                tx.send_replace(Signal::Broken(error.clone().about(&lease)));
            }
        }
    }
}

/// Listens (or polls) until the watch fails or no lease is watched: the
/// error, if it failed.
async fn follow(store: &PostgresStore, shared: &SharedWatch, generation: u64) -> Option<StoreError> {
    let inner = &store.inner;
    if inner.options.watch == WatchMode::Poll || shared.polling.load(Ordering::Relaxed) {
        return poll(store, shared, generation).await;
    }
    let bound = inner
        .connector
        .config
        .get_connect_timeout()
        .copied()
        .unwrap_or_default()
        + inner.request_timeout();
    let what = format!("listen on {}", inner.connector.describe);
    let connected =
        tokio::time::timeout(bound, inner.connector.config.connect(inner.connector.tls.clone())).await;
    let (client, connection) = match connected {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Some(map_error(ANY_LEASE, &what, e)),
        Err(_) => return Some(super::timed_out(ANY_LEASE, &what, bound)),
    };
    let mut heard = notifications(connection);
    let listen = format!("LISTEN {}", super::schema::quoted(&channel(&inner.schema)));
    if let Err(e) = bounded(inner.request_timeout(), client.batch_execute(&listen)).await {
        return Some(e);
    }
    match probe(store, &mut heard).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(
                database = %inner.connector.describe,
                "notifications sent to the PostgreSQL store's channel do not arrive (a pooler in \
                 transaction mode, such as PgBouncer's, does not pass them on): polling the leases \
                 instead; connect the store to the server or a pooler in session mode \
                 (docs/postgres.md#poolers)"
            );
            shared.polling.store(true, Ordering::Relaxed);
            return poll(store, shared, generation).await;
        }
        Err(e) => return Some(e),
    }
    if let Err(e) = catch_up(store, shared).await {
        return Some(e);
    }
    listen_on(store, shared, generation, &client, &mut heard).await
}

/// Delivers what the notifications say until the connection fails or no
/// lease is watched.
async fn listen_on(
    store: &PostgresStore,
    shared: &SharedWatch,
    generation: u64,
    client: &tokio_postgres::Client,
    heard: &mut mpsc::UnboundedReceiver<Result<String, String>>,
) -> Option<StoreError> {
    let inner = &store.inner;
    let period = inner.request_timeout().max(Duration::from_millis(500));
    let mut last = Instant::now();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = heard.recv() => match message {
                Some(Ok(payload)) => {
                    last = Instant::now();
                    take(shared, &payload);
                }
                Some(Err(e)) => return Some(StoreError::Unavailable { lease: ANY_LEASE.into(), detail: format!("the watch's connection: {e}") }),
                None => return Some(StoreError::Unavailable { lease: ANY_LEASE.into(), detail: "the watch's connection closed".into() }),
            },
            _ = tick.tick() => {
                if !shared.current(generation) || shared.watched().is_empty() {
                    return None;
                }
                // Not asked while notifications come (a leader's renewals).
                if last.elapsed() >= period {
                    if let Err(e) = bounded(inner.request_timeout(), client.simple_query("SELECT 1")).await {
                        return Some(e);
                    }
                    last = Instant::now();
                }
            }
        }
    }
}

/// Reads the watched leases every poll interval until that fails or no
/// lease is watched.
async fn poll(store: &PostgresStore, shared: &SharedWatch, generation: u64) -> Option<StoreError> {
    loop {
        if let Err(e) = catch_up(store, shared).await {
            return Some(e);
        }
        tokio::time::sleep(store.inner.options.poll_interval).await;
        if !shared.current(generation) || shared.watched().is_empty() {
            return None;
        }
    }
}

/// Reads every watched lease and hands each its rows (each stream passes
/// on only what is newer than it knew).
async fn catch_up(store: &PostgresStore, shared: &SharedWatch) -> Result<(), StoreError> {
    let watched = shared.watched();
    if watched.is_empty() {
        return Ok(());
    }
    for (lease, rows) in store.read_many(&watched).await? {
        shared.deliver(&lease, Change::Rows(rows));
    }
    Ok(())
}

/// Sends a notification from a pooled connection and waits for it on the
/// watch's: whether it arrived within the request timeout. Others heard
/// meanwhile are kept for the watch.
async fn probe(
    store: &PostgresStore,
    heard: &mut mpsc::UnboundedReceiver<Result<String, String>>,
) -> Result<bool, StoreError> {
    let inner = &store.inner;
    let id = format!("{:016x}", rand::random::<u64>());
    let payload = serde_json::json!({ "probe": id }).to_string();
    let chan = channel(&inner.schema);
    let bound = inner.request_timeout();
    inner
        .on_connection(ANY_LEASE, "notify the watch", Some(bound), async |c| {
            c.execute_typed(
                "SELECT pg_notify($1, $2)",
                &[(&chan, Type::TEXT), (&payload, Type::TEXT)],
            )
            .await
        })
        .await?;
    let deadline = Instant::now() + bound.max(Duration::from_secs(1));
    loop {
        match tokio::time::timeout_at(deadline, heard.recv()).await {
            Err(_) => return Ok(false),
            Ok(None) => {
                return Err(StoreError::Unavailable {
                    lease: ANY_LEASE.into(),
                    detail: "the watch's connection closed".into(),
                });
            }
            Ok(Some(Err(e))) => {
                return Err(StoreError::Unavailable {
                    lease: ANY_LEASE.into(),
                    detail: format!("the watch's connection: {e}"),
                });
            }
            Ok(Some(Ok(p))) if p == payload => return Ok(true),
            // A change before the probe: the catch-up that follows reads it.
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// The notifications of `connection`, driven by a task of their own; ends
/// (after an error, if one broke it) when the connection does.
fn notifications<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
) -> mpsc::UnboundedReceiver<Result<String, String>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(Ok(n.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            }
        }
    });
    rx
}

/// Hands a notification's change to its lease's stream.
fn take(shared: &SharedWatch, payload: &str) {
    let Ok(n) = serde_json::from_str::<serde_json::Value>(payload) else {
        return;
    };
    let (Some(lease), Some(seq)) = (n["n"].as_str(), n["s"].as_i64()) else {
        return;
    };
    let timeline = n["t"].as_i64().and_then(|t| i32::try_from(t).ok()).unwrap_or(1);
    let change = match (n["v"].as_str(), n["r"].as_str()) {
        (Some(version), Some(json)) => Change::Row {
            seq,
            row: RecordRow {
                json: json.to_owned(),
                version: version.to_owned(),
                seq,
                timeline,
            },
        },
        _ => Change::Read { seq },
    };
    shared.deliver(lease, change);
}

async fn bounded<T>(
    bound: Duration,
    request: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(bound, request).await {
        Ok(r) => r.map_err(|e| map_error(ANY_LEASE, "the watch's connection", e)),
        Err(_) => Err(super::timed_out(ANY_LEASE, "the watch's connection", bound)),
    }
}

/// A watch of `lease`: its state now, then after each change.
pub(super) async fn open(store: &PostgresStore, lease: &str) -> Result<LeaseWatch, StoreError> {
    let mut rx = store.inner.shared.register(store, lease);
    rx.borrow_and_update();
    let first = store.read(lease, Some(store.inner.request_timeout())).await?;
    let stream = LeaseStream {
        store: store.clone(),
        lease: lease.to_owned(),
        rx,
        first: Some(first),
        done: false,
    };
    Ok(Box::pin(stream::unfold(stream, LeaseStream::next)))
}

struct LeaseStream {
    store: PostgresStore,
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
        match change {
            Change::Rows(rows) => {
                if !inner.advance(lease, rows.seq()) {
                    return None;
                }
                let ticket = inner.seen.ticket(lease);
                Some(inner.found(lease, ticket, rows.clone(), None))
            }
            Change::Row { seq, row } => {
                if !inner.advance(lease, *seq) {
                    return None;
                }
                inner.note_timeline(row.timeline);
                let floor = inner
                    .recent()
                    .get(lease)
                    .and_then(|r| r.meta.flatten())
                    .map_or(0, |(f, _)| f);
                Some(inner.decoded(lease, row, floor, row.timeline).map(|v| {
                    inner.remember(lease, &v.version, *seq);
                    inner.seen.found(lease, Found::Record(v))
                }))
            }
            Change::Read { seq } => {
                if !inner.advance(lease, *seq) {
                    return None;
                }
                Some(self.store.read(lease, Some(inner.request_timeout())).await)
            }
        }
    }
}
