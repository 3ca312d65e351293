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
//!   ConfigMap that outlives the Lease, its *term floor* ([`floor`]); a Lease
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
use std::time::Duration;

use futures::stream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub mod buckets;
mod client;
pub mod floor;
mod gate;
pub mod pod_label;
mod reads;
mod record;
mod requests;
mod watch;
mod writes;

pub use floor::{FLOOR_LEASE_ANNOTATION, FLOOR_PREFIX, floor_name};
pub use record::{
    HOLDER_ADDRESS, HOLDER_DRAINING, HOLDER_INSTANCE, HOLDER_WEIGHT, PLUGINS, YIELDED_BY, YIELDED_FOR,
    to_versioned, write_annotations, write_spec,
};
pub use requests::{FIELD_MANAGER, baton_wrote_transitions, map_error};

use self::floor::Floors;
use self::gate::{Class, Gated, RequestGate};
use self::reads::listed;
use self::watch::{LeaseStream, LiveTimings, SharedWatch, WatchConfig};
use super::deleted::DeletedRecords;
use super::{ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, TOMBSTONE, Versioned};

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
    api: Gated<DynamicObject>,
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
    objects: VecDeque<Arc<DynamicObject>>,
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
        let client = client::client(&config)
            .map_err(|e| refused(format!("cannot build the Kubernetes client: {e}")))?;
        Ok(KubeStore::with_client(client, &namespace, server, &options))
    }

    /// Opens the store on an existing client.
    pub fn with_client(client: Client, namespace: &str, server: String, options: &KubeOptions) -> KubeStore {
        let resource = ApiResource::erase::<Lease>(&());
        let timings = Arc::new(LiveTimings::new(StoreTimings {
            fallback_duration: options.fallback_duration,
            request_timeout: options.request_timeout,
        }));
        let bound = timings.clone();
        let gate = RequestGate::new(move || bound.request_timeout());
        let api = Gated::new(Api::namespaced_with(client, namespace, &resource), Arc::new(gate));
        let watch = WatchConfig {
            api: api.clone(),
            selector: written_labels(&options.labels),
            timings,
            watch_timeout_secs: options.watch_timeout_secs,
        };
        KubeStore {
            inner: Arc::new(Inner {
                floors: Floors::new(&api, namespace),
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

    /// The route labels of the pod `pod` in `namespace` (default: the
    /// store's), through the same client.
    pub fn pod_labels(&self, namespace: Option<&str>, pod: &str) -> pod_label::PodLabels {
        let namespace = namespace.unwrap_or(&self.inner.namespace);
        pod_label::PodLabels::new(&self.inner.api, namespace, pod)
    }

    /// The buckets of plugins' key-value state beside the Leases: ConfigMaps
    /// of the same namespace, through the same client.
    pub fn buckets(&self) -> buckets::KubeBuckets {
        buckets::KubeBuckets::through(&self.inner.api, &self.inner.namespace)
    }
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
        Class::Elect.scope(self.read(lease)).await
    }

    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError> {
        // A lease read as never written: its floor must still be 0.
        Class::Elect.scope(self.create_at(lease, record, false)).await
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
        match Class::Elect.scope(self.inner.api.delete(lease, &params)).await {
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
        if version.starts_with(TOMBSTONE) {
            return Class::Elect.scope(self.recreate(lease, version, record)).await;
        }
        let obj = Class::Elect.scope(self.inner.object_at(lease, version)).await?;
        let class = self.inner.class_of_write(lease, &obj, record);
        class.scope(self.replace(lease, obj, version, record)).await
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
    /// else from the API server; see "Listing membership
    /// records" in docs/kubernetes.md.
    async fn list_prefixed(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let inner = &self.inner;
        let objects = match inner.shared.cached(prefix) {
            Ok(objects) => objects,
            Err(why) => {
                tracing::debug!(reason = %why, prefix, "listing the Leases from the API server");
                let selector = watch::label_selector(&inner.watch.selector);
                Class::Elect.scope(inner.list_objects(&selector)).await?
            }
        };
        listed(prefix, &objects, inner.fallback_duration())
    }
}

#[cfg(test)]
mod tests;
