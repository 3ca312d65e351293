//! Purpose-built bad guests, each beside a well-behaved neighbour on the
//! same host and lease: the host keeps its lease and a bounded memory, the
//! neighbour keeps its schedule, and the bad one is retried with back-off or
//! stopped by force, with a one-line reason.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support::*;
use crate::{SECS, STARTED, STOPPED};

/// The neighbour's nominal tick.
const TICK_MS: u64 = 100;
/// How long each bad guest runs beside the neighbour.
const RUN: Duration = Duration::from_secs(4);
/// The bad guest's memory limit.
const MEMORY_LIMIT_MIB: u64 = 32;

/// One bad behaviour: the probe's world and mode, extra environment, and
/// what the host must say about it.
struct Bad {
    name: &'static str,
    world: &'static str,
    mode: &'static str,
    tick_ms: Option<u64>,
    expect: Expect,
}

enum Expect {
    /// Trapped (or failed), retried with a growing back-off; the first
    /// reason starts with this.
    Retried {
        message: &'static str,
        reason: &'static str,
    },
    /// Its output over the limits dropped and reported.
    Limited,
    /// It ignores the change: stopped by force within the grace at the end.
    Forced,
}

const BAD: &[Bad] = &[
    Bad {
        name: "overflows-its-stack",
        world: "pollable",
        mode: "recurse",
        tick_ms: None,
        expect: Expect::Retried {
            message: "leader task trapped",
            reason: "stack overflow",
        },
    },
    Bad {
        name: "allocates-without-bound",
        world: "pollable",
        mode: "oom",
        tick_ms: None,
        expect: Expect::Retried {
            message: "leader task trapped",
            reason: "memory limit of 32.0 MiB reached",
        },
    },
    Bad {
        name: "prints-long-lines",
        world: "pollable",
        mode: "flood",
        tick_ms: None,
        expect: Expect::Limited,
    },
    Bad {
        name: "prints-many-short-lines",
        world: "future",
        mode: "cooperative",
        tick_ms: Some(0),
        expect: Expect::Limited,
    },
    Bad {
        name: "traps-at-start",
        world: "future",
        mode: "trap",
        tick_ms: None,
        expect: Expect::Retried {
            message: "leader task trapped",
            reason: "the guest panicked: probe trap on purpose",
        },
    },
    Bad {
        name: "returns-errors",
        world: "pollable",
        mode: "fail",
        tick_ms: None,
        expect: Expect::Retried {
            message: "leader task failed",
            reason: "probe failure on purpose",
        },
    },
    Bad {
        name: "ignores-the-change",
        world: "pollable",
        mode: "busy",
        tick_ms: None,
        expect: Expect::Forced,
    },
];

/// A configuration: the neighbour, and the bad guest if any (with its own
/// memory limit).
fn config_with(store: &Path, bad: Option<&Bad>) -> String {
    let mut text = config(store, &[probe("neighbour", "future", "cooperative")]).replace(
        "env = { PROBE_MODE = \"cooperative\" }",
        &format!("env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"{TICK_MS}\" }}"),
    );
    if let Some(b) = bad {
        let tick = b
            .tick_ms
            .map(|t| format!(", PROBE_TICK_MS = \"{t}\""))
            .unwrap_or_default();
        text.push_str(&format!(
            "\n[[plugin]]\nname = {:?}\npath = {:?}\nlease = \"demo\"\nenv = {{ PROBE_MODE = {:?}{tick} }}\n\
             memory-limit = \"{MEMORY_LIMIT_MIB} MiB\"\n",
            b.name,
            guest(&format!("probe_{}.wasm", b.world)).display().to_string(),
            b.mode,
        ));
    }
    text
}

/// The host's resident memory in MiB.
fn rss_mib(pid: i32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// What one run measured.
struct Run {
    host: Host,
    p99_ms: f64,
    ticks: usize,
    rss_first_mib: f64,
    rss_max_mib: f64,
    rss_last_mib: f64,
}

/// Runs the neighbour (and the bad guest) for [`RUN`], sampling the host's
/// memory, then measures the neighbour's tick intervals.
fn run(bad: Option<&Bad>) -> Run {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_with(&s.store(), bad));
    let host = Host::start("host", &cfg);
    let from = host
        .wait_for(SECS(60), "neighbour start", |e| {
            e.guest_line("neighbour", "probe start")
        })
        .at;
    let (mut first, mut max, mut last) = (0.0, 0.0f64, 0.0);
    let started = std::time::Instant::now();
    while started.elapsed() < RUN {
        std::thread::sleep(Duration::from_millis(100));
        last = rss_mib(host.pid());
        if first == 0.0 {
            first = last;
        }
        max = max.max(last);
    }
    let to = SystemTime::now();
    let ticks: Vec<SystemTime> = host
        .all(|e| e.at >= from && e.at <= to && e.guest_line("neighbour", "probe tick"))
        .iter()
        .map(|e| e.at)
        .collect();
    let mut gaps: Vec<f64> = ticks.windows(2).map(|w| ms_between(w[0], w[1])).collect();
    gaps.sort_by(f64::total_cmp);
    assert!(
        gaps.len() >= 20,
        "the neighbour ticked {} times in {RUN:?}",
        ticks.len()
    );
    let p99_ms = gaps[(gaps.len() * 99).div_ceil(100) - 1];
    Run {
        p99_ms,
        ticks: ticks.len(),
        rss_first_mib: first,
        rss_max_mib: max,
        rss_last_mib: last,
        host,
    }
}

