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
//! - `idle cpu`: the process's CPU time over 10 s (`BATON_BENCH_IDLE_SECS`)
//!   in steady state, in % of one core: from 40 s after every task runs
//!   (`BATON_BENCH_SETTLE_SECS`), once the embedded store writes over the
//!   oldest of the versions it keeps of each lease (16, written one per
//!   retry period of 2 s); before that, its writes are not yet what they
//!   are for the rest of the host's life.
//!
//! - `idle cpu by thread`: the same, by thread name (medians).
//!
//! The headline is what users run: `BATON_BENCH_LEASES` (default 1,000)
//! leases each with `BATON_BENCH_PLUGINS` (default 1) idle plugins, each
//! run paired with the same leases without plugins, and what the plugins
//! add (memory per plugin, CPU). `BATON_BENCH_RUNS` (default 3; one more
//! run first warms the compiled-code cache), `BATON_BENCH_SPREAD=0` to turn spreading off (its
//! membership record and listing are then not measured),
//! `BATON_BENCH_FOLLOW=1` to measure a host whose leases another host leads
//! (spreading off): it loads every plugin and runs none, and the bench
//! prints the resident memory per loaded plugin, against the same host with
//! no plugins. Run: `scripts/bench.sh --bench many_plugins`.
//!
//! `BATON_BENCH_SWEEP=1` measures instead one host at several plugin
//! counts: `BATON_BENCH_LEASES` leases (default 100) × each of
//! `BATON_BENCH_SWEEP_PLUGINS` plugins per lease (default `0,1,2,5,10,20`:
//! 0 to 2,000 tasks), `BATON_BENCH_RUNS` runs each. The leases stay the
//! same, so what grows from one point to the next is the plugins' cost
//! alone; 0 is the host and its idle leases. It prints a Markdown table of
//! the medians, writes every run to `many-plugins.json` and plots start
//! time and resident memory against the number of plugins
//! (`many-plugins-start.svg`, `many-plugins-memory.svg`: median, min to
//! max) into `BATON_BENCH_PLOTS` (default `docs/perf/`), with
//! `benches/plot.rs`. About 16 minutes on a 2-core machine, each run
//! waiting for steady state (`BATON_BENCH_SETTLE_SECS=0`: 3.5 minutes,
//! for start and memory alone). Run:
//! `BATON_BENCH_SWEEP=1 scripts/bench.sh --bench many_plugins`.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

// benches/plot.rs, shared by the benches (each uses part of it).
#[path = "plot.rs"]
#[allow(dead_code)]
mod plot;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

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

struct Run {
    start_ms: f64,
    load_ms: f64,
    rss_mb: f64,
    vsz_gb: f64,
    threads: f64,
    idle_cpu: f64,
    /// Idle CPU by thread name, in % of one core.
    by_thread: std::collections::BTreeMap<String, f64>,
}

fn is_role(e: &Event, role: &str) -> bool {
    e.message() == "lease status changed"
        && e.str("role") == Some(role)
        && !e.str("lease").unwrap_or("").starts_with("baton-member.")
}

/// One run; `settle`: wait for steady state before measuring idle CPU.
fn run(leases: usize, plugins: usize, settle: bool) -> Run {
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
    let idle = var("BATON_BENCH_IDLE_SECS", 10) as f64;
    if settle {
        std::thread::sleep(Duration::from_secs(var("BATON_BENCH_SETTLE_SECS", 40) as u64));
    }
    let (before, threads_before) = (cpu_secs(pid), thread_cpu_secs(pid));
    std::thread::sleep(Duration::from_secs_f64(idle));
    let idle_cpu = (cpu_secs(pid) - before) / idle * 100.0;
    let by_thread = thread_cpu_secs(pid)
        .into_iter()
        .map(|(name, after)| {
            let spent = after - threads_before.get(&name).copied().unwrap_or(0.0);
            (name, spent / idle * 100.0)
        })
        .collect();
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
        by_thread,
    }
}

