//! Plugins' buckets in etcd, beside the leases: per bucket a meta key
//! (`<prefix>bucket/<lease>/<bucket>`: its fence, entry count and bytes)
//! and a key per entry (`<prefix>entry/<lease>/<bucket>/<key>`), so that a
//! prefix range lists a bucket's keys in byte order.
//!
//! A write reads the meta key and the entries it touches at one revision,
//! checks the fence and applies its operations, then commits in one
//! transaction that compares the meta key's `mod_revision` with the one
//! read: every write and claim rewrites the meta key, so a claim of a later
//! term, or any write, that lands in between fails the comparison, and the
//! write starts over from a fresh read (and is fenced). An entry's version
//! is the revision of the write that set it. A write's transaction must fit
//! etcd's request limits (`max-request-bytes`, `max-txn-ops`): one that
//! would not is refused as over a limit, naming it.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::{EtcdStore, ranges, revision};
use crate::store::buckets::{
    Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Limits, Write, apply_to_entries,
    check_fence, check_size,
};

/// How many times a write or claim starts over after another landed first.
const ATTEMPTS: usize = 16;

/// etcd's default largest request (`--max-request-bytes`), less room for
/// the request's own framing.
const MAX_REQUEST_BYTES: usize = 1_572_864 - 16 * 1024;

/// etcd's default most operations in one transaction (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// What a bucket's meta key holds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Meta {
    fence: u64,
    entries: u64,
    bytes: u64,
}

/// The buckets of an [`EtcdStore`], through its connection.
#[derive(Clone)]
pub struct EtcdBuckets {
    store: EtcdStore,
}

impl EtcdStore {
    /// The buckets of plugins' key-value state beside the leases, through
    /// the same connection.
    pub fn buckets(&self) -> EtcdBuckets {
        EtcdBuckets { store: self.clone() }
    }
}

/// The bucket's error for the store's error `e`: refusals and malformed
/// answers keep their kind in the detail; all are unavailable to the
/// plugin, which may retry.
fn unavailable(bucket: &BucketName, e: crate::store::StoreError) -> BucketError {
    match e {
        crate::store::StoreError::Malformed { detail, .. } => BucketError::Malformed {
            bucket: bucket.clone(),
            detail,
        },
        e => BucketError::Unavailable {
            bucket: bucket.clone(),
            detail: e.to_string(),
        },
    }
}

/// The largest answer a bucket read decodes: a full transaction of the
/// largest values etcd takes.
const MAX_ANSWER_BYTES: usize = 256 << 20;

impl EtcdBuckets {
    fn meta_key(&self, bucket: &BucketName) -> String {
        format!(
            "{}bucket/{}/{}",
            self.store.inner.prefix, bucket.lease, bucket.bucket
        )
    }

    fn entries_prefix(&self, bucket: &BucketName) -> String {
        format!(
            "{}entry/{}/{}/",
            self.store.inner.prefix, bucket.lease, bucket.bucket
        )
    }

    fn entry_key(&self, bucket: &BucketName, key: &str) -> String {
        format!("{}{key}", self.entries_prefix(bucket))
    }

    fn meta_of(&self, bucket: &BucketName, kv: Option<&KeyValue>) -> Result<Meta, BucketError> {
        kv.map_or(Ok(Meta::default()), |kv| {
            serde_json::from_slice(kv.value()).map_err(|e| BucketError::Malformed {
                bucket: bucket.clone(),
                detail: format!(
                    "{} is not a bucket's meta record ({e}); delete the bucket with `baton kv` or etcdctl",
                    self.meta_key(bucket)
                ),
            })
        })
    }

