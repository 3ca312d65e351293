//! Chaos on the PostgreSQL store (the engine is tests/e2e/chaos/engine.rs),
//! on a primary, an asynchronous standby and a pooler of the run's own
//! ([`OwnServer`]), so that restarting, pausing and failing over its nodes
//! disturbs no other test. Every host reaches both nodes through proxies
//! of its own (libpq's variables: `PGHOST`, `PGPORT`, ...,
//! `PGTARGETSESSIONATTRS=read-write`; the `[store]` table names no URL),
//! which follow a failover as the nodes swap roles. Besides the host
//! faults ([`PG_FAULTS`]):
//!
//! - the primary restarted, `pg_ctl restart -m fast` and `-m immediate`
//!   (crash recovery);
//! - every backend of the hosts' role terminated (`pg_terminate_backend`),
//!   the watches' connections included;
//! - the primary frozen (SIGSTOP of the postmaster and every backend) past
//!   the renew deadline, then resumed;
//! - one host's path to both nodes black-holed (proxies that hold every
//!   byte without closing anything) and restored;
//! - a failover to a standby that missed the newest writes of the
//!   leases: see [`PgBed::failover`].
//!
//! The engine counts each under a kind of its own (`Fault::Pg*`).

#[path = "../e2e/chaos/counter.rs"]
mod counter;
#[path = "../e2e/chaos/engine.rs"]
mod engine;
#[path = "../e2e/chaos/layout.rs"]
mod layout;
#[path = "../e2e/chaos/schedule.rs"]
mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use baton::store::LeaseStore;
use baton::store::postgres::{BEFORE_PROMOTION, PostgresOptions, PostgresStore};
use futures::StreamExt;
use rand::Rng;
use rand::rngs::StdRng;

use crate::env::OwnServer;
use crate::faults::blackhole::BlackHole;
use crate::support::Scratch;
use engine::{Bed, Fault, HOST_FAULTS, Scenario};

/// The hosts' timings (the first of [`Bed::defaults`]).
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);

/// The PostgreSQL faults, by the engine's kind each one is counted under.
const PG_FAULTS: [(Fault, &str); 6] = [
    (Fault::PgRestartFast, "the primary restarted -m fast"),
    (Fault::PgRestartImmediate, "the primary restarted -m immediate"),
    (Fault::PgTerminate, "every backend terminated"),
    (Fault::PgPause, "the primary paused past the renew deadline"),
    (Fault::BlackHole, "one host black-holed"),
    (Fault::PgFailover, "a failover losing the newest lease writes"),
];

fn pg_name(fault: Fault) -> &'static str {
    PG_FAULTS
        .iter()
        .find(|(f, _)| *f == fault)
        .map_or_else(|| fault.name(), |(_, what)| what)
}

/// A WAL position (`X/Y`) as a number.
fn lsn(text: &str) -> u64 {
    let (hi, lo) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text:?}"));
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// The PostgreSQL store in a fresh schema of the own server for each
/// segment; each host reaches both nodes through black holes of its own.
struct PgBed {
    rt: tokio::runtime::Runtime,
    own: OwnServer,
    schema: String,
    /// Both nodes (failovers swap their roles, never their ports).
    nodes: Vec<SocketAddr>,
    user: String,
    password: String,
    database: String,
    /// Per host name: a proxy to each node.
    holes: HashMap<String, Vec<BlackHole>>,
    /// What each store fault did, by kind.
    done: BTreeMap<Fault, Vec<String>>,
}

impl PgBed {
    fn new() -> PgBed {
        let own = OwnServer::start();
        let url = own.env().failover_url;
        let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
        let (userinfo, rest) = rest.split_once('@').expect("a user");
        let (user, password) = userinfo.split_once(':').expect("a password");
        let (hosts, rest) = rest.split_once('/').expect("a database");
        let database = rest.split('?').next().unwrap().to_owned();
        let nodes: Vec<SocketAddr> = hosts.split(',').map(|h| h.parse().expect("host:port")).collect();
        assert_eq!(nodes.len(), 2, "{url}");
        PgBed {
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
            own,
            schema: String::new(),
            nodes,
            user: user.to_owned(),
            password: password.to_owned(),
            database,
            holes: HashMap::new(),
            done: BTreeMap::new(),
        }
    }

