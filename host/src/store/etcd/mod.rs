//! The etcd store: lease records as keys of an etcd v3 cluster, through
//! its KV, Txn and Watch services only (no Election or Lock service, so
//! that any etcd-compatible server serves). The design, with the reasons,
//! is in `docs/etcd.md`.
//!
//! - **Layout.** A record and its *term floor* per lease, under a prefix
//!   ([`layout`]).
//! - **Writes.** Each create, renewal, acquisition, release and delete is
//!   one transaction comparing the record's `mod_revision` and bytes with
//!   the version last read (a version names one write, even after a
//!   restore reused revisions); a write that starts a term or creates the
//!   record writes the term floor in the same transaction, compared too,
//!   so no term is ever given out twice. A failed comparison is a
//!   [`StoreError::Conflict`].
//! - **Reads** take the record and its floor at one revision; a record
//!   below its floor reads at the floor.
//! - **Deletions.** A record deleted while held reads as its last state
//!   under a version of its own ([`TOMBSTONE`]); a missing record reads as
//!   released at its floor ([`deleted`](crate::store::deleted)).
//! - **Watching.** One watch of the prefix per store, from the revision its
//!   listing was read at and resumed from the revision after the last
//!   event: no gap, no duplicate; a compaction past it lists again. It is
//!   checked for silence with progress requests. A lease's stream only
//!   moves forward.
//! - **Rewinds.** A linearizable answer at a revision or raft term below
//!   one seen before the request was sent means the cluster went back
//!   (restored from an older snapshot, or replaced); answers to requests
//!   in flight together may come back in any order, so only the [`Mark`]
//!   taken before sending is compared. The store forgets every version, revision and
//!   floor it remembered and ends its watch, so that every stream reads
//!   afresh; the highest term it saw of each lease stays, so this host
//!   never gives out a term it saw given.
//! - **Timing.** Expiry is judged as by every store: by when a host saw
//!   the record change, on its own clock. etcd's own leases decide
//!   nothing.
//! - **Errors.** A failed comparison is [`StoreError::Conflict`]; denied
//!   permissions, failed authentication and invalid requests are
//!   [`StoreError::Refused`]; anything else the server or the connection
//!   says is [`StoreError::Unavailable`]; undecodable values are
//!   [`StoreError::Malformed`].

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{KeyValue, ResponseHeader, TxnOpResponse, TxnResponse};

pub mod buckets;
mod connect;
mod layout;
mod reads;
mod route;
mod watch;
mod writes;

pub use connect::map_error;

use self::watch::SharedWatch;
use super::deleted::DeletedRecords;
use super::{ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, TOMBSTONE, Versioned};

/// The key prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "/baton/";

/// How many recently seen versions of each lease are kept for
/// compare-and-swap (an update of a version not among them reads first).
const KEEP_VERSIONS: usize = 8;

/// How to reach the etcd cluster and where the leases live.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Client URLs (`http://host:port`, `https://host:port`).
    pub endpoints: Vec<String>,
    /// The prefix of every key this store reads and writes.
    pub prefix: String,
    /// The CA that signed the servers' certificates (`https` endpoints);
    /// default: the Web PKI roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A user and password, for etcd's authentication.
    pub user: Option<(String, String)>,
    /// The bound on establishing a connection to an endpoint.
    pub dial_timeout: Duration,
    /// The bound on the requests this store makes by itself (listing,
    /// starting and resuming its watch); replaced by
    /// [`LeaseStore::set_timings`]. The elector bounds all the others.
    pub request_timeout: Duration,
}

/// Lease records in etcd; see the [module documentation](self). Cloning is
/// cheap; clones share the connection and what was seen.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The members' clients, and the one in use.
    route: route::Route,
    prefix: String,
    endpoints: Vec<String>,
    /// The configured bound on the store's own requests: listings.
    configured_timeout: Duration,
    /// The bound on its watch's requests and silence: the configured one,
    /// or the leases' shortest request timeout if shorter.
    request_timeout: Mutex<Duration>,
    /// The recent versions of each lease.
    recent: Mutex<HashMap<String, Recent>>,
    /// What this store saw of each lease, for deleted records.
    seen: DeletedRecords,
    /// The store's one watch of its prefix.
    shared: Arc<SharedWatch>,
    /// The highest revision and raft term of the linearizable answers so
    /// far (both only grow while the cluster is the same).
    highest: Mutex<Mark>,
}

