//! The runtime of the electors and the lease store: one thread of its own
//! (`baton-election`), apart from the guests. A guest that blocks a worker
//! thread (inline file I/O on a slow disk, a busy loop between two epoch
//! ticks) cannot delay a renewal or a step-down. The two sides share only
//! each lease's status channel and its [`Term`](crate::election::Term).
//! The spreader runs on it too, when the configuration calls for one.

use std::sync::Arc;

use super::error::ServeError;
use super::stores::open_stores;
use crate::config::Config;
use crate::ops::admin::Monitoring;
use crate::store::LeaseStore;
use crate::store::buckets::BucketStore;

/// The most threads of the election runtime's blocking pool (see
/// [`ElectionRuntime::start`]): one per core, two to eight.
fn election_blocking_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8)
}

/// The runtime of the electors and the store; see the [module
/// documentation](self). Shut down in the background when dropped (an
/// elector stuck in a request does not hold up the exit).
pub(super) struct ElectionRuntime(Option<tokio::runtime::Runtime>);

impl ElectionRuntime {
    pub(super) fn start() -> Result<ElectionRuntime, ServeError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            // The embedded store's file work runs on the blocking pool, a
            // request at a time per lease, each well under a millisecond on
            // a healthy disk. Renewals come in bursts (the renewal grid:
            // about 60 at once with 1,000 leases) and take CPU in the
            // kernel, not waits (a renewal does not sync): more threads
            // than cores only add switches, and the pool, uncapped, kept
            // the thread per lease it grew to at start (every lease
            // acquired at once). A request stuck in a hung file system
            // holds a thread; its elector's timeout does not wait for it,
            // so a full pool delays requests, never a step-down.
            .max_blocking_threads(election_blocking_threads())
            .thread_name("baton-election")
            .enable_all()
            .build()
            .map(|rt| ElectionRuntime(Some(rt)))
            .map_err(ServeError::ElectionRuntime)
    }

    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("running").handle()
    }

    /// Its thread watched by the health checks.
    pub(super) fn watched(&self, monitoring: Option<&Monitoring>) {
        if let Some(monitoring) = monitoring {
            monitoring.health.watch_runtime("election", self.handle());
        }
    }

    /// The test hook [`stall_election_after`]: `after` start, if given,
    /// its only thread blocks for an hour, as a runtime whose worker hangs
    /// would.
    ///
    /// [`stall_election_after`]: super::serve::TestHooks::stall_election_after
    #[cfg(feature = "test-hooks")]
    pub(super) fn stall_after(&self, after: Option<std::time::Duration>) {
        if let Some(after) = after {
            self.handle().spawn(async move {
                tokio::time::sleep(after).await;
                tracing::warn!("test hook: the election runtime's thread blocks for an hour now");
                std::thread::sleep(std::time::Duration::from_secs(3600));
            });
        }
    }

    /// Opens the configured store on this runtime, where its requests run.
    pub(super) async fn open_stores(
        &self,
        config: &Config,
    ) -> Result<(Arc<dyn LeaseStore>, Arc<dyn BucketStore>), ServeError> {
        let config = config.clone();
        self.handle()
            .spawn(async move { open_stores(&config).await })
            .await
            .map_err(|e| ServeError::Store(format!("opening the store failed: {e}")))?
    }
}

impl Drop for ElectionRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
