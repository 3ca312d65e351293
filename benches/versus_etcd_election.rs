//! baton on etcd against etcd's own `concurrency.Election`, side by side on
//! one real etcd 3.4 cluster (three members of Debian's etcd-server 3.4.23
//! on loopback, started by `scripts/etcd-testenv.sh` for this bench alone,
//! under an env file of its own), in the same run, at the same timings:
//!
//! - baton: a real `baton run` process on the etcd store (`[store] kind =
//!   "etcd"`, the members' plain endpoints, a key prefix of its own per
//!   run) with the pollable Rust probe (`probe_pollable.wasm`), which prints
//!   a line at once and then every 100 ms while it leads: an *act* is one
//!   such line, timed by the host's JSON log;
//! - etcd election: `benches/etcdelection/main.go`, the clientv3 3.4
//!   client's `concurrency.NewSession` + `NewElection` + `Campaign` (from
//!   Debian's `golang-etcd-server-dev` 3.4.23, built offline with Debian's
//!   Go by `benches/etcdelection/build.sh` into
//!   `$BATON_CACHE/etcd/etcd-elector`, rebuilt only when its source
//!   changes): acting every 100 ms while it leads, until its session ends;
//!   on SIGTERM it stops acting, `Resign`s and revokes its session's lease.
//!   It prints wall-clock timestamps in the line format of
//!   `benches/clientgo/main.go`.
//!
//! Timing sets (`BATON_BENCH_TIMINGS`, default `fast,default`), and how
//! etcd's election maps onto them:
//! - `default`: baton's defaults, lease 15 s, renew deadline 10 s, retry
//!   period 2 s; grace 1 s (10 s + 1 s + 800 ms margin < 15 s);
//! - `fast`: lease 4 s, renew deadline 3 s, retry 500 ms; grace 500 ms
//!   (3 s + 500 ms + 250 ms margin < 4 s).
//!
//! | baton | etcd's `concurrency` (clientv3 3.4) |
//! |---|---|
//! | lease duration (LD) | the session's TTL (`WithTTL`), whole seconds: equal |
//! | retry period (RP): the leader renews every RP | none: the client keeps the session's lease alive every TTL / 3 (fixed in `clientv3/lease.go`): 5 s and 1.33 s |
//! | renew deadline (RD): the leader stops leading RD after its last confirmed renewal | none: the session ends when no keep-alive answer came for TTL (the client's deadline, checked every 500 ms), so the leader acts up to a whole TTL after its last renewal, as long as the lease itself |
//! | a follower watches the record | a candidate watches the key created just before its own (`Campaign`'s `waitDeletes`) |
//! | grace, request timeout (min(RP, RD / 2)) | none (a `Resign` bounded by 2 s at exit) |
//!
//! Scenarios (`BATON_BENCH_SCENARIOS`, default
//! `graceful,crash,frozen,idle,cpu`); the first three run `BATON_BENCH_RUNS`
//! times (default 8) with a fresh leader, standby and lease (baton: a key
//! prefix; etcd: an election prefix) per run; the two tools' runs go at
//! the same time, one thread each (`BATON_BENCH_SERIAL=1`: one tool after
//! the other):
//!
//! - `graceful`: SIGTERM the leader -> the standby's first act;
//! - `crash`: SIGKILL the leader -> the standby's first act;
//! - `frozen`: SIGSTOP the leader, wait for the standby's first act and
//!   until the leader has been frozen for longer than the lease, then
//!   SIGCONT; for RD + grace + 2 s after, count the old leader's acts:
//!   how long it kept acting after it resumed, and whether it acted while
//!   the standby led (overlap). etcd's election fences nothing: its leader
//!   acts until its client notices the session expired;
//! - `idle`: a leader and a follower of one tool, idle for 30 retry periods
//!   (at least 30 s), then the same for the other tool, one after the
//!   other, nothing else on the cluster: the requests each pair made, from
//!   etcd's own counters (`/metrics` of every member:
//!   `grpc_server_msg_received_total`, every message received, a unary
//!   request or a message on a stream such as a lease keep-alive or a
//!   watch's progress request, by gRPC method; summed over the members,
//!   after minus before). A window with neither tool running comes first
//!   and should count nothing: what the bench's own scrapes cost;
//! - `cpu`: one host's idle CPU with 1,000 leases (`BATON_BENCH_LEASES`),
//!   no plugins and no standby, at the timings of `BATON_BENCH_CPU_TIMING`
//!   (default `default`): a `baton run` host leading them all, against one
//!   Go process campaigning in 1,000 elections (a session each, as
//!   baton's leases are each their own; and then with one session shared
//!   by all, etcd's cheapest way). From the moment it leads all of them,
//!   `BATON_BENCH_SETTLE_SECS` (default 10) to settle, then
//!   `BATON_BENCH_CPU_WINDOWS` windows (default 3) of
//!   `BATON_BENCH_CPU_SECS` (default 20): the process's utime + stime from
//!   `/proc/PID/stat`, in % of one core; with the etcd members' CPU and the
//!   requests per second of each, as for `idle`. Measure a release build:
//!   `BATON_BENCH_PROFILE=release` (the bench prints which it ran).
//!
//! Hand-overs are timed from the moment the bench signals the leader to
//! the standby's first act, both wall-clock times on this machine.
//!
//! A run whose standby does not act within 2 LD + 4 RP + 10 s of the signal
//! is a failure: the bench says so, writes both processes' whole output to
//! the temporary folder (`versus-etcd-election-<leader>.log`), leaves the
//! run out of the figures and counts it (`failed_runs` in the JSON).
//! `BATON_BENCH_BATON_LOG` sets the baton hosts' `BATON_LOG` (default
//! `info`).
//!
//! Prints min / median / max per tool and the ratio of the medians
//! (baton / etcd election), a Markdown table of the same, writes the raw
//! runs as JSON and the plots as SVG (`benches/plot.rs`) into
//! `BATON_BENCH_PLOTS` (default `docs/perf/`).
//!
//! Run: `scripts/bench.sh --bench versus_etcd_election`, for the CPU figure
//! with `BATON_BENCH_PROFILE=release`. Needs Debian's etcd-server
//! (`scripts/etcd-testenv.sh install`) and golang-etcd-server-dev, which
//! `benches/etcdelection/build.sh` installs when missing.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/etcd/env.rs"]
#[allow(dead_code)]
mod env;

