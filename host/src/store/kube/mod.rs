//! The Kubernetes store: lease records as `coordination.k8s.io/v1` Lease
//! objects, through the API server. The whole design, with the reasons, is
//! in `docs/kubernetes.md` ("The store, in detail").
//!
//! - **Mapping.** The holder, duration, times and term are the Lease's
//!   `spec` fields (the term is `leaseTransitions`); the holder's instance,
//!   its plugins and a yield are annotations ([`HOLDER_INSTANCE`],
//!   [`PLUGINS`], [`YIELDED_BY`]); the version is `resourceVersion`. A held
//!   Lease without a duration is read with the *fallback duration*, the
//!   longest one configured.
//! - **Writes.** Every acquire, renew and release is a `PUT` of the whole
//!   object last read with its `resourceVersion` (409 on any write in
//!   between); fields written by others are carried over.
//! - **Terms never repeat.** Each lease's highest term is also kept in a
//!   ConfigMap that outlives the Lease, its term floor ([`floor`]); a Lease
//!   below its floor is read at the floor.
//! - **Deletions.** A Lease deleted while held reads as its last record
//!   under a version of its own ([`TOMBSTONE`]): nobody takes it before its
//!   holder's lease runs out.
//! - **Watching.** One shared, label-selected watch per store and
//!   namespace ([`ROLE_LABEL`]); a Lease without the labels is watched on its
//!   own. A DELETED event of the shared watch is never taken for a deletion
//!   (the Lease is listed); a missing label never makes a Lease look free.
//!   A watch silent past its timeout, the request timeout and a second is
//!   dead. The stream of a lease only moves forward.
//! - **Membership listings** are read from the shared watch while it is in
//!   sync (no request), from the API server otherwise.
//! - **Errors.** 409 is [`StoreError::Conflict`]; 401, 403 and other 4xx
//!   are [`StoreError::Refused`]; 410, 429, 5xx, connection errors and
//!   timeouts are [`StoreError::Unavailable`]; undecodable answers are
//!   [`StoreError::Malformed`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::stream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams, Preconditions,
    TypeMeta,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Map, Value};

pub mod floor;
mod watch;

pub use floor::{FLOOR_LEASE_ANNOTATION, FLOOR_PREFIX, floor_name};

use self::floor::{Floors, Raised};
use self::watch::{LeaseStream, LiveTimings, SharedWatch, WatchConfig};
use super::deleted::{DeletedRecords, Found};
use super::{
    ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, TOMBSTONE, Versioned, Yielded,
};
use crate::support::rounding::human;

/// How many recently seen objects of each lease are kept for
/// read-modify-write.
const KEEP_OBJECTS: usize = 8;

/// The label key of baton's role for an object it writes: on every Lease
/// it writes, [`LEASE_ROLE`]; on its term floors' ConfigMaps, `term-floor`.
///
/// A key of baton's own, so that writing it never changes a label another
/// tool set: `app.kubernetes.io/managed-by` would overwrite the value a
/// Helm chart or an operator put on a Lease it created (Helm then refuses
/// to manage it). The store's shared watch selects its Leases by this label
/// (and the configured ones).
pub const ROLE_LABEL: &str = "baton.dev/role";

/// The value of [`ROLE_LABEL`] on every Lease baton writes (its leases and
/// its hosts' membership records).
pub const LEASE_ROLE: &str = "lease";

/// The shortest request timeout the store uses, whatever is configured: a
/// bound below it would fail on a healthy loopback API server.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_millis(100);

/// The labels written on every Lease: the configured ones and
/// [`ROLE_LABEL`]` = `[`LEASE_ROLE`] (which wins over a configured value
/// of the same key, refused by the configuration anyway).
pub fn written_labels(configured: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = configured.clone();
    labels.insert(ROLE_LABEL.to_owned(), LEASE_ROLE.to_owned());
    labels
}

