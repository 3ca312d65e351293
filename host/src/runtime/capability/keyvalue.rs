//! `wasi:keyvalue@0.2.0-draft2` (`store`, `atomics`, `batch`) for plugins
//! of both worlds, over the lease store's fenced buckets
//! ([`crate::store::buckets`]).
//!
//! Bound here with `bindgen!` rather than taken from
//! `wasmtime-wasi-keyvalue`: that crate implements the older draft (no
//! compare-and-swap) and keeps its data in memory per Store, where a
//! leader's state must outlive its instance, its process and its host.
//!
//! - A plugin opens only the buckets its `keyvalue` grant names
//!   ([`BucketGrant`]); `default` is its own bucket, stored under the
//!   plugin's name. Anything else is `access-denied`.
//! - Every write carries the instance's term, and the store refuses it if a
//!   newer term has claimed the bucket; its last check that the term is not
//!   past its force-stop time is made right before the write is made
//!   durable. A refused write is logged and counted, and the guest gets
//!   `error::other` with the reason.
//! - Batches are atomic here (one write), stronger than the draft asks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::WasiView;

use bytesize::ByteSize;

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;
use crate::store::buckets::{
    Applied, BucketError, BucketName, BucketStore, Entry, Limits, Op, Write, validate_bucket_name,
};

/// Bindings for `wasi:keyvalue/imports@0.2.0-draft2`.
#[allow(missing_docs)]
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/deps/keyvalue-0.2.0-draft2",
        world: "wasi:keyvalue/imports@0.2.0-draft2",
        imports: { default: async | trappable },
        with: {
            "wasi:keyvalue/store.bucket": super::OpenBucket,
            "wasi:keyvalue/atomics.cas": super::Cas,
        },
        require_store_data_send: true,
    });
}

use bindings::wasi::keyvalue::{atomics, batch, store};

/// The name by which a plugin opens its own bucket.
pub const OWN_BUCKET: &str = "default";

/// How many keys one `list-keys` call returns at most.
const KEYS_PER_PAGE: usize = 1000;

/// Which buckets a plugin may open, and the limits on its writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketGrant {
    /// The names the guest may open (`default`: its own bucket).
    pub buckets: Vec<String>,
    /// The limits on keys, values and bucket sizes.
    pub limits: Limits,
}

impl Default for BucketGrant {
    /// The plugin's own bucket, with the default limits.
    fn default() -> BucketGrant {
        BucketGrant {
            buckets: vec![OWN_BUCKET.to_owned()],
            limits: Limits::default(),
        }
    }
}

impl BucketGrant {
    /// The bucket that the guest's name `name` opens for `plugin` under
    /// `lease`, if granted.
    pub fn resolve(&self, lease: &str, plugin: &str, name: &str) -> Option<BucketName> {
        self.buckets
            .iter()
            .any(|b| b == name)
            .then(|| stored_bucket(lease, plugin, name))
    }

    /// Every bucket granted to `plugin` under `lease`, as stored.
    pub fn stored(&self, lease: &str, plugin: &str) -> Vec<BucketName> {
        self.buckets
            .iter()
            .map(|b| stored_bucket(lease, plugin, b))
            .collect()
    }
}

/// The stored bucket behind a guest's name: `default` is the plugin's own,
/// under the plugin's name.
fn stored_bucket(lease: &str, plugin: &str, name: &str) -> BucketName {
    let bucket = if name == OWN_BUCKET { plugin } else { name };
    BucketName::new(lease, bucket)
}

/// What one plugin's operations came to, for `/metrics`.
#[derive(Debug, Default)]
pub struct BucketCounts {
    counts: [[AtomicU64; Outcome::ALL.len()]; 2],
}

/// How one operation ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// A compare-and-swap found the entry changed.
    Conflict,
    /// A write of a stale term: a newer term had claimed the bucket, or the
    /// writer's term was past its force-stop time.
    Stale,
    /// A limit refused it.
    Limit,
    /// Any other failure (the store unreachable, a malformed bucket, a
    /// bucket not granted).
    Error,
}

