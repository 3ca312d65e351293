//! Term start per guest language: from the moment a host wins a lease
//! (its `lease status changed … role=leading` event) to its guest's first
//! line, on the embedded store with a warm compiled-code cache.
//!
//! Each sample is a hand-over between two real `baton` processes: a
//! standby that has loaded its plugin and follows takes over when the
//! leader gets SIGTERM, then a new standby is started for the next sample.
//! So every term starts in a host that had been idle, as in production,
//! and the figure covers the instantiation of a fresh instance, the guest's
//! own start-up and the output path, not the election.
//!
//! Guests: the Rust probes of both worlds (`tests/guests`), and the
//! Python, JavaScript and C example tickers (`scripts/build-polyglot-guests.sh`,
//! in `BATON_POLYGLOT_DIR`; left out with a note if missing).
//!
//! Prints p50, p99 (with fewer than 100 samples: the largest) and max per
//! guest, in milliseconds. `BATON_BENCH_RUNS` sets the samples per guest
//! (default 30). Run: `scripts/bench.sh --bench term_start`.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::*;

fn config_text(store: &std::path::Path, path: &std::path::Path) -> String {
    // The bench's hand-overs are SIGTERMs: the lease duration only bounds
    // a crash, which does not happen here.
    format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\n\
         retry-period = \"500ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"bench\"\n\
         [[plugin]]\nname = \"g\"\npath = {:?}\nlease = \"bench\"\n\
         env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"3600000\" }}\n",
        store.display().to_string(),
        path.display().to_string()
    )
}

fn is_leading(e: &Event) -> bool {
    e.message() == "lease status changed" && e.str("role") == Some("leading")
}

/// `samples` term starts of the guest at `path`, in milliseconds.
fn term_starts(path: &std::path::Path, samples: usize) -> Vec<f64> {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_text(&s.store(), path));
    let mut leader = Host::start("h0", &cfg);
    leader.wait_for(Duration::from_secs(120), "first guest line", |e| {
        e.guest_line("g", "")
    });
    let mut out = Vec::new();
    for i in 1..=samples {
        let standby = Host::start(&format!("h{i}"), &cfg);
        standby.wait_for(Duration::from_secs(120), "standby following", |e| {
            e.message() == "lease status changed" && e.str("role") == Some("following")
        });
        leader.sigterm();
        let led = standby.wait_for(Duration::from_secs(10), "standby leading", is_leading);
        let first = standby.wait_for(Duration::from_secs(10), "standby's guest", |e| {
            e.guest_line("g", "")
        });
        out.push(ms_between(led.at, first.at));
        assert!(
            leader.wait_exit(Duration::from_secs(10)).success(),
            "the old leader failed"
        );
        leader = standby;
    }
    leader.sigterm();
    leader.wait_exit(Duration::from_secs(10));
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let samples: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let polyglot = std::env::var_os("BATON_POLYGLOT_DIR").map(PathBuf::from);
    let mut guests: Vec<(&str, PathBuf)> = vec![
        ("rust pollable", guest("probe_pollable.wasm")),
        ("rust future", guest("probe_future.wasm")),
    ];
    for (name, file) in [
        ("python pollable", "python_pollable_ticker.wasm"),
        ("python future", "python_future_ticker.wasm"),
        ("javascript pollable", "js_pollable_ticker.wasm"),
        ("javascript future", "js_future_ticker.wasm"),
        ("c pollable", "c_pollable_ticker.wasm"),
    ] {
        match polyglot.as_ref().map(|d| d.join(file)).filter(|p| p.is_file()) {
            Some(path) => guests.push((name, path)),
            None => println!("{name}: left out ({file} not found; set BATON_POLYGLOT_DIR)"),
        }
    }
    println!("term start: winning the lease -> the guest's first line, {samples} hand-overs per guest (ms)");
    for (name, path) in guests {
        let mut ms = term_starts(&path, samples);
        ms.sort_by(f64::total_cmp);
        println!(
            "{name:<20} n {:>3}  p50 {:>7.2}  p99 {:>7.2}  max {:>7.2}",
            ms.len(),
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms[ms.len() - 1]
        );
    }
}
