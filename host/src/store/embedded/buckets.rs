//! The embedded store's buckets: one SQLite database in the store's
//! directory (`buckets/buckets.sqlite3`), shared by every process of the
//! machine that opens the store.
//!
//! - **Several processes.** SQLite's own file locks order them; a write
//!   runs in `BEGIN IMMEDIATE`, so it holds the database's write lock from
//!   its first read of the fence to its commit. A claim is one such
//!   transaction too, so a write and a claim never interleave.
//! - **Crashes.** The database is in WAL mode with `synchronous = FULL`: a
//!   write is acknowledged only once its commit is in the log on disk, and
//!   a process killed at any point leaves either the whole transaction or
//!   none of it (SQLite's recovery on the next open).
//! - **The fence.** Each bucket's row holds its fence, its revision and its
//!   size; a write of a term below the fence is refused inside the
//!   transaction, and the writer's last check ([`Write::may_commit`]) runs
//!   right before the commit.
//!
//! Calls run on tokio's blocking pool; a busy database is waited for up to
//! [`BUSY_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::store::buckets::{
    Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Limits, Op, Write, check_fence,
    check_key, check_size, check_value, incremented,
};

/// How long a call waits for another process's write to finish.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The database's file, under the store's directory (in a directory of its
/// own, so the lease watches' inotify sees none of its writes).
pub const DATABASE: &str = "buckets/buckets.sqlite3";

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS buckets (
        lease TEXT NOT NULL,
        bucket TEXT NOT NULL,
        fence INTEGER NOT NULL,
        revision INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        PRIMARY KEY (lease, bucket)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS entries (
        lease TEXT NOT NULL,
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        version INTEGER NOT NULL,
        PRIMARY KEY (lease, bucket, key)
    ) WITHOUT ROWID;
";

/// The embedded store's buckets.
#[derive(Clone)]
pub struct EmbeddedBuckets {
    path: Arc<PathBuf>,
    db: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for EmbeddedBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBuckets")
            .field("path", &self.path)
            .finish()
    }
}

/// A bucket's row.
#[derive(Clone, Copy, Default)]
struct Row {
    fence: u64,
    revision: u64,
    bytes: u64,
}

impl EmbeddedBuckets {
    /// Opens (creating if needed) the buckets of the embedded store in
    /// `store_dir`.
    pub fn open(store_dir: &Path) -> Result<EmbeddedBuckets, BucketError> {
        let path = store_dir.join(DATABASE);
        let fail = |e: &dyn std::fmt::Display| BucketError::Unavailable {
            bucket: BucketName::new("*", "*"),
            detail: format!("cannot open {}: {e}", path.display()),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        }
        let db = connect_waiting(&path).map_err(|e| fail(&e))?;
        Ok(EmbeddedBuckets {
            path: Arc::new(path),
            db: Arc::new(Mutex::new(db)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection, on the blocking pool.
    async fn call<R: Send + 'static>(
        &self,
        bucket: &BucketName,
        f: impl FnOnce(&mut Connection) -> Result<R, BucketError> + Send + 'static,
    ) -> Result<R, BucketError> {
        let db = self.db.clone();
        let task = tokio::task::spawn_blocking(move || f(&mut db.lock().unwrap_or_else(|e| e.into_inner())));
        task.await.unwrap_or_else(|e| {
            Err(BucketError::Unavailable {
                bucket: bucket.clone(),
                detail: format!("the database call failed: {e}"),
            })
        })
    }
}

/// Opens the database, in WAL mode, with the schema, waiting up to
/// [`BUSY_TIMEOUT`] while other processes do the same: switching to WAL
/// and a schema write that began as a read can be refused at once with
/// `SQLITE_BUSY`, without the busy handler, when two hosts start together.
fn connect_waiting(path: &Path) -> rusqlite::Result<Connection> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match connect(path) {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            done => return done,
        }
    }
}

/// One attempt of [`connect_waiting`].
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let mut db = Connection::open(path)?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    db.pragma_update(None, "synchronous", "FULL")?;
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    tx.commit()?;
    Ok(db)
}