// benches/plot.rs, shared by the benches (each uses part of it).
#[path = "plot.rs"]
#[allow(dead_code)]
mod plot;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use env::OwnCluster;
use plot::median;
use support::*;

// ------------------------------------------------------------ timings

#[derive(Clone, Copy)]
struct Timing {
    name: &'static str,
    ld: Duration,
    rd: Duration,
    rp: Duration,
    grace: Duration,
}

const DEFAULT: Timing = Timing {
    name: "default",
    ld: Duration::from_secs(15),
    rd: Duration::from_secs(10),
    rp: Duration::from_secs(2),
    grace: Duration::from_secs(1),
};

const FAST: Timing = Timing {
    name: "fast",
    ld: Duration::from_secs(4),
    rd: Duration::from_secs(3),
    rp: Duration::from_millis(500),
    grace: Duration::from_millis(500),
};

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Timing {
    fn label(&self) -> String {
        format!(
            "{} (lease {}, renew {}, retry {}; baton grace {}; etcd session TTL {}, keep-alive every {})",
            self.name,
            humantime::format_duration(self.ld),
            humantime::format_duration(self.rd),
            humantime::format_duration(self.rp),
            humantime::format_duration(self.grace),
            humantime::format_duration(self.ld),
            humantime::format_duration(Duration::from_millis((self.ld.as_millis() / 3) as u64)),
        )
    }

    fn by_name(name: &str) -> Timing {
        match name {
            "fast" => FAST,
            "default" => DEFAULT,
            other => panic!("unknown timing set {other:?} (fast, default)"),
        }
    }
}

// ------------------------------------------------------------ the tools

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Baton,
    Etcd,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Baton => "baton",
            Tool::Etcd => "etcd election",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Tool::Baton => "baton",
            Tool::Etcd => "etcd",
        }
    }
}

/// One event of the etcd elector (a line of its stdout).
#[derive(Clone)]
struct GoEvent {
    event: String,
    leader: String,
    at: SystemTime,
}

type GoLog = Arc<(Mutex<Vec<GoEvent>>, Condvar)>;

/// A running etcd elector.
struct GoProc {
    child: Child,
    log: GoLog,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl GoProc {
    fn start(bin: &Path, args: &[String]) -> GoProc {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start etcd-elector");
        let log: GoLog = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stdout = child.stdout.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let at = UNIX_EPOCH + Duration::from_micros(v["us"].as_u64().unwrap_or(0));
                let (events, cv) = &*log2;
                events.lock().unwrap().push(GoEvent {
                    event: v["event"].as_str().unwrap_or("").to_owned(),
                    leader: v["leader"].as_str().unwrap_or("").to_owned(),
                    at,
                });
                cv.notify_all();
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (pipe, stderr2) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut lines = stderr2.lock().unwrap();
                // The client's log can be long (1,000 elections): keep the end.
                if lines.len() > 2000 {
                    lines.drain(..1000);
                }
                lines.push(line);
            }
        });
        GoProc { child, log, stderr }
    }

    fn try_wait_for(&self, timeout: Duration, pred: &dyn Fn(&GoEvent) -> bool) -> Option<GoEvent> {
        let deadline = Instant::now() + timeout;
        let (events, cv) = &*self.log;
        let mut guard = events.lock().unwrap();
        loop {
            if let Some(e) = guard.iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = cv.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    fn output(&self) -> String {
        let events: Vec<String> = self
            .log
            .0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take(20)
            .map(|e| format!("{} {:?}", e.event, e.at))
            .collect();
        format!(
            "{}\n{}",
            tail(&self.stderr.lock().unwrap().join("\n"), 40),
            events.join("\n")
        )
    }
}

impl Drop for GoProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Inner {
    Baton(Host),
    Go(GoProc),
}

/// A leader or standby of either tool.
struct Proc {
    name: String,
    inner: Inner,
}

fn is_act(e: &Event) -> bool {
    e.guest_line("probe", "probe start") || e.guest_line("probe", "probe tick")
}

impl Proc {
    fn pid(&self) -> i32 {
        match &self.inner {
            Inner::Baton(h) => h.pid(),
            Inner::Go(g) => g.child.id() as i32,
        }
    }

    /// Every act so far.
    fn acts(&self) -> Vec<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h.all(is_act).iter().map(|e| e.at).collect(),
            Inner::Go(g) => g
                .log
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.event == "act")
                .map(|e| e.at)
                .collect(),
        }
    }

    /// When its leader task stopped (baton: the host's "leader task
    /// stopped"; etcd: the Go program's "stopped", its session ended), the
    /// first at or after `after`.
    fn stopped_after(&self, after: SystemTime) -> Option<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h
                .all(|e| e.at >= after && e.is("leader task stopped", Some("probe")))
                .first()
                .map(|e| e.at),
            Inner::Go(g) => g
                .log
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|e| e.at >= after && e.event == "stopped")
                .map(|e| e.at),
        }
    }

    /// The first act at or after `after`.
    fn wait_act(&self, after: SystemTime, timeout: Duration, what: &str) -> SystemTime {
        self.try_wait_act(after, timeout).unwrap_or_else(|| {
            panic!(
                "{}: no {what} within {timeout:?}; output:\n{}",
                self.name,
                self.output()
            )
        })
    }

    /// The first act at or after `after`, if one comes within `timeout`.
    fn try_wait_act(&self, after: SystemTime, timeout: Duration) -> Option<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| e.at >= after && is_act(e))
                .map(|e| e.at),
            Inner::Go(g) => g
                .try_wait_for(timeout, &|e| e.at >= after && e.event == "act")
                .map(|e| e.at),
        }
    }

    /// Until it follows another leader (etcd: its candidate key is in and
    /// another's value leads).
    fn wait_following(&self, timeout: Duration) {
        let ok = match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| {
                    e.message() == "lease status changed" && e.str("role") == Some("following")
                })
                .is_some(),
            Inner::Go(g) => g
                .try_wait_for(timeout, &|e| e.event == "leader" && e.leader != self.name)
                .is_some(),
        };
        assert!(
            ok,
            "{}: not following within {timeout:?}; output:\n{}",
            self.name,
            self.output()
        );
    }

    fn signal(&self, sig: i32) -> SystemTime {
        let at = SystemTime::now();
        // SAFETY: kill(2) on a child this bench spawned and still owns.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill {sig} {}", self.name);
        at
    }

    fn wait_exit(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let done = match &mut self.inner {
                Inner::Baton(h) => h.exited().is_some(),
                Inner::Go(g) => g.child.try_wait().unwrap().is_some(),
            };
            if done {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; output:\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn output(&self) -> String {
        match &self.inner {
            Inner::Baton(h) => tail(&h.output(), 40),
            Inner::Go(g) => g.output(),
        }
    }

    /// Everything it wrote (the Go program: its events and stderr).
    fn full_output(&self) -> String {
        match &self.inner {
            Inner::Baton(h) => h.output(),
            Inner::Go(g) => {
                let events: Vec<String> = g
                    .log
                    .0
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|e| {
                        format!(
                            "{} {} {}",
                            humantime::format_rfc3339_micros(e.at),
                            e.event,
                            e.leader
                        )
                    })
                    .collect();
                format!("{}\n{}", g.stderr.lock().unwrap().join("\n"), events.join("\n"))
            }
        }
    }
}

