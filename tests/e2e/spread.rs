//! Spreading the leads, the scenario both stores run: three hosts contend
//! for thirty leases, each gating one guest that appends term-tagged
//! records to a file of its lease. The hosts settle at ten leases each;
//! one is killed and the other two settle at fifteen; it comes back and
//! they settle at ten again. Then every lease's records are checked: no
//! record after its term's force-stop time (or, on the killed host, after
//! its death), and terms never going back, so no two hosts ever ran a
//! lease's guest at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::support::*;
use crate::witness::{Record, force_stop_at};

/// How many leases the hosts share.
pub const LEASES: usize = 30;

/// The name of lease `i`, and of the plugin it gates.
pub fn lease_name(i: usize) -> String {
    format!("lease-{i:02}")
}

fn plugin_name(i: usize) -> String {
    format!("p-{i:02}")
}

/// The leases and plugins of the scenario, after `head` (the `[store]`
/// and `[defaults]` tables); each lease's guest appends a record every
/// 200 ms to `data/lease-NN/records`.
pub fn spread_config(head: &str, data: &Path) -> String {
    let mut text = head.to_owned();
    let path = guest("probe_pollable.wasm").display().to_string();
    for i in 0..LEASES {
        let dir = data.join(lease_name(i));
        std::fs::create_dir_all(&dir).unwrap();
        text.push_str(&format!(
            "\n[[lease]]\nname = {lease:?}\n\n[[plugin]]\nname = {plugin:?}\npath = {path:?}\nlease = {lease:?}\n\
             inherit-env = [\"PROBE_HOST\"]\nenv = {{ PROBE_MODE = \"append\", PROBE_TAG = {plugin:?}, PROBE_TICK_MS = \"200\" }}\n\
             dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            dir.display().to_string(),
            lease = lease_name(i),
            plugin = plugin_name(i),
        ));
    }
    text
}

/// As [`spread_config`] with `n` leases, lease `i` with the lines of
/// `rules` for `i` in its table (`prefer = [...]`, `avoid = [...]`).
pub fn leases_config(head: &str, data: &Path, n: usize, rules: &[(usize, &str)]) -> String {
    let mut text = head.to_owned();
    let path = guest("probe_pollable.wasm").display().to_string();
    for i in 0..n {
        let dir = data.join(lease_name(i));
        std::fs::create_dir_all(&dir).unwrap();
        let extra: String = rules
            .iter()
            .filter(|(j, _)| *j == i)
            .map(|(_, r)| format!("{r}\n"))
            .collect();
        text.push_str(&format!(
            "\n[[lease]]\nname = {lease:?}\n{extra}\n[[plugin]]\nname = {plugin:?}\npath = {path:?}\nlease = {lease:?}\n\
             inherit-env = [\"PROBE_HOST\"]\nenv = {{ PROBE_MODE = \"append\", PROBE_TAG = {plugin:?}, PROBE_TICK_MS = \"200\" }}\n\
             dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            dir.display().to_string(),
            lease = lease_name(i),
            plugin = plugin_name(i),
        ));
    }
    text
}

/// Starts host `name` on `config`, its guests tagging records with it.
pub fn start_host(name: &str, config: &Path) -> Host {
    Host::start_opts(
        name,
        config,
        Opts {
            env: &[("PROBE_HOST", name)],
            ..Opts::default()
        },
    )
}

