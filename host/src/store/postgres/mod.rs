//! The PostgreSQL store: lease records as rows of a schema of baton's own,
//! in the database a team already runs. The design, with the reasons, is
//! in `docs/postgres.md`.
//!
//! - **Schema.** Created and migrated at start-up by versioned migrations
//!   ([`schema`]): `leases` (one row per record), `lease_meta` (what stays
//!   when a record is deleted: the *term floor*, the create count, a write
//!   counter), a trigger that keeps `lease_meta` and notifies every
//!   change, and the write functions.
//! - **Writes.** Each create, renewal, acquisition and release is one call
//!   of a write function: one transaction that compares the record's
//!   version (a random id of its write), checks and raises the term floor
//!   when a term starts, and writes. A failed comparison is a
//!   [`StoreError::Conflict`].
//! - **Reads** take the record and its meta in one statement; a record
//!   below its floor reads at the floor; a missing record is handled as
//!   by every store ([`deleted`](crate::store::deleted)).
//! - **Watching.** `LISTEN` on a connection of the store's own; every
//!   change's notification carries the row when it fits. After every
//!   (re)connect the watched leases are read afresh, since notifications
//!   sent meanwhile are lost; a silent connection is probed and dropped.
//!   Where notifications do not arrive (a pooler in transaction mode) the
//!   store says so and polls instead.
//! - **Promotions.** A record written before a standby was promoted may
//!   be older than the primary's last writes, which asynchronous
//!   replication can lose: it reads as held by nobody known, for the
//!   longest lease duration from first sight, and the next term is above
//!   every term the old timelines can have given out. See
//!   `docs/postgres.md#failover`.
//! - **Timing.** Expiry is judged as by every store: by when a host saw
//!   the record change, on its own clock. The database's clock decides
//!   nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;

pub mod buckets;
mod connect;
mod reads;
pub mod schema;
mod watch;
mod writes;

pub use connect::map_error;

use self::watch::SharedWatch;
use super::deleted::DeletedRecords;
use super::{ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, TOMBSTONE, Versioned};

/// The schema when none is configured.
pub const DEFAULT_SCHEMA: &str = "baton";

/// The holder a record written before a promotion reads as held by.
pub const BEFORE_PROMOTION: &str = "(unknown: written before the database was promoted)";

/// How many recently seen versions of each lease are kept.
const KEEP_VERSIONS: usize = 8;

/// How the store hears of changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchMode {
    /// `LISTEN`/`NOTIFY`, falling back to polling if notifications do not
    /// arrive (a pooler in transaction mode).
    #[default]
    Notify,
    /// Polling every `poll_interval`, without trying notifications.
    Poll,
}

/// How to reach the database and where the leases live.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// A connection URL or libpq key-value string; `None`: the libpq
    /// environment (`PGHOST`, `PGPORT`, `PGUSER`, ...).
    pub url: Option<String>,
    /// The schema of baton's tables.
    pub schema: String,
    /// The CA of the server's certificate (libpq's `sslrootcert`).
    pub ca: Option<PathBuf>,
    /// The most connections the store's pool opens (its watch's one
    /// apart).
    pub pool_size: usize,
    /// The bound on connecting.
    pub connect_timeout: Duration,
    /// The bound on the store's own requests; replaced by
    /// [`LeaseStore::set_timings`] when that is shorter.
    pub request_timeout: Duration,
    /// How changes are heard.
    pub watch: WatchMode,
    /// How often a polling store reads the watched leases.
    pub poll_interval: Duration,
}

impl PostgresOptions {
    /// Options for `url` with every default (unit tests).
    pub fn for_tests(url: Option<&str>) -> PostgresOptions {
        PostgresOptions {
            url: url.map(str::to_owned),
            schema: DEFAULT_SCHEMA.into(),
            ca: None,
            pool_size: 4,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            watch: WatchMode::Notify,
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Lease records in PostgreSQL; see the [module documentation](self).
/// Cloning is cheap; clones share the pool and what was seen.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    connector: connect::Connector,
    schema: String,
    /// The quoted schema, for statements.
    s: String,
    options: PostgresOptions,
    /// The bound on the store's own requests.
    request_timeout: Mutex<Duration>,
    /// The duration of a record read as held by nobody known.
    fallback_duration: Mutex<Duration>,
    recent: Mutex<HashMap<String, Recent>>,
    seen: DeletedRecords,
    shared: Arc<SharedWatch>,
    /// The highest timeline seen.
    timeline: Mutex<i32>,
}

/// What this store knows of one lease.
#[derive(Default)]
struct Recent {
    /// Recently reported versions, newest last.
    versions: std::collections::VecDeque<String>,
    /// The highest write counter at which this store learned the lease's
    /// state: nothing older is passed on.
    newest: i64,
    /// The meta as last read: `Some(None)`, there was none; floor and
    /// creates.
    meta: Option<Option<(u64, u64)>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.inner.connector.describe)
            .field("schema", &self.inner.schema)
            .finish()
    }
}

