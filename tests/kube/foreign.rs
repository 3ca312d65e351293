//! Other writers and the operator: Leases deleted or written by someone
//! else, labels dropped, the deploy Role (RBAC), timings refused at
//! start-up.

use super::*;

#[test]
fn a_deleted_or_foreign_written_lease_converges_to_one_leader_without_overlap() {
    let t = KubeTest::new("foreign");
    let (_, mut hosts) = t.three_hosts();
    let first = settled(&hosts);
    std::thread::sleep(Duration::from_secs(1));

    // Deleted while held: the holder may still run its guest and sees the
    // deletion no sooner than the others, so nobody else may start. It
    // re-creates the Lease at its next renewal and leads on, same term (a
    // holder that failed to within its renew deadline would step down,
    // which the checks below catch: the wait is only for a slow machine).
    let leader = running(&hosts).pop().expect("a leader");
    let term = first.guest_term().unwrap();
    let deleted_at = SystemTime::now();
    t.rt.block_on(t.ns.leases().delete("demo", &DeleteParams::default()))
        .unwrap();
    let recreated = loop {
        if let Some(lease) = t.lease("demo") {
            break lease;
        }
        assert!(
            ms_between(deleted_at, SystemTime::now()) < 10_000.0,
            "the Lease was not re-created"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    println!(
        "Lease deleted while held: it was back {:.0} ms later, held by {:?} in term {:?} (leader {leader}, term {term})",
        ms_between(deleted_at, SystemTime::now()),
        spec_of(&recreated).holder_identity,
        spec_of(&recreated).lease_transitions,
    );
    assert_eq!(
        spec_of(&recreated).holder_identity.as_deref(),
        Some(leader.as_str())
    );
    assert_eq!(spec_of(&recreated).lease_transitions, Some(term as i32));
    std::thread::sleep(LD);
    for h in &hosts {
        let moved: Vec<Event> =
            h.all(|e| e.at >= deleted_at && (is_start(e) || e.is(STOPPED, Some("probe"))));
        assert!(
            moved.is_empty(),
            "{}: no guest stopped or started after the delete: {moved:?}",
            h.name
        );
    }
    assert_eq!(running(&hosts), vec![leader.clone()]);

    // Overwritten by a foreign writer with its own labels and annotations,
    // a 2 s lease and a term of its own: the leader stops at once, the
    // others wait out the foreign lease, then one takes over with the next
    // term, keeping the foreign fields. The writer does what any client
    // must: read, modify, write with the read resourceVersion, and read
    // again when the leader renewed in between (409 Conflict).
    let tries_until = Instant::now() + SECS(10);
    let overwritten_at = loop {
        assert!(
            Instant::now() < tries_until,
            "the foreign overwrite kept conflicting"
        );
        let mut lease = t.lease("demo").unwrap();
        lease
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "other".into());
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("other.example/owner".into(), "keep me".into());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("foreign-writer".into()),
            lease_duration_seconds: Some(2),
            lease_transitions: Some(40),
            ..LeaseSpec::default()
        });
        let at = SystemTime::now();
        match t
            .rt
            .block_on(t.ns.leases().replace("demo", &PostParams::default(), &lease))
        {
            Ok(_) => break at,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("foreign overwrite: {e}"),
        }
    };
    let (idx, taken) = wait_any(
        &hosts,
        SECS(15),
        "a guest start after the overwrite",
        overwritten_at,
        is_start,
    );
    let waited = ms_between(overwritten_at, taken.at);
    println!(
        "Lease overwritten by a foreign holder (2 s lease): {} took over after {waited:.0} ms, term {}",
        hosts[idx].name,
        taken.guest_term().unwrap()
    );
    assert!(waited >= 1900.0, "the foreign lease was honoured: {waited:.0} ms");
    // Term 41, above the foreign one; or, when another host's try for 41
    // raised the floor (to 41 + 15) and then lost the Lease write, the
    // floor's next term: the foreign write made the Lease's terms not
    // baton's, so a reserved term is not given out (a suite run saw 57,
    // the kubeterms group on an API server of its own).
    let term = taken.guest_term().unwrap_or(0);
    let losers = hosts.len() as u64 - 1;
    assert!(
        term >= 41 && term <= 41 + RESERVED_TERMS * losers && (term - 41) % RESERVED_TERMS == 0,
        "term {term} after the foreign lease; the hosts' story:\n{}",
        story(&hosts, overwritten_at, SystemTime::now())
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(running(&hosts).len(), 1);
    assert_one_at_a_time(&hosts, &[]);
    let lease = t.lease("demo").unwrap();
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("team").map(String::as_str),
        Some("other"),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("baton-test"),
        "{labels:?}"
    );
    assert_eq!(
        lease
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("other.example/owner")
            .map(String::as_str),
        Some("keep me")
    );
    assert_eq!(
        spec_of(&lease).holder_identity.as_deref(),
        Some(hosts[idx].name.as_str())
    );

    // Deleted after its holder died: the others honour the dead holder's
    // lease from when they saw the deletion, then one takes over.
    let killed_at = hosts[idx].sigkill();
    let killed = vec![(hosts[idx].name.clone(), killed_at)];
    let deleted_at = SystemTime::now();
    t.rt.block_on(t.ns.leases().delete("demo", &DeleteParams::default()))
        .unwrap();
    let (next, taken) = wait_any(
        &hosts,
        LD + SECS(10),
        "a guest start after the delete",
        deleted_at,
        is_start,
    );
    let waited = ms_between(deleted_at, taken.at);
    println!(
        "Lease deleted after its holder was killed: {} took over after {waited:.0} ms, term {:?}",
        hosts[next].name,
        taken.guest_term()
    );
    assert!(
        waited >= LD.as_millis() as f64 - 50.0,
        "the dead holder's lease was honoured: {waited:.0} ms"
    );
    // Above every term the killed holder may have started: term 41
    // reserved up to 41 + 15 (see the Kubernetes store's term floors). A
    // host that lost the race for term 41 may have reserved the next 16
    // (its floor write lands before its Lease write fails), so the term is
    // 57 or, once per losing host, 16 higher: terms only need to grow.
    let term = taken.guest_term().unwrap_or(0);
    let losers = hosts.len() as u64 - 1;
    assert!(
        term > 41 + RESERVED_TERMS - 1
            && term <= 41 + RESERVED_TERMS * (1 + losers)
            && (term - 41) % RESERVED_TERMS == 0,
        "term {term} after the deletion; the hosts' story:\n{}",
        story(&hosts, killed_at, SystemTime::now())
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_one_at_a_time(&hosts, &killed);
}