/// Waits until the hosts lead exactly the leases of `want` (one set per
/// host) and that holds for [`STEADY`]; returns how long it took until it
/// held. Panics after `within` + [`STEADY`].
pub fn wait_leads(hosts: &[&Host], want: &[BTreeSet<String>], within: Duration) -> Duration {
    let start = Instant::now();
    let mut held_since: Option<Instant> = None;
    loop {
        let sets: Vec<BTreeSet<String>> = hosts.iter().map(|h| led(h)).collect();
        if sets == want {
            let since = *held_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STEADY {
                return since - start;
            }
        } else {
            held_since = None;
        }
        assert!(
            start.elapsed() < within + STEADY,
            "the hosts lead {sets:?}, not {want:?}, after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Placement on `head`'s store: four leases, `lease-00` preferring b then
/// a, `lease-01` preferring b, `lease-02` avoiding a, `lease-03` free. a
/// alone leads all four (its preferred host b is not live; the one that
/// avoids a has no other host). Once b runs, the preferred and avoiding
/// leases go to b, over its bound of two, and a keeps the free one: the
/// rules decide, not the hashes. Every lease's records are checked.
pub fn prefer_and_avoid_decide(head: &str, data: &Path, cfg_name: &dyn Fn(&str) -> PathBuf) {
    let rules = [
        (0, "prefer = [\"b\", \"a\"]"),
        (1, "prefer = [\"b\"]"),
        (2, "avoid = [\"a\"]"),
    ];
    let cfg = cfg_name(&leases_config(head, data, 4, &rules));
    let set = |ls: &[usize]| -> BTreeSet<String> { ls.iter().map(|i| lease_name(*i)).collect() };
    let mut a = start_host("a", &cfg);
    wait_leads(&[&a], &[set(&[0, 1, 2, 3])], Duration::from_secs(60));
    let mut b = start_host("b", &cfg);
    let took = wait_leads(&[&a, &b], &[set(&[3]), set(&[0, 1, 2])], Duration::from_secs(60));
    eprintln!("prefer and avoid: b has its three {took:?} after it started");
    stop_and_check(data, &mut [&mut a, &mut b], 4);
}

/// Stops `hosts` by SIGTERM, each exiting cleanly, and checks the records
/// of the first `leases` leases against them.
fn stop_and_check(data: &Path, hosts: &mut [&mut Host], leases: usize) {
    for h in hosts.iter() {
        h.sigterm();
    }
    for h in hosts.iter_mut() {
        assert!(
            h.wait_exit(Duration::from_secs(20)).success(),
            "{} failed",
            h.name
        );
    }
    let hosts: Vec<&Host> = hosts.iter().map(|h| &**h).collect();
    check_leases(data, leases, &hosts);
}

/// Checks every record of leases `0..n` against the logs of `hosts`, which
/// exited after SIGTERM: no overlap.
pub fn check_leases(data: &Path, n: usize, hosts: &[&Host]) {
    let runs: Vec<Incarnation> = hosts
        .iter()
        .map(|h| Incarnation {
            host: h,
            killed: None,
        })
        .collect();
    for i in 0..n {
        let (records, terms) = check_lease(data, i, &runs);
        assert!(records > 0, "lease-{i:02} has records");
        eprintln!("lease-{i:02}: {records} records in {terms} terms, none overlapping");
    }
}

/// Weights on `head`'s store: six leases, a of weight 2 and b of weight 1
/// (each host's weight in its own file, read by the other from its
/// membership record). a alone leads all six; once b runs, they settle at
/// four and two (`M * w / W`), not three and three. Every lease's records
/// are checked.
pub fn weights_decide_the_shares(head: &str, data: &Path, cfg_name: &dyn Fn(&str, &str) -> PathBuf) {
    let body = leases_config(head, data, 6, &[]);
    let mut a = start_host("a", &cfg_name("a.toml", &format!("weight = 2\n{body}")));
    let mut b = start_host("b", &cfg_name("b.toml", &body));
    let start = Instant::now();
    let mut held_since: Option<Instant> = None;
    loop {
        let sets = [led(&a), led(&b)];
        let all: BTreeSet<&String> = sets.iter().flatten().collect();
        let counts = [sets[0].len(), sets[1].len()];
        if counts == [4, 2] && all.len() == 6 {
            if held_since.get_or_insert_with(Instant::now).elapsed() >= STEADY {
                break;
            }
        } else {
            held_since = None;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "weights 2 and 1: the hosts lead {sets:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "weights 2 and 1: four and two after {:?}",
        start.elapsed() - STEADY
    );
    stop_and_check(data, &mut [&mut a, &mut b], 6);
}

/// How long a spread must hold to count as settled: moves that follow a
/// change of the live hosts come a settle time (two retry periods) after
/// it, and must not be mistaken for a passing balance.
pub const STEADY: Duration = Duration::from_secs(3);

/// Waits until every lease is led by one of `hosts` (by one only) and each
/// leads `share` ± 1, and that holds for [`STEADY`]; returns how long it
/// took until it held (from the call). Panics after `within` + [`STEADY`].
/// Two hosts that lead one lease by their logs for a while do not fail it:
/// a status event is logged after the fact, by as much as a busy machine
/// delays it. That no two hosts ran a lease's guest at once is the records'
/// check ([`check_lease`]).
pub fn wait_spread(hosts: &[&Host], share: usize, within: Duration) -> Duration {
    let start = Instant::now();
    let mut held_since: Option<Instant> = None;
    loop {
        let sets: Vec<BTreeSet<String>> = hosts.iter().map(|h| led(h)).collect();
        let counts: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        let mut holders: BTreeMap<&String, usize> = BTreeMap::new();
        for s in &sets {
            for l in s {
                *holders.entry(l).or_default() += 1;
            }
        }
        let all_led = holders.len() == LEASES && holders.values().all(|n| *n == 1);
        if all_led && counts.iter().all(|c| c.abs_diff(share) <= 1) {
            let since = *held_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STEADY {
                return since - start;
            }
        } else {
            held_since = None;
        }
        assert!(
            start.elapsed() < within + STEADY,
            "no spread of {share} ± 1 within {within:?}: {counts:?}, {} of {LEASES} leases led",
            holders.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One run of a host process: its log, and when it was killed (`None`:
/// it exited by itself after SIGTERM).
pub struct Incarnation<'a> {
    pub host: &'a Host,
    pub killed: Option<SystemTime>,
}

/// Checks the records of lease `i` against the hosts' logs: each record
/// was stamped before its term's force-stop time (a killed host's terms:
/// before it was killed), and no record of an older term follows one of a
/// newer term. Returns the number of records and of terms.
pub fn check_lease(data: &Path, i: usize, runs: &[Incarnation]) -> (usize, usize) {
    let plugin = plugin_name(i);
    let mut bound: HashMap<(String, u64), SystemTime> = HashMap::new();
    for run in runs {
        let h = run.host;
        for e in h.all(|e| e.is("leader task stopped", Some(&plugin))) {
            bound.insert((h.name.clone(), e.u64("term").unwrap()), force_stop_at(&e));
        }
        if let Some(killed) = run.killed {
            for e in h.all(|e| e.guest_line(&plugin, "probe start")) {
                let term = e.guest_term().unwrap();
                bound.entry((h.name.clone(), term)).or_insert(killed);
            }
        }
    }
    let file: PathBuf = data.join(lease_name(i)).join("records");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let mut newest = 0;
    let mut terms = BTreeSet::new();
    let mut records = 0;
    for (n, line) in text.lines().enumerate() {
        let r = Record::parse(n, line);
        let Some(stop) = bound.get(&(r.host.clone(), r.term)) else {
            panic!(
                "{}: line {}: host {} logged no end for term {}",
                file.display(),
                n + 1,
                r.host,
                r.term
            );
        };
        let late = ms_between(*stop, r.at);
        assert!(
            late <= 5.0,
            "{}: line {}: stamped {late:.1} ms after its term's end",
            file.display(),
            n + 1
        );
        assert!(
            r.term >= newest,
            "{}: line {}: a record of term {} after one of term {newest}",
            file.display(),
            n + 1,
            r.term
        );
        newest = r.term;
        terms.insert(r.term);
        records += 1;
    }
    (records, terms.len())
}

/// The whole scenario on `config` (with `args` for `baton run`), the
/// killed host's share taken over within `failover` on an idle machine;
/// prints what it measured. (Only a share never taken over fails it: the
/// bound is twice `failover` and 10 s more, a wedged lease and not a busy
/// machine's slow one.)
pub fn three_hosts_share_thirty_leases(
    config: &Path,
    data: &Path,
    args: &[&std::ffi::OsStr],
    failover: Duration,
) {
    // Each host's admin address too: its timings, from its /metrics.
    let mut args = args.to_vec();
    args.extend([
        std::ffi::OsStr::new("--admin-address"),
        std::ffi::OsStr::new("127.0.0.1:0"),
    ]);
    let args = &args[..];
    let start = |name: &str| {
        Host::start_opts(
            name,
            config,
            Opts {
                env: &[("PROBE_HOST", name)],
                args,
                ..Opts::default()
            },
        )
    };
    let mut a = start("a");
    let mut b = start("b");
    let mut c = start("c");
    for h in [&a, &b, &c] {
        h.wait_for(Duration::from_secs(120), "plugins loaded", |e| {
            e.message() == "compiled-code cache"
        });
    }
    let settled = wait_spread(&[&a, &b, &c], LEASES / 3, Duration::from_secs(60));
    eprintln!("three hosts: 10 ± 1 each {settled:?} after loading");

    // The lease's timings, as the hosts have them.
    let timing = |name: &str| {
        let text = a.scrape();
        let series = format!("baton_lease_{name}_seconds{{lease=\"{}\"}}", lease_name(0));
        Duration::from_secs_f64(metric(&text, &series).unwrap_or_else(|| panic!("no {series}:\n{text}")))
    };
    let (lease_duration, retry_period) = (timing("duration"), timing("retry_period"));
    // A take-over by expiry comes this long after the release at the
    // soonest: a take sooner is a hand-over.
    let expiry = lease_duration - retry_period;

    let killed = c.sigkill();
    let taken = wait_spread(&[&a, &b], LEASES / 2, 2 * failover + Duration::from_secs(10));
    eprintln!("one killed: 15 ± 1 each {taken:?} after the kill (within {failover:?} on an idle machine)");

    let c2 = start("c");
    c2.wait_for(Duration::from_secs(120), "plugins loaded", |e| {
        e.message() == "compiled-code cache"
    });
    let back = wait_spread(&[&a, &b, &c2], LEASES / 3, Duration::from_secs(60));
    eprintln!("back: 10 ± 1 each {back:?} after it loaded");
    // Its share came by hand-overs: each lease released by a or b and
    // taken by the returning host, which prefers it, sooner than a take
    // by expiry can come (LD - RP after the release). A lease whose last
    // holder stepped down without a release (a renewal late under load)
    // expires instead: each of those must follow a step-down its holder
    // logged, and they are shown.
    let mut gaps: Vec<f64> = Vec::new();
    let mut expired = 0;
    for lease in led(&c2) {
        let is = |e: &Event, message: &str| e.message() == message && e.str("lease") == Some(lease.as_str());
        let leading = |e: &Event| is(e, "lease status changed") && e.str("role") == Some("leading");
        let took = c2.all(leading).last().map(|e| e.at).expect("a leading event");
        let others = [&a, &b];
        let last_lead = others
            .iter()
            .flat_map(|h| h.all(leading))
            .map(|e| e.at)
            .filter(|at| *at <= took)
            .max();
        // When the release happened: the releasing host logs it a moment
        // after its write, possibly after the taker's log shows the take,
        // so the taker's own sighting of the released lease counts too.
        let after_last_lead = |at: &SystemTime| last_lead.is_none_or(|l| *at >= l);
        let logged = others
            .iter()
            .flat_map(|h| h.all(|e| is(e, "released the lease")))
            .map(|e| e.at)
            .filter(|at| after_last_lead(at) && *at <= took + expiry);
        let seen = c2
            .all(|e| {
                is(e, "lease status changed")
                    && e.str("role") == Some("pending")
                    && e.str("holder") == Some("")
            })
            .into_iter()
            .map(|e| e.at)
            .filter(|at| after_last_lead(at) && *at <= took);
        let released = logged.chain(seen).min();
        // What happened to the lease, for a message.
        let story = |from: SystemTime| {
            let mut story: Vec<(SystemTime, String)> = Vec::new();
            for h in [&a, &b, &c2] {
                for e in h.all(|e| e.str("lease") == Some(lease.as_str())) {
                    story.push((e.at, format!("{} {} {}", h.name, e.message(), e.json)));
                }
            }
            story.sort_by_key(|(at, _)| *at);
            let lines: Vec<String> = story
                .iter()
                .map(|(at, line)| format!("{:.3} {line}", ms_between(from, *at)))
                .collect();
            lines.join("\n")
        };
        match released {
            Some(released) => {
                let gap = ms_between(released, took);
                assert!(
                    gap < expiry.as_secs_f64() * 1e3,
                    "{lease}: taken {gap:.1} ms after its release: by expiry, not through the release:\n{}",
                    story(released)
                );
                gaps.push(gap)
            }
            None => {
                // No release: its holder stepped down (a late renewal),
                // after its last lead and before the take.
                let stepped_down = others
                    .iter()
                    .flat_map(|h| h.all(|e| is(e, "stepping down")))
                    .any(|e| after_last_lead(&e.at) && e.at <= took);
                assert!(
                    stepped_down,
                    "{lease}: taken with neither a release nor a step-down before:\n{}",
                    story(took)
                );
                eprintln!(
                    "{lease}: taken after an expiry (its holder stepped down):\n{}",
                    story(took)
                );
                expired += 1
            }
        }
    }
    gaps.sort_by(f64::total_cmp);
    assert!(
        !gaps.is_empty(),
        "no lease was handed over ({expired} expired after step-downs)"
    );
    let worst = gaps[gaps.len() - 1];
    eprintln!(
        "hand-overs to it: {} leases, release to taken median {:.1} ms, max {worst:.1} ms; {expired} taken after an expiry",
        gaps.len(),
        gaps[gaps.len() / 2]
    );

    let mut c2 = c2;
    for h in [&a, &b, &c2] {
        h.sigterm();
    }
    for h in [&mut a, &mut b, &mut c2] {
        assert!(
            h.wait_exit(Duration::from_secs(20)).success(),
            "{} failed",
            h.name
        );
    }
    let runs = [
        Incarnation {
            host: &a,
            killed: None,
        },
        Incarnation {
            host: &b,
            killed: None,
        },
        Incarnation {
            host: &c,
            killed: Some(killed),
        },
        Incarnation {
            host: &c2,
            killed: None,
        },
    ];
    let (mut records, mut terms) = (0, 0);
    for i in 0..LEASES {
        let (r, t) = check_lease(data, i, &runs);
        assert!(r > 0, "lease {i}: no records");
        records += r;
        terms += t;
    }
    eprintln!("{records} records in {terms} terms of {LEASES} leases: none late, none out of order");
}

/// The live hosts as guests see them (`baton:leader@0.2.0`): one lease
/// (so no spreading) gating a guest of each world that prints the live
/// hosts whenever they change (`tests/guests/hosts-*`), after `head` (the
/// `[store]` and `[defaults]` tables).
pub fn hosts_config(head: &str) -> String {
    let mut text = format!("{head}\n[[lease]]\nname = \"counted\"\n");
    for world in ["pollable", "future"] {
        text.push_str(&format!(
            "\n[[plugin]]\nname = \"hosts-{world}\"\npath = {:?}\nlease = \"counted\"\n",
            guest(&format!("hosts_{world}.wasm")).display().to_string()
        ));
    }
    text
}

/// Waits until both of `h`'s guests have printed `live` hosts, this one
/// among them; returns when the later one did.
fn counted(h: &Host, live: u32, within: Duration) -> SystemTime {
    let line = format!("probe hosts live={live} this-host-live=true");
    ["hosts-pollable", "hosts-future"]
        .iter()
        .map(|p| {
            h.wait_for(within, &format!("{p} counting {live} hosts"), |e| {
                e.guest_line(p, &line)
            })
            .at
        })
        .max()
        .unwrap()
}

/// Three hosts with [`hosts_config`]: the leader's guests count one host,
/// then three once the others started, then two once one of them was
/// killed (within `dead_within` of the kill: its membership record
/// expires), without a new term: the count changes on its own signal.
/// Returns how long the count of the killed host took to drop.
pub fn guests_count_the_live_hosts(cfg: &Path, dead_within: Duration) -> Duration {
    let a = Host::start("a", cfg);
    counted(&a, 1, Duration::from_secs(30));
    // The first reading of each guest already counts its own host.
    for p in ["hosts-pollable", "hosts-future"] {
        let first = a.all(|e| e.guest_line(p, "probe hosts"));
        let first = first.first().map(Event::message).unwrap_or_default();
        assert!(
            first.starts_with("probe hosts live=1 this-host-live=true"),
            "{p}: first reading {first:?}"
        );
    }
    let b = Host::start("b", cfg);
    let mut c = Host::start("c", cfg);
    counted(&a, 3, Duration::from_secs(30));
    let killed = c.sigkill();
    // Counted out at all (a bound only a count that never drops breaks:
    // on a busy machine it comes later than on an idle one).
    let seen = counted(&a, 2, dead_within + Duration::from_secs(5));
    let took = seen.duration_since(killed).unwrap_or_default();
    println!(
        "the leader's guests counted the killed host out after {} ms (idle-machine bound {} ms)",
        took.as_millis(),
        dead_within.as_millis()
    );
    // One term throughout: the count changed while the guests ran.
    let starts = a.all(|e| e.guest_line("hosts-pollable", "probe start"));
    assert_eq!(starts.len(), 1, "the guest started {} times", starts.len());
    assert!(
        b.all(|e| e.guest_line("hosts-pollable", "probe start"))
            .is_empty(),
        "a follower ran the guest"
    );
    took
}

/// The hosts of `cfg` ([`hosts_config`] with `[spread] forget-after` of
/// `forget_after`, membership records of `member_ld`): b is paused
/// (SIGSTOP) until its record has expired and been deleted (gone from
/// `baton status` within `member_ld + forget_after` and a few listings),
/// then resumed: it writes its record again and a's guests count it again.
/// Returns when the record went, after b's pause.
pub fn a_gone_host_is_forgotten_then_counted_again(
    cfg: &Path,
    status_args: &[&std::ffi::OsStr],
    member_ld: Duration,
    forget_after: Duration,
) -> Duration {
    let listed = |host: &str| {
        let mut args = status_args.to_vec();
        args.extend([std::ffi::OsStr::new("--output"), std::ffi::OsStr::new("json")]);
        let json: serde_json::Value = serde_json::from_str(&crate::status::status(cfg, &args)).unwrap();
        let record = format!("baton-member.{host}");
        json["hosts"]
            .as_array()
            .is_some_and(|hosts| hosts.iter().any(|e| e["record"] == record.as_str()))
    };
    let a = Host::start("a", cfg);
    counted(&a, 1, Duration::from_secs(30));
    let b = Host::start("b", cfg);
    counted(&a, 2, Duration::from_secs(30));
    let paused = b.signal(libc::SIGSTOP);
    // A bound only a record never deleted breaks: the listings are
    // process spawns, slow on a busy machine.
    let bound = member_ld + forget_after + Duration::from_secs(15);
    let start = Instant::now();
    while listed("b") {
        assert!(start.elapsed() < bound, "b's record still listed after {bound:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let gone = SystemTime::now().duration_since(paused).unwrap_or_default();
    // Dated from its last renewal seen, up to a retry period before the
    // pause.
    let earliest = (member_ld + forget_after).saturating_sub(Duration::from_millis(600));
    assert!(gone >= earliest, "deleted after {gone:?}: too early");
    assert!(listed("a"), "a's own record was deleted");
    let before = a
        .all(|e| e.guest_line("hosts-future", "probe hosts live=2"))
        .len();
    b.signal(libc::SIGCONT);
    let resumed = Instant::now();
    while a
        .all(|e| e.guest_line("hosts-future", "probe hosts live=2"))
        .len()
        <= before
    {
        assert!(resumed.elapsed() < Duration::from_secs(30), "b not counted again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(listed("b"), "b did not write its record again");
    println!(
        "b's record went {} ms after its pause (member lease {} ms + forget-after {} ms), and came back with b",
        gone.as_millis(),
        member_ld.as_millis(),
        forget_after.as_millis()
    );
    gone
}
