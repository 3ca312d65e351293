//! What the other stores do, on etcd: real hosts and guests electing
//! through the test's prefix of the shared cluster.
//!
//! - Spreading: three hosts spread seven leases by the hosts' own
//!   assignment, their guests count the live hosts from the membership
//!   records, a killed host's share is taken over; `baton status` (JSON and
//!   text) and each host's `/metrics` say who holds what, in which term,
//!   at which address; the guests' records never overlap.
//! - `baton yield` and `baton drain`/`resume`: the scenarios the embedded
//!   and Kubernetes stores run (`tests/e2e/yielding.rs`, `draining.rs`),
//!   the store's records read through a store of the test's own.
//! - The health hand-over, with scheduled plugins on the same lease: each
//!   due time runs once across the hand-overs, `baton run-now` reaches
//!   whichever host leads, and `baton status` shows the runs.
//! - Buckets: the kv-counter guest counts on across a hand-over, `baton
//!   kv` lists, reads and writes, refuses to write under a leader unless
//!   forced, and a forced write fences the leader: every version of the
//!   entry, as a watch of the test's own sees it, is checked for a stale
//!   write.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::*;
use crate::spread::{Incarnation, check_lease, lease_name};
use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The test timings of [`EtcdTest::head`].
const LD: Duration = Duration::from_secs(4);
const RP: Duration = Duration::from_millis(500);

/// The address host `name` ("a", "b", ... or "host-a", ...) advertises.
fn address(name: &str) -> String {
    let last = name.as_bytes()[name.len() - 1];
    format!("10.0.0.{}:8080", last - b'a' + 1)
}

/// Starts host `name` with its admin endpoints, advertising
/// [`address`]`(name)`, its probes tagging their records with its name
/// (`PROBE_HOST`, `SCHED_HOST`), and `env`.
fn start(name: &str, cfg: &Path, env: &[(&str, &str)]) -> Host {
    let addr = address(name);
    let args = [
        OsStr::new("--admin-address"),
        OsStr::new("127.0.0.1:0"),
        OsStr::new("--advertise-address"),
        OsStr::new(&addr),
    ];
    let mut vars = vec![("PROBE_HOST", name), ("SCHED_HOST", name)];
    vars.extend_from_slice(env);
    Host::start_opts(
        name,
        cfg,
        Opts {
            args: &args,
            env: &vars,
            ..Opts::default()
        },
    )
}

fn leading(lease: &str) -> impl Fn(&Event) -> bool + '_ {
    move |e: &Event| {
        e.message() == "lease status changed"
            && e.str("lease") == Some(lease)
            && e.str("role") == Some("leading")
    }
}

fn following(e: &Event) -> bool {
    e.message() == "lease status changed" && e.str("role") == Some("following")
}

/// The term `h` last logged leading `lease` in.
fn logged_term(h: &Host, lease: &str) -> Option<u64> {
    h.all(leading(lease)).last().and_then(|e| e.u64("term"))
}

/// The leases each of `names` is given by the hosts' assignment under
/// those live hosts.
fn shares(leases: &[String], names: &[&str]) -> (BTreeMap<String, String>, Vec<BTreeSet<String>>) {
    let hosts: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let assigned = baton::election::assign(leases, &hosts);
    let sets = names
        .iter()
        .map(|n| {
            assigned
                .iter()
                .filter(|(_, h)| h.as_str() == *n)
                .map(|(l, _)| l.clone())
                .collect()
        })
        .collect();
    (assigned, sets)
}

