//! The chaos engine, for any lease store: three hosts on one lease,
//! guests of both worlds (one honouring the change signal, one ignoring
//! it, each) appending term-tagged records to one file at a steady rate,
//! and faults injected at random moments: the leader killed, terminated,
//! stopped past its lease or for less than its renew deadline, a follower
//! stopped, and the faults of the store under test (a [`Bed`]). A checker
//! then reads the records and every host's log; another the counter that a
//! guest keeps in its bucket ([`super::counter`]); another the runs of a
//! plugin scheduled every second ([`super::schedule`]).
//!
//! The [`Scenario::Spread`] runs several leases with spreading on instead,
//! and adds faults that rewrite the configuration file the hosts watch and
//! `baton yield` ([`super::layout`], which checks its records per plugin).
//!
//! One run is a number of *segments* (fresh hosts and store each); the
//! bounded run in the test suite is one segment per store and scenario.
//! Variables:
//!
//! - `BATON_CHAOS_SEED`: the seed of the first segment (printed by every
//!   run; the segment after it uses the seed plus one, and so on), to
//!   replay a run.
//! - `BATON_CHAOS_FAULTS`: how many faults in all, per store and scenario
//!   (default 16).
//! - `BATON_CHAOS_SOAK`: a file where each finished segment appends one line
//!   of figures; a run counts the faults of its store already there and
//!   only adds what is missing, so a soak stopped half-way resumes where it
//!   stopped. `scripts/soak.sh` wraps it and sums the file up
//!   (`docs/reliability.md`).
//!
//! Used by tests/e2e (the embedded store), tests/kube (the Kubernetes
//! store) and tests/etcd (the etcd store), each with a bed of its own.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::counter;
use super::layout::{self, Layout, Logged};
use super::schedule;
use crate::support::*;
use crate::witness::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Faults per segment.
pub const SEGMENT_FAULTS: usize = 16;

/// How long after a fault cleared a leader's records are expected to be
/// missing at most on an idle machine: LD + RP, plus an allowance for
/// starting the guests of the new term (instantiating four components:
/// tens of milliseconds) and for a watch event and a retry tick that start
/// just after the deadline. A longer gap is reported with what the hosts
/// said meanwhile (a figure: `longest_gap_ms`, soaked by scripts/soak.sh),
/// not failed: on a busy machine starting a term takes longer.
pub const ALLOWANCE: Duration = Duration::from_millis(400);

/// The longest gap that fails the run: a lease left wedged, not a slow
/// start. Twice the expiry and retry, plus 2 s for starting the new term
/// on a busy machine; a take-over cannot come sooner than the expiry
/// whatever the load, so this only widens the start-up's share.
pub fn wedged(lease_duration: Duration, retry_period: Duration) -> Duration {
    2 * (lease_duration + retry_period) + SECS(2)
}

/// The guests' tick: a record every 5 ms each.
const TICK_MS: &str = "5";

/// The counter's tick (see [`counter`]): an increment every 10 ms.
const COUNTER_MS: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(dead_code)] // each store injects only its own
pub enum Fault {
    KillLeader,
    TermLeader,
    StopLeaderLong,
    StopLeaderShort,
    StopFollower,
    DeleteLease,
    GarbleLease,
    ApiServerStop,
    ApiServerRestart,
    EtcdRestart,
    ForeignWriter,
    BlackHole,
    MemberKill,
    EtcdLeaderKill,
    MemberStop,
    QuorumLoss,
    Compaction,
    PgRestartFast,
    PgRestartImmediate,
    PgTerminate,
    PgPause,
    PgFailover,
    MovePlugin,
    AddLease,
    RemoveLease,
    ChangeTimings,
    Yield,
}

/// What a segment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// One lease, "demo", with the host faults and the store's own.
    OneLease,
    /// Three to five leases with spreading on, hosts watching their
    /// configuration file: the host faults, reloads and yields.
    Spread,
}