/// The bound on listing every lease (`LeaseStore::list`, for status
/// reports), which no elector bounds.
const OWN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the API server and where the leases live.
#[derive(Clone, Debug, Default)]
pub struct KubeOptions {
    /// The namespace of the Lease objects; default: the kubeconfig context's
    /// namespace, the in-cluster service account's, or `default`.
    pub namespace: Option<String>,
    /// A kubeconfig file; default: `KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// Labels written on every Lease this host writes.
    pub labels: BTreeMap<String, String>,
    /// The duration read for a Lease that has a holder but no usable
    /// `leaseDurationSeconds`: the longest configured lease duration.
    /// Replaced by [`LeaseStore::set_timings`].
    pub fallback_duration: Duration,
    /// The shortest configured request timeout: the bound on the requests
    /// this store makes by itself (listing, starting and resuming a watch,
    /// reading a term floor for it); the elector bounds all the others.
    /// Replaced by [`LeaseStore::set_timings`]. Also the client's connect
    /// timeout, which is built into the client at [`KubeStore::connect`]
    /// and never changes.
    pub request_timeout: Duration,
    /// The server-side timeout of each watch request, in seconds; `None`
    /// (the default): the fallback duration (capped at an hour) x 1 to
    /// 1.25 at random for each watch request, as it is when the request
    /// starts. Tests shorten it to see watches resumed.
    pub watch_timeout_secs: Option<u32>,
}

/// Lease records as Kubernetes Lease objects; see the [module
/// documentation](self). Cloning is cheap; clones share the client and the
/// objects seen.
#[derive(Clone)]
pub struct KubeStore {
    inner: Arc<Inner>,
}

struct Inner {
    api: Api<DynamicObject>,
    /// Where and how its watches watch; `watch.selector` holds every label
    /// it writes.
    watch: WatchConfig,
    /// The namespace's one watch, shared by the watches of every lease.
    shared: Arc<SharedWatch>,
    /// The term floors of the namespace's leases.
    floors: Floors,
    resource: ApiResource,
    namespace: String,
    server: String,
    /// The configured labels (without [`ROLE_LABEL`]): what
    /// [`LeaseStore::list`] selects.
    labels: BTreeMap<String, String>,
    /// The recent objects of each lease.
    recent: Mutex<HashMap<String, Recent>>,
    /// What this store saw of each lease, for deleted Leases (see [Deleted
    /// records](super#deleted-records); resourceVersions never contain
    /// the `@` of a [`TOMBSTONE`] version).
    seen: DeletedRecords,
}

/// The recent objects of one lease, for read-modify-write and to tell
/// stale watch events.
#[derive(Default)]
struct Recent {
    /// Recently seen objects, newest last.
    objects: VecDeque<DynamicObject>,
    /// The highest resourceVersion learned from any answer (reads, writes,
    /// the watch, deletions).
    newest: u64,
    /// The term floor, once a write found it above the Lease's
    /// `leaseTransitions`: the term the Lease is read with from then on.
    floor: u64,
    /// The floor's resourceVersion when the Lease was last found missing
    /// (`Some(None)`: no floor then): what a create checks it against.
    floor_version: Option<Option<String>>,
    /// When this store, holding the lease, last checked that the floor
    /// holds the Lease's term (see [`Inner::check_floor`]).
    floor_checked: Option<std::time::Instant>,
}

/// A resourceVersion as a number. The API server's resourceVersions are
/// etcd revisions, which grow with every write; `None` for one that is not
/// a number (then nothing is judged stale by it).
fn rv_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("namespace", &self.inner.namespace)
            .field("server", &self.inner.server)
            .finish()
    }
}

impl KubeStore {
    /// Builds a client the usual kube-rs way (the given kubeconfig, else
    /// `KUBECONFIG`, `~/.kube/config`, or the in-cluster service account) and
    /// opens the store. Makes no request.
    pub async fn connect(options: KubeOptions) -> Result<KubeStore, StoreError> {
        let refused = |detail: String| StoreError::Refused {
            lease: ANY_LEASE.into(),
            detail,
        };
        let mut config = match &options.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|e| refused(format!("cannot read the kubeconfig {}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| refused(format!("kubeconfig {}: {e}", path.display())))?
            }
            None => kube::Config::infer().await.map_err(|e| {
                refused(format!(
                    "no Kubernetes client configuration (set KUBECONFIG, pass --kubeconfig, \
                     or run in a pod with a service account): {e}"
                ))
            })?,
        };
        // The elector bounds every request and retries by itself; the
        // client's own retries would only blur its timings.
        config.default_retry = false;
        config.connect_timeout = Some(options.request_timeout);
        // Watches are bounded by their server-side timeout and by this
        // store's silence check, other requests by the elector.
        config.read_timeout = None;
        let namespace = options
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .map_err(|e| refused(format!("cannot build the Kubernetes client: {e}")))?;
        Ok(KubeStore::with_client(client, &namespace, server, &options))
    }