/// The highest revision and raft term seen before a request was sent: a
/// linearizable answer to it cannot be below either unless the cluster
/// went back. `epoch` counts the rewinds seen, so that answers to requests
/// sent before one are not taken for another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Mark {
    revision: i64,
    term: u64,
    epoch: u64,
}

impl Mark {
    /// At least `revision` (one this store knows was reached, such as a
    /// watch's resume point).
    pub(super) fn at_least(self, revision: i64) -> Mark {
        Mark {
            revision: self.revision.max(revision),
            ..self
        }
    }

    /// Notes, in the highest seen so far (`self`), an answer at `revision`
    /// and raft `term` to a request sent after `mark`. Returns whether it
    /// shows that the cluster went back: below the mark, with no rewind
    /// noticed since the mark was taken. Then the answer is the new
    /// highest, in a new epoch.
    pub(super) fn note(&mut self, revision: i64, term: u64, mark: Mark) -> bool {
        let below = revision < mark.revision || term < mark.term;
        if mark.epoch != self.epoch || !below {
            // In order or not, within what the cluster reached; or a request
            // sent before the last rewind was noticed, whose answer says
            // nothing about the cluster compared with now.
            self.revision = self.revision.max(revision);
            self.term = self.term.max(term);
            return false;
        }
        *self = Mark {
            revision,
            term,
            epoch: self.epoch + 1,
        };
        true
    }
}

/// What this store knows of one lease.
#[derive(Default)]
struct Recent {
    /// Recently seen versions and their bytes, newest last.
    versions: VecDeque<(String, Arc<[u8]>)>,
    /// The highest revision at which this store learned the lease's state
    /// (a read, a write, an event): nothing older is passed on.
    newest: i64,
    /// The term floor as last read (`Some(None)`: there was none), what a
    /// create compares.
    floor: Option<Option<u64>>,
    /// The create count as last read (0: none).
    creates: u64,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connects to the cluster (authenticating, if a user is configured:
    /// the one request made here) and opens the store.
    pub async fn connect(options: EtcdOptions) -> Result<EtcdStore, StoreError> {
        let route = connect::route(&options).await?;
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                route,
                prefix: options.prefix.clone(),
                endpoints: options.endpoints.clone(),
                configured_timeout: options.request_timeout,
                request_timeout: Mutex::new(options.request_timeout),
                recent: Mutex::new(HashMap::new()),
                seen: DeletedRecords::default(),
                shared: Arc::new(SharedWatch::default()),
                highest: Mutex::new(Mark::default()),
            }),
        })
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }
}

