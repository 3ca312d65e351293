//! PostgreSQL tests: the postgres store against a real PostgreSQL 15 on
//! loopback (a primary, an asynchronous streaming standby and a
//! transaction-mode pgbouncer, started by `scripts/pg-testenv.sh`;
//! `scripts/test.sh` starts it before the tests and stops it after), and
//! real `baton` processes electing through it. They fail, never skip, when
//! the server is not running.
//!
//! Timings throughout: lease 4 s, renew deadline 2 s, retry period 500 ms,
//! grace 1 s, request timeout 500 ms. Each test works in a schema of its
//! own.
//!
//! Files by theme: `conformance.rs` (the store contract of
//! `tests/store_contract.rs`), `bucket_conformance.rs` (the bucket
//! contract of `tests/bucket_contract.rs`), `store.rs` (the store against
//! the server: migrations, privileges, TLS, the pooler, notifications),
//! `elections.rs` (real hosts), `features.rs` (what the other stores do,
//! with real hosts and guests: spreading, yield, drain, health, schedules,
//! buckets), `faults.rs` (the server restarted fast and immediately,
//! backends terminated, the server paused, a host black-holed, a failover
//! that loses the newest writes) and `chaos.rs` (the chaos engine); these
//! two on servers of their own ([`env::OwnServer`]).
// Tests may be long; production functions may not (clippy.toml).
#![allow(clippy::too_many_lines)]

mod bucket_conformance;
mod chaos;
mod conformance;
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
// The scenarios every store runs (`features.rs` runs them on PostgreSQL).
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

use baton::store::postgres::{PostgresOptions, PostgresStore};
use baton::store::{LeaseStore, StoreTimings};

use self::env::PgEnv;

/// The request timeout of the tests' leases.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// One test's server, runtime and schema.
pub struct PgTest {
    pub env: PgEnv,
    pub rt: tokio::runtime::Runtime,
    /// `t_<name>_<random>`.
    pub schema: String,
    pub scratch: support::Scratch,
}

impl PgTest {
    pub fn new(name: &str) -> PgTest {
        PgTest::on(PgEnv::load(), name)
    }

    /// A test on the environment `env` (one the test started itself).
    pub fn on(env: PgEnv, name: &str) -> PgTest {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let schema = format!("t_{}_{:08x}", name.replace('-', "_"), rand::random::<u32>());
        PgTest {
            env,
            rt,
            schema,
            scratch: support::Scratch::new(),
        }
    }

    /// The options of a store in the test's schema at `url`.
    pub fn options_at(&self, url: &str) -> PostgresOptions {
        PostgresOptions {
            schema: self.schema.clone(),
            request_timeout: Duration::from_secs(5),
            ..PostgresOptions::for_tests(Some(url))
        }
    }

    /// A store of its own (another pool, as another host's) in the test's
    /// schema on the primary.
    pub fn store(&self) -> PostgresStore {
        self.store_at(&self.env.url)
    }

    /// A store of its own at `url`.
    pub fn store_at(&self, url: &str) -> PostgresStore {
        let connect = PostgresStore::connect(self.options_at(url), &|_| None);
        let store = match tokio::runtime::Handle::try_current() {
            Ok(h) => tokio::task::block_in_place(|| h.block_on(connect)),
            Err(_) => self.rt.block_on(connect),
        }
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        store.set_timings(StoreTimings {
            fallback_duration: Duration::from_secs(4),
            request_timeout: REQUEST_TIMEOUT,
        });
        store
    }

    /// The `[store]` section and test timings of a configuration in the
    /// test's schema at `url`.
    pub fn head_at(&self, url: &str) -> String {
        format!(
            "[store]\nkind = \"postgres\"\nurl = \"{url}\"\nschema = \"{}\"\nrequest-timeout = \"2s\"\n\n\
             [defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"500ms\"\n",
            self.schema
        )
    }

    /// [`head_at`](Self::head_at) the primary.
    pub fn head(&self) -> String {
        self.head_at(&self.env.url)
    }
}