/// A run in which the standby did not act in time: says so, writes both
/// processes' whole output to a file of the temporary folder, and stops
/// them (resuming a frozen one first).
fn failed(what: &str, procs: &mut [Proc], t: &Timing) {
    let file = std::env::temp_dir().join(format!("versus-etcd-election-{}.log", procs[0].name));
    let text: Vec<String> = procs
        .iter()
        .map(|p| format!("==== {}\n{}\n", p.name, p.full_output()))
        .collect();
    std::fs::write(&file, text.concat()).unwrap();
    eprintln!(
        "versus_etcd_election: FAILED RUN: {what}; not counted; both processes' output in {}",
        file.display()
    );
    for p in procs.iter() {
        // SAFETY: kill(2) on a child this bench spawned and still owns.
        unsafe { libc::kill(p.pid(), libc::SIGCONT) };
    }
    release_all(procs, t);
}

/// What every run needs: the cluster, the binaries.
struct Bench {
    cluster: OwnCluster,
    endpoints: Vec<String>,
    elector: PathBuf,
    scratch: Scratch,
}

impl Bench {
    /// The `[store]` and `[defaults]` of a baton host on `prefix`.
    fn head(&self, t: &Timing, prefix: &str) -> String {
        format!(
            "[store]\nkind = \"etcd\"\nendpoints = [{}]\nprefix = {prefix:?}\n\n[defaults]\n\
             lease-duration = \"{}\"\nrenew-deadline = \"{}\"\nretry-period = \"{}\"\ngrace = \"{}\"\n",
            self.endpoints
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            ms(t.ld),
            ms(t.rd),
            ms(t.rp),
            ms(t.grace),
        )
    }

    /// Starts `tool`'s elector for `lease` as `who` ("a" or "b"). baton:
    /// the lease `lease` under the key prefix `/baton-bench/<lease>/`;
    /// etcd: the election prefix `/etcd-election/<lease>`.
    fn spawn(&self, tool: Tool, t: &Timing, lease: &str, who: &str) -> Proc {
        let name = format!("{}-{lease}-{who}", tool.short());
        let inner = match tool {
            Tool::Baton => {
                let text = format!(
                    "{}\n[[lease]]\nname = {lease:?}\n\n[[plugin]]\nname = \"probe\"\npath = {:?}\nlease = {lease:?}\n\
                     env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"100\" }}\n",
                    self.head(t, &format!("/baton-bench/{lease}/")),
                    guest("probe_pollable.wasm").display().to_string()
                );
                let cfg = self.scratch.write(&format!("{name}.toml"), &text);
                let level = std::env::var("BATON_BENCH_BATON_LOG").unwrap_or_else(|_| "info".into());
                Inner::Baton(Host::start_opts(
                    &name,
                    &cfg,
                    Opts {
                        env: &[("BATON_LOG", &level)],
                        ..Opts::default()
                    },
                ))
            }
            Tool::Etcd => Inner::Go(GoProc::start(
                &self.elector,
                &[
                    format!("-endpoints={}", self.endpoints.join(",")),
                    format!("-prefix=/etcd-election/{lease}"),
                    format!("-identity={name}"),
                    format!("-ttl={}", ms(t.ld)),
                    "-act-every=100ms".to_owned(),
                ],
            )),
        };
        Proc { name, inner }
    }

