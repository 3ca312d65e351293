//! A plugin moved by a reload to a lease another host leads: it never
//! runs on both hosts (the claims of `election/claims.rs`), on either store.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use crate::witness::{Record, records_dir};

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Sends SIGHUP to each of `hosts` in turn, waiting for its reload to be
/// applied.
fn reload_all(hosts: &[&Host]) {
    for h in hosts {
        let before = h.all(|e| e.message() == "reload applied").len();
        h.signal(libc::SIGHUP);
        let deadline = std::time::Instant::now() + SECS(60);
        // Not inside a wait_for predicate: that holds the log's lock.
        while h.all(|e| e.message() == "reload applied").len() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "{}: no reload applied:\n{}",
                h.name,
                tail(&h.output(), 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The configuration of the moved-plugin test: spreading on, leases `la`
/// and `lb`, and plugin `p` (it appends records, ignores the end of its
/// term, and gets 2 s of grace) under `lease`.
fn moving(head: &str, data: &Path, lease: &str) -> String {
    format!(
        "{head}[spread]\nenabled = true\n\
         [[lease]]\nname = \"la\"\n[[lease]]\nname = \"lb\"\n\
         [[plugin]]\nname = \"p\"\npath = {:?}\nlease = {lease:?}\ninherit-env = [\"PROBE_HOST\"]\n\
         env = {{ PROBE_MODE = \"append\", PROBE_IGNORE = \"1\", PROBE_TICK_MS = \"10\", PROBE_TAG = \"p\" }}\n\
         dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
        guest("probe_pollable.wasm").display().to_string(),
        data.display().to_string()
    )
}

/// Two hosts spreading leases `la` and `lb` on the store and timings of
/// `head` (TOML: `[store]` and `[defaults]`, grace 2 s), `p` under `la`;
/// a reload of both moves `p` to `lb`, led by the other host: the records
/// show the old host's last before the new host's first.
pub fn a_moved_plugin_never_runs_on_both(s: &Scratch, head: &str) {
    let data = records_dir(s);
    let cfg = s.write("baton.toml", &moving(head, &data, "la"));
    let a = probe_host("host-a", &cfg);
    let b = probe_host("host-b", &cfg);
    // Which host leads which lease: spreading gives each one, perhaps
    // after swapping them (each host may win the other's preferred lease
    // first); steady for 3 s (the settle time is 600 ms).
    let deadline = std::time::Instant::now() + SECS(60);
    let mut steady: Option<(std::time::Instant, bool)> = None;
    let a_leads_la = loop {
        let (la, lb) = (led(&a), led(&b));
        let split = (la.len() == 1 && lb.len() == 1 && la != lb).then(|| la.contains("la"));
        steady = match (split, steady) {
            (Some(now), Some((since, was))) if now == was => Some((since, was)),
            (Some(now), _) => Some((std::time::Instant::now(), now)),
            (None, _) => None,
        };
        if let Some((since, a_la)) = steady
            && since.elapsed() >= SECS(3)
        {
            break a_la;
        }
        assert!(std::time::Instant::now() < deadline, "not spread: {la:?} {lb:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (x, y) = if a_leads_la { (&a, &b) } else { (&b, &a) };
    x.wait_for(SECS(30), "p runs under la", |e| {
        e.is("leader task started", Some("p"))
    });
    std::thread::sleep(SECS(1));
    s.write("baton.toml", &moving(head, &data, "lb"));
    // The host that leads lb first: it must wait for la's claim.
    let moved_at = std::time::SystemTime::now();
    reload_all(&[y, x]);
    y.wait_for(SECS(30), "p runs under lb", |e| {
        e.is("leader task started", Some("p")) && e.str("lease") == Some("lb")
    });
    std::thread::sleep(SECS(1));
    let waited = y.all(|e| e.message().starts_with("leader task waits"));
    let (x, y) = (x.name.clone(), y.name.clone());
    let (mut a, mut b) = (a, b);
    a.sigterm();
    b.sigterm();
    assert!(a.wait_exit(SECS(30)).success());
    assert!(b.wait_exit(SECS(30)).success());
    let text = std::fs::read_to_string(data.join("records")).unwrap();
    let records: Vec<Record> = text
        .lines()
        .enumerate()
        .map(|(n, l)| Record::parse(n, l))
        .collect();
    // Before the move only x ran it (the spreading may have moved la
    // from one host to the other before).
    let records: Vec<Record> = records.into_iter().filter(|r| r.at >= moved_at).collect();
    let last_x = records
        .iter()
        .filter(|r| r.host == x)
        .map(|r| r.at)
        .max()
        .unwrap();
    let first_y = records
        .iter()
        .filter(|r| r.host == y)
        .map(|r| r.at)
        .min()
        .unwrap();
    let gap = ms_between(last_x, first_y);
    eprintln!(
        "moved plugin across hosts: {} records after the move; the old host's last came {gap:.1} ms before the new host's first",
        records.len()
    );
    assert!(
        gap > 0.0,
        "p ran on both hosts at once: {:.1} ms of overlap",
        -gap
    );
    // And the new host said why it waited.
    assert!(
        waited
            .iter()
            .any(|e| e.str("claimed_by").is_some_and(|c| c.contains("lease la"))),
        "{y} did not say it waited for lease la's claim"
    );
}
