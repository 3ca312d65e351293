//! Lease stores: where lease records live, behind one trait.
//!
//! The elector (see [`crate::election`]) needs four things from a store:
//! read a record, create one, replace one only if nobody else wrote it in
//! between (compare-and-swap on an opaque version), and hear about changes
//! without polling. Everything a backend does beyond that (files, the
//! Kubernetes API) stays inside its module. The record mirrors a Kubernetes
//! `coordination.k8s.io/v1` Lease spec.
//!
//! - [`embedded`]: a directory on the local disk; the default, needs nothing
//!   installed, and lets several `baton` processes on one machine contend.
//! - [`kube`]: Lease objects of a Kubernetes API server, for many machines.
//! - [`etcd`] and [`postgres`]: keys of an etcd v3 cluster, rows of a
//!   PostgreSQL database, for hosts on many machines without Kubernetes.
//! - [`memory`]: in-process, with fault injection, for the elector's tests.
//! - Beside them: [`subscription`] keeps the latest record of a lease
//!   current apart from the elector; [`deleted`] is the one implementation
//!   of the deleted-records rules below, which every backend uses.
//!
//! # Deleted records
//!
//! A record deleted while held (a file removed, `kubectl delete lease`)
//! reads, in every store that saw it held, as its last state, still held,
//! under a version of its own (a *tombstone*: a version starting with
//! [`TOMBSTONE`]). The holder keeps leading and writes the record again at
//! its next renewal (an update of a tombstone is a create); the others wait
//! out the holder's lease from when they saw the deletion. A deleted record
//! without a holder, or one the store never saw, reads as released at the
//! lease's highest term, which every store keeps apart from the
//! record, so that terms are never reused. The exact rules are in
//! [`deleted`]; the elector only passes the versions back to
//! [`LeaseStore::update`].
//!
//! # Reads never go back
//!
//! Neither a read nor a watch of a store reports a state of a lease older
//! than one this same store already reported or wrote: a watch event that
//! was overtaken by the store's own write is not passed on. The elector
//! relies on this: its own writes and its subscription's sightings come
//! from one store.

use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub mod buckets;
pub mod deleted;
pub mod embedded;
pub mod etcd;
pub mod kube;
pub mod memory;
pub mod postgres;
pub mod subscription;

/// The `lease` named in errors that concern a whole store rather than one
/// lease (opening it, listing it).
pub const ANY_LEASE: &str = "*";

/// The duration written on release: others may take over at once. Zero is
/// not a valid Kubernetes lease duration (client-go#754), hence one second.
pub const RELEASED_LEASE_DURATION: Duration = Duration::from_secs(1);

/// The longest lease name allowed (as for a Kubernetes object name).
const MAX_LEASE_NAME: usize = 253;

/// Checks that `name` can name a lease: a lowercase RFC 1123 subdomain, as
/// Kubernetes requires for object names.
///
/// That is, at most 253 characters, made of dot-separated labels, each
/// non-empty, of lowercase letters, digits and `-`, starting and ending with a
/// letter or digit (for example `demo`, `jobs.billing-1`). Such a name is safe
/// as a file name and maps one to one to a Kubernetes Lease.
///
/// The error explains what is wrong with the name.
///
/// ```
/// use baton::store::validate_lease_name;
///
/// assert!(validate_lease_name("jobs.billing-1").is_ok());
/// assert!(validate_lease_name("Jobs").unwrap_err().to_string().contains("lowercase"));
/// ```
pub fn validate_lease_name(name: &str) -> Result<(), InvalidLeaseName> {
    if name.is_empty() {
        return Err(InvalidLeaseName::Empty);
    }
    if name.len() > MAX_LEASE_NAME {
        return Err(InvalidLeaseName::TooLong {
            name: name.to_owned(),
            length: name.len(),
        });
    }
    for label in name.split('.') {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let valid = match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
            }
            _ => false,
        };
        if !valid {
            return Err(InvalidLeaseName::NotASubdomain {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

/// Refuses a name that cannot name a lease, as the store's error about
/// it, so that a store writes (and reads) nothing under it.
pub(crate) fn named(lease: &str) -> Result<(), StoreError> {
    validate_lease_name(lease).map_err(|e| StoreError::Refused {
        lease: lease.into(),
        detail: e.to_string(),
    })
}

/// Why a name cannot name a lease ([`validate_lease_name`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLeaseName {
    /// The name is empty.
    #[error("invalid lease name: it is empty")]
    Empty,
    /// The name is longer than 253 characters.
    #[error("invalid lease name {name:?}: {length} characters, at most {MAX_LEASE_NAME} allowed")]
    TooLong {
        /// The name.
        name: String,
        /// Its length, in bytes.
        length: usize,
    },
    /// A label is empty, or holds a character other than `a-z`, `0-9` and
    /// `-`, or starts or ends with `-`.
    #[error(
        "invalid lease name {name:?}: must be a lowercase RFC 1123 subdomain \
         (dot-separated labels of a-z, 0-9 and '-', each starting and ending \
         with a letter or digit)"
    )]
    NotASubdomain {
        /// The name.
        name: String,
    },
}

