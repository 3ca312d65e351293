//! baton on PostgreSQL against a session advisory lock, side by side on one
//! real PostgreSQL 15 of the bench's own (`scripts/pg-testenv.sh start`
//! under an env file of its own: a primary, its async standby and
//! pgbouncer; only the primary is used, directly), in the same run, at the
//! same timings:
//!
//! - baton: real `baton run` processes on the postgres store (`[store]
//!   kind = "postgres"`, the primary's URL, a schema per scenario) with the
//!   pollable Rust probe (`probe_pollable.wasm`), which prints a line at
//!   once and then every 100 ms while it leads: an *act* is one such line,
//!   timed by the host's JSON log. A release build: `BATON_BIN`, else the
//!   bench's own `baton` when the bench is built in release, else
//!   `$CARGO_TARGET_DIR/release/baton` (`cargo build --release -p baton`;
//!   the bench warns when a source of the host is newer).
//! - advisory lock: an elector written the way common libraries do it, in
//!   this file (the bench binary re-executes itself with `advisory-elector`):
//!   one connection (tokio-postgres, no pool), `SELECT
//!   pg_try_advisory_lock(key)` every retry period until it returns true;
//!   then it leads, acting every 100 ms, for as long as its session lasts:
//!   it learns of a loss only when its connection ends. On SIGTERM or
//!   SIGINT it stops acting, `pg_advisory_unlock`s and closes the
//!   connection. It prints wall-clock timestamps as JSON lines.
//!
//! Timing sets (`BATON_BENCH_TIMINGS`, default `fast,default`): `default`,
//! baton's defaults (lease 15 s, renew deadline 10 s, retry period 2 s,
//! grace 1 s); `fast`, lease 4 s, renew 3 s, retry 500 ms, grace 500 ms.
//! The advisory lock has only the retry period (its standby's polling);
//! the lease is the session.
//!
//! Scenarios (`BATON_BENCH_SCENARIOS`, default
//! `graceful,crash,blackhole,idle,cpu,buckets`). The hand-overs run
//! `BATON_BENCH_RUNS` times (default 5; `blackhole`
//! `BATON_BENCH_BLACKHOLE_RUNS`, default 3) per timing set with a fresh
//! leader, standby and lease (baton: a lease name; the lock: a key) per run;
//! the two tools' runs go at the same time, one thread each
//! (`BATON_BENCH_SERIAL=1`: one after the other). Each run's fault comes 2
//! to 3 retry periods (at random) after the standby follows, so at any
//! point of the leader's renewals and of the standby's tries:
//!
//! - `graceful`: SIGTERM the leader -> the standby's first act;
//! - `crash`: SIGKILL the leader -> the standby's first act;
//! - `blackhole`: the leader reaches PostgreSQL through a TCP proxy
//!   (`tests/kube/blackhole.rs`) that is cut: it holds every byte both ways
//!   and closes nothing, so neither end sees the connection end (the
//!   standby connects directly). baton: the cut -> the old leader's task
//!   stopped (its renew deadline), the cut -> the standby's first act, and
//!   the old leader's acts at or after the standby's first act (overlap:
//!   there must be none). The lock: for a lease duration + 2 retry periods
//!   after the cut, whether the lock moves (the server's session is alive:
//!   it does not) and whether the old holder stops acting (it does not);
//!   then the server ends the holder's session (`pg_terminate_backend`,
//!   what its TCP keepalive or an administrator would do, the only way the
//!   lock moves): to the standby's first act, and the old holder's acts at
//!   or after it over 2 s, while it is still cut off (overlap); then the
//!   proxy is restored: to the old holder's "stopped".
//! - `idle`: a leader and a follower of baton with 1 lease, then with 100
//!   (spread over the two), then an advisory-lock leader and standby, each
//!   alone on the server, idle for `BATON_BENCH_IDLE_SECS` (default 30 s)
//!   at `BATON_BENCH_IDLE_TIMING` (default `default`): the statements they
//!   ran, per minute and per lease per minute, counted from the primary's
//!   log (`log_statement = 'all'` for the idle part only: every
//!   statement of role baton in database baton, by what it is; a statement
//!   of the extended protocol is logged once, at its execution; the
//!   bench's own reads are in database `postgres`). Beside them,
//!   `pg_stat_database`'s `xact_commit + xact_rollback`, which
//!   PostgreSQL 15 undercounts: a backend whose transactions touched no
//!   table (an advisory lock's try, a `LISTEN`) flushes its counts only
//!   with other statistics, or at exit. A window with nothing running comes
//!   first.
//! - `cpu`: one `baton run` host leading 1,000 leases
//!   (`BATON_BENCH_LEASES`), no plugins, no standby, default timings: from
//!   the moment it leads them all, `BATON_BENCH_SETTLE_SECS` (default 10),
//!   then one window of `BATON_BENCH_CPU_SECS` (default 60): its utime +
//!   stime from `/proc/PID/stat` in % of one core, the PostgreSQL
//!   processes' (those in `pg_stat_activity`), and the transactions per
//!   lease per minute from `pg_stat_database` (nothing logged: a baton
//!   renewal writes a table, so these counts keep up, as the idle part's
//!   two columns show).
//! - `buckets`: a fenced write in-process through the `BucketStore` API,
//!   `apply` of a `Write` with one `Op::Set` of 100 bytes to one of 100
//!   keys, `BATON_BENCH_OPS` (default 500) after 20 unmeasured, one at a
//!   time: `PostgresStore::buckets()` (through its pool, on the primary)
//!   against `EmbeddedBuckets` (SQLite in a temporary folder): median,
//!   p99, max. This part runs in the bench's own build (the dev profile
//!   unless `BATON_BENCH_PROFILE=release`).
//!
//! A run whose standby does not act in time is a failure: the bench says
//! so, writes both processes' output to the temporary folder
//! (`versus-advisory-lock-<leader>.log`), leaves it out and counts it.
//! Prints every figure; asserts none.
//!
//! Run: `cargo build --release -p baton && scripts/bench.sh --bench
//! versus_advisory_lock` (about 8 minutes on 2 cores). Needs Debian's
//! postgresql-15 (`scripts/pg-testenv.sh install`).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/postgres/env.rs"]
#[allow(dead_code)]
mod env;

#[path = "../tests/kube/blackhole.rs"]
#[allow(dead_code)]
mod blackhole;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton::store::buckets::{BucketName, BucketStore, Limits, Op, Write};
use baton::store::embedded::buckets::EmbeddedBuckets;
use baton::store::postgres::{PostgresOptions, PostgresStore};
use serde_json::Value;