    /// A leader (acting) and a standby (following) on a fresh `lease`,
    /// then 2.5 retry periods, so that what follows lands mid-lease.
    fn pair(&self, tool: Tool, t: &Timing, lease: &str) -> (Proc, Proc) {
        let a = self.spawn(tool, t, lease, "a");
        a.wait_act(UNIX_EPOCH, Duration::from_secs(60), "first act of the leader");
        let b = self.spawn(tool, t, lease, "b");
        b.wait_following(Duration::from_secs(60));
        std::thread::sleep(t.rp * 5 / 2);
        (a, b)
    }

    /// Messages received by the members' gRPC servers so far, per
    /// "Service.Method", summed over the members.
    fn grpc_counts(&self) -> BTreeMap<String, f64> {
        let mut counts = BTreeMap::new();
        for e in &self.endpoints {
            let out = Command::new("curl")
                .args(["-fsS", "--max-time", "5"])
                .arg(format!("{e}/metrics"))
                .output()
                .expect("run curl");
            assert!(
                out.status.success(),
                "curl {e}/metrics: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
                    continue;
                };
                let Some((labels, value)) = rest.rsplit_once("} ") else {
                    continue;
                };
                let label = |k: &str| {
                    labels
                        .split(',')
                        .find_map(|l| l.strip_prefix(k)?.strip_prefix("=\""))
                        .map(|v| v.trim_end_matches('"').to_owned())
                        .unwrap_or_default()
                };
                let service = label("grpc_service");
                let key = format!(
                    "{}.{}",
                    service.rsplit('.').next().unwrap_or(&service),
                    label("grpc_method")
                );
                *counts.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        counts
    }

    /// The members' CPU time so far, in seconds.
    fn members_cpu(&self) -> f64 {
        self.cluster.env().pids.iter().map(|&p| cpu_secs(p)).sum()
    }
}

/// `after - before`, per key, leaving out zeros.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| v.abs() > 1e-9)
        .collect()
}

// ------------------------------------------------------------ scenarios

/// One frozen-leader run.
#[derive(Clone, Copy, Debug)]
struct Frozen {
    /// How long the leader was frozen.
    frozen_ms: f64,
    /// SIGSTOP -> the standby's first act.
    takeover_ms: f64,
    /// Acts of the old leader after SIGCONT.
    acts_after: usize,
    /// SIGCONT -> its last act (0 if none).
    acting_ms: f64,
    /// SIGCONT -> its task stopped, if it did within the window.
    stopped_ms: Option<f64>,
    /// It acted after the standby's first act.
    overlap: bool,
}

/// The time from the signal to the standby's first act; `None` if the
/// standby did not act within 2 LD + 4 RP + 10 s (a failed run).
fn handover(b: &Bench, tool: Tool, t: &Timing, lease: &str, sig: i32) -> Option<f64> {
    let (mut a, s) = b.pair(tool, t, lease);
    let stopped = a.signal(sig);
    let timeout = t.ld * 2 + t.rp * 4 + Duration::from_secs(10);
    let Some(first) = s.try_wait_act(stopped, timeout) else {
        failed(
            &format!(
                "{}: no standby's first act within {timeout:?} of signal {sig}",
                s.name
            ),
            &mut [a, s],
            t,
        );
        return None;
    };
    a.wait_exit(t.rd + t.grace + Duration::from_secs(10));
    let late = a.acts().iter().filter(|&&at| at >= first).count();
    if late > 0 {
        eprintln!(
            "versus_etcd_election: {} acted {late} times after the standby's first act (signal {sig})",
            a.name
        );
    }
    release_all(&mut [s], t);
    Some(ms_between(stopped, first))
}

/// Stops each process with SIGTERM and waits for it to exit, so that it
/// releases its lease (baton) or resigns (etcd).
fn release_all(procs: &mut [Proc], t: &Timing) {
    for p in procs.iter() {
        p.signal(libc::SIGTERM);
    }
    for p in procs.iter_mut() {
        p.wait_exit(t.rd + t.grace + Duration::from_secs(10));
    }
}

/// One frozen-leader run; `None` if the standby did not act within
/// 2 LD + 4 RP + 10 s of SIGSTOP (a failed run).
fn frozen(b: &Bench, tool: Tool, t: &Timing, lease: &str) -> Option<Frozen> {
    let (a, s) = b.pair(tool, t, lease);
    let stop = a.signal(libc::SIGSTOP);
    let timeout = t.ld * 2 + t.rp * 4 + Duration::from_secs(10);
    let Some(first) = s.try_wait_act(stop, timeout) else {
        failed(
            &format!("{}: no standby's first act within {timeout:?} of SIGSTOP", s.name),
            &mut [a, s],
            t,
        );
        return None;
    };
    // Frozen for longer than the lease, and past the standby's first act.
    let until = (stop + t.ld + Duration::from_secs(1)).max(first + Duration::from_secs(1));
    if let Ok(d) = until.duration_since(SystemTime::now()) {
        std::thread::sleep(d);
    }
    let cont = a.signal(libc::SIGCONT);
    std::thread::sleep(t.rd + t.grace + Duration::from_secs(2));
    let after: Vec<SystemTime> = a.acts().into_iter().filter(|&at| at >= cont).collect();
    let early: Vec<SystemTime> = a
        .acts()
        .into_iter()
        .filter(|&at| at > stop && at < cont)
        .collect();
    if early.iter().any(|&at| ms_between(stop, at) > 50.0) {
        eprintln!("versus_etcd_election: {}: acts while frozen? {early:?}", a.name);
    }
    let frozen = Frozen {
        frozen_ms: ms_between(stop, cont),
        takeover_ms: ms_between(stop, first),
        acts_after: after.len(),
        acting_ms: after.last().map_or(0.0, |&l| ms_between(cont, l)),
        stopped_ms: a.stopped_after(stop).map(|at| ms_between(cont, at)),
        overlap: a.acts().iter().any(|&at| at >= first),
    };
    release_all(&mut [a, s], t);
    Some(frozen)
}

