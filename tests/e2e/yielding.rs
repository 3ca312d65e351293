//! `baton yield`, the scenario both stores run: two hosts on one lease
//! with a cooperative guest; a yield to the follower says it does not lead,
//! one for a lease it does not have says so; a yield found through the
//! configuration file reaches the leader, whose guest stops cooperatively,
//! and the follower takes over within milliseconds; the yielder does not
//! take the lease back before the yield's time, even when it is released
//! meanwhile, and leads again right after.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, SystemTime};

use crate::support::*;

fn is_start(e: &Event) -> bool {
    e.guest_line("probe", "probe start")
}

fn leading(e: &Event) -> bool {
    e.message() == "lease status changed"
        && e.str("lease") == Some("demo")
        && e.str("role") == Some("leading")
}

/// Runs `baton yield` with `args`.
pub fn yield_cmd(args: &[&std::ffi::OsStr]) -> Output {
    baton().arg("yield").args(args).output().expect("run baton yield")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The default control socket of `identity` for the configuration `cfg`.
pub fn socket_of(cfg: &Path, identity: &str) -> PathBuf {
    cfg.parent()
        .unwrap()
        .join(".baton/control")
        .join(format!("{identity}.sock"))
}

/// The scenario (see the module documentation) on the configuration `cfg`
/// (one lease "demo" with one cooperative probe "probe"); `start` starts a
/// host under a name. Returns the hand-over time in milliseconds: from
/// the yield command to the other host's guest start.
pub fn two_hosts_yield(cfg: &Path, start: &dyn Fn(&str) -> Host, store: &str, bound_ms: f64) -> f64 {
    let mut a = start("host-a");
    a.wait_for(Duration::from_secs(60), "a's guest start", is_start);
    let mut b = start("host-b");
    b.wait_for(Duration::from_secs(60), "b following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    let (sock_a, sock_b) = (socket_of(cfg, "host-a"), socket_of(cfg, "host-b"));
    for s in [&sock_a, &sock_b] {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let meta = std::fs::symlink_metadata(s).unwrap_or_else(|e| panic!("{}: {e}", s.display()));
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", s.display());
    }
    let term = a
        .wait_for(Duration::from_secs(5), "a leading", leading)
        .u64("term")
        .unwrap();

    // A yield to the follower, and for a lease it does not have.
    let out = yield_cmd(&["demo".as_ref(), "--socket".as_ref(), sock_b.as_os_str()]);
    assert!(!out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "host host-b does not lead demo; it is held by host-a, term {term}"
        )),
        "{err}"
    );
    let out = yield_cmd(&["nope".as_ref(), "--socket".as_ref(), sock_b.as_os_str()]);
    assert!(!out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("no such lease on host host-b"), "{err}");

    // The yield, found through the configuration: the leader is host-a.
    let yield_for = Duration::from_secs(5);
    let yielded = SystemTime::now();
    let out = yield_cmd(&[
        "demo".as_ref(),
        "--for".as_ref(),
        "5s".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
    ]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains("host host-a yielded demo"), "{said}");
    assert!(
        said.contains(&format!("host-b took it in term {}", term + 1)),
        "{said}"
    );
    println!("{store}: baton yield said: {}", said.trim());
    let started = b.wait_for(Duration::from_secs(5), "b's guest start", is_start);
    let handover = ms_between(yielded, started.at);
    let released = a.wait_for(Duration::from_secs(1), "a's release", |e| {
        e.message() == "released the lease"
    });
    let b_leads = b.wait_for(Duration::from_secs(1), "b leading", leading);
    println!(
        "{store}: yield hand-over: {handover:.1} ms from the command to the other host's guest start \
         ({:.1} ms from the release to its lead)",
        ms_between(released.at, b_leads.at)
    );
    assert_eq!(started.guest_term(), Some(term + 1));
    assert!(handover < bound_ms, "the hand-over took {handover:.1} ms");
    let stopped = a.wait_for(Duration::from_secs(1), "a's guest stop", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    assert_eq!(stopped.str("how"), Some("cooperative"));
    assert!(stopped.at <= released.at, "stopped before the release");

    // host-a stands by: a yield to it says so.
    let out = yield_cmd(&["demo".as_ref(), "--socket".as_ref(), sock_a.as_os_str()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains(&format!(
            "host host-a does not lead demo; it is held by host-b, term {}",
            term + 1
        )) && err.contains("this host yielded it and contends again at"),
        "{err}"
    );

    // host-b stops (and releases) a quarter into the yield: host-a still
    // does not take the lease until the yield's time is up, then does.
    std::thread::sleep(yield_for / 4);
    b.sigterm();
    assert!(b.wait_exit(Duration::from_secs(10)).success());
    let back = a.wait_for(yield_for * 2, "a leading again", |e| leading(e) && e.at > yielded);
    let after = ms_between(yielded, back.at);
    println!(
        "{store}: the yielder led again {after:.0} ms after the yield (--for {}ms; the lease was free from {:.0} ms)",
        yield_for.as_millis(),
        (yield_for / 4).as_millis()
    );
    assert!(
        after >= yield_for.as_millis() as f64,
        "took it back after {after:.0} ms"
    );
    assert!(
        after < (yield_for.as_millis() + 1500) as f64,
        "contended again only after {after:.0} ms"
    );
    a.wait_for(Duration::from_secs(5), "a's guest start again", |e| {
        is_start(e) && e.at > back.at - Duration::from_millis(50)
    });
    a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(10)).success());
    assert!(
        !sock_a.exists() && !sock_b.exists(),
        "the sockets are removed on exit"
    );
    handover
}
