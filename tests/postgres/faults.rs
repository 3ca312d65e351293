//! Faults of the server under the store and under real hosts: the primary
//! restarted (fast, immediate), every backend terminated, the primary
//! paused past the renew deadline, one host's path black-holed, and a
//! failover to a standby that missed the newest writes. Each on an
//! environment of the test's own ([`OwnServer`]).
//!
//! The host tests run three real hosts whose guests (one honouring the
//! change, one ignoring it) append term-tagged records to one file, the
//! witness of `tests/e2e/witness.rs`: through every fault no two terms
//! overlap, no record is stamped after its term's force-stop time, a host
//! that takes the lease over from one that lost it leads only after that
//! one's force-stop time, and one host leads afterwards, within twice the
//! expiry and retry plus 2 s of the fault's end.

#[allow(dead_code)]
#[path = "../kube/blackhole.rs"]
pub mod blackhole;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use baton::store::LeaseRecord;
use baton::store::postgres::BEFORE_PROMOTION;

use self::blackhole::BlackHole;
use super::env::OwnServer;
use super::*;
use crate::support::*;
use crate::witness;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The timings of [`PgTest::head`].
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(1);
/// The terms one timeline may give out: the first term after a promotion
/// is above it (`docs/postgres.md#failover`).
const JUMP: u64 = 1_000_000_000;

/// A record held by `holder` in `term`.
fn held(holder: &str, term: u64) -> LeaseRecord {
    LeaseRecord::new(Some(holder), term, Duration::from_secs(4))
}

#[test]
fn after_a_failover_that_lost_writes_no_term_is_given_twice_and_the_old_holder_is_waited_out() {
    let own = OwnServer::start();
    let t = PgTest::on(own.env(), "failover");
    let a = t.store_at(&t.env.failover_url);
    let v1 = t.rt.block_on(a.create("demo", &held("a", 1))).unwrap();
    // Replicated, then cut off: the next term is written on the primary
    // only.
    std::thread::sleep(Duration::from_millis(500));
    own.script(&["hold-replication"]);
    let released = LeaseRecord::new(None, 1, baton::store::RELEASED_LEASE_DURATION);
    let v2 = t.rt.block_on(a.update("demo", &v1.version, &released)).unwrap();
    let v3 =
        t.rt.block_on(a.update("demo", &v2.version, &held("b", 2)))
            .unwrap();
    assert_eq!(v3.record.term, 2);
    own.script(&["failover"]);
    // A host that knew nothing: it finds term 1 held... by nobody known,
    // in a term above every term the lost timeline can have given.
    let c = t.store_at(&own.env().failover_url);
    let seen =
        t.rt.block_on(c.get("demo"))
            .unwrap()
            .expect("the record survived");
    assert_eq!(seen.record.holder(), Some(BEFORE_PROMOTION));
    assert!(seen.record.term >= 1_000_000_000, "{:?}", seen.record);
    // The release it may have read before: not written over.
    let stale = t.rt.block_on(c.update("demo", &v2.version, &held("c", 2)));
    assert!(stale.is_err_and(|e| e.is_conflict()));
    let taken =
        t.rt.block_on(c.update("demo", &seen.version, &held("c", seen.record.term + 1)))
            .expect("taken over the unknown holder");
    assert!(taken.record.term > 1_000_000_000);
    // The lost term's holder, back on the new primary: its version is gone.
    let b = t.rt.block_on(a.update("demo", &v3.version, &held("b", 2)));
    assert!(b.is_err_and(|e| e.is_conflict()));
}

/// The longest a fleet may go without a leader after a fault is over:
/// twice the expiry and retry, plus 2 s for starting the new term on a
/// busy machine (the chaos engine's bound for a lease left wedged).
fn settle_bound() -> Duration {
    2 * (LD + RP) + SECS(2)
}