    /// Sends a bucket request through the store's route, its answers
    /// allowed up to [`MAX_ANSWER_BYTES`].
    async fn routed<T, R>(
        &self,
        request: impl FnOnce(etcd_client::KvClient) -> R,
    ) -> Result<T, etcd_client::Error>
    where
        R: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.store
            .inner
            .route
            .send(|c| request(c.kv_client().max_decoding_message_size(MAX_ANSWER_BYTES)))
            .await
    }

    /// Sends `txn` for `bucket`, bounded by the store's configured request
    /// timeout.
    async fn send(
        &self,
        bucket: &BucketName,
        what: &str,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, BucketError> {
        let inner = &self.store.inner;
        let request = self.routed(move |mut kv| async move { kv.txn(txn).await });
        inner
            .bounded_by(inner.configured_timeout, &bucket.lease, what, request)
            .await
            .map_err(|e| unavailable(bucket, e))
    }

    /// The meta key (its meta, and its `mod_revision`, 0 if absent) and the
    /// entries of `keys`, at one revision.
    async fn read(
        &self,
        bucket: &BucketName,
        keys: &[&str],
    ) -> Result<(Meta, i64, BTreeMap<String, Entry>, i64), BucketError> {
        let mut ops = vec![TxnOp::get(self.meta_key(bucket), None)];
        ops.extend(keys.iter().map(|k| TxnOp::get(self.entry_key(bucket, k), None)));
        let answer = self
            .send(bucket, "read the bucket", Txn::new().and_then(ops))
            .await?;
        let mut found = ranges(&answer).into_iter();
        let meta_kv = found.next().flatten();
        let meta = self.meta_of(bucket, meta_kv.as_ref())?;
        let mut entries = BTreeMap::new();
        for (key, kv) in keys.iter().zip(found) {
            if let Some(kv) = kv {
                entries.insert(
                    (*key).to_owned(),
                    Entry {
                        value: kv.value().to_vec(),
                        version: kv.mod_revision() as u64,
                    },
                );
            }
        }
        Ok((
            meta,
            meta_kv.map_or(0, |kv| kv.mod_revision()),
            entries,
            revision(&answer),
        ))
    }

    /// A comparison that the meta key is still as read (`mod_revision`,
    /// 0: absent).
    fn unchanged(&self, bucket: &BucketName, meta_revision: i64) -> Compare {
        match meta_revision {
            0 => Compare::create_revision(self.meta_key(bucket), CompareOp::Equal, 0),
            rev => Compare::mod_revision(self.meta_key(bucket), CompareOp::Equal, rev),
        }
    }

    fn limit(bucket: &BucketName, detail: String) -> BucketError {
        BucketError::Limit {
            bucket: bucket.clone(),
            detail,
        }
    }

    /// One attempt at `write`: `None` if another write landed first.
    async fn try_apply(&self, bucket: &BucketName, write: &Write) -> Result<Option<Applied>, BucketError> {
        let mut keys: Vec<&str> = write.ops.iter().map(|op| op.key()).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() + 1 > MAX_TXN_OPS {
            return Err(Self::limit(
                bucket,
                format!(
                    "a write of {} keys, more than etcd's {} operations in one transaction (--max-txn-ops) allow",
                    keys.len(),
                    MAX_TXN_OPS - 1
                ),
            ));
        }
        let (mut meta, meta_revision, before, read_at) = self.read(bucket, &keys).await?;
        check_fence(bucket, write.term, meta.fence)?;
        let mut after = before.clone();
        let unbounded = Limits {
            bucket: u64::MAX,
            ..write.limits
        };
        let applied = apply_to_entries(bucket, &mut after, read_at as u64, &write.ops, unbounded)?;
        let size = |m: &BTreeMap<String, Entry>| -> u64 {
            m.iter().map(|(k, e)| (k.len() + e.value.len()) as u64).sum()
        };
        let bytes = (meta.bytes + size(&after)).saturating_sub(size(&before));
        check_size(bucket, bytes, write.limits)?;
        meta.entries = (meta.entries + after.len() as u64).saturating_sub(before.len() as u64);
        meta.bytes = bytes;
        meta.fence = meta.fence.max(write.term);
        let mut ops = Vec::new();
        let mut request = 0;
        for key in &keys {
            let entry_key = self.entry_key(bucket, key);
            request += entry_key.len() + 64;
            match after.get(*key) {
                Some(e)
                    if before
                        .get(*key)
                        .is_none_or(|b| b.value != e.value || b.version != e.version) =>
                {
                    request += e.value.len();
                    ops.push(TxnOp::put(entry_key, e.value.clone(), None));
                }
                Some(_) => {}
                None if before.contains_key(*key) => ops.push(TxnOp::delete(entry_key, None)),
                None => {}
            }
        }
        if request > MAX_REQUEST_BYTES {
            return Err(Self::limit(
                bucket,
                format!(
                    "a write of about {request} bytes, more than etcd takes in one request \
                     (--max-request-bytes, 1.5 MiB by default)"
                ),
            ));
        }
        ops.push(TxnOp::put(
            self.meta_key(bucket),
            serde_json::to_vec(&meta).expect("meta serializes"),
            None,
        ));
        if !(write.may_commit)() {
            return Err(BucketError::Stopped {
                bucket: bucket.clone(),
                term: write.term,
            });
        }
        let txn = Txn::new()
            .when([self.unchanged(bucket, meta_revision)])
            .and_then(ops);
        let answer = self.send(bucket, "write the bucket", txn).await?;
        Ok(answer.succeeded().then_some(applied))
    }
}

