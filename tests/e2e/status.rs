//! `baton status` against real hosts, the scenario both stores run: two
//! hosts spread six leases; `baton status` (JSON and text) must show each
//! lease's holder and term as the hosts logged them, and the preferred
//! holder the hosts' own assignment gives under the live hosts; once one
//! host has stopped, the other is the only live host and preferred for
//! every lease.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::support::*;

/// The leases of the scenario.
pub fn lease_names() -> Vec<String> {
    (0..6).map(|i| format!("job-{i}")).collect()
}

/// `head` (the `[store]` and `[defaults]` tables) and six leases without
/// plugins (a lease without plugins is contended for all the same).
pub fn status_config(head: &str) -> String {
    let mut text = head.to_owned();
    for name in lease_names() {
        text.push_str(&format!("\n[[lease]]\nname = {name:?}\n"));
    }
    text
}

/// Waits until the hosts lead exactly the leases `want` gives each (by
/// their logs), steadily for a second.
fn wait_led(hosts: &[&Host], want: &BTreeMap<String, String>, within: Duration) {
    let start = Instant::now();
    let mut since: Option<Instant> = None;
    loop {
        let ok = hosts.iter().all(|h| {
            let mine: std::collections::BTreeSet<String> = want
                .iter()
                .filter(|(_, p)| **p == h.name)
                .map(|(l, _)| l.clone())
                .collect();
            led(h) == mine
        });
        if ok {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= Duration::from_secs(1) {
                return;
            }
        } else {
            since = None;
        }
        let now: Vec<String> = hosts
            .iter()
            .map(|h| format!("{}: {:?}", h.name, led(h)))
            .collect();
        assert!(start.elapsed() < within, "want {want:?}, led {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `baton status` with `args`; its stdout, after checking it exited 0.
pub fn status(config: &Path, args: &[&OsStr]) -> String {
    let out = baton()
        .args(["status", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "baton status failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The term `h` last logged leading `lease` in.
fn logged_term(h: &Host, lease: &str) -> Option<u64> {
    h.all(|e| {
        e.message() == "lease status changed"
            && e.str("lease") == Some(lease)
            && e.str("role") == Some("leading")
    })
    .last()
    .and_then(|e| e.u64("term"))
}

fn time(v: &Value) -> SystemTime {
    humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap()
}

/// Checks one JSON report: every lease held by its preferred holder (as
/// `preferred` gives it), in the term its holder logged, and the live
/// hosts.
fn check_json(json: &Value, hosts: &[&Host], preferred: &BTreeMap<String, String>, ld: Duration, kind: &str) {
    assert_eq!(json["version"], 1, "{json:#}");
    assert_eq!(json["store"]["kind"], kind, "{json:#}");
    assert_eq!(json["spreading"], true, "{json:#}");
    let live: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(json["live_hosts"], serde_json::json!(live), "{json:#}");
    let now = time(&json["now"]);
    let leases = json["leases"].as_array().unwrap();
    let names: Vec<&str> = leases.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        lease_names(),
        "only the leases, no membership record: {json:#}"
    );
    for l in leases {
        let name = l["name"].as_str().unwrap();
        let holder = l["holder"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} held: {json:#}"));
        assert_eq!(
            l["preferred_holder"],
            preferred[name].as_str(),
            "{name}: {json:#}"
        );
        assert_eq!(
            holder, preferred[name],
            "{name} led by its preferred holder: {json:#}"
        );
        let h = hosts.iter().find(|h| h.name == holder).unwrap();
        assert_eq!(
            l["term"].as_u64(),
            logged_term(h, name),
            "{name}'s term as its holder logged it"
        );
        assert_eq!(l["state"], "held", "{name}: {json:#}");
        let (renewed, expires) = (time(&l["renewed"]), time(&l["expires"]));
        assert_eq!(expires.duration_since(renewed).unwrap(), ld, "{name}: {json:#}");
        let left = l["seconds_left"].as_f64().unwrap();
        assert!(left > 0.0 && left <= ld.as_secs_f64(), "{name}: {json:#}");
        let by_times = expires.duration_since(now).map_or(0.0, |d| d.as_secs_f64());
        assert!(
            (left - by_times).abs() <= 0.01,
            "{name}: seconds_left {left}, by the times {by_times}"
        );
    }
    for h in hosts {
        let entry = json["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["identity"] == h.name.as_str())
            .unwrap_or_else(|| panic!("{}'s membership record: {json:#}", h.name));
        let share = preferred.values().filter(|p| **p == h.name).count();
        assert_eq!(entry["record"], format!("baton-member.{}", h.name).as_str());
        assert_eq!(entry["live"], true);
        assert_eq!(entry["leads"].as_u64(), Some(share as u64), "{json:#}");
        assert_eq!(entry["preferred"].as_u64(), Some(share as u64), "{json:#}");
    }
}

/// Checks the text report's tables against the JSON one.
fn check_text(text: &str, json: &Value) {
    let header = text
        .lines()
        .find(|l| l.starts_with("LEASE "))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        cols,
        ["LEASE", "HOLDER", "TERM", "PREFERRED", "EXPIRES"],
        "{text}"
    );
    for l in json["leases"].as_array().unwrap() {
        let name = l["name"].as_str().unwrap();
        let row = text
            .lines()
            .find(|r| r.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], l["holder"].as_str().unwrap(), "{row}");
        assert_eq!(cols[2].parse::<u64>().ok(), l["term"].as_u64(), "{row}");
        assert_eq!(cols[3], l["preferred_holder"].as_str().unwrap(), "{row}");
        assert_eq!(cols[4], "in", "{row}");
        let left = cols[5];
        assert!(
            left.trim_end_matches("ms")
                .trim_end_matches('s')
                .parse::<f64>()
                .is_ok(),
            "{row}"
        );
    }
    assert!(
        text.contains("HOST (membership record)  LEADS  PREFERRED  EXPIRES"),
        "{text}"
    );
    for h in json["hosts"].as_array().unwrap() {
        let id = h["identity"].as_str().unwrap();
        let row = text
            .lines()
            .find(|r| r.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id}: {text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1].parse::<u64>().ok(), h["leads"].as_u64(), "{row}");
        assert_eq!(cols[2].parse::<u64>().ok(), h["preferred"].as_u64(), "{row}");
    }
    let live: Vec<&str> = json["live_hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert!(
        text.contains(&format!("({})", live.join(", "))),
        "the live hosts: {text}"
    );
}

/// The scenario on `config` (written by [`status_config`]), hosts started
/// with `run_args`, `baton status` run with `status_args`; `ld` is the
/// configured lease duration, `kind` the store's.
pub fn two_hosts_as_status_shows_them(
    config: &Path,
    run_args: &[&OsStr],
    status_args: &[&OsStr],
    ld: Duration,
    kind: &str,
) {
    let start = |name: &str| {
        Host::start_opts(
            name,
            config,
            Opts {
                args: run_args,
                ..Opts::default()
            },
        )
    };
    let mut a = start("a");
    let mut b = start("b");
    let leases = lease_names();
    let both = baton::election::assign(&leases, &["a".to_owned(), "b".to_owned()]);
    wait_led(&[&a, &b], &both, Duration::from_secs(60));
    let json_args: Vec<&OsStr> = status_args
        .iter()
        .copied()
        .chain([OsStr::new("--output"), OsStr::new("json")])
        .collect();
    let json: Value = serde_json::from_str(&status(config, &json_args)).unwrap();
    check_json(&json, &[&a, &b], &both, ld, kind);
    let text = status(config, status_args);
    check_text(&text, &json);
    eprintln!("{text}");

    // b stops: it hands its leases over and releases its record; a is
    // the only live host, preferred for every lease, and takes them all.
    b.sigterm();
    assert!(b.wait_exit(Duration::from_secs(20)).success());
    let alone = baton::election::assign(&leases, &["a".to_owned()]);
    wait_led(&[&a], &alone, Duration::from_secs(30));
    let json: Value = serde_json::from_str(&status(config, &json_args)).unwrap();
    check_json(&json, &[&a], &alone, ld, kind);
    let gone = json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["record"] == "baton-member.b")
        .unwrap_or_else(|| panic!("b's record is kept, released: {json:#}"));
    assert_eq!(
        (&gone["live"], &gone["state"]),
        (&Value::Bool(false), &Value::from("released")),
        "{json:#}"
    );
    assert_eq!(gone["preferred"].as_u64(), Some(0), "{json:#}");
    check_text(&status(config, status_args), &json);
    a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(20)).success());
}
