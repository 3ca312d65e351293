//! Spreading leases across hosts on Leases: membership Leases, thirty
//! leases on three hosts, `baton status`, and what a hundred leases cost
//! the API server.

use super::*;

#[test]
fn guests_of_both_worlds_count_the_live_hosts_from_membership_leases() {
    // As the end-to-end test of the same name: the membership records are
    // Leases, listed every retry period.
    let t = KubeTest::new("hosts");
    let head = t.head();
    let cfg = t.scratch.write("baton.toml", &spread::hosts_config(&head));
    // The membership Lease lasts half the lease duration (2 s), listed
    // every retry period.
    spread::guests_count_the_live_hosts(&cfg, SECS(2) + 2 * RP + SECS(1));
}

#[test]
fn the_membership_lease_of_a_host_gone_for_long_is_deleted_and_comes_back_with_it() {
    let t = KubeTest::new("forget");
    let head = t.head() + "\n[spread]\nforget-after = \"2s\"\n";
    let cfg = t.scratch.write("baton.toml", &spread::hosts_config(&head));
    spread::a_gone_host_is_forgotten_then_counted_again(&cfg, &[], SECS(2), SECS(2));
}

#[test]
fn three_hosts_spread_thirty_leases_and_take_over_a_dead_hosts_share() {
    // As the end-to-end test of the same name, on Leases: the membership
    // records are Leases too, found by listing the namespace.
    let t = KubeTest::new("spread");
    let data = witness::records_dir(&t.scratch);
    let head = t.head();
    let cfg = t
        .scratch
        .write("baton.toml", &spread::spread_config(&head, &data));
    // LD + RP, and a few seconds for the moves that follow.
    spread::three_hosts_share_thirty_leases(&cfg, &data, &[], LD + RP + SECS(6));
    let leases = t.rt.block_on(async {
        kube::Api::<Lease>::namespaced(t.admin.clone(), &t.ns.name)
            .list(&Default::default())
            .await
            .unwrap()
    });
    let members = leases
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("baton-member."))
        })
        .count();
    assert_eq!(members, 3, "one membership Lease per host identity");
}

#[test]
fn status_shows_two_hosts_spreading_leases_as_json_and_text() {
    // As the end-to-end test of the same name, on Leases, the kubeconfig
    // given to `baton run` and `baton status` alike by --kubeconfig (the
    // file names none). A membership Lease without baton's labels, as a
    // baton from before them wrote, is shown but not counted, as the hosts
    // do not count it.
    let t = KubeTest::new("status");
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("baton-member.ghost".into()),
            labels: Some([("app".to_owned(), "baton-test".to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(held_by("ghost", 1, 60)),
    };
    t.rt.block_on(t.ns.leases().create(&PostParams::default(), &ghost))
        .unwrap();
    let head = format!("{}\n{DEFAULTS}", store_table(&t.ns.name, None, true));
    let cfg = t.scratch.write("baton.toml", &status::status_config(&head));
    let args = [OsStr::new("--kubeconfig"), t.env.admin_kubeconfig.as_os_str()];
    status::two_hosts_as_status_shows_them(&cfg, &args, &args, LD, "kubernetes");
    let json_args = [args[0], args[1], OsStr::new("-o"), OsStr::new("json")];
    let json: serde_json::Value = serde_json::from_str(&status::status(&cfg, &json_args)).unwrap();
    assert!(
        json["store"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(&t.ns.name)),
        "{json:#}"
    );
    let ghost = json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["identity"] == "ghost")
        .unwrap_or_else(|| panic!("{json:#}"));
    assert_eq!(
        (&ghost["counted"], &ghost["live"]),
        (&false.into(), &false.into()),
        "{json:#}"
    );
    // Both hosts have stopped and released their records.
    assert_eq!(json["live_hosts"], serde_json::json!([]), "{json:#}");
    let text = status::status(&cfg, &args);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ghost ") && l.contains("not counted")),
        "{text}"
    );
}