/// Whether SQLite refused for a lock another connection holds.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// An SQLite error as a bucket error.
fn sql(bucket: &BucketName) -> impl Fn(rusqlite::Error) -> BucketError + '_ {
    move |e| BucketError::Unavailable {
        bucket: bucket.clone(),
        detail: e.to_string(),
    }
}

fn read_row(tx: &Connection, b: &BucketName) -> Result<Option<Row>, BucketError> {
    tx.query_row(
        "SELECT fence, revision, bytes FROM buckets WHERE lease = ?1 AND bucket = ?2",
        params![b.lease, b.bucket],
        |r| {
            Ok(Row {
                fence: r.get::<_, i64>(0)? as u64,
                revision: r.get::<_, i64>(1)? as u64,
                bytes: r.get::<_, i64>(2)? as u64,
            })
        },
    )
    .optional()
    .map_err(sql(b))
}

fn write_row(tx: &Connection, b: &BucketName, row: Row) -> Result<(), BucketError> {
    tx.execute(
        "INSERT INTO buckets (lease, bucket, fence, revision, bytes) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (lease, bucket) DO UPDATE SET fence = ?3, revision = ?4, bytes = ?5",
        params![
            b.lease,
            b.bucket,
            row.fence as i64,
            row.revision as i64,
            row.bytes as i64
        ],
    )
    .map_err(sql(b))?;
    Ok(())
}

fn read_entry(tx: &Connection, b: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
    tx.query_row(
        "SELECT value, version FROM entries WHERE lease = ?1 AND bucket = ?2 AND key = ?3",
        params![b.lease, b.bucket, key],
        |r| {
            Ok(Entry {
                value: r.get(0)?,
                version: r.get::<_, i64>(1)? as u64,
            })
        },
    )
    .optional()
    .map_err(sql(b))
}

/// Sets `key` and returns the change in the bucket's bytes.
fn put_entry(
    tx: &Connection,
    b: &BucketName,
    key: &str,
    value: &[u8],
    version: u64,
) -> Result<i64, BucketError> {
    let old = read_entry(tx, b, key)?.map_or(0, |e| (key.len() + e.value.len()) as i64);
    tx.execute(
        "INSERT INTO entries (lease, bucket, key, value, version) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (lease, bucket, key) DO UPDATE SET value = ?4, version = ?5",
        params![b.lease, b.bucket, key, value, version as i64],
    )
    .map_err(sql(b))?;
    Ok((key.len() + value.len()) as i64 - old)
}

/// Deletes `key` and returns the change in the bucket's bytes.
fn delete_entry(tx: &Connection, b: &BucketName, key: &str) -> Result<i64, BucketError> {
    let old = read_entry(tx, b, key)?.map_or(0, |e| (key.len() + e.value.len()) as i64);
    tx.execute(
        "DELETE FROM entries WHERE lease = ?1 AND bucket = ?2 AND key = ?3",
        params![b.lease, b.bucket, key],
    )
    .map_err(sql(b))?;
    Ok(-old)
}

/// Applies one op at `version`; returns the change in bytes and, for an
/// increment, the new value.
fn apply_op(
    tx: &Connection,
    b: &BucketName,
    op: &Op,
    version: u64,
    limits: Limits,
) -> Result<(i64, Option<i64>), BucketError> {
    check_key(b, op.key(), limits)?;
    match op {
        Op::Set { key, value } => {
            check_value(b, key, value, limits)?;
            Ok((put_entry(tx, b, key, value, version)?, None))
        }
        Op::Delete { key } => Ok((delete_entry(tx, b, key)?, None)),
        Op::Increment { key, delta } => {
            let now = read_entry(tx, b, key)?;
            let next = incremented(b, key, now.as_ref().map(|e| e.value.as_slice()), *delta)?;
            Ok((
                put_entry(tx, b, key, next.to_string().as_bytes(), version)?,
                Some(next),
            ))
        }
        Op::Swap {
            key,
            version: seen,
            value,
        } => {
            let now = read_entry(tx, b, key)?.map_or(0, |e| e.version);
            if now != *seen {
                return Err(BucketError::Changed {
                    bucket: b.clone(),
                    key: key.clone(),
                });
            }
            check_value(b, key, value, limits)?;
            Ok((put_entry(tx, b, key, value, version)?, None))
        }
    }
}

