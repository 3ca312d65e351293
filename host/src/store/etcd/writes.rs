//! The etcd store's writes, each one transaction: the record compared by
//! `mod_revision` and bytes with the version it replaces (or found absent,
//! for a create), and, when a term starts or the record is created, the
//! *term floor* compared and raised in the same transaction.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};

use super::layout::{self, pad};
use super::{EtcdStore, Inner, map_error, ranges, revision};
use crate::store::{LeaseRecord, StoreError, Versioned};

fn conflict(lease: &str, detail: impl Into<String>) -> StoreError {
    StoreError::Conflict {
        lease: lease.to_owned(),
        detail: detail.into(),
    }
}

/// How a write's floor is compared.
enum FloorCheck {
    /// Below the term written (a term start over an existing floor).
    Below(u64),
    /// Exactly this (a create over a floor this store read).
    Is(u64),
    /// Absent.
    Absent,
}

impl FloorCheck {
    fn compare(&self, key: &str) -> Compare {
        match self {
            FloorCheck::Below(term) => Compare::value(key, CompareOp::Less, pad(*term)),
            FloorCheck::Is(floor) => Compare::value(key, CompareOp::Equal, pad(*floor)),
            FloorCheck::Absent => Compare::create_revision(key, CompareOp::Equal, 0),
        }
    }
}

impl EtcdStore {
    /// Creates `lease`'s record if it is absent and its floor is as
    /// expected: absent for a lease read as never written (`None`), else
    /// the floor this store last read; in a term above that floor unless
    /// `own` (the holder writing its own deleted record again).
    pub(super) async fn create_over(
        &self,
        lease: &str,
        record: &LeaseRecord,
        read: Option<(Option<u64>, u64)>,
        own: bool,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let (check, floor, creates) = match read {
            None | Some((None, _)) => (FloorCheck::Absent, 0, read.map_or(0, |(_, c)| c)),
            Some((Some(floor), creates)) => (FloorCheck::Is(floor), floor, creates),
        };
        if read.is_some() && !own && record.term <= floor {
            return Err(conflict(
                lease,
                format!("term {} is not above the lease's floor, {floor}", record.term),
            ));
        }
        let bytes: Arc<[u8]> = layout::encode_record(record).into();
        let (l, f) = (inner.lease_key(lease), inner.floor_key(lease));
        let txn = Txn::new()
            .when([
                Compare::create_revision(l.as_str(), CompareOp::Equal, 0),
                check.compare(&f),
            ])
            .and_then([
                TxnOp::put(l.as_str(), bytes.to_vec(), None),
                TxnOp::put(f.as_str(), pad(floor.max(record.term)), None),
                TxnOp::put(inner.creates_key(lease), pad(creates + 1), None),
            ]);
        let answer = self.send(lease, "create", txn).await?;
        if !answer.succeeded() {
            return Err(conflict(lease, "the record or its term floor was written first"));
        }
        Ok(inner.wrote(
            lease,
            record,
            bytes,
            revision(&answer),
            Some(floor.max(record.term)),
        ))
    }

