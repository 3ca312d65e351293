//! A well-behaved guest beside a bad one: how evenly the neighbour (a probe
//! ticking every 100 ms) keeps ticking on the same host and lease while
//! each of `tests/e2e/bad_guests.rs`'s bad guests (a stack overflow,
//! unbounded allocation, long and many output lines, a trap at start,
//! errors, a busy loop that ignores the change) runs beside it for 4 s, and
//! the host's resident memory. The end-to-end test `misbehaving` asserts
//! only what a busy machine cannot break (the lease kept, the neighbour
//! never starved, memory bounded); the latencies are figures, here.
//!
//! Each run measures the neighbour alone, then beside each bad guest, one
//! real `baton` process at a time. Prints, per case, the median over runs
//! of the neighbour's p50, p99 and longest tick interval and of the host's
//! peak memory, and the p99 against the neighbour alone.
//!
//! Run: `scripts/bench.sh --bench neighbours` (about 40 s a run);
//! `BATON_BENCH_RUNS` sets the runs (default 3).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/e2e/bad_guests.rs"]
#[allow(dead_code)]
mod bad_guests;

use std::collections::BTreeMap;

use bad_guests::{BAD, run};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runs: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    // Per case: p50, p99, longest, peak memory, one entry per run.
    let mut figures: BTreeMap<&str, Vec<[f64; 4]>> = BTreeMap::new();
    let cases: Vec<Option<&bad_guests::Bad>> = std::iter::once(None).chain(BAD.iter().map(Some)).collect();
    for i in 0..runs {
        for bad in &cases {
            let name = bad.map_or("(alone)", |b| b.name);
            let mut r = run(*bad);
            let row = [
                r.percentile_ms(0.5),
                r.percentile_ms(0.99),
                r.longest_ms(),
                r.rss_max_mib,
            ];
            eprintln!(
                "neighbours: run {}/{runs}, {name}: p50 {:.1} ms, p99 {:.1} ms, longest {:.1} ms, {} ticks, {:.0} MiB",
                i + 1,
                row[0],
                row[1],
                row[2],
                r.ticks,
                row[3]
            );
            r.host.sigterm();
            r.host.wait_exit(std::time::Duration::from_secs(10));
            figures.entry(name).or_default().push(row);
        }
    }
    let med = |name: &str, k: usize| median(figures[name].iter().map(|r| r[k]).collect());
    let alone = med("(alone)", 1);
    println!("\nthe neighbour's tick interval (nominal 100 ms), medians over {runs} runs:\n");
    println!("| beside | p50 ms | p99 ms | longest ms | p99 / alone | host memory MiB |");
    println!("|---|---|---|---|---|---|");
    for bad in &cases {
        let name = bad.map_or("(alone)", |b| b.name);
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} |",
            med(name, 0),
            med(name, 1),
            med(name, 2),
            med(name, 1) / alone,
            med(name, 3)
        );
    }
}
