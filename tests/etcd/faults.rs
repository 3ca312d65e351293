//! Faults a fleet meets, on a 3-member etcd cluster of the test's own
//! ([`OwnCluster`]): a member killed, the raft leader killed or paused, a
//! compaction under the hosts' watches, quorum lost and regained, the
//! whole cluster restarted, one host's path black-holed, a member hung for
//! several leases. Real hosts whose guests (one honouring the change, one
//! ignoring it) append term-tagged records to one file, the witness of
//! `tests/e2e/witness.rs`: through every fault no two terms overlap, no
//! record is stamped after its term's force-stop time, and one host leads
//! afterwards, within twice the expiry and retry plus 2 s of the fault's
//! end.

#[allow(dead_code)]
#[path = "../kube/blackhole.rs"]
pub mod blackhole;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use self::blackhole::BlackHole;
use super::*;
use crate::env::OwnCluster;
use crate::support::*;
use crate::witness;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The timings of [`EtcdTest::head`].
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(1);

/// The longest a fleet may go without a leader after a fault is over:
/// twice the expiry and retry, plus 2 s for starting the new term on a
/// busy machine (the chaos engine's bound for a lease left wedged).
fn settle_bound() -> Duration {
    2 * (LD + RP) + SECS(2)
}

/// A cluster of the test's own and hosts on it, whose guests append
/// records to one file.
struct Fleet {
    hosts: Vec<Host>,
    /// Its scratch folder holds the configuration and the records.
    #[allow(dead_code)]
    t: EtcdTest,
    records: PathBuf,
    cfg: PathBuf,
    cluster: OwnCluster,
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

impl Fleet {
    /// A cluster of its own and the configuration; no host yet.
    fn new(name: &str) -> Fleet {
        let cluster = OwnCluster::start();
        let t = EtcdTest::on(cluster.env(), name);
        let data = witness::records_dir(&t.scratch);
        let cfg = t.scratch.write(
            "baton.toml",
            &format!("{}\n[[lease]]\nname = \"demo\"\n{}", t.head(), appenders(&data)),
        );
        Fleet {
            hosts: Vec::new(),
            records: data.join("records"),
            cfg,
            t,
            cluster,
        }
    }