/// The version prefix of a record deleted while held; see [Deleted
/// records](self#deleted-records). No store's own versions contain `@`.
pub const TOMBSTONE: &str = "deleted@";

/// One lease record, as written by the holder.
///
/// The fields mirror a Kubernetes Lease spec (`holderIdentity`,
/// `leaseDurationSeconds`, `acquireTime`, `renewTime`, `leaseTransitions`).
/// Times inside the record are informational only: expiry is judged by the
/// local monotonic time at which a reader saw the record change, plus the
/// duration written here (see [`crate::election`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// Who holds the lease; `None` (or an empty string in a foreign record)
    /// means nobody does.
    pub holder: Option<String>,
    /// How long the holder may go without renewing before others may take
    /// the lease over. Readers use this value, never their own.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// When the current holder acquired the lease (wall clock).
    #[serde(default, with = "humantime_serde")]
    pub acquire_time: Option<SystemTime>,
    /// When the current holder last renewed the lease (wall clock).
    #[serde(default, with = "humantime_serde")]
    pub renew_time: Option<SystemTime>,
    /// The term: how many times any host has started leading this lease.
    /// It grows by one with every acquisition, so the number identifies the
    /// term and serves as a fencing token. Stored as `transitions` (the
    /// embedded store's files) and `leaseTransitions` (a Kubernetes Lease),
    /// the name Kubernetes gives it.
    #[serde(rename = "transitions")]
    pub term: u64,
    /// A random id the holder's process chose when it started: two
    /// processes started under one identity (a configuration mistake, or a
    /// restarted process while the old one still runs) tell their records
    /// apart by it, so neither takes the other's record for its own. Stored
    /// as `holderInstance` (the embedded store's files) and the annotation
    /// `baton.dev/holder-instance` (a Kubernetes Lease); `None` in records
    /// of other writers and of older baton versions, which no process takes
    /// for its own.
    #[serde(default, rename = "holderInstance", skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Set on a release that `baton yield` made: who yielded the lease and
    /// for how long it keeps out of contention for it. Only on a record
    /// without holder (any write that takes the lease drops it). Stored as
    /// `yielded` (the embedded store's files: `{"by": "node-a", "for":
    /// "15s"}`) and the annotations `baton.dev/yielded-by` and
    /// `baton.dev/yielded-for` (a Kubernetes Lease); other writers and
    /// older baton versions ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yielded: Option<Yielded>,
    /// The plugins the holder may run in its term: its *claims*. A host
    /// starts a plugin under a lease only once a write of its term lists
    /// the plugin and no other lease's live record lists it (see
    /// [`crate::election::claims`]); a plugin stays listed until its task
    /// is gone. Stored as `plugins` (the embedded store's files) and the
    /// annotation `baton.dev/plugins`, comma-separated (a Kubernetes
    /// Lease); `None` in records of other writers, of older baton
    /// versions, and without a holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Vec<String>>,
    /// The holder host as it describes itself: how to reach it, whether it
    /// drains, its weight ([`HostInfo`]). Written with every write of
    /// baton's that holds the lease (the membership record and every
    /// ordinary lease), never on a release, and never kept by a write that
    /// changes the holder. Stored as `host` (the embedded store's files:
    /// `{"address": "10.1.2.3:8080", "draining": false, "weight": 1}`) and
    /// the annotations `baton.dev/holder-address`, `baton.dev/draining`
    /// and `baton.dev/weight` (a Kubernetes Lease); `None` in records of
    /// other writers, of older baton versions, and without a holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostInfo>,
}