impl PostgresStore {
    /// Connects (one connection, which migrates the schema) and opens the
    /// store; the libpq variables are read through `env`.
    pub async fn connect(
        options: PostgresOptions,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<PostgresStore, StoreError> {
        validate_schema(&options.schema)?;
        let connector = connect::connector(&options, env)?;
        let pool = connect::pool(&connector, options.pool_size, &schema::quoted(&options.schema))?;
        let what = format!("connect to {}", connector.describe);
        let mut client = tokio::time::timeout(options.connect_timeout + options.request_timeout, pool.get())
            .await
            .map_err(|_| StoreError::Unavailable {
                lease: ANY_LEASE.into(),
                detail: format!("{what}: timed out"),
            })?
            .map_err(|e| connect::pool_error(ANY_LEASE, &what, e))?;
        let applied = schema::migrate(&mut client, &options.schema).await?;
        if !applied.is_empty() {
            tracing::info!(schema = %options.schema, migrations = ?applied, "migrated the PostgreSQL store's schema");
        }
        drop(client);
        // Every connection of the pool opened (and warmed up) now, not in
        // the middle of a hand-over: a connection's TLS handshake and
        // SCRAM authentication take milliseconds, and a term's start asks
        // for several at once. Best effort.
        let opened = futures::future::join_all((0..options.pool_size).map(|_| pool.get()));
        drop(tokio::time::timeout(options.connect_timeout, opened).await);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                s: schema::quoted(&options.schema),
                schema: options.schema.clone(),
                request_timeout: Mutex::new(options.request_timeout),
                // Until `set_timings`, which opening the store always calls.
                fallback_duration: Mutex::new(Duration::from_secs(15)),
                connector,
                options,
                recent: Mutex::new(HashMap::new()),
                seen: DeletedRecords::default(),
                shared: Arc::new(SharedWatch::default()),
                timeline: Mutex::new(0),
            }),
        })
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }
}

/// Refuses a schema name that is not a plain lowercase identifier.
pub fn validate_schema(schema: &str) -> Result<(), StoreError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Refused {
            lease: ANY_LEASE.into(),
            detail: format!(
                "field `schema`: {schema:?} is not a schema name (1 to 63 of a-z, 0-9 and _, not starting with a digit)"
            ),
        })
    }
}

