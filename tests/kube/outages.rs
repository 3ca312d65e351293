//! Connections that go silent and API server outages: a leader stops by
//! its deadline, a follower notices, one leader resumes.

use super::*;

/// A proxy to the API server that the test can cut, and a kubeconfig
/// (written into `s`) that reaches the server through it.
pub fn proxied_kubeconfig(env: &KubeEnv, s: &Scratch) -> (blackhole::BlackHole, std::path::PathBuf) {
    let (admin_config, server) = env.admin_server();
    let upstream: std::net::SocketAddr = server.trim_start_matches("https://").parse().unwrap();
    let hole = blackhole::BlackHole::start(upstream);
    let proxied = s.write(
        "proxied.kubeconfig",
        &admin_config.replace(&server, &format!("https://127.0.0.1:{}", hole.port)),
    );
    (hole, proxied)
}

#[test]
fn a_leader_whose_connection_goes_silent_stops_by_its_deadline_and_another_takes_over_in_time() {
    let t = KubeTest::new("leader-hole");
    // a, the leader, reaches the API server through a proxy the test cuts.
    let (hole, proxied) = proxied_kubeconfig(&t.env, &t.scratch);
    let plugins = [
        probe("probe", "pollable", "cooperative"),
        probe("stubborn", "future", "block"),
    ];
    let through = t.scratch.write(
        "a.toml",
        &kube_config(&t.ns.name, Some(&proxied), "demo", &plugins),
    );
    let direct = t.scratch.write("b.toml", &t.config("demo", &plugins));
    let a = host_with_admin("host-a", &through);
    a.wait_for(SECS(60), "a leads", is_start);
    let b = Host::start("host-b", &direct);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(2));

    // Cut a's path without closing it: its renewals hang.
    hole.cut(true);
    let cut_at = SystemTime::now();
    let down = a.wait_for(SECS(30), "a steps down", |e| {
        e.at >= cut_at && e.message() == "stepping down"
    });
    let down_ms = ms_between(cut_at, down.at);
    // Each hung renewal was given up after the request timeout (500 ms),
    // or at the renew deadline if that came first.
    let timeouts =
        a.all(|e| e.at >= cut_at && e.at <= down.at && e.message().starts_with("renewal timed out"));
    let mut gaps: Vec<f64> = Vec::new();
    let mut last = cut_at;
    for e in &timeouts {
        gaps.push(ms_between(last, e.at));
        last = e.at;
    }
    // The time left until the renew deadline when each was given up.
    let remaining: Vec<f64> = timeouts
        .iter()
        .map(|e| {
            let r = e.str("remaining").expect("remaining");
            match r.strip_suffix("ms") {
                Some(ms) => ms.parse::<f64>().unwrap(),
                None => r.trim_end_matches('s').parse::<f64>().unwrap() * 1e3,
            }
        })
        .collect();
    // The force-stop time the leader computed when it stepped down: from
    // its last confirmed renewal, which began before the cut, so at most
    // the renew deadline and the grace after the cut however busy the
    // machine is (its clock's reading in the log: a few ms of leeway).
    let deadline = witness::force_stop_at(&down);
    let deadline_ms = ms_between(cut_at, deadline);
    println!(
        "a leader cut off: {} renewals timed out, {:?} ms apart, {:?} ms before the renew deadline; \
         stepped down {down_ms:.0} ms after the cut, force-stop time {deadline_ms:.0} ms after it",
        timeouts.len(),
        gaps.iter().map(|g| g.round() as i64).collect::<Vec<_>>(),
        remaining.iter().map(|r| r.round() as i64).collect::<Vec<_>>()
    );
    // (The last attempt may instead end at the renew deadline, when the
    // time left in the term is shorter than the request timeout.)
    assert!(!timeouts.is_empty(), "no renewal timed out: {timeouts:?}");
    // A renewal that hung until the renew deadline would be given up with
    // no time left: one given up earlier was bounded by the request
    // timeout.
    assert!(
        remaining.iter().any(|&r| r > 0.0),
        "every hung renewal lasted until the renew deadline: {timeouts:?}"
    );
    let counted = metric_sum(
        &a.scrape(),
        "baton_lease_store_errors_total",
        &["lease=\"demo\"", "kind=\"timeout\""],
    );
    assert!(counted >= 1.0, "a counted no timed-out request: {counted}");
    assert!(
        deadline_ms <= (RD + GRACE).as_secs_f64() * 1e3 + 20.0,
        "the force-stop time is {deadline_ms:.0} ms after the cut, past the renew deadline and the grace \
         ({:?}): {:?}",
        RD + GRACE,
        down.json
    );
    let mut force_stop = cut_at;
    let mut stops = Vec::new();
    for p in ["probe", "stubborn"] {
        let e = a.wait_for(SECS(30), "a's guest stopped", |e| {
            e.at >= cut_at && e.is(STOPPED, Some(p))
        });
        force_stop = force_stop.max(witness::force_stop_at(&e));
        stops.push(e);
    }
    // The stubborn guest ignored the change: stopped by force, after the
    // grace, at the force-stop time (how late it was logged is the
    // machine's: the fence keeps its effects in).
    assert_stopped_by_force(&a, &stops[1], GRACE);
    // b takes over once a's lease has expired (about LD + RP after the
    // cut, plus its watch's news and its guests' start), never before a's
    // force-stop time, and after a's guests stopped; the bound on how long
    // it took catches only a lease left wedged.
    let taken = b.wait_for(SECS(30), "b takes over", is_start);
    let took = ms_between(cut_at, taken.at);
    let bound = (LD + RP + SECS(3)).as_secs_f64() * 1e3;
    println!(
        "b took over {took:.0} ms after the cut (bound {bound:.0} ms), {:.0} ms after a's last force-stop time",
        ms_between(force_stop, taken.at)
    );
    assert!(taken.at >= force_stop, "b started before a's force-stop time");
    for stop in &stops {
        assert!(
            stop.at <= taken.at,
            "a's guest stopped after b's started: {:?}, {:?}",
            stop.json,
            taken.json
        );
    }
    assert!(
        took <= bound,
        "b took over {took:.0} ms after the cut (bound {bound:.0} ms)"
    );
    hole.cut(false);
}