/// What a holder publishes about its host in the records it writes
/// ([`LeaseRecord::host`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// How others reach this host's service (`advertise-address`, or the
    /// pod IP on Kubernetes); `None` when not configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Whether the host is draining: handing its leases over and taking
    /// none.
    #[serde(default)]
    pub draining: bool,
    /// The host's weight in spreading the leads (1 unless configured).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The manifest digest of each plugin the host has loaded from a
    /// registry, by plugin: what its next term runs (and its current one,
    /// unless a reload changed it meanwhile).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub versions: std::collections::BTreeMap<String, String>,
}

/// [`HostInfo::weight`] unless configured.
pub const DEFAULT_WEIGHT: u32 = 1;

fn default_weight() -> u32 {
    DEFAULT_WEIGHT
}

impl Default for HostInfo {
    fn default() -> HostInfo {
        HostInfo {
            address: None,
            draining: false,
            weight: DEFAULT_WEIGHT,
            versions: std::collections::BTreeMap::new(),
        }
    }
}

/// A yield, as a release record carries it; see [`LeaseRecord::yielded`].
///
/// The duration counts from when a reader sees the release, on its own
/// monotonic clock (as a lease's duration does), never from a timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Yielded {
    /// The identity of the host that yielded.
    pub by: String,
    /// How long that host does not contend for the lease.
    #[serde(rename = "for", with = "humantime_serde")]
    pub duration: Duration,
}

impl LeaseRecord {
    /// A record of `holder` (`None`: released) in `term`, for
    /// `lease_duration`, and nothing else: no times, instance, claims or
    /// yield. What a test or a tool writes where only those three matter;
    /// the elector's writes fill in the rest.
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::store::LeaseRecord;
    ///
    /// let record = LeaseRecord::new(Some("node-a"), 3, Duration::from_secs(15));
    /// assert_eq!((record.holder(), record.term), (Some("node-a"), 3));
    /// ```
    pub fn new(holder: Option<&str>, term: u64, lease_duration: Duration) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_owned),
            lease_duration,
            acquire_time: None,
            renew_time: None,
            term,
            instance: None,
            yielded: None,
            plugins: None,
            host: None,
        }
    }

    /// The holder's address ([`HostInfo::address`]), if the record has a
    /// holder that published one.
    pub fn holder_address(&self) -> Option<&str> {
        self.holder()?;
        self.host.as_ref()?.address.as_deref()
    }

    /// The holder, treating an empty identity as no holder.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }

    /// Whether the record is held by the process that runs under
    /// `identity` with the random `instance`: only that process may take
    /// it for its own.
    pub fn held_by(&self, identity: &str, instance: &str) -> bool {
        self.holder() == Some(identity) && self.instance.as_deref() == Some(instance)
    }

    /// Whether the record's holder claims `plugin` (see [`plugins`](Self::plugins)).
    pub fn claims(&self, plugin: &str) -> bool {
        self.holder().is_some()
            && self
                .plugins
                .as_ref()
                .is_some_and(|p| p.iter().any(|n| n == plugin))
    }

    /// Whether the record is held under `identity` by another process (one
    /// started under the same identity).
    pub fn held_by_namesake(&self, identity: &str, instance: &str) -> bool {
        self.holder() == Some(identity) && self.instance.as_deref() != Some(instance)
    }
}

/// A record together with the store's opaque version of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The record.
    pub record: LeaseRecord,
    /// The version to pass to [`LeaseStore::update`]; changes with every
    /// write.
    pub version: String,
}

/// Why a store operation failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// Someone else wrote first: the version did not match, or the record
    /// already exists. Never retried blindly; the elector re-reads.
    #[error("lease {lease:?}: conflict: {detail}")]
    Conflict {
        /// The lease at fault.
        lease: String,
        /// What the store said.
        detail: String,
    },
    /// The store could not be reached or did not answer in time.
    #[error("lease {lease:?}: store unavailable: {detail}")]
    Unavailable {
        /// The lease at fault.
        lease: String,
        /// What went wrong.
        detail: String,
    },
    /// The record exists but cannot be read as a lease record.
    #[error("lease {lease:?}: malformed record: {detail}")]
    Malformed {
        /// The lease at fault.
        lease: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The store refused the request for a reason that retrying will not
    /// fix (for example, permissions).
    #[error("lease {lease:?}: {detail}")]
    Refused {
        /// The lease at fault.
        lease: String,
        /// What the store said.
        detail: String,
    },
}