    /// Opens the store on an existing client.
    pub fn with_client(client: Client, namespace: &str, server: String, options: &KubeOptions) -> KubeStore {
        let resource = ApiResource::erase::<Lease>(&());
        let api = Api::namespaced_with(client.clone(), namespace, &resource);
        let timings = StoreTimings {
            fallback_duration: options.fallback_duration,
            request_timeout: options.request_timeout,
        };
        let watch = WatchConfig {
            api: api.clone(),
            selector: written_labels(&options.labels),
            timings: Arc::new(LiveTimings::new(timings)),
            watch_timeout_secs: options.watch_timeout_secs,
        };
        KubeStore {
            inner: Arc::new(Inner {
                floors: Floors::new(client, namespace),
                api,
                shared: Arc::new(SharedWatch::new(watch.clone())),
                watch,
                resource,
                namespace: namespace.to_owned(),
                server,
                labels: options.labels.clone(),
                recent: Mutex::new(HashMap::new()),
                seen: DeletedRecords::default(),
            }),
        }
    }

    /// The namespace of the Lease objects.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// Creates the Lease if there is none and the lease's term floor is
    /// unchanged since this store found the Lease missing; in a term above
    /// the floor, unless `own`: the holder writing its own deleted record
    /// again, in its term.
    async fn create_at(&self, lease: &str, record: &LeaseRecord, own: bool) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let mut obj = inner.new_object(lease);
        inner.apply(lease, &mut obj, record)?;
        // Raised (and the create counted) before the Lease appears, so that
        // a reader that finds no Lease again knows it was created between.
        inner.raise_floor(lease, None, record, own).await?;
        let created = inner
            .api
            .create(&post_params(), &obj)
            .await
            .map_err(|e| map_error(lease, "create", e))?;
        let v = inner.accept_written(lease, &created)?;
        inner.check_floor(lease, &created, &v);
        Ok(v)
    }
}

