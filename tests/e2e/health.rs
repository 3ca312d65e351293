//! The health check (`baton:leader@0.4.0`): two hosts on the embedded
//! store, one lease with the health probe (a check that fails while a
//! marker file names the holder) and a 0.3.0 guest beside it. The leader's
//! check turns unhealthy; after `threshold` failures in a row it hands the
//! whole lease over the graceful way (both tasks stop cooperatively before
//! the release), the other host takes it through the release (not once it
//! expired), the old leader stays out for the back-off even though the
//! lease is free meanwhile (and no longer), and the terms the guests
//! recorded never overlap. How long the hand-over took is a figure. Guests see the holder's advertised address. And the
//! `health-check` table's errors.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support::*;

/// A check every second, which may take up to 800 ms: a healthy check that
/// a busy machine slows is no failure (three in a row would hand the lease
/// over before the test turns the host unhealthy).
const PERIOD_MS: u64 = 1000;
const TIMEOUT_MS: u64 = 800;
const THRESHOLD: u64 = 3;
const BACK_OFF: Duration = Duration::from_secs(4);

fn config(store: &Path, dir: &Path) -> String {
    format!(
        "[store]\nkind = \"embedded\"\ndir = {store:?}\n\n[defaults]\nlease-duration = \"2s\"\n\
         renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n\n[[lease]]\nname = \"demo\"\n\n\
         [[plugin]]\nname = \"health\"\npath = {:?}\nlease = \"demo\"\ndirs = [{{ host = {dir:?}, guest = \"/health\" }}]\n\
         health-check = {{ period = \"{PERIOD_MS}ms\", timeout = \"{TIMEOUT_MS}ms\", threshold = {THRESHOLD}, back-off = \"{}s\" }}\n\n\
         [[plugin]]\nname = \"v03\"\npath = {:?}\nlease = \"demo\"\n",
        guest("health_probe.wasm").display().to_string(),
        BACK_OFF.as_secs(),
        guest("probe_v03.wasm").display().to_string(),
    )
}

fn start(name: &str, cfg: &Path, address: &str) -> Host {
    let args: Vec<&OsStr> = ["--admin-address", "127.0.0.1:0", "--advertise-address", address]
        .into_iter()
        .map(OsStr::new)
        .collect();
    Host::start_with_args(name, cfg, &shared_cache_dir(), &args)
}

fn health_start(e: &Event) -> bool {
    e.guest_line("health", "health start")
}