use blackhole::BlackHole;
use env::{OwnServer, PgEnv};
use support::*;

/// The first argument that makes the bench binary the advisory-lock
/// elector.
const ELECTOR_ARG: &str = "advisory-elector";

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
    fn by_name(name: &str) -> Timing {
        match name {
            "fast" => FAST,
            "default" => DEFAULT,
            other => panic!("unknown timing set {other:?} (fast, default)"),
        }
    }

    fn label(&self) -> String {
        format!(
            "{} (baton: lease {}, renew {}, retry {}, grace {}; advisory lock: retry {})",
            self.name,
            humantime::format_duration(self.ld),
            humantime::format_duration(self.rd),
            humantime::format_duration(self.rp),
            humantime::format_duration(self.grace),
            humantime::format_duration(self.rp),
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Baton,
    Lock,
}

impl Tool {
    fn short(self) -> &'static str {
        match self {
            Tool::Baton => "baton",
            Tool::Lock => "lock",
        }
    }
}

// ------------------------------------------------------------ the elector

/// The advisory-lock elector (the bench binary run with `advisory-elector
/// --url=U --key=K --retry-ms=R --act-ms=A`).
mod elector {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use tokio::signal::unix::{SignalKind, signal};
    use tokio::sync::oneshot;

    fn say(event: &str, detail: &str) {
        use std::io::Write;
        let us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let line = serde_json::json!({ "event": event, "detail": detail, "us": us as u64 });
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    pub fn main(args: &[String]) {
        let opt = |name: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("--{name}=")))
                .unwrap_or_else(|| panic!("advisory-elector: --{name}= missing"))
                .to_owned()
        };
        let url = opt("url");
        let key: i64 = opt("key").parse().expect("--key: a number");
        let retry = Duration::from_millis(opt("retry-ms").parse().expect("--retry-ms"));
        let act = Duration::from_millis(opt("act-ms").parse().expect("--act-ms"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(&url, key, retry, act));
    }

    async fn run(url: &str, key: i64, retry: Duration, act: Duration) {
        let mut term = signal(SignalKind::terminate()).unwrap();
        let mut int = signal(SignalKind::interrupt()).unwrap();
        loop {
            let (client, connection) = match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
                Ok(c) => c,
                Err(e) => {
                    say("error", &format!("connect: {e}"));
                    tokio::select! {
                        () = tokio::time::sleep(retry) => continue,
                        _ = term.recv() => return say("exit", "SIGTERM"),
                        _ = int.recv() => return say("exit", "SIGINT"),
                    }
                }
            };
            // The connection's end (an error, or the server closing it) is
            // the only way a holder learns that its lock is gone.
            let (lost_tx, mut lost) = oneshot::channel::<String>();
            tokio::spawn(async move {
                let why = match connection.await {
                    Ok(()) => "connection closed".to_owned(),
                    Err(e) => e.to_string(),
                };
                let _ = lost_tx.send(why);
            });
            // A candidate: try the lock every retry period.
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
            let mut following = false;
            let leading = loop {
                let tried = tokio::select! {
                    r = client.query_one("SELECT pg_try_advisory_lock($1)", &params) => r,
                    _ = term.recv() => return say("exit", "SIGTERM"),
                    _ = int.recv() => return say("exit", "SIGINT"),
                };
                match tried {
                    Ok(row) if row.get::<_, bool>(0) => break true,
                    Ok(_) if !following => {
                        following = true;
                        say("candidate", "");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        say("error", &format!("try lock: {e}"));
                        break false;
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    why = &mut lost => {
                        say("error", &why.unwrap_or_default());
                        break false;
                    }
                    _ = term.recv() => return say("exit", "SIGTERM"),
                    _ = int.recv() => return say("exit", "SIGINT"),
                }
            };
            if !leading {
                tokio::time::sleep(retry).await;
                continue;
            }
            say("leading", "");
            let mut tick = tokio::time::interval(act);
            let by = loop {
                tokio::select! {
                    _ = tick.tick() => say("act", ""),
                    why = &mut lost => {
                        say("stopped", &why.unwrap_or_default());
                        break None;
                    }
                    _ = term.recv() => break Some("SIGTERM"),
                    _ = int.recv() => break Some("SIGINT"),
                }
            };
            let Some(by) = by else {
                // Lost with the connection: a candidate again, on a new one.
                continue;
            };
            say("stopped", by);
            let unlock = client.execute("SELECT pg_advisory_unlock($1)", &params);
            match tokio::time::timeout(Duration::from_secs(2), unlock).await {
                Ok(Ok(_)) => say("released", ""),
                Ok(Err(e)) => say("error", &format!("unlock: {e}")),
                Err(_) => say("error", "unlock: timed out"),
            }
            drop(client);
            return say("exit", by);
        }
    }
}

/// One event of an advisory-lock elector (a line of its stdout).
#[derive(Clone)]
struct LockEvent {
    event: String,
    detail: String,
    at: SystemTime,
}

type LockLog = Arc<(Mutex<Vec<LockEvent>>, Condvar)>;

/// A running advisory-lock elector.
struct LockProc {
    child: Child,
    log: LockLog,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl LockProc {
    fn start(args: &[String]) -> LockProc {
        let mut child = Command::new(std::env::current_exe().expect("the bench binary"))
            .arg(ELECTOR_ARG)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the advisory-lock elector");
        let log: LockLog = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let (stdout, log2) = (child.stdout.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let (events, cv) = &*log2;
                events.lock().unwrap().push(LockEvent {
                    event: v["event"].as_str().unwrap_or("").to_owned(),
                    detail: v["detail"].as_str().unwrap_or("").to_owned(),
                    at: UNIX_EPOCH + Duration::from_micros(v["us"].as_u64().unwrap_or(0)),
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
        LockProc { child, log, stderr }
    }

    fn events(&self) -> Vec<LockEvent> {
        self.log.0.lock().unwrap().clone()
    }

    fn try_wait_for(&self, timeout: Duration, pred: &dyn Fn(&LockEvent) -> bool) -> Option<LockEvent> {
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
            .events()
            .iter()
            .filter(|e| e.event != "act")
            .map(|e| {
                format!(
                    "{} {} {}",
                    humantime::format_rfc3339_micros(e.at),
                    e.event,
                    e.detail
                )
            })
            .collect();
        format!(
            "{}\n{}",
            self.stderr.lock().unwrap().join("\n"),
            events.join("\n")
        )
    }
}

impl Drop for LockProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ either tool

enum Inner {
    Baton(Host),
    Lock(LockProc),
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
            Inner::Lock(l) => l.child.id() as i32,
        }
    }

    fn acts(&self) -> Vec<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h.all(is_act).iter().map(|e| e.at).collect(),
            Inner::Lock(l) => l
                .events()
                .iter()
                .filter(|e| e.event == "act")
                .map(|e| e.at)
                .collect(),
        }
    }