    /// The update of a tombstone `version`: the record was deleted, so it is
    /// created again, unless its floor moved since this store read it.
    pub(super) async fn recreate(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let seen = &self.inner.seen;
        seen.create_floor(lease, version)?;
        let own = seen.is_own_tombstone(lease, version);
        let read = {
            let recent = self.inner.recent();
            recent.get(lease).and_then(|r| r.floor.map(|f| (f, r.creates)))
        };
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
    /// (the same term), or a new term (the floor compared below it and
    /// raised to it).
    pub(super) async fn replace(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let (rev, old) = self.version_bytes(lease, version).await?;
        let key = inner.lease_key(lease);
        let stored_term = layout::decode_record(lease, &key, &old)?.term;
        let bytes: Arc<[u8]> = layout::encode_record(record).into();
        let same = [
            Compare::mod_revision(key.as_str(), CompareOp::Equal, rev),
            Compare::value(key.as_str(), CompareOp::Equal, old.to_vec()),
        ];
        let f = inner.floor_key(lease);
        if record.term <= stored_term {
            // A renewal or a release: the floor read back, to remake it if
            // it was deleted.
            let txn = Txn::new().when(same).and_then([
                TxnOp::put(key.as_str(), bytes.to_vec(), None),
                TxnOp::get(f.as_str(), None),
            ]);
            let answer = self.send(lease, "update", txn).await?;
            if !answer.succeeded() {
                return Err(conflict(lease, format!("version {version} was written over")));
            }
            let floor = ranges(&answer).into_iter().next().flatten();
            let floor = inner.number(lease, floor.as_ref())?;
            if floor < record.term {
                self.remake_floor(lease, record.term, floor).await;
            }
            return Ok(inner.wrote(lease, record, bytes, revision(&answer), None));
        }
        // A new term: the floor must be below it, or absent (tried when the
        // first answer shows it absent).
        for check in [FloorCheck::Below(record.term), FloorCheck::Absent] {
            let txn = Txn::new()
                .when([same[0].clone(), same[1].clone(), check.compare(&f)])
                .and_then([
                    TxnOp::put(key.as_str(), bytes.to_vec(), None),
                    TxnOp::put(f.as_str(), pad(record.term), None),
                ])
                .or_else([TxnOp::get(key.as_str(), None), TxnOp::get(f.as_str(), None)]);
            let answer = self.send(lease, "update", txn).await?;
            if answer.succeeded() {
                return Ok(inner.wrote(lease, record, bytes, revision(&answer), Some(record.term)));
            }
            let mut now = ranges(&answer).into_iter();
            let (current, floor) = (now.next().flatten(), now.next().flatten());
            let unchanged = current.is_some_and(|kv| kv.mod_revision() == rev && kv.value() == &old[..]);
            if !unchanged || floor.is_some() {
                let floor = inner.number(lease, floor.as_ref())?;
                return Err(conflict(
                    lease,
                    if unchanged {
                        format!(
                            "term {} was given out already (the lease's floor is {floor})",
                            record.term
                        )
                    } else {
                        format!("version {version} was written over")
                    },
                ));
            }
        }
        Err(conflict(lease, "its term floor changed while the term started"))
    }

    /// Deletes the record if it is still `version`.
    pub(super) async fn delete_version(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        let (rev, old) = match self.version_bytes(lease, version).await {
            Ok(found) => found,
            Err(e) if e.is_conflict() => return Ok(false),
            Err(e) => return Err(e),
        };
        let key = self.inner.lease_key(lease);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, rev),
                Compare::value(key.as_str(), CompareOp::Equal, old.to_vec()),
            ])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(self.send(lease, "delete", txn).await?.succeeded())
    }

    /// The revision and bytes of `version` of `lease`: remembered, or read
    /// now (a conflict if the record is no longer that version).
    async fn version_bytes(&self, lease: &str, version: &str) -> Result<(i64, Arc<[u8]>), StoreError> {
        let rev = layout::revision_of(version)
            .ok_or_else(|| conflict(lease, format!("{version:?} is not a version of this store")))?;
        if let Some(bytes) = self.inner.bytes_of(lease, version) {
            return Ok((rev, bytes));
        }
        let current = self.read(lease, false).await?;
        match (current, self.inner.bytes_of(lease, version)) {
            (Some(v), Some(bytes)) if v.version == version => Ok((rev, bytes)),
            _ => Err(conflict(lease, format!("version {version} was written over"))),
        }
    }

    /// Raises `lease`'s floor (found at `found`, 0: absent) to `term`, after
    /// a renewal found it below: it was deleted, or lost. Best effort: the
    /// next renewal tries again.
    async fn remake_floor(&self, lease: &str, term: u64, found: u64) {
        let f = self.inner.floor_key(lease);
        let check = if found == 0 {
            FloorCheck::Absent
        } else {
            FloorCheck::Below(term)
        };
        let txn = Txn::new()
            .when([check.compare(&f)])
            .and_then([TxnOp::put(f.as_str(), pad(term), None)]);
        match self.send(lease, "remake the term floor", txn).await {
            Ok(_) => {
                tracing::info!(%lease, term, "the lease's term floor was missing or below its term: written again")
            }
            Err(e) => {
                tracing::warn!(%lease, error = %e, "cannot write the lease's term floor again; the next renewal tries")
            }
        }
    }

    /// Sends `txn`.
    async fn send(&self, lease: &str, what: &str, txn: Txn) -> Result<TxnResponse, StoreError> {
        let mark = self.inner.mark();
        let answer = self
            .inner
            .route
            .send(move |c| async move { c.kv_client().txn(txn).await })
            .await
            .map_err(|e| map_error(lease, what, e))?;
        self.inner.observe(answer.header(), mark);
        Ok(answer)
    }
}

impl Inner {
    /// This store wrote `record` as `bytes` at `revision` (and the floor,
    /// if `floor`): the version it reports.
    fn wrote(
        &self,
        lease: &str,
        record: &LeaseRecord,
        bytes: Arc<[u8]>,
        revision: i64,
        floor: Option<u64>,
    ) -> Versioned {
        let v = Versioned {
            record: record.clone(),
            version: layout::version_of(revision, &bytes),
        };
        self.remember(lease, &v.version, bytes, revision);
        if let Some(floor) = floor {
            let mut recent = self.recent();
            let r = recent.entry(lease.to_owned()).or_default();
            r.floor = Some(Some(floor));
        }
        self.seen.wrote(lease, &v);
        v
    }
}
