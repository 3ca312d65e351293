//! One host, many plugins: `L` leases × `P` plugins of one Rust component
//! (the pollable probe, idle: it waits on its change signal and an
//! hour-long timer) on the embedded store, with a warm compiled-code cache.
//!
//! Prints, per run and as min / median / max:
//! - `start`: from spawning `baton run` until the last task's first line
//!   (with no plugins: until it leads every lease);
//! - `load`: the longest `load_ms` of the plugins (compiling or taking from
//!   the cache, done before contending);
//! - `rss` and `vsz`: resident memory and address space once every task
//!   runs (`VmRSS`, `VmSize` of `/proc/PID/status`);
//! - `threads`;
//! - `idle cpu`: the process's CPU time over 10 s once every task runs, in
//!   % of one core.
//!
//! `BATON_BENCH_LEASES` (default 100), `BATON_BENCH_PLUGINS` (per lease,
//! default 10), `BATON_BENCH_RUNS` (default 3; one more run first warms the
//! compiled-code cache), `BATON_BENCH_SPREAD=0` to turn spreading off (its
//! membership record and listing are then not measured),
//! `BATON_BENCH_FOLLOW=1` to measure a host whose leases another host leads
//! (spreading off): it loads every plugin and runs none, and the bench
//! prints the resident memory per loaded plugin, against the same host with
//! no plugins. Run: `scripts/bench.sh --bench many_plugins`.

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use support::*;

fn var(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config_text(store: &std::path::Path, leases: usize, plugins: usize) -> String {
    let probe = guest("probe_pollable.wasm").display().to_string();
    let mut text = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n",
        store.display().to_string()
    );
    if var("BATON_BENCH_SPREAD", 1) == 0 || var("BATON_BENCH_FOLLOW", 0) == 1 {
        text.push_str("\n[spread]\nenabled = false\n");
    }
    for l in 0..leases {
        let _ = write!(text, "\n[[lease]]\nname = \"lease-{l}\"\n");
        for p in 0..plugins {
            let _ = write!(
                text,
                "\n[[plugin]]\nname = \"p-{l}-{p}\"\npath = {probe:?}\nlease = \"lease-{l}\"\n\
                 env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"3600000\" }}\n"
            );
        }
    }
    text
}

/// A field of `/proc/PID/status`, in its own unit (kB for sizes).
fn status_field(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The process's user + system CPU time, in seconds.
fn cpu_secs(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

struct Run {
    start_ms: f64,
    load_ms: f64,
    rss_mb: f64,
    vsz_gb: f64,
    threads: f64,
    idle_cpu: f64,
}

fn is_role(e: &Event, role: &str) -> bool {
    e.message() == "lease status changed"
        && e.str("role") == Some(role)
        && !e.str("lease").unwrap_or("").starts_with("baton-member.")
}

fn run(leases: usize, plugins: usize) -> Run {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_text(&s.store(), leases, plugins));
    let total = leases * plugins;
    let follow = var("BATON_BENCH_FOLLOW", 0) == 1;
    // Following: another host, with the same leases and no plugins, leads
    // them all first.
    let holder = follow.then(|| {
        let cfg = s.write("holder.toml", &config_text(&s.store(), leases, 0));
        let h = Host::start("holder", &cfg);
        let until = std::time::Instant::now() + Duration::from_secs(120);
        while h.all(|e| is_role(e, "leading")).len() < leases {
            assert!(
                std::time::Instant::now() < until,
                "the holder did not lead every lease"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        h
    });
    let spawned = SystemTime::now();
    let mut h = Host::start("many", &cfg);
    let until = std::time::Instant::now() + Duration::from_secs(600);
    // Every task's first line; with no plugins, every lease led; when
    // following, every lease followed.
    let (what, wanted): (fn(&Event) -> bool, usize) = if follow {
        (|e| is_role(e, "following"), leases)
    } else if total > 0 {
        (|e| e.message().starts_with("probe start"), total)
    } else {
        (|e| is_role(e, "leading"), leases)
    };
    let last = loop {
        let started = h.all(what);
        if started.len() >= wanted {
            break started.iter().map(|e| e.at).max().unwrap();
        }
        assert!(
            std::time::Instant::now() < until,
            "{} of {wanted} started",
            started.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let load_ms = h
        .all(|e| e.message() == "plugin loaded")
        .iter()
        .filter_map(|e| e.f64("load_ms"))
        .fold(0.0, f64::max);
    let pid = h.pid();
    let rss_mb = status_field(pid, "VmRSS") as f64 / 1024.0;
    let vsz_gb = status_field(pid, "VmSize") as f64 / 1024.0 / 1024.0;
    let threads = status_field(pid, "Threads") as f64;
    let before = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(10));
    let idle_cpu = (cpu_secs(pid) - before) / 10.0 * 100.0;
    h.sigterm();
    h.wait_exit(Duration::from_secs(60));
    if let Some(mut holder) = holder {
        holder.sigterm();
        holder.wait_exit(Duration::from_secs(60));
    }
    Run {
        start_ms: ms_between(spawned, last),
        load_ms,
        rss_mb,
        vsz_gb,
        threads,
        idle_cpu,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

fn summary(name: &str, unit: &str, mut v: Vec<f64>) {
    let median = median(v.clone());
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{name:<9} runs {:>2}  min {:>9.1} {unit:<3} median {:>9.1} {unit:<3} max {:>9.1} {unit}",
        v.len(),
        v[0],
        median,
        v[v.len() - 1]
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let leases = var("BATON_BENCH_LEASES", 100);
    let plugins = var("BATON_BENCH_PLUGINS", 10);
    let runs = var("BATON_BENCH_RUNS", 3);
    println!(
        "one host, {leases} leases x {plugins} plugins of one component ({} tasks), warm cache",
        leases * plugins
    );
    let follow = var("BATON_BENCH_FOLLOW", 0) == 1;
    let _warm = run(leases.min(2), plugins.min(2));
    if plugins == 0 {
        println!("(no plugins: {leases} idle leases)");
    }
    if follow {
        println!("(following: another host leads every lease; start is until every lease is followed)");
    }
    let results: Vec<Run> = (0..runs).map(|_| run(leases, plugins)).collect();
    if follow && plugins > 0 {
        let base: Vec<f64> = (0..runs).map(|_| run(leases, 0).rss_mb).collect();
        let base = median(base);
        let per: Vec<f64> = results
            .iter()
            .map(|r| (r.rss_mb - base) * 1024.0 / (leases * plugins) as f64)
            .collect();
        println!("(resident with no plugins, following: {base:.1} MB, median of {runs})");
        summary("per plugin", "KB", per);
    }
    summary("start", "ms", results.iter().map(|r| r.start_ms).collect());
    summary("load", "ms", results.iter().map(|r| r.load_ms).collect());
    summary("rss", "MB", results.iter().map(|r| r.rss_mb).collect());
    summary("vsz", "GB", results.iter().map(|r| r.vsz_gb).collect());
    summary("threads", "", results.iter().map(|r| r.threads).collect());
    summary("idle cpu", "%", results.iter().map(|r| r.idle_cpu).collect());
}
