//! Plugins' key-value state on the embedded store, with real hosts: a
//! paused leader's write refused, grants and limits, `baton kv`, crash
//! safety, and `wasi:config`. (The counter under chaos: `chaos/counter.rs`;
//! the Kubernetes store's: tests/kube/state.rs.)

use std::time::Duration;

use rand::Rng;

use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A `[[plugin]]` table of the kv-counter named `name` with `extra` lines.
fn counter(name: &str, extra: &str) -> String {
    format!(
        "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\n{extra}\n",
        guest("kv_counter.wasm").display().to_string()
    )
}

/// The configuration of `support::config` with the given plugin tables.
fn config_with(s: &Scratch, tables: &str) -> std::path::PathBuf {
    let mut text = config(&s.store(), &[]);
    text.push_str(tables);
    s.write("baton.toml", &text)
}

/// `baton kv ARGS --config CFG`: (exit success, stdout, stderr).
fn kv(cfg: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = baton()
        .arg("kv")
        .args(args)
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `n=` of a guest line.
fn n_of(e: &Event) -> u64 {
    e.message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("n="))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_BUCKET_WRITE_DELAY: a build with --features test-hooks"
)]
fn a_leader_paused_in_a_write_past_its_lease_cannot_land_it() {
    let s = Scratch::new();
    let cfg = config_with(&s, &counter("counter", "env = { KV_INTERVAL_MS = \"50\" }"));
    let a = Host::start_opts(
        "a",
        &cfg,
        Opts {
            env: &[("BATON_TEST_BUCKET_WRITE_DELAY", "3s")],
            ..Opts::default()
        },
    );
    let tried = a.wait_for(SECS(30), "a's first try", |e| e.guest_line("counter", "kv try"));
    // The guest calls the write right after its line; under load it may
    // not have yet when the line is read. The write then waits out its
    // delay in the host, where the pause must catch it.
    std::thread::sleep(Duration::from_millis(300));
    a.signal(libc::SIGSTOP);
    let stale_term = tried.guest_term().unwrap();
    let mut b = Host::start("b", &cfg);
    let first = b.wait_for(SECS(30), "b's first write", |e| e.guest_line("counter", "kv ok"));
    assert!(first.guest_term().unwrap() > stale_term);
    assert_eq!(
        n_of(&first),
        1,
        "a's write was not in the store before b's: {}",
        first.message()
    );
    a.signal(libc::SIGCONT);
    let refused = a.wait_for(SECS(10), "a's write refused", |e| {
        e.message() == "refused a stale write"
    });
    assert_eq!(refused.u64("term"), Some(stale_term));
    let error = refused.str("error").unwrap_or_default();
    assert!(
        error.contains(&format!("term {} has claimed", first.guest_term().unwrap())),
        "{error}"
    );
    std::thread::sleep(Duration::from_millis(300));
    b.sigterm();
    b.wait_exit(SECS(10));
    let (_, value, _) = kv(&cfg, &["get", "count"]);
    let term: u64 = value.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(
        term,
        first.guest_term().unwrap(),
        "the value was last written by b's term: {value}"
    );
}

