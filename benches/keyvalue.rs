//! Key-value buckets: the latency of one fenced write, one read and one
//! claim, on the embedded store (SQLite in WAL mode, `synchronous = FULL`,
//! in a temporary directory) and on the Kubernetes store (one ConfigMap per
//! bucket on the test API server), through the `BucketStore` a host uses,
//! one operation at a time:
//!
//! - `set 100 B`: `Op::Set` of a 100-byte value to one of 100 keys (the
//!   bucket holds about 10 KB), in the term that holds the fence;
//! - `increment`: `Op::Increment` of one key;
//! - `get`: a read of one of the 100 keys;
//! - `claim`: raising the bucket's fence to the next term, as a term's
//!   start does (a write: on Kubernetes a PUT of the whole ConfigMap).
//!
//! Each prints the median, p99 and max over `BATON_BENCH_OPS` operations
//! (default 500; `BATON_BENCH_CLAIMS`, default 200, claims), after 20
//! unmeasured ones. The Kubernetes part runs on the test API server of
//! `scripts/kube-testenv.sh start` (`BATON_KUBE_ENV`, default
//! `$BATON_CACHE/kube/run/env.sh`), in a namespace of its own, as the admin;
//! without a running server it is skipped, and says so.
//!
//! Run: `scripts/bench.sh --bench keyvalue`.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/kube/env.rs"]
#[allow(dead_code)]
mod env;

use std::path::PathBuf;
use std::time::Instant;

use baton::store::buckets::{BucketName, BucketStore, Limits, Op, Write};
use baton::store::embedded::buckets::EmbeddedBuckets;
use baton::store::kube::buckets::KubeBuckets;

/// Unmeasured operations before each measured series.
const WARM_UP: usize = 20;
/// Keys the writes and reads go round.
const KEYS: usize = 100;

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints one series: median, p99 and max in milliseconds.
fn report(store: &str, what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
    let total: f64 = ms.iter().sum();
    println!(
        "{store:<10} {what:<10} n {:>4}  median {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({:.0} ops/s one at a time)",
        ms.len(),
        ms[ms.len() / 2],
        p99,
        ms[ms.len() - 1],
        ms.len() as f64 / (total / 1e3)
    );
}

/// Times `n` calls of `op(i)` after [`WARM_UP`] unmeasured ones (`i` goes
/// on counting through both).
async fn timed<F, Fut>(n: usize, mut op: F) -> Vec<f64>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..WARM_UP {
        op(i).await;
    }
    let mut ms = Vec::with_capacity(n);
    for i in WARM_UP..WARM_UP + n {
        let start = Instant::now();
        op(i).await;
        ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    ms
}

/// Every series on one store.
async fn measure(name: &str, store: &dyn BucketStore, ops: usize, claims: usize) {
    let b = BucketName::new("bench", "plugin");
    let term = 1;
    store.claim(&b, term).await.unwrap();
    let write = |ops: Vec<Op>| Write::new(term, ops, Limits::default());
    let set = timed(ops, |i| {
        let value = format!("{i:0>100}").into_bytes();
        let w = write(vec![Op::Set {
            key: format!("key-{:03}", i % KEYS),
            value,
        }]);
        let b = &b;
        async move {
            store.apply(b, w).await.unwrap();
        }
    })
    .await;
    report(name, "set 100 B", set);
    let incr = timed(ops, |_| {
        let w = write(vec![Op::Increment {
            key: "count".into(),
            delta: 1,
        }]);
        let b = &b;
        async move {
            store.apply(b, w).await.unwrap();
        }
    })
    .await;
    report(name, "increment", incr);
    let get = timed(ops, |i| {
        let (b, key) = (&b, format!("key-{:03}", i % KEYS));
        async move {
            assert!(store.get(b, &key).await.unwrap().is_some());
        }
    })
    .await;
    report(name, "get", get);
    let claim = timed(claims, |i| {
        let b = &b;
        async move {
            store.claim(b, term + 1 + i as u64).await.unwrap();
        }
    })
    .await;
    report(name, "claim", claim);
    let info = store.buckets(Some("bench")).await.unwrap();
    println!(
        "{name:<10} the bucket: {} entries, {} bytes, fence {}",
        info[0].entries, info[0].bytes, info[0].fence
    );
}

/// The test API server's env file, if the server runs.
fn kube_env() -> Result<env::KubeEnv, String> {
    let file = std::env::var_os("BATON_KUBE_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| env::cache_dir().join("kube/run/env.sh"));
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let pid: i32 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("export KUBE_TEST_APISERVER_PID="))
        .and_then(|p| p.trim_matches(['"', '\'']).parse().ok())
        .ok_or_else(|| format!("{} names no API server", file.display()))?;
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return Err(format!(
            "the API server of {} (pid {pid}) is not running",
            file.display()
        ));
    }
    Ok(env::KubeEnv::load_from(file))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let ops = count("BATON_BENCH_OPS", 500);
    let claims = count("BATON_BENCH_CLAIMS", 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("keyvalue: one operation at a time, {ops} each ({claims} claims), after {WARM_UP} unmeasured");
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedBuckets::open(dir.path()).unwrap();
    println!("embedded: {}", embedded.describe());
    rt.block_on(measure("embedded", &embedded, ops, claims));
    match kube_env() {
        Err(why) => println!(
            "kubernetes: skipped: {why}; start the test API server first (scripts/kube-testenv.sh start)"
        ),
        Ok(env) => {
            let ns = rt.block_on(async {
                let admin = env.admin().await;
                let ns = env::TestNamespace::create(admin.clone(), "kv-bench").await;
                let store = KubeBuckets::new(admin, &ns.name);
                println!(
                    "kubernetes: {} on kube-apiserver 1.20 (scripts/kube-testenv.sh)",
                    store.describe()
                );
                measure("kubernetes", &store, ops, claims).await;
                ns
            });
            // Deleted outside the runtime's block_on.
            drop(ns);
        }
    }
}