impl Outcome {
    /// Every outcome, in the order of the counts.
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Conflict,
        Outcome::Stale,
        Outcome::Limit,
        Outcome::Error,
    ];

    /// Its label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "conflict",
            Outcome::Stale => "stale",
            Outcome::Limit => "limit",
            Outcome::Error => "error",
        }
    }

    fn of(result: &Result<impl Sized, BucketError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(BucketError::Changed { .. }) => Outcome::Conflict,
            Err(e) if e.is_stale() => Outcome::Stale,
            Err(BucketError::Limit { .. } | BucketError::NotAnInteger { .. }) => Outcome::Limit,
            Err(_) => Outcome::Error,
        }
    }
}

impl BucketCounts {
    fn count(&self, write: bool, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.counts[usize::from(write)][i].fetch_add(1, Ordering::Relaxed);
    }

    /// How many reads (`write` false) or writes ended with `outcome`.
    pub fn get(&self, write: bool, outcome: Outcome) -> u64 {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.counts[usize::from(write)][i].load(Ordering::Relaxed)
    }
}

/// A plugin's buckets: the store, what it may open, and its counts. One
/// per plugin, shared by its instances.
pub struct PluginBuckets {
    /// The lease store's buckets.
    pub store: Arc<dyn BucketStore>,
    /// The plugin's name.
    pub plugin: Arc<str>,
    /// What it may open.
    pub grant: BucketGrant,
    /// Its operations, counted.
    pub counts: Arc<BucketCounts>,
}

impl PluginBuckets {
    /// A read's result, counted, as the guest sees it.
    fn read<R>(&self, result: Result<R, BucketError>) -> Result<R, store::Error> {
        self.counts.count(false, Outcome::of(&result));
        result.map_err(|e| guest_error(&self.plugin, e))
    }

    /// Claims every granted bucket of the lease for `term`, before the
    /// term's first guest call; the first failure is returned.
    pub async fn claim(&self, lease: &str, term: u64) -> Result<(), BucketError> {
        for bucket in self.grant.stored(lease, &self.plugin) {
            let before = self.store.claim(&bucket, term).await?;
            if before != term {
                tracing::debug!(plugin = %self.plugin, %bucket, term, fence = before, "bucket claimed for the term");
            }
        }
        Ok(())
    }
}

/// What an instance's Store keeps for `wasi:keyvalue`.
pub struct KeyValueCtx {
    /// The plugin's buckets; `None` where there is no lease store (`baton
    /// check`): every `open` is then `no-such-store`.
    pub buckets: Option<Arc<PluginBuckets>>,
    /// The lease the instance's term is of.
    pub lease: String,
    /// The instance's term.
    pub term: StoreTerm,
}

/// An open bucket (the `bucket` resource).
pub struct OpenBucket {
    name: BucketName,
}

/// A compare-and-swap in progress (the `cas` resource): the entry as read.
pub struct Cas {
    bucket: BucketName,
    key: String,
    seen: Option<Entry>,
}

/// A delay before each write, for the tests of a leader paused in the
/// middle of one (`BATON_TEST_BUCKET_WRITE_DELAY`, such as `3s`). Read
/// only in a build with the `test-hooks` feature.
fn test_write_delay() -> Option<Duration> {
    if !cfg!(feature = "test-hooks") {
        return None;
    }
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("BATON_TEST_BUCKET_WRITE_DELAY")
            .ok()
            .and_then(|d| humantime::parse_duration(&d).ok())
    })
}

impl KeyValueCtx {
    fn buckets(&self) -> Result<&Arc<PluginBuckets>, store::Error> {
        self.buckets.as_ref().ok_or(store::Error::NoSuchStore)
    }

    /// A bucket error as the guest sees it.
    fn error(&self, e: BucketError) -> store::Error {
        let plugin = self.buckets.as_ref().map_or("?", |b| &*b.plugin);
        guest_error(plugin, e)
    }

