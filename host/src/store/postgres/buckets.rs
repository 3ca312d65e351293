//! Plugins' buckets in PostgreSQL, beside the leases: a row per bucket in
//! `buckets` (its fence, revision and size) and a row per entry in
//! `entries`, keys ordered byte-wise (`COLLATE "C"`).
//!
//! A write is one transaction: the bucket's row locked (`FOR UPDATE`), its
//! fence compared with the writer's term, the entries it touches read,
//! its operations applied, the changed entries and the bucket's row
//! written, and the writer's last check made right before the commit. A
//! claim of a later term waits for the lock and then raises the fence, so
//! a stale term's write either commits before the claim or is refused
//! after it. An entry's version is the bucket's revision of the write that
//! set it. No size limit of the store's own: the plugins' configured
//! limits apply (`bytea` holds up to 1 GiB). A transaction left idle for
//! the request timeout (its writer frozen or cut off) is ended by the
//! server, so no row stays locked.

use std::collections::BTreeMap;

use tokio_postgres::types::Type;

use super::PostgresStore;
use crate::store::StoreError;
use crate::store::buckets::{
    Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Limits, Write, apply_to_entries,
    check_fence, check_size,
};

/// The buckets of a [`PostgresStore`], through its pool.
#[derive(Clone)]
pub struct PostgresBuckets {
    store: PostgresStore,
}

impl PostgresStore {
    /// The buckets of plugins' key-value state beside the leases, through
    /// the same pool.
    pub fn buckets(&self) -> PostgresBuckets {
        PostgresBuckets { store: self.clone() }
    }
}

/// The bucket's error for the store's error `e`.
fn unavailable(bucket: &BucketName, e: StoreError) -> BucketError {
    BucketError::Unavailable {
        bucket: bucket.clone(),
        detail: e.to_string(),
    }
}

