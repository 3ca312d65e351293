//! Elections through Lease objects: one guest at a time across hosts, fast
//! hand-over and bounded fail-over, a leader paused past its lease, two
//! hosts under one identity.

use super::*;

#[test]
fn three_hosts_one_guest_at_a_time_fast_handover_bounded_failover_few_requests() {
    let t = KubeTest::new("elect");
    let (cfg, mut hosts) = t.three_hosts();
    let t0 = SystemTime::UNIX_EPOCH;
    wait_any(&hosts, SECS(60), "first guest start", t0, is_start);
    for h in &hosts {
        h.wait_for(SECS(60), "a status", |e| {
            e.message() == "lease status changed" && e.str("role") != Some("pending")
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        running(&hosts).len(),
        1,
        "exactly one guest runs: {:?}",
        running(&hosts)
    );

    // Idle: each write is a renewal the leader confirmed (or the retry of
    // a write that failed: a renewal slower than the request timeout, which
    // a busy machine has, is retried, conflicts and is answered by a read);
    // followers only watch. What the API server counts is held against
    // what the hosts say they did (their /metrics), never against a rate
    // of the wall clock: a busy machine renews less often, and every bound
    // below holds all the same. The rate is the bench's
    // (`benches/requests_per_lease.rs`, one lease).
    let idle = SECS(6);
    // The hosts' counts are read around the API server's, a second and
    // more on each side, so that every request the API server counts in
    // its window is counted by the hosts in theirs (a read may land a
    // moment after the failure it answers).
    let hosts_before = HostCounts::read(&hosts);
    std::thread::sleep(SECS(1));
    let before = t.rt.block_on(lease_requests(&t.admin));
    std::thread::sleep(idle);
    let after = t.rt.block_on(lease_requests(&t.admin));
    // A read in the window answers a failure counted by the time it ends.
    std::thread::sleep(SECS(1));
    let done = HostCounts::read(&hosts).since(&hosts_before);
    let idle_requests = delta(&before, &after);
    let periods = (idle.as_millis() / RP.as_millis()) as u64;
    println!(
        "requests to leases in {idle:?} idle, 1 leader + 2 followers (retry period {RP:?}): {idle_requests:?}; \
         the hosts counted {} renewals and {} failed writes (conflicts, timeouts); \
         writes per retry period: {:.2}",
        done.renewals,
        done.failed,
        idle_requests.get("PUT").copied().unwrap_or(0) as f64 / periods as f64
    );
    let count = |verb: &str| idle_requests.get(verb).copied().unwrap_or(0);
    assert_eq!(count("LIST"), 0, "nobody lists: {idle_requests:?}");
    assert!(
        count("GET") <= done.failed,
        "a lease is read only after a failed write: {idle_requests:?}, {} failures",
        done.failed
    );
    // A single lease: no membership records (spreading needs two or more),
    // so every write is the lease's.
    // (A machine this busy may lose the lead in the window, a renewal not
    // confirmed within the renew deadline: it is taken again, and counted,
    // not judged.)
    println!(
        "leadership changes in the idle window: {} terms started, {} ended",
        done.gained, done.lost
    );
    assert!(
        count("PUT") <= done.renewals + done.gained + done.lost + done.failed,
        "one write per renewal, acquisition or release, and a retry per failure: {idle_requests:?}, \
         {} renewals, {} acquisitions, {} terms ended, {} failures",
        done.renewals,
        done.gained,
        done.lost,
        done.failed
    );
    assert!(
        count("PUT") <= periods + 1 + done.gained + done.lost + done.failed,
        "the leader renews at most once per retry period (besides acquisitions, releases and retries): {idle_requests:?}"
    );
    assert!(
        done.renewed.get("demo").is_some_and(|&n| n >= 1) || done.taken.get("demo").is_some_and(|&n| n >= 1),
        "the leader renews (or a leader takes it again): renewed {:?}, taken {:?}",
        done.renewed,
        done.taken
    );
    assert_eq!(count("POST"), 0, "no creating: {idle_requests:?}");
    // Each of the three watches is resumed once per lease duration (x 1 to
    // 1.25), the budget that finds a silent connection.
    let rewatches = 3 * (idle.as_millis() / LD.as_millis() + 1) as u64;
    assert!(
        count("WATCH") <= rewatches,
        "each watch resumed at most once per lease duration ({rewatches} in all): {idle_requests:?}"
    );

    // SIGTERM the leader, three times: a standby takes the lease over
    // through the release, not by waiting for it to expire (the
    // milliseconds are a figure: `benches/versus_client_go.rs`, graceful).
    let mut killed: Vec<(String, SystemTime)> = Vec::new();
    let mut handovers = Vec::new();
    let mut from_release = Vec::new();
    for next_name in b'd'..=b'f' {
        let leader = hosts
            .iter()
            .position(|h| running(std::slice::from_ref(h)).len() == 1)
            .expect("a leader");
        let termed = hosts[leader].sigterm();
        let (idx, started) = wait_any(&hosts, SECS(15), "a standby's guest start", termed, is_start);
        assert_ne!(idx, leader);
        handovers.push(ms_between(termed, started.at));
        from_release.push(assert_handed_over_by_release(
            &hosts[leader],
            &hosts[idx],
            "demo",
            termed,
        ));
        assert!(hosts[leader].wait_exit(SECS(15)).success());
        assert_eq!(
            hosts[leader].all(|e| e.message() == "released the lease").len(),
            1,
            "{} released the lease",
            hosts[leader].name
        );
        // A new standby takes the stopped host's place.
        let name = format!("host-{}", next_name as char);
        let h = host_with_admin(&name, &cfg);
        h.wait_for(SECS(60), "following", |e| {
            e.message() == "lease status changed" && e.str("role") == Some("following")
        });
        hosts.push(h);
        std::thread::sleep(Duration::from_millis(300));
    }
    println!(
        "SIGTERM handover (signal to the standby's guest start): {}; (release to the standby's lead): {}",
        summary(handovers),
        summary(from_release)
    );

    // SIGKILL the leader: another takes over once the lease has expired,
    // never sooner (safety), and not much later (liveness: a bound only a
    // wedged lease breaks; the figure is `benches/handover.rs`, crash).
    let leader = hosts
        .iter()
        .position(|h| running(std::slice::from_ref(h)).len() == 1)
        .expect("a leader");
    println!("SIGKILL {}", hosts[leader].name);
    let killed_at = hosts[leader].sigkill();
    killed.push((hosts[leader].name.clone(), killed_at));
    // The dead leader's last renewal, as the Lease holds it (unless it was
    // taken over before it could be read).
    let last = t
        .lease("demo")
        .map(|l| spec_of(&l))
        .filter(|s| s.holder_identity.as_deref() == Some(hosts[leader].name.as_str()));
    let (_, started) = wait_any(
        &hosts,
        SECS(30),
        "a guest start after SIGKILL",
        killed_at,
        is_start,
    );
    let (_, led) = wait_any(&hosts, SECS(1), "a lead after SIGKILL", killed_at, |e| {
        e.message() == "lease status changed" && e.str("role") == Some("leading")
    });
    let took = ms_between(killed_at, started.at);
    let bound = (LD * 2 + RP).as_millis() as f64;
    println!(
        "SIGKILL failover: {took:.0} ms (LD + RP = {} ms; liveness bound {bound:.0} ms)",
        (LD + RP).as_millis()
    );
    match last.as_ref().and_then(|s| s.renew_time.as_ref()) {
        Some(renewed) => {
            let renewed = SystemTime::from(renewed.0);
            let waited = ms_between(renewed, led.at);
            println!("the taker led {waited:.0} ms after the dead leader's last renewal");
            assert!(
                waited >= LD.as_millis() as f64 - 50.0,
                "taken {waited:.0} ms after the dead leader's last renewal, before its lease ({LD:?}) expired"
            );
        }
        None => println!("the Lease was taken over before it could be read: its last renewal is unknown"),
    }
    assert!(
        took <= bound,
        "failover took {took:.0} ms (bound {bound:.0} ms); what the hosts logged:\n{}",
        story(&hosts, killed_at - SECS(1), started.at + SECS(1))
    );
    std::thread::sleep(Duration::from_millis(500));

    // One at a time throughout, terms growing, and the last term is the
    // Lease's leaseTransitions; each leading host reported the guest's term.
    let all = assert_one_at_a_time(&hosts, &killed);
    let alive: Vec<String> = running(&hosts)
        .into_iter()
        .filter(|n| !killed.iter().any(|(k, _)| k == n))
        .collect();
    assert_eq!(alive.len(), 1, "one guest runs: {alive:?}");
    let last_term = all.last().unwrap().2;
    let spec = spec_of(&t.lease("demo").expect("the Lease"));
    assert_eq!(
        spec.lease_transitions,
        Some(last_term as i32),
        "the term is the Lease's transitions"
    );
    assert_eq!(spec.lease_duration_seconds, Some(4));
    for h in &hosts {
        for led in h.all(|e| e.message() == "lease status changed" && e.str("role") == Some("leading")) {
            let term = led.u64("term").unwrap();
            assert!(
                all.iter().any(|r| r.3 == h.name && r.2 == term),
                "{} led term {term} and its guest ran in it",
                h.name
            );
        }
    }
    println!(
        "terms: {:?}",
        all.iter().map(|r| format!("{}:{}", r.3, r.2)).collect::<Vec<_>>()
    );
}

#[test]
fn a_leader_paused_past_its_lease_never_appends_after_its_terms_force_stop() {
    // As the end-to-end test of the same name, on Leases: three hosts whose
    // guests append term-tagged records back to back to one file, the
    // leader stopped with SIGSTOP past its lease, again and again, with the
    // CPUs busy.
    let t = KubeTest::new("pauses");
    let data = witness::records_dir(&t.scratch);
    let mut text = t.config("demo", &[]);
    text.push_str(&witness::appender_plugins("demo", &data));
    let cfg = t.scratch.write("appenders.toml", &text);
    let mut hosts = witness::start_hosts(&cfg, &["h1", "h2", "h3"], &[]);
    const PAUSES: usize = 6;
    {
        let _load = witness::CpuLoad::start(2);
        // Each leader paused only once its guests wrote in its term.
        let records = data.join("records");
        witness::pause_leaders_when(&hosts, PAUSES, LD + Duration::from_millis(500), |t| {
            witness::recorded(&records, t)
        });
        std::thread::sleep(SECS(1));
    }
    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        assert!(h.wait_exit(SECS(15)).success(), "{}", h.name);
    }
    let seen = witness::check_records(&data.join("records"), &hosts);
    println!(
        "{PAUSES} pauses of the leader past its lease on Kubernetes, CPUs busy: {} records in {} terms, all \
         stamped before their term's force-stop, none out of order",
        seen.records,
        seen.terms.len()
    );
    assert!(
        seen.terms.len() >= PAUSES,
        "only {} terms wrote: {:?}",
        seen.terms.len(),
        seen.terms
    );
}

#[test]
fn two_hosts_under_one_identity_never_both_lead_and_the_second_says_why() {
    let t = KubeTest::new("same-identity");
    let cfg = t.scratch.write(
        "baton.toml",
        &t.config("demo", &[probe("probe", "pollable", "cooperative")]),
    );
    let a = Host::start("same", &cfg);
    let first = a.wait_for(SECS(60), "a's guest start", is_start);
    let lease = t.lease("demo").expect("the Lease");
    let instance = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("baton.dev/holder-instance"))
        .cloned();
    assert!(instance.is_some(), "no holder instance on the Lease: {lease:?}");
    let mut b = Host::start("same", &cfg);
    let status = b.wait_exit(SECS(30));
    assert_eq!(status.code(), Some(1), "b: {status}; its log:\n{}", b.output());
    let output = b.output();
    assert!(
        output.contains("identities must be unique per process"),
        "b did not say why; its log:\n{output}"
    );
    assert!(b.all(is_start).is_empty(), "b ran a guest");
    std::thread::sleep(LD);
    let starts = a.all(is_start);
    assert_eq!(starts.len(), 1, "a's guest restarted: {starts:?}");
    let spec = spec_of(&t.lease("demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some("same"));
    assert_eq!(spec.lease_transitions.map(|t| t as u64), first.guest_term());
}
