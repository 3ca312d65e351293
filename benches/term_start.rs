//! Term start per guest language: from the moment a host wins a lease
//! (its `lease status changed … role=leading` event) to its guest's first
//! line, on the embedded store with a warm compiled-code cache.
//!
//! Each sample is a hand-over between two real `baton` processes: a
//! standby that has loaded its plugin and follows takes over when the
//! leader gets SIGTERM, then a new standby is started for the next sample.
//! So every term starts in a host that had been idle, as in production
//! (300 ms after it follows: it has prepared its instance), and the figure
//! covers the gates a task passes, the call into the prepared instance,
//! the guest's own start-up and the output path, not the election.
//!
//! Guests: the Rust probes of both worlds (`tests/guests`), and the
//! Python, JavaScript and C example tickers (`scripts/build-polyglot-guests.sh`,
//! in `BATON_POLYGLOT_DIR`; left out with a note if missing).
//!
//! Prints p50 and p99 (with fewer than 100 samples: the largest) per
//! guest, in milliseconds, in all and split at the host's `leader task
//! started`. `BATON_BENCH_RUNS` sets the samples per guest (default 30),
//! `BATON_BENCH_GUESTS` picks guests by words of their names (`python,c`),
//! `BATON_BENCH_HANDOVER=kill` hands over by SIGKILL and expiry instead.
//! Run: `scripts/bench.sh --bench term_start`.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::*;

/// How the leader hands over: `BATON_BENCH_HANDOVER=kill` kills it and
/// the standby wins once the lease expires, on a machine where nothing of
/// the old leader runs any more (the two hosts of a SIGTERM hand-over
/// share this machine's cores while the old one exits).
fn by_kill() -> bool {
    std::env::var("BATON_BENCH_HANDOVER").is_ok_and(|v| v == "kill")
}

fn config_text(store: &std::path::Path, path: &std::path::Path) -> String {
    // A SIGTERM hand-over does not wait for the lease to expire; a kill
    // does, so its lease is short.
    let timings = if by_kill() {
        "lease-duration = \"2s\"\nrenew-deadline = \"1200ms\"\nretry-period = \"200ms\"\ngrace = \"300ms\"\n"
    } else {
        "lease-duration = \"4s\"\nrenew-deadline = \"3s\"\nretry-period = \"500ms\"\ngrace = \"500ms\"\n"
    };
    format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\n{timings}[[lease]]\nname = \"bench\"\n\
         [[plugin]]\nname = \"g\"\npath = {:?}\nlease = \"bench\"\n\
         env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"3600000\" }}\n",
        store.display().to_string(),
        path.display().to_string()
    )
}

fn is_leading(e: &Event) -> bool {
    e.message() == "lease status changed" && e.str("role") == Some("leading")
}

/// One term start, in ms: winning the lease to the guest's first line, and
/// its two parts, to the host's `leader task started` (the gates) and from
/// there to the first line (the instance and the guest).
struct Start {
    total: f64,
    gates: f64,
    guest: f64,
}

/// `samples` term starts of the guest at `path`.
fn term_starts(path: &std::path::Path, samples: usize) -> Vec<Start> {
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
        // A standby prepares its instance once it follows (a millisecond
        // or two): as in production, it has been idle a while first.
        std::thread::sleep(Duration::from_millis(300));
        if by_kill() {
            leader.sigkill();
        } else {
            leader.sigterm();
        }
        let led = standby.wait_for(Duration::from_secs(10), "standby leading", is_leading);
        let first = standby.wait_for(Duration::from_secs(10), "standby's guest", |e| {
            e.guest_line("g", "")
        });
        let started = standby.wait_for(Duration::from_secs(1), "task started", |e| {
            e.message() == "leader task started"
        });
        out.push(Start {
            total: ms_between(led.at, first.at),
            gates: ms_between(led.at, started.at),
            guest: ms_between(started.at, first.at),
        });
        let exit = leader.wait_exit(Duration::from_secs(10));
        assert!(by_kill() || exit.success(), "the old leader failed");
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
    // `BATON_BENCH_GUESTS`: only the guests whose names contain one of
    // these words (comma-separated).
    let only: Vec<String> = std::env::var("BATON_BENCH_GUESTS")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    guests.retain(|(name, _)| only.is_empty() || only.iter().any(|w| name.contains(w.as_str())));
    println!("term start: winning the lease -> the guest's first line, {samples} hand-overs per guest (ms);");
    println!("  gates: to `leader task started`; guest: from there to the first line");
    for (name, path) in guests {
        let starts = term_starts(&path, samples);
        let stat = |f: fn(&Start) -> f64| {
            let mut ms: Vec<f64> = starts.iter().map(f).collect();
            ms.sort_by(f64::total_cmp);
            (percentile(&ms, 0.5), percentile(&ms, 0.99))
        };
        let ((p50, p99), (g50, g99), (u50, u99)) = (stat(|s| s.total), stat(|s| s.gates), stat(|s| s.guest));
        println!(
            "{name:<20} n {:>3}  p50 {p50:>6.2}  p99 {p99:>6.2}   gates {g50:>5.2} / {g99:>5.2}   guest {u50:>5.2} / {u99:>5.2}",
            starts.len()
        );
    }
}
