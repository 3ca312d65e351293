//! The etcd store's reads: a record with its *term floor* at one revision,
//! and listings.

use std::sync::Arc;

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp};

use super::layout;
use super::{EtcdStore, Inner, ranges};
use crate::store::deleted::{Found, ReadTicket};
use crate::store::{ANY_LEASE, StoreError, Versioned};

impl EtcdStore {
    /// Reads `lease`'s record and floor at one revision, as the store
    /// reports them (deleted records and floors applied). `own`: a request of the store's own, bounded by it (the elector
    /// bounds its reads).
    pub(super) async fn read(&self, lease: &str, own: bool) -> Result<Option<Versioned>, StoreError> {
        self.read_after(lease, own, None).await
    }

    /// [`read`](Self::read), after a deletion whose last state was `last`.
    pub(super) async fn read_after(
        &self,
        lease: &str,
        own: bool,
        last: Option<Versioned>,
    ) -> Result<Option<Versioned>, StoreError> {
        let inner = &self.inner;
        let ticket = inner.seen.ticket(lease);
        let txn = Txn::new().and_then([
            TxnOp::get(inner.lease_key(lease), None),
            TxnOp::get(inner.floor_key(lease), None),
            TxnOp::get(inner.creates_key(lease), None),
        ]);
        let mark = inner.mark();
        let request = inner
            .route
            .send(move |c| async move { c.kv_client().txn(txn).await });
        let answer = if own {
            inner.bounded(lease, "read", request).await?
        } else {
            request.await.map_err(|e| super::map_error(lease, "read", e))?
        };
        let mut found = ranges(&answer).into_iter();
        let (record, floor, creates) = (
            found.next().flatten(),
            found.next().flatten(),
            found.next().flatten(),
        );
        let revision = inner.revision_of(&answer, mark);
        inner.found(lease, ticket, record, (floor, creates), last, revision)
    }

    /// The readable records whose lease names start with `prefix`, each at
    /// its floor at least, and the unreadable ones with why, at one
    /// revision.
    pub(super) async fn list_under(
        &self,
        prefix: &str,
    ) -> Result<(Vec<(String, Versioned)>, Vec<(String, String)>), StoreError> {
        let inner = &self.inner;
        let range = |keys: String| TxnOp::get(keys, Some(GetOptions::new().with_prefix()));
        let mark = inner.mark();
        let txn = Txn::new().and_then([
            range(format!("{}{prefix}", layout::leases_prefix(&inner.prefix))),
            range(format!("{}term/{prefix}", inner.prefix)),
        ]);
        let request = inner
            .route
            .send(move |c| async move { c.kv_client().txn(txn).await });
        let answer = inner
            .bounded_by(inner.configured_timeout, ANY_LEASE, "list", request)
            .await?;
        let revision = inner.revision_of(&answer, mark);
        let mut lists = answer.op_responses().into_iter().filter_map(|op| match op {
            etcd_client::TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        });
        let (records, floors) = (lists.next().unwrap_or_default(), lists.next().unwrap_or_default());
        let floors: std::collections::HashMap<String, u64> = floors
            .iter()
            .filter_map(|kv| {
                let key = std::str::from_utf8(kv.key()).ok()?;
                let lease = key.strip_prefix(&format!("{}term/", inner.prefix))?;
                Some((
                    lease.to_owned(),
                    layout::decode_number(lease, key, kv.value()).ok()?,
                ))
            })
            .collect();
        let mut read = Vec::new();
        let mut unreadable = Vec::new();
        for kv in records {
            let Some(lease) = lease_of(&inner.prefix, &kv) else {
                continue;
            };
            let floor = floors.get(&lease).copied().unwrap_or(0);
            match inner.decoded(&lease, &kv, floor) {
                Ok(v) => {
                    inner.remember(
                        &lease,
                        &v.version,
                        kv.value().into(),
                        revision.min(kv.mod_revision()),
                    );
                    read.push((lease, v));
                }
                Err(e) => unreadable.push((lease, e.to_string())),
            }
        }
        Ok((read, unreadable))
    }
}

/// The lease named by a record's key, if it is a valid name.
fn lease_of(prefix: &str, kv: &KeyValue) -> Option<String> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    let lease = key.strip_prefix(&layout::leases_prefix(prefix))?;
    crate::store::validate_lease_name(lease).ok()?;
    Some(lease.to_owned())
}

impl Inner {
    /// The record in `kv` (a lease's key), read at `floor` at least.
    pub(super) fn decoded(&self, lease: &str, kv: &KeyValue, floor: u64) -> Result<Versioned, StoreError> {
        let key = self.lease_key(lease);
        let mut record = layout::decode_record(lease, &key, kv.value())?;
        record.term = record.term.max(floor);
        Ok(Versioned {
            record,
            version: layout::version_of(kv.mod_revision(), kv.value()),
        })
    }

    /// The number in `kv` (a floor or a create count of `lease`); 0 if
    /// there is none.
    pub(super) fn number(&self, lease: &str, kv: Option<&KeyValue>) -> Result<u64, StoreError> {
        kv.map_or(Ok(0), |kv| {
            layout::decode_number(lease, &String::from_utf8_lossy(kv.key()), kv.value())
        })
    }

    /// What to report for `lease` after a read (begun at `ticket`, answered
    /// at `revision`) found `record`, its floor and its create count;
    /// `last`: the record's final state, if it was deleted and the deletion
    /// said so.
    pub(super) fn found(
        &self,
        lease: &str,
        ticket: ReadTicket,
        record: Option<KeyValue>,
        (floor, creates): (Option<KeyValue>, Option<KeyValue>),
        last: Option<Versioned>,
        revision: i64,
    ) -> Result<Option<Versioned>, StoreError> {
        let floor_term = self.number(lease, floor.as_ref())?;
        let creates = self.number(lease, creates.as_ref())?;
        {
            let mut recent = self.recent();
            let r = recent.entry(lease.to_owned()).or_default();
            r.floor = Some(floor.is_some().then_some(floor_term));
            r.creates = creates;
        }
        let found = match record {
            Some(kv) => {
                let v = self.decoded(lease, &kv, floor_term)?;
                self.remember(lease, &v.version, Arc::from(kv.value()), revision);
                Found::Record(v)
            }
            None => {
                self.advance(lease, revision);
                Found::Missing {
                    last,
                    floor: Some(floor_term),
                    creates: Some(creates),
                }
            }
        };
        Ok(self.seen.found_since(lease, ticket, found))
    }
}
