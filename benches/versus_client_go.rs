//! baton against client-go's `tools/leaderelection`, side by side on one
//! real kube-apiserver (v1.20.2, started by `scripts/kube-testenv.sh` for
//! this bench alone, with an audit log), in the same run, at the same
//! timings:
//!
//! - baton: a real `baton run` process on the Kubernetes store with the
//!   pollable Rust probe (`probe_pollable.wasm`), which prints a line at
//!   once and then every 100 ms while it leads: an *act* is one such line,
//!   timed by the host's JSON log;
//! - client-go: `benches/clientgo/main.go` (client-go 1.20.2 from the
//!   Kubernetes source tarball the test server is built from, built offline
//!   by `benches/clientgo/build.sh` into `$BATON_CACHE/kube/clientgo-elector`
//!   and rebuilt only when its source changes): a `LeaseLock`,
//!   `ReleaseOnCancel`, cancelled by SIGTERM, acting every 100 ms while it
//!   leads and printing wall-clock timestamps.
//!
//! Timing sets (`BATON_BENCH_TIMINGS`, default `fast,default`):
//! - `default`: client-go's defaults, lease 15 s, renew deadline 10 s, retry
//!   period 2 s; baton's grace 1 s (10 s + 1 s + 800 ms margin < 15 s);
//! - `fast`: lease 4 s, renew deadline 3 s, retry 500 ms; baton's grace
//!   500 ms (3 s + 500 ms + 250 ms margin < 4 s).
//!
//! baton's request timeout is its default, min(RP, RD / 2). Scenarios
//! (`BATON_BENCH_SCENARIOS`, default `graceful,crash,frozen,idle`), each
//! run `BATON_BENCH_RUNS` times (default 8) with a fresh leader, standby
//! and Lease per run; the two tools' runs go at the same time, one thread
//! each (`BATON_BENCH_SERIAL=1`: one tool after the other):
//!
//! - `graceful`: SIGTERM the leader -> the standby's first act;
//! - `crash`: SIGKILL the leader -> the standby's first act;
//! - `frozen`: SIGSTOP the leader, wait for the standby's first act and
//!   until the leader has been frozen for longer than the lease, then
//!   SIGCONT; for RD + grace + 2 s after, count the old leader's acts:
//!   how long it kept acting after it resumed, and whether it acted while
//!   the standby led (overlap);
//! - `idle`: a leader and a follower of each tool, all four at once, for
//!   30 retry periods (at least 30 s); requests per minute of each, from
//!   the API server's audit log (Leases and ConfigMaps, attributed by user
//!   for baton and by user agent for client-go).
//!
//! Hand-overs are timed from the moment the bench signals the leader to
//! the standby's first act, both wall-clock times on this machine.
//!
//! Prints min / median / max per tool and the ratio of the medians
//! (baton / client-go), a Markdown table of the same, writes the raw runs
//! as JSON and the plots as SVG (`benches/plot.rs`) into
//! `BATON_BENCH_PLOTS` (default `docs/perf/`).
//!
//! Run: `scripts/bench.sh --bench versus_client_go` (13.5 minutes with both
//! timing sets and 8 runs on a 2-core machine, `BATON_BENCH_TIMINGS=fast`
//! about 4; plus about 90 s the first time, to build the Go program). The
//! Kubernetes test server must be installed (`scripts/kube-testenv.sh
//! install`); the bench starts and stops a server of its own.
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/kube/env.rs"]
#[allow(dead_code)]
mod env;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::rbac::v1::Role;
use serde_json::{Value, json};

use env::{KubeEnv, OwnServer, TestNamespace};
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
            "{} (lease {}, renew {}, retry {}; baton grace {})",
            self.name,
            humantime::format_duration(self.ld),
            humantime::format_duration(self.rd),
            humantime::format_duration(self.rp),
            humantime::format_duration(self.grace)
        )
    }
}

// ------------------------------------------------------------ the tools

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Baton,
    ClientGo,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Baton => "baton",
            Tool::ClientGo => "client-go",
        }
    }
}

/// One event of the client-go elector (a line of its stdout).
#[derive(Clone)]
struct GoEvent {
    event: String,
    leader: String,
    at: SystemTime,
}