/// The records `term=N host=H at=MICROS` in time order: each term is one
/// host's, and a term's records all come before the next term's.
fn check_no_overlap(records: &str) -> Vec<(u64, String)> {
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

#[test]
fn an_unhealthy_leader_hands_the_lease_over_and_stays_out_for_the_back_off() {
    let s = Scratch::new();
    let dir = s.dir.path().join("health");
    std::fs::create_dir(&dir).unwrap();
    let cfg = s.write("health.toml", &config(&s.store(), &dir));
    let mut a = start("host-a", &cfg, "10.0.0.1:8080");
    let first = a.wait_for(Duration::from_secs(60), "a's health probe", health_start);
    let term = first.guest_term().unwrap();
    assert!(
        first.message().contains("holder=host-a at=10.0.0.1:8080"),
        "{}",
        first.message()
    );
    // The 0.3.0 guest runs beside it, under the same lease.
    let v03 = a.wait_for(Duration::from_secs(10), "the 0.3.0 guest", |e| {
        e.guest_line("v03", "probe start")
    });
    assert_eq!(v03.guest_term(), Some(term));
    let mut b = start("host-b", &cfg, "10.0.0.2:8080");
    b.wait_for(Duration::from_secs(60), "b following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    a.wait_for(Duration::from_secs(15), "a healthy check", |e| {
        e.guest_line("health", "health check ok") && e.message().contains("at=10.0.0.1:8080")
    });

    // host-a turns unhealthy.
    let marker = dir.join("unhealthy-host-a");
    let unhealthy_at = SystemTime::now();
    std::fs::write(&marker, "down").unwrap();
    let started = b.wait_for(Duration::from_secs(30), "b's health probe", |e| {
        health_start(e) && e.guest_term() > Some(term)
    });
    let took = ms_between(unhealthy_at, started.at);
    assert!(
        started.message().contains("holder=host-b at=10.0.0.2:8080"),
        "{}",
        started.message()
    );
    let handing = a.wait_for(Duration::from_secs(10), "a handing over", |e| {
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
    let failed: Vec<Event> = a.all(|e| e.message() == "health check failed");
    assert_eq!(failed.len() as u64, THRESHOLD, "{failed:?}");
    let released = a.wait_for(Duration::from_secs(10), "a's release", |e| {
        e.message() == "released the lease"
    });
    for plugin in ["health", "v03"] {
        let stopped = a.wait_for(Duration::from_secs(10), "a's tasks stopped", |e| {
            e.is("leader task stopped", Some(plugin))
        });
        assert_eq!(stopped.str("how"), Some("cooperative"), "{plugin}");
        assert!(stopped.at <= released.at, "{plugin} stopped before the release");
    }
    // Taken through the release, not once the lease expired: b's first
    // record of its term is written over a's release.
    let term_b = started.guest_term().unwrap();
    match taken_over_a_release(&s.store(), "demo", "host-b", term_b) {
        Some(through) => through.unwrap(),
        None => println!("health hand-over: the versions before b's take were pruned already; not judged"),
    }
    assert!(handing.at <= released.at, "released before deciding to hand over");
    println!(
        "health hand-over: {took:.0} ms from the marker to the other host's task (period {PERIOD_MS} ms × threshold {THRESHOLD} = {} ms; \
         {:.0} ms from the hand-over's decision to the release, {:.0} ms from the release to the new task)",
        PERIOD_MS * THRESHOLD,
        ms_between(handing.at, released.at),
        ms_between(released.at, started.at)
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

    // host-a is healthy again, but stays out for the back-off even when
    // host-b stops (and releases) meanwhile; then it leads again.
    std::fs::remove_file(&marker).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    b.sigterm();
    assert!(b.wait_exit(Duration::from_secs(10)).success());
    let back = a.wait_for(Duration::from_secs(60), "a leading again", |e| {
        health_start(e) && e.guest_term() > started.guest_term()
    });
    let after = ms_between(handing.at, back.at);
    println!(
        "the unhealthy host led again {after:.0} ms after its hand-over (back-off {} ms)",
        BACK_OFF.as_millis()
    );
    assert!(after >= BACK_OFF.as_millis() as f64, "back after {after:.0} ms");
    // Back once the back-off is up, not a whole back-off later.
    assert!(
        after < (BACK_OFF * 2).as_millis() as f64,
        "back only after {after:.0} ms (back-off {BACK_OFF:?})"
    );
    std::thread::sleep(Duration::from_millis(300));
    a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(10)).success());

    let records = std::fs::read_to_string(dir.join("records")).unwrap();
    let terms = check_no_overlap(&records);
    let hosts: Vec<&str> = terms.iter().map(|(_, h)| h.as_str()).collect();
    assert_eq!(hosts, ["host-a", "host-b", "host-a"], "{terms:?}");
}

#[test]
fn health_check_settings_are_checked_and_need_a_component_that_exports_one() {
    let s = Scratch::new();
    let dir = s.dir.path().join("health");
    std::fs::create_dir(&dir).unwrap();
    let good = config(&s.store(), &dir);
    for (from, to, says) in [
        (
            format!("timeout = \"{TIMEOUT_MS}ms\""),
            "timeout = \"1000ms\"",
            "field `health-check.timeout`: 1s must be above 0 and below the period (1s)",
        ),
        (
            format!("threshold = {THRESHOLD}"),
            "threshold = 0",
            "field `health-check.threshold`: 0",
        ),
        ("back-off = ".to_owned(), "backoff = ", "unknown field `backoff`"),
    ] {
        let cfg = s.write("bad.toml", &good.replace(&from, to));
        let out = baton().args(["run", "--config"]).arg(&cfg).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{to}: {stderr}");
        assert!(
            stderr.contains("plugin \"health\"") || stderr.contains("backoff"),
            "{stderr}"
        );
        assert!(stderr.contains(says), "{to}: {stderr}");
    }
    // A health-check table on a component without a check (0.3.0): the
    // plugin is refused, named; the others go on.
    let text = good.replace(
        "name = \"v03\"\npath",
        "name = \"v03\"\nhealth-check = { period = \"1s\" }\npath",
    );
    let cfg = s.write("no-check.toml", &text);
    let mut h = Host::start("host", &cfg);
    let refused = h.wait_for(Duration::from_secs(60), "v03 refused", |e| {
        e.message() == "plugin cannot run; the others go on"
    });
    assert_eq!(refused.str("plugin"), Some("v03"));
    let error = refused.str("error").unwrap_or("");
    assert!(
        error.contains("has a `health-check` table, but its component exports no health check")
            && error.contains("baton:leader/pollable-plugin@0.3.0"),
        "{error}"
    );
    h.wait_for(Duration::from_secs(10), "the other plugin", health_start);
    h.sigterm();
    assert!(h.wait_exit(Duration::from_secs(10)).success());
}

/// A check still going when its term ended (here: hanging, its leader
/// paused past the lease) comes back after the term: it counts for
/// nothing. No failure of that term is logged or counted after the term's
/// end, and no hand-over is started for a lease the host no longer leads
/// (which would keep it out of the next election for the back-off).
#[test]
fn a_check_cut_off_by_its_terms_end_is_no_failure_and_hands_nothing_over() {
    let s = Scratch::new();
    let dir = s.dir.path().join("health");
    std::fs::create_dir(&dir).unwrap();
    // Checks every 2 s, each may run for 1.9 s; two failures in a row
    // would hand the lease over.
    let cfg = s.write(
        "health.toml",
        &config(&s.store(), &dir)
            .replace(&format!("threshold = {THRESHOLD}"), "threshold = 2")
            .replace(&format!("period = \"{PERIOD_MS}ms\""), "period = \"2s\"")
            .replace(&format!("timeout = \"{TIMEOUT_MS}ms\""), "timeout = \"1900ms\""),
    );
    // A check that runs guest code until the host stops it: the end of
    // its term traps it, at the very moment the term is over.
    std::fs::write(dir.join("unhealthy-host-a"), "spin").unwrap();
    let a = start("host-a", &cfg, "10.0.0.1:8080");
    let first = a.wait_for(Duration::from_secs(60), "a's health probe", health_start);
    let term = first.guest_term().unwrap();
    // The first check spins and times out: one failure of the term.
    let failed = a.wait_for(Duration::from_secs(30), "the first failure", |e| {
        e.message() == "health check failed"
    });
    assert_eq!(failed.u64("term"), Some(term), "{:?}", failed.json);
    assert_eq!(failed.u64("failures"), Some(1), "{:?}", failed.json);
    // The next check is due a period after the first began: pause the
    // leader while it spins, past its lease.
    std::thread::sleep(Duration::from_millis(400));
    a.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    // Healthy from now on: the spinning check read the marker already, and
    // any failure or hand-over after the resume can only come from it.
    std::fs::remove_file(dir.join("unhealthy-host-a")).unwrap();
    a.signal(libc::SIGCONT);
    let down = a.wait_for(Duration::from_secs(30), "a stepping down", |e| {
        e.message() == "stepping down" && e.u64("term") == Some(term)
    });
    // The host goes on: it leads again (no one else is there), and its
    // next term's checks pass.
    a.wait_for(Duration::from_secs(30), "a leading again", |e| {
        e.message() == "lease status changed"
            && e.str("role") == Some("leading")
            && e.u64("term").is_some_and(|t| t > term)
    });
    a.wait_for(Duration::from_secs(30), "a healthy check in the next term", |e| {
        e.guest_line("health", "health check ok") && e.guest_term().is_some_and(|t| t > term)
    });
    let after: Vec<Event> = a.all(|e| {
        e.at >= down.at
            && e.u64("term") == Some(term)
            && (e.message() == "health check failed" || e.message().starts_with("plugin unhealthy"))
    });
    assert!(
        after.is_empty(),
        "term {term}'s check counted after the term ended: {:?}",
        after.iter().map(|e| &e.json).collect::<Vec<_>>()
    );
    let scrape = a.scrape();
    assert_eq!(
        metric(&scrape, "baton_lease_health_handovers_total{lease=\"demo\"}").unwrap_or(0.0),
        0.0,
        "a hand-over was counted:\n{scrape}"
    );
}
