//! The configured stores: the lease store, and the buckets of plugins'
//! key-value state beside it.

use std::sync::Arc;

use super::serve::{ServeError, store_timings};
use crate::config::{Config, StoreConfig};
use crate::store::buckets::BucketStore;
use crate::store::embedded::EmbeddedStore;
use crate::store::embedded::buckets::EmbeddedBuckets;
use crate::store::kube::{KubeOptions, KubeStore};
use crate::store::{LeaseStore, StoreError};

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
    }
}

/// Opens the configured Kubernetes store (a configuration of another store
/// is refused).
pub(super) async fn open_kube(config: &Config) -> Result<KubeStore, ServeError> {
    match &config.store {
        StoreConfig::Embedded { .. } => Err(ServeError::Store("not a Kubernetes store".into())),
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
/// embedded store's SQLite database in its directory, or ConfigMaps in the
/// Kubernetes store's namespace.
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
    }
}
