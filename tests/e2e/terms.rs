//! The term's promise, tried the way a user would: nothing a guest does
//! reaches the outside after its term's force-stop time, and no stall of
//! the host (a paused process, a stalled store, a stderr nobody reads, a
//! guest that floods its output) stretches a term or starves the election.

use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, SystemTime};

use crate::support::*;
use crate::witness::*;

const STOPPED: &str = "leader task stopped";
const SECS: fn(u64) -> Duration = Duration::from_secs;
const RENEW_DEADLINE: Duration = Duration::from_secs(1);

#[test]
fn a_leader_paused_past_its_lease_never_appends_after_its_terms_force_stop() {
    let s = Scratch::new();
    let data = records_dir(&s);
    let mut text = config(&s.store(), &[]);
    text.push_str(&appender_plugins("demo", &data));
    let cfg = s.write("appenders.toml", &text);
    let mut hosts = start_hosts(&cfg, &["h1", "h2", "h3"], &[]);
    const PAUSES: usize = 20;
    {
        let _load = CpuLoad::start(2);
        // Each leader paused only once its guests wrote in its term.
        let records = data.join("records");
        pause_leaders_when(&hosts, PAUSES, LEASE_DURATION + Duration::from_millis(500), |t| {
            recorded(&records, t)
        });
        // Let the last resumed leader settle.
        std::thread::sleep(SECS(1));
    }
    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        assert!(h.wait_exit(SECS(10)).success(), "{}", h.name);
    }
    let seen = check_records(&data.join("records"), &hosts);
    println!(
        "{PAUSES} pauses of the leader past its lease, CPUs busy: {} records in {} terms, all stamped before \
         their term's force-stop, none out of order",
        seen.records,
        seen.terms.len(),
    );
    assert!(
        seen.terms.len() >= PAUSES,
        "only {} terms wrote: {:?}",
        seen.terms.len(),
        seen.terms
    );
}

