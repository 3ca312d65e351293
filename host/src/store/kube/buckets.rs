//! The Kubernetes store's buckets: one ConfigMap per bucket, in the
//! Leases' namespace ([`bucket_object_name`]: `baton-bucket.<lease>.<bucket>`).
//!
//! - **Found by labels, not by Lease watches.** Labelled
//!   [`ROLE_LABEL`]` = bucket`; annotated with the lease, the bucket's name,
//!   its fence and its revision ([`FENCE_ANNOTATION`], ...). A ConfigMap is
//!   never a Lease: Lease watches, `baton status` and `kubectl delete leases
//!   --all` leave it alone.
//! - **Entries** are `data["entries.json"]`: each key's value (base64) and
//!   version.
//! - **The fence.** A claim or a write reads the ConfigMap, compares the
//!   writer's term with the fence annotation, and replaces the whole object
//!   under the `resourceVersion` it read: one conditional update. Any write
//!   in between (a newer term's claim above all) makes it fail with 409,
//!   and it starts over from a fresh read, where the fence refuses it. A
//!   stale leader resuming after a pause therefore cannot land a write
//!   once a newer term has claimed the bucket.
//! - **Size.** A ConfigMap holds at most 1 MiB; a bucket's keys and values
//!   are limited to [`MAX_BUCKET_BYTES`] (their base64 fits), and the error
//!   says so.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta};

use super::gate::{Gated, RequestGate};
use serde::{Deserialize, Serialize};

use super::ROLE_LABEL;
use super::requests::post_params;
use crate::store::buckets::{
    Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Limits, Write, apply_to_entries,
    check_fence,
};

/// The value of [`ROLE_LABEL`] on a bucket's ConfigMap.
pub const BUCKET_ROLE: &str = "bucket";

/// The annotation with the bucket's lease.
pub const LEASE_ANNOTATION: &str = "baton.dev/lease";

/// The annotation with the bucket's name.
pub const BUCKET_ANNOTATION: &str = "baton.dev/bucket";

/// The annotation with the bucket's fence: the highest term that claimed or
/// wrote it.
pub const FENCE_ANNOTATION: &str = "baton.dev/fence";

/// The annotation with the bucket's revision.
pub const REVISION_ANNOTATION: &str = "baton.dev/revision";

/// The data key of the entries.
const ENTRIES: &str = "entries.json";

/// The most a bucket may hold in a ConfigMap (keys and values), whatever
/// the plugin's limit: with base64 and JSON around it, it stays below the
/// 1 MiB a ConfigMap may hold.
pub const MAX_BUCKET_BYTES: u64 = 640 << 10;

/// The bound on each request: an API server that does not answer makes
/// the guest's call fail, never hang.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `request` within [`REQUEST_TIMEOUT`].
async fn bounded<T>(
    b: &BucketName,
    verb: &str,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, BucketError> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| BucketError::Unavailable {
            bucket: b.clone(),
            detail: format!(
                "{verb} ConfigMap {}: no answer within {REQUEST_TIMEOUT:?}",
                bucket_object_name(b)
            ),
        })
}

/// How many times a write that lost a race to another writer starts over.
const ATTEMPTS: usize = 16;

/// The longest object name.
const MAX_NAME: usize = 253;

/// The prefix of every bucket ConfigMap's name.
pub const BUCKET_PREFIX: &str = "baton-bucket.";

/// The ConfigMap of `bucket`: `baton-bucket.<lease>.<bucket>` if the
/// bucket's name is a DNS label and the whole fits, else the lease (cut)
/// and a hash of both names.
///
/// ```
/// use baton::store::buckets::BucketName;
/// use baton::store::kube::buckets::bucket_object_name;
///
/// assert_eq!(bucket_object_name(&BucketName::new("jobs", "cursor")), "baton-bucket.jobs.cursor");
/// let odd = bucket_object_name(&BucketName::new("jobs", "My Plugin"));
/// assert!(odd.starts_with("baton-bucket.jobs.") && odd.len() == "baton-bucket.jobs.".len() + 16);
/// ```
pub fn bucket_object_name(bucket: &BucketName) -> String {
    let plain = format!("{BUCKET_PREFIX}{}.{}", bucket.lease, bucket.bucket);
    if crate::store::buckets::validate_bucket_name(&bucket.bucket).is_ok() && plain.len() <= MAX_NAME {
        return plain;
    }
    let hash = format!("{}\0{}", bucket.lease, bucket.bucket)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let keep = MAX_NAME - BUCKET_PREFIX.len() - 17;
    let lease = &bucket.lease[..bucket.lease.len().min(keep)];
    format!(
        "{BUCKET_PREFIX}{}.{hash:016x}",
        lease.trim_end_matches(['.', '-'])
    )
}