type GoLog = Arc<(Mutex<Vec<GoEvent>>, Condvar)>;

/// A running client-go elector.
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
            .expect("start clientgo-elector");
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
                stderr2.lock().unwrap().push(line);
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
    /// stopped"; client-go: OnStoppedLeading), the first at or after `after`.
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
        let found = match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| e.at >= after && is_act(e))
                .map(|e| e.at),
            Inner::Go(g) => g
                .try_wait_for(timeout, &|e| e.at >= after && e.event == "act")
                .map(|e| e.at),
        };
        found.unwrap_or_else(|| {
            panic!(
                "{}: no {what} within {timeout:?}; output:\n{}",
                self.name,
                self.output()
            )
        })
    }

    /// Until it follows another leader.
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
            Inner::Go(g) => {
                let events: Vec<String> = g
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
                    tail(&g.stderr.lock().unwrap().join("\n"), 40),
                    events.join("\n")
                )
            }
        }
    }
}

/// What every run needs: the server, the namespace, the binaries.
struct Bench {
    env: KubeEnv,
    ns: String,
    clientgo: PathBuf,
    scratch: Scratch,
}

impl Bench {
    /// Starts `tool`'s elector for `lease` as `who` ("a" or "b": baton runs
    /// as token user baton-a or baton-b, with baton's deploy Role in the
    /// namespace; client-go as the admin, with user agent
    /// clientgo-elector/<identity>).
    fn spawn(&self, tool: Tool, t: &Timing, lease: &str, who: &str) -> Proc {
        let name = format!("{}-{lease}-{who}", tool.name());
        let inner = match tool {
            Tool::Baton => {
                let text = format!(
                    "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\n\n[defaults]\nlease-duration = \"{}\"\n\
                     renew-deadline = \"{}\"\nretry-period = \"{}\"\ngrace = \"{}\"\n\n[[lease]]\nname = {lease:?}\n\n\
                     [[plugin]]\nname = \"probe\"\npath = {:?}\nlease = {lease:?}\n\
                     env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"100\" }}\n",
                    self.ns,
                    ms(t.ld),
                    ms(t.rd),
                    ms(t.rp),
                    ms(t.grace),
                    guest("probe_pollable.wasm").display().to_string()
                );
                let cfg = self.scratch.write(&format!("{name}.toml"), &text);
                let kc = self.env.kubeconfig(&format!("baton-{who}"));
                Inner::Baton(Host::start_with_args(
                    &name,
                    &cfg,
                    &shared_cache_dir(),
                    &[OsStr::new("--kubeconfig"), kc.as_os_str()],
                ))
            }
            Tool::ClientGo => Inner::Go(GoProc::start(
                &self.clientgo,
                &[
                    format!("-kubeconfig={}", self.env.admin_kubeconfig.display()),
                    format!("-namespace={}", self.ns),
                    format!("-lease={lease}"),
                    format!("-identity={name}"),
                    format!("-lease-duration={}", ms(t.ld)),
                    format!("-renew-deadline={}", ms(t.rd)),
                    format!("-retry-period={}", ms(t.rp)),
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

fn handover(b: &Bench, tool: Tool, t: &Timing, lease: &str, sig: i32) -> f64 {
    let (mut a, s) = b.pair(tool, t, lease);
    let stopped = a.signal(sig);
    let first = s.wait_act(
        stopped,
        t.ld * 2 + t.rp * 4 + Duration::from_secs(10),
        "standby's first act",
    );
    a.wait_exit(t.rd + t.grace + Duration::from_secs(10));
    let late = a.acts().iter().filter(|&&at| at >= first).count();
    if late > 0 {
        eprintln!(
            "versus_client_go: {} acted {late} times after the standby's first act (signal {sig})",
            a.name
        );
    }
    release_all(&mut [s], t);
    ms_between(stopped, first)
}

/// Stops each process with SIGTERM and waits for it to exit, so that it
/// releases its lease. Killed, a leader's Lease would stay held, listing
/// the plugin "probe", and every later host of another lease with the
/// same plugin would wait for it to expire, a lease duration from when it
/// first saw it, before starting its task (the claims of
/// docs/architecture.md): 4 s in every later run.
fn release_all(procs: &mut [Proc], t: &Timing) {
    for p in procs.iter() {
        p.signal(libc::SIGTERM);
    }
    for p in procs.iter_mut() {
        p.wait_exit(t.rd + t.grace + Duration::from_secs(10));
    }
}

fn frozen(b: &Bench, tool: Tool, t: &Timing, lease: &str) -> Frozen {
    let (a, s) = b.pair(tool, t, lease);
    let stop = a.signal(libc::SIGSTOP);
    let first = s.wait_act(
        stop,
        t.ld * 2 + t.rp * 4 + Duration::from_secs(10),
        "standby's first act",
    );
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
        eprintln!("versus_client_go: {}: acts while frozen? {early:?}", a.name);
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
    frozen
}

/// Requests per minute, per process and per "resource verb".
type Idle = BTreeMap<String, BTreeMap<String, f64>>;

fn idle(b: &Bench, t: &Timing, audit: &Path) -> (Idle, f64) {
    let lb = format!("idle-baton-{}", t.name);
    let lc = format!("idle-clientgo-{}", t.name);
    let (ba, bb) = b.pair(Tool::Baton, t, &lb);
    let (ca, cb) = b.pair(Tool::ClientGo, t, &lc);
    let window = (t.rp * 30).max(Duration::from_secs(30));
    std::thread::sleep(t.rp * 2);
    let t0 = SystemTime::now();
    std::thread::sleep(window);
    let t1 = SystemTime::now();
    std::thread::sleep(Duration::from_secs(1));
    let who: BTreeMap<String, String> = [
        ("user baton-a".to_owned(), "baton leader".to_owned()),
        ("user baton-b".to_owned(), "baton follower".to_owned()),
        (
            format!("agent clientgo-elector/{}", ca.name),
            "client-go leader".to_owned(),
        ),
        (
            format!("agent clientgo-elector/{}", cb.name),
            "client-go follower".to_owned(),
        ),
    ]
    .into();
    let text = std::fs::read_to_string(audit).unwrap();
    let mut seen = BTreeSet::new();
    let mut counts: Idle = who.values().map(|w| (w.clone(), BTreeMap::new())).collect();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(at) = v["requestReceivedTimestamp"]
            .as_str()
            .and_then(|s| humantime::parse_rfc3339(s).ok())
        else {
            continue;
        };
        if at < t0 || at >= t1 || !seen.insert(v["auditID"].as_str().unwrap_or("").to_owned()) {
            continue;
        }
        let agent = v["userAgent"].as_str().unwrap_or("");
        let key = if agent.starts_with("clientgo-elector/") {
            format!("agent {agent}")
        } else {
            format!("user {}", v["user"]["username"].as_str().unwrap_or(""))
        };
        let Some(w) = who.get(&key) else { continue };
        let what = format!(
            "{} {}",
            v["verb"].as_str().unwrap_or("?"),
            v["objectRef"]["resource"].as_str().unwrap_or("?")
        );
        *counts.get_mut(w).unwrap().entry(what).or_insert(0.0) += 1.0;
    }
    let minutes = window.as_secs_f64() / 60.0;
    for per in counts.values_mut() {
        for n in per.values_mut() {
            *n /= minutes;
        }
    }
    release_all(&mut [ba, bb, ca, cb], t);
    (counts, window.as_secs_f64())
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
        format!("{:.0} ms", ms)
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

fn count(n: f64) -> String {
    format!("{n:.1}").trim_end_matches(".0").to_owned()
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

// ------------------------------------------------------------ plots

// benches/plot.rs, shared by the benches (each uses part of it).
#[path = "clientgo.rs"]
mod clientgo;

#[path = "plot.rs"]
#[allow(dead_code)]
mod plot;

// ------------------------------------------------------------ main

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Runs `f` for both tools, `runs` times each, at the same time (one thread
/// per tool) unless BATON_BENCH_SERIAL is set.
fn both<T: Send>(runs: usize, f: &(dyn Fn(Tool, usize) -> T + Sync)) -> BTreeMap<Tool, Vec<T>> {
    let serial = std::env::var_os("BATON_BENCH_SERIAL").is_some_and(|v| v != "0");
    let each = |tool: Tool| (0..runs).map(|i| f(tool, i)).collect::<Vec<T>>();
    if serial {
        [Tool::Baton, Tool::ClientGo]
            .into_iter()
            .map(|t| (t, each(t)))
            .collect()
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = [Tool::Baton, Tool::ClientGo]
                .into_iter()
                .map(|t| (t, s.spawn(move || each(t))))
                .collect();
            hs.into_iter().map(|(t, h)| (t, h.join().unwrap())).collect()
        })
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let started = Instant::now();
    let runs: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8);
    let timings: Vec<Timing> = list("BATON_BENCH_TIMINGS", "fast,default")
        .iter()
        .map(|n| match n.as_str() {
            "fast" => FAST,
            "default" => DEFAULT,
            other => panic!("BATON_BENCH_TIMINGS: unknown timing set {other:?} (fast, default)"),
        })
        .collect();
    let scenarios = list("BATON_BENCH_SCENARIOS", "graceful,crash,frozen,idle");
    let plots = std::env::var_os("BATON_BENCH_PLOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf")));

    let clientgo = clientgo::build();
    guest("probe_pollable.wasm");

    // The API server of this bench, with an audit log of every request on
    // Leases and ConfigMaps.
    let files = tempfile::tempdir().unwrap();
    let policy = files.path().join("audit-policy.yaml");
    let audit = files.path().join("audit.log");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
         - level: Metadata\n  resources:\n  - group: coordination.k8s.io\n    resources: [\"leases\"]\n\
         \x20 - group: \"\"\n    resources: [\"configmaps\"]\n- level: None\n",
    )
    .unwrap();
    eprintln!("versus_client_go: starting an API server of its own (scripts/kube-testenv.sh start)");
    let server = OwnServer::start(&format!(
        "--audit-policy-file={} --audit-log-path={} --audit-log-mode=blocking",
        policy.display(),
        audit.display()
    ));
    let env = server.env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin, "versus"));
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    for user in ["baton-a", "baton-b"] {
        let mut r = role.clone();
        r.metadata.name = Some(format!("baton-{user}"));
        rt.block_on(ns.bind(r, user));
    }
    let bench = Bench {
        env,
        ns: ns.name.clone(),
        clientgo,
        scratch: Scratch::new(),
    };
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    println!(
        "versus_client_go: baton vs client-go 1.20.2 leaderelection on kube-apiserver 1.20.2, {runs} runs per row, {date}"
    );

    let mut raw = serde_json::Map::new();
    let mut table = vec![
        "| timings | measure | baton min / median / max | client-go min / median / max | baton / client-go (medians) |"
            .to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    let mut handover_cols: Vec<(String, &str, Vec<f64>)> = Vec::new();
    let mut frozen_cols: Vec<(String, &str, Vec<f64>)> = Vec::new();
    let mut idle_bars: Vec<(String, &str, f64)> = Vec::new();
    let mut idle_rows: Vec<String> = Vec::new();
    for t in &timings {
        println!("\n== {}", t.label());
        let row_with = |measure: &str, res: &BTreeMap<Tool, Vec<f64>>, f: fn(f64) -> String| {
            let (bv, cv) = (&res[&Tool::Baton], &res[&Tool::ClientGo]);
            let (bs, cs) = (mmm_with(bv, f), mmm_with(cv, f));
            let r = ratio(median(bv), median(cv));
            println!("{measure:<34} baton {bs:<28} client-go {cs:<28} ratio {r}");
            format!("| {} | {measure} | {bs} | {cs} | {r} |", t.name)
        };
        let row = |measure: &str, res: &BTreeMap<Tool, Vec<f64>>| row_with(measure, res, secs);
        for (scenario, sig) in [("graceful", libc::SIGTERM), ("crash", libc::SIGKILL)] {
            if !scenarios.iter().any(|s| s == scenario) {
                continue;
            }
            let res = both(runs, &|tool, i| {
                handover(
                    &bench,
                    tool,
                    t,
                    &format!("{scenario}-{}-{}-{i}", t.name, tool.name()).replace("client-go", "cg"),
                    sig,
                )
            });
            let what = if scenario == "graceful" {
                "graceful: SIGTERM -> standby acts"
            } else {
                "crash: SIGKILL -> standby acts"
            };
            table.push(row(what, &res));
            for (tool, v) in &res {
                raw.insert(format!("{}/{scenario}/{}", t.name, tool.name()), json!(v));
                handover_cols.push((
                    format!("{scenario} {}", t.name),
                    tool.name(),
                    v.iter().map(|x| x / 1000.0).collect(),
                ));
            }
        }
        if scenarios.iter().any(|s| s == "frozen") {
            let res = both(runs, &|tool, i| {
                frozen(
                    &bench,
                    tool,
                    t,
                    &format!("frozen-{}-{}-{i}", t.name, tool.name()).replace("client-go", "cg"),
                )
            });
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
            println!(
                "{:<28} baton {}/{runs} runs   client-go {}/{runs} runs",
                "frozen: overlap",
                overlaps[&Tool::Baton],
                overlaps[&Tool::ClientGo]
            );
            table.push(format!(
                "| {} | frozen: runs where the resumed leader acted while the standby led | {} of {runs} | {} of {runs} | |",
                t.name, overlaps[&Tool::Baton], overlaps[&Tool::ClientGo]
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
                    format!("{}/frozen/{}", t.name, tool.name()),
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
        if scenarios.iter().any(|s| s == "idle") {
            let (counts, window) = idle(&bench, t, &audit);
            println!("idle, requests per minute over {window:.0} s:");
            for (who, per) in &counts {
                let total: f64 = per.values().sum();
                let detail: Vec<String> = per.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
                println!("  {who:<20} {total:>7.1}   ({})", detail.join(", "));
                idle_rows.push(format!(
                    "| {} | {who} | {total:.1} | {} |",
                    t.name,
                    detail.join(", ")
                ));
                let tool = if who.starts_with("baton") {
                    "baton"
                } else {
                    "client-go"
                };
                idle_bars.push((format!("{} {}", t.name, who), tool, total));
            }
            raw.insert(
                format!("{}/idle", t.name),
                json!({ "window_s": window, "per_minute": counts }),
            );
        }
    }
    drop(bench);
    drop(ns);
    drop(rt);
    drop(server);

    let took = started.elapsed();
    println!(
        "\nMarkdown ({runs} runs per row, {date}, took {:.1} min):\n",
        took.as_secs_f64() / 60.0
    );
    println!("{}", table.join("\n"));
    if !idle_rows.is_empty() {
        println!("\n| timings | process | requests / min | by verb and resource |\n|---|---|---|---|");
        println!("{}", idle_rows.join("\n"));
    }

    std::fs::create_dir_all(&plots).unwrap();
    raw.insert("runs".into(), json!(runs));
    raw.insert("date".into(), json!(date));
    raw.insert("took_s".into(), json!(took.as_secs()));
    std::fs::write(
        plots.join("versus-client-go.json"),
        serde_json::to_string_pretty(&Value::Object(raw)).unwrap() + "\n",
    )
    .unwrap();
    if !handover_cols.is_empty() {
        plot::strips(
            &plots.join("versus-client-go-handover.svg"),
            &format!("Hand-over: signal to the standby's first act ({runs} runs each; bar: median)"),
            "seconds (log scale)",
            &handover_cols,
            true,
        )
        .unwrap();
    }
    if !frozen_cols.is_empty() {
        plot::strips(
            &plots.join("versus-client-go-frozen.svg"),
            &format!("Frozen past its lease: acting after SIGCONT ({runs} runs each)"),
            "seconds from SIGCONT to its last act",
            &frozen_cols,
            false,
        )
        .unwrap();
    }
    if !idle_bars.is_empty() {
        plot::bars(
            &plots.join("versus-client-go-idle.svg"),
            "Idle: requests per minute to the API server",
            "requests / minute",
            &idle_bars,
        )
        .unwrap();
    }
    println!("\nwrote {}/versus-client-go*.{{json,svg}}", plots.display());
}