/// One write in one transaction; see the [module documentation](self).
fn apply_in(db: &mut Connection, b: &BucketName, write: &Write) -> Result<Applied, BucketError> {
    let tx = db
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql(b))?;
    let mut row = read_row(&tx, b)?.unwrap_or_default();
    check_fence(b, write.term, row.fence)?;
    let version = row.revision + 1;
    let mut bytes = row.bytes as i64;
    let mut applied = Vec::new();
    for op in &write.ops {
        let (delta, value) = apply_op(&tx, b, op, version, write.limits)?;
        bytes += delta;
        applied.extend(value);
    }
    check_size(b, bytes.max(0) as u64, write.limits)?;
    row = Row {
        fence: write.term,
        revision: version,
        bytes: bytes.max(0) as u64,
    };
    write_row(&tx, b, row)?;
    if !(write.may_commit)() {
        return Err(BucketError::Stopped {
            bucket: b.clone(),
            term: write.term,
        });
    }
    tx.commit().map_err(sql(b))?;
    Ok(applied)
}

#[async_trait::async_trait]
impl BucketStore for EmbeddedBuckets {
    fn describe(&self) -> String {
        format!("buckets in {}", self.path.display())
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        let b = bucket.clone();
        self.call(bucket, move |db| {
            let tx = db
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql(&b))?;
            let row = read_row(&tx, &b)?.unwrap_or_default();
            check_fence(&b, term, row.fence)?;
            if row.fence != term {
                write_row(&tx, &b, Row { fence: term, ..row })?;
                tx.commit().map_err(sql(&b))?;
            }
            Ok(row.fence)
        })
        .await
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        let (b, key) = (bucket.clone(), key.to_owned());
        self.call(bucket, move |db| read_entry(db, &b, &key)).await
    }

    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        let (b, keys) = (bucket.clone(), keys.to_vec());
        self.call(bucket, move |db| {
            let tx = db.transaction().map_err(sql(&b))?;
            keys.iter().map(|k| read_entry(&tx, &b, k)).collect()
        })
        .await
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        let (b, after) = (bucket.clone(), after.map(str::to_owned));
        self.call(bucket, move |db| {
            let mut q = db
                .prepare_cached(
                    "SELECT key FROM entries WHERE lease = ?1 AND bucket = ?2 AND (?3 IS NULL OR key > ?3)
                     ORDER BY key LIMIT ?4",
                )
                .map_err(sql(&b))?;
            let keys = q
                .query_map(params![b.lease, b.bucket, after, limit as i64], |r| {
                    r.get::<_, String>(0)
                })
                .map_err(sql(&b))?;
            keys.collect::<Result<Vec<_>, _>>().map_err(sql(&b))
        })
        .await
    }

    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        let b = bucket.clone();
        self.call(bucket, move |db| apply_in(db, &b, &write)).await
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        let any = BucketName::new(lease.unwrap_or("*"), "*");
        let lease = lease.map(str::to_owned);
        self.call(&any.clone(), move |db| {
            let mut q = db
                .prepare_cached(
                    "SELECT b.lease, b.bucket, b.fence, b.bytes,
                            (SELECT COUNT(*) FROM entries e WHERE e.lease = b.lease AND e.bucket = b.bucket)
                     FROM buckets b WHERE ?1 IS NULL OR b.lease = ?1 ORDER BY b.lease, b.bucket",
                )
                .map_err(sql(&any))?;
            let rows = q
                .query_map(params![lease], |r| {
                    Ok(BucketInfo {
                        name: BucketName {
                            lease: r.get(0)?,
                            bucket: r.get(1)?,
                        },
                        fence: r.get::<_, i64>(2)? as u64,
                        bytes: r.get::<_, i64>(3)? as u64,
                        entries: r.get::<_, i64>(4)? as u64,
                    })
                })
                .map_err(sql(&any))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql(&any))
        })
        .await
    }
}