    /// The plugin's buckets, or the guest's error.
    fn plugin_buckets(&self) -> Result<Arc<PluginBuckets>, store::Error> {
        self.buckets().cloned()
    }

    /// Writes `ops` to `bucket` in the instance's term; see the [module
    /// documentation](self). The write runs as a task of its own: once
    /// handed to the store it runs to its end even if the instance is
    /// dropped at its force-stop, so it lands before its last check or is
    /// refused, and a refusal is logged either way.
    async fn write(&self, bucket: &BucketName, ops: Vec<Op>) -> Result<Applied, BucketError> {
        let Some(buckets) = self.buckets.clone() else {
            return Err(BucketError::Unavailable {
                bucket: bucket.clone(),
                detail: "no lease store".into(),
            });
        };
        let term = self.term.clone();
        let number = term.number();
        let write = Write {
            term: number,
            ops,
            limits: buckets.grant.limits,
            may_commit: Arc::new(move || !term.must_stop()),
        };
        let name = bucket.clone();
        let task = tokio::spawn(async move {
            if let Some(delay) = test_write_delay() {
                tokio::time::sleep(delay).await;
            }
            let result = buckets.store.apply(&name, write).await;
            buckets.counts.count(true, Outcome::of(&result));
            if let Err(e) = &result
                && e.is_stale()
            {
                tracing::warn!(plugin = %buckets.plugin, bucket = %name, term = number, error = %e,
                    "refused a stale write");
            }
            result
        });
        task.await.unwrap_or_else(|e| {
            Err(BucketError::Unavailable {
                bucket: bucket.clone(),
                detail: format!("the write failed: {e}"),
            })
        })
    }
}

/// A read of the instance's plugin's buckets, counted: `read!(self,
/// get(&name, &key))` is `Result<_, store::Error>`.
macro_rules! read {
    ($state:expr, $op:ident($($arg:expr),*)) => {
        match $state.keyvalue.plugin_buckets() {
            Ok(b) => b.read(b.store.$op($($arg),*).await),
            Err(e) => Err(e),
        }
    };
}

/// A bucket error as the guest sees it: `other`, naming the plugin.
fn guest_error(plugin: &str, e: BucketError) -> store::Error {
    store::Error::Other(format!("plugin {plugin:?}: {e}"))
}

impl KeyValueView<'_> {
    fn bucket_name(&self, bucket: &Resource<OpenBucket>) -> wasmtime::Result<BucketName> {
        Ok(self.table.get(bucket)?.name.clone())
    }
}

impl store::Host for KeyValueView<'_> {
    async fn open(
        &mut self,
        identifier: String,
    ) -> wasmtime::Result<Result<Resource<OpenBucket>, store::Error>> {
        let kv = &self.keyvalue;
        let buckets = match kv.buckets() {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        let Some(name) = buckets.grant.resolve(&kv.lease, &buckets.plugin, &identifier) else {
            tracing::debug!(plugin = %buckets.plugin, bucket = %identifier, "bucket not granted");
            buckets.counts.count(false, Outcome::Error);
            return Ok(Err(store::Error::AccessDenied));
        };
        Ok(Ok(self.table.push(OpenBucket { name })?))
    }
}