#[test]
fn buckets_not_granted_are_denied_and_limits_are_errors_in_the_guest() {
    let s = Scratch::new();
    let tables = [
        counter("own", "env = { KV_MODE = \"grant-probe\", KV_BUCKET = \"default\" }"),
        counter("denied", "env = { KV_MODE = \"grant-probe\", KV_BUCKET = \"other\" }"),
        counter(
            "shared",
            "keyvalue = [\"jobs\"]\nenv = { KV_MODE = \"grant-probe\", KV_BUCKET = \"jobs\", KV_VALUE_BYTES = \"2048\" }\nkeyvalue-limits = { value = \"1 KiB\" }",
        ),
        counter("no-default", "keyvalue = [\"jobs\"]\nenv = { KV_MODE = \"grant-probe\", KV_BUCKET = \"default\" }"),
    ]
    .concat();
    let cfg = config_with(&s, &tables);
    let mut h = Host::start("h", &cfg);
    let line = |plugin: &str, prefix: &str| {
        h.wait_for(SECS(30), prefix, |e| e.guest_line(plugin, prefix))
            .message()
            .to_owned()
    };
    assert_eq!(line("own", "kv open"), "kv open bucket=default result=ok");
    assert_eq!(line("own", "kv set"), "kv set bytes=10 result=ok");
    assert_eq!(
        line("denied", "kv open"),
        "kv open bucket=other result=access-denied"
    );
    assert_eq!(
        line("no-default", "kv open"),
        "kv open bucket=default result=access-denied"
    );
    assert_eq!(line("shared", "kv open"), "kv open bucket=jobs result=ok");
    let set = line("shared", "kv set");
    assert!(
        set.contains("result=other:plugin \"shared\"")
            && set.contains("demo/jobs")
            && set.contains("limit of 1024 bytes"),
        "{set}"
    );
    // The host goes on: every plugin's task ended by itself.
    for p in ["own", "denied", "shared", "no-default"] {
        h.wait_for(SECS(10), "task ended", |e| {
            e.is("leader task finished for this term", Some(p))
        });
    }
    assert!(h.exited().is_none());
}

#[test]
fn baton_kv_reads_writes_and_fences_a_running_leader_only_when_forced() {
    let s = Scratch::new();
    let cfg = config_with(&s, &counter("counter", "env = { KV_INTERVAL_MS = \"100\" }"));
    let (ok, _, err) = kv(&cfg, &["put", "note", "before"]);
    assert!(ok, "{err}");
    let h = Host::start("h", &cfg);
    let first = h.wait_for(SECS(30), "a write", |e| e.guest_line("counter", "kv ok"));
    let term = first.guest_term().unwrap();
    let (_, listed, _) = kv(&cfg, &["list", "-o", "json"]);
    assert!(listed.contains("\"bucket\": \"counter\""), "{listed}");
    let (_, keys, _) = kv(&cfg, &["list", "--plugin", "counter"]);
    assert_eq!(keys.lines().collect::<Vec<_>>(), ["count", "note"]);
    let (ok, _, err) = kv(&cfg, &["put", "note", "refused"]);
    assert!(
        !ok && err.contains("is held by") && err.contains(&format!("in term {term}")),
        "{err}"
    );
    let (ok, out, err) = kv(&cfg, &["put", "note", "forced", "--force"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("in term {}", term + 1)) && out.contains("was displaced"),
        "{out}"
    );
    // The leader's next write is refused, or its task was stopped first.
    h.wait_for(SECS(10), "the old term stopped", |e| {
        e.is("leader task stopped", Some("counter")) && e.u64("term") == Some(term)
    });
    let next = h.wait_for(SECS(30), "a write of a later term", |e| {
        e.guest_line("counter", "kv ok") && e.guest_term() > Some(term + 1)
    });
    assert!(next.guest_term().unwrap() > term + 1);
    let (_, note, _) = kv(&cfg, &["get", "note"]);
    assert_eq!(note, "forced");
    let (ok, _, _) = kv(&cfg, &["delete", "note", "--force"]);
    assert!(ok);
    let (ok, _, err) = kv(&cfg, &["get", "note"]);
    assert!(!ok && err.contains("no key \"note\""), "{err}");
    let written = h
        .all(|e| e.guest_line("counter", "kv ok") && e.guest_term() == Some(term))
        .len();
    assert!(written > 0);
}