fn u(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn i(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PostgresBuckets {
    fn s(&self) -> &str {
        &self.store.inner.s
    }

    /// Runs `request` on a pooled connection, bounded by the store's
    /// request timeout.
    async fn run<T>(
        &self,
        bucket: &BucketName,
        what: &str,
        request: impl AsyncFnOnce(&mut deadpool_postgres::Object) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, BucketError> {
        let inner = &self.store.inner;
        let bound = Some(inner.options.request_timeout);
        inner
            .on_connection(&bucket.lease, what, bound, request)
            .await
            .map_err(|e| unavailable(bucket, e))
    }

    /// One write in one transaction; the bucket's refusal, or the
    /// database's error.
    async fn write_in(
        &self,
        c: &mut deadpool_postgres::Object,
        bucket: &BucketName,
        write: &Write,
    ) -> Result<Result<Applied, BucketError>, tokio_postgres::Error> {
        let s = self.s().to_owned();
        let tx = c.transaction().await?;
        // A writer frozen or cut off mid-transaction must not keep the
        // bucket's row locked (a claim of the next term waits for it): the
        // server ends a session idle in its transaction for the request
        // timeout, and the write rolls back.
        let row = self.lock_bucket(&tx, bucket).await?;
        let (l, b) = (&bucket.lease, &bucket.bucket);
        let (fence, revision, size) = (u(row.get(0)), u(row.get(1)), u(row.get(2)));
        if let Err(e) = check_fence(bucket, write.term, fence) {
            return Ok(Err(e));
        }
        let mut keys: Vec<String> = write.ops.iter().map(|op| op.key().to_owned()).collect();
        keys.sort_unstable();
        keys.dedup();
        let rows = tx
            .query_typed(
                &format!("SELECT key, value, version FROM {s}.entries WHERE lease = $1 AND bucket = $2 AND key = ANY($3)"),
                &[(l, Type::TEXT), (b, Type::TEXT), (&keys, Type::TEXT_ARRAY)],
            )
            .await?;
        let before: BTreeMap<String, Entry> = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Entry {
                        value: r.get(1),
                        version: u(r.get(2)),
                    },
                )
            })
            .collect();
        let mut after = before.clone();
        let unbounded = Limits {
            bucket: u64::MAX,
            ..write.limits
        };
        let applied = match apply_to_entries(bucket, &mut after, revision, &write.ops, unbounded) {
            Ok(a) => a,
            Err(e) => return Ok(Err(e)),
        };
        let bytes = |m: &BTreeMap<String, Entry>| -> u64 {
            m.iter().map(|(k, e)| (k.len() + e.value.len()) as u64).sum()
        };
        let new_size = (size + bytes(&after)).saturating_sub(bytes(&before));
        if let Err(e) = check_size(bucket, new_size, write.limits) {
            return Ok(Err(e));
        }
        Self::write_entries(&tx, &s, bucket, &keys, &before, &after).await?;
        tx.execute_typed(
            &format!(
                "UPDATE {s}.buckets SET fence = GREATEST(fence, $3), revision = revision + 1, size = $4 \
                 WHERE lease = $1 AND bucket = $2"
            ),
            &[
                (l, Type::TEXT),
                (b, Type::TEXT),
                (&i(write.term), Type::INT8),
                (&i(new_size), Type::INT8),
            ],
        )
        .await?;
        if !(write.may_commit)() {
            return Ok(Err(BucketError::Stopped {
                bucket: bucket.clone(),
                term: write.term,
            }));
        }
        tx.commit().await?;
        Ok(Ok(applied))
    }

    /// In the write's transaction `tx`: the bucket's row (created if
    /// missing) locked, its fence, revision and size.
    async fn lock_bucket(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        bucket: &BucketName,
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        let s = self.s();
        let idle = self.store.inner.options.request_timeout.as_millis().max(1);
        tx.batch_execute(&format!("SET LOCAL idle_in_transaction_session_timeout = {idle}"))
            .await?;
        let (l, b) = (&bucket.lease, &bucket.bucket);
        tx.execute_typed(
            &format!("INSERT INTO {s}.buckets (lease, bucket) VALUES ($1, $2) ON CONFLICT DO NOTHING"),
            &[(l, Type::TEXT), (b, Type::TEXT)],
        )
        .await?;
        let row = tx
            .query_typed_one(
                &format!("SELECT fence, revision, size FROM {s}.buckets WHERE lease = $1 AND bucket = $2 FOR UPDATE"),
                &[(l, Type::TEXT), (b, Type::TEXT)],
            )
            .await?;
        Ok(row)
    }

    /// Writes the entries of `keys` that changed from `before` to `after`.
    async fn write_entries(
        tx: &tokio_postgres::Transaction<'_>,
        s: &str,
        bucket: &BucketName,
        keys: &[String],
        before: &BTreeMap<String, Entry>,
        after: &BTreeMap<String, Entry>,
    ) -> Result<(), tokio_postgres::Error> {
        let (l, b) = (&bucket.lease, &bucket.bucket);
        for key in keys {
            match after.get(key) {
                Some(e) if before.get(key) != Some(e) => {
                    tx.execute_typed(
                        &format!(
                            "INSERT INTO {s}.entries (lease, bucket, key, value, version) VALUES ($1, $2, $3, $4, $5) \
                             ON CONFLICT (lease, bucket, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version"
                        ),
                        &[(l, Type::TEXT), (b, Type::TEXT), (key, Type::TEXT), (&e.value, Type::BYTEA), (&i(e.version), Type::INT8)],
                    )
                    .await?;
                }
                Some(_) => {}
                None if before.contains_key(key) => {
                    tx.execute_typed(
                        &format!("DELETE FROM {s}.entries WHERE lease = $1 AND bucket = $2 AND key = $3"),
                        &[(l, Type::TEXT), (b, Type::TEXT), (key, Type::TEXT)],
                    )
                    .await?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl BucketStore for PostgresBuckets {
    fn describe(&self) -> String {
        format!("buckets as rows of {}.entries", self.s())
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        let sql = format!(
            "WITH old AS (SELECT fence FROM {s}.buckets WHERE lease = $1 AND bucket = $2 FOR UPDATE), \
             ins AS (INSERT INTO {s}.buckets (lease, bucket, fence) SELECT $1, $2, $3 \
                     WHERE NOT EXISTS (SELECT 1 FROM old) ON CONFLICT DO NOTHING RETURNING 0::bigint AS fence), \
             up AS (UPDATE {s}.buckets SET fence = $3 WHERE lease = $1 AND bucket = $2 \
                    AND fence < $3 AND EXISTS (SELECT 1 FROM old) RETURNING 0) \
             SELECT COALESCE((SELECT fence FROM old), (SELECT fence FROM ins)), (SELECT count(*) FROM up)",
            s = self.s()
        );
        let (l, b, t) = (&bucket.lease, &bucket.bucket, i(term));
        let row = self
            .run(bucket, "claim the bucket", async |c| {
                c.query_typed_one(&sql, &[(l, Type::TEXT), (b, Type::TEXT), (&t, Type::INT8)])
                    .await
            })
            .await?;
        match row.get::<_, Option<i64>>(0) {
            Some(before) => {
                check_fence(bucket, term, u(before))?;
                Ok(u(before))
            }
            // Created by another claim at the same moment: claim again.
            None => Box::pin(self.claim(bucket, term)).await,
        }
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        Ok(self.get_many(bucket, &[key.to_owned()]).await?.pop().flatten())
    }

    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        let sql = format!(
            "SELECT key, value, version FROM {}.entries WHERE lease = $1 AND bucket = $2 AND key = ANY($3)",
            self.s()
        );
        let (l, b) = (&bucket.lease, &bucket.bucket);
        let rows = self
            .run(bucket, "read the bucket", async |c| {
                c.query_typed(
                    &sql,
                    &[(l, Type::TEXT), (b, Type::TEXT), (&keys, Type::TEXT_ARRAY)],
                )
                .await
            })
            .await?;
        let found: BTreeMap<String, Entry> = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Entry {
                        value: r.get(1),
                        version: u(r.get(2)),
                    },
                )
            })
            .collect();
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        let sql = format!(
            "SELECT key FROM {}.entries WHERE lease = $1 AND bucket = $2 \
             AND ($3::text IS NULL OR key COLLATE \"C\" > $3) ORDER BY key COLLATE \"C\" LIMIT $4",
            self.s()
        );
        let (l, b, n) = (
            &bucket.lease,
            &bucket.bucket,
            i64::try_from(limit).unwrap_or(i64::MAX),
        );
        let rows = self
            .run(bucket, "list the bucket", async |c| {
                c.query_typed(
                    &sql,
                    &[
                        (l, Type::TEXT),
                        (b, Type::TEXT),
                        (&after, Type::TEXT),
                        (&n, Type::INT8),
                    ],
                )
                .await
            })
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        let mut outcome = None;
        let result = self
            .run(bucket, "write the bucket", async |c| {
                let r = self.write_in(c, bucket, &write).await;
                match r {
                    Ok(done) => {
                        outcome = Some(done);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        result?;
        outcome.unwrap_or_else(|| {
            Err(BucketError::Unavailable {
                bucket: bucket.clone(),
                detail: "the write did not finish".into(),
            })
        })
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        let sql = format!(
            "SELECT b.lease, b.bucket, b.fence, b.size, (SELECT count(*) FROM {s}.entries e \
             WHERE e.lease = b.lease AND e.bucket = b.bucket) FROM {s}.buckets b \
             WHERE $1::text IS NULL OR b.lease = $1 ORDER BY b.lease, b.bucket",
            s = self.s()
        );
        let any = BucketName::new(lease.unwrap_or("*"), "*");
        let rows = self
            .run(&any, "list the buckets", async |c| {
                c.query_typed(&sql, &[(&lease, Type::TEXT)]).await
            })
            .await?;
        Ok(rows
            .iter()
            .map(|r| BucketInfo {
                name: BucketName::new(r.get::<_, &str>(0), r.get::<_, &str>(1)),
                fence: u(r.get(2)),
                bytes: u(r.get(3)),
                entries: u(r.get(4)),
            })
            .collect())
    }
}