/// An entry as stored.
#[derive(Serialize, Deserialize)]
struct StoredEntry {
    /// The value, base64.
    v: String,
    /// Its version.
    r: u64,
}

/// A bucket as read: its object (`None`: none yet), fence, revision and
/// entries.
struct Loaded {
    object: Option<ConfigMap>,
    fence: u64,
    revision: u64,
    entries: BTreeMap<String, Entry>,
}

/// Buckets as ConfigMaps; see the [module documentation](self).
#[derive(Clone)]
pub struct KubeBuckets {
    api: Gated<ConfigMap>,
    namespace: String,
}

impl KubeBuckets {
    /// The buckets in `namespace`, through `client`.
    pub fn new(client: kube::Client, namespace: &str) -> KubeBuckets {
        let gate = RequestGate::new(|| REQUEST_TIMEOUT);
        KubeBuckets {
            api: Gated::new(Api::namespaced(client, namespace), gate.into()),
            namespace: namespace.to_owned(),
        }
    }

    /// The buckets in `namespace`, through a store's client and gate.
    pub(super) fn through(store: &Gated<DynamicObject>, namespace: &str) -> KubeBuckets {
        KubeBuckets {
            api: store.other(|client| Api::namespaced(client, namespace)),
            namespace: namespace.to_owned(),
        }
    }

    async fn load(&self, b: &BucketName) -> Result<Loaded, BucketError> {
        let name = bucket_object_name(b);
        let object = bounded(b, "get", self.api.get_opt(&name))
            .await?
            .map_err(unavailable(b, "get"))?;
        let Some(object) = object else {
            return Ok(Loaded {
                object: None,
                fence: 0,
                revision: 0,
                entries: BTreeMap::new(),
            });
        };
        let notes = object.metadata.annotations.clone().unwrap_or_default();
        let number = |key: &str| -> Result<u64, BucketError> {
            notes.get(key).map_or(Ok(0), |v| {
                v.parse()
                    .map_err(|_| malformed(b, &name, format!("annotation {key} is {v:?}, not a number")))
            })
        };
        let (fence, revision) = (number(FENCE_ANNOTATION)?, number(REVISION_ANNOTATION)?);
        let entries = match object.data.as_ref().and_then(|d| d.get(ENTRIES)) {
            None => BTreeMap::new(),
            Some(json) => decode_entries(json).map_err(|e| malformed(b, &name, e))?,
        };
        Ok(Loaded {
            object: Some(object),
            fence,
            revision,
            entries,
        })
    }

    /// Writes `loaded` back with the new fence, revision and entries: a
    /// replace under the resourceVersion read, or a create. `Ok(false)` if
    /// another writer came first.
    async fn store(&self, b: &BucketName, loaded: Loaded) -> Result<bool, BucketError> {
        let name = bucket_object_name(b);
        let json = encode_entries(&loaded.entries);
        let mut object = loaded.object.unwrap_or_else(|| new_object(b, &name));
        let notes = object.metadata.annotations.get_or_insert_default();
        notes.insert(FENCE_ANNOTATION.into(), loaded.fence.to_string());
        notes.insert(REVISION_ANNOTATION.into(), loaded.revision.to_string());
        object.data.get_or_insert_default().insert(ENTRIES.into(), json);
        let result = if object.metadata.resource_version.is_some() {
            bounded(b, "replace", self.api.replace(&name, &post_params(), &object)).await?
        } else {
            bounded(b, "create", self.api.create(&post_params(), &object)).await?
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
            Err(e) => Err(unavailable(b, "write")(e)),
        }
    }
}

