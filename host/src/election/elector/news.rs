//! What the elector learns of the lease (from its subscription and its own
//! reads), what it publishes, and how it reports store faults.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::decide::follower_status;
use super::{Elector, ElectorError};
use crate::election::report::StoreErrorKind;
use crate::election::status::{Status, YieldSeen};
use crate::election::term::Term;
use crate::store::subscription::Sighting;
use crate::store::{StoreError, Versioned};
use crate::support::recurring::Note;
use crate::support::rounding::human;

impl Elector {
    /// Takes the subscription's newest sighting, if there is one.
    pub(super) fn take_sighting(&mut self) {
        if let Some(s) = self.subscription.take_new() {
            self.learn(s.record, s.at);
            self.publish_follower();
        }
    }

    /// Records what this host learned of the record; the time it was seen
    /// only moves when the version changed.
    pub(super) fn learn(&mut self, record: Option<Versioned>, at: Instant) {
        self.heartbeat.answer();
        if let Some(r) = &record {
            self.known_term = self.known_term.max(r.record.term);
        }
        let changed = match &self.known {
            None => true,
            Some(k) => k.version() != record.as_ref().map(|v| v.version.as_str()),
        };
        if changed {
            let namesake = |k: Option<&Versioned>| {
                k.is_some_and(|v| v.record.held_by_namesake(&self.me.identity, &self.me.instance))
            };
            let before = namesake(self.known.as_ref().and_then(|k| k.record.as_ref()));
            // A tombstone (the record of a lease deleted while held) gets
            // versions of its own from the store that reads it: a deletion,
            // not a write by the namesake.
            let written = record
                .as_ref()
                .is_some_and(|v| !v.version.starts_with(crate::store::TOMBSTONE));
            if namesake(record.as_ref()) {
                if before && written {
                    // Written again by the other process: it is alive.
                    self.failure.get_or_insert(ElectorError::DuplicateIdentity {
                        lease: self.cfg.lease.clone(),
                        identity: self.me.identity.clone(),
                    });
                } else {
                    tracing::warn!(
                        lease = %self.cfg.lease,
                        identity = %self.me.identity,
                        "the lease is held by another process under this host's identity; waiting \
                         for its lease to run out (this one stops if the other renews it)"
                    );
                }
            }
            if let Some(y) = record.as_ref().and_then(|v| v.record.yielded.as_ref()) {
                let seen = YieldSeen {
                    by: y.by.clone(),
                    until: at + y.duration,
                };
                self.tx.send_if_modified(|view| {
                    view.yielded = Some(seen);
                    false
                });
            }
            self.known = Some(Sighting { record, at });
        }
    }

    /// Publishes a status, with its holder's address; observers wake only
    /// if either differs.
    pub(super) fn publish(&self, status: Status, term: Option<Arc<Term>>) {
        let lease = &self.cfg.lease;
        let since = self.clock.now();
        let observer = &self.observer;
        let address = self.holder_address(&status);
        self.tx.send_if_modified(|view| {
            let moved = view.holder_address != address;
            view.holder_address = address;
            if view.status == status {
                view.term = term;
                return moved;
            }
            observer.status_changed(&view.status, &status);
            tracing::info!(
                lease = %lease,
                role = %status.role,
                holder = status.holder.as_deref().unwrap_or(""),
                term = status.term,
                "lease status changed"
            );
            view.status = status;
            view.term = term;
            view.since = since;
            true
        });
    }

    /// The address of `status`'s holder: this host's own while it leads,
    /// else what the holder's record says.
    fn holder_address(&self, status: &Status) -> Option<String> {
        let holder = status.holder.as_deref()?;
        if status.is_leading() {
            return self.cfg.host.borrow().address.clone();
        }
        let record = &self.known.as_ref()?.record.as_ref()?.record;
        (record.holder() == Some(holder))
            .then(|| record.holder_address().map(str::to_owned))
            .flatten()
    }

    pub(super) fn publish_follower(&self) {
        let status = follower_status(self.known.as_ref(), &self.cfg.lease, &self.me, self.known_term);
        self.publish(status, None);
    }

    /// Reads the lease now (bounded by `limit`), dating the answer on
    /// arrival. `None` if it failed.
    pub(super) async fn read(&mut self, limit: Duration) -> Option<Option<Versioned>> {
        match timeout(limit, self.store.get(&self.cfg.lease)).await {
            Ok(Ok(record)) => {
                // A change is dated when we learn of it, never earlier: a
                // later date only makes this host wait longer.
                self.learn(record.clone(), Instant::now());
                self.trouble_over();
                Some(record)
            }
            Ok(Err(e)) => {
                self.store_fault("read", &e);
                None
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, timeout = %human(limit), "reading the lease timed out");
                None
            }
        }
    }

    /// A store fault met while trying to `doing` the lease. Met at every
    /// attempt while it lasts (a record that cannot be read is never
    /// overwritten, a refusal stays): said once, then recalled now and then.
    pub(super) fn store_fault(&mut self, doing: &str, e: &StoreError) {
        self.failed_request(StoreErrorKind::of(e));
        let lease = &self.cfg.lease;
        match self.trouble.note(&e.to_string(), Instant::now().into_std()) {
            Note::First => tracing::warn!(lease = %lease, error = %e, "cannot {doing} the lease"),
            Note::Reminder { repeats, since } => {
                tracing::warn!(lease = %lease, error = %e, repeats, since = %human(since), "still cannot {doing} the lease")
            }
            Note::Quiet => tracing::debug!(lease = %lease, error = %e, "cannot {doing} the lease"),
        }
    }

    /// A store request failed: the observer counts it.
    pub(super) fn failed_request(&self, kind: StoreErrorKind) {
        self.observer.store_error(&self.cfg.lease, kind);
    }

    /// The store answered: a lasting fault, if there was one, is over.
    pub(super) fn trouble_over(&mut self) {
        if let Some(lasted) = self.trouble.clear(Instant::now().into_std()) {
            tracing::info!(lease = %self.cfg.lease, lasted = %human(lasted), "the lease's store answers again");
        }
    }
}