    /// Starts a host named `name` (naming itself in `PROBE_HOST`) with
    /// the variables `env`, and waits until its plugins are loaded.
    fn add(&mut self, name: &str, env: &[(&str, &str)]) -> usize {
        let mut vars = vec![("PROBE_HOST", name)];
        vars.extend_from_slice(env);
        let host = Host::start_opts(
            name,
            &self.cfg,
            Opts {
                env: &vars,
                ..Opts::default()
            },
        );
        host.wait_for(SECS(60), "plugins loaded", |e| {
            e.message() == "compiled-code cache"
        });
        self.hosts.push(host);
        self.hosts.len() - 1
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

    /// Stops the hosts (SIGTERM) and checks the records against their
    /// logs: every record stamped before its term's force-stop time, none
    /// of an older term after one of a newer, and each term's records
    /// before the next term's first. The terms that wrote.
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

fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
}

#[test]
fn members_killed_or_paused_and_a_compaction_leave_one_leader_and_no_record_past_its_term() {
    let mut f = Fleet::new("faults-members");
    for n in ["h1", "h2", "h3"] {
        f.add(n, &[]);
    }
    let (lead, term) = f.one_leader(SystemTime::now(), Some(SECS(60)), "at start");

    // A member that is not the raft leader killed for a lease duration:
    // the cluster keeps its quorum; requests on the dead member's
    // connections fail at once, and the leader renews through the others.
    let raft = f.cluster.leader();
    let victim = (raft + 1) % 3;
    f.cluster.kill(victim);
    std::thread::sleep(LD);
    f.cluster.revive();
    let (lead, term) = {
        let now = SystemTime::now();
        let after = f.one_leader(
            now,
            None,
            &format!("member m{victim} (not the raft leader) killed for {LD:?}"),
        );
        assert_eq!(
            after,
            (lead, term),
            "a member other than the raft leader was killed, and the lease changed hands; what the hosts \
             said:\n{}",
            f.story(now - LD - SECS(2), now)
        );
        after
    };

    // The raft leader killed for a lease duration: writes stall for an
    // election (about a second here), well inside the renew deadline.
    let raft = f.cluster.leader();
    f.cluster.kill(raft);
    std::thread::sleep(LD);
    f.cluster.revive();
    let (l, t) = f.one_leader(
        SystemTime::now(),
        None,
        &format!("raft leader m{raft} killed for {LD:?}"),
    );
    println!(
        "  the lease {} through the raft leader's death",
        if (l, t) == (lead, term) {
            "stayed with its leader".to_owned()
        } else {
            format!("moved from term {term} to {t}")
        }
    );

    // The raft leader paused past the renew deadline, then resumed: the
    // others elect a new raft leader; requests sent to the paused one hang
    // until their timeout.
    let (lead, term) = (l, t);
    let raft = f.cluster.leader();
    f.cluster.pause(raft);
    std::thread::sleep(RD + SECS(1));
    f.cluster.resume(raft);
    let (l, t) = f.one_leader(
        SystemTime::now(),
        None,
        &format!("raft leader m{raft} paused for {:?}", RD + SECS(1)),
    );
    println!(
        "  the lease {} through the pause",
        if (l, t) == (lead, term) {
            "stayed with its leader".to_owned()
        } else {
            format!("moved from term {term} to {t}")
        }
    );

    // Compactions to the current revision while the hosts run and watch:
    // nobody notices; the leader keeps its term.
    let (lead, term) = (l, t);
    let compacting = SystemTime::now();
    let mut revisions = Vec::new();
    for _ in 0..3 {
        let rev = f.cluster.revision();
        f.cluster.env().etcdctl(&["compact", &rev.to_string()]);
        revisions.push(rev);
        std::thread::sleep(2 * RP);
    }
    std::thread::sleep(LD);
    let after = f.one_leader(
        SystemTime::now(),
        None,
        &format!("compacted at revisions {revisions:?}"),
    );
    assert_eq!(
        after,
        (lead, term),
        "compactions changed the leader; what the hosts said:\n{}",
        f.story(compacting, SystemTime::now())
    );
    f.assert_nobody_led(compacting, SystemTime::now(), "during the compactions");
    let broke: Vec<String> = f
        .hosts
        .iter()
        .flat_map(|h| {
            h.all(|e| e.at >= compacting && e.message().starts_with("the lease watch broke"))
                .into_iter()
                .map(|e| format!("{}: {}", h.name, e.str("error").unwrap_or("")))
        })
        .collect();
    println!("  watches broken during the compactions: {broke:?}");
    f.finish();
}

#[test]
fn quorum_lost_stops_the_leader_by_its_renew_deadline_and_a_restarted_cluster_elects_one_leader() {
    let mut f = Fleet::new("faults-quorum");
    for n in ["h1", "h2", "h3"] {
        f.add(n, &[]);
    }
    let (lead, _) = f.one_leader(SystemTime::now(), Some(SECS(60)), "at start");

    // Two members of three killed (the raft leader survives, alone, until
    // it notices): nothing can be written. Longer than a lease: every
    // host's view of the lease expires meanwhile.
    let raft = f.cluster.leader();
    let (x, y) = ((raft + 1) % 3, (raft + 2) % 3);
    f.cluster.kill(x);
    f.cluster.kill(y);
    let lost = SystemTime::now();
    let hold = LD + SECS(1);
    let down = f.hosts[lead].wait_for(hold, "the leader stepping down", |e| {
        e.at >= lost && e.message() == "stepping down"
    });
    sleep_until(lost + hold);
    let reviving = SystemTime::now();
    f.cluster.revive();
    let revived = SystemTime::now();

    // The step-down's force-stop time is the last confirmed renewal's
    // start + RD + grace: no renewal was confirmed after the quorum was
    // lost (a few ms of leeway: the host's clock reading in the log), and
    // the leader said it stopped leading within RD + a retry period + 1 s
    // of that renewal.
    let force_stop = witness::force_stop_at(&down);
    let last_renewal = force_stop - GRACE - RD;
    let renewal_ms = ms_between(lost, last_renewal);
    let down_ms = ms_between(last_renewal, down.at);
    let margin = RP + SECS(1);
    println!(
        "quorum lost (m{x}, m{y} killed; m{raft} alone) for {hold:?}: the leader's last confirmed renewal began \
         {renewal_ms:.0} ms from the loss, it stepped down {down_ms:.0} ms after that renewal (bound RD + {} ms = \
         {} ms), force-stop {:.0} ms after the loss",
        margin.as_millis(),
        (RD + margin).as_millis(),
        ms_between(lost, force_stop)
    );
    assert!(
        down.str("reason").is_some_and(|r| r.contains("renew deadline")),
        "stepped down for another reason: {:?}",
        down.json
    );
    assert!(
        renewal_ms <= 20.0,
        "a renewal was confirmed {renewal_ms:.0} ms after the quorum was lost: {:?}",
        down.json
    );
    assert!(
        down_ms <= (RD + margin).as_secs_f64() * 1e3,
        "the leader stopped leading {down_ms:.0} ms after its last confirmed renewal (renew deadline {RD:?}); \
         its log:\n{}",
        f.story(lost - RD, down.at)
    );
    for p in ["coop", "stubborn"] {
        let stop = f.hosts[lead].wait_for(SECS(10), "its guest's stop", |e| {
            e.at >= lost && e.is("leader task stopped", Some(p))
        });
        let late = ms_between(lost, witness::force_stop_at(&stop));
        assert!(
            late <= (RD + GRACE).as_secs_f64() * 1e3 + 20.0,
            "{p}'s force-stop time is {late:.0} ms after the loss, past RD + grace: {:?}",
            stop.json
        );
    }
    f.assert_nobody_led(lost, reviving, "without a quorum");
    f.one_leader(revived, None, "after the quorum came back");

    // Every member killed, then started again on its data.
    let (lead, term) = f.one_leader(revived, None, "before the whole cluster is killed");
    let killed = SystemTime::now();
    for n in 0..3 {
        f.cluster.kill(n);
    }
    std::thread::sleep(SECS(1));
    f.cluster.revive();
    let back = SystemTime::now();
    let (l, t) = f.one_leader(back, None, "after the whole cluster restarted");
    println!(
        "  the cluster was down for {:.0} ms; the lease {}",
        ms_between(killed, back),
        if (l, t) == (lead, term) {
            "stayed with its leader".to_owned()
        } else {
            format!("moved from term {term} to {t}")
        }
    );
    assert!(t >= term, "term {t} after term {term}");
    f.finish();
}

#[test]
fn a_black_holed_leader_stops_by_its_deadline_another_takes_over_and_a_black_holed_follower_costs_nothing() {
    let mut f = Fleet::new("faults-hole");
    // a reaches every member through a proxy the test cuts; b and c
    // directly.
    let holes: Vec<BlackHole> = f.cluster.addresses().into_iter().map(BlackHole::start).collect();
    let through = holes
        .iter()
        .map(|h| format!("http://127.0.0.1:{}", h.port))
        .collect::<Vec<_>>()
        .join(",");
    let a = f.add("a", &[("BATON_ETCD_ENDPOINTS", &through)]);
    f.one_leader(SystemTime::now(), Some(SECS(60)), "a alone");
    f.add("b", &[]);
    f.add("c", &[]);
    std::thread::sleep(SECS(1));
    let (lead, term) = f.one_leader(SystemTime::now(), None, "three hosts");
    assert_eq!(lead, a, "a led first");

    // Cut a's path without closing it: its renewals hang.
    for h in &holes {
        h.cut(true);
    }
    let cut = SystemTime::now();
    let down = f.hosts[a].wait_for(SECS(30), "a stepping down", |e| {
        e.at >= cut && e.message() == "stepping down"
    });
    let force_stop_ms = ms_between(cut, witness::force_stop_at(&down));
    let mut force_stop = cut;
    for p in ["coop", "stubborn"] {
        let e = f.hosts[a].wait_for(SECS(30), "a's guest stopped", |e| {
            e.at >= cut && e.is("leader task stopped", Some(p))
        });
        force_stop = force_stop.max(witness::force_stop_at(&e));
    }
    let (l, t) = f.one_leader(cut, None, "a black-holed");
    let taken = f.hosts[l].wait_for(SECS(1), "the new leader's status", |e| {
        is_leading(e) && e.u64("term") == Some(t)
    });
    println!(
        "  a stepped down {:.0} ms after the cut, force-stop time {force_stop_ms:.0} ms after it (RD + grace = \
         {} ms); {} took over {:.0} ms after the cut, {:.0} ms after a's last force-stop time",
        ms_between(cut, down.at),
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
    assert!(
        taken.at >= force_stop,
        "{} led before a's force-stop time",
        f.hosts[l].name
    );

    // Restored: the bytes held meanwhile (a's renewals, which it gave up)
    // reach etcd now and find the record moved on. a follows.
    for h in &holes {
        h.cut(false);
    }
    let restored = SystemTime::now();
    std::thread::sleep(LD);
    let after = f.one_leader(restored, None, "a's path restored");
    assert_eq!(after, (l, t), "a's held requests moved the lease");
    f.assert_follows(a, l);

    // a, now a follower, cut off past a lease: nothing changes for the
    // others, and a takes nothing (its attempts are held, then refused).
    for h in &holes {
        h.cut(true);
    }
    let cut = SystemTime::now();
    std::thread::sleep(LD + SECS(1));
    for h in &holes {
        h.cut(false);
    }
    let restored = SystemTime::now();
    std::thread::sleep(LD);
    let after = f.one_leader(restored, None, "a black-holed as a follower, then restored");
    assert_eq!(after, (l, t), "a black-holed follower moved the lease");
    f.assert_nobody_led(cut, SystemTime::now(), "with a follower black-holed");
    f.assert_follows(a, l);
    f.finish();
}

#[test]
fn a_member_hung_for_several_leases_leaves_the_leader_its_term() {
    // One member of three frozen (SIGSTOP: a stalled process or disk, as a
    // half-open path to it looks the same): it accepts connections and
    // requests and answers nothing. The cluster keeps its quorum, and the
    // other two answer at once; a fleet on it should not notice.
    let mut f = Fleet::new("faults-hung");
    for n in ["h1", "h2", "h3"] {
        f.add(n, &[]);
    }
    let (lead, term) = f.one_leader(SystemTime::now(), Some(SECS(60)), "at start");
    let raft = f.cluster.leader();
    let victim = (raft + 1) % 3;
    let hung = 5 * LD;
    f.cluster.pause(victim);
    let paused = SystemTime::now();
    std::thread::sleep(hung);
    f.cluster.resume(victim);
    let resumed = SystemTime::now();
    let after = f.one_leader(
        resumed,
        None,
        &format!("member m{victim} (not the raft leader) hung for {hung:?}"),
    );
    let count = |h: &Host, what: &str| {
        h.all(|e| e.at >= paused && e.at <= resumed && e.message().starts_with(what))
            .len()
    };
    let leader = &f.hosts[lead];
    let (timeouts, downs) = (count(leader, "renewal timed out"), count(leader, "stepping down"));
    let changes = f
        .hosts
        .iter()
        .map(|h| count(h, "lease status changed"))
        .sum::<usize>();
    let story = f.story(paused, resumed);
    println!(
        "  {}: {timeouts} renewals timed out, {downs} step-downs; {changes} status changes on the three hosts",
        leader.name
    );
    // The promise holds either way.
    f.finish();
    assert!(
        after == (lead, term) && downs == 0,
        "a member hung for {hung:?} (the other two answering) cost the leader its term {downs} times \
         ({timeouts} renewals timed out): requests keep going to the hung member, each one lost for a whole \
         request-timeout; what the hosts said:\n{story}"
    );
}

#[test]
fn a_cluster_restored_from_an_older_snapshot_under_a_running_host_never_repeats_a_term() {
    // An operator restores the cluster from a snapshot taken two terms
    // ago while a host runs: the record and its floor go back to term t1,
    // revisions and raft terms go back too. The host that saw t3 must
    // notice, read afresh, and never give out t2 or t3 again.
    let mut f = Fleet::new("faults-restore");
    for n in ["h1", "h2", "h3"] {
        f.add(n, &[]);
    }
    let (first, t1) = f.one_leader(SystemTime::now(), Some(SECS(60)), "at start");
    let snapshot = f.t.scratch.dir.path().join("snapshot.db");
    f.cluster.script(&["snapshot", &snapshot.display().to_string()]);
    // Two hand-overs by release: the last host left leads t3.
    let stopped = f.hosts[first].sigterm();
    assert!(f.hosts[first].wait_exit(SECS(30)).success());
    let (second, t2) = f.one_leader(stopped, None, "the first leader stopped");
    assert!(t2 > t1, "term {t2} after {t1}");
    let stopped = f.hosts[second].sigterm();
    assert!(f.hosts[second].wait_exit(SECS(30)).success());
    let (last, t3) = f.one_leader(stopped, None, "the second leader stopped");
    assert!(t3 > t2, "term {t3} after {t2}");

    let restoring = SystemTime::now();
    f.cluster.script(&["restore", &snapshot.display().to_string()]);
    let restored = SystemTime::now();
    println!(
        "restore: the cluster was restored to term {t1}'s snapshot in {:.0} ms",
        ms_between(restoring, restored)
    );
    // The record read back names the first leader in t1; the last host
    // must fail its renewal (the bytes differ), stop, and take the lease
    // again above every term it saw.
    let host = &f.hosts[last];
    let host_name = host.name.clone();
    host.wait_for(SECS(30), "the host notices the cluster went back", |e| {
        e.at >= restoring && e.message().starts_with("the etcd cluster went back")
    });
    let again = host.wait_for(SECS(60), "the last host leads again", |e| {
        e.at >= restoring && is_leading(e)
    });
    let t4 = again.u64("term").expect("a term");
    assert!(
        t4 > t3,
        "after the restore {} leads term {t4}, not above the {t3} it led before: a term given out twice",
        host.name
    );
    // A host started after the restore follows and never leads a term
    // given out before.
    let newcomer = f.add("h4", &[]);
    let last = f.hosts.iter().position(|h| h.name == host_name).unwrap();
    f.assert_follows(newcomer, last);
    println!(
        "restore: {host_name} led term {t3} (after {t1} and {t2}); after the restore to {t1}'s snapshot it \
         leads {t4}, {:.0} ms after the restore",
        ms_between(restored, again.at)
    );
    // Each term's records come from one host, and terms never overlap.
    f.finish();
}