impl Inner {
    /// The duration read for a Lease with a holder but no usable
    /// `leaseDurationSeconds`, now.
    fn fallback_duration(&self) -> Duration {
        self.watch.timings.fallback_duration()
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recent>> {
        // Every change to the map is complete in one step: a poisoned lock
        // is used as is.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers an object as the latest seen of its lease.
    fn remember(&self, lease: &str, obj: &DynamicObject) {
        let mut recent = self.recent();
        let recent = recent.entry(lease.to_owned()).or_default();
        let rv = obj.metadata.resource_version.as_deref().unwrap_or_default();
        recent.newest = recent.newest.max(rv_number(rv).unwrap_or(0));
        let list = &mut recent.objects;
        if list
            .back()
            .is_some_and(|last| last.metadata.resource_version == obj.metadata.resource_version)
        {
            return;
        }
        list.push_back(obj.clone());
        while list.len() > KEEP_OBJECTS {
            list.pop_front();
        }
    }

    /// The lease does not exist (any more), as of `rv` if known; `last` is
    /// its final state if the deletion event told it. Reads its term floor
    /// and returns what to hand the caller: the tombstone if the last known
    /// state had a holder, else the floor record, or `None` for a lease
    /// that never had a term.
    async fn deleted(
        &self,
        lease: &str,
        last: Option<&DynamicObject>,
        rv: Option<&str>,
    ) -> Result<Option<Versioned>, StoreError> {
        {
            let mut recent = self.recent();
            let recent = recent.entry(lease.to_owned()).or_default();
            recent.objects.clear();
            recent.newest = recent.newest.max(rv.and_then(rv_number).unwrap_or(0));
        }
        let last = last.and_then(|obj| self.versioned(lease, obj).ok());
        let floor = self.floors.read(lease).await?;
        self.recent().entry(lease.to_owned()).or_default().floor_version = Some(floor.version.clone());
        Ok(self.seen.found(
            lease,
            Found::Missing {
                last,
                floor: Some(floor.term),
                creates: Some(floor.creates),
            },
        ))
    }

    /// Reads an object as a record, with the term floor learned for its
    /// lease if that is higher than its `leaseTransitions`.
    fn versioned(&self, lease: &str, obj: &DynamicObject) -> Result<Versioned, StoreError> {
        let mut v = to_versioned(lease, obj, self.fallback_duration())?;
        if let Some(floor) = self.recent().get(lease).map(|r| r.floor) {
            v.record.term = v.record.term.max(floor);
        }
        Ok(v)
    }

    /// Before `record` is written over `current` (a Lease object) or, with
    /// `current` `None`, created: raises the term floor if the record starts
    /// a new term, or checks and counts the create.
    async fn raise_floor(
        &self,
        lease: &str,
        current: Option<&DynamicObject>,
        record: &LeaseRecord,
        own: bool,
    ) -> Result<(), StoreError> {
        let instance = record.instance.as_deref();
        let Some(current) = current else {
            let seen = self.recent().get(lease).and_then(|r| r.floor_version.clone());
            let base = match seen {
                Some(base) => base,
                // Never found missing by this store: as the floor is now.
                None => self.floors.read(lease).await?.version,
            };
            return self
                .floors
                .raise_for_create(lease, base.as_deref(), record.term, own, instance)
                .await;
        };
        let written = to_versioned(lease, current, self.fallback_duration())?
            .record
            .term;
        if record.term < written {
            // Never written by the elector (its records come from what it
            // read); refused so that terms only grow within one object
            // while baton alone writes them (see `baton_wrote_transitions`).
            return Err(StoreError::Conflict {
                lease: lease.to_owned(),
                detail: format!(
                    "term {} would lower the Lease's leaseTransitions ({written}): terms never go back",
                    record.term
                ),
            });
        }
        if record.term == written {
            return Ok(());
        }
        let uid = current.metadata.uid.as_deref();
        let continuous = baton_wrote_transitions(current);
        match self
            .floors
            .raise_for_term(lease, record.term, uid, continuous, instance)
            .await?
        {
            Raised::Done => Ok(()),
            Raised::Behind(floor) => {
                {
                    let mut recent = self.recent();
                    let recent = recent.entry(lease.to_owned()).or_default();
                    recent.floor = recent.floor.max(floor);
                }
                let how = if continuous {
                    "re-created by another writer"
                } else {
                    "written by another writer (replaced or edited in place)"
                };
                tracing::warn!(
                    lease,
                    lease_transitions = written,
                    floor,
                    floor_object = %self.floors.describe(lease),
                    "the Lease's leaseTransitions is below the lease's highest term: it was {how}; \
                     terms continue above {floor}"
                );
                Err(StoreError::Conflict {
                    lease: lease.to_owned(),
                    detail: format!(
                        "the Lease's leaseTransitions ({written}) is not above the lease's highest \
                         term ({floor}, in {}): it was {how}; term {} may have been given out \
                         already, so terms continue above {floor}",
                        self.floors.describe(lease),
                        record.term,
                    ),
                })
            }
        }
    }

    /// After this store wrote `written` (read as `v`): if it holds the
    /// lease and has not checked the floor for a lease duration, checks in
    /// the background that the floor holds the Lease's term, and re-creates
    /// or raises it if not (a floor ConfigMap deleted while its Lease
    /// lives, which no new term would notice while the floor seen before
    /// covers it). So a floor deleted while its lease is held is back
    /// within about a lease duration, before a deletion of the Lease would
    /// need it.
    fn check_floor(self: &Arc<Self>, lease: &str, written: &DynamicObject, v: &Versioned) {
        if v.record.holder().is_none() {
            return;
        }
        let now = std::time::Instant::now();
        {
            let mut recent = self.recent();
            let recent = recent.entry(lease.to_owned()).or_default();
            if recent
                .floor_checked
                .is_some_and(|at| now.duration_since(at) < v.record.lease_duration)
            {
                return;
            }
            recent.floor_checked = Some(now);
        }
        let inner = self.clone();
        let lease = lease.to_owned();
        let term = v.record.term;
        let uid = written.metadata.uid.clone();
        let instance = v.record.instance.clone();
        let bound = self.watch.request_timeout();
        tokio::spawn(async move {
            let ensured = tokio::time::timeout(
                bound,
                inner
                    .floors
                    .ensure(&lease, term, uid.as_deref(), instance.as_deref()),
            )
            .await;
            match ensured {
                Ok(Ok(None)) => {}
                Ok(Ok(Some(found))) => tracing::warn!(
                    lease = %lease,
                    term,
                    found = found.term,
                    floor_object = %inner.floors.describe(&lease),
                    "the lease's term floor was {}; raised to the Lease's term",
                    if found.version.is_none() { "missing (deleted)" } else { "below the Lease's term" }
                ),
                Ok(Err(e)) => {
                    // Tried again at the next renewal.
                    inner.recent().entry(lease.clone()).or_default().floor_checked = None;
                    tracing::warn!(lease = %lease, error = %e, "cannot check the lease's term floor");
                }
                Err(_) => {
                    inner.recent().entry(lease.clone()).or_default().floor_checked = None;
                    tracing::warn!(lease = %lease, timeout = %human(bound), "checking the lease's term floor timed out");
                }
            }
        });
    }

    /// Whether something newer than `rv` was already learned of `lease`
    /// (and handed to the caller): a watch event that old is history.
    fn is_stale(&self, lease: &str, rv: &str) -> bool {
        let Some(n) = rv_number(rv) else { return false };
        self.recent().get(lease).is_some_and(|r| r.newest > n)
    }

    /// The object of `lease` at `version`, if it was seen.
    fn seen_at(&self, lease: &str, version: &str) -> Option<DynamicObject> {
        self.recent()
            .get(lease)?
            .objects
            .iter()
            .rev()
            .find(|o| o.metadata.resource_version.as_deref() == Some(version))
            .cloned()
    }

    /// Converts an object the API server sent in answer to a read (or a
    /// watch), and remembers it.
    fn accept(&self, lease: &str, obj: &DynamicObject) -> Result<Versioned, StoreError> {
        let v = self.versioned(lease, obj)?;
        self.remember(lease, obj);
        self.seen.found(lease, Found::Record(v.clone()));
        Ok(v)
    }

    /// Converts the object the API server answered a write with, and
    /// remembers it.
    fn accept_written(&self, lease: &str, obj: &DynamicObject) -> Result<Versioned, StoreError> {
        let v = self.versioned(lease, obj)?;
        self.remember(lease, obj);
        self.seen.wrote(lease, &v);
        // The shared watch must deliver it: how its cache is known to be
        // current (see [Listing](self#listing-membership-records)).
        self.shared.wrote(obj);
        Ok(v)
    }

    /// Lists the namespace's Leases with `selector` (`k=v,k=v`; empty:
    /// every Lease) from the API server.
    async fn list_objects(&self, selector: &str) -> Result<Vec<DynamicObject>, StoreError> {
        let mut params = ListParams::default();
        if !selector.is_empty() {
            params = params.labels(selector);
        }
        let list = tokio::time::timeout(OWN_REQUEST_TIMEOUT, self.api.list(&params))
            .await
            .map_err(|_| StoreError::Unavailable {
                lease: ANY_LEASE.into(),
                detail: format!("listing leases timed out after {}", human(OWN_REQUEST_TIMEOUT)),
            })?
            .map_err(|e| map_error(ANY_LEASE, "list", e))?;
        Ok(list.items)
    }

    fn new_object(&self, lease: &str) -> DynamicObject {
        DynamicObject {
            types: Some(TypeMeta {
                api_version: self.resource.api_version.clone(),
                kind: self.resource.kind.clone(),
            }),
            metadata: ObjectMeta {
                name: Some(lease.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            data: Value::Object(Map::new()),
        }
    }

    /// Writes `record` and this host's labels into `obj`, leaving everything
    /// else as it is.
    fn apply(&self, lease: &str, obj: &mut DynamicObject, record: &LeaseRecord) -> Result<(), StoreError> {
        let labels = obj.metadata.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in &self.watch.selector {
            labels.insert(k.clone(), v.clone());
        }
        match &record.instance {
            Some(instance) => {
                obj.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(HOLDER_INSTANCE.into(), instance.clone());
            }
            None => {
                if let Some(annotations) = &mut obj.metadata.annotations {
                    annotations.remove(HOLDER_INSTANCE);
                }
            }
        }
        match record.plugins.as_ref().filter(|_| record.holder().is_some()) {
            Some(plugins) => {
                obj.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(PLUGINS.into(), plugins.join(","));
            }
            None => {
                if let Some(annotations) = &mut obj.metadata.annotations {
                    annotations.remove(PLUGINS);
                }
            }
        }
        match record.yielded.as_ref().filter(|_| record.holder().is_none()) {
            Some(y) => {
                let annotations = obj.metadata.annotations.get_or_insert_with(BTreeMap::new);
                annotations.insert(YIELDED_BY.into(), y.by.clone());
                annotations.insert(YIELDED_FOR.into(), format!("{}ms", y.duration.as_millis()));
            }
            None => {
                if let Some(annotations) = &mut obj.metadata.annotations {
                    annotations.remove(YIELDED_BY);
                    annotations.remove(YIELDED_FOR);
                }
            }
        }
        write_spec(lease, &mut obj.data, record)
    }
}

/// The annotation that carries [`LeaseRecord::instance`]: the holder's
/// process, so that two processes under one identity tell their records
/// apart. Written with every write of baton's, removed on release; other
/// writers leave it alone or drop it, and a record without it is nobody's
/// own (see [`LeaseRecord::held_by`]).
pub const HOLDER_INSTANCE: &str = "baton.dev/holder-instance";

/// The annotation that carries [`LeaseRecord::plugins`], the holder's
/// claims: plugin names, comma-separated (plugin names hold no comma).
/// Written with every write of baton's that holds the lease, removed on
/// release; read only with a holder.
pub const PLUGINS: &str = "baton.dev/plugins";

/// The annotations that carry [`LeaseRecord::yielded`]: the identity of the
/// host that yielded the lease, and for how long (milliseconds, as `15000ms`).
/// Written on a release by `baton yield`, removed by every other write of
/// baton's; read only on a Lease without holder.
pub const YIELDED_BY: &str = "baton.dev/yielded-by";
/// See [`YIELDED_BY`].
pub const YIELDED_FOR: &str = "baton.dev/yielded-for";

/// Reads a Lease object as a record. Lenient with everything a foreign
/// writer may leave out; strict only where a value has the wrong JSON type
/// (which a real API server never serves).
pub fn to_versioned(
    lease: &str,
    obj: &DynamicObject,
    fallback_duration: Duration,
) -> Result<Versioned, StoreError> {
    let malformed = |detail: String| StoreError::Malformed {
        lease: lease.to_owned(),
        detail,
    };
    let version = obj
        .metadata
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| malformed("the Lease object has no metadata.resourceVersion".into()))?;
    let empty = Map::new();
    let spec = match obj.data.get("spec") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(spec)) => spec,
        Some(other) => return Err(malformed(format!("spec is not an object: {other}"))),
    };
    let field = |name: &str| spec.get(name).filter(|v| !v.is_null());
    let holder = match field("holderIdentity") {
        None => None,
        Some(Value::String(h)) if h.is_empty() => None,
        Some(Value::String(h)) => Some(h.clone()),
        Some(other) => return Err(malformed(format!("spec.holderIdentity is not a string: {other}"))),
    };
    let lease_duration = match field("leaseDurationSeconds") {
        None => fallback_duration,
        Some(v) => match v.as_i64() {
            Some(s) if s > 0 => Duration::from_secs(s as u64),
            Some(_) => fallback_duration,
            None => {
                return Err(malformed(format!(
                    "spec.leaseDurationSeconds is not an integer: {v}"
                )));
            }
        },
    };
    let time = |name: &str| {
        field(name)
            .and_then(Value::as_str)
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    };
    let transitions = match field("leaseTransitions") {
        None => 0,
        Some(v) => match v.as_i64() {
            Some(t) => t.max(0) as u64,
            None => return Err(malformed(format!("spec.leaseTransitions is not an integer: {v}"))),
        },
    };
    Ok(Versioned {
        version,
        record: LeaseRecord {
            // Only with a holder: a foreign writer that took the Lease over
            // and kept the annotations leaves ours behind.
            instance: holder.as_ref().and_then(|_| {
                obj.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(HOLDER_INSTANCE))
                    .cloned()
            }),
            plugins: holder.as_ref().and_then(|_| {
                let listed = obj.metadata.annotations.as_ref()?.get(PLUGINS)?;
                Some(
                    listed
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect(),
                )
            }),
            // Only without a holder: a release by `baton yield`.
            yielded: match &holder {
                Some(_) => None,
                None => obj.metadata.annotations.as_ref().and_then(|a| {
                    let by = a.get(YIELDED_BY).filter(|b| !b.is_empty())?;
                    let duration = humantime::parse_duration(a.get(YIELDED_FOR)?).ok()?;
                    Some(Yielded {
                        by: by.clone(),
                        duration,
                    })
                }),
            },
            holder,
            lease_duration,
            acquire_time: time("acquireTime"),
            renew_time: time("renewTime"),
            term: transitions,
        },
    })
}