/// Requests per minute per "Service.Method", of one pair.
type PerMinute = BTreeMap<String, f64>;

/// Requests per minute over `window`, from the members' counters.
fn counted(b: &Bench, window: Duration) -> PerMinute {
    let before = b.grpc_counts();
    std::thread::sleep(window);
    let after = b.grpc_counts();
    let minutes = window.as_secs_f64() / 60.0;
    delta(&before, &after)
        .into_iter()
        .map(|(k, v)| (k, v / minutes))
        .collect()
}

/// A leader and a follower of `tool`, idle for `window`: their requests
/// per minute.
fn idle(b: &Bench, tool: Tool, t: &Timing, window: Duration) -> PerMinute {
    let lease = format!("idle-{}-{}", t.name, tool.short());
    let (a, s) = b.pair(tool, t, &lease);
    // Past the start's own requests (the follower's first reads).
    std::thread::sleep(t.rp * 2);
    let counts = counted(b, window);
    assert!(
        !a.acts().is_empty() && a.stopped_after(UNIX_EPOCH).is_none(),
        "{}: not leading through the idle window; output:\n{}",
        a.name,
        a.output()
    );
    release_all(&mut [a, s], t);
    counts
}

/// One tool's idle CPU with many leases.
struct Cpu {
    /// The process, % of one core, per window.
    percent: Vec<f64>,
    /// The etcd members together, % of one core, per window.
    members: Vec<f64>,
    /// Requests per second to the members, per window.
    requests: Vec<f64>,
    /// Requests per second by gRPC method, over every window.
    by_method: BTreeMap<String, f64>,
    /// Resident memory at the end, MB.
    rss_mb: f64,
    /// From start to leading every lease, s.
    start_s: f64,
}