#[test]
fn writers_killed_at_random_points_leave_every_acknowledged_write() {
    let s = Scratch::new();
    let cfg = config_with(&s, &counter("counter", "env = { KV_INTERVAL_MS = \"0\" }"));
    let db = s.store().join("buckets/buckets.sqlite3");
    let mut rng = rand::rng();
    let mut acknowledged = 0;
    for round in 0..6 {
        let mut h = Host::start("h", &cfg);
        h.wait_for(SECS(30), "writing", |e| e.guest_line("counter", "kv ok"));
        std::thread::sleep(Duration::from_millis(rng.random_range(50..400)));
        h.sigkill();
        h.wait_exit(SECS(10));
        let last = h
            .all(|e| e.guest_line("counter", "kv ok"))
            .last()
            .map(n_of)
            .unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "round {round}");
        drop(conn);
        let (ok, value, err) = kv(&cfg, &["get", "count"]);
        assert!(ok, "round {round}: {err}");
        let n: u64 = value.split_whitespace().next().unwrap().parse().unwrap();
        // The host's last log lines may be lost with it, so the store may
        // hold more than the log shows acknowledged, never less.
        assert!(n >= last, "round {round}: stored {n}, last acknowledged {last}");
        assert!(last > acknowledged, "round {round}: no progress");
        acknowledged = last;
        // The next host takes over once this one's lease ran out.
    }
}

#[test]
fn config_values_come_from_the_table_a_file_and_the_environment() {
    let s = Scratch::new();
    let secret = s.write("token", "s3cret\n");
    let extra = format!(
        "env = {{ KV_MODE = \"config\", CONFIG_KEYS = \"region,token,home,missing\" }}\n\
         config = {{ region = \"eu-west\", token = {{ from-file = {:?} }}, home = {{ env = \"BATON_TEST_HOME\" }} }}",
        secret.display().to_string()
    );
    let cfg = config_with(&s, &counter("cfg", &extra));
    let h = Host::start_opts(
        "h",
        &cfg,
        Opts {
            env: &[("BATON_TEST_HOME", "/srv")],
            ..Opts::default()
        },
    );
    let line = |prefix: &str| {
        h.wait_for(SECS(30), prefix, |e| e.guest_line("cfg", prefix))
            .message()
            .to_owned()
    };
    assert_eq!(
        line("config get key=region"),
        "config get key=region value=eu-west"
    );
    assert_eq!(line("config get key=token"), "config get key=token value=s3cret");
    assert_eq!(line("config get key=home"), "config get key=home value=/srv");
    assert_eq!(
        line("config get key=missing"),
        "config get key=missing value=none"
    );
    assert_eq!(line("config all"), "config all n=3");
    let out = baton()
        .arg("check")
        .arg(guest("kv_counter.wasm"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("wasi:keyvalue") && said.contains("wasi:config"),
        "{said}"
    );
}

#[test]
fn a_counter_counts_each_increment_once_across_yields_between_two_hosts() {
    let s = Scratch::new();
    let kv = crate::chaos::counter::records(&s);
    let cfg = config_with(&s, &crate::chaos::counter::plugin(10, &kv));
    let a = Host::start("a", &cfg);
    a.wait_for(SECS(30), "a counts", |e| e.guest_line("counter", "kv ok"));
    let b = Host::start("b", &cfg);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    for round in 0..4 {
        let (from, to) = if round % 2 == 0 { ("a", &b) } else { ("b", &a) };
        let counted = || to.all(|e| e.guest_line("counter", "kv ok")).len();
        let before = counted();
        let socket = crate::yielding::socket_of(&cfg, from);
        let out = crate::yielding::yield_cmd(&[
            "demo".as_ref(),
            "--for".as_ref(),
            "100ms".as_ref(),
            "--socket".as_ref(),
            socket.as_os_str(),
        ]);
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let until = std::time::Instant::now() + SECS(30);
        while counted() < before + 10 {
            assert!(
                std::time::Instant::now() < until,
                "round {round}: the other host does not count"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    a.sigterm();
    b.sigterm();
    std::thread::sleep(SECS(2));
    crate::chaos::counter::check(&cfg, &[], &kv, 0);
}