#[test]
fn a_follower_whose_connection_goes_silent_notices_within_a_lease_duration() {
    let t = KubeTest::new("black-hole");
    // b reaches the API server through a proxy the test can cut.
    let (hole, proxied) = proxied_kubeconfig(&t.env, &t.scratch);
    let plugins = [probe("probe", "pollable", "cooperative")];
    let direct = t.scratch.write("a.toml", &t.config("demo", &plugins));
    let through = t.scratch.write(
        "b.toml",
        &kube_config(&t.ns.name, Some(&proxied), "demo", &plugins),
    );
    let a = Host::start("host-a", &direct);
    a.wait_for(SECS(60), "a leads", is_start);
    let b = Host::start("host-b", &through);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(1));

    // Cut b's path without closing it: its watch goes silent.
    hole.cut(true);
    let cut_at = SystemTime::now();
    let noticed = b.wait_for(SECS(30), "b notices its silent watch", |e| {
        e.at >= cut_at && e.message().starts_with("the lease watch broke")
    });
    let took = ms_between(cut_at, noticed.at);
    // The watch asks the server to end it after one lease duration (x 1 to
    // 1.25); silence past that plus request-timeout and a second ends it.
    // Twice that: the bound catches a watch that never notices, not a slow
    // machine.
    let expected = (LD.as_secs_f64() * 1.25 + 0.5 + 1.0) * 1e3 + 500.0;
    let bound = 2.0 * expected;
    println!(
        "a follower's watch went silent: it noticed {took:.0} ms later (expected within {expected:.0} ms, \
         bound {bound:.0} ms)"
    );
    assert!(
        took <= bound,
        "noticed {took:.0} ms after the cut (bound {bound:.0} ms)"
    );
    assert!(b.all(is_start).is_empty(), "b ran a guest while cut off");

    // Restored: b follows again, and takes over promptly when a leaves.
    hole.cut(false);
    let restored = SystemTime::now();
    b.wait_for(SECS(30), "b watches again", |e| {
        e.at >= restored && e.message() == "watching the lease again"
    });
    let termed = a.sigterm();
    let taken = b.wait_for(SECS(30), "b takes over", is_start);
    println!(
        "after the path was restored: b took over {:.0} ms after a's SIGTERM",
        ms_between(termed, taken.at)
    );
}