/// The faults of the spread scenario: the reloads and the yield twice as
/// likely as each host fault.
pub const SPREAD_FAULTS: [Fault; 15] = [
    Fault::MovePlugin,
    Fault::AddLease,
    Fault::RemoveLease,
    Fault::ChangeTimings,
    Fault::Yield,
    Fault::MovePlugin,
    Fault::AddLease,
    Fault::RemoveLease,
    Fault::ChangeTimings,
    Fault::Yield,
    Fault::KillLeader,
    Fault::TermLeader,
    Fault::StopLeaderLong,
    Fault::StopLeaderShort,
    Fault::StopFollower,
];

/// The faults of hosts, on any store.
pub const HOST_FAULTS: [Fault; 5] = [
    Fault::KillLeader,
    Fault::TermLeader,
    Fault::StopLeaderLong,
    Fault::StopLeaderShort,
    Fault::StopFollower,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "SIGKILL leader",
            Fault::TermLeader => "SIGTERM leader",
            Fault::StopLeaderLong => "SIGSTOP leader > LD",
            Fault::StopLeaderShort => "SIGSTOP leader < RD",
            Fault::StopFollower => "SIGSTOP follower",
            Fault::DeleteLease => "lease deleted",
            Fault::GarbleLease => "lease garbled",
            Fault::ApiServerStop => "API server SIGSTOP > RD",
            Fault::ApiServerRestart => "API server killed, restarted",
            Fault::EtcdRestart => "etcd killed, restarted",
            Fault::ForeignWriter => "foreign writer",
            Fault::BlackHole => "one host black-holed",
            Fault::MemberKill => "etcd member killed, revived",
            Fault::EtcdLeaderKill => "etcd raft leader killed, revived",
            Fault::MemberStop => "etcd member SIGSTOP > RD",
            Fault::QuorumLoss => "etcd quorum lost, regained",
            Fault::Compaction => "etcd compacted",
            Fault::PgRestartFast => "PostgreSQL primary restarted -m fast",
            Fault::PgRestartImmediate => "PostgreSQL primary restarted -m immediate",
            Fault::PgTerminate => "PostgreSQL backends terminated",
            Fault::PgPause => "PostgreSQL primary SIGSTOP > RD",
            Fault::PgFailover => "PostgreSQL failover, lease writes lost",
            Fault::MovePlugin => "reload: plugin moved",
            Fault::AddLease => "reload: lease added",
            Fault::RemoveLease => "reload: lease removed",
            Fault::ChangeTimings => "reload: timings changed",
            Fault::Yield => "baton yield",
        }
    }
}

/// A lease store under chaos: how hosts reach it, and its own faults.
pub trait Bed {
    /// The store's name in the figures (`store=...`).
    fn store(&self) -> &'static str;
    /// The faults to draw from: [`HOST_FAULTS`] and the store's own.
    fn faults(&self) -> Vec<Fault>;
    /// The lease duration and retry period of the hosts.
    fn timings(&self) -> (Duration, Duration);
    /// A fresh store for one segment, and the `[store]` and timing tables
    /// of a configuration with the lease "demo" on it (the plugins are
    /// added after).
    fn config(&mut self, s: &Scratch) -> String;
    /// Environment variables of the host process named `name`.
    fn env(&mut self, s: &Scratch, name: &str) -> Vec<(String, String)>;
    /// Injects a store fault; `hosts` are the live hosts' names, `leader`
    /// the index of the one leading. Returns when the fault was cleared
    /// (see [`Injected`]), or `None` if it could not be injected now.
    fn inject(&mut self, fault: Fault, rng: &mut StdRng, hosts: &[&str], leader: usize)
    -> Option<SystemTime>;
    /// A fresh store for one segment of [`Scenario::Spread`]: its `[store]`
    /// table alone.
    fn store_table(&mut self, s: &Scratch) -> String;
    /// Two `[defaults]` tables that `Timings::validate` accepts, the first
    /// with [`Bed::timings`]: [`Fault::ChangeTimings`] switches between them.
    fn defaults(&self) -> [String; 2];
    /// Called when the segment is over, to put the store back in order.
    fn end(&mut self) {}
}

/// One fault, as injected.
pub struct Injected {
    fault: Fault,
    /// When the injection began.
    started: SystemTime,
    /// When the fault was over as far as the bound is concerned: the
    /// injection for kills and stops, the repair for store faults.
    cleared: SystemTime,
}