impl store::HostBucket for KeyValueView<'_> {
    async fn get(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let got = read!(self, get(&name, &key));
        Ok(got.map(|e| e.map(|e| e.value)))
    }

    async fn set(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let name = self.bucket_name(&bucket)?;
        Ok(self
            .keyvalue
            .write(&name, vec![Op::Set { key, value }])
            .await
            .map(drop)
            .map_err(|e| self.keyvalue.error(e)))
    }

    async fn delete(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let name = self.bucket_name(&bucket)?;
        Ok(self
            .keyvalue
            .write(&name, vec![Op::Delete { key }])
            .await
            .map(drop)
            .map_err(|e| self.keyvalue.error(e)))
    }

    async fn exists(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
    ) -> wasmtime::Result<Result<bool, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        Ok(read!(self, get(&name, &key)).map(|e| e.is_some()))
    }

    async fn list_keys(
        &mut self,
        bucket: Resource<OpenBucket>,
        cursor: Option<String>,
    ) -> wasmtime::Result<Result<store::KeyResponse, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let keys = read!(self, list_keys(&name, cursor.as_deref(), KEYS_PER_PAGE));
        Ok(keys.map(|keys| store::KeyResponse {
            cursor: (keys.len() == KEYS_PER_PAGE)
                .then(|| keys.last().cloned())
                .flatten(),
            keys,
        }))
    }

    async fn drop(&mut self, bucket: Resource<OpenBucket>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

impl atomics::Host for KeyValueView<'_> {
    async fn increment(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let applied = self
            .keyvalue
            .write(&name, vec![Op::Increment { key, delta }])
            .await;
        Ok(applied
            .map(|a| a.first().copied().unwrap_or_default())
            .map_err(|e| self.keyvalue.error(e)))
    }

    async fn swap(
        &mut self,
        cas: Resource<Cas>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), atomics::CasError>> {
        let cas = self.table.delete(cas)?;
        let version = cas.seen.as_ref().map_or(0, |e| e.version);
        let op = Op::Swap {
            key: cas.key.clone(),
            version,
            value,
        };
        match self.keyvalue.write(&cas.bucket, vec![op]).await {
            Ok(_) => Ok(Ok(())),
            Err(BucketError::Changed { .. }) => {
                let seen = read!(self, get(&cas.bucket, &cas.key));
                match seen {
                    Ok(seen) => {
                        let fresh = self.table.push(Cas { seen, ..cas })?;
                        Ok(Err(atomics::CasError::CasFailed(fresh)))
                    }
                    Err(e) => Ok(Err(atomics::CasError::StoreError(e))),
                }
            }
            Err(e) => Ok(Err(atomics::CasError::StoreError(self.keyvalue.error(e)))),
        }
    }
}

impl atomics::HostCas for KeyValueView<'_> {
    async fn new(
        &mut self,
        bucket: Resource<OpenBucket>,
        key: String,
    ) -> wasmtime::Result<Result<Resource<Cas>, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let seen = match read!(self, get(&name, &key)) {
            Ok(seen) => seen,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(self.table.push(Cas {
            bucket: name,
            key,
            seen,
        })?))
    }

    async fn current(
        &mut self,
        cas: Resource<Cas>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, store::Error>> {
        Ok(Ok(self.table.get(&cas)?.seen.as_ref().map(|e| e.value.clone())))
    }

    async fn drop(&mut self, cas: Resource<Cas>) -> wasmtime::Result<()> {
        self.table.delete(cas)?;
        Ok(())
    }
}

impl batch::Host for KeyValueView<'_> {
    async fn get_many(
        &mut self,
        bucket: Resource<OpenBucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<Option<(String, Vec<u8>)>>, store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let got = read!(self, get_many(&name, &keys));
        Ok(got.map(|entries| {
            keys.into_iter()
                .zip(entries)
                .map(|(k, e)| e.map(|e| (k, e.value)))
                .collect()
        }))
    }

    async fn set_many(
        &mut self,
        bucket: Resource<OpenBucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let ops = key_values
            .into_iter()
            .map(|(key, value)| Op::Set { key, value })
            .collect();
        Ok(self
            .keyvalue
            .write(&name, ops)
            .await
            .map(drop)
            .map_err(|e| self.keyvalue.error(e)))
    }

    async fn delete_many(
        &mut self,
        bucket: Resource<OpenBucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let name = self.bucket_name(&bucket)?;
        let ops = keys.into_iter().map(|key| Op::Delete { key }).collect();
        Ok(self
            .keyvalue
            .write(&name, ops)
            .await
            .map(drop)
            .map_err(|e| self.keyvalue.error(e)))
    }
}

/// The capability: `wasi:keyvalue` over the plugin's buckets.
pub struct KeyValue;