/// A server of the test's own and hosts on it, whose guests append
/// records to one file.
struct Fleet {
    hosts: Vec<Host>,
    /// Its scratch folder holds the configurations and the records.
    t: PgTest,
    records: PathBuf,
    plugins: String,
    own: OwnServer,
}

/// `[[plugin]]` tables of two guests on "demo" appending a record every
/// 5 ms each to `dir/records`: a pollable one that honours the change, a
/// future one that ignores it (stopped by force at its term's force-stop).
fn appenders(dir: &Path) -> String {
    let mut text = String::new();
    for (name, world, ignore) in [("coop", "pollable", false), ("stubborn", "future", true)] {
        text.push_str(&format!(
            "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\ninherit-env = [\"PROBE_HOST\"]\n\
             env = {{ PROBE_MODE = \"append\", PROBE_TICK_MS = \"5\", PROBE_TAG = {name:?}{} }}\n\
             dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            guest(&format!("probe_{world}.wasm")).display().to_string(),
            if ignore { ", PROBE_IGNORE = \"1\"" } else { "" },
            dir.display().to_string(),
        ));
    }
    text
}

fn is_leading(e: &Event) -> bool {
    e.message() == "lease status changed"
        && e.str("role") == Some("leading")
        && e.str("lease") == Some("demo")
}

/// `url` with `port` in place of the primary's port `primary`.
fn through_port(url: &str, primary: u16, port: u16) -> String {
    let from = format!("127.0.0.1:{primary}/");
    assert!(url.contains(&from), "{url} names no 127.0.0.1:{primary}");
    url.replacen(&from, &format!("127.0.0.1:{port}/"), 1)
}

impl Fleet {
    /// A server of its own; no host yet.
    fn new(name: &str) -> Fleet {
        let own = OwnServer::start();
        let t = PgTest::on(own.env(), name);
        let data = witness::records_dir(&t.scratch);
        Fleet {
            hosts: Vec::new(),
            records: data.join("records"),
            plugins: appenders(&data),
            t,
            own,
        }
    }

    /// Starts a host named `name` (naming itself in `PROBE_HOST`) on the
    /// store at `url`, and waits until its plugins are loaded.
    fn add(&mut self, name: &str, url: &str) -> usize {
        let cfg = self.t.scratch.write(
            &format!("baton-{name}.toml"),
            &format!(
                "{}\n[[lease]]\nname = \"demo\"\n{}",
                self.t.head_at(url),
                self.plugins
            ),
        );
        let host = Host::start_opts(
            name,
            &cfg,
            Opts {
                env: &[("PROBE_HOST", name)],
                ..Opts::default()
            },
        );
        host.wait_for(SECS(60), "plugins loaded", |e| {
            e.message() == "compiled-code cache"
        });
        self.hosts.push(host);
        self.hosts.len() - 1
    }

    /// Three hosts, h1 to h3, on the store at `url`; the first leader and
    /// its term, its guests writing.
    fn three(name: &str, url: impl Fn(&Fleet) -> String) -> (Fleet, usize, u64) {
        let mut f = Fleet::new(name);
        let url = url(&f);
        for n in ["h1", "h2", "h3"] {
            f.add(n, &url);
        }
        let (lead, term) = f.one_leader(SystemTime::now(), Some(SECS(60)), "at start");
        // Its guests at work for a moment.
        std::thread::sleep(SECS(1));
        (f, lead, term)
    }

    /// The hosts that lead "demo" now, by their logs: (index, term).
    fn leaders(&self) -> Vec<(usize, u64)> {
        self.hosts
            .iter()
            .enumerate()
            .filter_map(|(i, h)| witness::leading_term(h).map(|t| (i, t)))
            .collect()
    }

    /// Whether the guests of `term` wrote a record stamped at or after
    /// `since` (records are appended in time order: the last one tells).
    fn written_since(&self, term: u64, since: SystemTime) -> bool {
        let text = std::fs::read_to_string(&self.records).unwrap_or_default();
        let prefix = format!("term={term} ");
        text.lines()
            .rev()
            .find(|l| l.starts_with(&prefix))
            .is_some_and(|l| witness::Record::parse(0, l).at >= since)
    }

