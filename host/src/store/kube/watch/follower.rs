//! One watch request at a time, resumed where the last one ended: the
//! request behind the shared watch and behind each lease watched on its
//! own.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{DynamicObject, WatchEvent, WatchParams};
use tokio::time::Instant;

use super::WatchConfig;
use crate::store::StoreError;
use crate::store::kube::requests::{map_error, rv_number, slim};
use crate::support::rounding::human;

/// A watch the server ended sooner than this after it started, without a
/// single event, is reported as an error (the elector then backs off)
/// instead of being resumed at once: no request storms.
const MIN_QUIET_WATCH: Duration = Duration::from_secs(1);

/// How long a watch may stay silent past its own server-side timeout (plus
/// the request timeout) before it is taken as dead: the server ends a watch
/// on time to the second, so this only covers rounding and a busy server.
const WATCH_SILENCE_ALLOWANCE: Duration = Duration::from_secs(1);

type Events = BoxStream<'static, Result<WatchEvent<DynamicObject>, kube::Error>>;

/// One watch request at a time, resumed from the last resourceVersion seen
/// when the server ends it; bookmarks keep that version current. Yields
/// the events that carry an object, and bookmarks.
pub(in crate::store::kube) struct Follower {
    config: WatchConfig,
    /// The selector (label or field) of every request.
    params: WatchParams,
    /// Named in errors: a lease, or [`ANY_LEASE`](crate::store::ANY_LEASE) for the shared watch.
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
    pub(in crate::store::kube) fn new(
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
    pub(super) async fn start(&mut self) -> Result<(), StoreError> {
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
            events,
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
    pub(super) fn advance(&mut self, rv: &str) {
        if moves_forward(&self.resource_version, rv) {
            self.resource_version = rv.to_owned();
        }
    }

    /// The next ADDED, MODIFIED, DELETED or BOOKMARK event, resuming the
    /// watch as needed; any error ends it (the caller drops the follower).
    pub(in crate::store::kube) async fn next(&mut self) -> Result<WatchEvent<DynamicObject>, StoreError> {
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
                Some(Ok(mut event)) => {
                    request.active = true;
                    match event {
                        WatchEvent::Bookmark(ref b) => {
                            self.advance(&b.metadata.resource_version);
                            return Ok(event);
                        }
                        WatchEvent::Error(status) => {
                            return Err(map_error(&self.lease, "watch", kube::Error::Api(status)));
                        }
                        WatchEvent::Added(ref mut obj)
                        | WatchEvent::Modified(ref mut obj)
                        | WatchEvent::Deleted(ref mut obj) => {
                            slim(obj);
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
pub(super) fn moves_forward(from: &str, to: &str) -> bool {
    if to.is_empty() {
        return false;
    }
    !matches!((rv_number(from), rv_number(to)), (Some(old), Some(new)) if new < old)
}