    /// When it stopped leading (baton: its task stopped; the lock: the
    /// elector's "stopped"), the first at or after `after`, waiting up to
    /// `timeout`.
    fn wait_stopped(&self, after: SystemTime, timeout: Duration) -> Option<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| {
                    e.at >= after && e.is("leader task stopped", Some("probe"))
                })
                .map(|e| e.at),
            Inner::Lock(l) => l
                .try_wait_for(timeout, &|e| e.at >= after && e.event == "stopped")
                .map(|e| e.at),
        }
    }

    fn try_wait_act(&self, after: SystemTime, timeout: Duration) -> Option<SystemTime> {
        match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| e.at >= after && is_act(e))
                .map(|e| e.at),
            Inner::Lock(l) => l
                .try_wait_for(timeout, &|e| e.at >= after && e.event == "act")
                .map(|e| e.at),
        }
    }

    /// Until it follows another leader (the lock: its first try failed).
    fn wait_following(&self, timeout: Duration) {
        let ok = match &self.inner {
            Inner::Baton(h) => h
                .try_wait_for(timeout, &|e| {
                    e.message() == "lease status changed" && e.str("role") == Some("following")
                })
                .is_some(),
            Inner::Lock(l) => l.try_wait_for(timeout, &|e| e.event == "candidate").is_some(),
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

    fn exited(&mut self) -> bool {
        match &mut self.inner {
            Inner::Baton(h) => h.exited().is_some(),
            Inner::Lock(l) => l.child.try_wait().unwrap().is_some(),
        }
    }

    fn wait_exit(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.exited() {
            if Instant::now() >= deadline {
                eprintln!(
                    "versus_advisory_lock: {} did not exit within {timeout:?}: killed; output:\n{}",
                    self.name,
                    self.output()
                );
                // SAFETY: kill(2) on a child this bench spawned and still owns.
                unsafe { libc::kill(self.pid(), libc::SIGKILL) };
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn output(&self) -> String {
        match &self.inner {
            Inner::Baton(h) => h.output(),
            Inner::Lock(l) => l.output(),
        }
    }
}

/// SIGTERM to each, then waits for each to exit (baton releases its
/// leases, the lock unlocks).
fn release_all(procs: &mut [Proc], t: &Timing) {
    for p in procs.iter_mut() {
        if !p.exited() {
            p.signal(libc::SIGTERM);
        }
    }
    for p in procs.iter_mut() {
        p.wait_exit(t.rd + t.grace + Duration::from_secs(30));
    }
}

/// A failed run: says so, writes the processes' output to a file, stops
/// them.
fn failed(what: &str, mut procs: Vec<Proc>, t: &Timing) {
    let file = std::env::temp_dir().join(format!("versus-advisory-lock-{}.log", procs[0].name));
    let text: Vec<String> = procs
        .iter()
        .map(|p| format!("==== {}\n{}\n", p.name, p.output()))
        .collect();
    std::fs::write(&file, text.concat()).unwrap();
    eprintln!(
        "versus_advisory_lock: FAILED RUN: {what}; not counted; the output is in {}",
        file.display()
    );
    release_all(&mut procs, t);
}

// ------------------------------------------------------------ the bench

/// What every run needs: the server, an administrator's connection to
/// database `postgres` (so that its statements do not count in database
/// `baton`'s statistics), a scratch folder.
struct Bench {
    /// Stopped (and its data deleted) when the bench ends.
    _server: OwnServer,
    env: PgEnv,
    /// The primary's server log (`<run folder>/node1.log`).
    log: PathBuf,
    scratch: Scratch,
    rt: tokio::runtime::Runtime,
    admin: tokio_postgres::Client,
}

/// A small number for the lock of `lease` (below 2^31: pg_locks shows it as
/// classid 0, objid the key).
fn key_of(lease: &str) -> i64 {
    let mut h: u32 = 2_166_136_261;
    for b in lease.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(16_777_619);
    }
    i64::from(h >> 1) + 1
}

impl Bench {
    fn start() -> Bench {
        let server = OwnServer::start();
        let env = server.env();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let url = env
            .admin_url
            .strip_suffix("/baton")
            .map(|u| format!("{u}/postgres"))
            .expect("the admin URL ends in /baton");
        let admin = rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect as baton_admin");
            tokio::spawn(connection);
            client
        });
        let text = std::fs::read_to_string(&env.file).expect("read the env file");
        let data = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("export PG_TEST_PRIMARY_DATA="))
            .expect("PG_TEST_PRIMARY_DATA in the env file")
            .trim_matches(['"', '\''])
            .to_owned();
        Bench {
            _server: server,
            log: PathBuf::from(format!("{data}.log")),
            env,
            scratch: Scratch::new(),
            rt,
            admin,
        }
    }

    /// The primary's URL for role baton, through port `port` of 127.0.0.1
    /// (a proxy's) if given.
    fn url(&self, port: Option<u16>) -> String {
        match port {
            None => self.env.url.clone(),
            Some(p) => {
                let from = format!("@127.0.0.1:{}/", self.env.primary_port);
                assert!(self.env.url.contains(&from), "unexpected URL form");
                self.env.url.replace(&from, &format!("@127.0.0.1:{p}/"))
            }
        }
    }

    /// The `[store]` and `[defaults]` of a baton host.
    fn head(t: &Timing, url: &str, schema: &str) -> String {
        format!(
            "[store]\nkind = \"postgres\"\nurl = {url:?}\nschema = {schema:?}\n\n[defaults]\n\
             lease-duration = \"{}\"\nrenew-deadline = \"{}\"\nretry-period = \"{}\"\ngrace = \"{}\"\n",
            ms(t.ld),
            ms(t.rd),
            ms(t.rp),
            ms(t.grace),
        )
    }

    /// `tool`'s elector for `lease` as `who`, on the server through `url`.
    fn spawn(&self, tool: Tool, t: &Timing, lease: &str, who: &str, url: &str) -> Proc {
        let name = format!("{}-{lease}-{who}", tool.short());
        let inner = match tool {
            Tool::Baton => {
                let text = format!(
                    "{}\n[[lease]]\nname = {lease:?}\n\n[[plugin]]\nname = \"probe\"\npath = {:?}\nlease = {lease:?}\n\
                     env = {{ PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"100\" }}\n",
                    Bench::head(t, url, "bench_handover"),
                    guest("probe_pollable.wasm").display().to_string()
                );
                let cfg = self.scratch.write(&format!("{name}.toml"), &text);
                Inner::Baton(Host::start_opts(&name, &cfg, Opts::default()))
            }
            Tool::Lock => Inner::Lock(LockProc::start(&[
                format!("--url={url}?application_name=advisory-elector"),
                format!("--key={}", key_of(lease)),
                format!("--retry-ms={}", t.rp.as_millis()),
                "--act-ms=100".to_owned(),
            ])),
        };
        Proc { name, inner }
    }

    /// A leader (acting, through `leader_url`) and a standby (following,
    /// directly) on a fresh `lease`, then 2 to 3 retry periods (at random),
    /// so that what follows lands mid-lease, at any point of the leader's
    /// renewals and of the standby's tries.
    fn pair(&self, tool: Tool, t: &Timing, lease: &str, leader_url: &str) -> (Proc, Proc) {
        let a = self.spawn(tool, t, lease, "a", leader_url);
        if a.try_wait_act(UNIX_EPOCH, Duration::from_secs(60)).is_none() {
            panic!("{}: no first act within 60 s; output:\n{}", a.name, a.output());
        }
        let b = self.spawn(tool, t, lease, "b", &self.url(None));
        b.wait_following(Duration::from_secs(60));
        std::thread::sleep(t.rp * 2 + jitter(t.rp));
        (a, b)
    }

    /// Logs every statement (`log_statement = 'all'`) or none
    /// (`'none'`); new sessions take it at once.
    fn log_statements(&self, on: bool) {
        let value = if on { "all" } else { "none" };
        self.rt
            .block_on(async {
                self.admin
                    .batch_execute(&format!("ALTER SYSTEM SET log_statement = '{value}'"))
                    .await?;
                self.admin.batch_execute("SELECT pg_reload_conf()").await
            })
            .expect("set log_statement");
        std::thread::sleep(Duration::from_millis(200));
    }

    /// The server log's length so far.
    fn log_size(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// The statements role baton ran in database baton, as logged between
    /// offsets `from` and `to` of the server log, by what they are (a
    /// schema name left out).
    fn statements(&self, from: u64, to: u64) -> BTreeMap<String, f64> {
        use std::io::{Read, Seek, SeekFrom};
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&self.log).and_then(|mut f| {
            f.seek(SeekFrom::Start(from))?;
            f.take(to.saturating_sub(from)).read_to_end(&mut bytes)
        });
        if let Err(e) = read {
            eprintln!("versus_advisory_lock: cannot read {}: {e}", self.log.display());
        }
        let mut counts = BTreeMap::new();
        for line in String::from_utf8_lossy(&bytes).lines() {
            let Some((_, rest)) = line.split_once(" baton@baton LOG:  ") else {
                continue;
            };
            let text = if let Some(t) = rest.strip_prefix("statement: ") {
                t
            } else if let Some(t) = rest.strip_prefix("execute ") {
                t.split_once(": ").map_or(t, |(_, t)| t)
            } else {
                continue;
            };
            *counts.entry(label(text)).or_insert(0.0) += 1.0;
        }
        counts
    }

    /// Transactions committed and rolled back in database `baton` so far.
    fn xacts(&self) -> f64 {
        let row = self
            .rt
            .block_on(self.admin.query_one(
                "SELECT (xact_commit + xact_rollback)::float8 FROM pg_stat_database WHERE datname = 'baton'",
                &[],
            ))
            .expect("read pg_stat_database");
        row.get(0)
    }

    /// The CPU seconds of every PostgreSQL process in `pg_stat_activity`
    /// (backends and the server's own workers), by pid.
    fn pg_cpu(&self) -> BTreeMap<i32, f64> {
        let rows = self
            .rt
            .block_on(self.admin.query("SELECT pid FROM pg_stat_activity", &[]))
            .expect("read pg_stat_activity");
        rows.iter()
            .filter_map(|r| {
                let pid: i32 = r.get(0);
                Some((pid, proc_cpu_secs(pid)?))
            })
            .collect()
    }

    /// The backend holding the advisory lock `key`.
    fn lock_holder(&self, key: i64) -> Option<i32> {
        let sql = format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = 0 AND objid = {key} AND objsubid = 1"
        );
        let rows = self
            .rt
            .block_on(self.admin.query(&sql, &[]))
            .expect("read pg_locks");
        rows.first().map(|r| r.get(0))
    }

    fn terminate(&self, pid: i32) {
        self.rt
            .block_on(self.admin.execute("SELECT pg_terminate_backend($1)", &[&pid]))
            .expect("pg_terminate_backend");
    }

    fn setting(&self, name: &str) -> String {
        let row = self
            .rt
            .block_on(self.admin.query_one(&format!("SHOW {name}"), &[]))
            .expect("SHOW");
        row.get(0)
    }
}