#[test]
fn a_host_whose_stderr_is_not_read_keeps_its_lease_and_stops_its_guests_on_time() {
    let s = Scratch::new();
    let mut text = config(
        &s.store(),
        &[
            probe("chatty-1", "pollable", "cooperative"),
            probe("chatty-2", "future", "cooperative"),
            probe("chatty-3", "pollable", "cooperative"),
            probe("chatty-4", "future", "cooperative"),
            probe("stubborn", "pollable", "block"),
        ],
    );
    // No pause between ticks: each chatty guest prints as fast as it can
    // (tens of thousands of lines a second; its output limit passes
    // thousands, far more than the log queue holds).
    text = text.replace(
        "env = { PROBE_MODE = \"cooperative\" }",
        "env = { PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"0\" }",
    );
    let cfg = s.write("baton.toml", &text);
    // Its metrics say what it did while nobody read its log.
    let mut a = Host::start_opts(
        "host-a",
        &cfg,
        Opts {
            args: &["--admin-address".as_ref(), "127.0.0.1:0".as_ref()],
            ..Opts::default()
        },
    );
    let mut term = 0;
    for p in ["chatty-1", "chatty-2", "chatty-3", "chatty-4", "stubborn"] {
        let started = a.wait_for(SECS(60), "guest start", |e| e.guest_line(p, "probe start"));
        term = started.guest_term().unwrap();
    }
    a.admin_address();
    let b = Host::start("host-b", &cfg);
    b.wait_for(SECS(60), "b following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });

    // Nobody reads a's stderr for six seconds: the pipe fills at once.
    let before = HostCounts::read(std::slice::from_ref(&a));
    a.hold_stderr(true);
    let renew_time = || -> Option<String> {
        let json = read_lease(&s.store(), "demo")?;
        json["record"]["renewTime"].as_str().map(str::to_owned)
    };
    // The renewals as the test saw them, and how late the test's own 20 ms
    // naps woke (a machine that stalls every process shows there too).
    let started = std::time::Instant::now();
    let mut last = (renew_time(), std::time::Instant::now());
    let mut gaps: Vec<(u128, u128)> = Vec::new(); // (at ms, gap ms)
    let mut overslept = Duration::ZERO;
    while started.elapsed() < SECS(6) {
        let nap = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        overslept = overslept.max(nap.elapsed().saturating_sub(Duration::from_millis(20)));
        let now = renew_time();
        if now.is_some() && now != last.0 {
            gaps.push((started.elapsed().as_millis(), last.1.elapsed().as_millis()));
            last = (now, std::time::Instant::now());
        }
    }
    gaps.push((started.elapsed().as_millis(), last.1.elapsed().as_millis()));
    let longest = Duration::from_millis(gaps.iter().map(|g| g.1).max().unwrap_or(0) as u64);
    println!(
        "stderr not read for 6 s: {} renewals seen, longest time between renewals {} ms \
         (the test's own naps woke up to {} ms late)",
        gaps.len() - 1,
        longest.as_millis(),
        overslept.as_millis()
    );
    // The lease was kept throughout, as a says and as the record shows: a
    // renewal stalled past the renew deadline would have cost a its lead
    // (a loss a counts), and one stalled past the lease duration would
    // have let b take over (in a new term). How far apart the renewals
    // came is a figure, printed above: a busy machine stretches it.
    let did = HostCounts::read(std::slice::from_ref(&a)).since(&before);
    let slow: Vec<_> = gaps.iter().filter(|g| g.1 > 400).collect();
    println!(
        "stderr not read: a renewed {} times, lost the lead {} times",
        did.renewals, did.lost
    );
    assert_eq!(
        (did.lost, did.gained),
        (0, 0),
        "a's lead changed while its stderr was full; renewal gaps over 400 ms (at ms, gap ms): {slow:?}"
    );
    assert!(did.renewals > 0, "a renewed nothing while its stderr was full");
    let record = read_lease(&s.store(), "demo").expect("the lease's record");
    assert_eq!(record["record"]["holder"], "host-a", "{record}");
    assert_eq!(record["record"]["transitions"], term, "{record}");
    let early = b.all(|e| e.guest_line("chatty-1", "probe start"));
    assert!(
        early.is_empty(),
        "b took over from a host whose stderr was full (at {:?}); renewal gaps over 400 ms: {slow:?}",
        early[0].at
    );

    // Still not read: a shuts down, and b takes over through its release
    // (after the forced stop of the guest that ignores the change), not
    // once the lease expired: b's first record of its term is written
    // over a's release. (a's own log is lossy here: nobody reads it.)
    let termed = a.sigterm();
    let taken = b.wait_for(SECS(15), "b takes over", |e| {
        e.guest_line("chatty-1", "probe start")
    });
    let through = taken_over_a_release(&s.store(), "demo", "host-b", term + 1);
    let took = ms_between(termed, taken.at);
    println!("stderr not read: b took over {took:.0} ms after a's SIGTERM");
    a.hold_stderr(false);
    let status = a.wait_exit(SECS(10));
    // a's log is complete only now: the failure messages show its end.
    assert_eq!(taken.guest_term(), Some(term + 1));
    match through {
        Some(through) => {
            through.unwrap_or_else(|e| panic!("{e}; the end of a's log:\n{}", tail(&a.output(), 40)))
        }
        None => println!("stderr not read: the versions before b's take were pruned already; not judged"),
    }
    assert!(
        status.success(),
        "a exited with {status}; the end of its log:\n{}",
        tail(&a.output(), 40)
    );
    // The count is reported before the log is written out at exit.
    a.try_wait_for(SECS(5), &|e| e.message() == "baton stopped");
    a.try_wait_for(SECS(2), &|e| {
        e.message() == "log lines were dropped: standard error did not keep up"
    });
    let dropped: u64 = a
        .all(|e| e.message() == "log lines were dropped: standard error did not keep up")
        .iter()
        .map(|e| e.u64("dropped_lines").unwrap())
        .sum();
    println!("stderr not read: {dropped} log lines were dropped and reported");
    assert!(
        dropped > 0,
        "no drop was reported; the log must have been lossy; the end of a's log:\n{}",
        tail(&a.output(), 40)
    );
}

#[test]
fn a_terminal_nobody_reads_stalls_neither_the_start_up_and_its_progress_nor_the_guests() {
    // The host's standard error is a terminal (so it draws the start-up's
    // progress) whose buffer is full before the host starts, and which is
    // never read: its first log line blocks the log's writer thread for
    // good. Nothing else may wait for it: the compilations, the progress
    // they report, the election, the guests (which flood the log), the exit.
    let s = Scratch::new();
    let port = free_port();
    let text = config(
        &s.store(),
        &[
            probe("chatty-1", "pollable", "cooperative"),
            probe("chatty-2", "future", "cooperative"),
        ],
    )
    .replace(
        "env = { PROBE_MODE = \"cooperative\" }",
        "env = { PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"0\" }",
    );
    let cfg = s.write(
        "baton.toml",
        &format!("admin-address = \"127.0.0.1:{port}\"\n{text}"),
    );
    // An empty compiled-code cache: both components are compiled, with
    // the progress display's spinners.
    let cache = tempfile::tempdir().unwrap();
    let pty = Pty::open(120, 40);
    let filled = pty.fill();
    let started = std::time::Instant::now();
    let mut child = pty
        .baton()
        .args(["--log-format", "text", "run", "--config"])
        .arg(&cfg)
        .args(["--identity", "host-a", "--cache-dir"])
        .arg(cache.path())
        .env("BATON_LOG", "info")
        .spawn()
        .unwrap();
    let killer = KillOnDrop(child.id());
    let addr = format!("127.0.0.1:{port}");
    let get = |path: &str| http_get(&addr, path).ok();
    let until = |what: &str, timeout: Duration, ok: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + timeout;
        while !ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: not within {timeout:?} (the terminal holds {filled} bytes nobody reads)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Ready: every plugin compiled, and the store answered.
    until("ready", SECS(60), &|| {
        get("/readyz").is_some_and(|(status, _)| status == 200)
    });
    let ready = started.elapsed();
    let scrape = || get("/metrics").map(|(_, body)| body).unwrap_or_default();
    until("both guests running", SECS(10), &|| {
        let m = scrape();
        ["chatty-1", "chatty-2"].iter().all(|p| {
            metric(
                &m,
                &format!("baton_plugin_task_state{{plugin=\"{p}\",state=\"running\"}}"),
            ) == Some(1.0)
        })
    });
    // Their flood is dropped, not waited for, and the lease is renewed on
    // time meanwhile.
    until("log lines dropped", SECS(10), &|| {
        metric(&scrape(), "baton_log_dropped_lines_total").is_some_and(|n| n > 0.0)
    });
    let renew_time =
        || read_lease(&s.store(), "demo").and_then(|j| j["record"]["renewTime"].as_str().map(str::to_owned));
    let term = read_lease(&s.store(), "demo").unwrap()["record"]["transitions"].clone();
    let renewals = |m: &str| metric(m, "baton_lease_renewal_seconds_count{lease=\"demo\"}").unwrap_or(0.0);
    let lost = |m: &str| {
        metric(
            m,
            "baton_lease_leadership_changes_total{lease=\"demo\",change=\"lost\"}",
        )
        .unwrap_or(0.0)
    };
    let before = scrape();
    let watched = std::time::Instant::now();
    let (mut last, mut since, mut longest) = (renew_time(), std::time::Instant::now(), Duration::ZERO);
    while watched.elapsed() < SECS(3) {
        std::thread::sleep(Duration::from_millis(20));
        let now = renew_time();
        if now != last {
            longest = longest.max(since.elapsed());
            (last, since) = (now, std::time::Instant::now());
        }
    }
    longest = longest.max(since.elapsed());
    // The lease was kept meanwhile: renewed, never lost (a renewal stalled
    // past the renew deadline loses the lead), the same holder in the
    // same term. How far apart the renewals came is a figure, printed.
    let after = scrape();
    assert!(
        renewals(&after) > renewals(&before),
        "no renewal behind a terminal nobody reads:\n{after}"
    );
    assert_eq!(
        lost(&after),
        0.0,
        "the lead was lost behind a terminal nobody reads (renewals at most {longest:?} apart)"
    );
    let lease = read_lease(&s.store(), "demo").unwrap();
    assert_eq!(lease["record"]["holder"], "host-a", "{lease}");
    assert_eq!(lease["record"]["transitions"], term, "{lease}");
    // SIGTERM: it exits on time, the terminal still not read.
    // SAFETY: kill(2) of the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let stopping = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopping.elapsed() < SECS(10),
            "no exit within 10 s of SIGTERM behind a terminal nobody reads"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(killer);
    println!(
        "terminal not read ({filled} bytes waiting): ready {} ms after start, renewals at most {} ms \
         apart, exit {} ms after SIGTERM",
        ready.as_millis(),
        longest.as_millis(),
        stopping.elapsed().as_millis()
    );
    assert!(status.success(), "exited with {status}");
}

/// Kills the process `pid` if dropped by a failing test (a failed
/// assertion must not leave it running).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) of a child this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_flooding_guest_is_held_to_its_output_rate_and_its_neighbour_keeps_time() {
    let s = Scratch::new();
    let mut text = config(
        &s.store(),
        // The flood last: the `output-rate` line below is its.
        &[
            probe("ticker", "future", "cooperative"),
            probe("flood", "pollable", "flood"),
        ],
    );
    text = text.replace(
        "env = { PROBE_MODE = \"cooperative\" }",
        "env = { PROBE_MODE = \"cooperative\", PROBE_TICK_MS = \"100\" }",
    );
    text.push_str("output-rate = \"32 KiB\"\n");
    let cfg = s.write("baton.toml", &text);
    let h = Host::start("host", &cfg);
    h.wait_for(SECS(60), "ticker start", |e| {
        e.guest_line("ticker", "probe start")
    });
    let from = h
        .wait_for(SECS(60), "flood start", |e| e.guest_line("flood", "probe start"))
        .at;
    std::thread::sleep(SECS(8));
    let to = SystemTime::now();

    let window = |e: &Event| e.at >= from && e.at <= to;
    let flooded: usize = h
        .all(|e| window(e) && e.str("target") == Some("guest") && e.str("plugin") == Some("flood"))
        .iter()
        .map(|e| e.message().len() + 1)
        .sum();
    let secs = ms_between(from, to) / 1e3;
    let allowed = 32.0 * 1024.0 * (secs + 1.0);
    println!(
        "flooding guest: {flooded} bytes of its output logged in {secs:.1} s (limit {allowed:.0} at 32 KiB/s)"
    );
    assert!(
        (flooded as f64) <= allowed,
        "{flooded} bytes logged, limit {allowed:.0}"
    );
    let reports = h.all(|e| e.message() == "guest output over the plugin's limits was dropped");
    assert!(!reports.is_empty(), "the drops were not reported");
    let cut: u64 = reports.iter().filter_map(|e| e.u64("cut_bytes")).sum();
    assert!(cut > 1 << 20, "the 1 MiB lines were cut: {cut} bytes");

    let ticks: Vec<SystemTime> = h
        .all(|e| window(e) && e.guest_line("ticker", "probe tick"))
        .iter()
        .map(|e| e.at)
        .collect();
    let mut gaps: Vec<f64> = ticks.windows(2).map(|w| ms_between(w[0], w[1])).collect();
    gaps.sort_by(f64::total_cmp);
    // The neighbour kept ticking: a flood that held the output path or the
    // neighbour's timer would stop its ticks for as long as it lasts
    // (seconds, the whole window). How evenly it ticked is a figure, not
    // a verdict (a busy machine stretches it): `benches/neighbours.rs`
    // measures it beside this guest (`prints-long-lines`).
    assert!(gaps.len() >= 10, "{} ticks in {secs:.1} s", ticks.len());
    let p99 = gaps[(gaps.len() * 99).div_ceil(100) - 1];
    let longest = gaps[gaps.len() - 1];
    println!(
        "flooding guest: the neighbour ticked {} times, p99 interval {p99:.1} ms, longest {longest:.1} ms (nominal 100 ms)",
        ticks.len()
    );
    assert!(
        longest < 2000.0,
        "the neighbour waited {longest:.0} ms for a tick beside the flood"
    );
}

