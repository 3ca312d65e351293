//! Reloads (SIGHUP, `--watch`): an unchanged configuration restarts
//! nothing and the process goes on; broken files and restart-only changes
//! are refused, naming what is wrong, while the old version keeps running
//! (and `baton_reloads_total` counts both); a changed plugin runs from the
//! lease's next term (forced by `baton yield` to the other host), or, with
//! `reload = "now"`, from a new term at once, never beside the old one
//! (the guests' records show it); a plugin moved to another lease starts
//! there only once its old task is gone; a ConfigMap-style symlink swap
//! adds and removes a lease and a plugin; with spreading on, two hosts
//! spread the leases their reloads add, and hand over and leave the one
//! they remove (the guests' records show no overlap); spreading turned on
//! by reloads (from one lease to four) spreads the leads, and turned off
//! (with a plugin counting the live hosts, then without) moves none; a
//! host started without leases gets them by a reload and spreads them
//! with another host.

use std::path::Path;
use std::time::Duration;

use crate::spread::{STEADY, check_leases, lease_name};
use crate::status::status;
use crate::support::*;
use crate::witness::{Record, check_records, records_dir};
use crate::yielding::{socket_of, yield_cmd};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn starts(h: &Host, plugin: &str) -> Vec<Event> {
    h.all(|e| e.is("leader task started", Some(plugin)))
}

fn base(store: &Path, plugin: &Path, extra: &str) -> String {
    format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[spread]\nenabled = false\n[defaults]\nlease-duration = \"2s\"\n\
         renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"demo\"\n\
         [[plugin]]\nname = \"probe\"\npath = {:?}\nlease = \"demo\"\n{extra}",
        store.display().to_string(),
        plugin.display().to_string()
    )
}