    /// A fresh schema for a segment, and its `[store]` table.
    fn fresh_store(&mut self, what: &str) -> String {
        self.holes.clear();
        self.schema = format!("t_{what}_{:08x}", rand::random::<u32>());
        format!(
            "[store]\nkind = \"postgres\"\nschema = {:?}\nrequest-timeout = \"2s\"\n",
            self.schema
        )
    }

    fn note(&mut self, fault: Fault, what: String) {
        println!("  postgres: {}: {what}", pg_name(fault));
        self.done.entry(fault).or_default().push(what);
    }

    /// The standby's replay position and the primary's current one.
    fn lag(&self) -> (u64, u64) {
        let out = self.own.script(&["lag"]);
        let field = |k: &str| {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(lsn)
                .unwrap_or_else(|| panic!("lag: no {k} in {out:?}"))
        };
        (field("standby_replay="), field("primary_current="))
    }

    /// Waits (`bound` at most) until the record of "demo" names a holder
    /// other than `not`, watching it with a store of the test's own on the
    /// primary: the holder and its term.
    fn taken_from(&self, not: &str, bound: Duration) -> Option<(String, u64)> {
        let options = PostgresOptions {
            schema: self.schema.clone(),
            ..PostgresOptions::for_tests(Some(&self.own.env().url))
        };
        self.rt.block_on(async {
            let deadline = tokio::time::Instant::now() + bound;
            let store = PostgresStore::connect(options, &|_| None).await.ok()?;
            loop {
                let mut watch = match tokio::time::timeout_at(deadline, store.watch("demo")).await {
                    Err(_) => return None,
                    Ok(Ok(watch)) => watch,
                    Ok(Err(_)) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                loop {
                    match tokio::time::timeout_at(deadline, watch.next()).await {
                        Err(_) => return None,
                        Ok(None | Some(Err(_))) => break,
                        Ok(Some(Ok(Some(v)))) => {
                            if let Some(h) = v.record.holder()
                                && h != not
                                && h != BEFORE_PROMOTION
                            {
                                return Some((h.to_owned(), v.record.term));
                            }
                        }
                        Ok(Some(Ok(None))) => {}
                    }
                }
            }
        })
    }

    /// A failover that loses the newest writes of the leases, sometimes a
    /// term's start, but no bucket write a guest saw acknowledged: the
    /// engine's counter and schedule checks hold a bucket to every write
    /// it acknowledged, which no asynchronous standby promises (a bucket
    /// write acknowledged by the primary alone is lost with it, as a
    /// lease's is; `tests/postgres/faults.rs` fails over under a writing
    /// leader without buckets). So:
    ///
    /// 1. the buckets table is locked (`LOCK TABLE ... IN EXCLUSIVE MODE`
    ///    in a transaction left open): from now on bucket writes wait,
    ///    and their callers time out, unanswered; reads and the leases'
    ///    writes go on;
    /// 2. once the standby replayed everything the primary wrote by then,
    ///    replication is held: every write from now on is the primary's
    ///    alone;
    /// 3. half the time the leader's renewals go on (and are lost) for
    ///    half a second to three seconds; the other half the leader is
    ///    black-holed, the lease expires, another host takes it over (a
    ///    watch sees the new term's record), and its term runs for a
    ///    moment: its start and renewals are lost;
    /// 4. the primary is killed and the standby promoted; the paths are
    ///    restored (the bytes held meanwhile reach a dead node). The
    ///    holder of the last term finds its version gone; every host
    ///    reads the record as held by nobody known for a lease duration,
    ///    and the next term is above 10⁹ × the old timeline;
    /// 5. the old primary is rebuilt as a standby of the new one, so that
    ///    the next failover can happen.
    ///
    /// When the fault was over: the paths restored.
    fn failover(&mut self, rng: &mut StdRng, hosts: &[&str], leader: usize) -> Option<SystemTime> {
        let lead = hosts[leader];
        let began = Instant::now();
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_millis();
        let sql = format!(
            "SET lock_timeout = '20s'; BEGIN; LOCK TABLE {}.buckets IN EXCLUSIVE MODE",
            self.schema
        );
        let url = self.own.env().admin_url;
        let locker = self.rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect to lock the buckets");
            tokio::spawn(connection);
            client.batch_execute(&sql).await.expect("lock the buckets");
            client
        });
        let locked = Instant::now();
        let (_, written) = self.lag();
        let until = Instant::now() + Duration::from_secs(30);
        while self.lag().0 < written {
            assert!(
                Instant::now() < until,
                "the standby did not replay the primary's writes in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.own.script(&["hold-replication"]);
        let held = Instant::now();
        let lost = if rng.random_bool(0.5) {
            let run = Duration::from_millis(rng.random_range(500..3000));
            std::thread::sleep(run);
            format!("{lead}'s renewals for {} ms", run.as_millis())
        } else {
            for h in &self.holes[lead] {
                h.cut(true);
            }
            let cut = Instant::now();
            // The lease is taken over at the earliest a lease duration
            // after the leader's last renewal; on a busy machine later.
            let taken = self.taken_from(lead, LD + Duration::from_secs(20));
            let seen = Instant::now();
            let run = Duration::from_millis(rng.random_range(100..1500));
            std::thread::sleep(run);
            match taken {
                Some((h, t)) => format!(
                    "{lead} cut off, {h}'s start of term {t} {} ms later and its renewals for {} ms",
                    ms(cut, seen),
                    run.as_millis()
                ),
                None => format!("{lead} cut off, no take-over seen in {} ms", ms(cut, seen)),
            }
        };
        let (replayed, current) = self.lag();
        let failing = Instant::now();
        let timeline = self.own.script(&["failover"]);
        let promoted = Instant::now();
        drop(locker);
        for h in self.holes.values().flatten() {
            h.cut(false);
        }
        let cleared = SystemTime::now();
        self.own.script(&["rebuild-standby"]);
        let what = format!(
            "buckets locked, replication held {} ms later; lost: {lost} ({} bytes of WAL); the primary killed and \
             the standby promoted in {} ms (timeline {}), {} ms after the lock; the standby rebuilt in {} ms",
            ms(locked, held),
            current.saturating_sub(replayed),
            ms(failing, promoted),
            timeline.trim(),
            ms(began, promoted),
            ms(promoted, Instant::now())
        );
        self.note(Fault::PgFailover, what);
        Some(cleared)
    }
}

impl Bed for PgBed {
    fn store(&self) -> &'static str {
        "postgres"
    }