/// A host process (a host name may have several, one after another).
struct Process {
    host: Host,
    /// When the test killed it (SIGKILL), if it did.
    killed: Option<SystemTime>,
}

/// What the checker found in one segment.
#[derive(Debug, Default)]
struct Figures {
    records: usize,
    terms: usize,
    /// Two terms whose records overlap in time (or come out of order); in
    /// the spread scenario, two runs of one plugin.
    overlaps: usize,
    /// Runs of a plugin followed by one on another host (spread scenario).
    handovers: usize,
    /// A record of an older term after one of a newer term in the file.
    stale: usize,
    /// A record stamped after its term's force-stop time (or after its
    /// process was killed).
    late: usize,
    /// Host processes that exited without being told to, or badly.
    crashes: usize,
    /// The longest time without records after a fault cleared, per fault.
    gaps: BTreeMap<Fault, (usize, Duration)>,
}

/// `[[plugin]]` tables: both worlds, each honouring and ignoring the change;
/// and a guest that asks for the live hosts (and writes no records), so
/// that every host keeps its membership record under the faults too.
fn plugins(dir: &Path) -> String {
    let mut text = format!(
        "\n[[plugin]]\nname = \"hosts\"\npath = {:?}\nlease = \"demo\"\n",
        guest("hosts_pollable.wasm").display().to_string()
    );
    for world in ["pollable", "future"] {
        for ignore in [false, true] {
            let name = format!("{world}-{}", if ignore { "stubborn" } else { "coop" });
            text.push_str(&format!(
                "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\ninherit-env = [\"PROBE_HOST\"]\n\
                 env = {{ PROBE_MODE = \"append\", PROBE_TICK_MS = {TICK_MS:?}, PROBE_TAG = {name:?}{} }}\n\
                 dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
                guest(&format!("probe_{world}.wasm")).display().to_string(),
                if ignore { ", PROBE_IGNORE = \"1\"" } else { "" },
                dir.display().to_string(),
            ));
        }
    }
    text
}

fn start(bed: &mut dyn Bed, s: &Scratch, name: &str, config: &Path, scenario: Scenario) -> Host {
    let mut vars = bed.env(s, name);
    vars.push(("PROBE_HOST".into(), name.into()));
    vars.push(("SCHED_HOST".into(), name.into()));
    let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let watch: &[&std::ffi::OsStr] = match scenario {
        Scenario::OneLease => &[],
        Scenario::Spread => &["--watch".as_ref()],
    };
    let host = Host::start_opts(
        name,
        config,
        Opts {
            env: &env,
            args: watch,
            ..Opts::default()
        },
    );
    host.wait_for(SECS(60), "plugins loaded", |e| {
        e.message() == "compiled-code cache"
    });
    host
}

/// A reload fault of the spread scenario applied to `layout`: what it did,
/// or `None` if it cannot be done now.
fn reload(layout: &mut Layout, fault: Fault, rng: &mut StdRng) -> Option<String> {
    match fault {
        Fault::MovePlugin => Some(layout.move_plugin(rng)),
        Fault::AddLease => layout.add_lease(rng),
        Fault::RemoveLease => layout.remove_lease(rng),
        Fault::ChangeTimings => Some(layout.change_timings()),
        other => panic!("not a reload: {other:?}"),
    }
}