#[test]
fn a_stalled_lease_store_stops_the_guests_by_the_deadline_plus_grace() {
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(
            &s.store(),
            &[
                probe("busy", "pollable", "busy"),
                probe("block", "future", "block"),
            ],
        ),
    );
    let h = Host::start("host", &cfg);
    for p in ["busy", "block"] {
        h.wait_for(SECS(60), "guest start", |e| e.guest_line(p, "probe start"));
    }
    // Stall the store: a named pipe as its newest version. Every read
    // hangs in opening it, as on a file system that stopped answering;
    // renewals time out.
    let newest = lease_file(&s.store(), "demo").unwrap();
    let counter: u64 = newest.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    let pipe = lease_dir(&s.store(), "demo").join(format!("{:020}.json", counter + 1000));
    let c_pipe = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c_pipe.as_ptr(), 0o600) }, 0);
    let stalled = SystemTime::now();
    for p in ["busy", "block"] {
        let e = h.wait_for(SECS(15), "forced stop", |e| e.is(STOPPED, Some(p)));
        // By force, after the grace, at the force-stop time the host
        // computed from its last confirmed renewal (which no renewal after
        // the stall moved): load cannot move that time. How late after it
        // the stop was logged is a figure (no effect of the guest passes
        // the fence after it: `witness.rs` and `fsops.rs` prove that).
        assert_stopped_by_force(&h, &e, GRACE);
        let bound = (RENEW_DEADLINE + GRACE).as_secs_f64() * 1e3;
        let force = ms_between(stalled, force_stop_at(&e));
        assert!(
            force <= bound,
            "{p}: force-stop time {force:.0} ms after the stall (bound {bound} ms)"
        );
        println!(
            "stalled store: {p} stopped {:.0} ms after the stall, {:+.1} ms from its force-stop time",
            ms_between(stalled, e.at),
            ms_between(force_stop_at(&e), e.at)
        );
    }
    // The store comes back: the host leads again, in a new term. (The
    // readers waiting in the pipe are let go once it is gone.)
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&pipe)
        .unwrap();
    std::fs::remove_file(&pipe).unwrap();
    drop(writer);
    h.wait_for(SECS(15), "leading again", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("leading") && e.u64("term") == Some(2)
    });
}

#[test]
fn traps_are_reported_in_one_line_of_plain_words() {
    let s = Scratch::new();
    let mut text = config(
        &s.store(),
        &[
            probe("panics", "pollable", "trap"),
            probe("overflows", "pollable", "recurse"),
            probe("grows", "pollable", "oom"),
        ],
    );
    text.push_str("memory-limit = \"16 MiB\"\n");
    let cfg = s.write("baton.toml", &text);
    let h = Host::start("host", &cfg);
    for (plugin, reason) in [
        ("panics", "the guest panicked: probe trap on purpose"),
        ("overflows", "stack overflow"),
        ("grows", "memory limit of 16.0 MiB reached"),
    ] {
        let e = h.wait_for(SECS(60), "trap", |e| e.is("leader task trapped", Some(plugin)));
        let error = e.str("error").unwrap();
        println!("{plugin}: {error}");
        assert!(error.starts_with(reason), "{plugin}: {error:?}");
        assert!(!error.contains('\n'), "{plugin}: more than one line: {error:?}");
    }
}
