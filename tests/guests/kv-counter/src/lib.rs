//! A test plugin (pollable world) that keeps a counter in a
//! `wasi:keyvalue` bucket, through the SDK's `kv` and `config` modules.
//!
//! Variables (the host passes those the config grants):
//!
//! - `KV_MODE`:
//!   - `count` (default): while leading, every `KV_INTERVAL_MS`
//!     milliseconds (default 20), adds one to the counter at key `count` of
//!     bucket `KV_BUCKET` (default `default`) by compare-and-swap. The value
//!     is `"<n> <term>"`: the count and the term that wrote it. Before each
//!     swap it prints `kv try n=N term=T`, after it `kv ok n=N term=T`; when
//!     another write came between, `kv conflict n=N term=T` and it tries
//!     again with the fresh value; on an error `kv error n=N term=T
//!     error=MESSAGE` and `run` returns `Err` (`N`: the count it was about
//!     to write, or the last it read plus one when the read failed). It
//!     returns `Ok` once the status is no longer the one `run` got.
//!     With `KV_RECORDS` (a file in a granted directory) each of these
//!     lines is also appended to that file as it happens, `try` before the
//!     swap (the swap is not tried if it cannot be written): a record a
//!     killed host's log lost is still there.
//!   - `once`: one increment (the same lines), then returns `Ok`.
//!   - `stubborn`: as `count`, but ignores the status change: it keeps
//!     counting until the host stops it (a plugin built to misbehave).
//!   - `grant-probe`: opens `KV_BUCKET` and prints `kv open bucket=B
//!     result=R`, then (if it opened) sets key `probe` to `KV_VALUE_BYTES`
//!     bytes (default 10) and prints `kv set bytes=N result=R`; `R` is `ok`,
//!     `access-denied`, `no-such-store` or `other:MESSAGE`. Returns `Ok`.
//!   - `config`: prints `config get key=K value=V` (`value=none` when not
//!     set, `error=MESSAGE` when the read failed) for each key of
//!     `CONFIG_KEYS` (comma separated), then `config all n=COUNT`. Returns
//!     `Ok`.
//!
//! Any other mode returns `Err("unknown KV_MODE: M")`.

use std::time::Duration;

use baton_guest::kv::{Bucket, CasError, Error};
use baton_guest::pollable::{self, LeaderTask};
use baton_guest::{Status, config};

struct KvCounter;

const KEY: &str = "count";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn bucket_name() -> String {
    env("KV_BUCKET").unwrap_or_else(|| "default".into())
}

/// The count in a stored value `"<n> <term>"` (0 when unset or unreadable).
fn count_of(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How an error shows in the probe's lines.
fn result_text(result: Result<(), &Error>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(Error::AccessDenied) => "access-denied".into(),
        Err(Error::NoSuchStore) => "no-such-store".into(),
        Err(e) => format!("other:{e}"),
    }
}

/// Prints `line`, and appends it to `KV_RECORDS` if set (an error if it
/// cannot be written).
fn say(line: &str) -> Result<(), String> {
    println!("{line}");
    let Some(file) = env("KV_RECORDS") else {
        return Ok(());
    };
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        .map_err(|e| format!("cannot record {line:?} in {file}: {e}"))
}

/// Adds one to the counter by compare-and-swap, printing each step;
/// `last` is the last count read. Returns the count written.
fn increment(bucket: &Bucket, term: u64, last: &mut u64) -> Result<u64, String> {
    let fail = |n: u64, e: &Error| {
        let _ = say(&format!("kv error n={n} term={term} error={e}"));
        format!("kv error: {e}")
    };
    let mut cas = bucket.cas(KEY).map_err(|e| fail(*last + 1, &e))?;
    loop {
        let current = cas.current().map_err(|e| fail(*last + 1, &e))?;
        *last = count_of(current.as_deref());
        let n = *last + 1;
        say(&format!("kv try n={n} term={term}"))?;
        match cas.swap(format!("{n} {term}").as_bytes()) {
            Ok(()) => {
                let _ = say(&format!("kv ok n={n} term={term}"));
                *last = n;
                return Ok(n);
            }
            Err(CasError::Conflict(fresh)) => {
                let _ = say(&format!("kv conflict n={n} term={term}"));
                cas = fresh;
            }
            Err(CasError::Store(e)) => return Err(fail(n, &e)),
        }
    }
}

/// How `count` treats the status change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// Until the change.
    Term,
    /// One increment.
    Once,
    /// Ignoring the change.
    Stubborn,
}

fn count(status: &Status, how: Counting) -> Result<(), String> {
    let term = status.term;
    let interval = env("KV_INTERVAL_MS").and_then(|ms| ms.parse().ok()).unwrap_or(20);
    let change = pollable::watch(status);
    let mut last = 0;
    let bucket = Bucket::open(&bucket_name()).map_err(|e| {
        println!("kv error n=1 term={term} error={e}");
        format!("kv error: {e}")
    })?;
    loop {
        if how != Counting::Stubborn && change.is_ready() {
            return Ok(());
        }
        increment(&bucket, term, &mut last)?;
        match how {
            Counting::Once => return Ok(()),
            Counting::Term if change.wait_timeout(Duration::from_millis(interval)) => return Ok(()),
            Counting::Term => {}
            Counting::Stubborn => std::thread::sleep(Duration::from_millis(interval)),
        }
    }
}

fn grant_probe() {
    let name = bucket_name();
    let bucket = Bucket::open(&name);
    println!(
        "kv open bucket={name} result={}",
        result_text(bucket.as_ref().map(|_| ()))
    );
    let Ok(bucket) = bucket else { return };
    let bytes = env("KV_VALUE_BYTES").and_then(|n| n.parse().ok()).unwrap_or(10);
    let set = bucket.set("probe", vec![b'x'; bytes]);
    println!(
        "kv set bytes={bytes} result={}",
        result_text(set.as_ref().map(|_| ()))
    );
}

fn config_probe() {
    let keys = env("CONFIG_KEYS").unwrap_or_default();
    for key in keys.split(',').filter(|k| !k.is_empty()) {
        match config::get(key) {
            Ok(Some(value)) => println!("config get key={key} value={value}"),
            Ok(None) => println!("config get key={key} value=none"),
            Err(e) => println!("config get key={key} error={e}"),
        }
    }
    match config::get_all() {
        Ok(all) => println!("config all n={}", all.len()),
        Err(e) => println!("config all error={e}"),
    }
}

impl LeaderTask for KvCounter {
    fn run(status: Status) -> Result<(), String> {
        match env("KV_MODE").as_deref().unwrap_or("count") {
            "count" => count(&status, Counting::Term),
            "once" => count(&status, Counting::Once),
            "stubborn" => count(&status, Counting::Stubborn),
            "grant-probe" => {
                grant_probe();
                Ok(())
            }
            "config" => {
                config_probe();
                Ok(())
            }
            other => Err(format!("unknown KV_MODE: {other}")),
        }
    }
}

baton_guest::export_pollable!(KvCounter);