/// Writes the record's fields into an object's `spec`, keeping any other
/// field of it.
pub fn write_spec(lease: &str, data: &mut Value, record: &LeaseRecord) -> Result<(), StoreError> {
    let refused = |detail: String| StoreError::Refused {
        lease: lease.to_owned(),
        detail,
    };
    let d = record.lease_duration;
    if d.subsec_nanos() != 0 || d.as_secs() == 0 || d.as_secs() > i32::MAX as u64 {
        return Err(refused(format!(
            "a Kubernetes Lease holds its duration in whole seconds (1 to {}); {} cannot be written",
            i32::MAX,
            humantime::format_duration(d)
        )));
    }
    let transitions = i32::try_from(record.term).map_err(|_| {
        refused(format!(
            "term {} does not fit in leaseTransitions (an int32)",
            record.term
        ))
    })?;
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    let root = data.as_object_mut().expect("an object");
    let spec = root.entry("spec").or_insert_with(|| Value::Object(Map::new()));
    if !spec.is_object() {
        *spec = Value::Object(Map::new());
    }
    let spec = spec.as_object_mut().expect("an object");
    spec.insert(
        "holderIdentity".into(),
        Value::String(record.holder.clone().unwrap_or_default()),
    );
    spec.insert("leaseDurationSeconds".into(), Value::from(d.as_secs()));
    let mut time = |name: &str, t: Option<SystemTime>| match t {
        Some(t) => {
            spec.insert(name.into(), Value::String(micro_time(t)));
        }
        None => {
            spec.remove(name);
        }
    };
    time("acquireTime", record.acquire_time);
    time("renewTime", record.renew_time);
    spec.insert("leaseTransitions".into(), Value::from(transitions));
    Ok(())
}