fn status_json(cfg: &Path) -> Value {
    let text = crate::status::status(cfg, &[OsStr::new("-o"), OsStr::new("json")]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn time(v: &Value) -> SystemTime {
    humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap()
}

/// `baton status` (JSON, then text) on `cfg`: every lease of `assigned`
/// held by its assigned host, which is its preferred holder, in the term
/// that host logged, at its address; the `live` hosts' membership records
/// live, with their address and shares; `gone` hosts' records not live.
fn check_status(
    cfg: &Path,
    live: &[&Host],
    gone: &[&str],
    assigned: &BTreeMap<String, String>,
    prefix: &str,
) {
    let json = status_json(cfg);
    assert_eq!(json["store"]["kind"], "etcd", "{json:#}");
    assert!(
        json["store"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(prefix)),
        "{json:#}"
    );
    assert_eq!(json["spreading"], true, "{json:#}");
    let names: Vec<&str> = live.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(json["live_hosts"], serde_json::json!(names), "{json:#}");
    let leases = json["leases"].as_array().unwrap();
    let listed: BTreeSet<&str> = leases.iter().map(|l| l["name"].as_str().unwrap()).collect();
    let want: BTreeSet<&str> = assigned.keys().map(String::as_str).collect();
    assert_eq!(listed, want, "the leases, no membership record: {json:#}");
    for l in leases {
        let name = l["name"].as_str().unwrap();
        let holder = assigned[name].as_str();
        assert_eq!(l["holder"], holder, "{name}: {json:#}");
        assert_eq!(l["preferred_holder"], holder, "{name}: {json:#}");
        assert_eq!(l["holder_address"], address(holder).as_str(), "{name}: {json:#}");
        assert_eq!(l["state"], "held", "{name}: {json:#}");
        let h = live.iter().find(|h| h.name == holder).unwrap();
        assert_eq!(
            l["term"].as_u64(),
            logged_term(h, name),
            "{name}'s term as {holder} logged it"
        );
        let (renewed, expires) = (time(&l["renewed"]), time(&l["expires"]));
        assert_eq!(expires.duration_since(renewed).unwrap(), LD, "{name}: {json:#}");
    }
    let hosts = json["hosts"].as_array().unwrap();
    let entry = |id: &str| {
        hosts
            .iter()
            .find(|e| e["identity"] == id)
            .unwrap_or_else(|| panic!("{id}'s membership record: {json:#}"))
            .clone()
    };
    for h in live {
        let e = entry(&h.name);
        let share = assigned.values().filter(|p| **p == h.name).count() as u64;
        assert_eq!(
            e["record"],
            format!("baton-member.{}", h.name).as_str(),
            "{json:#}"
        );
        assert_eq!(
            (&e["live"], &e["state"]),
            (&Value::Bool(true), &Value::from("held")),
            "{json:#}"
        );
        assert_eq!(e["address"], address(&h.name).as_str(), "{json:#}");
        assert_eq!(e["leads"].as_u64(), Some(share), "{json:#}");
        assert_eq!(e["preferred"].as_u64(), Some(share), "{json:#}");
        assert_eq!(e["draining"], false, "{json:#}");
    }
    for id in gone {
        let e = entry(id);
        assert_eq!(e["live"], false, "{json:#}");
        assert_ne!(e["state"], "held", "{json:#}");
        assert_eq!(e["preferred"].as_u64(), Some(0), "{json:#}");
    }

    let text = crate::status::status(cfg, &[]);
    let header = text
        .lines()
        .find(|l| l.starts_with("LEASE "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(header.contains("HOLDER  ADDRESS"), "{text}");
    for (lease, holder) in assigned {
        let row = text
            .lines()
            .find(|r| r.starts_with(&format!("{lease} ")))
            .unwrap_or_else(|| panic!("{lease}: {text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        let term = live
            .iter()
            .find(|h| h.name == *holder)
            .and_then(|h| logged_term(h, lease))
            .unwrap()
            .to_string();
        assert_eq!(
            cols[1..4],
            [holder.as_str(), address(holder).as_str(), term.as_str()],
            "{text}"
        );
    }
    assert!(text.contains("HOST (membership record)  ADDRESS"), "{text}");
    for h in live {
        let row = text
            .lines()
            .find(|r| r.starts_with(&format!("{} ", h.name)))
            .unwrap_or_else(|| panic!("{}: {text}", h.name));
        assert!(row.contains(&address(&h.name)), "{text}");
    }
    assert!(
        text.contains(&format!("({})", names.join(", "))),
        "the live hosts: {text}"
    );
}

/// `h`'s `/metrics`: each lease of `assigned` led in the term `h` logged
/// if it is `h`'s, followed otherwise; the lease's timings as configured.
fn check_metrics(h: &Host, assigned: &BTreeMap<String, String>) {
    let text = h.scrape();
    let value =
        |series: String| metric(&text, &series).unwrap_or_else(|| panic!("{}: no {series}:\n{text}", h.name));
    for (lease, holder) in assigned {
        let l = format!("lease=\"{lease}\"");
        assert_eq!(
            value(format!("baton_lease_duration_seconds{{{l}}}")),
            LD.as_secs_f64()
        );
        assert_eq!(
            value(format!("baton_lease_retry_period_seconds{{{l}}}")),
            RP.as_secs_f64()
        );
        if *holder == h.name {
            assert_eq!(
                value(format!("baton_lease_role{{{l},role=\"leading\"}}")),
                1.0,
                "{lease}"
            );
            let term = logged_term(h, lease).unwrap() as f64;
            assert_eq!(
                value(format!("baton_lease_term{{{l}}}")),
                term,
                "{}: {lease}",
                h.name
            );
            assert!(
                value(format!(
                    "baton_lease_leadership_changes_total{{{l},change=\"gained\"}}"
                )) >= 1.0,
                "{}: {lease}",
                h.name
            );
        } else {
            assert_eq!(
                value(format!("baton_lease_role{{{l},role=\"following\"}}")),
                1.0,
                "{}: {lease}:\n{text}",
                h.name
            );
        }
    }
}

/// `h`'s `GET /leases`: this host and its address, and each lease of
/// `assigned` held by its assigned host at that host's address, led here
/// only if it is this host's.
fn check_leases_endpoint(h: &Host, assigned: &BTreeMap<String, String>) {
    let (code, body) = h.admin_get("/leases");
    assert_eq!(code, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["host"]["identity"], h.name.as_str(), "{doc:#}");
    assert_eq!(doc["host"]["address"], address(&h.name).as_str(), "{doc:#}");
    let entries = doc["leases"].as_array().unwrap();
    assert_eq!(entries.len(), assigned.len(), "{doc:#}");
    for (lease, holder) in assigned {
        let l = entries
            .iter()
            .find(|l| l["lease"] == lease.as_str())
            .unwrap_or_else(|| panic!("{lease}: {doc:#}"));
        assert_eq!(l["holder"], holder.as_str(), "{lease}: {doc:#}");
        assert_eq!(l["holder_address"], address(holder).as_str(), "{lease}: {doc:#}");
        assert_eq!(l["leading"], *holder == h.name, "{lease}: {doc:#}");
    }
}

/// Waits until `h`'s guests of both worlds have printed `live` hosts, this
/// one among them, after `since`.
fn counted(h: &Host, live: u32, since: SystemTime, within: Duration) {
    let line = format!("probe hosts live={live} this-host-live=true");
    for p in ["hosts-pollable", "hosts-future"] {
        h.wait_for(within, &format!("{p} counting {live} hosts"), |e| {
            e.at >= since && e.guest_line(p, &line)
        });
    }
}

#[test]
fn three_hosts_spread_leases_count_each_other_and_take_over_a_killed_hosts_share() {
    const N: usize = 6;
    let t = EtcdTest::new("spread");
    let data = witness::records_dir(&t.scratch);
    // Six leases gating an appending guest each, and one gating the
    // guests that count the live hosts: seven, spread by the assignment.
    let mut text = spread::leases_config(&t.head(), &data, N, &[]);
    text.push_str(&spread::hosts_config(""));
    let cfg = t.scratch.write("baton.toml", &text);
    let mut leases: Vec<String> = (0..N).map(lease_name).collect();
    leases.push("counted".into());

    let a = start("a", &cfg, &[]);
    let b = start("b", &cfg, &[]);
    let mut c = start("c", &cfg, &[]);
    let (three, sets) = shares(&leases, &["a", "b", "c"]);
    let took = spread::wait_leads(&[&a, &b, &c], &sets, SECS(90));
    println!("etcd: three hosts lead their shares {sets:?} after {took:?}");
    let counter = [&a, &b, &c]
        .into_iter()
        .find(|h| h.name == three["counted"])
        .unwrap();
    counted(counter, 3, SystemTime::UNIX_EPOCH, SECS(10));
    check_status(&cfg, &[&a, &b, &c], &[], &three, &t.prefix);
    for h in [&a, &b, &c] {
        check_metrics(h, &three);
        check_leases_endpoint(h, &three);
    }

    // c dies: its membership record expires, a and b share every lease by
    // their assignment, each of c's leases in a newer term than c's.
    let c_terms: BTreeMap<String, u64> = three
        .iter()
        .filter(|(_, h)| *h == "c")
        .map(|(l, _)| (l.clone(), logged_term(&c, l).unwrap()))
        .collect();
    let killed = c.sigkill();
    let (two, sets) = shares(&leases, &["a", "b"]);
    // Liveness, not speed: c's leases expire LD after its last renewal.
    let took = spread::wait_leads(&[&a, &b], &sets, 2 * (LD + RP) + SECS(60));
    println!("etcd: c killed; a and b lead their shares {sets:?} {took:?} later");
    for (lease, term) in &c_terms {
        let taker = [&a, &b].into_iter().find(|h| h.name == two[lease]).unwrap();
        let now = logged_term(taker, lease).unwrap();
        assert!(now > *term, "{lease}: c's term {term}, {}'s {now}", taker.name);
    }
    let counter = [&a, &b].into_iter().find(|h| h.name == two["counted"]).unwrap();
    counted(counter, 2, killed, SECS(30));
    check_status(&cfg, &[&a, &b], &["c"], &two, &t.prefix);
    for h in [&a, &b] {
        check_metrics(h, &two);
        check_leases_endpoint(h, &two);
    }

    let (mut a, mut b) = (a, b);
    for h in [&a, &b] {
        h.sigterm();
    }
    for h in [&mut a, &mut b] {
        assert!(h.wait_exit(SECS(30)).success(), "{} failed", h.name);
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
    ];
    // Answers to requests in flight together come back in any order; none
    // of that is a cluster that went back, and none broke a watch.
    for h in [&a, &b, &c] {
        for what in ["the etcd cluster went back", "the lease watch broke"] {
            let seen = h.all(|e| e.message().starts_with(what));
            assert!(
                seen.is_empty(),
                "{}: {what:?} with no fault: {:?}",
                h.name,
                seen.first().map(|e| &e.json)
            );
        }
    }
    for i in 0..N {
        let (records, terms) = check_lease(&data, i, &runs);
        assert!(records > 0, "{}: no records", lease_name(i));
        println!(
            "{}: {records} records in {terms} terms, none late, none out of order",
            lease_name(i)
        );
    }
}

#[test]
fn prefer_avoid_and_weights_decide_the_shares_on_etcd() {
    // The rules of each lease decide over the hashes; then, under a
    // prefix of its own, each host's weight, written into its membership
    // record and read from there by the other, decides the shares.
    let t = EtcdTest::new("prefer");
    let data = witness::records_dir(&t.scratch);
    spread::prefer_and_avoid_decide(&t.head(), &data, &|text| t.scratch.write("baton.toml", text));
    let t = EtcdTest::new("weights");
    let data = witness::records_dir(&t.scratch);
    spread::weights_decide_the_shares(&t.head(), &data, &|name, text| t.scratch.write(name, text));
    let store = t.store();
    let weight = |host: &str| {
        let read = t.rt.block_on(store.get(&format!("baton-member.{host}"))).unwrap();
        read.and_then(|v| v.record.host).map(|h| h.weight)
    };
    // Both stopped: their released records publish nothing.
    assert_eq!((weight("a"), weight("b")), (None, None));
}

#[test]
fn a_gone_hosts_membership_record_is_deleted_from_etcd_and_comes_back_with_it() {
    // As on the other stores: b paused past its membership record's
    // lease (2 s, half the lease duration) and `forget-after` is deleted
    // by a (etcd's delete compares the version a listed), then resumed,
    // writes it again and is counted again.
    let t = EtcdTest::new("forget");
    let head = t.head() + "\n[spread]\nforget-after = \"2s\"\n";
    let cfg = t.scratch.write("baton.toml", &spread::hosts_config(&head));
    spread::a_gone_host_is_forgotten_then_counted_again(&cfg, &[], SECS(2), SECS(2));
    let store = t.store();
    let read =
        t.rt.block_on(store.get("baton-member.b"))
            .unwrap()
            .expect("b's record");
    assert_eq!(read.record.holder(), Some("b"), "{read:?}");
    // The record's term floor outlived the delete.
    let floor = t.env.etcdctl(&[
        "get",
        "--print-value-only",
        &format!("{}term/baton-member.b", t.prefix),
    ]);
    let floor: u64 = floor.trim().parse().unwrap_or_else(|e| panic!("{e}: {floor:?}"));
    assert!(
        read.record.term >= floor,
        "term {} below the floor {floor}",
        read.record.term
    );
}

#[test]
fn yield_hands_the_lease_over_on_etcd_and_the_yielder_stays_out_for_its_time() {
    let t = EtcdTest::new("yield");
    let text = format!(
        "{}\n[[lease]]\nname = \"demo\"\n{}",
        t.head(),
        plugin_tables("demo", &[probe("probe", "pollable", "cooperative")])
    );
    let cfg = t.scratch.write("baton.toml", &text);
    crate::yielding::two_hosts_yield(&cfg, &|name| Host::start(name, &cfg), "etcd store");
    // The yield went with the release; the write that took the lease over
    // dropped it, as did every write since.
    let store = t.store();
    let read = t.rt.block_on(store.get("demo")).unwrap().expect("the record");
    assert_eq!(read.record.yielded, None, "{:?}", read.record);
    assert_eq!(read.record.holder(), None, "released on exit: {:?}", read.record);
}

#[test]
fn a_drained_host_hands_its_leases_over_on_etcd_and_its_membership_record_says_so() {
    let t = EtcdTest::new("drain");
    let data = witness::records_dir(&t.scratch);
    let cfg = t
        .scratch
        .write("baton.toml", &spread::leases_config(&t.head(), &data, 4, &[]));
    let store = t.store();
    let get = |lease: &str| t.rt.block_on(store.get(lease)).unwrap();
    let holder = |lease: &str| get(lease).and_then(|v| v.record.holder().map(str::to_owned));
    let draining = |host: &str| {
        let v = get(&format!("baton-member.{host}"))?;
        v.record.holder()?;
        Some(v.record.host?.draining)
    };
    let status_draining = |host: &str| crate::draining::status_says_draining(&cfg, host);
    let records = crate::draining::Records {
        holder: &holder,
        draining: &draining,
        status_draining: &status_draining,
    };
    // One lease at a time (the Kubernetes test drains all at once).
    let took = crate::draining::drain_one_host(&cfg, &data, &["a", "b"], 4, &records, false);
    println!("etcd: baton drain of a host leading two leases took {took:.0} ms");
}

// ---------------------------------------------------------------------------
// The health hand-over, schedules and run-now on one lease.

const PERIOD_MS: u64 = 1000;
const THRESHOLD: u64 = 3;
const BACK_OFF: Duration = Duration::from_secs(4);

/// The records `term=N host=H at=MICROS` of the health probe in time
/// order: each term is one host's, and a term's records all come before
/// the next term's. Returns the terms and their hosts.
fn health_terms(records: &str) -> Vec<(u64, String)> {
    let mut rows: Vec<(u128, u64, String)> = records
        .lines()
        .map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap_or_else(|| panic!("{k} in {l}"))
                    .to_owned()
            };
            (
                field("at=").parse().unwrap(),
                field("term=").parse().unwrap(),
                field("host="),
            )
        })
        .collect();
    rows.sort();
    let mut terms: Vec<(u64, String)> = Vec::new();
    for (_, term, host) in rows {
        match terms.last() {
            Some((t, h)) if *t == term => assert_eq!(h, &host, "term {term} recorded by two hosts"),
            Some((t, _)) => assert!(term > *t, "a record of term {term} after one of term {t}"),
            None => {}
        }
        if terms.last().is_none_or(|(t, _)| *t != term) {
            terms.push((term, host));
        }
    }
    terms
}

/// `baton run-now PLUGIN --config CFG`, tried again while no host answers
/// as the leader yet (a hand-over under way); its stdout.
fn run_now(cfg: &Path, plugin: &str) -> String {
    let ask = || {
        baton()
            .args(["run-now", plugin, "--config"])
            .arg(cfg)
            .output()
            .unwrap()
    };
    let until = Instant::now() + SECS(15);
    loop {
        let out = ask();
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < until,
            "baton run-now {plugin}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_unhealthy_leader_hands_over_on_etcd_and_schedules_and_run_now_follow_the_lease() {
    let t = EtcdTest::new("health");
    let dir = t.scratch.dir.path().join("health");
    let data = t.scratch.dir.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(&data).unwrap();
    let sched = guest("sched_probe.wasm").display().to_string();
    let text = format!(
        "{head}\n[[lease]]\nname = \"demo\"\n\n\
         [[plugin]]\nname = \"health\"\npath = {health:?}\nlease = \"demo\"\n\
         dirs = [{{ host = {dir:?}, guest = \"/health\" }}]\n\
         health-check = {{ period = \"{PERIOD_MS}ms\", timeout = \"800ms\", threshold = {THRESHOLD}, back-off = \"{}s\" }}\n\n\
         [[plugin]]\nname = \"tick\"\npath = {sched:?}\nlease = \"demo\"\nevery = \"500ms\"\n\
         inherit-env = [\"SCHED_HOST\"]\nenv = {{ SCHED_RECORDS = \"/data\" }}\n\
         dirs = [{{ host = {data:?}, guest = \"/data\" }}]\n\n\
         [[plugin]]\nname = \"nightly\"\npath = {sched:?}\nlease = \"demo\"\n\
         schedule = \"0 3 * * *\"\ntime-zone = \"Europe/Berlin\"\n",
        BACK_OFF.as_secs(),
        head = t.head(),
        health = guest("health_probe.wasm").display().to_string(),
        dir = dir.display().to_string(),
        data = data.display().to_string(),
    );
    let cfg = t.scratch.write("baton.toml", &text);
    let health_start = |e: &Event| e.guest_line("health", "health start");
    let tick_done = |e: &Event| e.guest_line("tick", "sched done");

    let mut a = start("host-a", &cfg, &[]);
    let first = a.wait_for(SECS(60), "a's health probe", health_start);
    let term = first.guest_term().unwrap();
    assert!(
        first
            .message()
            .contains(&format!("holder=host-a at={}", address("a"))),
        "{}",
        first.message()
    );
    a.wait_for(SECS(30), "a's scheduled runs", tick_done);
    let mut b = start("host-b", &cfg, &[]);
    b.wait_for(SECS(60), "b following", following);
    a.wait_for(SECS(15), "a healthy check", |e| {
        e.guest_line("health", "health check ok")
    });

    // run-now reaches the leader among the two hosts of the file.
    let said = run_now(&cfg, "nightly");
    println!("baton run-now nightly: {}", said.trim());
    let run = a.wait_for(SECS(15), "the run asked of a", |e| {
        e.guest_line("nightly", "sched run")
    });
    assert!(run.message().contains("on_demand=true"), "{}", run.message());
    assert_eq!(run.guest_term(), Some(term));
    a.wait_for(SECS(15), "its end", |e| e.guest_line("nightly", "sched done"));

    // host-a turns unhealthy: after THRESHOLD failures it hands the lease
    // over through its release; b leads the next term.
    let marker = dir.join("unhealthy-host-a");
    let unhealthy_at = SystemTime::now();
    std::fs::write(&marker, "down").unwrap();
    let started = b.wait_for(SECS(60), "b's health probe", |e| {
        health_start(e) && e.guest_term() > Some(term)
    });
    let term_b = started.guest_term().unwrap();
    assert!(
        started
            .message()
            .contains(&format!("holder=host-b at={}", address("b"))),
        "{}",
        started.message()
    );
    let handing = a.wait_for(SECS(10), "a handing over", |e| {
        e.message()
            .starts_with("plugin unhealthy: handing the lease over")
    });
    assert_eq!(
        (handing.str("plugin"), handing.str("lease"), handing.u64("term")),
        (Some("health"), Some("demo"), Some(term))
    );
    assert_eq!(handing.u64("failures"), Some(THRESHOLD));
    assert!(
        handing
            .str("reason")
            .unwrap_or("")
            .contains("marker /health/unhealthy-host-a"),
        "{:?}",
        handing.json
    );
    assert_eq!(
        a.all(|e| e.message() == "health check failed").len() as u64,
        THRESHOLD
    );
    let ms = assert_handed_over_by_release(&a, &b, "demo", unhealthy_at);
    let released = a.wait_for(SECS(10), "a's release", |e| e.message() == "released the lease");
    assert!(handing.at <= released.at, "released before deciding to hand over");
    let stopped = a.wait_for(SECS(10), "the health task stopped", |e| {
        e.is("leader task stopped", Some("health"))
    });
    assert_eq!(stopped.str("how"), Some("cooperative"));
    println!(
        "etcd: health hand-over {:.0} ms from the marker to b's task; {ms:.1} ms from the release to b's lead",
        ms_between(unhealthy_at, started.at)
    );
    let metrics = a.scrape();
    assert_eq!(
        metric(
            &metrics,
            "baton_plugin_health_checks_total{plugin=\"health\",outcome=\"failed\"}"
        ),
        Some(THRESHOLD as f64),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "baton_lease_health_handovers_total{lease=\"demo\"}"),
        Some(1.0),
        "{metrics}"
    );

    // The schedules moved with the lease: b runs them, and run-now reaches
    // b now.
    b.wait_for(SECS(30), "b's scheduled runs", tick_done);
    let said = run_now(&cfg, "nightly");
    println!("baton run-now nightly: {}", said.trim());
    let run = b.wait_for(SECS(15), "the run asked of b", |e| {
        e.guest_line("nightly", "sched run")
    });
    assert!(run.message().contains("on_demand=true"), "{}", run.message());
    assert_eq!(run.guest_term(), Some(term_b));
    b.wait_for(SECS(15), "its end", |e| e.guest_line("nightly", "sched done"));

    // host-a is healthy again but stays out for the back-off, even once b
    // stops and releases the lease; then it leads again.
    std::fs::remove_file(&marker).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    b.sigterm();
    assert!(b.wait_exit(SECS(20)).success());
    let back = a.wait_for(SECS(60), "a leading again", |e| {
        health_start(e) && e.guest_term() > Some(term_b)
    });
    let after = ms_between(handing.at, back.at);
    println!(
        "the unhealthy host led again {after:.0} ms after its hand-over (back-off {} ms)",
        BACK_OFF.as_millis()
    );
    assert!(after >= BACK_OFF.as_millis() as f64, "back after {after:.0} ms");
    // Back once the back-off is up (b released the lease before it), not
    // once a lease more had passed.
    assert!(
        after < (BACK_OFF + LD).as_millis() as f64,
        "back only after {after:.0} ms (back-off {BACK_OFF:?})"
    );
    let since = SystemTime::now();
    a.wait_for(SECS(30), "a's scheduled runs again", |e| {
        e.at >= since && tick_done(e)
    });
    a.sigterm();
    assert!(a.wait_exit(SECS(20)).success());

    // The health probe's records: three terms, a's, b's, a's, never
    // overlapping.
    let terms = health_terms(&std::fs::read_to_string(dir.join("records")).unwrap());
    let hosts: Vec<&str> = terms.iter().map(|(_, h)| h.as_str()).collect();
    assert_eq!(hosts, ["host-a", "host-b", "host-a"], "{terms:?}");

    // Each due time of `tick` completed once across the two hand-overs, by
    // the host of its term, terms never going back; every due time from
    // the first run to the last ran or was skipped, as the progress in the
    // etcd bucket says.
    let records: Vec<(u64, u64, String)> = std::fs::read_to_string(data.join("records"))
        .unwrap()
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].parse().unwrap(), w[1].parse().unwrap(), w[2].to_owned())
        })
        .collect();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut newest = 0;
    for (due, t, host) in &records {
        assert!(
            seen.insert(*due, *t).is_none(),
            "due {due} completed twice: {records:?}"
        );
        assert!(
            *t >= newest,
            "a run of term {t} after one of term {newest}: {records:?}"
        );
        newest = *t;
        let of_term = terms.iter().find(|(tt, _)| tt == t).map(|(_, h)| h.as_str());
        assert_eq!(
            of_term,
            Some(host.as_str()),
            "due {due}: term {t} is not {host}'s: {terms:?}"
        );
    }
    let by: BTreeSet<&str> = records.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(by, BTreeSet::from(["host-a", "host-b"]), "{records:?}");
    let out = baton()
        .args(["kv", "get", "--config"])
        .arg(&cfg)
        .args(["--bucket", "baton-schedules", "tick"])
        .output()
        .unwrap();
    let p: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let skipped: u64 = p["skipped"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    // Up to the progress's `handled`: a due time after the last run seen
    // may already be skipped (an overlap) while the hosts still run.
    let first = *seen.keys().next().unwrap();
    let handled = p["handled"].as_u64().unwrap();
    let ran = seen.keys().filter(|due| **due <= handled).count() as u64;
    assert_eq!(
        (handled - first) / 500 + 1,
        ran + skipped,
        "every due time from the first run to the last handled ran once or was skipped: {p}"
    );
    let last = *seen.keys().last().unwrap();
    assert!(handled >= last, "the last run seen, {last}, is not handled: {p}");

    // `baton status`: the schedules, and the two runs asked for, each by
    // the host that led in its term.
    let json = status_json(&cfg);
    let of = |plugin: &str| {
        json["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["plugin"] == plugin)
            .unwrap_or_else(|| panic!("{plugin}: {json:#}"))
            .clone()
    };
    assert_eq!(of("tick")["schedule"], "every 500ms", "{json:#}");
    let nightly = of("nightly");
    let asked: Vec<(String, u64)> = nightly["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["on_demand"] == true)
        .map(|r| {
            (
                r["host"].as_str().unwrap().to_owned(),
                r["term"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        asked,
        [("host-b".to_owned(), term_b), ("host-a".to_owned(), term)],
        "newest first: {nightly:#}"
    );
    let text = crate::status::status(&cfg, &[]);
    assert!(
        text.contains("plugin tick (lease demo): every 500ms; next due"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------
// Buckets: kv-counter and `baton kv`.

/// `baton kv ARGS --config CFG`: (exit code, stdout, stderr).
fn kv(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let out = baton()
        .arg("kv")
        .args(args)
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    println!(
        "baton kv {}: exit {:?}: {}{}",
        args.join(" "),
        out.status.code(),
        stdout.trim(),
        stderr.trim()
    );
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

/// `baton kv get count`, which must succeed: (count, what follows it).
fn stored_count(cfg: &Path) -> (u64, String) {
    let (code, value, err) = kv(cfg, &["get", "count"]);
    assert_eq!(code, 0, "{err}");
    let (n, rest) = value.split_once(' ').unwrap_or_else(|| panic!("{value:?}"));
    (n.parse().unwrap(), rest.to_owned())
}

/// The `n=` of a guest line.
fn n_of(e: &Event) -> u64 {
    e.message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("n="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no n= in {:?}", e.message()))
}

fn kv_ok(e: &Event) -> bool {
    e.guest_line("counter", "kv ok")
}

/// The term of a stored value `"<n> <term>"` (`None` for another writer's).
fn term_of(value: &str) -> Option<u64> {
    value.split_whitespace().nth(1).and_then(|t| t.parse().ok())
}

/// Every value the entry `key` of the etcd store took, in order, as a
/// watch of the test's own (from before any write) sees them; the watch
/// failing fails the test when the history is read.
struct History {
    values: Arc<Mutex<Vec<String>>>,
    broken: Arc<Mutex<Option<String>>>,
}

impl History {
    fn watch(t: &EtcdTest, key: String) -> History {
        let values: Arc<Mutex<Vec<String>>> = Arc::default();
        let broken: Arc<Mutex<Option<String>>> = Arc::default();
        let (seen, failed) = (values.clone(), broken.clone());
        let endpoints = t.env.endpoints.clone();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        t.rt.spawn(async move {
            let run = async {
                let mut client = etcd_client::Client::connect(&endpoints, None).await?;
                let mut stream = client.watch(key.as_bytes(), None).await?;
                let _ = ready_tx.send(());
                while let Some(answer) = stream.message().await? {
                    if answer.canceled() {
                        return Err::<(), _>(etcd_client::Error::WatchError(format!(
                            "cancelled: {}",
                            answer.cancel_reason()
                        )));
                    }
                    for event in answer.events() {
                        if let Some(kv) = event.kv()
                            && event.event_type() == etcd_client::EventType::Put
                        {
                            seen.lock()
                                .unwrap()
                                .push(String::from_utf8_lossy(kv.value()).into_owned());
                        }
                    }
                }
                Err::<(), _>(etcd_client::Error::WatchError("the stream ended".into()))
            };
            if let Err(e) = run.await {
                *failed.lock().unwrap() = Some(e.to_string());
            }
        });
        ready.recv_timeout(SECS(10)).expect("the test's watch started");
        History { values, broken }
    }

    fn get(&self) -> Vec<String> {
        if let Some(e) = self.broken.lock().unwrap().as_ref() {
            panic!("the test's watch of the entry failed: {e}");
        }
        self.values.lock().unwrap().clone()
    }
}

/// No value of a term below `newer` after the first value of `newer`.
fn assert_no_stale_after(history: &[String], newer: u64) {
    let first = history
        .iter()
        .position(|v| term_of(v) == Some(newer))
        .unwrap_or_else(|| panic!("a value of term {newer} in {history:?}"));
    let stale: Vec<&String> = history[first..]
        .iter()
        .filter(|v| term_of(v).is_some_and(|t| t < newer))
        .collect();
    assert!(
        stale.is_empty(),
        "values of older terms after term {newer}'s first: {stale:?} in {history:?}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_BUCKET_WRITE_DELAY: a build with --features test-hooks"
)]
fn kv_counter_counts_on_across_a_hand_over_and_a_forced_kv_write_fences_the_leader() {
    let t = EtcdTest::new("kv");
    let text = format!(
        "{}\n[[lease]]\nname = \"demo\"\n\n[[plugin]]\nname = \"counter\"\npath = {:?}\nlease = \"demo\"\n\
         env = {{ KV_INTERVAL_MS = \"50\" }}\n",
        t.head(),
        guest("kv_counter.wasm").display().to_string()
    );
    let cfg = t.scratch.write("baton.toml", &text);
    let history = History::watch(&t, format!("{}entry/demo/counter/count", t.prefix));

    // Before any host: the operator's write takes the lease for term 1
    // and releases it.
    let (code, out, err) = kv(&cfg, &["put", "note", "before"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("written to bucket demo/counter in term 1"), "{out}");
    assert_eq!(kv(&cfg, &["get", "note"]).1, "before");
    let (code, _, err) = kv(&cfg, &["get", "missing"]);
    assert!(code != 0 && err.contains("no key \"missing\""), "{err}");
    let store = t.store();
    let read = t.rt.block_on(store.get("demo")).unwrap().expect("the record");
    assert_eq!(
        (read.record.holder(), read.record.term),
        (None, 1),
        "the operator released the lease"
    );

    // a counts; b, whose writes each wait 3 s in the host before they
    // reach the store, takes over on a's SIGTERM and counts on.
    let mut a = Host::start("kv-a", &cfg);
    a.wait_for(SECS(60), "a's writes", |e| kv_ok(e) && n_of(e) >= 5);
    let mut b = Host::start_opts(
        "kv-b",
        &cfg,
        Opts {
            env: &[("BATON_TEST_BUCKET_WRITE_DELAY", "3s")],
            ..Opts::default()
        },
    );
    b.wait_for(SECS(60), "b follows", following);
    a.sigterm();
    assert!(a.wait_exit(SECS(20)).success());
    let a_last = a.all(kv_ok).last().cloned().unwrap();
    let a_term = a_last.guest_term().unwrap();
    assert!(a_term >= 2, "after the operator's term 1: {}", a_last.message());
    assert!(
        a.all(|e| e.guest_line("counter", "kv error")).is_empty(),
        "{}",
        a.output()
    );
    let b_first = b.wait_for(SECS(30), "b's first write", kv_ok);
    let term = b_first.guest_term().unwrap();
    println!("a's last: {}; b's first: {}", a_last.message(), b_first.message());
    assert_eq!(n_of(&b_first), n_of(&a_last) + 1, "the count goes on");
    assert!(term > a_term, "terms grow");

    // `baton kv` reads the bucket under b.
    let (code, listed, err) = kv(&cfg, &["list", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["bucket"], "counter", "{listed}");
    assert_eq!(listed[0]["entries"], 2, "{listed}");
    assert!(listed[0]["fence"].as_u64() >= Some(term), "{listed}");
    let (_, keys, _) = kv(&cfg, &["list", "--plugin", "counter"]);
    assert_eq!(keys.lines().collect::<Vec<_>>(), ["count", "note"]);
    let (_, got, _) = kv(&cfg, &["get", "count", "-o", "json"]);
    let got: Value = serde_json::from_str(&got).unwrap();
    assert!(
        got["value"].as_str().unwrap().ends_with(&format!(" {term}")),
        "{got}"
    );
    assert!(got["version"].as_u64() > Some(0), "{got}");

    // Refused while b leads, naming it.
    let (code, _, err) = kv(&cfg, &["put", "count", "100 operator"]);
    assert!(code != 0, "{err}");
    assert!(
        err.contains("is held by \"kv-b\"") && err.contains(&format!("in term {term}")),
        "{err}"
    );
    let (code, _, err) = kv(&cfg, &["delete", "note"]);
    assert!(code != 0 && err.contains("is held by \"kv-b\""), "{err}");

    // Forced, right after b's guest began a write: that write is refused.
    let since = SystemTime::now();
    let tried = b.wait_for(SECS(15), "a try", |e| {
        e.at >= since && e.guest_line("counter", "kv try")
    });
    let (code, out, err) = kv(&cfg, &["put", "count", "100 operator", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("in term {}", term + 1)) && out.contains("kv-b was displaced"),
        "{out}"
    );
    let refused = b.wait_for(SECS(15), "the stale write refused", |e| {
        (e.message() == "refused a stale write" && e.str("plugin") == Some("counter"))
            || e.guest_line("counter", "kv error")
    });
    println!(
        "the write tried {:.0} ms before the refusal: {}",
        ms_between(tried.at, refused.at),
        refused.json
    );
    assert!(
        b.all(|e| kv_ok(e) && e.at >= tried.at && e.guest_term() == Some(term))
            .is_empty(),
        "b's guest saw a write of term {term} land after the forced put"
    );
    assert_eq!(
        stored_count(&cfg),
        (100, "operator".to_owned()),
        "the operator's value stands"
    );

    // The next term (once the operator's lease ran out) counts on from it.
    let next = b.wait_for(SECS(60), "a write of a later term", |e| {
        kv_ok(e) && e.guest_term() > Some(term)
    });
    assert_eq!(
        (n_of(&next), next.guest_term()),
        (101, Some(term + 2)),
        "{}",
        next.message()
    );
    b.sigterm();
    assert!(b.wait_exit(SECS(20)).success());
    let b_last = b.all(kv_ok).last().cloned().unwrap();
    assert_eq!(stored_count(&cfg), (n_of(&b_last), (term + 2).to_string()));

    // Every version of the entry: a's, then b's, the operator's, then b's
    // of the later term; nothing of an older term after a newer one wrote.
    let history = history.get();
    println!(
        "{} versions of the count: {:?} ...",
        history.len(),
        &history[..3.min(history.len())]
    );
    let put = history
        .iter()
        .position(|v| v == "100 operator")
        .expect("the put's version");
    for v in &history[put..] {
        assert!(
            v == "100 operator" || term_of(v) >= Some(term + 2),
            "after the put: {v:?} in {history:?}"
        );
    }
    assert!(
        history[..put]
            .iter()
            .all(|v| term_of(v) == Some(a_term) || term_of(v) == Some(term)),
        "{history:?}"
    );
    assert_no_stale_after(&history, term);
    assert_no_stale_after(&history, term + 2);
    // Exactly the writes the guests saw land, in order: 1, 2, ... n.
    let counts: Vec<u64> = history
        .iter()
        .filter(|v| term_of(v).is_some())
        .map(|v| v.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    let oks = a.all(kv_ok).len() + b.all(kv_ok).len();
    assert_eq!(
        counts.len(),
        oks,
        "one version per acknowledged write: {history:?}"
    );

    // With no host left: the operator writes without force.
    let (code, out, err) = kv(&cfg, &["delete", "note"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("written to bucket demo/counter"), "{out}");
    let (code, _, err) = kv(&cfg, &["get", "note"]);
    assert!(code != 0 && err.contains("no key \"note\""), "{err}");
    assert_eq!(kv(&cfg, &["list", "--plugin", "counter"]).1.trim(), "count");
}
