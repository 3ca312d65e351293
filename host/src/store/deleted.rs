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
//!    backend with a floor can refuse a create that lost a race.

use std::collections::HashMap;
use std::sync::Mutex;

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
    /// The last record read or written, while it exists.
    last: Option<Versioned>,
    /// The record was deleted while held: its last state, under a
    /// [`TOMBSTONE`] version.
    tombstone: Option<Versioned>,
    /// How many times the tombstone got a new version.
    renewals: u64,
    /// The backend's create count when the tombstone was last dated.
    creates: Option<u64>,
    /// How many writes this store made (see [`DeletedRecords::writes`]).
    writes: u64,
    /// The record of this store's last write (compared by content: a
    /// deletion event may carry it under a version of the deletion's own).
    written: Option<LeaseRecord>,
    /// The tombstone is of this store's own last write.
    tombstone_ours: bool,
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
        self.with(lease, |m| {
            m.last = Some(written.clone());
            m.tombstone = None;
            m.writes += 1;
            m.written = Some(written.record.clone());
            m.highest = m.highest.max(written.record.term);
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
                m.last.clone().or_else(|| m.tombstone.clone())
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
                self.last = Some(current.clone());
                self.tombstone = None;
                return Some(current);
            }
            Found::Missing { last, floor, creates } => (last, floor, creates),
        };
        let last = last.or_else(|| self.last.take());
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
            Some(last) if self.tombstone.as_ref().is_none_or(|t| t.record != last.record) => {
                self.renewals = 0;
                self.creates = creates;
                self.tombstone_ours = self.written.as_ref() == Some(&last.record);
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
mod tests {
    use std::time::Duration;

    use super::*;

    fn v(version: &str, holder: Option<&str>, term: u64) -> Versioned {
        Versioned {
            version: version.into(),
            record: LeaseRecord {
                plugins: None,
                yielded: None,
                instance: None,
                holder: holder.map(str::to_owned),
                lease_duration: Duration::from_secs(10),
                acquire_time: None,
                renew_time: None,
                term,
            },
        }
    }

    fn missing(floor: Option<u64>, creates: Option<u64>) -> Found {
        Found::Missing {
            last: None,
            floor,
            creates,
        }
    }

    #[test]
    fn a_record_deleted_while_held_reads_as_one_tombstone_until_written_again() {
        let d = DeletedRecords::default();
        d.found("l", Found::Record(v("x-1", Some("a"), 3)));
        let t = d.found("l", missing(Some(3), Some(1))).unwrap();
        assert_eq!(t.version, "deleted@x-1");
        assert_eq!(t.record.holder(), Some("a"));
        // Read again: the same version, so readers keep their dates.
        assert_eq!(d.found("l", missing(Some(3), Some(1))), Some(t.clone()));
        assert_eq!(d.create_floor("l", "deleted@x-1").unwrap(), 3);
        assert!(d.create_floor("l", "deleted@x-0").unwrap_err().is_conflict());
        // Written again: a record, no tombstone.
        d.wrote("l", &v("y-1", Some("a"), 3));
        assert!(d.tombstone("l").is_none());
        assert!(d.create_floor("l", "deleted@x-1").is_err());
    }

    #[test]
    fn a_released_record_deleted_reads_as_its_floor_or_as_gone() {
        let d = DeletedRecords::default();
        d.found("l", Found::Record(v("x-1", None, 4)));
        let f = d.found("l", missing(Some(4), Some(1))).unwrap();
        assert_eq!(f.version, "deleted@term-4");
        assert_eq!((f.record.holder(), f.record.term), (None, 4));
        assert_eq!(d.create_floor("l", &f.version).unwrap(), 4);
        // A backend without a floor (Kubernetes): gone.
        let k = DeletedRecords::default();
        k.found("l", Found::Record(v("7", None, 4)));
        assert_eq!(k.found("l", missing(None, None)), None);
    }

    #[test]
    fn a_recreate_and_second_deletion_between_reads_dates_the_holder_again() {
        let d = DeletedRecords::default();
        d.found("l", Found::Record(v("x-1", Some("a"), 2)));
        let first = d.found("l", missing(Some(2), Some(1))).unwrap();
        let again = d.found("l", missing(Some(2), Some(2))).unwrap();
        assert_eq!(again.version, format!("{}+1", first.version));
        assert_eq!(again.record, first.record);
        assert_eq!(d.create_floor("l", &again.version).unwrap(), 2);
        // A higher term started since, by a write not seen here: its
        // holder is unknown and may lead, so the tombstone stands for it at
        // that term, dated anew (the create count moved too).
        let later = d.found("l", missing(Some(5), Some(3))).unwrap();
        assert_eq!(later.version, "deleted@x-1+2");
        assert_eq!((later.record.holder(), later.record.term), (Some("a"), 5));
        assert_eq!(d.create_floor("l", &later.version).unwrap(), 5);
        // The floor alone moving keeps the version: nothing was created.
        let still = d.found("l", missing(Some(6), Some(3))).unwrap();
        assert_eq!((still.version.as_str(), still.record.term), ("deleted@x-1+2", 6));
    }

    #[test]
    fn a_deletion_event_carries_the_last_state_and_is_learned_once() {
        let d = DeletedRecords::default();
        d.found("l", Found::Record(v("10", Some("a"), 1)));
        let by_read = d.found("l", missing(None, None)).unwrap();
        let by_event = d
            .found(
                "l",
                Found::Missing {
                    last: Some(v("10", Some("a"), 1)),
                    floor: None,
                    creates: None,
                },
            )
            .unwrap();
        assert_eq!(by_read, by_event, "one deletion, one version");
        // A deletion of a state this store never read (a foreign write,
        // then the delete): the event's state counts.
        let foreign = d
            .found(
                "l",
                Found::Missing {
                    last: Some(v("12", Some("b"), 2)),
                    floor: None,
                    creates: None,
                },
            )
            .unwrap();
        assert_eq!(foreign.version, "deleted@12");
        assert_eq!(foreign.record.holder(), Some("b"));
    }

    #[test]
    fn a_read_overtaken_by_an_own_write_reports_the_write() {
        let d = DeletedRecords::default();
        d.found("l", Found::Record(v("x-1", Some("a"), 1)));
        let ticket = d.ticket("l");
        d.wrote("l", &v("x-2", Some("a"), 1));
        let old = Found::Record(v("x-1", Some("a"), 1));
        assert_eq!(d.found_since("l", ticket, old).unwrap().version, "x-2");
        let ticket = d.ticket("l");
        let new = Found::Record(v("x-3", Some("b"), 2));
        assert_eq!(d.found_since("l", ticket, new).unwrap().version, "x-3");
    }

    #[test]
    fn reads_older_than_a_write_and_repeated_deletions_are_reported_safely() {
        let seen = DeletedRecords::default();
        let w = |version: &str, holder: Option<&str>| v(version, holder, 3);
        let none = |floor, creates| missing(Some(floor), Some(creates));
        // A read that began before this store's own write reports the write.
        let since = seen.ticket("l");
        seen.wrote("l", &w("x-2", Some("me")));
        assert_eq!(
            seen.found_since("l", since, Found::Record(w("x-1", Some("old")))),
            Some(w("x-2", Some("me")))
        );
        let since = seen.ticket("l");
        assert_eq!(
            seen.found_since("l", since, none(3, 1)).unwrap().version,
            "deleted@x-2"
        );
        // A read that began before the write reports it, not the deletion.
        let since = seen.ticket("l");
        seen.wrote("l", &w("y-1", Some("me")));
        assert_eq!(
            seen.found_since("l", since, none(3, 2)),
            Some(w("y-1", Some("me")))
        );
        // Deleted: one tombstone, reported again by every read, until the
        // backend counts another create (the record was written again and
        // deleted again between two reads): then a new version makes the
        // others date the holder's lease from that read.
        let since = seen.ticket("l");
        let first = seen.found_since("l", since, none(3, 2)).unwrap();
        assert_eq!(first.version, "deleted@y-1");
        assert_eq!(seen.found_since("l", since, none(3, 2)), Some(first.clone()));
        let renewed = seen.found_since("l", since, none(3, 3)).unwrap();
        assert_eq!(renewed.version, "deleted@y-1+1");
        assert_eq!(renewed.record, first.record);
        assert_eq!(seen.found_since("l", since, none(3, 3)), Some(renewed.clone()));
        assert_eq!(seen.create_floor("l", "deleted@y-1+1").unwrap(), 3);
        assert!(seen.create_floor("l", "deleted@y-1").is_err());
        assert_eq!(
            seen.found_since("l", since, none(3, 5)).unwrap().version,
            "deleted@y-1+2"
        );
        // A higher term started (and deleted) since: the tombstone of this
        // store's own write stays as it is (it writes it again in its own
        // term, which the backend refuses if another host wrote since)...
        let own = seen.found_since("l", since, none(4, 6)).unwrap();
        assert_eq!((own.version.as_str(), own.record.term), ("deleted@y-1+3", 3));
        assert_eq!(seen.create_floor("l", "deleted@y-1+3").unwrap(), 3);
        // ...while another store's stands for the newer term's unknown holder.
        let other = DeletedRecords::default();
        other.found("l", Found::Record(w("y-1", Some("me"))));
        let lifted = other.found("l", none(4, 6)).unwrap();
        assert_eq!((lifted.version.as_str(), lifted.record.term), ("deleted@y-1", 4));
        assert!(seen.create_floor("l", "deleted@y-1+2").is_err());
    }
}
