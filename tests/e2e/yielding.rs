//! `baton yield`, the scenario both stores run: two hosts on one lease
//! with a cooperative guest; a yield to the follower says it does not lead,
//! one for a lease it does not have says so; a yield found through the
//! configuration file reaches the leader, whose guest stops cooperatively
//! before it releases the lease, and the follower takes it through that
//! release (not by waiting for it to expire); the yielder does not take
//! the lease back before the yield's time, even when it is released
//! meanwhile, and leads again once it is up (not after another yield).
//! How fast the hand-over is, is a figure (printed; `benches/handover.rs`
//! measures hand-overs), not a verdict.

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
/// host under a name. Returns the hand-over time in milliseconds (a figure): from the yield
/// command to the other host's guest start.
pub fn two_hosts_yield(cfg: &Path, start: &dyn Fn(&str) -> Host, store: &str) -> f64 {
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
    // When the yielder contends again, as it computed it.
    let until = said
        .split("does not contend for it until ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        .unwrap_or_else(|| panic!("no time to contend again in: {said}"));
    let started = b.wait_for(Duration::from_secs(30), "b's guest start", is_start);
    let handover = ms_between(yielded, started.at);
    // Taken through the release (b saw the lease free before it led), and
    // a's tasks stopped before it.
    let from_release = assert_handed_over_by_release(&a, &b, "demo", yielded);
    let b_leads = b.wait_for(Duration::from_secs(10), "b leading", leading);
    println!(
        "{store}: yield hand-over: {handover:.1} ms from the command to the other host's guest start \
         ({from_release:.1} ms from the release to its lead)"
    );
    assert_eq!(started.guest_term(), Some(term + 1));
    assert_eq!(b_leads.u64("term"), Some(term + 1));
    let released = a.wait_for(Duration::from_secs(10), "a's release", |e| {
        e.message() == "released the lease"
    });
    let stopped = a.wait_for(Duration::from_secs(10), "a's guest stop", |e| {
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
    let back = a.wait_for(Duration::from_secs(60), "a leading again", |e| {
        leading(e) && e.at > yielded
    });
    let after = ms_between(yielded, back.at);
    println!(
        "{store}: the yielder led again {after:.0} ms after the yield, {:.0} ms after the time it said \
         (--for {}ms; the lease was free from {:.0} ms)",
        ms_between(until, back.at),
        yield_for.as_millis(),
        (yield_for / 4).as_millis()
    );
    assert!(
        after >= yield_for.as_millis() as f64,
        "took it back after {after:.0} ms"
    );
    // Not before the time it said (given to the millisecond).
    assert!(
        back.at + Duration::from_millis(1) >= until,
        "took it back {:.0} ms before the time it said",
        ms_between(back.at, until)
    );
    // It contends again once the yield is up, not a whole yield later.
    assert!(
        after < (yield_for * 2).as_millis() as f64,
        "contended again only after {after:.0} ms (--for {}ms)",
        yield_for.as_millis()
    );
    a.wait_for(Duration::from_secs(30), "a's guest start again", |e| {
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
