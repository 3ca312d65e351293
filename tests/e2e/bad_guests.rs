//! Purpose-built bad guests, each beside a well-behaved neighbour on the
//! same host and lease, as `tests/e2e/misbehaving.rs` runs them and
//! `benches/neighbours.rs` measures them: one host runs the neighbour (a
//! probe ticking every [`TICK_MS`]) and the bad guest for [`RUN`], its
//! memory sampled, and the neighbour's ticks are read from its log.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support::*;

/// The neighbour's nominal tick.
pub const TICK_MS: u64 = 100;
/// How long each bad guest runs beside the neighbour.
pub const RUN: Duration = Duration::from_secs(4);
/// The bad guest's memory limit.
pub const MEMORY_LIMIT_MIB: u64 = 32;

/// One bad behaviour: the probe's world and mode, extra environment, and
/// what the host must say about it.
pub struct Bad {
    pub name: &'static str,
    pub world: &'static str,
    pub mode: &'static str,
    pub tick_ms: Option<u64>,
    /// Its `output-rate`, if not the default.
    pub output_rate: Option<&'static str>,
    pub expect: Expect,
}

pub enum Expect {
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

pub const BAD: &[Bad] = &[
    Bad {
        name: "overflows-its-stack",
        world: "pollable",
        mode: "recurse",
        tick_ms: None,
        output_rate: None,
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
        output_rate: None,
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
        output_rate: None,
        expect: Expect::Limited,
    },
    Bad {
        name: "prints-many-short-lines",
        world: "future",
        mode: "cooperative",
        tick_ms: Some(0),
        // Far below what it prints on the slowest machine (a line each
        // tick, thousands a second), so that drops do not depend on how
        // fast the host runs it; the default rate is the bench's concern.
        output_rate: Some("1 KiB"),
        expect: Expect::Limited,
    },
    Bad {
        name: "traps-at-start",
        world: "future",
        mode: "trap",
        tick_ms: None,
        output_rate: None,
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
        output_rate: None,
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
        output_rate: None,
        expect: Expect::Forced,
    },
];

/// A configuration: the neighbour, and the bad guest if any (with its own
/// memory limit).
pub fn config_with(store: &Path, bad: Option<&Bad>) -> String {
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
             memory-limit = \"{MEMORY_LIMIT_MIB} MiB\"\n{}",
            b.name,
            guest(&format!("probe_{}.wasm", b.world)).display().to_string(),
            b.mode,
            b.output_rate
                .map(|r| format!("output-rate = {r:?}\n"))
                .unwrap_or_default(),
        ));
    }
    text
}

/// The host's resident memory in MiB.
pub fn rss_mib(pid: i32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// What one run measured.
pub struct Run {
    pub host: Host,
    /// The neighbour's tick intervals (from its start to its first tick,
    /// between ticks, and from its last tick to the end), sorted, in ms.
    pub gaps_ms: Vec<f64>,
    pub ticks: usize,
    pub rss_first_mib: f64,
    pub rss_max_mib: f64,
    pub rss_last_mib: f64,
}

impl Run {
    /// The `p`th percentile of the neighbour's tick intervals, in ms.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        let i = ((self.gaps_ms.len() as f64 * p).ceil() as usize).clamp(1, self.gaps_ms.len()) - 1;
        self.gaps_ms[i]
    }

    /// The neighbour's longest wait for a tick, in ms.
    pub fn longest_ms(&self) -> f64 {
        self.gaps_ms.last().copied().unwrap_or(f64::INFINITY)
    }
}

/// Runs the neighbour (and the bad guest) for [`RUN`], sampling the host's
/// memory, then measures the neighbour's tick intervals.
pub fn run(bad: Option<&Bad>) -> Run {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_with(&s.store(), bad));
    let host = Host::start("host", &cfg);
    let from = host
        .wait_for(Duration::from_secs(60), "neighbour start", |e| {
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
    let ends: Vec<SystemTime> = std::iter::once(from)
        .chain(ticks.iter().copied())
        .chain([to])
        .collect();
    let mut gaps_ms: Vec<f64> = ends.windows(2).map(|w| ms_between(w[0], w[1])).collect();
    gaps_ms.sort_by(f64::total_cmp);
    Run {
        gaps_ms,
        ticks: ticks.len(),
        rss_first_mib: first,
        rss_max_mib: max,
        rss_last_mib: last,
        host,
    }
}