    fn faults(&self) -> Vec<Fault> {
        // The store's faults twice as likely as each host fault: a segment
        // of 16 faults meets most of them.
        let mut all = HOST_FAULTS.to_vec();
        for _ in 0..2 {
            all.extend(PG_FAULTS.iter().map(|(f, _)| *f));
        }
        all
    }

    fn timings(&self) -> (Duration, Duration) {
        (LD, RP)
    }

    fn config(&mut self, _: &Scratch) -> String {
        let store = self.fresh_store("chaos");
        format!("{store}\n{}\n[[lease]]\nname = \"demo\"\n", self.defaults()[0])
    }

    fn store_table(&mut self, _: &Scratch) -> String {
        self.fresh_store("chaos_spread")
    }

    fn defaults(&self) -> [String; 2] {
        [
            "[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"500ms\"\n"
                .into(),
            "[defaults]\nlease-duration = \"5s\"\nrenew-deadline = \"2500ms\"\nretry-period = \"600ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"600ms\"\n"
                .into(),
        ]
    }

    fn env(&mut self, _: &Scratch, name: &str) -> Vec<(String, String)> {
        let nodes = &self.nodes;
        let holes = self
            .holes
            .entry(name.to_owned())
            .or_insert_with(|| nodes.iter().map(|n| BlackHole::start(*n)).collect());
        let hosts = vec!["127.0.0.1"; holes.len()].join(",");
        let ports = holes
            .iter()
            .map(|h| h.port.to_string())
            .collect::<Vec<_>>()
            .join(",");
        [
            ("PGHOST", hosts),
            ("PGPORT", ports),
            ("PGUSER", self.user.clone()),
            ("PGPASSWORD", self.password.clone()),
            ("PGDATABASE", self.database.clone()),
            ("PGTARGETSESSIONATTRS", "read-write".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn inject(
        &mut self,
        fault: Fault,
        rng: &mut StdRng,
        hosts: &[&str],
        leader: usize,
    ) -> Option<SystemTime> {
        let ms = |rng: &mut StdRng, from: u64, to: u64| Duration::from_millis(rng.random_range(from..to));
        match fault {
            Fault::PgRestartFast | Fault::PgRestartImmediate => {
                let mode = if fault == Fault::PgRestartFast {
                    "fast"
                } else {
                    "immediate"
                };
                let began = Instant::now();
                self.own.script(&["restart", "primary", mode]);
                let took = began.elapsed();
                self.note(fault, format!("down and up again in {} ms", took.as_millis()));
                Some(SystemTime::now())
            }
            Fault::PgTerminate => {
                let n = self.own.script(&["terminate"]);
                self.note(fault, format!("{} backends", n.trim()));
                Some(SystemTime::now())
            }
            Fault::PgPause => {
                self.own.script(&["pause", "primary"]);
                let pause = RD + ms(rng, 100, 3000);
                std::thread::sleep(pause);
                self.own.script(&["resume", "primary"]);
                self.note(fault, format!("{} ms", pause.as_millis()));
                Some(SystemTime::now())
            }
            Fault::BlackHole => {
                // The leader half of the time: a follower's is cheap.
                let victim = if rng.random_bool(0.5) {
                    hosts[leader]
                } else {
                    hosts[rng.random_range(0..hosts.len())]
                };
                let holes = &self.holes[victim];
                for h in holes {
                    h.cut(true);
                }
                let at = SystemTime::now();
                let hold = ms(rng, 1000, 6000);
                std::thread::sleep(hold);
                for h in holes {
                    h.cut(false);
                }
                let role = if victim == hosts[leader] {
                    "the leader"
                } else {
                    "a follower"
                };
                self.note(fault, format!("{victim} ({role}) for {} ms", hold.as_millis()));
                Some(at)
            }
            Fault::PgFailover => self.failover(rng, hosts, leader),
            other => panic!("not a fault of the postgres store: {other:?}"),
        }
    }

    fn end(&mut self) {
        for h in self.holes.values().flatten() {
            h.cut(false);
        }
    }
}

/// Prints which engine kind stands for which PostgreSQL fault.
fn legend() {
    for (f, what) in PG_FAULTS {
        println!("postgres chaos: the kind {f:?} (\"{}\") is {what}", f.name());
    }
}

/// Prints what the store faults did.
fn summary(bed: &PgBed) {
    for (f, done) in &bed.done {
        println!("postgres chaos: {} ({f:?}): {} times", pg_name(*f), done.len());
        for d in done {
            println!("    {d}");
        }
    }
}

#[test]
fn chaos_on_the_postgres_store_never_overlaps_terms_or_lands_a_stale_write() {
    legend();
    let mut bed = PgBed::new();
    engine::run(&mut bed, Scenario::OneLease);
    summary(&bed);
}

#[test]
fn chaos_on_the_postgres_store_with_spread_leases_reloads_and_yields_never_runs_a_plugin_twice() {
    engine::run(&mut PgBed::new(), Scenario::Spread);
}