/// `keyvalue-limits`, as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawKeyValueLimits {
    key: Option<ByteSize>,
    value: Option<ByteSize>,
    bucket: Option<ByteSize>,
}

crate::raw_keys! {
    /// `keyvalue` and `keyvalue-limits`.
    pub struct RawKeyValue {
        buckets: Vec<String> = "keyvalue",
        limits: RawKeyValueLimits = "keyvalue-limits",
    }
}

/// What `wasi:keyvalue` sees of a Store.
pub struct KeyValueView<'a> {
    keyvalue: &'a mut KeyValueCtx,
    table: &'a mut ResourceTable,
}

impl HasData for KeyValue {
    type Data<'a> = KeyValueView<'a>;
}

impl Capability for KeyValue {
    type Raw = RawKeyValue;
    type Grant = BucketGrant;
    /// Its buckets, where the host has a lease store.
    type Plugin = Option<Arc<PluginBuckets>>;
    type Ctx = KeyValueCtx;
    type View<'a> = KeyValueView<'a>;

    /// The buckets named (each a valid name, none of the host's own
    /// `baton-` ones), the limits defaulted and consistent.
    fn grant(raw: RawKeyValue, site: &GrantSite<'_>) -> Result<BucketGrant, GrantError> {
        let mut grant = BucketGrant::default();
        if let Some(buckets) = raw.buckets {
            for b in &buckets {
                if b != OWN_BUCKET {
                    validate_bucket_name(b).map_err(|e| site.error("keyvalue", e))?;
                }
                if b.starts_with("baton-") {
                    let why = format!(
                        "bucket {b:?}: names starting with \"baton-\" are kept for the host's own buckets"
                    );
                    return Err(site.error("keyvalue", why));
                }
            }
            grant.buckets = buckets;
        }
        let raw = raw.limits.unwrap_or_default();
        let limit = |l: Option<ByteSize>, default: u64| l.map_or(default, |b| b.as_u64());
        let limits = &mut grant.limits;
        limits.key = limit(raw.key, limits.key as u64) as usize;
        limits.value = limit(raw.value, limits.value as u64) as usize;
        limits.bucket = limit(raw.bucket, limits.bucket);
        if limits.key == 0 || limits.value as u64 > limits.bucket {
            let why = format!(
                "key must be above 0 and value ({}) at most bucket ({})",
                limits.value, limits.bucket
            );
            return Err(site.error("keyvalue-limits", why));
        }
        Ok(grant)
    }

    fn load(grant: &BucketGrant, plugin: &LoadContext<'_>) -> Result<Option<Arc<PluginBuckets>>, String> {
        Ok(plugin.buckets.map(|store| {
            Arc::new(PluginBuckets {
                store: store.clone(),
                plugin: plugin.plugin.clone(),
                grant: grant.clone(),
                counts: Arc::default(),
            })
        }))
    }

    fn prepare(
        buckets: &Option<Arc<PluginBuckets>>,
        setup: &mut Setup<'_>,
    ) -> Result<KeyValueCtx, SetupError> {
        Ok(KeyValueCtx {
            buckets: buckets.clone(),
            lease: setup.lease.to_owned(),
            term: setup.term.clone(),
        })
    }

    fn view<'a>(ctx: &'a mut KeyValueCtx, shared: Shared<'a>) -> KeyValueView<'a> {
        KeyValueView {
            keyvalue: ctx,
            table: shared.table,
        }
    }

    /// `wasi:keyvalue/{store,atomics,batch}@0.2.0-draft2`.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> KeyValueView<'a>,
    ) -> wasmtime::Result<()> {
        bindings::Imports::add_to_linker::<_, KeyValue>(linker, get)
    }

    fn describe(grant: &BucketGrant) -> Vec<String> {
        if grant.buckets == BucketGrant::default().buckets {
            Vec::new()
        } else {
            vec![format!("keyvalue {}", grant.buckets.join(","))]
        }
    }
}