    /// Waits until exactly one host leads, at most [`settle_bound`] after
    /// `since`, when a fault was over (`bound` instead, if given), then
    /// until its guests write in its term after `since` (30 s more at
    /// most: starting guests on a busy machine); `what` names the fault.
    /// The leader and its term (it may have led since before `since`).
    fn one_leader(&self, since: SystemTime, bound: Option<Duration>, what: &str) -> (usize, u64) {
        let bound = bound.unwrap_or_else(settle_bound);
        let (lead, term) = loop {
            let now = SystemTime::now();
            if let [(i, t)] = self.leaders()[..] {
                break (i, t);
            }
            assert!(
                ms_between(since, now) <= bound.as_secs_f64() * 1e3,
                "{what}: no single leader {bound:?} on (leading: {:?}); what the hosts said:\n{}",
                self.leaders(),
                self.story(since - LD, now)
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let until = Instant::now() + SECS(30);
        while !self.written_since(term, since) {
            assert!(
                Instant::now() < until,
                "{what}: {} leads term {term}, but its guests wrote nothing in it for 30 s; its log:\n{}",
                self.hosts[lead].name,
                tail(&self.hosts[lead].output(), 40)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            self.leaders(),
            [(lead, term)],
            "{what}: another host led meanwhile"
        );
        // When it said it leads: before `since` if it kept its term.
        let led = self.hosts[lead]
            .all(|e| is_leading(e) && e.u64("term") == Some(term))
            .last()
            .map_or(0.0, |e| ms_between(since, e.at));
        println!(
            "{what}: {} leads term {term}, from {led:+.0} ms (bound {} ms), its guests writing {:.0} ms on",
            self.hosts[lead].name,
            bound.as_millis(),
            ms_between(since, SystemTime::now())
        );
        (lead, term)
    }

    /// What the hosts logged between `from` and `to` but their guests'
    /// lines, in time order.
    fn story(&self, from: SystemTime, to: SystemTime) -> String {
        let mut lines: Vec<(SystemTime, String)> = Vec::new();
        for h in &self.hosts {
            for e in h.all(|e| e.at >= from && e.at <= to && e.str("target") != Some("guest")) {
                lines.push((e.at, format!("  {}: {}", h.name, e.json)));
            }
        }
        lines.sort();
        lines.into_iter().map(|(_, l)| l + "\n").collect()
    }

    /// Waits (30 s at most) until host `i` says it follows host `leader`.
    fn assert_follows(&self, i: usize, leader: usize) {
        let until = Instant::now() + SECS(30);
        loop {
            let last = self.hosts[i]
                .all(|e| e.message() == "lease status changed" && e.str("lease") == Some("demo"))
                .pop();
            if last.as_ref().is_some_and(|e| {
                e.str("role") == Some("following") && e.str("holder") == Some(&self.hosts[leader].name)
            }) {
                return;
            }
            assert!(
                Instant::now() < until,
                "{} does not follow {} after 30 s; its last status: {:?}",
                self.hosts[i].name,
                self.hosts[leader].name,
                last.map(|e| e.json)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// No host logged that it leads between `from` and `to`.
    fn assert_nobody_led(&self, from: SystemTime, to: SystemTime, what: &str) {
        for h in &self.hosts {
            let led = h.all(|e| e.at > from && e.at < to && is_leading(e));
            assert!(led.is_empty(), "{what}: {} led: {:?}", h.name, led[0].json);
        }
    }

    /// Host `i`'s guests of `term` both stopped after `since` (30 s at
    /// most): the latest force-stop time they logged.
    fn stopped(&self, i: usize, term: u64, since: SystemTime, what: &str) -> SystemTime {
        let mut force_stop = SystemTime::UNIX_EPOCH;
        for p in ["coop", "stubborn"] {
            let e = self.hosts[i].wait_for(SECS(30), what, |e| {
                e.at >= since && e.is("leader task stopped", Some(p)) && e.u64("term") == Some(term)
            });
            force_stop = force_stop.max(witness::force_stop_at(&e));
        }
        force_stop
    }

    /// Host `new` began leading `new_term` after the force-stop time of
    /// `old_term` that host `old` logged: the take-over of a lease its
    /// holder lost (not released) waited until its guests were stopped.
    fn assert_took_over_after(&self, old: usize, old_term: u64, new: usize, new_term: u64, what: &str) {
        let force_stop = self.hosts[old]
            .all(|e| e.is("leader task stopped", None) && e.u64("term") == Some(old_term))
            .iter()
            .map(witness::force_stop_at)
            .max()
            .unwrap_or_else(|| {
                panic!(
                    "{what}: {} logged no stop of term {old_term}",
                    self.hosts[old].name
                )
            });
        let taken = self.hosts[new]
            .all(|e| is_leading(e) && e.u64("term") == Some(new_term))
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("{what}: {} never said it leads {new_term}", self.hosts[new].name));
        println!(
            "  {what}: {} led term {new_term} {:.0} ms after {}'s force-stop time of term {old_term}",
            self.hosts[new].name,
            ms_between(force_stop, taken.at),
            self.hosts[old].name
        );
        assert!(
            taken.at >= force_stop,
            "{what}: {} led term {new_term} {:.0} ms before {}'s force-stop time of term {old_term}; what the \
             hosts said:\n{}",
            self.hosts[new].name,
            ms_between(taken.at, force_stop),
            self.hosts[old].name,
            self.story(force_stop - LD - RD, taken.at + SECS(1))
        );
    }

    /// Lines of every host whose message starts with `what` after `since`.
    fn count(&self, since: SystemTime, what: &str) -> BTreeMap<String, usize> {
        self.hosts
            .iter()
            .map(|h| {
                (
                    h.name.clone(),
                    h.all(|e| e.at >= since && e.message().starts_with(what)).len(),
                )
            })
            .collect()
    }

    /// Stops the hosts (SIGTERM) and checks the records against their
    /// logs: every record stamped before its term's force-stop time, none
    /// of an older term after one of a newer, each term's records from one
    /// host, and each term's records before the next term's first. The
    /// terms that wrote.
    fn finish(mut self) -> Vec<u64> {
        for h in &mut self.hosts {
            if h.exited().is_none() {
                h.sigterm();
            }
        }
        for h in &mut self.hosts {
            let status = h.wait_exit(SECS(30));
            assert!(
                status.success(),
                "{} exited with {status}:\n{}",
                h.name,
                tail(&h.output(), 40)
            );
        }
        let seen = witness::check_records(&self.records, &self.hosts);
        let text = std::fs::read_to_string(&self.records).unwrap();
        let mut spans: BTreeMap<u64, (String, SystemTime, SystemTime)> = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let r = witness::Record::parse(n, line);
            let span = spans.entry(r.term).or_insert((r.host.clone(), r.at, r.at));
            assert_eq!(
                span.0,
                r.host,
                "line {}: term {} written by two hosts",
                n + 1,
                r.term
            );
            span.1 = span.1.min(r.at);
            span.2 = span.2.max(r.at);
        }
        let spans: Vec<_> = spans.into_iter().collect();
        for pair in spans.windows(2) {
            let ((t1, (h1, _, last)), (t2, (h2, first, _))) = (&pair[0], &pair[1]);
            assert!(
                last < first,
                "term {t1} ({h1}) wrote until {:.1} ms after term {t2} ({h2}) began",
                ms_between(*first, *last)
            );
        }
        println!(
            "witness: {} records in terms {:?}, each stamped before its term's force-stop, no two terms \
             overlapping",
            seen.records, seen.terms
        );
        seen.terms.into_iter().collect()
    }
}

/// What became of the lease through a fault: kept or moved.
fn outcome(before: (usize, u64), after: (usize, u64)) -> String {
    if after == before {
        "stayed with its leader".to_owned()
    } else {
        format!("moved from term {} to {}", before.1, after.1)
    }
}

/// The primary restarted with `-m mode` under three hosts: once by
/// `pg_ctl restart` (down for as long as it takes), then stopped for
/// longer than a lease and started again.
fn restarted(mode: &str) {
    let (f, lead, term) = Fleet::three(&format!("faults-restart-{mode}"), |f| f.t.env.url.clone());
    let began = SystemTime::now();
    f.own.script(&["restart", "primary", mode]);
    let back = SystemTime::now();
    let what = format!(
        "the primary restarted -m {mode} (down and up again in {:.0} ms)",
        ms_between(began, back)
    );
    let (l, t) = f.one_leader(back, None, &what);
    println!(
        "  the lease {}; renewal failures {:?}, step-downs {:?}, watches broken {:?}",
        outcome((lead, term), (l, t)),
        f.count(began, "renewal"),
        f.count(began, "stepping down"),
        f.count(began, "the lease watch broke")
    );
    assert!(t >= term, "term {t} after term {term}");
    if (l, t) != (lead, term) {
        assert!(t > term, "{} leads term {t}, not above {term}", f.hosts[l].name);
        f.stopped(lead, term, began, "the old leader's guests stopped");
        if l != lead {
            f.assert_took_over_after(lead, term, l, t, &what);
        }
    }

    // Stopped past a lease: the leader's last confirmed renewal began
    // before the server refused new work, so its force-stop time is at
    // most RD + grace after the stop; nobody leads until the server is
    // back; then one host does, in a newer term.
    std::thread::sleep(SECS(1));
    let (lead, term) = (l, t);
    let stopping = SystemTime::now();
    f.own.script(&["stop", "primary", mode]);
    let stopped = SystemTime::now();
    let down = f.hosts[lead].wait_for(RD + SECS(5), "the leader stepping down", |e| {
        e.at >= stopping && e.message() == "stepping down"
    });
    sleep_until(stopped + LD + SECS(1));
    let starting = SystemTime::now();
    f.own.script(&["start-node", "primary"]);
    let started = SystemTime::now();
    let force_stop = f.stopped(lead, term, stopping, "the leader's guests stopped");
    let late = ms_between(stopped, force_stop);
    println!(
        "the primary stopped -m {mode} (in {:.0} ms) for {:.0} ms, started in {:.0} ms: the leader stepped down \
         {:.0} ms after the stop ({}), force-stop time {late:.0} ms after it (bound RD + grace = {} ms)",
        ms_between(stopping, stopped),
        ms_between(stopped, starting),
        ms_between(starting, started),
        ms_between(stopped, down.at),
        down.str("reason").unwrap_or("?"),
        (RD + GRACE).as_millis()
    );
    // (A few ms of leeway: the host's clock reading in the log.)
    assert!(
        late <= (RD + GRACE).as_secs_f64() * 1e3 + 20.0,
        "the leader's force-stop time is {late:.0} ms after the server stopped, past RD + grace: {:?}",
        down.json
    );
    f.assert_nobody_led(stopped, starting, "with the primary stopped");
    let what = format!("the primary stopped -m {mode} past a lease and started again");
    let (l, t) = f.one_leader(started, None, &what);
    assert!(
        t > term,
        "term {t} after {term}: the leader kept a term it could not renew"
    );
    if l != lead {
        f.assert_took_over_after(lead, term, l, t, &what);
    }
    f.finish();
}

#[test]
fn the_primary_restarted_fast_under_running_hosts_leaves_one_leader_and_no_record_past_its_term() {
    restarted("fast");
}

#[test]
fn the_primary_restarted_immediately_under_running_hosts_leaves_one_leader_and_no_record_past_its_term() {
    restarted("immediate");
}

#[test]
fn every_backend_terminated_under_running_hosts_costs_the_leader_nothing() {
    // pg_terminate_backend of every connection of the hosts' role, the
    // watches' included: each pooled connection is found closed and
    // replaced, each watch reconnects and reads afresh. One renewal fails
    // at most; the renew deadline is four retry periods away.
    let (f, lead, term) = Fleet::three("faults-terminate", |f| f.t.env.url.clone());
    let began = SystemTime::now();
    let n = f.own.script(&["terminate"]);
    let done = SystemTime::now();
    let what = format!("{} backends terminated", n.trim());
    let after = f.one_leader(done, None, &what);
    std::thread::sleep(LD);
    let after_lease = f.one_leader(SystemTime::now(), None, &format!("{what}, a lease later"));
    let story = f.story(began - SECS(1), SystemTime::now());
    let (failed, downs) = (f.count(began, "renewal"), f.count(began, "stepping down"));
    println!(
        "  the lease {}; renewal failures {failed:?}, step-downs {downs:?}, watches broken {:?}",
        outcome((lead, term), after_lease),
        f.count(began, "the lease watch broke")
    );
    f.finish();
    assert!(
        after == (lead, term) && after_lease == (lead, term),
        "terminating the backends cost the leader its term ({failed:?} renewal failures, {downs:?} step-downs); \
         what the hosts said:\n{story}"
    );
}

#[test]
fn the_primary_paused_past_the_renew_deadline_stops_the_leader_by_its_deadline_and_one_leads_once_resumed() {
    // SIGSTOP of the postmaster and every backend: connections and
    // requests are accepted by the kernel and never answered, new
    // connections hang in their start-up. Nothing can be written, so the
    // leader's last confirmed renewal began before the pause, and its
    // force-stop time is at most RD + grace after it.
    let (f, lead, term) = Fleet::three("faults-pause", |f| f.t.env.url.clone());
    let pausing = SystemTime::now();
    f.own.script(&["pause", "primary"]);
    let paused = SystemTime::now();
    let down = f.hosts[lead].wait_for(RD + SECS(5), "the leader stepping down", |e| {
        e.at >= pausing && e.message() == "stepping down"
    });
    sleep_until(paused + RD + SECS(1));
    let resuming = SystemTime::now();
    f.own.script(&["resume", "primary"]);
    let resumed = SystemTime::now();
    let force_stop = f.stopped(lead, term, pausing, "the leader's guests stopped");
    let late = ms_between(paused, force_stop);
    println!(
        "the primary paused for {:.0} ms: the leader stepped down {:.0} ms after the pause ({}), force-stop time \
         {late:.0} ms after it (bound RD + grace = {} ms)",
        ms_between(paused, resuming),
        ms_between(paused, down.at),
        down.str("reason").unwrap_or("?"),
        (RD + GRACE).as_millis()
    );
    // (A few ms of leeway: the host's clock reading in the log.)
    assert!(
        late <= (RD + GRACE).as_secs_f64() * 1e3 + 20.0,
        "the leader's force-stop time is {late:.0} ms after the server froze, past RD + grace: {:?}",
        down.json
    );
    f.assert_nobody_led(paused, resuming, "with the primary paused");
    let (l, t) = f.one_leader(resumed, None, "the primary resumed");
    assert!(
        t > term,
        "term {t} after {term}: the paused leader kept a term it could not renew"
    );
    if l != lead {
        f.assert_took_over_after(lead, term, l, t, "after the pause");
    }
    f.finish();
}

#[test]
fn a_black_holed_leader_stops_by_its_deadline_another_takes_over_and_a_black_holed_follower_costs_nothing() {
    let mut f = Fleet::new("faults-hole");
    // a reaches the primary through a proxy the test cuts; b and c
    // directly.
    let env = f.t.env.clone();
    let hole = BlackHole::start(([127, 0, 0, 1], env.primary_port).into());
    let a = f.add("a", &through_port(&env.url, env.primary_port, hole.port));
    f.one_leader(SystemTime::now(), Some(SECS(60)), "a alone");
    f.add("b", &env.url);
    f.add("c", &env.url);
    std::thread::sleep(SECS(1));
    let (lead, term) = f.one_leader(SystemTime::now(), None, "three hosts");
    assert_eq!(lead, a, "a led first");

    // Cut a's path without closing it: its renewals hang.
    hole.cut(true);
    let cut = SystemTime::now();
    let down = f.hosts[a].wait_for(SECS(30), "a stepping down", |e| {
        e.at >= cut && e.message() == "stepping down"
    });
    let force_stop_ms = ms_between(cut, witness::force_stop_at(&down));
    let force_stop = f.stopped(a, term, cut, "a's guests stopped");
    let (l, t) = f.one_leader(cut, None, "a black-holed");
    let taken = f.hosts[l].wait_for(SECS(1), "the new leader's status", |e| {
        is_leading(e) && e.u64("term") == Some(t)
    });
    println!(
        "  a stepped down {:.0} ms after the cut ({}), force-stop time {force_stop_ms:.0} ms after it (RD + grace \
         = {} ms); {} took over {:.0} ms after the cut, {:.0} ms after a's last force-stop time",
        ms_between(cut, down.at),
        down.str("reason").unwrap_or("?"),
        (RD + GRACE).as_millis(),
        f.hosts[l].name,
        ms_between(cut, taken.at),
        ms_between(force_stop, taken.at)
    );
    // (A few ms of leeway: the host's clock reading in the log.)
    assert!(
        force_stop_ms <= (RD + GRACE).as_secs_f64() * 1e3 + 20.0,
        "a's force-stop time is {force_stop_ms:.0} ms after the cut, past RD + grace: {:?}",
        down.json
    );
    assert_ne!(l, a, "a led again while cut off");
    assert!(t > term, "term {t} after {term}");
    f.assert_took_over_after(a, term, l, t, "a black-holed");

    // Restored: the bytes held meanwhile (a's renewals, which it gave up)
    // reach the server now and find the record moved on. a follows.
    hole.cut(false);
    let restored = SystemTime::now();
    std::thread::sleep(LD);
    let after = f.one_leader(restored, None, "a's path restored");
    assert_eq!(after, (l, t), "a's held requests moved the lease");
    f.assert_follows(a, l);

    // a, now a follower, cut off past a lease: nothing changes for the
    // others, and a takes nothing (its attempts are held, then refused).
    hole.cut(true);
    let cut = SystemTime::now();
    std::thread::sleep(LD + SECS(1));
    hole.cut(false);
    let restored = SystemTime::now();
    std::thread::sleep(LD);
    let after = f.one_leader(restored, None, "a black-holed as a follower, then restored");
    assert_eq!(after, (l, t), "a black-holed follower moved the lease");
    f.assert_nobody_led(cut, SystemTime::now(), "with a follower black-holed");
    f.assert_follows(a, l);
    let ends = hole.ends();
    println!(
        "  a's connections through the proxy ended {} times ({} by a reset)",
        ends.len(),
        ends.iter().filter(|e| e.reset).count()
    );
    f.finish();
}

#[test]
fn a_failover_that_lost_a_terms_start_stops_its_holder_and_gives_no_term_twice() {
    // The hosts reach both nodes (target_session_attrs=read-write). The
    // standby is cut off from the primary, then the lease changes hands
    // (its leader paused past its lease): the new term's start and its
    // renewals are on the primary only. The primary dies, the standby is
    // promoted: its record is the first term's, the second term is lost.
    let (f, first, t1) = Fleet::three("faults-failover", |f| f.t.env.failover_url.clone());
    let schema = f.t.schema.clone();
    f.own.script(&["hold-replication"]);
    let holding = SystemTime::now();
    let h = &f.hosts[first];
    h.signal(libc::SIGSTOP);
    std::thread::sleep(LD + SECS(1));
    let resumed = h.signal(libc::SIGCONT);
    let (second, t2) = f.one_leader(
        resumed,
        None,
        "the first leader paused past its lease, replication held",
    );
    assert!(
        t2 > t1 && second != first,
        "term {t2} of {second} after {t1} of {first}"
    );
    // The second term at work, its renewals on the primary only.
    std::thread::sleep(SECS(1));
    let lag = f.own.script(&["lag"]);
    let failing = SystemTime::now();
    let timeline = f.own.script(&["failover"]);
    let failed = SystemTime::now();
    let env = f.own.env();
    // Before any host can write (a record of the old timeline is waited
    // out for a lease duration): the promoted node's record.
    let on_new = env.psql(&format!(
        "SELECT term || ' ' || (record::json->>'holder') FROM {schema}.leases WHERE name = 'demo'"
    ));
    println!(
        "failover: replication held {:.0} ms before it ({}), the primary killed and the standby promoted in {:.0} \
         ms, timeline {}; the promoted node's record: term and holder {on_new:?}",
        ms_between(holding, failing),
        lag.trim(),
        ms_between(failing, failed),
        timeline.trim()
    );
    let lost_term: u64 = on_new
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no record of demo on the promoted node: {on_new:?}"));
    assert!(
        lost_term < t2,
        "the promoted node has term {lost_term}: the term {t2} started after replication was held was not lost"
    );

    // The lost term's holder stops: its version is gone, its renewals
    // fail, and it stops by its renew deadline at the latest.
    let down = f.hosts[second].wait_for(SECS(30), "the lost term's holder stepping down", |e| {
        e.at >= failing
            && (e.message() == "stepping down" || e.message() == "lost the lease while its tasks stop")
            && e.u64("term") == Some(t2)
    });
    let force_stop = f.stopped(second, t2, failing, "the lost term's guests stopped");
    let (l, t3) = f.one_leader(failed, None, "after the failover");
    println!(
        "  {} (term {t2}) stepped down {:.0} ms after the kill began ({}), force-stop time {:.0} ms after it; {} \
         leads term {t3}",
        f.hosts[second].name,
        ms_between(failing, down.at),
        down.str("reason").unwrap_or("?"),
        ms_between(failing, force_stop),
        f.hosts[l].name
    );
    assert!(
        ms_between(failing, force_stop)
            <= (RD + GRACE).as_secs_f64() * 1e3 + ms_between(failing, failed) + 20.0,
        "the lost term's force-stop time is past RD + grace after the primary died: {:?}",
        down.json
    );
    assert!(
        t3 > JUMP,
        "term {t3} after the failover: not above {JUMP}, the terms the old timeline may have given"
    );
    if l != second {
        f.assert_took_over_after(second, t2, l, t3, "after the failover");
    }
    // No host led a term of the old timeline after the failover began.
    for h in &f.hosts {
        for e in h.all(|e| e.at >= failing && is_leading(e)) {
            let t = e.u64("term").unwrap();
            assert!(
                t > JUMP,
                "{} led term {t} after the failover: {:?}",
                h.name,
                e.json
            );
        }
    }
    // Every host noticed the promotion.
    for h in &f.hosts {
        h.wait_for(SECS(30), "the promotion noticed", |e| {
            e.at >= failing
                && e.message()
                    .starts_with("the PostgreSQL server is on a new timeline")
        });
    }
    let terms = f.finish();
    let before: Vec<u64> = terms.iter().copied().filter(|t| *t <= t2).collect();
    let after: Vec<u64> = terms.iter().copied().filter(|t| *t > t2).collect();
    println!("  terms written before the failover {before:?}, after it {after:?}");
    assert!(
        after.iter().all(|t| *t > JUMP),
        "a term of the old timeline's range was written after the failover: {after:?}"
    );
}

fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
}