#[test]
fn api_server_outage_stops_the_leader_in_time_and_one_leader_resumes() {
    let t = KubeTest::new("outage");
    // A guest that ignores the change: it must be stopped by force.
    let cfg = t.scratch.write(
        "baton.toml",
        &t.config("demo", &[probe("probe", "pollable", "block")]),
    );
    // With their admin endpoints: liveness must hold through the outage.
    let admin_args = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    let hosts: Vec<Host> = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|n| Host::start_with_args(n, &cfg, &shared_cache_dir(), &admin_args))
        .collect();
    settled(&hosts);
    let addresses: Vec<String> = hosts.iter().map(Host::admin_address).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let leader = hosts
        .iter()
        .position(|h| running(std::slice::from_ref(h)).len() == 1)
        .expect("a leader");

    // Stop the API server for longer than the renew deadline (and the lease).
    let outage = LD + SECS(1);
    let before = t.rt.block_on(lease_requests(&t.admin));
    let stopped_at = SystemTime::now();
    // SAFETY: kill(2) on the test API server's pid.
    assert_eq!(unsafe { libc::kill(t.env.apiserver_pid, libc::SIGSTOP) }, 0);
    let resume = Resume(t.env.apiserver_pid);
    // /healthz answers 200 on every host throughout: an unreachable store
    // is no reason to restart a host.
    let mut polls = 0;
    while SystemTime::now().duration_since(stopped_at).unwrap() < outage {
        for (h, addr) in hosts.iter().zip(&addresses) {
            let (status, body) = http_get(addr, "/healthz").unwrap();
            assert_eq!(status, 200, "{} during the outage: {body}", h.name);
            polls += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(resume);
    println!("/healthz answered 200 {polls} times on the three hosts during the outage");
    let resumed_at = SystemTime::now();

    // The leader's guest was stopped (by force) before the lease could have
    // expired anywhere: the last renewal others saw began at most RP before
    // the outage, so none could take over before stopped_at - RP + LD. The
    // force-stop time the leader computed (from its last confirmed renewal,
    // before the outage: however busy the machine is) says so; from then
    // on the fence keeps the guest's effects in, however late the stop is
    // logged.
    let stop = hosts[leader].wait_for(SECS(10), "the leader's forced stop", |e| {
        e.is(STOPPED, Some("probe"))
    });
    let after = ms_between(stopped_at, stop.at);
    let deadline = ms_between(stopped_at, witness::force_stop_at(&stop));
    let expiry = (LD - RP).as_millis() as f64;
    println!(
        "API server stopped for {outage:?}: the leader's guest was stopped by force {after:.0} ms into it, \
         its force-stop time {deadline:.0} ms into it (renew deadline + grace = {} ms; the lease could \
         expire elsewhere at {expiry:.0} ms at the earliest)",
        (RD + GRACE).as_millis()
    );
    assert_stopped_by_force(&hosts[leader], &stop, GRACE);
    // (A few ms of leeway: the host's clock's reading in the log.)
    assert!(
        deadline <= (RD + GRACE).as_millis() as f64 + 20.0 && deadline < expiry,
        "the force-stop time was {deadline:.0} ms into the outage: {:?}",
        stop.json
    );
    let gave_up = hosts[leader].wait_for(SECS(10), "stepping down", |e| e.message() == "stepping down");
    println!(
        "the leader stepped down {:.0} ms into the outage",
        ms_between(stopped_at, gave_up.at)
    );

    // Nobody started a guest while the API server was away.
    for h in &hosts {
        let during: Vec<Event> = h.all(|e| is_start(e) && e.at > stopped_at && e.at < resumed_at);
        assert!(
            during.is_empty(),
            "{} started a guest during the outage: {during:?}",
            h.name
        );
    }

    // When it is back, the election resumes by itself: exactly one leader.
    let (idx, started) = wait_any(
        &hosts,
        SECS(30),
        "a guest start after the outage",
        resumed_at,
        is_start,
    );
    println!(
        "after the API server came back, {} ran the guest {:.0} ms later",
        hosts[idx].name,
        ms_between(resumed_at, started.at)
    );
    std::thread::sleep(LD + SECS(1));
    assert_eq!(running(&hosts).len(), 1, "one leader: {:?}", running(&hosts));
    assert_one_at_a_time(&hosts, &[]);
    // What the three hosts asked for, from just before the outage until
    // now (requests sent while the server was stopped are counted when it
    // serves them): retries are spaced by the retry period, no storm.
    let after = t.rt.block_on(lease_requests(&t.admin));
    let total = SystemTime::now().duration_since(stopped_at).unwrap();
    let requests = delta(&before, &after);
    println!("requests to leases over the {total:.1?} from the outage to now, 3 hosts: {requests:?}");
    let all: u64 = requests.values().sum();
    // Unhindered: the leader's renewals, and each follower re-reading and
    // re-watching about once per retry period while it cannot: 3 hosts x
    // (1 + 2 per retry period) is a generous ceiling.
    let ceiling = 3 * (1 + 2 * (total.as_millis() / RP.as_millis()) as u64);
    assert!(
        all <= ceiling,
        "{all} requests, more than {ceiling}: {requests:?}"
    );
    let spec = spec_of(&t.lease("demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some(hosts[idx].name.as_str()));
    // And after it; the leader counted what failed meanwhile.
    for (h, addr) in hosts.iter().zip(&addresses) {
        assert_eq!(http_get(addr, "/healthz").unwrap().0, 200, "{}", h.name);
    }
    let errors = metric_sum(
        &hosts[leader].scrape(),
        "baton_lease_store_errors_total",
        &["lease=\"demo\""],
    );
    assert!(errors >= 1.0, "the old leader's failed requests are counted");
}

/// Sends SIGCONT to the API server when dropped, so a failing test never
/// leaves it stopped.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the test API server's pid.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