impl Inner {
    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recent>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request_timeout(&self) -> Duration {
        *self.request_timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fallback_duration(&self) -> Duration {
        *self.fallback_duration.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `version` of `lease`, learned at write counter `seq`.
    fn remember(&self, lease: &str, version: &str, seq: i64) {
        let mut recent = self.recent();
        let r = recent.entry(lease.to_owned()).or_default();
        r.newest = r.newest.max(seq);
        if r.versions.iter().any(|v| v == version) {
            return;
        }
        if r.versions.len() == KEEP_VERSIONS {
            r.versions.pop_front();
        }
        r.versions.push_back(version.to_owned());
    }

    /// Whether `seq` is newer than anything this store learned of
    /// `lease`; if so, it is the newest from now on.
    fn advance(&self, lease: &str, seq: i64) -> bool {
        let mut recent = self.recent();
        let r = recent.entry(lease.to_owned()).or_default();
        if seq <= r.newest {
            return false;
        }
        r.newest = seq;
        true
    }

    /// Notes the server's timeline `tl`. A higher one than seen before
    /// means a standby was promoted: the write counters may have gone
    /// back with writes it never received, so everything remembered of
    /// them is forgotten and the watch ends (every stream reads afresh).
    /// What this store saw of terms stays.
    fn note_timeline(&self, tl: i32) {
        let mut seen = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        if tl <= *seen {
            return;
        }
        let before = std::mem::replace(&mut *seen, tl);
        drop(seen);
        if before == 0 {
            return;
        }
        tracing::warn!(
            schema = %self.schema,
            from_timeline = before,
            to_timeline = tl,
            "the PostgreSQL server is on a new timeline (a standby was promoted): records written \
             before read as held by nobody known for a lease duration, and new terms start above \
             the old timelines' (docs/postgres.md#failover)"
        );
        self.recent().clear();
        self.shared.break_off(StoreError::Unavailable {
            lease: ANY_LEASE.into(),
            detail: format!("the database was promoted (timeline {before} to {tl}): watching afresh"),
        });
    }

    /// A pooled connection, bounded by `bound`.
    async fn client(
        &self,
        lease: &str,
        what: &str,
        bound: Duration,
    ) -> Result<deadpool_postgres::Object, StoreError> {
        match tokio::time::timeout(bound, self.pool.get()).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(connect::pool_error(lease, what, e)),
            Err(_) => Err(timed_out(lease, what, bound)),
        }
    }

    /// Runs `request` on a pooled connection, bounded by `bound` if given
    /// (the store's own requests) or by the caller (the elector's): a
    /// connection whose request did not finish is not used again.
    async fn on_connection<T, F>(
        &self,
        lease: &str,
        what: &str,
        bound: Option<Duration>,
        request: F,
    ) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut deadpool_postgres::Object) -> Result<T, tokio_postgres::Error>,
    {
        let limit = bound.unwrap_or(Duration::from_secs(3600));
        let client = self.client(lease, what, limit).await?;
        let mut guard = PoisonOnDrop(Some(client));
        let c = guard.0.as_mut().expect("a connection");
        let result = match tokio::time::timeout(limit, request(c)).await {
            Ok(r) => r.map_err(|e| map_error(lease, what, e)),
            Err(_) => Err(timed_out(lease, what, limit)),
        };
        if result.is_ok() {
            // Finished: back to the pool.
            drop(guard.0.take());
        }
        result
    }
}

/// A pooled connection that is discarded, not returned, unless taken out
/// first: a request cut off (by a timeout, or its caller dropping it) may
/// have left the connection hung.
struct PoisonOnDrop(Option<deadpool_postgres::Object>);

impl Drop for PoisonOnDrop {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            let _ = deadpool_postgres::Object::take(client);
        }
    }
}

fn timed_out(lease: &str, what: &str, bound: Duration) -> StoreError {
    StoreError::Unavailable {
        lease: lease.to_owned(),
        detail: format!(
            "{what} timed out after {}",
            crate::support::rounding::human(bound)
        ),
    }
}

#[async_trait::async_trait]
impl LeaseStore for PostgresStore {
    fn describe(&self) -> String {
        format!(
            "postgres store: schema {:?} at {}",
            self.inner.schema, self.inner.connector.describe
        )
    }

    fn set_timings(&self, timings: StoreTimings) {
        let bound = timings.request_timeout.min(self.inner.options.request_timeout);
        *self
            .inner
            .request_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = bound;
        *self
            .inner
            .fallback_duration
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = timings.fallback_duration;
    }

    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        super::named(lease)?;
        self.read(lease, None).await
    }

    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError> {
        super::named(lease)?;
        self.create_over(lease, record, None, false).await
    }

    async fn update(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        super::named(lease)?;
        if version.starts_with(TOMBSTONE) {
            return self.recreate(lease, version, record).await;
        }
        self.replace(lease, version, record).await
    }

    async fn delete_if(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        super::named(lease)?;
        if version.starts_with(TOMBSTONE) {
            return Ok(false);
        }
        self.delete_version(lease, version).await
    }

    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError> {
        super::named(lease)?;
        watch::open(self, lease).await
    }

    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError> {
        let (read, unreadable) = self.list_readable().await?;
        match unreadable.into_iter().next() {
            Some((lease, detail)) => Err(StoreError::Malformed { lease, detail }),
            None => Ok(read),
        }
    }

    async fn list_readable(&self) -> Result<(Vec<(String, Versioned)>, Vec<(String, String)>), StoreError> {
        self.list_under("").await
    }

    async fn list_prefixed(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        Ok(self.list_under(prefix).await?.0)
    }
}

#[cfg(test)]
mod tests;
