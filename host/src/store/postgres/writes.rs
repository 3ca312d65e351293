//! The PostgreSQL store's writes, each one call of a write function of
//! the schema ([`schema`](super::schema)): the record compared by its
//! version (a random id of its write), the *term floor* checked and raised
//! when a term starts, in one transaction.

use tokio_postgres::types::Type;

use super::{Inner, PostgresStore};
use crate::store::{LeaseRecord, StoreError, Versioned};

fn conflict(lease: &str, detail: impl Into<String>) -> StoreError {
    StoreError::Conflict {
        lease: lease.to_owned(),
        detail: detail.into(),
    }
}

/// A new write's version: a random id no other write has.
fn new_version() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// A version as the store reports it: the stored id, and the timeline it
/// was read on if the record was written before a promotion.
fn parse_version(version: &str) -> (&str, Option<i32>) {
    match version.rsplit_once("~t") {
        Some((id, tl)) => match tl.parse() {
            Ok(tl) => (id, Some(tl)),
            Err(_) => (version, None),
        },
        None => (version, None),
    }
}

/// What a refused write function's outcome means.
fn refused(lease: &str, version: &str, outcome: &str, floor: Option<i64>) -> StoreError {
    conflict(
        lease,
        match outcome {
            "written over" => format!("version {version} was written over"),
            "exists" => "the record exists".into(),
            "meta moved" => "the record or its term floor was written first".into(),
            "floor" => format!(
                "the term was given out already (the lease's floor is {})",
                floor.unwrap_or_default()
            ),
            "promoted" => "the database was promoted since the record was read: read it again".into(),
            "below the timeline" => {
                "the term is not above the terms of the timelines before the last promotion".into()
            }
            other => format!("refused: {other}"),
        },
    )
}

impl PostgresStore {
    /// Creates `lease`'s record if it is absent and its meta is as read:
    /// `read` is `None` or `Some(None)` for a lease read as never written,
    /// else the floor and create count last read; in a term above that
    /// floor unless `own` (the holder writing its own deleted record
    /// again).
    pub(super) async fn create_over(
        &self,
        lease: &str,
        record: &LeaseRecord,
        read: Option<Option<(u64, u64)>>,
        own: bool,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let meta = read.flatten();
        if let Some((floor, _)) = meta
            && !own
            && record.term <= floor
        {
            return Err(conflict(
                lease,
                format!("term {} is not above the lease's floor, {floor}", record.term),
            ));
        }
        let json = encode(record);
        let version = new_version();
        let term = i64::try_from(record.term).unwrap_or(i64::MAX);
        let (floor, creates) = (
            meta.map(|(f, _)| i64::try_from(f).unwrap_or(i64::MAX)),
            meta.map_or(0, |(_, c)| i64::try_from(c).unwrap_or(i64::MAX)),
        );
        let sql = format!(
            "SELECT outcome, o_seq, o_tl FROM {}.lease_create($1, $2, $3, $4, $5, $6, $7)",
            inner.s
        );
        let row = inner
            .on_connection(lease, "create", None, async |c| {
                c.query_typed_one(
                    &sql,
                    &[
                        (&lease, Type::TEXT),
                        (&json, Type::TEXT),
                        (&term, Type::INT8),
                        (&version, Type::TEXT),
                        (&floor, Type::INT8),
                        (&creates, Type::INT8),
                        (&own, Type::BOOL),
                    ],
                )
                .await
            })
            .await?;
        let outcome: String = row.get(0);
        inner.note_timeline(row.get(2));
        if outcome != "ok" {
            return Err(refused(lease, &version, &outcome, floor));
        }
        let new_meta = (
            meta.map_or(0, |(f, _)| f).max(record.term),
            meta.map_or(0, |(_, c)| c) + 1,
        );
        Ok(inner.wrote(lease, record, version, row.get(1), Some(new_meta)))
    }

    /// The update of a tombstone `version`: the record was deleted, so it is
    /// created again, unless its meta moved since this store read it.
    pub(super) async fn recreate(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let seen = &self.inner.seen;
        seen.create_floor(lease, version)?;
        let own = seen.is_own_tombstone(lease, version);
        let read = self.inner.recent().get(lease).and_then(|r| r.meta);
        let Some(read) = read else {
            return Err(conflict(lease, "its term floor is not known here: read it again"));
        };
        let created = self.create_over(lease, record, Some(read), own).await;
        if created.as_ref().is_err_and(StoreError::is_conflict) {
            seen.create_refused(lease, version);
        }
        created
    }

    /// Writes `record` over `version` of the record: a renewal or release
    /// (the same term), or a new term (the floor checked below it and
    /// raised to it).
    pub(super) async fn replace(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let (old, promoted) = parse_version(version);
        let json = encode(record);
        let new = new_version();
        let term = i64::try_from(record.term).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT outcome, o_seq, o_tl, o_floor FROM {}.lease_replace($1, $2, $3, $4, $5, $6)",
            inner.s
        );
        let row = inner
            .on_connection(lease, "update", None, async |c| {
                c.query_typed_one(
                    &sql,
                    &[
                        (&lease, Type::TEXT),
                        (&old, Type::TEXT),
                        (&promoted, Type::INT4),
                        (&json, Type::TEXT),
                        (&term, Type::INT8),
                        (&new, Type::TEXT),
                    ],
                )
                .await
            })
            .await?;
        let outcome: String = row.get(0);
        inner.note_timeline(row.get(2));
        if outcome != "ok" {
            return Err(refused(lease, version, &outcome, row.get(3)));
        }
        let meta = inner.recent().get(lease).and_then(|r| r.meta.flatten());
        let meta = meta.map(|(f, c)| (f.max(record.term), c));
        Ok(inner.wrote(lease, record, new, row.get(1), meta))
    }

    /// Deletes the record if it is still `version`.
    pub(super) async fn delete_version(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let (old, promoted) = parse_version(version);
        let sql = format!(
            "DELETE FROM {s}.leases WHERE name = $1 AND version = $2 AND CASE WHEN $3::integer IS NULL \
             THEN timeline = {s}.timeline() ELSE timeline < $3 AND $3 = {s}.timeline() END",
            s = inner.s
        );
        let deleted = inner
            .on_connection(lease, "delete", None, async |c| {
                c.execute_typed(
                    &sql,
                    &[(&lease, Type::TEXT), (&old, Type::TEXT), (&promoted, Type::INT4)],
                )
                .await
            })
            .await?;
        Ok(deleted == 1)
    }
}

/// The record as stored: the embedded store's JSON form.
fn encode(record: &LeaseRecord) -> String {
    serde_json::to_string(record).expect("a lease record serializes")
}

impl Inner {
    /// This store wrote `record` as `version` at write counter `seq` (and
    /// the meta is now `meta`, if known): the version it reports.
    fn wrote(
        &self,
        lease: &str,
        record: &LeaseRecord,
        version: String,
        seq: i64,
        meta: Option<(u64, u64)>,
    ) -> Versioned {
        let v = Versioned {
            record: record.clone(),
            version,
        };
        self.remember(lease, &v.version, seq);
        if let Some(meta) = meta {
            self.recent().entry(lease.to_owned()).or_default().meta = Some(Some(meta));
        }
        self.seen.wrote(lease, &v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn a_version_read_after_a_promotion_names_its_timeline() {
        assert_eq!(parse_version("00ab"), ("00ab", None));
        assert_eq!(parse_version("00ab~t3"), ("00ab", Some(3)));
        assert_eq!(parse_version("00ab~tx"), ("00ab~tx", None));
    }
}