/// One segment: `faults` faults drawn from `seed`.
fn segment(
    bed: &mut dyn Bed,
    scenario: Scenario,
    seed: u64,
    faults: usize,
) -> (Figures, BTreeMap<Fault, usize>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (lease_duration, retry_period) = bed.timings();
    let s = Scratch::new();
    let data = records_dir(&s);
    let sched = schedule::records_dir(&s);
    let kv = counter::records(&s);
    let (kinds, mut layout, text) = match scenario {
        Scenario::OneLease => {
            let mut text = bed.config(&s);
            text.push_str(&plugins(&data));
            text.push_str(&counter::plugin(COUNTER_MS, &kv));
            text.push_str(&schedule::plugin(&sched));
            (bed.faults(), None, text)
        }
        Scenario::Spread => {
            let layout = Layout::new(bed.store_table(&s), bed.defaults(), &data);
            let text = layout.render();
            (SPREAD_FAULTS.to_vec(), Some(layout), text)
        }
    };
    let cfg = s.write("chaos.toml", &text);
    let names = ["h1", "h2", "h3"];
    // Live processes by host slot; every process ever started, for the check.
    let mut live: Vec<usize> = Vec::new();
    let mut all: Vec<Process> = Vec::new();
    for n in names {
        live.push(all.len());
        all.push(Process {
            host: start(bed, &s, n, &cfg, scenario),
            killed: None,
        });
    }
    let mut injected: Vec<Injected> = Vec::new();
    let mut counts: BTreeMap<Fault, usize> = BTreeMap::new();
    let mut crashes = 0;
    // The leader to hit: of "demo", the host in the newest term; with
    // several leases, the host that leads the most.
    let view = |all: &Vec<Process>, live: &Vec<usize>| -> Option<usize> {
        let procs: Vec<&Process> = live.iter().map(|&i| &all[i]).collect();
        let rank = |h: &Host| match scenario {
            Scenario::OneLease => leading_term(h),
            Scenario::Spread => Some(led(h).len() as u64).filter(|n| *n > 0),
        };
        procs
            .iter()
            .enumerate()
            .filter_map(|(slot, p)| rank(&p.host).map(|t| (slot, t)))
            .max_by_key(|(_, t)| *t)
            .map(|(slot, _)| slot)
    };
    // A fault that cannot be injected now is drawn again.
    let mut n = 0;
    while n < faults {
        // A leader to hit, most of the time.
        let until = Instant::now() + SECS(30);
        let lead = loop {
            if let Some(slot) = view(&all, &live) {
                break slot;
            }
            assert!(
                Instant::now() < until,
                "seed {seed}, fault {n}: no leader for 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1200)));
        let fault = kinds[rng.random_range(0..kinds.len())];
        let started = SystemTime::now();
        *counts.entry(fault).or_default() += 1;
        let follower = (lead + rng.random_range(1..names.len())) % names.len();
        let proc_of = |slot: usize| live[slot];
        match fault {
            Fault::KillLeader => {
                let i = proc_of(lead);
                let at = all[i].host.sigkill();
                all[i].killed = Some(at);
                injected.push(Injected {
                    fault,
                    started,
                    cleared: at,
                });
                std::thread::sleep(Duration::from_millis(rng.random_range(0..1000)));
                live[lead] = all.len();
                all.push(Process {
                    host: start(bed, &s, names[lead], &cfg, scenario),
                    killed: None,
                });
            }
            Fault::TermLeader => {
                let i = proc_of(lead);
                let at = all[i].host.sigterm();
                injected.push(Injected {
                    fault,
                    started,
                    cleared: at,
                });
                if !all[i].host.wait_exit(SECS(10)).success() {
                    crashes += 1;
                }
                live[lead] = all.len();
                all.push(Process {
                    host: start(bed, &s, names[lead], &cfg, scenario),
                    killed: None,
                });
            }
            Fault::StopLeaderLong | Fault::StopLeaderShort => {
                let pause = if fault == Fault::StopLeaderLong {
                    lease_duration + Duration::from_millis(rng.random_range(100..1500))
                } else {
                    Duration::from_millis(rng.random_range(50..800))
                };
                let h = &all[proc_of(lead)].host;
                let at = h.signal(libc::SIGSTOP);
                injected.push(Injected {
                    fault,
                    started,
                    cleared: at,
                });
                std::thread::sleep(pause);
                h.signal(libc::SIGCONT);
            }
            Fault::StopFollower => {
                let h = &all[proc_of(follower)].host;
                let at = h.signal(libc::SIGSTOP);
                injected.push(Injected {
                    fault,
                    started,
                    cleared: at,
                });
                std::thread::sleep(Duration::from_millis(rng.random_range(200..3000)));
                h.signal(libc::SIGCONT);
            }
            Fault::MovePlugin | Fault::AddLease | Fault::RemoveLease | Fault::ChangeTimings => {
                let layout = layout.as_mut().expect("a reload of the spread scenario");
                let Some(said) = reload(layout, fault, &mut rng) else {
                    *counts.get_mut(&fault).unwrap() -= 1;
                    continue;
                };
                println!("  fault {n}: {said}");
                let hosts: Vec<&Host> = live.iter().map(|&i| &all[i].host).collect();
                let cleared = layout::rewrite(&cfg, &layout.render(), &hosts);
                injected.push(Injected {
                    fault,
                    started,
                    cleared,
                });
            }
            Fault::Yield => {
                let lease = layout
                    .as_ref()
                    .expect("a yield of the spread scenario")
                    .busy_lease(&mut rng);
                let Some(cleared) = layout::yield_lease(&cfg, &lease, &mut rng) else {
                    *counts.get_mut(&fault).unwrap() -= 1;
                    continue;
                };
                injected.push(Injected {
                    fault,
                    started,
                    cleared,
                });
            }
            _ => match bed.inject(fault, &mut rng, &names, lead) {
                Some(cleared) => injected.push(Injected {
                    fault,
                    started,
                    cleared,
                }),
                None => {
                    *counts.get_mut(&fault).unwrap() -= 1;
                    continue;
                }
            },
        }
        // A process that exited by itself crashed.
        for &i in &live {
            if let Some(status) = all[i].host.exited() {
                panic!(
                    "seed {seed}, after {}: {} exited by itself ({status}); its log:\n{}",
                    fault.name(),
                    all[i].host.name,
                    tail(&all[i].host.output(), 40)
                );
            }
        }
        n += 1;
    }
    if let Some(layout) = &layout {
        // Every plugin runs again where the last configuration put it.
        layout::wait_all_run(&data.join("records"), layout, SECS(30));
    }
    std::thread::sleep(SECS(2));
    for &i in &live {
        all[i].host.sigterm();
    }
    for &i in &live {
        let status = all[i].host.wait_exit(SECS(10));
        if !status.success() {
            crashes += 1;
            eprintln!(
                "{} exited with {status}:\n{}",
                all[i].host.name,
                tail(&all[i].host.output(), 40)
            );
        }
    }
    bed.end();
    if scenario == Scenario::OneLease {
        let hosts: Vec<&Host> = all.iter().map(|p| &p.host).collect();
        counter::check(&cfg, &bed.env(&s, names[0]), &kv, seed);
        schedule::check(&cfg, &bed.env(&s, names[0]), &hosts, &sched, seed);
    }
    let bound = lease_duration + retry_period + ALLOWANCE;
    let mut figures = match scenario {
        Scenario::OneLease => check(&data.join("records"), &all, &injected, bound, lease_duration),
        Scenario::Spread => {
            let logged: Vec<Logged> = all
                .iter()
                .map(|p| Logged {
                    host: &p.host,
                    killed: p.killed,
                })
                .collect();
            let f = layout::check(&data.join("records"), &logged);
            Figures {
                records: f.records,
                terms: f.terms,
                overlaps: f.overlaps,
                stale: f.stale,
                late: f.late,
                handovers: f.handovers,
                ..Figures::default()
            }
        }
    };
    figures.crashes += crashes;
    (figures, counts)
}

/// Prints what every host logged between `from` and `to`, but its guests'
/// lines: the story of an overlap.
fn story(all: &[Process], from: SystemTime, to: SystemTime) {
    let mut lines: Vec<(SystemTime, String)> = Vec::new();
    for p in all {
        for e in p
            .host
            .all(|e| e.at >= from && e.at <= to && e.str("stream").is_none())
        {
            lines.push((e.at, format!("{}: {}", p.host.name, e.json)));
        }
    }
    lines.sort();
    eprintln!("what the hosts logged around it:");
    for (_, line) in lines {
        eprintln!("  {line}");
    }
}

/// Reads the records and the logs: see [`Figures`].
fn check(
    file: &Path,
    all: &[Process],
    injected: &[Injected],
    bound: Duration,
    lease_duration: Duration,
) -> Figures {
    let mut figures = Figures::default();
    // Each (host name, term): its force-stop time, or its process's death.
    let mut ends: HashMap<(String, u64), SystemTime> = HashMap::new();
    for p in all {
        let mut terms = Vec::new();
        for e in p.host.all(|e| {
            e.message() == "lease status changed"
                && e.str("role") == Some("leading")
                && e.str("lease") == Some("demo")
        }) {
            terms.push(e.u64("term").unwrap());
        }
        for t in terms {
            if let Some(killed) = p.killed {
                ends.insert((p.host.name.clone(), t), killed);
            }
        }
        for e in p.host.all(|e| e.is("leader task stopped", None)) {
            let key = (p.host.name.clone(), e.u64("term").unwrap());
            let at = force_stop_at(&e);
            let end = ends.entry(key).or_insert(at);
            *end = (*end).max(at);
        }
    }
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut newest = 0u64;
    // Per term: the host, its first and last record's time.
    let mut spans: BTreeMap<u64, (String, SystemTime, SystemTime)> = BTreeMap::new();
    let mut stamps: Vec<SystemTime> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Record { term, host, at, .. } = Record::parse(n, line);
        figures.records += 1;
        stamps.push(at);
        if term < newest {
            figures.stale += 1;
            eprintln!("line {}: term {term} after term {newest}: {line}", n + 1);
        }
        newest = newest.max(term);
        match ends.get(&(host.clone(), term)) {
            Some(end) if ms_between(*end, at) <= 5.0 => {}
            Some(end) => {
                figures.late += 1;
                eprintln!(
                    "line {}: stamped {:.1} ms after its term's end: {line}",
                    n + 1,
                    ms_between(*end, at)
                );
            }
            None => {
                figures.late += 1;
                eprintln!("line {}: {host} logged no end of term {term}: {line}", n + 1);
            }
        }
        let span = spans.entry(term).or_insert((host.clone(), at, at));
        if span.0 != host {
            figures.overlaps += 1;
            eprintln!("line {}: term {term} written by {} and {host}", n + 1, span.0);
        }
        span.1 = span.1.min(at);
        span.2 = span.2.max(at);
    }
    figures.terms = spans.len();
    let spans: Vec<_> = spans.into_iter().collect();
    for pair in spans.windows(2) {
        let ((t1, (h1, _, last1)), (t2, (h2, first2, _))) = (&pair[0], &pair[1]);
        if last1 >= first2 {
            figures.overlaps += 1;
            eprintln!(
                "term {t1} ({h1}) wrote until {:.1} ms after term {t2} ({h2}) began",
                ms_between(*first2, *last1)
            );
            story(
                all,
                *first2 - Duration::from_secs(6),
                *last1 + Duration::from_secs(1),
            );
        }
    }
    stamps.sort();
    for (k, i) in injected.iter().enumerate() {
        // The longest time without records from the moment the fault
        // cleared until the next fault began (the interval that spans that
        // moment included): the old leader may write on for a while (a
        // black-holed leader until its renew deadline), and the gap that
        // matters comes after.
        let window_end = injected.get(k + 1).map(|n| n.started);
        let (mut from, mut gap, mut gap_from, mut closed) = (i.cleared, Duration::ZERO, i.cleared, false);
        for &at in stamps.iter().skip_while(|&&at| at < i.cleared) {
            // An interval that runs into the next fault counts up to its
            // beginning only (the rest is that fault's).
            let until = window_end.map_or(at, |end| at.min(end.max(from)));
            let quiet = until.duration_since(from).unwrap_or_default();
            if quiet > gap {
                (gap, gap_from) = (quiet, from);
            }
            from = at;
            closed = true;
            if window_end.is_some_and(|end| at >= end) {
                break;
            }
        }
        if !closed {
            // Nothing after the last fault: the run ended first.
            continue;
        }
        if gap > bound {
            eprintln!(
                "{} cleared at {:?}: no record for {} ms from {:+.0} ms; what the hosts said meanwhile:",
                i.fault.name(),
                i.cleared,
                gap.as_millis(),
                ms_between(i.cleared, gap_from)
            );
            for p in all {
                for e in p.host.all(|e| {
                    e.str("target") != Some("guest")
                        && e.at >= gap_from - lease_duration
                        && e.at <= gap_from + gap + SECS(1)
                }) {
                    eprintln!(
                        "  {:+6.0} ms {}: {} {}",
                        ms_between(i.cleared, e.at),
                        p.host.name,
                        e.message(),
                        e.json
                    );
                }
            }
        }
        let entry = figures.gaps.entry(i.fault).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(gap);
    }
    figures
}

/// The seed of this run: `BATON_CHAOS_SEED`, or the time.
fn first_seed() -> u64 {
    std::env::var("BATON_CHAOS_SEED").map_or_else(
        |_| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        },
        |s| s.parse().expect("BATON_CHAOS_SEED is a number"),
    )
}

