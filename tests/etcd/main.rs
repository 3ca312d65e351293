//! etcd tests: the etcd store against a real 3-member etcd 3.4 cluster on
//! loopback (started by `scripts/etcd-testenv.sh`; `scripts/test.sh`
//! starts it before the tests and stops it after), and real `baton`
//! processes electing through it. They fail, never skip, when the cluster
//! is not running.
//!
//! Timings throughout: lease 4 s, renew deadline 2 s, retry period 500 ms,
//! grace 1 s, request timeout 500 ms. Each test works under a key prefix
//! of its own.
//!
//! Files by theme: `conformance.rs` (the store contract of
//! `tests/store_contract.rs`), `bucket_conformance.rs` (the bucket
//! contract of `tests/bucket_contract.rs`), `store.rs` (the store against
//! the cluster: watches, compaction, floors, errors), `elections.rs` (real
//! hosts), `features.rs` (what the other stores do, with real hosts and
//! guests: spreading, yield, drain, health, schedules, buckets),
//! `faults.rs` (members killed, paused, quorum lost, the cluster
//! restarted, a host black-holed, compactions, under real hosts) and
//! `chaos.rs` (the chaos engine); these two start clusters of their own
//! ([`env::OwnCluster`]), whose members they kill.
// Tests may be long; production functions may not (clippy.toml).
#![allow(clippy::too_many_lines)]

mod bucket_conformance;
mod chaos;
mod conformance;
mod deploy;
mod elections;
mod env;
mod faults;
mod features;
mod store;

#[path = "../bucket_contract.rs"]
mod bucket_contract;
#[path = "../store_contract.rs"]
mod store_contract;
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;
#[allow(dead_code)]
#[path = "../e2e/witness.rs"]
mod witness;
// The scenarios every store runs (`features.rs` runs them on etcd).
#[allow(dead_code)]
#[path = "../e2e/draining.rs"]
mod draining;
#[allow(dead_code)]
#[path = "../e2e/spread.rs"]
mod spread;
#[allow(dead_code)]
#[path = "../e2e/status.rs"]
mod status;
#[allow(dead_code)]
#[path = "../e2e/yielding.rs"]
mod yielding;

use std::time::Duration;

use baton::store::etcd::{EtcdOptions, EtcdStore};
use baton::store::{LeaseStore, StoreTimings};

use self::env::EtcdEnv;

/// The request timeout of the tests' leases.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// One test's cluster, runtime and key prefix.
pub struct EtcdTest {
    pub env: EtcdEnv,
    pub rt: tokio::runtime::Runtime,
    /// `/baton-test/<name>-<random>/`.
    pub prefix: String,
    pub scratch: support::Scratch,
}

impl EtcdTest {
    pub fn new(name: &str) -> EtcdTest {
        EtcdTest::on(EtcdEnv::load(), name)
    }

    /// A test on the cluster `env` (one the test started itself).
    pub fn on(env: EtcdEnv, name: &str) -> EtcdTest {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let prefix = format!("/baton-test/{name}-{:08x}/", rand::random::<u32>());
        EtcdTest {
            env,
            rt,
            prefix,
            scratch: support::Scratch::new(),
        }
    }

    /// The options of a store on the test's prefix, plain endpoints.
    pub fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.env.endpoints.clone(),
            prefix: self.prefix.clone(),
            ca: None,
            identity: None,
            user: None,
            dial_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// A store of its own (another client, as another host's) on the
    /// test's prefix. (Connecting without a user makes no request: it is
    /// waited for here, within the test's runtime.)
    pub fn store(&self) -> EtcdStore {
        let _in = self.rt.enter();
        let store = futures::executor::block_on(EtcdStore::connect(self.options())).unwrap();
        store.set_timings(StoreTimings {
            fallback_duration: Duration::from_secs(4),
            request_timeout: REQUEST_TIMEOUT,
        });
        store
    }

    /// The `[store]` section and test timings of a configuration on the
    /// test's prefix.
    pub fn head(&self) -> String {
        format!(
            "[store]\nkind = \"etcd\"\nendpoints = [{}]\nprefix = \"{}\"\n\n\
             [defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"500ms\"\n",
            self.env
                .endpoints
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", "),
            self.prefix
        )
    }
}