#[test]
fn a_foreign_write_that_drops_the_labels_is_no_deletion_and_the_hosts_see_every_change() {
    // The hosts watch their Leases through one watch per namespace that
    // selects baton's labels; the API server reports a Lease that loses
    // them as DELETED. Neither that nor a foreign holder that writes no
    // labels may look like a free Lease, or go unseen.
    let t = KubeTest::new("nolabels");
    let cfg = t.scratch.write(
        "baton.toml",
        &t.config("demo", &[probe("probe", "pollable", "cooperative")]),
    );
    let hosts: Vec<Host> = ["host-a", "host-b"]
        .iter()
        .map(|n| Host::start(n, &cfg))
        .collect();
    settled(&hosts);
    std::thread::sleep(SECS(1));
    let leader = running(&hosts).pop().expect("a leader");

    // 1. The labels of the held Lease dropped: nothing moves, and the
    // leader's next renewal puts them back (the wait is for a slow
    // machine: a leader that could not renew would step down, which the
    // checks below catch).
    let dropped_at = SystemTime::now();
    let how =
        t.rt.block_on(t.env.drop_labels(&t.ns, "demo", &["baton.dev/role", "app"]));
    let until = Instant::now() + SECS(10);
    loop {
        let labels = t.lease("demo").unwrap().metadata.labels.unwrap_or_default();
        if labels.get("baton.dev/role").map(String::as_str) == Some("lease") {
            break;
        }
        assert!(Instant::now() < until, "the labels were not put back: {labels:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "labels dropped ({how}) from the Lease {leader} holds: put back by its renewal {:.0} ms later",
        ms_between(dropped_at, SystemTime::now())
    );
    std::thread::sleep(LD);
    for h in &hosts {
        let moved: Vec<Event> =
            h.all(|e| e.at >= dropped_at && (is_start(e) || e.is(STOPPED, Some("probe"))));
        assert!(
            moved.is_empty(),
            "{}: a guest stopped or started: {moved:?}",
            h.name
        );
    }
    assert_eq!(running(&hosts), vec![leader.clone()]);

    // 2. A foreign holder takes the Lease over without baton's labels, for
    // 60 s: the leader stops, nobody takes it meanwhile.
    let taken_at = SystemTime::now();
    t.rt.block_on(foreign_write(
        &t.ns,
        "demo",
        &[("team", "other")],
        held_by("foreign-writer", 40, 60),
    ));
    let (_, stopped) = wait_any(&hosts, SECS(10), "the leader's stop", taken_at, |e| {
        e.is(STOPPED, Some("probe"))
    });
    println!(
        "a foreign holder without labels: the leader's guest stopped {:.0} ms later",
        ms_between(taken_at, stopped.at)
    );
    // 3. It renews twice, still without labels; then releases. The hosts
    // see the release through their watches (a host that missed it would
    // wait out the 60 s lease) and one takes over at once: well within a
    // quarter of that lease however busy the machine is (the milliseconds
    // are a figure).
    for i in 0..2 {
        std::thread::sleep(SECS(1));
        t.rt.block_on(foreign_write(
            &t.ns,
            "demo",
            &[("team", "other")],
            held_by("foreign-writer", 40, 60 + i),
        ));
    }
    std::thread::sleep(SECS(1));
    assert!(
        running(&hosts).is_empty(),
        "nobody leads while the foreign holder does"
    );
    let released_at = SystemTime::now();
    t.rt.block_on(foreign_write(
        &t.ns,
        "demo",
        &[("team", "other")],
        held_by("", 40, 1),
    ));
    let (idx, started) = wait_any(
        &hosts,
        SECS(30),
        "a guest start after the release",
        released_at,
        is_start,
    );
    let took = ms_between(released_at, started.at);
    println!(
        "the foreign holder released the Lease without labels: {} took over {took:.0} ms later, term {:?}",
        hosts[idx].name,
        started.guest_term()
    );
    assert!(
        took < 15_000.0,
        "taken {took:.0} ms after the release: not through the watch (the foreign lease is 60 s)"
    );
    assert_eq!(started.guest_term(), Some(41));
    let labels = t.lease("demo").unwrap().metadata.labels.unwrap_or_default();
    for (k, v) in [
        ("baton.dev/role", "lease"),
        ("app", "baton-test"),
        ("team", "other"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
    }
    std::thread::sleep(SECS(1));
    assert_eq!(running(&hosts).len(), 1);
    assert_one_at_a_time(&hosts, &[]);
}

#[test]
fn rbac_the_deploy_role_is_enough_and_its_absence_is_a_clear_forbidden() {
    let t = KubeTest::new("rbac");
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    t.rt.block_on(t.ns.bind(role, "baton-a"));
    // The kubeconfig comes from the command line here.
    let cfg = t.scratch.write(
        "baton.toml",
        &kube_config(
            &t.ns.name,
            None,
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let kc = |user: &str| t.env.kubeconfig(user).into_os_string();
    let allowed = Host::start_with_args(
        "rbac-a",
        &cfg,
        &shared_cache_dir(),
        &[OsStr::new("--kubeconfig"), kc("baton-a").as_os_str()],
    );
    allowed.wait_for(SECS(60), "the allowed host's guest", is_start);
    let denied = Host::start_with_args(
        "rbac-nobody",
        &cfg,
        &shared_cache_dir(),
        &[OsStr::new("--kubeconfig"), kc("nobody").as_os_str()],
    );
    let refusal = denied.wait_for(SECS(60), "a forbidden error", |e| {
        e.str("error").is_some_and(|m| m.contains("forbidden"))
    });
    let message = refusal.str("error").unwrap().to_owned();
    println!("user without the Role: {}: {message}", refusal.message());
    assert!(message.contains("User \"nobody\" cannot"), "{message}");
    assert!(message.contains("resource \"leases\""), "{message}");
    assert!(
        message.contains(&format!("namespace \"{}\"", t.ns.name)),
        "{message}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(denied.all(is_start).is_empty());
    assert!(allowed.all(|e| e.message() == "stepping down").is_empty());
    let spec = spec_of(&t.lease("demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some("rbac-a"));
}

#[test]
fn unsafe_or_unrepresentable_timings_are_refused_at_start_up() {
    let env = KubeEnv::load();
    let s = Scratch::new();
    let base = kube_config("baton", Some(&env.admin_kubeconfig), "demo", &[]);
    // A request timeout longer than the lease itself.
    let cfg = s.write(
        "slow.toml",
        &base.replace("request-timeout = \"500ms\"", "request-timeout = \"5s\""),
    );
    let out = baton().args(["run", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{}", stderr.trim());
    assert!(!out.status.success());
    assert!(
        stderr
            .contains("lease \"demo\": unsafe timings: request-timeout must be shorter than renew-deadline"),
        "{stderr}"
    );
    // A lease duration a Lease object cannot hold.
    let cfg = s.write(
        "frac.toml",
        &base.replace("lease-duration = \"4s\"", "lease-duration = \"4500ms\""),
    );
    let out = baton().args(["run", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{}", stderr.trim());
    assert!(!out.status.success());
    assert!(
        stderr.contains("lease-duration 4s 500ms is not a whole number of seconds"),
        "{stderr}"
    );
}