/// A Kubernetes MicroTime: RFC 3339 in UTC with microseconds.
fn micro_time(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// Maps a client error to a store error.
pub fn map_error(lease: &str, verb: &str, err: kube::Error) -> StoreError {
    let lease = lease.to_owned();
    match err {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() {
                format!("{verb} failed: HTTP {} {}", status.code, status.reason)
            } else {
                status.message.clone()
            };
            match status.code {
                409 => StoreError::Conflict {
                    lease,
                    detail: message,
                },
                // Updating an object that was deleted: someone else wrote.
                404 if verb == "update" => StoreError::Conflict {
                    lease,
                    detail: message,
                },
                401 => StoreError::Refused {
                    lease,
                    detail: format!("unauthorized ({verb} leases): {message}"),
                },
                403 => StoreError::Refused {
                    lease,
                    detail: format!("forbidden: {message}"),
                },
                410 => StoreError::Unavailable {
                    lease,
                    detail: format!("watch expired (410 Gone): {message}"),
                },
                429 | 500..=599 => StoreError::Unavailable {
                    lease,
                    detail: format!("{verb}: HTTP {}: {message}", status.code),
                },
                code => StoreError::Refused {
                    lease,
                    detail: format!("{verb}: HTTP {code}: {message}"),
                },
            }
        }
        kube::Error::SerdeError(e) => StoreError::Malformed {
            lease,
            detail: format!("{verb}: cannot decode the API server's answer: {e}"),
        },
        other => StoreError::Unavailable {
            lease,
            detail: format!("{verb}: {}", with_causes(&other)),
        },
    }
}