/// The median idle CPU of each thread name over `results`, busiest first.
fn by_thread(results: &[Run]) -> Vec<(String, f64)> {
    let names: std::collections::BTreeSet<&String> =
        results.iter().flat_map(|r| r.by_thread.keys()).collect();
    let mut medians: Vec<(String, f64)> = names
        .into_iter()
        .map(|n| {
            let v = results
                .iter()
                .map(|r| r.by_thread.get(n).copied().unwrap_or(0.0))
                .collect();
            (n.clone(), median(v))
        })
        .collect();
    medians.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    medians
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
    if var("BATON_BENCH_SWEEP", 0) == 1 {
        return sweep();
    }
    let leases = var("BATON_BENCH_LEASES", 1000);
    let plugins = var("BATON_BENCH_PLUGINS", 1);
    let runs = var("BATON_BENCH_RUNS", 3);
    println!(
        "one host, {leases} leases x {plugins} plugins of one component ({} tasks), warm cache",
        leases * plugins
    );
    let follow = var("BATON_BENCH_FOLLOW", 0) == 1;
    let _warm = run(leases.min(2), plugins.min(2), false);
    if plugins == 0 {
        println!("(no plugins: {leases} idle leases)");
    }
    if follow {
        println!("(following: another host leads every lease; start is until every lease is followed)");
    }
    // The same leases without plugins beside, run for run (the machine's
    // state drifts; pairs compare under the same), unless following.
    let paired = plugins > 0 && !follow;
    let mut results = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..runs {
        results.push(run(leases, plugins, true));
        if paired {
            bare.push(run(leases, 0, true));
        }
    }
    if follow && plugins > 0 {
        let base: Vec<f64> = (0..runs).map(|_| run(leases, 0, false).rss_mb).collect();
        let base = median(base);
        let per: Vec<f64> = results
            .iter()
            .map(|r| (r.rss_mb - base) * 1024.0 / (leases * plugins) as f64)
            .collect();
        println!("(resident with no plugins, following: {base:.1} MB, median of {runs})");
        summary("per plugin", "KB", per);
    }
    report(&results);
    if paired {
        println!("\nthe same {leases} leases with no plugins, run for run:");
        report(&bare);
        let per: Vec<f64> = results
            .iter()
            .zip(&bare)
            .map(|(r, b)| (r.rss_mb - b.rss_mb) * 1024.0 / (leases * plugins) as f64)
            .collect();
        summary("per plugin", "KB", per);
        let extra: Vec<f64> = results
            .iter()
            .zip(&bare)
            .map(|(r, b)| r.idle_cpu - b.idle_cpu)
            .collect();
        summary("plugins' cpu", "%", extra);
    }
}

/// Prints the summaries of `results`, and the idle CPU by thread.
fn report(results: &[Run]) {
    summary("start", "ms", results.iter().map(|r| r.start_ms).collect());
    summary("load", "ms", results.iter().map(|r| r.load_ms).collect());
    summary("rss", "MB", results.iter().map(|r| r.rss_mb).collect());
    summary("vsz", "GB", results.iter().map(|r| r.vsz_gb).collect());
    summary("threads", "", results.iter().map(|r| r.threads).collect());
    summary("idle cpu", "%", results.iter().map(|r| r.idle_cpu).collect());
    let threads: Vec<String> = by_thread(results)
        .into_iter()
        .filter(|(_, pct)| *pct >= 0.05)
        .map(|(name, pct)| format!("{name} {pct:.2} %"))
        .collect();
    println!("idle cpu by thread (medians): {}", threads.join(", "));
}

/// `min / median / max` of `v`, each with `f`.
fn mmm(v: &[f64], f: impl Fn(f64) -> String) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{} ({} - {})", f(plot::median(v)), f(lo), f(hi))
}

