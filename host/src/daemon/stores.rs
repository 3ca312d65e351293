//! The configured stores: the lease store, and the buckets of plugins'
//! key-value state beside it.

use std::sync::Arc;

use super::error::ServeError;
use crate::config::{Config, StoreConfig};
use crate::store::buckets::BucketStore;
use crate::store::embedded::EmbeddedStore;
use crate::store::embedded::buckets::EmbeddedBuckets;
use crate::store::etcd::EtcdStore;
use crate::store::kube::{KubeOptions, KubeStore};
use crate::store::postgres::PostgresStore;
use crate::store::{LeaseStore, StoreError, StoreTimings};

/// Opens the configured lease store. For a Kubernetes store this builds
/// the client (no request is made yet): a Lease with a holder but no
/// duration is read as the longest configured lease duration, and the
/// client's connect timeout is the shortest configured request timeout.
pub async fn open_store(config: &Config) -> Result<Arc<dyn LeaseStore>, ServeError> {
    match &config.store {
        StoreConfig::Embedded { dir } => EmbeddedStore::open(dir)
            .map(|s| Arc::new(s) as Arc<dyn LeaseStore>)
            .map_err(|e| ServeError::Store(format!("embedded store at {}: {e}", dir.display()))),
        StoreConfig::Kubernetes { .. } => Ok(Arc::new(open_kube(config).await?)),
        StoreConfig::Etcd(_) => Ok(Arc::new(open_etcd(config).await?)),
        StoreConfig::Postgres(_) => Ok(Arc::new(open_postgres(config).await?)),
    }
}

/// Opens the configured PostgreSQL store: the file's settings, libpq's
/// variables for what the URL leaves out (a configuration of another
/// store is refused). Connecting migrates the schema.
pub(super) async fn open_postgres(config: &Config) -> Result<PostgresStore, ServeError> {
    let StoreConfig::Postgres(pg) = &config.store else {
        return Err(ServeError::Store("not a postgres store".into()));
    };
    let options = pg
        .options()
        .map_err(|why| ServeError::Store(format!("postgres store: {why}")))?;
    let env = |name: &str| std::env::var(name).ok();
    let store = PostgresStore::connect(options, &env).await.map_err(|e| match e {
        StoreError::Refused { detail, .. } | StoreError::Unavailable { detail, .. } => {
            ServeError::Store(format!("postgres store: {detail}"))
        }
        other => ServeError::Store(format!("postgres store: {other}")),
    })?;
    store.set_timings(store_timings(config));
    Ok(store)
}

/// Opens the configured etcd store: the file's settings, else the
/// `ETCDCTL_*` variables' (a configuration of another store is refused).
pub(super) async fn open_etcd(config: &Config) -> Result<EtcdStore, ServeError> {
    let StoreConfig::Etcd(etcd) = &config.store else {
        return Err(ServeError::Store("not an etcd store".into()));
    };
    let options = etcd
        .options(|name| std::env::var(name).ok())
        .map_err(|why| ServeError::Store(format!("etcd store: {why}")))?;
    let store = EtcdStore::connect(options).await.map_err(|e| match e {
        StoreError::Refused { detail, .. } | StoreError::Unavailable { detail, .. } => {
            ServeError::Store(format!("etcd store: {detail}"))
        }
        other => ServeError::Store(format!("etcd store: {other}")),
    })?;
    store.set_timings(store_timings(config));
    Ok(store)
}

/// Opens the configured Kubernetes store (a configuration of another store
/// is refused).
pub(super) async fn open_kube(config: &Config) -> Result<KubeStore, ServeError> {
    match &config.store {
        StoreConfig::Embedded { .. } | StoreConfig::Etcd(_) | StoreConfig::Postgres(_) => {
            Err(ServeError::Store("not a Kubernetes store".into()))
        }
        StoreConfig::Kubernetes {
            namespace,
            kubeconfig,
            labels,
            ..
        } => {
            let timings = store_timings(config);
            let options = KubeOptions {
                namespace: namespace.clone(),
                kubeconfig: kubeconfig.clone(),
                labels: labels.clone(),
                fallback_duration: timings.fallback_duration,
                request_timeout: timings.request_timeout,
                watch_timeout_secs: None,
            };
            KubeStore::connect(options).await.map_err(|e| match e {
                // Not about any one lease.
                StoreError::Refused { detail, .. } => {
                    ServeError::Store(format!("kubernetes store: {detail}"))
                }
                other => ServeError::Store(format!("kubernetes store: {other}")),
            })
        }
    }
}

/// Opens the configured lease store and the buckets beside it: the
/// embedded store's SQLite database in its directory, ConfigMaps in the
/// Kubernetes store's namespace, keys of the etcd store, or tables of the
/// PostgreSQL store.
pub async fn open_stores(config: &Config) -> Result<(Arc<dyn LeaseStore>, Arc<dyn BucketStore>), ServeError> {
    match &config.store {
        StoreConfig::Embedded { dir } => {
            let buckets = EmbeddedBuckets::open(dir)
                .map_err(|e| ServeError::Store(format!("embedded store at {}: {e}", dir.display())))?;
            Ok((open_store(config).await?, Arc::new(buckets)))
        }
        StoreConfig::Kubernetes { .. } => {
            let store = open_kube(config).await?;
            let buckets = Arc::new(store.buckets());
            Ok((Arc::new(store), buckets))
        }
        StoreConfig::Etcd(_) => {
            let store = open_etcd(config).await?;
            let buckets = Arc::new(store.buckets());
            Ok((Arc::new(store), buckets))
        }
        StoreConfig::Postgres(_) => {
            let store = open_postgres(config).await?;
            let buckets = Arc::new(store.buckets());
            Ok((Arc::new(store), buckets))
        }
    }
}

/// What the store derives from the configured leases' timings: the longest
/// lease duration (read for a record with a holder but no duration) and
/// the shortest request timeout; the defaults' without leases. Given to the
/// store when it is opened, and again after every applied reload.
pub fn store_timings(config: &Config) -> StoreTimings {
    let defaults = crate::election::Timings::default();
    let leases = || config.leases.iter().map(|l| l.timings);
    StoreTimings {
        fallback_duration: leases()
            .map(|t| t.lease_duration)
            .max()
            .unwrap_or(defaults.lease_duration),
        request_timeout: leases()
            .map(|t| t.request_timeout)
            .min()
            .unwrap_or(defaults.request_timeout),
    }
}