/// An error and its causes, `: `-separated, each said once (a connection
/// error reads `... client error (Connect): tcp connect error: Connection
/// refused (os error 111)`, not only `client error (Connect)`).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// The field manager of every write of baton's: the API server records in
/// `metadata.managedFields` which manager last changed each field.
pub const FIELD_MANAGER: &str = "baton";

/// Writes are recorded in `metadata.managedFields` under the manager
/// [`FIELD_MANAGER`].
fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

/// Whether the object's `spec.leaseTransitions` was last changed by baton,
/// as the API server's `metadata.managedFields` say: the field belongs to
/// the manager [`FIELD_MANAGER`]. The API server gives a field to whoever
/// changes its value, whatever `managedFields` the writer sent, so a
/// Lease replaced in place with a lower `leaseTransitions` (`kubectl
/// replace`, a GitOps tool, client-go) reads `false` until baton writes a
/// new term over it; so does a Lease whose `managedFields` were cleared.
/// Only while it is `true` are terms known to have only grown within the
/// object (see [`floor::Floors::raise_for_term`]).
pub fn baton_wrote_transitions(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.subresource.as_deref().is_none_or(str::is_empty)
            && entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec"))
                .and_then(|spec| spec.get("f:leaseTransitions"))
                .is_some()
    })
}

fn field_selector(lease: &str) -> String {
    format!("metadata.name={lease}")
}

#[async_trait::async_trait]
impl LeaseStore for KubeStore {
    fn describe(&self) -> String {
        format!(
            "kubernetes store: Lease objects in namespace {:?} at {}",
            self.inner.namespace, self.inner.server
        )
    }