fn new_object(b: &BucketName, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(ROLE_LABEL.to_owned(), BUCKET_ROLE.to_owned())])),
            annotations: Some(BTreeMap::from([
                (LEASE_ANNOTATION.to_owned(), b.lease.clone()),
                (BUCKET_ANNOTATION.to_owned(), b.bucket.clone()),
            ])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn encode_entries(entries: &BTreeMap<String, Entry>) -> String {
    let stored: BTreeMap<&str, StoredEntry> = entries
        .iter()
        .map(|(k, e)| {
            (
                k.as_str(),
                StoredEntry {
                    v: STANDARD.encode(&e.value),
                    r: e.version,
                },
            )
        })
        .collect();
    serde_json::to_string(&stored).unwrap_or_default()
}

fn decode_entries(json: &str) -> Result<BTreeMap<String, Entry>, String> {
    let stored: BTreeMap<String, StoredEntry> =
        serde_json::from_str(json).map_err(|e| format!("{ENTRIES} is not a bucket's entries: {e}"))?;
    stored
        .into_iter()
        .map(|(k, s)| {
            let value = STANDARD
                .decode(&s.v)
                .map_err(|e| format!("{ENTRIES}: key {k:?}: {e}"))?;
            Ok((k, Entry { value, version: s.r }))
        })
        .collect()
}

fn unavailable<'a>(b: &'a BucketName, verb: &'a str) -> impl Fn(kube::Error) -> BucketError + 'a {
    move |e| BucketError::Unavailable {
        bucket: b.clone(),
        detail: format!("{verb} ConfigMap {}: {e}", bucket_object_name(b)),
    }
}

fn malformed(b: &BucketName, name: &str, detail: String) -> BucketError {
    BucketError::Malformed {
        bucket: b.clone(),
        detail: format!("ConfigMap {name}: {detail}"),
    }
}

/// A plugin's limits, with the bucket's size capped at what a ConfigMap
/// holds.
fn capped(limits: Limits) -> Limits {
    Limits {
        bucket: limits.bucket.min(MAX_BUCKET_BYTES),
        ..limits
    }
}

#[async_trait::async_trait]
impl BucketStore for KubeBuckets {
    fn describe(&self) -> String {
        format!("buckets as ConfigMaps in namespace {:?}", self.namespace)
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        for _ in 0..ATTEMPTS {
            let mut loaded = self.load(bucket).await?;
            check_fence(bucket, term, loaded.fence)?;
            let before = loaded.fence;
            if before == term {
                return Ok(before);
            }
            loaded.fence = term;
            if self.store(bucket, loaded).await? {
                return Ok(before);
            }
        }
        Err(contended(bucket))
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        Ok(self.load(bucket).await?.entries.remove(key))
    }

    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        let entries = self.load(bucket).await?.entries;
        Ok(keys.iter().map(|k| entries.get(k).cloned()).collect())
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        let entries = self.load(bucket).await?.entries;
        Ok(entries
            .into_keys()
            .filter(|k| after.is_none_or(|a| k.as_str() > a))
            .take(limit)
            .collect())
    }

    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        let limits = capped(write.limits);
        for _ in 0..ATTEMPTS {
            let mut loaded = self.load(bucket).await?;
            check_fence(bucket, write.term, loaded.fence)?;
            let applied = apply_to_entries(bucket, &mut loaded.entries, loaded.revision, &write.ops, limits)
                .map_err(|e| match e {
                    BucketError::Limit { bucket, detail } if limits.bucket < write.limits.bucket => {
                        BucketError::Limit {
                            bucket,
                            detail: format!("{detail} (a ConfigMap holds at most 1 MiB)"),
                        }
                    }
                    e => e,
                })?;
            loaded.fence = write.term;
            loaded.revision += 1;
            if !(write.may_commit)() {
                return Err(BucketError::Stopped {
                    bucket: bucket.clone(),
                    term: write.term,
                });
            }
            if self.store(bucket, loaded).await? {
                return Ok(applied);
            }
        }
        Err(contended(bucket))
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        let any = BucketName::new(lease.unwrap_or("*"), "*");
        let params = ListParams::default().labels(&format!("{ROLE_LABEL}={BUCKET_ROLE}"));
        let list = bounded(&any, "list", self.api.list(&params))
            .await?
            .map_err(|e| BucketError::Unavailable {
                bucket: any.clone(),
                detail: format!(
                    "list ConfigMaps labelled {ROLE_LABEL}={BUCKET_ROLE} in namespace {:?}: {e} (the Role needs \"list\" on configmaps: deploy/kubernetes/role.yaml)",
                    self.namespace
                ),
            })?;
        let mut all = Vec::new();
        for object in list.items {
            let notes = object.metadata.annotations.clone().unwrap_or_default();
            let (Some(l), Some(b)) = (notes.get(LEASE_ANNOTATION), notes.get(BUCKET_ANNOTATION)) else {
                continue;
            };
            if lease.is_some_and(|want| want != l) {
                continue;
            }
            let name = BucketName::new(l, b);
            let entries = object
                .data
                .as_ref()
                .and_then(|d| d.get(ENTRIES))
                .map(|j| decode_entries(j))
                .transpose()
                .map_err(|e| malformed(&name, &bucket_object_name(&name), e))?
                .unwrap_or_default();
            all.push(BucketInfo {
                fence: notes
                    .get(FENCE_ANNOTATION)
                    .and_then(|f| f.parse().ok())
                    .unwrap_or(0),
                entries: entries.len() as u64,
                bytes: entries
                    .iter()
                    .map(|(k, e)| (k.len() + e.value.len()) as u64)
                    .sum(),
                name,
            });
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }
}

fn contended(bucket: &BucketName) -> BucketError {
    BucketError::Unavailable {
        bucket: bucket.clone(),
        detail: format!("{ATTEMPTS} writes in a row lost to other writers; try again"),
    }
}
