//! Grants over the host's own files: a `dirs` grant that contains the
//! embedded store's directory (`host = "."` beside a configuration whose
//! store is `leases`), or is a symlink to it, is refused at start naming
//! the plugin, the grant and the store; introduced by a reload, it is
//! refused and the running plugin goes on.

use std::path::Path;
use std::time::Duration;

use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// One lease, "demo", on the store `leases` beside the file, and one probe
/// plugin, "probe", granted `host` as `/data`.
fn granting(host: &str) -> String {
    format!(
        "[store]\nkind = \"embedded\"\ndir = \"leases\"\n[defaults]\nlease-duration = \"2s\"\n\
         renew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"demo\"\n\
         [[plugin]]\nname = \"probe\"\npath = {:?}\nlease = \"demo\"\n\
         dirs = [{{ host = {host:?}, guest = \"/data\" }}]\n",
        guest("probe_pollable.wasm").display().to_string()
    )
}

/// Starts a host on `cfg` that must refuse to start; returns what it wrote.
fn refused_at_start(cfg: &Path) -> String {
    let mut h = Host::start("host-a", cfg);
    let status = h.wait_exit(SECS(60));
    let out = h.output();
    assert!(!status.success(), "started:\n{out}");
    out
}

#[test]
fn a_grant_over_the_store_is_refused_at_start_and_at_reload_and_through_a_symlink() {
    let s = Scratch::new();
    let store = s.store();
    // (1) `host = "."`: the folder of the file, which holds the store.
    let cfg = s.write("baton.toml", &granting("."));
    let out = refused_at_start(&cfg);
    let line = out
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{out}"));
    eprintln!("refused at start: {line}");
    assert!(line.contains("plugin \"probe\": field `dirs`"), "{line}");
    assert!(line.contains("guest = \"/data\""), "{line}");
    assert!(
        line.contains(&format!(
            "contains the embedded store's directory {}",
            store.display()
        )),
        "{line}"
    );
    assert!(line.contains("stops every host from leading"), "{line}");
    assert!(
        !lease_dir(&store, "demo").exists(),
        "the lease was never contended for"
    );

    // (3) A symlink to the store.
    let data = s.dir.path().join("data");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(&store, data.join("store")).unwrap();
    s.write("baton.toml", &granting("data/store"));
    let out = refused_at_start(&cfg);
    let line = out.lines().find(|l| l.starts_with("error: ")).unwrap_or(&out);
    eprintln!("refused through a symlink: {line}");
    assert!(line.contains("plugin \"probe\""), "{line}");
    assert!(line.contains("(resolved: "), "{line}");
    assert!(line.contains("is the embedded store's directory"), "{line}");
    assert!(
        !lease_dir(&store, "demo").exists(),
        "the lease was never contended for"
    );

    // (2) A folder of its own runs; the same grant over "." by a reload is
    // refused and the running plugin goes on.
    s.write("baton.toml", &granting("data"));
    let mut h = Host::start("host-a", &cfg);
    h.wait_for(SECS(60), "guest start", |e| e.guest_line("probe", "probe start"));
    s.write("baton.toml", &granting("."));
    h.signal(libc::SIGHUP);
    let refusal = h.wait_for(SECS(30), "reload refused", |e| {
        e.message().starts_with("reload refused")
    });
    let err = refusal.str("error").unwrap();
    eprintln!("reload refused: {err}");
    assert!(err.contains("baton.toml"), "{err}");
    assert!(err.contains("plugin \"probe\": field `dirs`"), "{err}");
    assert!(err.contains("guest = \"/data\""), "{err}");
    assert!(
        err.contains(&format!(
            "contains the embedded store's directory {}",
            store.display()
        )),
        "{err}"
    );
    h.wait_for(SECS(15), "a tick after the refusal", |e| {
        e.guest_line("probe", "probe tick") && e.at > refusal.at
    });
    assert_eq!(led(&h), ["demo".to_owned()].into());
    assert_eq!(h.all(|e| e.is("leader task started", Some("probe"))).len(), 1);
    assert_eq!(h.all(|e| e.message() == "reload applied").len(), 0);
    h.sigterm();
    assert!(h.wait_exit(SECS(30)).success());
}

/// Ctrl-C at start-up: SIGINT while a large component compiles with an
/// empty cache ends the process without waiting for the compile (which
/// never says it is done), and no lease is taken. How soon it exits is a
/// figure; the bound only catches a process that waits for a compile that
/// takes seconds more (an 18 MB Python component: `tests/polyglot`).
#[test]
fn sigint_while_compiling_at_start_ends_the_process_at_once() {
    let s = Scratch::new();
    let dir = std::env::var_os("BATON_POLYGLOT_DIR").map(std::path::PathBuf::from);
    let big = dir
        .map(|d| d.join("python_pollable_ticker.wasm"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| guest("probe_pollable.wasm"));
    let cfg = s.write(
        "baton.toml",
        &format!(
            "[store]\nkind = \"embedded\"\ndir = \"leases\"\n[[lease]]\nname = \"demo\"\n[[plugin]]\n\
             name = \"big\"\npath = {:?}\nlease = \"demo\"\n",
            big.display().to_string()
        ),
    );
    let cache = s.dir.path().join("cache");
    let mut h = Host::start_with("host-a", &cfg, &cache);
    h.wait_for(SECS(30), "compiling", |e| e.message() == "compiling plugin");
    std::thread::sleep(Duration::from_millis(500));
    let sent = std::time::Instant::now();
    let sent_at = h.signal(libc::SIGINT);
    h.wait_exit(SECS(120));
    let took = sent.elapsed();
    eprintln!("{}: exited {took:?} after SIGINT", big.display());
    // The compile was abandoned: it did not finish (and say so) after the
    // SIGINT, nor was the plugin loaded. (A small component that compiled
    // before the SIGINT, where the big one is missing, proves less.)
    let compiled = h.all(|e| e.message() == "plugin compiled");
    assert!(
        compiled.iter().all(|e| e.at < sent_at),
        "the compile went on after SIGINT: {:?}",
        compiled.iter().map(|e| &e.json).collect::<Vec<_>>()
    );
    if compiled.is_empty() {
        assert!(
            h.all(|e| e.message() == "plugin loaded").is_empty(),
            "a plugin was loaded after SIGINT"
        );
    }
    assert!(took < SECS(10), "took {took:?}");
    assert!(!lease_dir(&s.store(), "demo").exists(), "no lease was taken");
    assert!(h.all(|e| e.message() == "lease status changed").is_empty());
}
