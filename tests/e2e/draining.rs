//! `baton drain` and `baton resume`, the scenario both stores run: hosts
//! share several leases, each gating a guest that appends term-tagged
//! records ([`spread::leases_config`]); one host is drained. It ends up
//! leading nothing, each lease it led is led by another host in the next
//! term, the store's records say who holds what and that it drains, and it
//! takes nothing while it drains; resumed, it takes its share again. The
//! witness then checks every lease's records: none after its term's
//! force-stop time, terms never going back, so no two hosts ran a lease's
//! guest at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::spread::{Incarnation, check_lease, lease_name, start_host};
use crate::support::*;

/// How long a count must hold to count as settled.
const STEADY: Duration = Duration::from_millis(1500);

/// What the scenario reads from the store, besides the hosts' logs.
pub struct Records<'a> {
    /// The holder of a lease now (`None`: released or absent).
    pub holder: &'a dyn Fn(&str) -> Option<String>,
    /// What a host's membership record says: whether it drains (`None`:
    /// no record, or one without).
    pub draining: &'a dyn Fn(&str) -> Option<bool>,
    /// Whether `baton status` shows the host draining.
    pub status_draining: &'a dyn Fn(&str) -> bool,
}

/// Whether `baton status --config cfg -o json` lists `host`'s membership
/// record as draining.
pub fn status_says_draining(cfg: &Path, host: &str) -> bool {
    let json: serde_json::Value = serde_json::from_str(&crate::status::status(
        cfg,
        &[std::ffi::OsStr::new("-o"), std::ffi::OsStr::new("json")],
    ))
    .unwrap();
    let record = format!("baton-member.{host}");
    json["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|h| h["record"] == record.as_str() && h["draining"] == true)
}

/// Runs `baton ARGS`.
pub fn baton_cmd(args: &[&std::ffi::OsStr]) -> Output {
    baton().args(args).output().expect("run baton")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The term `h` last logged leading `lease` in.
fn lead_term(h: &Host, lease: &str) -> Option<u64> {
    h.all(|e| {
        e.message() == "lease status changed"
            && e.str("lease") == Some(lease)
            && e.str("role") == Some("leading")
    })
    .last()
    .and_then(|e| e.u64("term"))
}

/// Waits until every one of `n` leases is led by exactly one of `hosts`,
/// each host leading its `want` count (`None`: any), for [`STEADY`]:
/// longer than the settle time of both stores' tests (two retry periods,
/// 1 s at most), so a move that follows a change is not missed.
fn wait_counts(hosts: &[&Host], n: usize, want: &[Option<usize>], within: Duration) -> Vec<BTreeSet<String>> {
    let start = Instant::now();
    let mut held_since: Option<Instant> = None;
    loop {
        let sets: Vec<BTreeSet<String>> = hosts.iter().map(|h| led(h)).collect();
        let mut holders: BTreeMap<&String, usize> = BTreeMap::new();
        for l in sets.iter().flatten() {
            *holders.entry(l).or_default() += 1;
        }
        let counts: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        let ok = holders.len() == n
            && holders.values().all(|c| *c == 1)
            && counts.iter().zip(want).all(|(c, w)| w.is_none_or(|w| *c == w));
        if ok {
            let since = *held_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STEADY {
                return sets;
            }
        } else {
            held_since = None;
        }
        assert!(
            start.elapsed() < within + STEADY,
            "not {want:?} after {within:?}: the hosts lead {counts:?}, {} of {n} leases led",
            holders.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The scenario on `cfg` (`n` leases, records in `data`) with the hosts
/// `names`, the second of which is drained (one lease at a time, or
/// `all_at_once`); `records` reads the store.
/// Returns how long `baton drain` took, in milliseconds.
pub fn drain_one_host(
    cfg: &Path,
    data: &Path,
    names: &[&str],
    n: usize,
    records: &Records,
    all_at_once: bool,
) -> f64 {
    let mut hosts: Vec<Host> = names.iter().map(|name| start_host(name, cfg)).collect();
    let share = n / names.len();
    let all: Vec<&Host> = hosts.iter().collect();
    let even = vec![Some(share); names.len()];
    wait_counts(&all, n, &even, Duration::from_secs(60));
    let drained = &hosts[1];
    let id = drained.name.clone();
    let before: BTreeMap<String, u64> = led(drained)
        .into_iter()
        .map(|l| {
            let term = lead_term(drained, &l).unwrap();
            (l, term)
        })
        .collect();
    assert_eq!(before.len(), share);
    assert_eq!(
        (records.draining)(&id),
        Some(false),
        "{id}'s record before the drain"
    );

    let started = Instant::now();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "drain".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
        "--identity".as_ref(),
        id.as_ref(),
        "--timeout".as_ref(),
        "20s".as_ref(),
    ];
    if all_at_once {
        args.push("--all-at-once".as_ref());
    }
    let out = baton_cmd(&args);
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let said = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains(&format!("host {id} drains")), "{said}");
    println!("baton drain said ({took:.0} ms): {}", said.trim());
    // Each lease it led: handed over, and led by another host in the next
    // term, as its log, the others' logs and the store say.
    for (lease, term) in &before {
        assert!(
            said.contains(&format!("{lease} term {term}: tasks stopped")),
            "{lease}: {said}"
        );
        let next = hosts
            .iter()
            .filter(|h| h.name != id)
            .find_map(|h| {
                h.try_wait_for(Duration::from_secs(15), &|e| {
                    e.message() == "lease status changed"
                        && e.str("lease") == Some(lease.as_str())
                        && e.str("role") == Some("leading")
                        && e.u64("term") == Some(term + 1)
                })
                .map(|_| h.name.clone())
            })
            .unwrap_or_else(|| panic!("{lease}: no other host led term {}", term + 1));
        assert!(
            said.contains(&format!("{next} took it in term {}", term + 1)),
            "{lease}: {said}"
        );
        let stopped = drained.all(|e| e.is("leader task stopped", None) && e.u64("term") == Some(*term));
        assert!(
            stopped.iter().all(|e| e.str("how") == Some("cooperative")),
            "{lease}: {stopped:?}"
        );
    }
    assert!(led(drained).is_empty(), "{id} still leads {:?}", led(drained));
    let wait_record = |want: bool| {
        let start = Instant::now();
        while (records.draining)(&id) != Some(want) {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{id}'s record never said draining = {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_record(true);
    assert!(
        (records.status_draining)(&id),
        "baton status does not show {id} draining"
    );
    // It takes nothing while it drains: the others share every lease, and
    // the store says so.
    let mut others = even.clone();
    others[1] = Some(0);
    for (i, o) in others.iter_mut().enumerate() {
        if i != 1 {
            *o = None;
        }
    }
    wait_counts(&all, n, &others, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        led(drained).is_empty(),
        "{id} took {:?} while draining",
        led(drained)
    );
    for i in 0..n {
        let holder = (records.holder)(&lease_name(i));
        assert!(
            holder.as_ref().is_some_and(|h| *h != id),
            "{}: held by {holder:?}",
            lease_name(i)
        );
    }

    // Resumed: it takes its share again.
    let out = baton_cmd(&[
        "resume".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
        "--identity".as_ref(),
        id.as_ref(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).contains(&format!("host {id} resumed")),
        "{out:?}"
    );
    wait_record(false);
    wait_counts(&all, n, &even, Duration::from_secs(60));

    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        assert!(
            h.wait_exit(Duration::from_secs(20)).success(),
            "{} failed",
            h.name
        );
    }
    let runs: Vec<Incarnation> = hosts
        .iter()
        .map(|host| Incarnation { host, killed: None })
        .collect();
    for i in 0..n {
        let (r, _) = check_lease(data, i, &runs);
        assert!(r > 0, "lease {i}: no records");
    }
    took
}

/// A lone host on `cfg` (one lease "demo", its plugin "probe" ignoring its
/// change signal, so stopped by force after the grace), its lease read
/// through `holder`: a drain whose wait is shorter than the grace fails,
/// naming the lease, but the hand-over goes on: the lease is released
/// once the task is gone, and nobody leads it (no other host); a second
/// drain says it led nothing; `/readyz` stays ready throughout; `baton
/// resume` makes it lead again, in the next term.
pub fn a_lone_host_drain_that_times_out(cfg: &Path, holder: &dyn Fn(&str) -> Option<String>) {
    let mut a = Host::start_opts(
        "solo",
        cfg,
        Opts {
            args: &["--admin-address".as_ref(), "127.0.0.1:0".as_ref()],
            ..Opts::default()
        },
    );
    let leading = |e: &Event| {
        e.message() == "lease status changed"
            && e.str("lease") == Some("demo")
            && e.str("role") == Some("leading")
    };
    let term = a
        .wait_for(Duration::from_secs(60), "solo leading", leading)
        .u64("term")
        .unwrap();
    a.wait_for(Duration::from_secs(30), "the guest's start", |e| {
        e.guest_line("probe", "probe start")
    });
    let drain = |timeout: &str| {
        baton_cmd(&[
            "drain".as_ref(),
            "--config".as_ref(),
            cfg.as_os_str(),
            "--timeout".as_ref(),
            timeout.as_ref(),
        ])
    };
    let out = drain("200ms");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        err.contains("host solo drains") && err.contains("not confirmed stopped"),
        "{err}"
    );
    assert!(
        err.contains(&format!("demo term {term}: tasks not confirmed stopped")),
        "{err}"
    );
    // Forced after the grace, then released; nobody takes it.
    let stopped = a.wait_for(Duration::from_secs(15), "the forced stop", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    assert_eq!(stopped.str("how"), Some("forced"));
    a.wait_for(Duration::from_secs(15), "the release", |e| {
        e.message() == "released the lease"
    });
    assert_eq!(holder("demo"), None);
    let out = drain("5s");
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("it led no lease"), "{out:?}");
    // Readiness does not depend on leadership: a draining host is ready.
    let (status, body) = a.admin_get("/readyz");
    assert_eq!(status, 200, "draining, /readyz says: {body}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(holder("demo"), None, "taken while draining");
    assert!(led(&a).is_empty());
    let out = baton_cmd(&["resume".as_ref(), "--config".as_ref(), cfg.as_os_str()]);
    assert!(out.status.success(), "{out:?}");
    let again = a.wait_for(Duration::from_secs(15), "solo leading again", |e| {
        leading(e) && e.u64("term") > Some(term)
    });
    assert_eq!(again.u64("term"), Some(term + 1));
    a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(20)).success());
}