impl StoreError {
    /// Whether this error is a compare-and-swap conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    /// The same error, about `lease`: a failure of something many leases
    /// share (one watch of a whole namespace), told to each of them.
    pub fn about(self, lease: &str) -> StoreError {
        let lease = lease.to_owned();
        match self {
            StoreError::Conflict { detail, .. } => StoreError::Conflict { lease, detail },
            StoreError::Unavailable { detail, .. } => StoreError::Unavailable { lease, detail },
            StoreError::Malformed { detail, .. } => StoreError::Malformed { lease, detail },
            StoreError::Refused { detail, .. } => StoreError::Refused { lease, detail },
        }
    }
}

/// What a store derives from the timings of the leases it serves (the
/// configured ones, all together): set when it is opened, and again after
/// a reload changed them ([`LeaseStore::set_timings`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreTimings {
    /// The duration read for a record that names a holder but no usable
    /// duration (written by another program): the longest lease duration,
    /// so that such a holder gets at least as long as baton's own.
    pub fallback_duration: Duration,
    /// The shortest request timeout: the bound on the requests a store
    /// makes by itself (the elector bounds all the others).
    pub request_timeout: Duration,
}

/// A stream of observations of one lease: it yields the record as read after
/// each change (`None` once the record is deleted, or a tombstone: see
/// [Deleted records](self#deleted-records)). It may also yield when nothing
/// changed; the elector compares versions.
pub type LeaseWatch = BoxStream<'static, Result<Option<Versioned>, StoreError>>;

/// Where lease records live.
///
/// Implementations must make [`update`](LeaseStore::update) atomic with
/// respect to every other writer, in this process or another: it succeeds
/// only if the stored version still equals `version`.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// A short description for logs, such as `embedded store at /var/lib/baton`.
    fn describe(&self) -> String;

    /// Reads a lease; `Ok(None)` if it does not exist. A record deleted
    /// while held may read as `Ok(Some(tombstone))`: see [Deleted
    /// records](self#deleted-records).
    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError>;

    /// Creates a lease; [`StoreError::Conflict`] if it already exists (or,
    /// in a store that keeps the terms of deleted records, if it ever
    /// existed: read it and update what was read).
    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError>;

    /// Replaces a lease if its version is still `version`;
    /// [`StoreError::Conflict`] otherwise (including when it was deleted).
    /// Replacing a tombstone ([`TOMBSTONE`] version) creates the record,
    /// or conflicts if it was created or changed since.
    async fn update(&self, lease: &str, version: &str, record: &LeaseRecord)
    -> Result<Versioned, StoreError>;

    /// Deletes a lease if its version is still `version`; `Ok(false)` if
    /// it changed or is gone. Only for records that gate no task: the
    /// spreader deletes the membership records of hosts gone for long
    /// ([`crate::election::Spreader`]); an elector never deletes.
    async fn delete_if(&self, lease: &str, version: &str) -> Result<bool, StoreError>;

    /// Starts watching a lease. The stream ends or yields an error when the
    /// watch breaks; the caller then re-reads and watches again.
    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError>;

    /// Takes new [`StoreTimings`] after a reload changed the configured
    /// leases' timings (or the leases themselves). They apply to what
    /// begins afterwards: records read from then on, requests started from
    /// then on; a record already read keeps the duration it was read with,
    /// a request in flight its bound. Only the Kubernetes store derives
    /// anything from the timings; the default does nothing.
    fn set_timings(&self, _timings: StoreTimings) {}

    /// Every lease in the store, for `baton status`.
    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError>;

    /// Every lease in the store that can be read, and apart from them the
    /// name of each that cannot ([`StoreError::Malformed`]) with why, for
    /// `baton status`: one unreadable record must not hide the others. The
    /// default reads with [`list`](Self::list), so a store whose list
    /// fails on such a record fails here too.
    async fn list_readable(&self) -> Result<(Vec<(String, Versioned)>, Vec<(String, String)>), StoreError> {
        Ok((self.list().await?, Vec::new()))
    }

    /// Every lease whose name starts with `prefix` (the hosts' membership
    /// records, listed every retry period: the Kubernetes store serves it
    /// from its namespace's watch while that is in sync, see
    /// [`kube`](crate::store::kube#listing-membership-records)). A store that can should read
    /// only those: an unreadable lease of another name is not an error here.
    async fn list_prefixed(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let all = self.list().await?;
        Ok(all
            .into_iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .collect())
    }
}