#[test]
fn bad_guests_cost_neither_the_lease_nor_the_neighbours_schedule_nor_unbounded_memory() {
    let alone = run(None);
    println!(
        "misbehaving guests: the neighbour alone: p99 tick interval {:.1} ms ({} ticks), host memory {:.0} MiB",
        alone.p99_ms, alone.ticks, alone.rss_max_mib
    );
    drop(alone.host);
    for bad in BAD {
        let mut r = run(Some(bad));
        let h = &r.host;
        let name = bad.name;
        println!(
            "misbehaving guests: beside {name}: neighbour p99 {:.1} ms ({} ticks; alone {:.1}), host memory {:.0} MiB \
             at first, {:.0} at most, {:.0} at the end",
            r.p99_ms, r.ticks, alone.p99_ms, r.rss_first_mib, r.rss_max_mib, r.rss_last_mib
        );
        // The lease was kept: one term, never a step-down.
        assert!(
            h.all(|e| e.message() == "stepping down").is_empty(),
            "{name}: the host stepped down"
        );
        assert_eq!(
            h.all(|e| e.is(STARTED, Some("neighbour"))).len(),
            1,
            "{name}: the neighbour was restarted"
        );
        // The neighbour kept its schedule.
        assert!(
            r.p99_ms <= alone.p99_ms.max(TICK_MS as f64) + 50.0,
            "{name}: the neighbour's p99 tick interval was {:.1} ms (alone {:.1} ms)",
            r.p99_ms,
            alone.p99_ms
        );
        // Memory stayed bounded: what the bad guest may hold (its limit,
        // twice over while an instance is replaced) above the start.
        let bound = alone.rss_max_mib + 2.0 * MEMORY_LIMIT_MIB as f64 + 32.0;
        assert!(
            r.rss_max_mib <= bound,
            "{name}: the host grew to {:.0} MiB (bound {bound:.0})",
            r.rss_max_mib
        );
        match bad.expect {
            Expect::Retried { message, reason } => {
                let events = h.all(|e| e.is(message, Some(name)));
                assert!(
                    events.len() >= 2,
                    "{name}: {} {message:?} events: {}",
                    events.len(),
                    h.output()
                );
                let error = events[0].str("error").unwrap_or_default();
                assert!(error.starts_with(reason), "{name}: {error:?}");
                assert!(!error.contains('\n'), "{name}: more than one line: {error:?}");
                let backoff: Vec<u64> = events.iter().filter_map(|e| e.u64("retry_in_ms")).collect();
                assert!(
                    backoff.windows(2).all(|w| w[1] > w[0]) || backoff.last() == Some(&30_000),
                    "{name}: the back-off does not grow: {backoff:?}"
                );
                println!("misbehaving guests: {name}: \"{error}\", retried after {backoff:?} ms");
            }
            Expect::Limited => {
                let reports = h.all(|e| e.message() == "guest output over the plugin's limits was dropped");
                assert!(
                    reports.iter().any(|e| e.str("plugin") == Some(name)),
                    "{name}: its dropped output was not reported"
                );
            }
            Expect::Forced => {}
        }
        // Shut down: every guest stops within the grace, the bad one by
        // force if it ignores the change.
        let termed = r.host.sigterm();
        let status = r.host.wait_exit(SECS(10));
        assert!(status.success(), "{name}: {status}");
        r.host.try_wait_for(SECS(2), &|e| e.message() == "baton stopped");
        if let Some(stop) = r
            .host
            .all(|e| e.is(STOPPED, Some(name)))
            .into_iter()
            .find(|e| e.at >= termed)
        {
            let after = ms_between(termed, stop.at);
            assert!(
                after <= (GRACE.as_secs_f64() * 1e3) + 100.0,
                "{name}: stopped {after:.0} ms after SIGTERM (grace {GRACE:?})"
            );
            if matches!(bad.expect, Expect::Forced) {
                assert_eq!(stop.str("how"), Some("forced"), "{name}");
                println!("misbehaving guests: {name}: stopped by force {after:.0} ms after SIGTERM");
            }
        } else {
            assert!(
                !matches!(bad.expect, Expect::Forced),
                "{name}: no stop after SIGTERM:\n{}",
                r.host.output()
            );
        }
    }
}