fn refused(h: &Host, n: usize) -> Event {
    // Not inside a wait_for predicate: that holds the log's lock.
    let deadline = std::time::Instant::now() + SECS(30);
    loop {
        let all = h.all(|e| e.message().starts_with("reload refused"));
        if all.len() >= n {
            return all[n - 1].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal {n}:\n{}",
            tail(&h.output(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sighup_restarts_nothing_and_broken_or_restart_only_changes_are_refused() {
    let s = Scratch::new();
    let good = format!(
        "identity = \"host-a\"\n{}",
        base(&s.store(), &guest("probe_pollable.wasm"), "")
    );
    let cfg = s.write("baton.toml", &good);
    // The identity from the file (a changed one must be refused), and
    // the admin endpoints for the reloads' counter.
    let mut h = Host::start_opts(
        "host-a",
        &cfg,
        Opts {
            args: &["--admin-address".as_ref(), "127.0.0.1:0".as_ref()],
            identity_from_file: true,
            ..Opts::default()
        },
    );
    h.wait_for(SECS(60), "guest start", |e| e.guest_line("probe", "probe start"));
    // Unchanged: nothing restarts, the process goes on.
    h.signal(libc::SIGHUP);
    h.wait_for(SECS(30), "nothing changed", |e| {
        e.message() == "reload: nothing changed"
    });
    // A TOML error: file and line.
    s.write("baton.toml", "[store]\nkind = \"embedded\"\n[[lease]\nname = 1\n");
    h.signal(libc::SIGHUP);
    let e = refused(&h, 1);
    let err = e.str("error").unwrap();
    assert!(err.contains("baton.toml:3"), "{err}");
    // Not a component: the plugin and its file.
    s.write(
        "baton.toml",
        &good.replace("probe_pollable.wasm", "not-a-plugin.wasm"),
    );
    h.signal(libc::SIGHUP);
    let err = refused(&h, 2).str("error").unwrap().to_owned();
    assert!(
        err.contains("plugin \"probe\"") && err.contains("not-a-plugin.wasm"),
        "{err}"
    );
    // A new identity and store: a restart.
    let text = format!(
        "identity = \"other\"\n{}",
        base(&s.dir.path().join("l2"), &guest("probe_pollable.wasm"), "")
    );
    s.write("baton.toml", &text);
    h.signal(libc::SIGHUP);
    let err = refused(&h, 3).str("error").unwrap().to_owned();
    assert!(err.contains("baton.toml"), "{err}");
    assert!(err.contains("the identity changed (it needs a restart)"), "{err}");
    assert!(err.contains("the lease store ([store]) changed"), "{err}");
    // The old version still runs, in the same term, as if nothing had
    // happened.
    let refusal = refused(&h, 3).at;
    h.wait_for(SECS(15), "a tick after the refusals", |e| {
        e.guest_line("probe", "probe tick") && e.at > refusal
    });
    assert!(h.exited().is_none(), "SIGHUP never ends the process");
    assert_eq!(starts(&h, "probe").len(), 1, "the task never restarted");
    assert_eq!(h.all(|e| e.is("leader task stopped", Some("probe"))).len(), 0);
    assert_eq!(h.all(|e| e.message() == "reload applied").len(), 0);
    assert_eq!(led(&h), ["demo".to_owned()].into());
    let metrics = h.scrape();
    assert_eq!(
        metric(&metrics, "baton_reloads_total{result=\"ok\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "baton_reloads_total{result=\"refused\"}"),
        Some(3.0)
    );
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}

#[test]
fn a_changed_plugin_runs_from_the_next_term_forced_by_a_yield() {
    let s = Scratch::new();
    let file = s.dir.path().join("p.wasm");
    std::fs::copy(guest("probe_pollable.wasm"), &file).unwrap();
    let cfg = s.write(
        "baton.toml",
        &base(&s.store(), &file, "env = { PROBE_TICK_MS = \"100\" }\n"),
    );
    let mut a = Host::start("host-a", &cfg);
    let first = a.wait_for(SECS(60), "a's start", |e| {
        e.is("leader task started", Some("probe"))
    });
    let mut b = Host::start("host-b", &cfg);
    b.wait_for(SECS(60), "b loaded", |e| e.message() == "compiled-code cache");
    // The new version, seen by both hosts; the running task is left alone.
    std::fs::copy(guest("probe_future.wasm"), &file).unwrap();
    for h in [&a, &b] {
        h.signal(libc::SIGHUP);
        h.wait_for(SECS(60), "reload applied", |e| e.message() == "reload applied");
    }
    let applied = a.wait_for(SECS(1), "a's reload", |e| {
        e.message().starts_with("plugin changed")
    });
    assert!(
        applied.message().contains("from the lease's next term"),
        "{:?}",
        applied.json
    );
    std::thread::sleep(SECS(1));
    a.wait_for(SECS(15), "a tick after the reload", |e| {
        e.guest_line("probe", "probe tick") && e.at > applied.at
    });
    assert_eq!(starts(&a, "probe").len(), 1, "the running term kept its version");
    assert!(starts(&b, "probe").is_empty());
    // The next term, on host-b: the new version.
    let out = yield_cmd(&[
        "demo".as_ref(),
        "--socket".as_ref(),
        socket_of(&cfg, "host-a").as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let second = b.wait_for(SECS(30), "b's start", |e| {
        e.is("leader task started", Some("probe"))
    });
    assert!(
        second.str("world").unwrap().contains("future"),
        "{:?}",
        second.json
    );
    assert!(first.str("world").unwrap().contains("pollable"));
    assert!(second.u64("term").unwrap() > first.u64("term").unwrap());
    let stopped = a.wait_for(SECS(15), "a's stop", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    assert!(
        stopped.at <= second.at,
        "the old version was gone before the new one started"
    );
    for h in [&mut a, &mut b] {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
}

#[test]
fn a_replaced_plugin_with_reload_now_runs_at_once_in_a_new_term_never_beside_the_old() {
    let s = Scratch::new();
    let file = s.dir.path().join("p.wasm");
    std::fs::copy(guest("probe_pollable.wasm"), &file).unwrap();
    let data = records_dir(&s);
    // Its guests append records, stamped and tagged with their term.
    let extra = format!(
        "reload = \"now\"\nenv = {{ PROBE_MODE = \"append\", PROBE_TICK_MS = \"10\", PROBE_HOST = \"host-a\", \
         PROBE_TAG = \"probe\" }}\ndirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
        data.display().to_string()
    );
    let cfg = s.write("baton.toml", &base(&s.store(), &file, &extra));
    let mut h = Host::start_with_args("host-a", &cfg, &shared_cache_dir(), &["--watch".as_ref()]);
    let first = h.wait_for(SECS(60), "first start", |e| {
        e.is("leader task started", Some("probe"))
    });
    assert!(
        first.str("world").unwrap().contains("pollable"),
        "{:?}",
        first.json
    );
    std::thread::sleep(Duration::from_millis(500));
    // Replaced by a rename, as deploy tools do.
    let tmp = s.dir.path().join("p.wasm.tmp");
    std::fs::copy(guest("probe_future.wasm"), &tmp).unwrap();
    let replaced = std::time::SystemTime::now();
    std::fs::rename(&tmp, &file).unwrap();
    let second = h.wait_for(SECS(60), "the new version", |e| {
        e.is("leader task started", Some("probe")) && e.str("world").is_some_and(|w| w.contains("future"))
    });
    assert!(second.u64("term").unwrap() > first.u64("term").unwrap());
    let applied = h.wait_for(SECS(1), "applied", |e| e.message() == "reload applied");
    let stop = h.wait_for(SECS(15), "old stopped", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    assert!(
        stop.at <= second.at,
        "the old version was gone before the new one started"
    );
    assert_eq!(starts(&h, "probe").len(), 2, "one start per term");
    // Let the new version write for a while, then stop.
    std::thread::sleep(Duration::from_millis(500));
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
    // Every record stamped before its term's force-stop time, no record
    // of the old term after one of the new: never side by side.
    let file = data.join("records");
    let seen = check_records(&file, std::slice::from_ref(&h));
    let (old, new) = (first.u64("term").unwrap(), second.u64("term").unwrap());
    assert_eq!(seen.terms, [old, new].into(), "records of both versions");
    let text = std::fs::read_to_string(&file).unwrap();
    let records: Vec<Record> = text
        .lines()
        .enumerate()
        .map(|(n, l)| Record::parse(n, l))
        .collect();
    let last_old = records
        .iter()
        .filter(|r| r.term == old)
        .map(|r| r.at)
        .max()
        .unwrap();
    let first_new = records
        .iter()
        .filter(|r| r.term == new)
        .map(|r| r.at)
        .min()
        .unwrap();
    assert!(last_old < first_new, "the versions overlapped");
    eprintln!(
        "reload = now: {} records; reload applied {:.0} ms after the file was replaced (watcher: 250 ms \
         polls, 500 ms settle); the old version's last record to the new one's first: {:.1} ms; the \
         new version started {:.0} ms after the reload was applied",
        seen.records,
        ms_between(replaced, applied.at),
        ms_between(last_old, first_new),
        ms_between(applied.at, second.at)
    );
}

#[test]
fn a_configmap_swap_adds_and_removes_a_lease_and_a_plugin() {
    let s = Scratch::new();
    let d = s.dir.path();
    let probe = guest("probe_pollable.wasm");
    let extra = format!(
        "[[lease]]\nname = \"extra\"\n[[plugin]]\nname = \"p2\"\npath = {:?}\nlease = \"extra\"\n",
        probe.display().to_string()
    );
    let swap = |version: &str, text: &str| {
        std::fs::create_dir(d.join(version)).unwrap();
        std::fs::write(d.join(version).join("baton.toml"), text).unwrap();
        std::os::unix::fs::symlink(version, d.join("..tmp")).unwrap();
        std::fs::rename(d.join("..tmp"), d.join("..data")).unwrap();
    };
    swap("..v1", &base(&s.store(), &probe, ""));
    std::os::unix::fs::symlink("..data/baton.toml", d.join("baton.toml")).unwrap();
    let mut h = Host::start_with_args(
        "host-a",
        &d.join("baton.toml"),
        &shared_cache_dir(),
        &["--watch".as_ref()],
    );
    h.wait_for(SECS(60), "guest start", |e| e.guest_line("probe", "probe start"));
    swap("..v2", &format!("{}{extra}", base(&s.store(), &probe, "")));
    h.wait_for(SECS(30), "p2 start", |e| e.guest_line("p2", "probe start"));
    assert!(led(&h).contains("extra"));
    swap("..v3", &base(&s.store(), &probe, ""));
    h.wait_for(SECS(30), "p2 stopped", |e| {
        e.is("leader task stopped", Some("p2"))
    });
    h.wait_for(SECS(30), "extra removed", |e| {
        e.message().starts_with("lease removed by a reload")
    });
    let record = read_lease(&s.store(), "extra").unwrap();
    assert!(record["record"]["holder"].is_null(), "released: {record}");
    assert_eq!(starts(&h, "probe").len(), 1, "the other plugin was left alone");
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}

#[test]
fn a_plugin_moved_to_another_lease_starts_there_only_once_its_old_task_is_gone() {
    let s = Scratch::new();
    let data = records_dir(&s);
    // A task that ignores the end of its term: stopped by force, at the
    // end of the grace period.
    let x = |lease: &str| {
        format!(
            "[[lease]]\nname = \"other\"\n[[plugin]]\nname = \"x\"\npath = {:?}\nlease = {lease:?}\n\
             env = {{ PROBE_MODE = \"append\", PROBE_IGNORE = \"1\", PROBE_TICK_MS = \"10\", PROBE_HOST = \
             \"host-a\", PROBE_TAG = \"x\" }}\ndirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            guest("probe_future.wasm").display().to_string(),
            data.display().to_string()
        )
    };
    let probe = guest("probe_pollable.wasm");
    let cfg = s.write("baton.toml", &base(&s.store(), &probe, &x("demo")));
    let mut h = Host::start("host-a", &cfg);
    h.wait_for(SECS(60), "x in demo", |e| {
        e.is("leader task started", Some("x")) && e.str("lease") == Some("demo")
    });
    // Not inside a wait_for predicate: that holds the log's lock.
    let deadline = std::time::Instant::now() + SECS(30);
    while led(&h).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "both leases led");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.write("baton.toml", &base(&s.store(), &probe, &x("other")));
    h.signal(libc::SIGHUP);
    let applied = h.wait_for(SECS(30), "applied", |e| e.message() == "reload applied");
    let changes = applied.str("changes").unwrap();
    assert!(
        changes.contains("plugin x removed from lease demo")
            && changes.contains("plugin x added to lease other"),
        "{changes}"
    );
    let moved = h.wait_for(SECS(30), "x in other", |e| {
        e.is("leader task started", Some("x")) && e.str("lease") == Some("other")
    });
    // Its only stop before the shutdown: in demo.
    let gone = h.wait_for(SECS(1), "x gone from demo", |e| {
        e.is("leader task stopped", Some("x"))
    });
    assert_eq!(gone.str("how"), Some("forced"), "{:?}", gone.json);
    assert!(gone.at <= moved.at, "x ran in two leases at once");
    eprintln!(
        "moved plugin: the old task was gone {:.1} ms before the new one started",
        ms_between(gone.at, moved.at)
    );
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}

/// A configuration with spreading on and leases `lease-NN` of `leases`,
/// each gating one guest that appends records to `data/lease-NN/records`
/// (the layout of [`crate::spread`]'s scenario, so its check applies).
fn spreading(store: &Path, data: &Path, leases: &[usize]) -> String {
    spreading_with(store, data, leases, "[spread]\nenabled = true\n")
}

/// [`spreading`], with `spread` (TOML: a `[spread]` table, or nothing for
/// the default: on with more than one lease) instead.
fn spreading_with(store: &Path, data: &Path, leases: &[usize], spread: &str) -> String {
    let mut text = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n{spread}[defaults]\nlease-duration = \"2s\"\n\
         renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n",
        store.display().to_string()
    );
    let path = guest("probe_pollable.wasm").display().to_string();
    for &i in leases {
        let dir = data.join(lease_name(i));
        std::fs::create_dir_all(&dir).unwrap();
        text.push_str(&format!(
            "[[lease]]\nname = \"lease-{i:02}\"\n[[plugin]]\nname = \"p-{i:02}\"\npath = {path:?}\nlease = \"lease-{i:02}\"\n\
             inherit-env = [\"PROBE_HOST\"]\nenv = {{ PROBE_MODE = \"append\", PROBE_TAG = \"p-{i:02}\", PROBE_TICK_MS = \"50\" }}\n\
             dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            dir.display().to_string()
        ));
    }
    text
}

/// Waits until each of `leases` is led by exactly one of `hosts`, no
/// other lease is led, and the hosts' counts differ by one at most, and
/// that holds for [`STEADY`]. Returns each host's leases. A lease led by
/// both by their logs does not fail it (a status event is logged after the
/// fact, by as much as a busy machine delays it): that no lease's guest
/// ran on both at once is the records' check ([`check_leases`]).
fn wait_led(hosts: &[&Host], leases: &[usize], within: Duration) -> Vec<std::collections::BTreeSet<String>> {
    let want: std::collections::BTreeSet<String> = leases.iter().map(|&i| lease_name(i)).collect();
    let start = std::time::Instant::now();
    let mut held: Option<std::time::Instant> = None;
    loop {
        let sets: Vec<_> = hosts.iter().map(|h| led(h)).collect();
        let all: Vec<&String> = sets.iter().flatten().collect();
        let unique: std::collections::BTreeSet<&String> = all.iter().copied().collect();
        let counts: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        let even = counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1;
        if unique.len() == all.len()
            && unique
                .into_iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                == want
            && even
        {
            let since = *held.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= STEADY {
                return sets;
            }
        } else {
            held = None;
        }
        assert!(
            start.elapsed() < within + STEADY,
            "not spread: {sets:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_spreading_leases_added_by_reloads_are_spread_and_a_removed_one_is_handed_over_and_left() {
    let s = Scratch::new();
    let data = records_dir(&s);
    let cfg = s.write("baton.toml", &spreading(&s.store(), &data, &[0]));
    let start = |name: &str| probe_host(name, &cfg);
    let mut a = start("host-a");
    let mut b = start("host-b");
    for h in [&a, &b] {
        h.wait_for(SECS(60), "loaded", |e| e.message() == "compiled-code cache");
    }
    wait_led(&[&a, &b], &[0], SECS(60));
    // Two leases added, on a, then on b: spread, each led by one host.
    s.write("baton.toml", &spreading(&s.store(), &data, &[0, 1, 2]));
    for h in [&a, &b] {
        h.signal(libc::SIGHUP);
        let applied = h.wait_for(SECS(60), "reload applied", |e| e.message() == "reload applied");
        let changes = applied.str("changes").unwrap();
        assert!(
            changes.contains("lease lease-01 added") && changes.contains("lease lease-02 added"),
            "{changes}"
        );
    }
    assert!(
        a.all(|e| e.message().starts_with("reload refused")).is_empty(),
        "not refused"
    );
    let sets = wait_led(&[&a, &b], &[0, 1, 2], SECS(60));
    eprintln!("spread after adding two leases: a {:?}, b {:?}", sets[0], sets[1]);
    let holder = if sets[0].contains("lease-02") { &a } else { &b };
    let holder_name = holder.name.clone();
    // lease-02 removed, on a, then on b: handed over (its task told and
    // gone by itself), then led by nobody.
    s.write("baton.toml", &spreading(&s.store(), &data, &[0, 1]));
    for h in [&a, &b] {
        h.signal(libc::SIGHUP);
        let applied = h.wait_for(SECS(60), "reload applied", |e| {
            e.message() == "reload applied"
                && e.str("changes")
                    .is_some_and(|c| c.contains("lease lease-02 removed"))
        });
        assert!(applied.str("changes").is_some());
    }
    for h in [&a, &b] {
        h.wait_for(SECS(30), "lease-02 removed", |e| {
            e.message().starts_with("lease removed by a reload") && e.str("lease") == Some("lease-02")
        });
    }
    wait_led(&[&a, &b], &[0, 1], SECS(60));
    let record = read_lease(&s.store(), "lease-02").unwrap();
    assert!(record["record"]["holder"].is_null(), "released: {record}");
    let stops: Vec<Event> = [&a, &b]
        .iter()
        .flat_map(|h| h.all(|e| e.is("leader task stopped", Some("p-02"))))
        .collect();
    assert!(!stops.is_empty(), "{holder_name}'s task of lease-02 stopped");
    for e in &stops {
        assert_ne!(
            e.str("how"),
            Some("forced"),
            "handed over gracefully: {:?}",
            e.json
        );
    }
    std::thread::sleep(SECS(2));
    for h in [&a, &b] {
        assert!(
            !led(h).contains("lease-02"),
            "{} leads lease-02 after its removal",
            h.name
        );
    }
    let starts = |i: usize| -> usize {
        [&a, &b]
            .iter()
            .map(|h| {
                h.all(|e| e.is("leader task started", Some(&format!("p-{i:02}"))))
                    .len()
            })
            .sum()
    };
    eprintln!(
        "spread reload: leader task starts of lease-01: {}, of lease-02: {} (a start on a host that did not prefer it is moved once)",
        starts(1),
        starts(2)
    );
    for h in [&mut a, &mut b] {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
    check_leases(&data, 3, &[&a, &b]);
}

/// Sends SIGHUP to each of `hosts` in turn, waiting for the reload to be
/// applied; each one's changes must mention `change`.
fn reload_all(hosts: &[&Host], change: &str) {
    for h in hosts {
        let before = h.all(|e| e.message() == "reload applied").len();
        h.signal(libc::SIGHUP);
        let deadline = std::time::Instant::now() + SECS(60);
        let applied = loop {
            // Not inside a wait_for predicate: that holds the log's lock.
            let all = h.all(|e| e.message() == "reload applied");
            if all.len() > before {
                break all[before].clone();
            }
            assert!(
                h.all(|e| e.message().starts_with("reload refused")).is_empty(),
                "{}: refused:\n{}",
                h.name,
                tail(&h.output(), 20)
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{}: no reload applied",
                h.name
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let changes = applied.str("changes").unwrap();
        assert!(changes.contains(change), "{}: {changes}", h.name);
    }
}

/// `baton status --output json` of `cfg`.
fn status_json(cfg: &Path) -> serde_json::Value {
    serde_json::from_str(&status(cfg, &["--output".as_ref(), "json".as_ref()])).unwrap()
}

/// While the leads are spread: `baton status` of `cfg` counts `hosts` as
/// live and shows each lease led by its preferred holder.
fn led_as_preferred(cfg: &Path, hosts: &[&Host]) {
    let json = status_json(cfg);
    let live: Vec<&str> = json["live_hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(live, names, "{json}");
    assert_eq!(json["spreading"], true, "{json}");
    for lease in json["leases"].as_array().unwrap() {
        assert_eq!(lease["holder"], lease["preferred_holder"], "{lease}");
    }
}

/// Whether the membership record of `host` in `store` is held.
fn member_held(store: &Path, host: &str) -> bool {
    read_lease(store, &format!("baton-member.{host}")).is_some_and(|r| !r["record"]["holder"].is_null())
}

/// Every leader task start of lease `i`'s plugin on `hosts`.
fn task_starts(hosts: &[&Host], i: usize) -> usize {
    hosts
        .iter()
        .map(|h| {
            h.all(|e| e.is("leader task started", Some(&format!("p-{i:02}"))))
                .len()
        })
        .sum()
}

#[test]
fn spreading_turned_on_and_off_by_reloads_spreads_the_leads_then_moves_none() {
    let test_start = std::time::Instant::now();
    let s = Scratch::new();
    let data = records_dir(&s);
    let store = s.store();
    // One lease: spreading off by default.
    let cfg = s.write("baton.toml", &spreading_with(&store, &data, &[0], ""));
    let start = |name: &str| probe_host(name, &cfg);
    let mut a = start("host-a");
    let mut b = start("host-b");
    for h in [&a, &b] {
        h.wait_for(SECS(60), "loaded", |e| e.message() == "compiled-code cache");
    }
    wait_led(&[&a, &b], &[0], SECS(60));
    assert!(!member_held(&store, "host-a") && !member_held(&store, "host-b"));
    // Four leases, on a, then on b: spreading turns on, and the leads are
    // spread over both hosts as the assignment says.
    let four = [0, 1, 2, 3];
    s.write("baton.toml", &spreading_with(&store, &data, &four, ""));
    reload_all(&[&a, &b], "spreading on");
    let sets = wait_led(&[&a, &b], &four, SECS(60));
    assert_eq!([sets[0].len(), sets[1].len()], [2, 2], "{sets:?}");
    led_as_preferred(&cfg, &[&a, &b]);
    eprintln!("spreading on: a {:?}, b {:?}", sets[0], sets[1]);
    // Off, and a lease added whose plugin counts the live hosts: the
    // records are kept for it (it counts both hosts) but steer nothing,
    // and no lease moves.
    let starts: Vec<usize> = four.iter().map(|&i| task_starts(&[&a, &b], i)).collect();
    let hosts_plugin = format!(
        "[[lease]]\nname = \"counted\"\n[[plugin]]\nname = \"hosts-pollable\"\npath = {:?}\nlease = \"counted\"\n",
        guest("hosts_pollable.wasm").display().to_string()
    );
    let off = "[spread]\nenabled = false\n";
    s.write(
        "baton.toml",
        &format!("{}{hosts_plugin}", spreading_with(&store, &data, &four, off)),
    );
    reload_all(&[&a, &b], "spreading off");
    let deadline = std::time::Instant::now() + SECS(30);
    let counts_two = |e: &Event| e.guest_line("hosts-pollable", "probe hosts live=2 this-host-live=true");
    while a.all(counts_two).is_empty() && b.all(counts_two).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the live hosts not counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status_json(&cfg)["spreading"], false);
    // Each host's record is released and taken again as its spreader is
    // replaced (daemon/leases.rs, `respread`): a guest may count both
    // before the second host's record is back. Both are held again soon.
    let deadline = std::time::Instant::now() + SECS(30);
    while !(member_held(&store, "host-a") && member_held(&store, "host-b")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the membership records were not both held again within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // That lease and plugin removed: the records are released.
    s.write("baton.toml", &spreading_with(&store, &data, &four, off));
    reload_all(&[&a, &b], "membership record released");
    assert!(!member_held(&store, "host-a") && !member_held(&store, "host-b"));
    assert_eq!(status_json(&cfg)["live_hosts"], serde_json::json!([]));
    // Each lease still led by one host, the same: nothing moved.
    let after = wait_led(&[&a, &b], &four, SECS(60));
    assert_eq!(after, sets, "a lease moved");
    let now: Vec<usize> = four.iter().map(|&i| task_starts(&[&a, &b], i)).collect();
    assert_eq!(now, starts, "a lease's task started again");
    for h in [&mut a, &mut b] {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
    check_leases(&data, four.len(), &[&a, &b]);
    eprintln!(
        "spreading on and off by reloads: {:.1} s",
        test_start.elapsed().as_secs_f64()
    );
}

#[test]
fn a_host_started_without_leases_gets_them_by_a_reload_and_spreads_them_with_another() {
    let test_start = std::time::Instant::now();
    let s = Scratch::new();
    let data = records_dir(&s);
    let store = s.store();
    let four = [0, 1, 2, 3];
    let empty = s.write("a.toml", &spreading_with(&store, &data, &[], ""));
    let full = s.write("b.toml", &spreading_with(&store, &data, &four, ""));
    let mut a = probe_host("host-a", &empty);
    let mut b = probe_host("host-b", &full);
    a.wait_for(SECS(60), "a started", |e| e.message() == "baton starting");
    b.wait_for(SECS(60), "b loaded", |e| e.message() == "compiled-code cache");
    // b leads every lease; a, without leases, keeps no membership record.
    wait_led(&[&b], &four, SECS(60));
    assert!(!member_held(&store, "host-a"));
    assert!(member_held(&store, "host-b"));
    // a gets the four leases: it spreads them with b.
    s.write("a.toml", &spreading_with(&store, &data, &four, ""));
    reload_all(&[&a], "spreading on");
    let sets = wait_led(&[&a, &b], &four, SECS(60));
    assert_eq!([sets[0].len(), sets[1].len()], [2, 2], "{sets:?}");
    led_as_preferred(&full, &[&a, &b]);
    eprintln!(
        "a host without leases, reloaded: a {:?}, b {:?}",
        sets[0], sets[1]
    );
    for h in [&mut a, &mut b] {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
    check_leases(&data, four.len(), &[&a, &b]);
    eprintln!(
        "a host without leases, reloaded: {:.1} s",
        test_start.elapsed().as_secs_f64()
    );
}

#[test]
fn a_plugin_moved_to_a_lease_another_host_leads_never_runs_on_both() {
    let s = Scratch::new();
    let head = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"5s\"\n\
         renew-deadline = \"2s\"\nretry-period = \"300ms\"\ngrace = \"2s\"\n",
        s.store().display().to_string()
    );
    crate::moving::a_moved_plugin_never_runs_on_both(&s, &head);
}
