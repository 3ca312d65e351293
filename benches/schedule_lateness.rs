//! Schedules: how late a scheduled run starts after its due time. One real
//! `baton` process on the embedded store (in a temporary directory) leads a
//! plugin scheduled `every = "200ms"`, the Rust `sched-probe` guest in its
//! `quick` mode (it prints its run and returns), with a warm compiled-code
//! cache, for `BATON_BENCH_SECS` seconds (default 30: about 150 runs).
//!
//! Two figures per run, from the host's JSON log:
//!
//! - host: `late_ms` of `scheduled run started`, from the due time to the
//!   run recorded as started in the lease's bucket (a read and a fenced
//!   write of the progress) and about to be instantiated;
//! - guest: from the due time to the guest's first line (`sched run
//!   due=...`) as the host logged it: a fresh instance made and running.
//!
//! The first run is left out (it follows the start-up). Prints p50, p99 and
//! max of each, in milliseconds; and for the last 20 runs (those the
//! progress keeps), the median of `started - due` as stored (whole
//! milliseconds: the timer's wake-up and the progress read, before the
//! write). Run: `scripts/bench.sh --bench
//! schedule_lateness`.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::time::{Duration, UNIX_EPOCH};

use support::*;

fn config_text(store: &std::path::Path) -> String {
    format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\n\
         retry-period = \"200ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"bench\"\n\
         [[plugin]]\nname = \"sched\"\npath = {:?}\nlease = \"bench\"\nevery = \"200ms\"\n\
         env = {{ SCHED_MODE = \"quick\" }}\n",
        store.display().to_string(),
        guest("sched_probe.wasm").display().to_string()
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn line(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "{name:<34} n {:>4}  p50 {:>6.2}  p99 {:>6.2}  max {:>7.2}",
        ms.len(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms[ms.len() - 1]
    );
}

/// The `due=` of a guest line, as a time.
fn due_of(e: &Event) -> Option<std::time::SystemTime> {
    let ms: u64 = e
        .message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("due="))?
        .parse()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_millis(ms))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs: u64 = std::env::var("BATON_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_text(&s.store()));
    let mut h = Host::start("h", &cfg);
    h.wait_for(Duration::from_secs(120), "the first run", |e| {
        e.is("scheduled run started", Some("sched"))
    });
    std::thread::sleep(Duration::from_secs(secs));
    h.sigterm();
    assert!(h.wait_exit(Duration::from_secs(10)).success(), "the host failed");
    let host: Vec<f64> = h
        .all(|e| e.is("scheduled run started", Some("sched")))
        .iter()
        .skip(1)
        .filter_map(|e| e.f64("late_ms"))
        .collect();
    let guest: Vec<f64> = h
        .all(|e| e.guest_line("sched", "sched run due="))
        .iter()
        .skip(1)
        .filter_map(|e| due_of(e).map(|due| ms_between(due, e.at)))
        .collect();
    let out = baton()
        .args(["kv", "get", "--config"])
        .arg(&cfg)
        .args(["--bucket", "baton-schedules", "sched"])
        .output()
        .unwrap();
    let progress: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the progress");
    let mut stored: Vec<f64> = progress["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["started"].as_u64().unwrap() - r["due"].as_u64().unwrap()) as f64)
        .collect();
    stored.sort_by(f64::total_cmp);
    let skipped = h.all(|e| e.is("scheduled runs skipped", Some("sched"))).len();
    println!(
        "schedule lateness: every 200ms for {secs} s, Rust sched-probe (quick), embedded store, warm cache (ms after the due time)"
    );
    line("host: run recorded as started", host);
    line("guest: its first line", guest);
    println!(
        "stored started - due, last {} runs: median {} ms, max {} ms (whole ms); skips logged: {skipped}",
        stored.len(),
        percentile(&stored, 0.5),
        stored[stored.len() - 1]
    );
}
