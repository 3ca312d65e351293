//! Reloads (SIGHUP, `--watch`): an unchanged configuration restarts
//! nothing; broken files and restart-only changes are refused, naming
//! what is wrong, while the old version keeps running; a replaced plugin
//! with `reload = "now"` runs from a new term at once, never beside the
//! old one; a ConfigMap-style symlink swap adds and removes a lease and a
//! plugin.

use std::path::Path;
use std::time::Duration;

use crate::support::*;

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
        assert!(std::time::Instant::now() < deadline, "no refusal {n}:\n{}", tail(&h.output(), 30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sighup_restarts_nothing_and_broken_or_restart_only_changes_are_refused() {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &base(&s.store(), &guest("probe_pollable.wasm"), ""));
    let mut h = Host::start("host-a", &cfg);
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
    s.write("baton.toml", &base(&s.store(), &guest("not-a-plugin.wasm"), ""));
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
    assert!(err.contains("the identity changed (it needs a restart)"), "{err}");
    assert!(err.contains("the lease store ([store]) changed"), "{err}");
    std::thread::sleep(SECS(1));
    assert!(h.exited().is_none(), "SIGHUP never ends the process");
    assert_eq!(starts(&h, "probe").len(), 1, "the task never restarted");
    assert_eq!(h.all(|e| e.is("leader task stopped", Some("probe"))).len(), 0);
    let scrape_free = h.all(|e| e.message() == "reload applied").len();
    assert_eq!(scrape_free, 0);
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}

#[test]
fn a_replaced_plugin_with_reload_now_runs_at_once_in_a_new_term_never_beside_the_old() {
    let s = Scratch::new();
    let file = s.dir.path().join("p.wasm");
    std::fs::copy(guest("probe_pollable.wasm"), &file).unwrap();
    let cfg = s.write("baton.toml", &base(&s.store(), &file, "reload = \"now\"\n"));
    let mut h = Host::start_with_args("host-a", &cfg, &shared_cache_dir(), &["--watch".as_ref()]);
    h.wait_for(SECS(60), "guest start", |e| e.guest_line("probe", "probe start"));
    let first = starts(&h, "probe")[0].clone();
    assert!(
        first.str("world").unwrap().contains("pollable"),
        "{:?}",
        first.json
    );
    // Replaced by a rename, as deploy tools do.
    let tmp = s.dir.path().join("p.wasm.tmp");
    std::fs::copy(guest("probe_future.wasm"), &tmp).unwrap();
    let replaced = std::time::SystemTime::now();
    std::fs::rename(&tmp, &file).unwrap();
    let second = h.wait_for(SECS(60), "the new version", |e| {
        e.is("leader task started", Some("probe")) && e.str("world").is_some_and(|w| w.contains("future"))
    });
    assert!(second.u64("term").unwrap() > first.u64("term").unwrap());
    let stop = h.wait_for(SECS(5), "old stopped", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    assert!(
        stop.at <= second.at,
        "the old version was gone before the new one started"
    );
    assert_eq!(starts(&h, "probe").len(), 2, "one start per term");
    eprintln!(
        "reload = now: new version started {:.0} ms after the file was replaced",
        ms_between(replaced, second.at)
    );
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
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
    assert!(
        record.get("holder").is_none_or(|v| v.is_null()),
        "released: {record}"
    );
    assert_eq!(starts(&h, "probe").len(), 1, "the other plugin was left alone");
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}
