//! Deleted records: what a store reports for a lease whose record is gone.
//!
//! This is the one implementation of the store contract's [deleted
//! records](super#deleted-records) rules; the embedded, Kubernetes and
//! memory stores each keep a [`DeletedRecords`] and pass it what their
//! backend found. The rules:
//!
//! 1. A store remembers the last record it read or wrote of each lease.
//! 2. A read that finds no record, where the last record remembered had a
//!    holder, reports a *tombstone*: that record, still held, under the
//!    version [`TOMBSTONE`]`<its version>`. Later reads report the same
//!    tombstone, so readers keep dating the holder's lease from when they
//!    first saw the deletion.
//! 3. If the backend counts how often the record was created, and the count
//!    moved between two reads that found nothing, the record was created
//!    and deleted again in between, and a reader may have missed it: the
//!    tombstone gets a new version (`+N`), so readers date the holder's
//!    lease anew.
//! 4. If the backend keeps the lease's highest term (its *floor*: given out
//!    or reserved), a missing record without a tombstone reads as released
//!    at that term, under [`TOMBSTONE`]`term-<floor>`, so terms are never
//!    reused (the floor is read as at least the highest term this store
//!    saw, in case the backend lost it); and a tombstone whose term is below the floor takes the floor
//!    as its term, unless it is of this store's own last write: a newer
//!    term may have been started since, by a write this store did not see,
//!    and its holder, unknown, is waited out as the tombstone's would be.
//! 5. Updating a tombstone (or the floor record) creates the record, if the
//!    store still reports that very version; the caller of the create
//!    passes the floor it was given ([`DeletedRecords::create_floor`]) so a
//!    backend with a floor can refuse a create that lost a race. A refused
//!    create over this store's own tombstone means another host wrote
//!    since: the tombstone then stands for that holder, as in rule 4.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{LeaseRecord, RELEASED_LEASE_DURATION, StoreError, TOMBSTONE, Versioned};

/// The version of a deleted lease's floor record, after [`TOMBSTONE`].
const FLOOR_VERSION: &str = "term-";

/// What a backend found where a lease's record should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The record.
    Record(Versioned),
    /// No record.
    Missing {
        /// The record's final state, if the backend knows it (a deletion
        /// event carries it); else the last one remembered is used.
        last: Option<Versioned>,
        /// The highest term the lease ever had, if the backend keeps it.
        floor: Option<u64>,
        /// How many times the record was ever created, if the backend
        /// counts (compared only for a change).
        creates: Option<u64>,
    },
}

/// What one store instance remembers of each lease; see the [module
/// documentation](self).
#[derive(Debug, Default)]
pub struct DeletedRecords {
    leases: Mutex<HashMap<String, Memory>>,
}

#[derive(Debug, Default)]
struct Memory {
    /// The last record read or written, while it exists (shared with
    /// `written`: a renewal copies its record once).
    last: Option<Arc<Versioned>>,
    /// The record was deleted while held: its last state, under a
    /// [`TOMBSTONE`] version.
    tombstone: Option<Versioned>,
    /// How many times the tombstone got a new version.
    renewals: u64,
    /// The backend's create count when the tombstone was last dated.
    creates: Option<u64>,
    /// How many writes this store made (see [`DeletedRecords::wrote`] and [`DeletedRecords::ticket`]).
    writes: u64,
    /// The record of this store's last write (compared by content: a
    /// deletion event may carry it under a version of the deletion's own).
    written: Option<Arc<Versioned>>,
    /// The tombstone is of this store's own last write.
    tombstone_ours: bool,
    /// The record of an own tombstone that another host's term overtook
    /// ([`DeletedRecords::create_refused`]): never taken for this store's
    /// own again.
    disowned: Option<LeaseRecord>,
    /// The highest term of any record read or written: a backend's floor
    /// is read as at least this (it may have lost its floor while the
    /// record lived).
    highest: u64,
}

/// Something a read found before this store's own write finished.
#[derive(Clone, Copy, Debug)]
pub struct ReadTicket(u64);

impl DeletedRecords {
    fn with<T>(&self, lease: &str, f: impl FnOnce(&mut Memory) -> T) -> T {
        // A panic while holding the lock leaves a consistent map (every
        // change is one assignment), so a poisoned lock is used as is.
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        // Without a new key for a lease already known (every call of a
        // renewal).
        if let Some(memory) = leases.get_mut(lease) {
            return f(memory);
        }
        f(leases.entry(lease.to_owned()).or_default())
    }

    /// Taken before a read whose answer may be overtaken by this store's
    /// own write (a read of a file, a watch read delivered later), and
    /// handed to [`DeletedRecords::found_since`].
    pub fn ticket(&self, lease: &str) -> ReadTicket {
        ReadTicket(self.with(lease, |m| m.writes))
    }

    /// This store wrote `written`.
    pub fn wrote(&self, lease: &str, written: &Versioned) {
        // Copied outside the lock.
        let written = Arc::new(written.clone());
        self.with(lease, |m| {
            m.last = Some(written.clone());
            m.tombstone = None;
            m.writes += 1;
            m.highest = m.highest.max(written.record.term);
            m.written = Some(written);
            m.disowned = None;
        });
    }

    /// A create over the tombstone `version` was refused as a conflict. If
    /// the tombstone is of this store's own write, another host wrote the
    /// lease since (the floor moved past it): the tombstone then stands for
    /// that unknown holder, as any other host's does. It gets a new
    /// version (readers date it anew, from now) without the instance (no
    /// process takes it for its own), and reads at the floor's term from
    /// the next read on. Without this, its holder would write its own
    /// record again, be refused, and read the same tombstone for ever.
    pub fn create_refused(&self, lease: &str, version: &str) {
        self.with(lease, |m| {
            if !m.tombstone_ours {
                return;
            }
            let Some(t) = m.tombstone.as_mut().filter(|t| t.version == version) else {
                return;
            };
            m.tombstone_ours = false;
            m.disowned = Some(t.record.clone());
            t.record.instance = None;
            m.renewals += 1;
            let base = t.version.split('+').next().unwrap_or_default().to_owned();
            t.version = format!("{base}+{}", m.renewals);
        });
    }

