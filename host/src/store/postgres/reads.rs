//! The PostgreSQL store's reads: a record with its meta in one statement,
//! many at once (the watch's catch-up and polling), and listings; and how
//! a row reads, promotions included.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::schema::TERMS_PER_TIMELINE;
use super::{BEFORE_PROMOTION, Inner, PostgresStore};
use crate::store::deleted::{Found, ReadTicket};
use crate::store::{ANY_LEASE, LeaseRecord, StoreError, Versioned};

/// A record's row as read.
#[derive(Clone, Debug)]
pub(super) struct RecordRow {
    pub(super) json: String,
    pub(super) version: String,
    pub(super) seq: i64,
    pub(super) timeline: i32,
}

/// A lease's meta row as read.
#[derive(Clone, Copy, Debug)]
pub(super) struct MetaRow {
    pub(super) floor: i64,
    pub(super) creates: i64,
    pub(super) seq: i64,
    pub(super) timeline: i32,
}

/// One lease as one statement read it.
#[derive(Clone, Debug)]
pub(super) struct LeaseRows {
    pub(super) record: Option<RecordRow>,
    pub(super) meta: Option<MetaRow>,
    /// The server's timeline when it was read.
    pub(super) now: i32,
}

/// The columns every read selects, after the lease's name (`n.name`).
const COLUMNS: &str = "l.record, l.version, l.seq, l.timeline, m.floor, m.creates, m.seq, m.timeline";

impl LeaseRows {
    /// The rows in `row`'s columns from `at` on ([`COLUMNS`], then the
    /// timeline).
    fn from_row(row: &Row, at: usize) -> LeaseRows {
        let record = row.get::<_, Option<String>>(at).map(|json| RecordRow {
            json,
            version: row.get(at + 1),
            seq: row.get(at + 2),
            timeline: row.get(at + 3),
        });
        let meta = row.get::<_, Option<i64>>(at + 4).map(|floor| MetaRow {
            floor,
            creates: row.get(at + 5),
            seq: row.get(at + 6),
            timeline: row.get(at + 7),
        });
        LeaseRows {
            record,
            meta,
            now: row.get(at + 8),
        }
    }

    /// The write counter of the lease's newest state.
    pub(super) fn seq(&self) -> i64 {
        let record = self.record.as_ref().map_or(0, |r| r.seq);
        record.max(self.meta.map_or(0, |m| m.seq))
    }
}

/// The lowest term a lease may start on timeline `tl` when its last write
/// was on an older one: above every term the older timelines gave out.
pub(super) fn term_base(tl: i32) -> u64 {
    u64::try_from(tl.max(1) - 1).unwrap_or(0) * TERMS_PER_TIMELINE
}

impl PostgresStore {
    /// Reads `lease`'s record and meta, as the store reports them
    /// (deleted records, floors and promotions applied); bounded by
    /// `bound` if given (the store's own requests).
    pub(super) async fn read(
        &self,
        lease: &str,
        bound: Option<Duration>,
    ) -> Result<Option<Versioned>, StoreError> {
        self.read_after(lease, bound, None).await
    }

    /// [`read`](Self::read), after a deletion whose last state was `last`.
    pub(super) async fn read_after(
        &self,
        lease: &str,
        bound: Option<Duration>,
        last: Option<Versioned>,
    ) -> Result<Option<Versioned>, StoreError> {
        let inner = &self.inner;
        let ticket = inner.seen.ticket(lease);
        let sql = format!(
            "SELECT {COLUMNS}, {s}.timeline() FROM (SELECT $1::text AS name) n \
             LEFT JOIN {s}.leases l ON l.name = n.name LEFT JOIN {s}.lease_meta m ON m.name = n.name",
            s = inner.s
        );
        let row = inner
            .on_connection(lease, "read", bound, async |c| {
                c.query_typed_one(&sql, &[(&lease, Type::TEXT)]).await
            })
            .await?;
        inner.found(lease, ticket, LeaseRows::from_row(&row, 0), last)
    }

    /// The rows of each of `leases`, in one statement.
    pub(super) async fn read_many(&self, leases: &[String]) -> Result<Vec<(String, LeaseRows)>, StoreError> {
        let inner = &self.inner;
        let sql = format!(
            "SELECT n.name, {COLUMNS}, {s}.timeline() FROM unnest($1::text[]) AS n(name) \
             LEFT JOIN {s}.leases l ON l.name = n.name LEFT JOIN {s}.lease_meta m ON m.name = n.name",
            s = inner.s
        );
        let bound = Some(inner.request_timeout());
        let rows = inner
            .on_connection(ANY_LEASE, "read the watched leases", bound, async |c| {
                c.query_typed(&sql, &[(&leases, Type::TEXT_ARRAY)]).await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|row| (row.get::<_, String>(0), LeaseRows::from_row(row, 1)))
            .collect())
    }