/// A statement's text, short: quoted schema names left out, cut before
/// its first parenthesis or after 60 characters.
fn label(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('"') {
        let after = &rest[i + 1..];
        match after.find("\".") {
            Some(j) if after[..j].chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                out.push_str(&rest[..i]);
                rest = &after[j + 2..];
            }
            _ => {
                out.push_str(&rest[..=i]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let cut = out.find('(').filter(|&i| i <= 80).unwrap_or(60).min(out.len());
    let mut cut = cut;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out[..cut].trim().to_owned()
}

/// A random duration from zero to `d`.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random::<f64>())
}

/// The user + system CPU time of `pid` so far, in seconds, if it runs.
fn proc_cpu_secs(pid: i32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    Some(ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

fn rss_mb(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

// ------------------------------------------------------------ scenarios

/// The signal to the standby's first act, in ms; `None` if it did not
/// act within 2 LD + 4 RP + 10 s (a failed run).
fn handover(b: &Bench, tool: Tool, t: &Timing, lease: &str, sig: i32) -> Option<f64> {
    let (mut a, s) = b.pair(tool, t, lease, &b.url(None));
    let stopped = a.signal(sig);
    let timeout = t.ld * 2 + t.rp * 4 + Duration::from_secs(10);
    let Some(first) = s.try_wait_act(stopped, timeout) else {
        failed(
            &format!("{}: no first act within {timeout:?} of signal {sig}", s.name),
            vec![a, s],
            t,
        );
        return None;
    };
    a.wait_exit(t.rd + t.grace + Duration::from_secs(10));
    let late = a.acts().iter().filter(|&&at| at >= first).count();
    if late > 0 {
        eprintln!(
            "versus_advisory_lock: {} acted {late} times after the standby's first act (signal {sig})",
            a.name
        );
    }
    release_all(&mut [s], t);
    Some(ms_between(stopped, first))
}

/// One black-holed leader.
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// The cut -> the old leader stopped, while still cut off (`None`:
    /// it did not).
    stopped_ms: Option<f64>,
    /// The cut -> the standby's first act, while the old leader's session
    /// lasted (`None`: not within the window).
    moved_ms: Option<f64>,
    /// The lock: the server ended the old session -> the standby's first
    /// act.
    after_end_ms: Option<f64>,
    /// The old leader's acts at or after the standby's first act.
    overlap_acts: usize,
    /// The old leader's last act -> the standby's first act (negative: an
    /// overlap).
    gap_ms: f64,
    /// The lock: the proxy restored -> the old holder's "stopped".
    restored_stop_ms: Option<f64>,
}

/// A yes-or-no question about a run of `blackhole`.
type CutTest = fn(&Cut) -> bool;

/// One run of `blackhole`; `None` if the standby never acted.
fn cut_off(b: &Bench, tool: Tool, t: &Timing, lease: &str) -> Option<Cut> {
    let primary = format!("127.0.0.1:{}", b.env.primary_port).parse().unwrap();
    let hole = BlackHole::start(primary);
    let (a, s) = b.pair(tool, t, lease, &b.url(Some(hole.port)));
    hole.cut(true);
    let cut = SystemTime::now();
    let mut cut_result = Cut {
        stopped_ms: None,
        moved_ms: None,
        after_end_ms: None,
        overlap_acts: 0,
        gap_ms: 0.0,
        restored_stop_ms: None,
    };
    let first = match tool {
        Tool::Baton => {
            let timeout = t.ld * 2 + t.rp * 4 + Duration::from_secs(10);
            let Some(first) = s.try_wait_act(cut, timeout) else {
                hole.cut(false);
                failed(
                    &format!("{}: no first act within {timeout:?} of the cut", s.name),
                    vec![a, s],
                    t,
                );
                return None;
            };
            cut_result.moved_ms = Some(ms_between(cut, first));
            // What the old leader does next (it stopped already).
            std::thread::sleep(Duration::from_secs(2));
            cut_result.stopped_ms = a.wait_stopped(cut, Duration::ZERO).map(|at| ms_between(cut, at));
            first
        }
        Tool::Lock => {
            let window = t.ld + t.rp * 2;
            let moved = s.try_wait_act(cut, window);
            cut_result.moved_ms = moved.map(|at| ms_between(cut, at));
            let first = match moved {
                Some(first) => first,
                None => {
                    // The server ends the holder's session, as its TCP
                    // keepalive would once it noticed.
                    let Some(pid) = b.lock_holder(key_of(lease)) else {
                        hole.cut(false);
                        failed(&format!("{}: nobody holds the lock", a.name), vec![a, s], t);
                        return None;
                    };
                    // At any point of the standby's tries.
                    std::thread::sleep(jitter(t.rp));
                    let ended = SystemTime::now();
                    b.terminate(pid);
                    let timeout = t.rp * 4 + Duration::from_secs(10);
                    let Some(first) = s.try_wait_act(ended, timeout) else {
                        hole.cut(false);
                        failed(
                            &format!("{}: no first act within {timeout:?} of the session's end", s.name),
                            vec![a, s],
                            t,
                        );
                        return None;
                    };
                    cut_result.after_end_ms = Some(ms_between(ended, first));
                    first
                }
            };
            // The old holder, still cut off, acting on?
            std::thread::sleep(Duration::from_secs(2));
            cut_result.stopped_ms = a.wait_stopped(cut, Duration::ZERO).map(|at| ms_between(cut, at));
            let restored = SystemTime::now();
            hole.cut(false);
            cut_result.restored_stop_ms = a
                .wait_stopped(restored, Duration::from_secs(10))
                .map(|at| ms_between(restored, at));
            first
        }
    };
    hole.cut(false);
    let acts = a.acts();
    cut_result.overlap_acts = acts.iter().filter(|&&at| at >= first).count();
    let last_before = acts.iter().filter(|&&at| at < first).max().copied();
    cut_result.gap_ms = match (cut_result.overlap_acts, last_before) {
        (0, Some(last)) => ms_between(last, first),
        (_, _) => -ms_between(first, acts.iter().max().copied().unwrap_or(first)),
    };
    release_all(&mut [a, s], t);
    Some(cut_result)
}

/// What was run over a window, per minute.
#[derive(Default)]
struct Counted {
    /// Statements of role baton in database baton (the server's log).
    statements: f64,
    /// The same by what they are.
    by_statement: BTreeMap<String, f64>,
    /// `pg_stat_database`'s xact_commit + xact_rollback of database baton.
    xacts: f64,
}

impl Counted {
    fn detail(&self) -> String {
        let mut v: Vec<(&String, &f64)> = self.by_statement.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1));
        v.iter()
            .map(|(k, n)| format!("{n:.1} {k}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Counts per minute over `window`, from now.
fn per_minute(b: &Bench, window: Duration) -> Counted {
    let (l0, x0, t0) = (b.log_size(), b.xacts(), Instant::now());
    std::thread::sleep(window);
    let (l1, x1) = (b.log_size(), b.xacts());
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let by_statement: BTreeMap<String, f64> = b
        .statements(l0, l1)
        .into_iter()
        .map(|(k, n)| (k, n / minutes))
        .collect();
    Counted {
        // (`+ 0.0`: an empty sum is -0.0.)
        statements: by_statement.values().sum::<f64>() + 0.0,
        by_statement,
        xacts: (x1 - x0) / minutes,
    }
}

/// Two baton hosts sharing `leases` leases, idle: what they ran per
/// minute, once they have spread them (or `None` if they did not in 120 s).
fn idle_baton(b: &Bench, t: &Timing, leases: usize, window: Duration) -> Option<Counted> {
    let schema = format!("bench_idle_{leases}");
    let mut text = Bench::head(t, &b.url(None), &schema);
    for i in 0..leases {
        text.push_str(&format!("\n[[lease]]\nname = \"idle-{i:03}\"\n"));
    }
    let cfg = b.scratch.write(&format!("idle-{leases}.toml"), &text);
    let hosts: Vec<Host> = ["a", "b"]
        .iter()
        .map(|who| Host::start_opts(&format!("idle-{leases}-{who}"), &cfg, Opts::default()))
        .collect();
    let spread = |hosts: &[Host]| {
        let (x, y) = (led(&hosts[0]).len(), led(&hosts[1]).len());
        x + y == leases && x.abs_diff(y) <= 1
    };
    let until = Instant::now() + Duration::from_secs(120);
    while !spread(&hosts) {
        if Instant::now() >= until {
            eprintln!(
                "versus_advisory_lock: {leases} leases not spread in 120 s ({} and {}); last lines:\n{}\n{}",
                led(&hosts[0]).len(),
                led(&hosts[1]).len(),
                tail(&hosts[0].output(), 20),
                tail(&hosts[1].output(), 20)
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The hand-overs of the spreading, and their floors, settle.
    std::thread::sleep(t.ld.max(t.rp * 3));
    let rate = per_minute(b, window);
    if !spread(&hosts) {
        eprintln!("versus_advisory_lock: {leases} leases: the spread moved during the window");
    }
    let mut procs: Vec<Proc> = hosts
        .into_iter()
        .map(|h| Proc {
            name: h.name.clone(),
            inner: Inner::Baton(h),
        })
        .collect();
    release_all(&mut procs, t);
    Some(rate)
}

/// An advisory-lock leader and standby, idle: what they ran per minute.
fn idle_lock(b: &Bench, t: &Timing, window: Duration) -> Counted {
    let (a, s) = b.pair(Tool::Lock, t, "idle-lock", &b.url(None));
    std::thread::sleep(t.rp * 2);
    let rate = per_minute(b, window);
    release_all(&mut [a, s], t);
    rate
}

/// One host's idle CPU with many leases.
struct Cpu {
    percent: f64,
    pg_percent: f64,
    per_lease_minute: f64,
    rss_mb: f64,
    start_s: f64,
}

fn cpu_baton(b: &Bench, t: &Timing, leases: usize, settle: Duration, window: Duration) -> Option<Cpu> {
    let mut text = Bench::head(t, &b.url(None), "bench_cpu");
    for i in 0..leases {
        text.push_str(&format!("\n[[lease]]\nname = \"lease-{i:04}\"\n"));
    }
    let cfg = b.scratch.write("cpu.toml", &text);
    let started = Instant::now();
    let host = Host::start_opts("baton-cpu", &cfg, Opts::default());
    let deadline = Instant::now() + Duration::from_secs(300);
    while led(&host).len() < leases {
        if Instant::now() >= deadline {
            eprintln!(
                "versus_advisory_lock: baton-cpu leads {} of {leases} leases after 300 s; last lines:\n{}",
                led(&host).len(),
                tail(&host.output(), 30)
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let start_s = started.elapsed().as_secs_f64();
    std::thread::sleep(settle);
    let pid = host.pid();
    let (c0, pg0, x0, t0) = (proc_cpu_secs(pid)?, b.pg_cpu(), b.xacts(), Instant::now());
    std::thread::sleep(window);
    let (c1, pg1, x1) = (proc_cpu_secs(pid)?, b.pg_cpu(), b.xacts());
    let secs = t0.elapsed().as_secs_f64();
    let pg: f64 = pg1.iter().filter_map(|(p, s1)| Some(s1 - pg0.get(p)?)).sum();
    let cpu = Cpu {
        percent: (c1 - c0) / secs * 100.0,
        pg_percent: pg / secs * 100.0,
        per_lease_minute: (x1 - x0) / (secs / 60.0) / leases as f64,
        rss_mb: rss_mb(pid),
        start_s,
    };
    let lost = leases - led(&host).len();
    if lost > 0 {
        eprintln!("versus_advisory_lock: baton-cpu lost {lost} leases during the window");
    }
    let mut p = Proc {
        name: "baton-cpu".into(),
        inner: Inner::Baton(host),
    };
    release_all(std::slice::from_mut(&mut p), t);
    Some(cpu)
}

/// `ops` fenced writes of one `Op::Set` of 100 bytes each, after 20
/// unmeasured: each one's ms.
async fn bucket_writes(store: &dyn BucketStore, ops: usize) -> Vec<f64> {
    let bucket = BucketName::new("bench", "plugin");
    store.claim(&bucket, 1).await.expect("claim the bucket");
    let mut ms = Vec::with_capacity(ops);
    for i in 0..20 + ops {
        let write = Write::new(
            1,
            vec![Op::Set {
                key: format!("key-{:03}", i % 100),
                value: format!("{i:0>100}").into_bytes(),
            }],
            Limits::default(),
        );
        let start = Instant::now();
        store.apply(&bucket, write).await.expect("a fenced write");
        if i >= 20 {
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms
}

fn buckets(b: &Bench, ops: usize) -> (Vec<f64>, Vec<f64>) {
    let pg = b.rt.block_on(async {
        let mut options = PostgresOptions::for_tests(Some(&b.env.url));
        options.schema = "bench_kv".into();
        let store = PostgresStore::connect(options, &|_: &str| None::<String>)
            .await
            .expect("open the postgres store");
        bucket_writes(&store.buckets(), ops).await
    });
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedBuckets::open(dir.path()).expect("open the embedded buckets");
    let emb = b.rt.block_on(bucket_writes(&embedded, ops));
    (pg, emb)
}

// ------------------------------------------------------------ statistics

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => f64::midpoint(s[n / 2 - 1], s[n / 2]),
    }
}

fn p99(v: &[f64]) -> f64 {
    let s = sorted(v);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1]
}

fn secs(ms: f64) -> String {
    if ms.is_nan() {
        "-".into()
    } else if ms.abs() < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// "median (min to max), n runs".
fn summary(v: &[f64], f: fn(f64) -> String) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let s = sorted(v);
    format!(
        "{} ({} to {}), n {}",
        f(median(v)),
        f(s[0]),
        f(s[s.len() - 1]),
        v.len()
    )
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
        [Tool::Baton, Tool::Lock]
            .into_iter()
            .map(|t| (t, each(t)))
            .collect()
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = [Tool::Baton, Tool::Lock]
                .into_iter()
                .map(|t| (t, s.spawn(move || each(t))))
                .collect();
            hs.into_iter().map(|(t, h)| (t, h.join().unwrap())).collect()
        })
    }
}

/// The runs that completed per tool; the failed ones counted under
/// `row/tool`.
fn counted<T>(
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

/// The newest file under `dir` (recursively), with its modification time.
fn newest(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let meta = std::fs::metadata(dir).ok()?;
    if meta.is_file() {
        return Some((meta.modified().ok()?, dir.to_owned()));
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| newest(&e.path()))
        .max()
}

/// The release `baton` to measure, and how the bench found it; sets
/// `BATON_BIN` for `support::Host`.
fn release_baton() -> (PathBuf, String) {
    let (bin, how) = if let Some(bin) = std::env::var_os("BATON_BIN") {
        (PathBuf::from(bin), "BATON_BIN")
    } else if cfg!(debug_assertions) {
        // A dev-profile bench: the release build beside it in the target
        // folder (<target>/debug/deps/<bench>).
        let exe = std::env::current_exe().expect("the bench binary");
        let target = exe
            .ancestors()
            .nth(3)
            .expect("<target>/<profile>/deps/<bench>")
            .to_owned();
        (target.join("release/baton"), "the target folder's release build")
    } else {
        (
            PathBuf::from(env!("CARGO_BIN_EXE_baton")),
            "the bench's own release build",
        )
    };
    assert!(
        bin.is_file(),
        "no release build at {}: run `cargo build --release -p baton` first (or set BATON_BIN)",
        bin.display()
    );
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).unwrap();
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let sources = ["host/src", "host/Cargo.toml", "Cargo.lock", "wit"]
        .iter()
        .filter_map(|p| newest(&root.join(p)))
        .max();
    if let Some((at, file)) = sources
        && at > built
    {
        eprintln!(
            "versus_advisory_lock: WARNING: {} is older than {} (changed since the build): \
             run `cargo build --release -p baton` to measure the current source",
            bin.display(),
            file.display()
        );
    }
    // SAFETY: at the start of main, before the bench starts any thread.
    unsafe { std::env::set_var("BATON_BIN", &bin) };
    let text = format!(
        "{} ({how}, built {})",
        bin.display(),
        humantime::format_rfc3339_seconds(built)
    );
    (bin, text)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(ELECTOR_ARG) {
        elector::main(&args[2..]);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let started = Instant::now();
    let (_, build) = release_baton();
    let runs: usize = number("BATON_BENCH_RUNS", 5);
    let cut_runs: usize = number("BATON_BENCH_BLACKHOLE_RUNS", 3);
    let timings: Vec<Timing> = list("BATON_BENCH_TIMINGS", "fast,default")
        .iter()
        .map(|n| Timing::by_name(n))
        .collect();
    let scenarios = list(
        "BATON_BENCH_SCENARIOS",
        "graceful,crash,blackhole,idle,cpu,buckets",
    );
    let has = |s: &str| scenarios.iter().any(|x| x == s);
    guest("probe_pollable.wasm");

    eprintln!("versus_advisory_lock: starting a PostgreSQL of its own (scripts/pg-testenv.sh start)");
    let bench = Bench::start();
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let version = bench.setting("server_version");
    println!(
        "versus_advisory_lock: baton on postgres vs a session advisory lock, PostgreSQL {version} on loopback, {date}\n\
         baton: {build}\n\
         the machine is shared (2 cores, other builds and tests running): figures are noisy; tools run at the same time"
    );

    let mut table = vec![
        "| timings | measure | baton: median (min to max), runs | advisory lock: median (min to max), runs |"
            .to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    let per_timing = ["graceful", "crash", "blackhole"].iter().any(|s| has(s));
    for t in timings.iter().filter(|_| per_timing) {
        println!("\n== {}", t.label());
        let mut row = |measure: &str, res: &BTreeMap<Tool, Vec<f64>>, f: fn(f64) -> String| {
            let (bs, ls) = (summary(&res[&Tool::Baton], f), summary(&res[&Tool::Lock], f));
            println!("{measure:<44} baton {bs:<34} lock {ls}");
            table.push(format!("| {} | {measure} | {bs} | {ls} |", t.name));
        };
        for (scenario, sig, what) in [
            ("graceful", libc::SIGTERM, "graceful: SIGTERM -> the other acts"),
            ("crash", libc::SIGKILL, "crash: SIGKILL -> the other acts"),
        ] {
            if !has(scenario) {
                continue;
            }
            let res = counted(
                &format!("{}/{scenario}", t.name),
                both(runs, &|tool, i| {
                    handover(&bench, tool, t, &format!("{scenario}-{}-{i}", t.name), sig)
                }),
                &mut failures,
            );
            row(what, &res, secs);
        }
        if has("blackhole") {
            let res = counted(
                &format!("{}/blackhole", t.name),
                both(cut_runs, &|tool, i| {
                    cut_off(&bench, tool, t, &format!("cut-{}-{i}", t.name))
                }),
                &mut failures,
            );
            let pick = |f: &dyn Fn(&Cut) -> Option<f64>| -> BTreeMap<Tool, Vec<f64>> {
                res.iter()
                    .map(|(k, v)| (*k, v.iter().filter_map(f).collect()))
                    .collect()
            };
            let n = |tool: Tool, f: &dyn Fn(&Cut) -> bool| {
                format!(
                    "{} of {}",
                    res[&tool].iter().filter(|c| f(c)).count(),
                    res[&tool].len()
                )
            };
            row(
                "black hole: cut -> old leader stops, cut off",
                &pick(&|c| c.stopped_ms),
                secs,
            );
            row(
                "black hole: cut -> the other acts, session alive",
                &pick(&|c| c.moved_ms),
                secs,
            );
            row(
                "black hole: server ends the session -> the other acts",
                &pick(&|c| c.after_end_ms),
                secs,
            );
            row(
                "black hole: old leader's last act -> the other's first (< 0: overlap)",
                &pick(&|c| Some(c.gap_ms)),
                secs,
            );
            row(
                "black hole: old leader's acts after the other's first",
                &pick(&|c| Some(c.overlap_acts as f64)),
                |x| format!("{x:.0}"),
            );
            row(
                "black hole: proxy restored -> old holder stops",
                &pick(&|c| c.restored_stop_ms),
                secs,
            );
            let counts: [(&str, CutTest); 3] = [
                ("runs where the old leader stopped while cut off", |c| {
                    c.stopped_ms.is_some()
                }),
                ("runs where the other acted while the old session lived", |c| {
                    c.moved_ms.is_some()
                }),
                ("runs with an overlap (both acting)", |c| c.overlap_acts > 0),
            ];
            for (what, f) in counts {
                let (bn, ln) = (n(Tool::Baton, &f), n(Tool::Lock, &f));
                println!("black hole: {what:<56} baton {bn:<10} lock {ln}");
                table.push(format!("| {} | black hole: {what} | {bn} | {ln} |", t.name));
            }
        }
    }
    if has("blackhole") {
        let keepalive = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time").unwrap_or_default();
        println!(
            "black hole: the server's tcp_keepalives_idle = {} (0: the system's net.ipv4.tcp_keepalive_time, {} s); \
             the proxy's own kernel answers keepalives, so here the session never ends by itself",
            bench.setting("tcp_keepalives_idle"),
            keepalive.trim()
        );
    }

    if has("idle") {
        // Counted from the server's log (see the module's documentation).
        bench.log_statements(true);
    }
    let mut idle_rows: Vec<String> = Vec::new();
    if has("idle") {
        let t =
            Timing::by_name(&std::env::var("BATON_BENCH_IDLE_TIMING").unwrap_or_else(|_| "default".into()));
        let window = Duration::from_secs(number("BATON_BENCH_IDLE_SECS", 30));
        println!(
            "\n== idle, statements per minute of role baton (log_statement = 'all'; in brackets \
             pg_stat_database's xact_commit + xact_rollback), {} s windows, {}",
            window.as_secs(),
            t.label()
        );
        let mut row = |who: &str, leases: Option<usize>, c: &Counted| {
            let n = leases.unwrap_or(1) as f64;
            println!(
                "  {who:<44} {:>8.1} per minute ({:.1}), {:.1} per lease",
                c.statements,
                c.xacts,
                c.statements / n,
            );
            if !c.by_statement.is_empty() {
                println!("      {}", c.detail());
            }
            idle_rows.push(format!(
                "| {who} | {} | {:.1} | {} | {:.1} |",
                leases.map_or("-".into(), |l| l.to_string()),
                c.statements,
                leases.map_or("-".into(), |_| format!("{:.1}", c.statements / n)),
                c.xacts
            ));
        };
        let quiet = per_minute(&bench, Duration::from_secs(10));
        row("nothing running (10 s)", None, &quiet);
        for leases in [1usize, 100] {
            match idle_baton(&bench, &t, leases, window) {
                Some(c) => row(
                    &format!(
                        "baton, leader + follower, {leases} lease{}",
                        if leases == 1 { "" } else { "s (spread)" }
                    ),
                    Some(leases),
                    &c,
                ),
                None => {
                    failures.insert(format!("idle/baton-{leases}"), 1);
                }
            }
        }
        let c = idle_lock(&bench, &t, window);
        row("advisory lock, leader + standby", Some(1), &c);
        bench.log_statements(false);
    }

    let mut cpu_row = None;
    if has("cpu") {
        let leases: usize = number("BATON_BENCH_LEASES", 1000);
        let settle = Duration::from_secs(number("BATON_BENCH_SETTLE_SECS", 10));
        let window = Duration::from_secs(number("BATON_BENCH_CPU_SECS", 60));
        println!(
            "\n== idle CPU, one host leading {leases} leases, no plugins, {}; {} s window after {} s",
            DEFAULT.label(),
            window.as_secs(),
            settle.as_secs()
        );
        match cpu_baton(&bench, &DEFAULT, leases, settle, window) {
            Some(c) => {
                println!(
                    "  baton {:.1} % of a core, PostgreSQL {:.1} %, {:.1} transactions per lease per minute (xact_commit + xact_rollback), \
                     {:.0} MB resident, leading all after {:.1} s",
                    c.percent, c.pg_percent, c.per_lease_minute, c.rss_mb, c.start_s
                );
                cpu_row = Some(format!(
                    "| {leases} | {:.1} % | {:.1} % | {:.1} | {:.0} MB | {:.1} s |",
                    c.percent, c.pg_percent, c.per_lease_minute, c.rss_mb, c.start_s
                ));
            }
            None => {
                failures.insert("cpu".into(), 1);
            }
        }
    }

    let mut kv_rows: Vec<String> = Vec::new();
    if has("buckets") {
        let ops: usize = number("BATON_BENCH_OPS", 500);
        let profile = if cfg!(debug_assertions) { "dev" } else { "release" };
        println!(
            "\n== a fenced bucket write (one Set of 100 B), in-process, one at a time, {ops} after 20 unmeasured \
             (the bench's {profile} build)"
        );
        let (pg, emb) = buckets(&bench, ops);
        for (store, v) in [("postgres", &pg), ("embedded (SQLite)", &emb)] {
            println!(
                "  {store:<18} median {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  n {}",
                median(v),
                p99(v),
                sorted(v).last().copied().unwrap_or(f64::NAN),
                v.len()
            );
            kv_rows.push(format!(
                "| {store} | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
                median(v),
                p99(v),
                sorted(v).last().copied().unwrap_or(f64::NAN),
                v.len()
            ));
        }
    }
    drop(bench);

    let took = started.elapsed();
    println!(
        "\nMarkdown ({date}, PostgreSQL {version}, release baton, took {:.1} min):\n",
        took.as_secs_f64() / 60.0
    );
    if table.len() > 2 {
        println!("{}", table.join("\n"));
    }
    if !idle_rows.is_empty() {
        println!(
            "\n| idle, {} timings | leases | statements / min | per lease / min | xact_commit + xact_rollback / min |\n|---|---|---|---|---|\n{}",
            std::env::var("BATON_BENCH_IDLE_TIMING").unwrap_or_else(|_| "default".into()),
            idle_rows.join("\n")
        );
    }
    if let Some(row) = cpu_row {
        println!(
            "\n| 1 host, idle leases | baton CPU, % of a core | PostgreSQL CPU | transactions / lease / min | resident | leading all after |\n|---|---|---|---|---|---|\n{row}"
        );
    }
    if !kv_rows.is_empty() {
        println!(
            "\n| fenced bucket write | median | p99 | max | writes |\n|---|---|---|---|---|\n{}",
            kv_rows.join("\n")
        );
    }
    if !failures.is_empty() {
        println!("\nFAILED runs (left out of the figures above): {failures:?}");
    }
}