    /// What to report for `lease` after the backend found `found`.
    pub fn found(&self, lease: &str, found: Found) -> Option<Versioned> {
        self.with(lease, |m| m.report(found))
    }

    /// Like [`DeletedRecords::found`], for a read that began at `ticket`:
    /// if this store wrote since, the read may predate that write, and the
    /// write is reported instead (a later change is read again anyway).
    pub fn found_since(&self, lease: &str, ticket: ReadTicket, found: Found) -> Option<Versioned> {
        self.with(lease, |m| {
            if m.writes != ticket.0 {
                m.last.as_deref().cloned().or_else(|| m.tombstone.clone())
            } else {
                m.report(found)
            }
        })
    }

    /// Whether `version` is the tombstone this store reports for `lease`
    /// and it is of this store's own last write (its holder writes it again
    /// in its own term).
    pub fn is_own_tombstone(&self, lease: &str, version: &str) -> bool {
        self.with(lease, |m| {
            m.tombstone_ours && m.tombstone.as_ref().is_some_and(|t| t.version == version)
        })
    }

    /// The tombstone this store reports for `lease`, if any.
    pub fn tombstone(&self, lease: &str) -> Option<Versioned> {
        self.with(lease, |m| m.tombstone.clone())
    }

    /// For an update of `version`, a [`TOMBSTONE`] version: the highest
    /// term the create that replaces it must find (the floor the caller was
    /// shown), or a conflict if this store no longer reports that version.
    pub fn create_floor(&self, lease: &str, version: &str) -> Result<u64, StoreError> {
        let deleted = version.strip_prefix(TOMBSTONE).unwrap_or(version);
        let floor = match deleted.strip_prefix(FLOOR_VERSION) {
            Some(n) => n.parse().ok(),
            None => self.with(lease, |m| {
                m.tombstone
                    .as_ref()
                    .filter(|t| t.version == version)
                    .map(|t| t.record.term)
            }),
        };
        floor.ok_or_else(|| StoreError::Conflict {
            lease: lease.to_owned(),
            detail: format!("the deleted record ({version}) has changed since"),
        })
    }
}

impl Memory {
    fn report(&mut self, found: Found) -> Option<Versioned> {
        let (last, floor, creates) = match found {
            Found::Record(current) => {
                self.highest = self.highest.max(current.record.term);
                self.last = Some(Arc::new(current.clone()));
                self.tombstone = None;
                self.disowned = None;
                return Some(current);
            }
            Found::Missing { last, floor, creates } => (last, floor, creates),
        };
        let last = last.or_else(|| self.last.take().map(Arc::unwrap_or_clone));
        self.last = None;
        if let Some(last) = &last {
            self.highest = self.highest.max(last.record.term);
        }
        // A backend that keeps a floor may have lost it (a floor ConfigMap
        // deleted while the record lived): never below a term seen here.
        let floor = floor.map(|f| f.max(self.highest));
        match last {
            // A deletion not reported yet (the same one learned twice, a
            // read and then an event, keeps the version already reported).
            // Only a record with a holder leaves a tombstone.
            Some(last)
                if self.tombstone.as_ref().is_none_or(|t| t.record != last.record)
                    && self.disowned.as_ref() != Some(&last.record) =>
            {
                self.renewals = 0;
                self.creates = creates;
                self.tombstone_ours = self.written.as_ref().map(|w| &w.record) == Some(&last.record);
                self.tombstone = last.record.holder().is_some().then(|| Versioned {
                    version: format!("{TOMBSTONE}{}", last.version),
                    record: last.record,
                });
            }
            _ => {
                if let Some(t) = self
                    .tombstone
                    .as_mut()
                    .filter(|_| creates.is_some() && creates != self.creates)
                {
                    // Created (and deleted) again since the last read.
                    self.creates = creates;
                    self.renewals += 1;
                    let base = t.version.split('+').next().unwrap_or_default().to_owned();
                    t.version = format!("{base}+{}", self.renewals);
                }
            }
        }
        let floor = floor.unwrap_or(0);
        let ours = self.tombstone_ours;
        if let Some(t) = self.tombstone.as_mut().filter(|t| floor > t.record.term && !ours) {
            // A higher term may have been started since (or reserved), by a
            // write this store did not see (and may have been deleted
            // again). Its holder may still lead: the tombstone stands for
            // it, at that term, and is waited out like any holder. (The
            // store whose own record it is keeps it as it is: it writes it
            // again in its own term, and the store refuses that if the
            // floor says another host wrote since.)
            t.record.term = floor;
        }
        self.tombstone
            .clone()
            .or_else(|| (floor > 0).then(|| floor_record(floor)))
    }
}

/// How a deleted lease whose highest term was `floor` reads: released, at
/// that term. Updating it is a create.
pub fn floor_record(floor: u64) -> Versioned {
    Versioned {
        version: format!("{TOMBSTONE}{FLOOR_VERSION}{floor}"),
        record: LeaseRecord {
            plugins: None,
            yielded: None,
            host: None,
            instance: None,
            holder: None,
            lease_duration: RELEASED_LEASE_DURATION,
            acquire_time: None,
            renew_time: None,
            term: floor,
        },
    }
}

#[cfg(test)]
mod tests;