    /// The fallback duration (and with it the server-side timeout of the
    /// watch requests started from then on) and the bound on the store's
    /// own requests. The client's connect timeout stays the one it was
    /// built with.
    fn set_timings(&self, timings: StoreTimings) {
        self.inner.watch.timings.set(timings);
    }

    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        let inner = &self.inner;
        match inner
            .api
            .get_opt(lease)
            .await
            .map_err(|e| map_error(lease, "get", e))?
        {
            Some(obj) => inner.accept(lease, &obj).map(Some),
            None => inner.deleted(lease, None, None).await,
        }
    }

    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError> {
        // A lease read as never written: its floor must still be 0.
        self.create_at(lease, record, false).await
    }

    /// A delete with the version as its `resourceVersion` precondition
    /// (409 when it changed). The Lease's term floor ConfigMap stays (the
    /// role may not delete ConfigMaps).
    async fn delete_if(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        if version.starts_with(TOMBSTONE) {
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version.to_owned()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.inner.api.delete(lease, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(e) => Err(map_error(lease, "delete", e)),
        }
    }

    async fn update(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        if version.starts_with(TOMBSTONE) {
            // The Lease was deleted: re-create it, unless its floor moved
            // since the caller was shown it (409 if another host re-created
            // it first).
            // (The floor's own check is by its version, not the term shown:
            // a floor may be reserved above the record's term.)
            inner.seen.create_floor(lease, version)?;
            let own = inner.seen.is_own_tombstone(lease, version);
            return self.create_at(lease, record, own).await;
        }
        let mut obj = match inner.seen_at(lease, version) {
            Some(obj) => obj,
            None => {
                let current = inner
                    .api
                    .get_opt(lease)
                    .await
                    .map_err(|e| map_error(lease, "get", e))?;
                let Some(current) = current else {
                    return Err(StoreError::Conflict {
                        lease: lease.to_owned(),
                        detail: format!("does not exist (expected version {version})"),
                    });
                };
                inner.accept(lease, &current)?;
                let current_version = current.metadata.resource_version.clone().unwrap_or_default();
                if current_version != version {
                    return Err(StoreError::Conflict {
                        lease: lease.to_owned(),
                        detail: format!("version is {current_version}, not {version}"),
                    });
                }
                current
            }
        };
        inner.raise_floor(lease, Some(&obj), record, false).await?;
        // The precondition: the API server refuses the update with 409 if
        // the object's resourceVersion is no longer this one.
        obj.metadata.resource_version = Some(version.to_owned());
        inner.apply(lease, &mut obj, record)?;
        let written = inner
            .api
            .replace(lease, &post_params(), &obj)
            .await
            .map_err(|e| map_error(lease, "update", e))?;
        let v = inner.accept_written(lease, &written)?;
        inner.check_floor(lease, &written, &v);
        Ok(v)
    }

    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError> {
        let stream = LeaseStream::open(self.inner.clone(), lease).await?;
        Ok(Box::pin(stream::unfold(stream, watch::next_observation)))
    }

    /// Every Lease in the namespace, or only those carrying this store's
    /// configured labels when labels are configured (with or without
    /// [`ROLE_LABEL`]: a status report shows foreign Leases too).
    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError> {
        let inner = &self.inner;
        let objects = inner.list_objects(&watch::label_selector(&inner.labels)).await?;
        listed("", &objects, inner.fallback_duration())
    }

    /// The Leases carrying every label this store writes whose names start
    /// with `prefix`: from the shared watch's memory while it is in sync,
    /// else from the API server; see [Listing membership
    /// records](self#listing-membership-records).
    async fn list_prefixed(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let inner = &self.inner;
        let objects = match inner.shared.cached(prefix) {
            Ok(objects) => objects,
            Err(why) => {
                tracing::debug!(reason = %why, prefix, "listing the Leases from the API server");
                let selector = watch::label_selector(&inner.watch.selector);
                inner.list_objects(&selector).await?
            }
        };
        listed(prefix, &objects, inner.fallback_duration())
    }
}

/// The objects whose names start with `prefix`, read as records (as they
/// are, without term floors or deleted records: a listing reports what the
/// API server holds), sorted by name.
fn listed(
    prefix: &str,
    objects: &[DynamicObject],
    fallback_duration: Duration,
) -> Result<Vec<(String, Versioned)>, StoreError> {
    let mut leases = Vec::new();
    for obj in objects {
        let name = obj.metadata.name.clone().unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        leases.push((name.clone(), to_versioned(&name, obj, fallback_duration)?));
    }
    leases.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(leases)
}

#[cfg(test)]
mod tests;
