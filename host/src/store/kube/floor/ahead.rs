//! Reading a followed lease's *term floor* ahead of its next term (a
//! *read ahead*), so that the host that takes it over writes the floor, or
//! finds that it covers the term, without reading it first: one request
//! less in a hand-over (1.4 ms of 13.7 on the test API server;
//! docs/performance-journal.md, "One hand-over, request by request"). The
//! read also opens a connection beside the one that carries the watch,
//! which the hand-over then finds open if it comes within the client's
//! pool idle timeout (90 s).
//!
//! Safe by the argument that already lets a floor seen before decide
//! without a read: floors only grow, a floor covers a term only for the
//! Lease object it was raised on, and every write of a floor or a Lease is
//! a compare-and-swap on the version read. A floor read ahead can only be
//! stale; a stale one costs a conflict and a fresh read.
//!
//! Reads are paced ([`PACE`]) and made at most once per lease, Lease
//! object and term, only while the floors are not watched (a host that
//! holds a lease watches them: [`watch`](super::watch)) and this store
//! knows no floor for the lease or one below the term it sees (raised
//! since by another host).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;

use super::Floors;
use crate::store::kube::watch::LiveTimings;

/// The pause after each read ahead: at most 50 a second, so that a host
/// that starts following a thousand leases reads their floors over 20 s,
/// not all at once.
const PACE: Duration = Duration::from_millis(20);

/// The reads ahead asked for, and the queue of the task that makes them.
#[derive(Default)]
pub(super) struct Ahead {
    /// Per lease, the Lease object (uid) and term last asked for.
    asked: Mutex<HashMap<String, (String, u64)>>,
    /// Started by the first read asked for.
    queue: OnceLock<mpsc::UnboundedSender<String>>,
}

impl Floors {
    /// The Lease object `uid` of `lease` was seen at `term`: unless the
    /// floors are watched, if this store knows no floor for the lease, or
    /// one below `term`, reads it in the background, paced, at most once
    /// per object and term. Each read is bounded by the store's request
    /// timeout; a failed one is left to the next term start, which reads
    /// the floor as before.
    pub(in crate::store::kube) fn read_ahead(
        &self,
        lease: &str,
        term: u64,
        uid: Option<&str>,
        timings: &Arc<LiveTimings>,
    ) {
        let Some(uid) = uid else { return };
        // Watched, the floors seen are current: a read would tell nothing.
        if self.watched() || self.seen().get(lease).is_some_and(|kept| kept.floor.term >= term) {
            return;
        }
        // Outside a runtime (no task can run): nothing read ahead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut asked = self.ahead.asked.lock().unwrap_or_else(|e| e.into_inner());
            if asked.get(lease).is_some_and(|(u, t)| u == uid && *t == term) {
                return;
            }
            asked.insert(lease.to_owned(), (uid.to_owned(), term));
        }
        let queue = self
            .ahead
            .queue
            .get_or_init(|| self.start_reading(&runtime, timings.clone()));
        // The task ends only when every sender is gone.
        let _ = queue.send(lease.to_owned());
    }

    /// Spawns the task that reads the floors asked for, one at a time.
    fn start_reading(
        &self,
        runtime: &tokio::runtime::Handle,
        timings: Arc<LiveTimings>,
    ) -> mpsc::UnboundedSender<String> {
        let (queue, mut asked) = mpsc::unbounded_channel::<String>();
        // Shares the floors seen, not the queue: the task ends with the store.
        let reader = Floors {
            ahead: Arc::default(),
            ..self.clone()
        };
        runtime.spawn(async move {
            while let Some(lease) = asked.recv().await {
                // Watched since it was asked for: the floor seen is current.
                if reader.watched() {
                    continue;
                }
                let bound = timings.request_timeout();
                match tokio::time::timeout(bound, reader.fetch(&lease)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::debug!(%lease, error = %e, "cannot read the term floor ahead"),
                    Err(_) => tracing::debug!(%lease, "reading the term floor ahead timed out"),
                }
                tokio::time::sleep(PACE).await;
            }
        });
        queue
    }
}