impl Inner {
    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recent>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request_timeout(&self) -> Duration {
        *self.request_timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lease_key(&self, lease: &str) -> String {
        layout::lease_key(&self.prefix, lease)
    }

    fn floor_key(&self, lease: &str) -> String {
        layout::floor_key(&self.prefix, lease)
    }

    fn creates_key(&self, lease: &str) -> String {
        layout::creates_key(&self.prefix, lease)
    }

    /// Remembers `bytes` as `version` of `lease`, learned at `revision`.
    fn remember(&self, lease: &str, version: &str, bytes: Arc<[u8]>, revision: i64) {
        let mut recent = self.recent();
        let r = recent.entry(lease.to_owned()).or_default();
        r.newest = r.newest.max(revision);
        if r.versions.iter().any(|(v, _)| v == version) {
            return;
        }
        if r.versions.len() == KEEP_VERSIONS {
            r.versions.pop_front();
        }
        r.versions.push_back((version.to_owned(), bytes));
    }

    /// The bytes of `version` of `lease`, if remembered.
    fn bytes_of(&self, lease: &str, version: &str) -> Option<Arc<[u8]>> {
        let recent = self.recent();
        let r = recent.get(lease)?;
        r.versions
            .iter()
            .find(|(v, _)| v == version)
            .map(|(_, b)| b.clone())
    }

    /// Whether `revision` is newer than anything this store learned of
    /// `lease`; if so, it is the newest from now on.
    fn advance(&self, lease: &str, revision: i64) -> bool {
        let mut recent = self.recent();
        let r = recent.entry(lease.to_owned()).or_default();
        if revision <= r.newest {
            return false;
        }
        r.newest = revision;
        true
    }

    /// The revision of a linearizable `answer` to a request sent after
    /// `mark`, noted (see [`observe`](Self::observe)).
    fn revision_of(&self, answer: &TxnResponse, mark: Mark) -> i64 {
        self.observe(answer.header(), mark);
        revision(answer)
    }

    /// The highest revision and raft term seen so far: taken before a
    /// request is sent, and given to [`observe`](Self::observe) with its
    /// answer.
    pub(super) fn mark(&self) -> Mark {
        *self.highest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the revision and raft term of a linearizable answer to a
    /// request sent after `mark`. Either below the mark means the cluster
    /// went back: everything remembered of versions, revisions and floors
    /// is forgotten and the shared watch ends, so that every stream reads
    /// afresh. What this store saw of terms (`seen`) stays. An answer below
    /// the highest seen but not below its mark is one of several requests
    /// in flight together, answered in another order. Returns whether it
    /// went back.
    fn observe(&self, header: Option<&ResponseHeader>, mark: Mark) -> bool {
        let Some(header) = header else { return false };
        let (revision, term) = (header.revision(), header.raft_term());
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if !highest.note(revision, term, mark) {
            return false;
        }
        let (seen_revision, seen_term) = (mark.revision, mark.term);
        drop(highest);
        tracing::error!(
            prefix = %self.prefix,
            from_revision = seen_revision,
            to_revision = revision,
            from_raft_term = seen_term,
            to_raft_term = term,
            "the etcd cluster went back (restored from an older snapshot, or replaced): forgetting \
             what this host read of it and watching afresh; terms stay above the highest this host \
             saw (docs/etcd.md#terms-never-reused)"
        );
        self.recent().clear();
        self.shared.break_off(StoreError::Unavailable {
            lease: ANY_LEASE.into(),
            detail: format!(
                "the etcd cluster went back from revision {seen_revision} to {revision}: watching afresh"
            ),
        });
        true
    }

    /// Bounds a request the store makes by itself by the watch's bound.
    async fn bounded<T>(
        &self,
        lease: &str,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        self.bounded_by(self.request_timeout(), lease, what, request)
            .await
    }

    /// Bounds a request the store makes by itself by `bound`.
    async fn bounded_by<T>(
        &self,
        bound: Duration,
        lease: &str,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(bound, request).await {
            Ok(answer) => answer.map_err(|e| map_error(lease, what, e)),
            Err(_) => Err(StoreError::Unavailable {
                lease: lease.to_owned(),
                detail: format!(
                    "{what} timed out after {}",
                    crate::support::rounding::human(bound)
                ),
            }),
        }
    }
}

/// The key-values of the ranges in a transaction's answer, in order (one
/// entry per range, `None` where it found nothing).
fn ranges(answer: &TxnResponse) -> Vec<Option<KeyValue>> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs().into_iter().next()),
            _ => None,
        })
        .collect()
}

/// The revision of a transaction's answer.
fn revision(answer: &TxnResponse) -> i64 {
    answer.header().map_or(0, |h| h.revision())
}

#[async_trait::async_trait]
impl LeaseStore for EtcdStore {
    fn describe(&self) -> String {
        format!(
            "etcd store: keys under {:?} at {}",
            self.inner.prefix,
            self.inner.endpoints.join(",")
        )
    }

    /// The bound on the watch's requests and silence: the leases' shortest
    /// request timeout, if shorter than the configured one.
    fn set_timings(&self, timings: StoreTimings) {
        let bound = timings.request_timeout.min(self.inner.configured_timeout);
        *self
            .inner
            .request_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = bound;
    }

    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        super::named(lease)?;
        self.read(lease, false).await
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

/// The error for a request that concerns the whole store.
fn store_refused(detail: String) -> StoreError {
    StoreError::Refused {
        lease: ANY_LEASE.into(),
        detail,
    }
}

#[cfg(test)]
mod tests;