/// Runs chaos on `bed`'s store: `BATON_CHAOS_FAULTS` faults (default one
/// segment), in segments; panics with the figures and the seed to replay
/// if the checker finds anything.
pub fn run(bed: &mut dyn Bed, scenario: Scenario) {
    let store = match scenario {
        Scenario::OneLease => bed.store().to_owned(),
        Scenario::Spread => format!("{}/spread", bed.store()),
    };
    let (lease_duration, retry_period) = bed.timings();
    let total: usize = std::env::var("BATON_CHAOS_FAULTS").map_or(SEGMENT_FAULTS, |n| n.parse().unwrap());
    let soak = std::env::var_os("BATON_CHAOS_SOAK").map(std::path::PathBuf::from);
    let done_before: usize = soak
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map_or(0, |text| {
            text.lines()
                .filter(|l| l.contains(&format!("store={store} ")))
                .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("faults=")))
                .map(|n| n.parse::<usize>().unwrap())
                .sum()
        });
    let mut seed = first_seed();
    let mut done = done_before;
    let bound = wedged(lease_duration, retry_period);
    while done < total {
        let faults = SEGMENT_FAULTS.min(total - done);
        println!(
            "chaos segment on the {store} store: seed={seed} faults={faults} (replay: BATON_CHAOS_SEED={seed} BATON_CHAOS_FAULTS={faults})"
        );
        let (f, counts) = segment(bed, scenario, seed, faults);
        let gaps: Vec<String> = f
            .gaps
            .iter()
            .map(|(k, (n, g))| format!("{}: {n}, longest gap {} ms", k.name(), g.as_millis()))
            .collect();
        let longest = f.gaps.values().map(|(_, g)| *g).max().unwrap_or_default();
        let line = format!(
            "store={store} seed={seed} faults={faults} records={} terms={} handovers={} overlaps={} stale={} late={} crashes={} longest_gap_ms={} kinds={}",
            f.records,
            f.terms,
            f.handovers,
            f.overlaps,
            f.stale,
            f.late,
            f.crashes,
            longest.as_millis(),
            counts
                .iter()
                .map(|(k, n)| format!("{k:?}:{n}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        println!("{line}\n  {}", gaps.join("\n  "));
        assert!(
            f.overlaps == 0 && f.stale == 0 && f.late == 0 && f.crashes == 0,
            "seed {seed}: {line}"
        );
        // Each fault that ends the leader's term (its death, SIGTERM, a
        // pause past the lease) is followed by a new term that writes; the
        // other faults may leave the leader as it was. Fewer terms than
        // those faults: a lease was left wedged.
        let ending = [Fault::KillLeader, Fault::TermLeader, Fault::StopLeaderLong]
            .iter()
            .map(|k| counts.get(k).copied().unwrap_or(0))
            .sum::<usize>();
        assert!(
            f.terms >= ending,
            "seed {seed}: only {} terms wrote after {ending} faults that end a term: {line}",
            f.terms
        );
        assert!(
            longest <= bound,
            "seed {seed}: {} ms without records after a fault cleared: a lease left wedged (bound 2 (LD + RP) + 2 s = {} ms): {}",
            longest.as_millis(),
            bound.as_millis(),
            gaps.join("; ")
        );
        if let Some(file) = &soak {
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file)
                .unwrap();
            writeln!(out, "{line}").unwrap();
        }
        done += faults;
        seed += 1;
    }
}