/// One host at several plugin counts (`BATON_BENCH_SWEEP=1`).
fn sweep() {
    assert!(
        var("BATON_BENCH_FOLLOW", 0) == 0,
        "BATON_BENCH_SWEEP measures a leading host: unset BATON_BENCH_FOLLOW"
    );
    let started = Instant::now();
    let leases = var("BATON_BENCH_LEASES", 100);
    let runs = var("BATON_BENCH_RUNS", 3);
    let per_lease: Vec<usize> = std::env::var("BATON_BENCH_SWEEP_PLUGINS")
        .unwrap_or_else(|_| "0,1,2,5,10,20".to_owned())
        .split(',')
        .map(|p| {
            p.trim()
                .parse()
                .expect("BATON_BENCH_SWEEP_PLUGINS: plugins per lease, comma-separated")
        })
        .collect();
    let plots = std::env::var_os("BATON_BENCH_PLOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf")));
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    println!(
        "one host, {leases} leases x {per_lease:?} plugins per lease of one component, warm cache, {runs} runs each, {date}"
    );
    let _warm = run(2, 2, false);
    let mut points = Vec::new();
    let mut table = vec![
        format!("| plugins ({leases} leases × P) | start | resident | address space | threads | idle CPU |"),
        "|---|---|---|---|---|---|".to_owned(),
    ];
    for &p in &per_lease {
        let results: Vec<Run> = (0..runs).map(|_| run(leases, p, true)).collect();
        let col = |f: fn(&Run) -> f64| results.iter().map(f).collect::<Vec<f64>>();
        let row = format!(
            "| {} ({leases} × {p}) | {} | {} | {} | {} | {} |",
            leases * p,
            mmm(&col(|r| r.start_ms), |v| format!("{:.2} s", v / 1000.0)),
            mmm(&col(|r| r.rss_mb), |v| format!("{v:.0} MB")),
            mmm(&col(|r| r.vsz_gb), |v| format!("{v:.0} GB")),
            mmm(&col(|r| r.threads), |v| format!("{v:.0}")),
            mmm(&col(|r| r.idle_cpu), |v| format!("{v:.1} %")),
        );
        println!("{row}");
        table.push(row);
        points.push((p, results));
    }
    let took = started.elapsed();
    println!(
        "\nMarkdown ({runs} runs per row, median (min - max), {date}, took {:.1} min):\n\n{}",
        took.as_secs_f64() / 60.0,
        table.join("\n")
    );

    std::fs::create_dir_all(&plots).unwrap();
    let raw = json!({
        "date": date,
        "took_s": took.as_secs(),
        "leases": leases,
        "runs": runs,
        "points": points.iter().map(|(p, results)| json!({
            "plugins_per_lease": p,
            "plugins": leases * p,
            "runs": results.iter().map(|r| json!({
                "start_ms": r.start_ms, "load_ms": r.load_ms, "rss_mb": r.rss_mb,
                "vsz_gb": r.vsz_gb, "threads": r.threads, "idle_cpu_percent": r.idle_cpu,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        plots.join("many-plugins.json"),
        serde_json::to_string_pretty(&raw).unwrap() + "\n",
    )
    .unwrap();
    let series = |name: &str, i: usize, f: fn(&Run) -> f64| plot::Series {
        name: name.to_owned(),
        color: plot::palette(i),
        points: points
            .iter()
            .map(|(p, results)| ((leases * p) as f64, results.iter().map(f).collect()))
            .collect(),
    };
    plot::sweep(
        &plots.join("many-plugins-start.svg"),
        &format!("One host, {leases} leases: start time against plugins ({runs} runs; median, min to max)"),
        &format!("plugins (leading tasks; {leases} leases × plugins per lease)"),
        "seconds",
        &[
            series("spawn to the last task's first line", 0, |r| r.start_ms / 1000.0),
            series("the slowest plugin's load (compile or cache)", 2, |r| {
                r.load_ms / 1000.0
            }),
        ],
        false,
        false,
    )
    .unwrap();
    plot::sweep(
        &plots.join("many-plugins-memory.svg"),
        &format!(
            "One host, {leases} leases: resident memory against plugins ({runs} runs; median, min to max)"
        ),
        &format!("plugins (leading tasks; {leases} leases × plugins per lease)"),
        "MB resident (VmRSS)",
        &[series("resident memory, every task running", 0, |r| r.rss_mb)],
        false,
        false,
    )
    .unwrap();
    println!(
        "\nwrote {}/many-plugins{{.json,-start.svg,-memory.svg}}",
        plots.display()
    );
}
