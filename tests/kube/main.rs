//! Kubernetes tests: real `baton` processes electing through Lease objects
//! on a real kube-apiserver (v1.20, started by `scripts/kube-testenv.sh`;
//! `scripts/test.sh` starts it before the tests and stops it after). They
//! fail, never skip, when the server is not running.
//!
//! Timings throughout: lease 4 s, renew deadline 2 s, retry period 500 ms,
//! grace 1 s, request timeout 500 ms (2 s + 1 s + 250 ms margin < 4 s).
//! Each test works in a namespace of its own.
//!
//! Each test starts from a [`KubeTest`](fixture::KubeTest); the tests are
//! in files by theme: `elections.rs`, `spreading.rs`, `outages.rs`,
//! `foreign.rs` (other writers, RBAC), `store.rs` (the store against the
//! server), `terms.rs` (terms and floors), `reset.rs`, `plugins.rs`
//! (plugins through the host), `route.rs` (the leader's pod's route
//! label), `address.rs` (the holder's address on Leases and in status),
//! `state.rs` (plugins' key-value buckets
//! through real hosts and `baton kv`), `chaos.rs`, `conformance.rs` (the
//! store contract of `tests/store_contract.rs`) and `bucket_conformance.rs`
//! (the bucket contract of `tests/bucket_contract.rs`).
// Tests may be long; production functions may not (clippy.toml).
#![allow(clippy::too_many_lines)]

mod address;
mod blackhole;
mod bucket_conformance;
mod chaos;
mod conformance;
mod elections;
mod env;
mod fixture;
mod foreign;
mod outages;
mod plugins;
mod reset;
mod route;
mod spreading;
mod state;
mod store;
mod terms;

#[path = "../bucket_contract.rs"]
mod bucket_contract;
#[allow(dead_code)]
#[path = "../e2e/draining.rs"]
mod draining;
#[path = "../e2e/leader_address.rs"]
mod leader_address;
#[path = "../e2e/moving.rs"]
mod moving;
#[allow(dead_code)]
#[path = "../e2e/spread.rs"]
mod spread;
#[allow(dead_code)]
#[path = "../e2e/status.rs"]
mod status;
#[path = "../store_contract.rs"]
mod store_contract;
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;
#[allow(dead_code)]
#[path = "../e2e/witness.rs"]
mod witness;
#[allow(dead_code)]
#[path = "../e2e/yielding.rs"]
mod yielding;

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use baton::store::TOMBSTONE;
use baton::store::kube::floor::RESERVED_TERMS;
use baton::store::kube::{KubeOptions, KubeStore, LEASE_ROLE, ROLE_LABEL};
use baton::store::{LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, Versioned, Yielded};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

use env::{KubeEnv, OwnServer, TestNamespace, compact_etcd, delta, lease_requests, requests_to};
use fixture::*;
use support::*;

const STOPPED: &str = "leader task stopped";
const SECS: fn(u64) -> Duration = Duration::from_secs;
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(1);