#[test]
fn a_hundred_leases_on_two_hosts_cost_one_write_per_renewal_and_read_only_after_a_failed_write() {
    // The API server's own counts (/metrics) over an idle window, against
    // what the hosts say they did in it (their /metrics): each write to a
    // lease is a renewal the hosts confirmed, or a failed write they
    // counted; nothing is read but after a failed write (a renewal slower
    // than the request timeout, 500 ms, is retried, conflicts and is
    // answered by a read); every lease is renewed; the hosts find the live
    // hosts (their membership Leases, every retry period) in their watch's
    // memory, with no request; each host keeps one watch of the
    // namespace's Leases, resumed once per lease duration. Nothing here is
    // counted per second of the wall clock: a busy machine renews less
    // often, and every bound below holds all the same. The rates (writes
    // per record per retry period) are the bench's
    // (`benches/requests_per_lease.rs`, requests per minute per lease).
    const LEASES: u64 = 100;
    let t = KubeTest::new("hundred");
    let mut text = t.head();
    for i in 0..LEASES {
        text.push_str(&format!("\n[[lease]]\nname = \"lease-{i:03}\"\n"));
    }
    let cfg = t.scratch.write("baton.toml", &text);
    let admin_args = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    // The store's debug lines say when a host lists Leases or starts its
    // shared watch again (a busy machine does: its watch lags).
    let hosts = ["a", "b"].map(|n| {
        Host::start_opts(
            n,
            &cfg,
            support::Opts {
                args: &admin_args,
                env: &[("BATON_LOG", "info,baton::store::kube=debug")],
                ..support::Opts::default()
            },
        )
    });
    let led = |h: &Host| support::led(h).len() as u64;
    let started = Instant::now();
    // Liveness, not speed: a slow machine takes longer to spread.
    let until = started + SECS(180);
    while led(&hosts[0]) + led(&hosts[1]) != LEASES || led(&hosts[0]).abs_diff(LEASES / 2) > 1 {
        assert!(
            Instant::now() < until,
            "not spread: {} and {}; a's log ends:\n{}\nb's log ends:\n{}",
            led(&hosts[0]),
            led(&hosts[1]),
            support::tail(&hosts[0].output(), 30),
            support::tail(&hosts[1].output(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{LEASES} leases spread over 2 fresh hosts in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Let the hand-overs' watches and floors settle.
    std::thread::sleep(SECS(2));
    let idle = SECS(6);
    // The hosts' counts are read around the API server's, a retry period
    // and more on each side, so that every request the API server counts
    // in its window is counted by the hosts in theirs: a read lands up to
    // a request's queueing after the failure it answers, which may have
    // been counted just before the window.
    let hosts_before = support::HostCounts::read(&hosts);
    let hosts_from = SystemTime::now();
    std::thread::sleep(SECS(1));
    let before = t.rt.block_on(lease_requests(&t.admin));
    std::thread::sleep(idle);
    let requests = delta(&before, &t.rt.block_on(lease_requests(&t.admin)));
    // A read in the window answers a failure counted by the time it ends.
    std::thread::sleep(SECS(1));
    let done = support::HostCounts::read(&hosts).since(&hosts_before);
    let hosts_to = SystemTime::now();
    let count = |verb: &str| requests.get(verb).copied().unwrap_or(0);
    let records = LEASES + 2;
    // The membership Leases' renewals, which the hosts do not count (their
    // electors report to no observer): at most one per host per retry
    // period, fewer on a busy machine.
    let periods = (idle.as_millis() / RP.as_millis()) as u64;
    let members = 2 * (periods + 1);
    println!(
        "requests to leases in {idle:?} idle, {LEASES} leases and 2 membership Leases on 2 hosts \
         (retry period {RP:?}): {requests:?}; the hosts counted {} renewals and {} failed writes \
         (conflicts, timeouts); writes per record per retry period: {:.2}",
        done.renewals,
        done.failed,
        count("PUT") as f64 / (records * periods) as f64
    );
    // The membership electors report to no observer: their failed writes
    // (each a timed-out renewal, retried, conflicting, and answered by a
    // read) are counted from the hosts' logs.
    let member_timeouts: usize = hosts
        .iter()
        .map(|h| {
            h.all(|e| {
                e.at >= hosts_from
                    && e.str("lease").is_some_and(|l| l.starts_with("baton-member."))
                    && e.message().contains("timed out")
            })
            .len()
        })
        .sum();
    assert!(
        count("GET") <= done.failed + member_timeouts as u64,
        "a lease is read only after a failed write: {requests:?}, {} failures, {member_timeouts} of \
         membership records",
        done.failed
    );
    assert_eq!(count("POST"), 0, "no creating: {requests:?}");
    // Each write is a renewal, an acquisition or a release (a term ended)
    // the hosts counted, a retry of a failed one, or a membership Lease's
    // renewal. (A machine this
    // busy may lose leads in the window, a renewal not confirmed within the
    // renew deadline: they are taken again, and counted, not judged.)
    println!(
        "leadership changes in the idle window: {} terms started, {} ended",
        done.gained, done.lost
    );
    assert!(
        count("PUT") <= done.renewals + done.gained + done.lost + done.failed + members,
        "one write per renewal, acquisition or release, and a retry per failure: {requests:?}, {} renewals, \
         {} acquisitions, {} terms ended, {} failures",
        done.renewals,
        done.gained,
        done.lost,
        done.failed
    );
    // (That a leader renews at most once per retry period, however slow its
    // writes, is the elector's, under paused time:
    // `a_leader_renews_once_per_retry_period_however_slow_its_writes`; the
    // figure above and the bench print the rate.)
    // No leader keeps a lease without renewing it: a lease no host renewed
    // or took in the window was led by no host throughout it (lost under
    // load, before or in it, and not yet taken again: a busy machine may
    // take longer than the window for that), and is led again afterwards.
    assert_eq!(
        done.renewed.len() as u64,
        LEASES,
        "every lease is counted: {:?}",
        done.renewed
    );
    let unwritten: Vec<&String> = done
        .renewed
        .iter()
        .filter(|(l, n)| **n == 0 && done.taken.get(*l).copied().unwrap_or(0) == 0)
        .map(|(l, _)| l)
        .collect();
    for lease in &unwritten {
        for h in &hosts {
            let changed = h.all(|e| {
                (hosts_from..hosts_to).contains(&e.at)
                    && e.message() == "lease status changed"
                    && e.str("lease") == Some(lease.as_str())
            });
            assert!(
                !support::led_at(h, hosts_from).contains(*lease) || !changed.is_empty(),
                "{} led {lease} through the window without renewing it; its log ends:\n{}",
                h.name,
                support::tail(&h.output(), 30)
            );
        }
    }
    println!("leases neither renewed nor taken in the window (led by no host then): {unwritten:?}");
    let until = Instant::now() + SECS(180);
    while !unwritten
        .iter()
        .all(|l| hosts.iter().any(|h| support::led(h).contains(*l)))
    {
        assert!(Instant::now() < until, "{unwritten:?} not led again within 180 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Listing the membership Leases from the API server cost one LIST per
    // host per retry period here (24 in 6 s); the namespace's watch serves
    // it now, and an idle host in sync lists nothing. A host lists only
    // when its shared watch starts (again), or when that watch lags behind
    // the host's own write (a busy machine), and says so.
    let logged = |message: &str| -> u64 {
        hosts
            .iter()
            .map(|h| {
                h.all(|e| (hosts_from..hosts_to).contains(&e.at) && e.message() == message)
                    .len() as u64
            })
            .sum()
    };
    let (listed, restarted) = (
        logged("listing the Leases from the API server"),
        logged("starting the shared lease watch"),
    );
    println!(
        "list requests in {idle:?}: {} (2 hosts finding the live hosts every retry period: {} listings); \
         the hosts listed {listed} times with their watch behind and started it {restarted} times",
        count("LIST"),
        2 * periods
    );
    assert!(
        count("LIST") <= listed + restarted,
        "the membership listing is served from the watch, unless it lags: {requests:?}, {listed} listings \
         while behind, {restarted} watches started"
    );
    // One watch per host for the whole namespace, resumed once per lease
    // duration (x 1 to 1.25): at most two ends of it in 6 s, and one more
    // per host as slack for a shared watch broken and started again (still
    // one per namespace). One watch per lease cost 209 to 275 here: each of
    // 204 watches resumed.
    let rewatches = 2 * (idle.as_millis() / LD.as_millis() + 2) as u64;
    // (And one for each shared watch started again.)
    println!(
        "watch requests in {idle:?}: {} for {} records on 2 hosts (at most {rewatches}: one watch per host and namespace)",
        count("WATCH"),
        records
    );
    assert!(
        count("WATCH") <= rewatches + restarted,
        "one watch per host, resumed at most once per lease duration ({rewatches} in all): {requests:?}"
    );
    for mut h in hosts {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
}

#[test]
fn a_drained_host_hands_its_leases_over_on_leases_and_its_membership_lease_says_so() {
    // As the end-to-end test of the same name, on Leases, two hosts on
    // four leases, drained all at once: the drained host's membership Lease carries
    // baton.dev/draining = "true" (then "false" after the resume), and
    // every Lease is held by the other host while it drains.
    let t = KubeTest::new("drain");
    let data = witness::records_dir(&t.scratch);
    let cfg = t
        .scratch
        .write("baton.toml", &spread::leases_config(&t.head(), &data, 4, &[]));
    let leases = t.ns.leases();
    let get = |name: &str| t.rt.block_on(leases.get_opt(name)).unwrap();
    let holder = |lease: &str| get(lease).and_then(|l| l.spec).and_then(|s| s.holder_identity);
    let draining = |host: &str| {
        let lease = get(&format!("baton-member.{host}"))?;
        let value = lease.metadata.annotations?.get("baton.dev/draining").cloned()?;
        Some(value == "true")
    };
    let status_draining = |host: &str| draining::status_says_draining(&cfg, host);
    let records = draining::Records {
        holder: &holder,
        draining: &draining,
        status_draining: &status_draining,
    };
    let took = draining::drain_one_host(&cfg, &data, &["a", "b"], 4, &records, true);
    println!("kubernetes: baton drain of a host leading two leases took {took:.0} ms");
}