fn contended(bucket: &BucketName) -> BucketError {
    BucketError::Unavailable {
        bucket: bucket.clone(),
        detail: format!("other writes kept landing first ({ATTEMPTS} attempts)"),
    }
}

#[async_trait::async_trait]
impl BucketStore for EtcdBuckets {
    fn describe(&self) -> String {
        format!("buckets as etcd keys under {:?}", self.store.inner.prefix)
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        for _ in 0..ATTEMPTS {
            let (mut meta, meta_revision, _, _) = self.read(bucket, &[]).await?;
            check_fence(bucket, term, meta.fence)?;
            let before = meta.fence;
            if before == term {
                return Ok(before);
            }
            meta.fence = term;
            let txn = Txn::new()
                .when([self.unchanged(bucket, meta_revision)])
                .and_then([TxnOp::put(
                    self.meta_key(bucket),
                    serde_json::to_vec(&meta).expect("meta serializes"),
                    None,
                )]);
            if self.send(bucket, "claim the bucket", txn).await?.succeeded() {
                return Ok(before);
            }
        }
        Err(contended(bucket))
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        Ok(self.get_many(bucket, &[key.to_owned()]).await?.pop().flatten())
    }

    /// At one revision: the first transaction's, for the keys beyond it.
    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        let mut found = Vec::with_capacity(keys.len());
        let mut at = None;
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let options = at.map(|rev| GetOptions::new().with_revision(rev));
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::get(self.entry_key(bucket, k), options.clone()))
                .collect();
            let answer = self
                .send(bucket, "read the bucket", Txn::new().and_then(ops))
                .await?;
            at = at.or(Some(revision(&answer)));
            found.extend(ranges(&answer).into_iter().map(|kv| {
                kv.map(|kv| Entry {
                    value: kv.value().to_vec(),
                    version: kv.mod_revision() as u64,
                })
            }));
        }
        Ok(found)
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        if limit == 0 {
            // etcd reads a limit of 0 as no limit.
            return Ok(Vec::new());
        }
        let prefix = self.entries_prefix(bucket);
        let from = match after {
            Some(after) => format!("{prefix}{after}\0"),
            None => prefix.clone(),
        };
        let mut end = prefix.clone().into_bytes();
        *end.last_mut().expect("a prefix") += 1;
        let options = GetOptions::new()
            .with_range(end)
            .with_keys_only()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let inner = &self.store.inner;
        let request = self.routed(move |mut kv| async move { kv.get(from, Some(options)).await });
        let mut answer = inner
            .bounded_by(
                inner.configured_timeout,
                &bucket.lease,
                "list the bucket",
                request,
            )
            .await
            .map_err(|e| unavailable(bucket, e))?;
        Ok(answer
            .take_kvs()
            .into_iter()
            .filter_map(|kv| {
                Some(
                    std::str::from_utf8(kv.key())
                        .ok()?
                        .strip_prefix(&prefix)?
                        .to_owned(),
                )
            })
            .collect())
    }

    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        for _ in 0..ATTEMPTS {
            if let Some(applied) = self.try_apply(bucket, &write).await? {
                return Ok(applied);
            }
        }
        Err(contended(bucket))
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        let base = format!("{}bucket/", self.store.inner.prefix);
        let prefix = match lease {
            Some(lease) => format!("{base}{lease}/"),
            None => base.clone(),
        };
        let any = BucketName::new(lease.unwrap_or("*"), "*");
        let inner = &self.store.inner;
        let request = self
            .routed(move |mut kv| async move { kv.get(prefix, Some(GetOptions::new().with_prefix())).await });
        let mut answer = inner
            .bounded_by(inner.configured_timeout, &any.lease, "list the buckets", request)
            .await
            .map_err(|e| unavailable(&any, e))?;
        let mut infos = Vec::new();
        for kv in answer.take_kvs() {
            let Some((lease, name)) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(&base))
                .and_then(|k| k.split_once('/'))
            else {
                continue;
            };
            let name = BucketName::new(lease, name);
            let meta = self.meta_of(&name, Some(&kv))?;
            infos.push(BucketInfo {
                name,
                fence: meta.fence,
                entries: meta.entries,
                bytes: meta.bytes,
            });
        }
        Ok(infos)
    }
}