    /// The readable records whose lease names start with `prefix`, each at
    /// its floor at least, and the unreadable ones with why.
    pub(super) async fn list_under(
        &self,
        prefix: &str,
    ) -> Result<(Vec<(String, Versioned)>, Vec<(String, String)>), StoreError> {
        let inner = &self.inner;
        let sql = format!(
            "SELECT l.name, {COLUMNS}, {s}.timeline() FROM {s}.leases l \
             LEFT JOIN {s}.lease_meta m ON m.name = l.name WHERE starts_with(l.name, $1) ORDER BY l.name",
            s = inner.s
        );
        let bound = Some(inner.options.request_timeout);
        let rows = inner
            .on_connection(ANY_LEASE, "list", bound, async |c| {
                c.query_typed(&sql, &[(&prefix, Type::TEXT)]).await
            })
            .await?;
        let (mut read, mut unreadable) = (Vec::new(), Vec::new());
        for row in &rows {
            let lease: String = row.get(0);
            if crate::store::validate_lease_name(&lease).is_err() {
                continue;
            }
            let rows = LeaseRows::from_row(row, 1);
            inner.note_timeline(rows.now);
            let Some(record) = &rows.record else { continue };
            let floor = rows.meta.map_or(0, |m| m.floor.max(0).unsigned_abs());
            match inner.decoded(&lease, record, floor, rows.now) {
                Ok(v) => {
                    inner.remember(&lease, &v.version, record.seq);
                    read.push((lease, v));
                }
                Err(e) => unreadable.push((lease, e.to_string())),
            }
        }
        Ok((read, unreadable))
    }
}

impl Inner {
    /// The record in `row`, read at `floor` at least; on timeline `now`,
    /// a record of an older timeline reads as held by nobody known.
    pub(super) fn decoded(
        &self,
        lease: &str,
        row: &RecordRow,
        floor: u64,
        now: i32,
    ) -> Result<Versioned, StoreError> {
        let mut record: LeaseRecord = serde_json::from_str(&row.json).map_err(|e| StoreError::Malformed {
            lease: lease.to_owned(),
            detail: format!("the row of {lease:?} in leases: {e}"),
        })?;
        record.term = record.term.max(floor);
        if row.timeline >= now {
            return Ok(Versioned {
                record,
                version: row.version.clone(),
            });
        }
        Ok(Versioned {
            record: self.before_promotion(record.term, record.plugins, now),
            version: format!("{}~t{now}", row.version),
        })
    }

    /// How a record last written before the promotion to timeline `now`
    /// reads: held by nobody known for the longest lease duration, in a
    /// term no older timeline can have reached.
    pub(super) fn before_promotion(&self, term: u64, plugins: Option<Vec<String>>, now: i32) -> LeaseRecord {
        LeaseRecord {
            plugins,
            ..LeaseRecord::new(
                Some(BEFORE_PROMOTION),
                term.max(term_base(now)),
                self.fallback_duration(),
            )
        }
    }

    /// What to report for `lease` after a read (begun at `ticket`) found
    /// `rows`; `last`: the record's final state, if it was deleted and the
    /// caller knows it.
    pub(super) fn found(
        &self,
        lease: &str,
        ticket: ReadTicket,
        rows: LeaseRows,
        last: Option<Versioned>,
    ) -> Result<Option<Versioned>, StoreError> {
        self.note_timeline(rows.now);
        let meta = rows
            .meta
            .map(|m| (m.floor.max(0).unsigned_abs(), m.creates.max(0).unsigned_abs()));
        self.recent().entry(lease.to_owned()).or_default().meta = Some(meta);
        let (floor, creates) = meta.unwrap_or((0, 0));
        let found = match &rows.record {
            Some(row) => {
                let v = self.decoded(lease, row, floor, rows.now)?;
                self.remember(lease, &v.version, row.seq);
                Found::Record(v)
            }
            None => {
                self.advance(lease, rows.seq());
                let promoted = rows.now > 1 && rows.meta.is_none_or(|m| m.timeline < rows.now);
                if promoted {
                    // A create or a write after the last one here may have
                    // been lost with the old primary: its holder is waited
                    // out.
                    let lost = Versioned {
                        record: self.before_promotion(floor, None, rows.now),
                        version: format!("lost~t{}", rows.now),
                    };
                    Found::Missing {
                        last: Some(lost),
                        floor: Some(floor.max(term_base(rows.now))),
                        creates: Some(creates),
                    }
                } else {
                    Found::Missing {
                        last,
                        floor: Some(floor),
                        creates: Some(creates),
                    }
                }
            }
        };
        Ok(self.seen.found_since(lease, ticket, found))
    }
}