/// The resident memory of `pid`, MB.
fn rss_mb(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn cpu_windows(b: &Bench, pid: i32, settle: Duration, window: Duration, windows: usize) -> Cpu {
    std::thread::sleep(settle);
    let mut cpu = Cpu {
        percent: Vec::new(),
        members: Vec::new(),
        requests: Vec::new(),
        by_method: BTreeMap::new(),
        rss_mb: 0.0,
        start_s: 0.0,
    };
    for _ in 0..windows {
        let (p0, m0, r0, t0) = (cpu_secs(pid), b.members_cpu(), b.grpc_counts(), Instant::now());
        std::thread::sleep(window);
        let (p1, m1, r1) = (cpu_secs(pid), b.members_cpu(), b.grpc_counts());
        let secs = t0.elapsed().as_secs_f64();
        cpu.percent.push((p1 - p0) / secs * 100.0);
        cpu.members.push((m1 - m0) / secs * 100.0);
        let d = delta(&r0, &r1);
        cpu.requests.push(d.values().sum::<f64>() / secs);
        for (k, v) in d {
            *cpu.by_method.entry(k).or_insert(0.0) += v / secs / windows as f64;
        }
    }
    cpu.rss_mb = rss_mb(pid);
    cpu
}

/// A baton host leading `leases` leases, no plugins.
fn cpu_baton(
    b: &Bench,
    t: &Timing,
    leases: usize,
    settle: Duration,
    window: Duration,
    windows: usize,
) -> Cpu {
    let mut text = b.head(t, "/baton-bench/cpu/");
    for i in 0..leases {
        text.push_str(&format!("\n[[lease]]\nname = \"lease-{i:04}\"\n"));
    }
    let cfg = b.scratch.write("cpu-baton.toml", &text);
    let started = Instant::now();
    let host = Host::start_with_args("baton-cpu", &cfg, &shared_cache_dir(), &[]);
    let deadline = Instant::now() + Duration::from_secs(300);
    while led(&host).len() < leases {
        assert!(
            Instant::now() < deadline,
            "baton-cpu leads {} of {leases} leases after 300 s; output:\n{}",
            led(&host).len(),
            tail(&host.output(), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let start_s = started.elapsed().as_secs_f64();
    let mut cpu = cpu_windows(b, host.pid(), settle, window, windows);
    cpu.start_s = start_s;
    let lost = leases - led(&host).len();
    if lost > 0 {
        eprintln!("versus_etcd_election: baton-cpu lost {lost} leases during the windows");
    }
    let mut p = Proc {
        name: "baton-cpu".into(),
        inner: Inner::Baton(host),
    };
    release_all(std::slice::from_mut(&mut p), t);
    cpu
}

/// One Go process campaigning in `leases` elections (`shared`: on one
/// session).
fn cpu_etcd(
    b: &Bench,
    t: &Timing,
    leases: usize,
    shared: bool,
    settle: Duration,
    window: Duration,
    windows: usize,
) -> Cpu {
    let started = Instant::now();
    let g = GoProc::start(
        &b.elector,
        &[
            format!("-endpoints={}", b.endpoints.join(",")),
            format!(
                "-prefix=/etcd-election/cpu-{}",
                if shared { "shared" } else { "each" }
            ),
            "-identity=etcd-cpu".to_owned(),
            format!("-ttl={}", ms(t.ld)),
            "-act-every=0".to_owned(),
            format!("-elections={leases}"),
            format!("-shared-session={shared}"),
        ],
    );
    let ok = g.try_wait_for(Duration::from_secs(300), &|e| e.event == "leading");
    assert!(
        ok.is_some(),
        "etcd-elector leads not all {leases} elections after 300 s; output:\n{}",
        g.output()
    );
    let start_s = started.elapsed().as_secs_f64();
    let mut cpu = cpu_windows(b, g.child.id() as i32, settle, window, windows);
    cpu.start_s = start_s;
    let mut p = Proc {
        name: "etcd-cpu".into(),
        inner: Inner::Go(g),
    };
    release_all(std::slice::from_mut(&mut p), t);
    cpu
}

// ------------------------------------------------------------ statistics

fn min_max(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

fn secs(ms: f64) -> String {
    if ms.abs() < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

fn count(n: f64) -> String {
    format!("{n:.1}").trim_end_matches(".0").to_owned()
}

fn percent(p: f64) -> String {
    format!("{p:.1} %")
}

fn mmm_with(v: &[f64], f: fn(f64) -> String) -> String {
    let (lo, hi) = min_max(v);
    format!("{} / {} / {}", f(lo), f(median(v)), f(hi))
}

fn ratio(a: f64, b: f64) -> String {
    if b.abs() < 1e-9 {
        if a.abs() < 1e-9 { "=".into() } else { "inf".into() }
    } else {
        format!("{:.3}", a / b)
    }
}

// ------------------------------------------------------------ main

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn number<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` for both tools, `runs` times each, at the same time (one thread
/// per tool) unless BATON_BENCH_SERIAL is set.
fn both<T: Send>(runs: usize, f: &(dyn Fn(Tool, usize) -> T + Sync)) -> BTreeMap<Tool, Vec<T>> {
    let serial = std::env::var_os("BATON_BENCH_SERIAL").is_some_and(|v| v != "0");
    let each = |tool: Tool| (0..runs).map(|i| f(tool, i)).collect::<Vec<T>>();
    if serial {
        [Tool::Baton, Tool::Etcd]
            .into_iter()
            .map(|t| (t, each(t)))
            .collect()
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = [Tool::Baton, Tool::Etcd]
                .into_iter()
                .map(|t| (t, s.spawn(move || each(t))))
                .collect();
            hs.into_iter().map(|(t, h)| (t, h.join().unwrap())).collect()
        })
    }
}

/// The runs that completed, per tool; the failed ones counted in
/// `failures` under `row/tool`.
fn counted_runs<T>(
    row: &str,
    res: BTreeMap<Tool, Vec<Option<T>>>,
    failures: &mut BTreeMap<String, usize>,
) -> BTreeMap<Tool, Vec<T>> {
    res.into_iter()
        .map(|(tool, v)| {
            let n = v.iter().filter(|x| x.is_none()).count();
            if n > 0 {
                failures.insert(format!("{row}/{}", tool.short()), n);
            }
            (tool, v.into_iter().flatten().collect())
        })
        .collect()
}

/// The etcd elector's binary: `BATON_ETCD_ELECTOR`, or built (and cached)
/// by `benches/etcdelection/build.sh`, which prints its path last.
fn build_elector() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_ETCD_ELECTOR") {
        return p.into();
    }
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/etcdelection/build.sh"
    ))
    .stderr(Stdio::inherit())
    .output()
    .expect("run benches/etcdelection/build.sh");
    assert!(out.status.success(), "benches/etcdelection/build.sh failed");
    let path = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(path.lines().last().expect("a path").trim())
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let started = Instant::now();
    let runs: usize = number("BATON_BENCH_RUNS", 8);
    let timings: Vec<Timing> = list("BATON_BENCH_TIMINGS", "fast,default")
        .iter()
        .map(|n| Timing::by_name(n))
        .collect();
    let scenarios = list("BATON_BENCH_SCENARIOS", "graceful,crash,frozen,idle,cpu");
    let has = |s: &str| scenarios.iter().any(|x| x == s);
    let plots = std::env::var_os("BATON_BENCH_PLOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf")));

    let elector = build_elector();
    guest("probe_pollable.wasm");

    eprintln!("versus_etcd_election: starting an etcd cluster of its own (scripts/etcd-testenv.sh start)");
    let cluster = OwnCluster::start();
    let env = cluster.env();
    let bench = Bench {
        endpoints: env.endpoints.clone(),
        cluster,
        elector,
        scratch: Scratch::new(),
    };
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let build = match std::env::var_os("BATON_BIN") {
        Some(bin) => format!("BATON_BIN={}", bin.to_string_lossy()),
        None if cfg!(debug_assertions) => "debug build".to_owned(),
        None => "release build".to_owned(),
    };
    println!(
        "versus_etcd_election: baton ({build}) vs etcd clientv3 3.4.23 concurrency.Election on etcd 3.4.23 (3 members), {runs} runs per row, {date}"
    );

    let mut raw = serde_json::Map::new();
    let mut table = vec![
        "| timings | measure | baton min / median / max | etcd election min / median / max | baton / etcd (medians) |"
            .to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    let mut handover_cols: Vec<(String, &str, Vec<f64>)> = Vec::new();
    let mut frozen_cols: Vec<(String, &str, Vec<f64>)> = Vec::new();
    let mut idle_bars: Vec<(String, &str, f64)> = Vec::new();
    let mut idle_rows: Vec<String> = Vec::new();
    let mut cpu_rows: Vec<String> = Vec::new();
    // Failed runs (the standby never acted), per "timing/scenario/tool".
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    let per_timing = ["graceful", "crash", "frozen", "idle"].iter().any(|s| has(s));
    for t in timings.iter().filter(|_| per_timing) {
        println!("\n== {}", t.label());
        let row_with = |measure: &str, res: &BTreeMap<Tool, Vec<f64>>, f: fn(f64) -> String| {
            let (bv, ev) = (&res[&Tool::Baton], &res[&Tool::Etcd]);
            let (bs, es) = (mmm_with(bv, f), mmm_with(ev, f));
            let r = ratio(median(bv), median(ev));
            println!("{measure:<34} baton {bs:<28} etcd {es:<28} ratio {r}");
            format!("| {} | {measure} | {bs} | {es} | {r} |", t.name)
        };
        let row = |measure: &str, res: &BTreeMap<Tool, Vec<f64>>| row_with(measure, res, secs);
        for (scenario, sig) in [("graceful", libc::SIGTERM), ("crash", libc::SIGKILL)] {
            if !has(scenario) {
                continue;
            }
            let res = counted_runs(
                &format!("{}/{scenario}", t.name),
                both(runs, &|tool, i| {
                    handover(
                        &bench,
                        tool,
                        t,
                        &format!("{scenario}-{}-{}-{i}", t.name, tool.short()),
                        sig,
                    )
                }),
                &mut failures,
            );
            let what = if scenario == "graceful" {
                "graceful: SIGTERM -> standby acts"
            } else {
                "crash: SIGKILL -> standby acts"
            };
            table.push(row(what, &res));
            for (tool, v) in &res {
                raw.insert(format!("{}/{scenario}/{}", t.name, tool.short()), json!(v));
                handover_cols.push((
                    format!("{scenario} {}", t.name),
                    tool.name(),
                    v.iter().map(|x| x / 1000.0).collect(),
                ));
            }
        }
        if has("frozen") {
            let res = counted_runs(
                &format!("{}/frozen", t.name),
                both(runs, &|tool, i| {
                    frozen(
                        &bench,
                        tool,
                        t,
                        &format!("frozen-{}-{}-{i}", t.name, tool.short()),
                    )
                }),
                &mut failures,
            );
            let pick = |f: &dyn Fn(&Frozen) -> f64| -> BTreeMap<Tool, Vec<f64>> {
                res.iter().map(|(k, v)| (*k, v.iter().map(f).collect())).collect()
            };
            table.push(row("frozen: SIGSTOP -> standby acts", &pick(&|f| f.takeover_ms)));
            table.push(row("frozen: acting after SIGCONT", &pick(&|f| f.acting_ms)));
            table.push(row_with(
                "frozen: acts after SIGCONT",
                &pick(&|f| f.acts_after as f64),
                count,
            ));
            let overlaps: BTreeMap<Tool, usize> = res
                .iter()
                .map(|(k, v)| (*k, v.iter().filter(|f| f.overlap).count()))
                .collect();
            let acted: BTreeMap<Tool, usize> = res
                .iter()
                .map(|(k, v)| (*k, v.iter().filter(|f| f.acts_after > 0).count()))
                .collect();
            println!(
                "{:<34} baton {}/{runs} runs   etcd {}/{runs} runs",
                "frozen: acted after SIGCONT",
                acted[&Tool::Baton],
                acted[&Tool::Etcd]
            );
            println!(
                "{:<34} baton {}/{runs} runs   etcd {}/{runs} runs",
                "frozen: overlap",
                overlaps[&Tool::Baton],
                overlaps[&Tool::Etcd]
            );
            table.push(format!(
                "| {} | frozen: runs where the resumed leader acted at all | {} of {runs} | {} of {runs} | |",
                t.name,
                acted[&Tool::Baton],
                acted[&Tool::Etcd]
            ));
            table.push(format!(
                "| {} | frozen: runs where the resumed leader acted while the standby led | {} of {runs} | {} of {runs} | |",
                t.name, overlaps[&Tool::Baton], overlaps[&Tool::Etcd]
            ));
            for (tool, v) in &res {
                let stopped: Vec<String> = v
                    .iter()
                    .map(|f| f.stopped_ms.map_or("-".into(), |s| format!("{s:.0}")))
                    .collect();
                println!(
                    "  {} frozen for (ms): {:?}; task stopped after SIGCONT (ms): {}",
                    tool.name(),
                    v.iter().map(|f| f.frozen_ms.round()).collect::<Vec<_>>(),
                    stopped.join(" ")
                );
                raw.insert(
                    format!("{}/frozen/{}", t.name, tool.short()),
                    json!(
                        v.iter()
                            .map(|f| json!({
                                "frozen_ms": f.frozen_ms, "takeover_ms": f.takeover_ms,
                                "acts_after": f.acts_after, "acting_ms": f.acting_ms,
                                "stopped_ms": f.stopped_ms, "overlap": f.overlap,
                            }))
                            .collect::<Vec<_>>()
                    ),
                );
                frozen_cols.push((
                    t.name.to_owned(),
                    tool.name(),
                    v.iter().map(|f| f.acting_ms / 1000.0).collect(),
                ));
            }
        }
        if has("idle") {
            let window = (t.rp * 30).max(Duration::from_secs(30));
            // Nothing running: what the bench's scrapes themselves count.
            let quiet = counted(&bench, Duration::from_secs(10));
            let quiet_total: f64 = quiet.values().sum();
            println!(
                "idle, requests per minute over {:.0} s, each tool's leader and follower alone on the cluster \
                 (grpc_server_msg_received_total, all members); nothing running: {:.1}",
                window.as_secs_f64(),
                quiet_total.abs()
            );
            let mut per_tool = serde_json::Map::new();
            for tool in [Tool::Baton, Tool::Etcd] {
                let counts = idle(&bench, tool, t, window);
                let total: f64 = counts.values().sum();
                let detail: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
                println!("  {:<14} {total:>7.1}   ({})", tool.name(), detail.join(", "));
                idle_rows.push(format!(
                    "| {} | {} (leader + follower) | {total:.1} | {} |",
                    t.name,
                    tool.name(),
                    detail.join(", ")
                ));
                idle_bars.push((format!("{} {}", t.name, tool.name()), tool.name(), total));
                per_tool.insert(tool.short().to_owned(), json!(counts));
            }
            raw.insert(
                format!("{}/idle", t.name),
                json!({ "window_s": window.as_secs_f64(), "per_minute": per_tool, "quiet_per_minute": quiet }),
            );
        }
    }

    if has("cpu") {
        let t =
            Timing::by_name(&std::env::var("BATON_BENCH_CPU_TIMING").unwrap_or_else(|_| "default".into()));
        let leases: usize = number("BATON_BENCH_LEASES", 1000);
        let settle = Duration::from_secs(number("BATON_BENCH_SETTLE_SECS", 10));
        let window = Duration::from_secs(number("BATON_BENCH_CPU_SECS", 20));
        let windows: usize = number("BATON_BENCH_CPU_WINDOWS", 3);
        println!(
            "\n== idle CPU, one host, {leases} leases, no plugins, {} ({build}); {windows} windows of {} s after {} s",
            t.label(),
            window.as_secs(),
            settle.as_secs()
        );
        let results = [
            ("baton", cpu_baton(&bench, &t, leases, settle, window, windows)),
            (
                "etcd election, a session each",
                cpu_etcd(&bench, &t, leases, false, settle, window, windows),
            ),
            (
                "etcd election, one shared session",
                cpu_etcd(&bench, &t, leases, true, settle, window, windows),
            ),
        ];
        let mut per = serde_json::Map::new();
        for (who, c) in &results {
            let rate = |v: f64| format!("{v:.1}");
            let methods: Vec<String> = c.by_method.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
            println!(
                "  {who:<34} {:<22} etcd members {:<22} requests/s {:<22} rss {:.0} MB, led all after {:.1} s\n  {:<34} requests/s by method: {}",
                mmm_with(&c.percent, percent),
                mmm_with(&c.members, percent),
                mmm_with(&c.requests, rate),
                c.rss_mb,
                c.start_s,
                "",
                methods.join(", ")
            );
            cpu_rows.push(format!(
                "| {who} | {} | {} | {} ({}) | {:.0} MB | {:.1} s |",
                mmm_with(&c.percent, percent),
                mmm_with(&c.members, percent),
                mmm_with(&c.requests, rate),
                methods.join(", "),
                c.rss_mb,
                c.start_s
            ));
            per.insert(
                (*who).to_owned(),
                json!({
                    "cpu_percent": c.percent, "members_cpu_percent": c.members,
                    "requests_per_s": c.requests, "requests_per_s_by_method": c.by_method,
                    "rss_mb": c.rss_mb, "start_s": c.start_s,
                }),
            );
        }
        let (b, e) = (median(&results[0].1.percent), median(&results[1].1.percent));
        println!(
            "  baton / etcd election (a session each), medians: {}",
            ratio(b, e)
        );
        raw.insert(
            "cpu".into(),
            json!({
                "timing": t.name, "leases": leases, "settle_s": settle.as_secs(),
                "window_s": window.as_secs(), "build": build, "per_tool": per,
            }),
        );
    }
    drop(bench);

    let took = started.elapsed();
    println!(
        "\nMarkdown ({runs} runs per row, {date}, {build}, took {:.1} min):\n",
        took.as_secs_f64() / 60.0
    );
    if table.len() > 2 {
        println!("{}", table.join("\n"));
    }
    if !failures.is_empty() {
        println!(
            "\nFAILED runs (the standby did not act in time; left out of the figures above): {failures:?}"
        );
    }
    if !idle_rows.is_empty() {
        println!("\n| timings | processes | requests / min | by gRPC method |\n|---|---|---|---|");
        println!("{}", idle_rows.join("\n"));
    }
    if !cpu_rows.is_empty() {
        println!(
            "\n| 1 host, idle | CPU, % of a core (min / median / max) | etcd members' CPU | requests / s | resident | leading all after |\n|---|---|---|---|---|---|"
        );
        println!("{}", cpu_rows.join("\n"));
    }

    std::fs::create_dir_all(&plots).unwrap();
    raw.insert("runs".into(), json!(runs));
    raw.insert("failed_runs".into(), json!(failures));
    raw.insert("date".into(), json!(date));
    raw.insert("build".into(), json!(build));
    raw.insert("took_s".into(), json!(took.as_secs()));
    std::fs::write(
        plots.join("versus-etcd-election.json"),
        serde_json::to_string_pretty(&Value::Object(raw)).unwrap() + "\n",
    )
    .unwrap();
    if !handover_cols.is_empty() {
        plot::strips(
            &plots.join("versus-etcd-election-handover.svg"),
            &format!("Hand-over on etcd: signal to the standby's first act ({runs} runs each; bar: median)"),
            "seconds (log scale)",
            &handover_cols,
            true,
        )
        .unwrap();
    }
    if !frozen_cols.is_empty() {
        plot::strips(
            &plots.join("versus-etcd-election-frozen.svg"),
            &format!("Frozen past its lease: acting after SIGCONT ({runs} runs each)"),
            "seconds from SIGCONT to its last act",
            &frozen_cols,
            false,
        )
        .unwrap();
    }
    if !idle_bars.is_empty() {
        plot::bars(
            &plots.join("versus-etcd-election-idle.svg"),
            "Idle, a leader and a follower: requests per minute to etcd",
            "requests / minute",
            &idle_bars,
        )
        .unwrap();
    }
    println!("\nwrote {}/versus-etcd-election*.{{json,svg}}", plots.display());
}
