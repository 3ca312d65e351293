//! Terms after a Lease is reset in place or loses its term floor (issue
//! 20, item 5): real `baton` processes on the real API server, and the
//! store itself for what only a running host can know.

use super::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// A host on `cfg` (shared compiled-code cache).
fn host(name: &str, cfg: &Path) -> Host {
    Host::start_with(name, cfg, &shared_cache_dir())
}

/// The term of `h`'s next guest start at or after `after`.
fn started_term(h: &Host, after: SystemTime) -> u64 {
    h.wait_for(SECS(60), "the guest's start", |e| e.at >= after && is_start(e))
        .guest_term()
        .expect("a term")
}

/// Leads the lease with one host after another, one per name: each next
/// host starts as a follower and takes over when the one before it is
/// stopped (SIGTERM: it releases the Lease). Returns the terms, in order,
/// and the last host, still leading.
fn lead_in_turn(cfg: &Path, names: &[&str]) -> (Vec<u64>, Host) {
    let mut current = host(names[0], cfg);
    let mut terms = vec![started_term(&current, SystemTime::UNIX_EPOCH)];
    for name in &names[1..] {
        let next = host(name, cfg);
        next.wait_for(SECS(60), "following", |e| {
            e.message() == "lease status changed" && e.str("role") == Some("following")
        });
        let stopped = current.sigterm();
        terms.push(started_term(&next, stopped));
        assert!(current.wait_exit(SECS(30)).success());
        current = next;
    }
    (terms, current)
}

fn floor_config(ns: &TestNamespace, env: &KubeEnv, s: &Scratch) -> std::path::PathBuf {
    s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    )
}

fn floor_term(rt: &tokio::runtime::Runtime, admin: &kube::Client, ns: &TestNamespace) -> Option<u64> {
    rt.block_on(floor_of(admin, &ns.name, "demo"))
        .map(|data| data.get("floor").expect("data.floor").parse().expect("a number"))
}

/// The warning a host logs when it finds the Lease's leaseTransitions
/// below the floor, if it logged one.
fn reset_warning(h: &Host) -> Option<Event> {
    h.all(|e| {
        e.message()
            .contains("leaseTransitions is below the lease's highest term")
    })
    .into_iter()
    .next()
}

#[test]
fn a_lease_replaced_in_place_with_its_terms_reset_never_repeats_a_term() {
    let t = KubeTest::new("reset");
    let cfg = floor_config(&t.ns, &t.env, &t.scratch);

    // Four hosts lead one after another: terms 1 to 4.
    let (terms, mut last) = lead_in_turn(&cfg, &["reset-a", "reset-b", "reset-c", "reset-d"]);
    assert_eq!(terms, [1, 2, 3, 4]);
    last.sigterm();
    assert!(last.wait_exit(SECS(30)).success());
    let floor = floor_term(&t.rt, &t.admin, &t.ns).expect("a floor");
    let before = t.lease("demo").expect("the Lease");
    println!("terms {terms:?}, floor {floor}");
    assert!(floor >= 4, "{floor}");

    // With no host running, the Lease is replaced in place as `kubectl
    // replace` or a GitOps tool does with its manifest: the same object
    // (uid), leaseTransitions 0, no holder.
    // (With the live resourceVersion, which an update of a Lease needs and
    // which such tools fill in.)
    let manifest = Lease {
        metadata: ObjectMeta {
            name: Some("demo".into()),
            resource_version: before.metadata.resource_version.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            lease_duration_seconds: Some(4),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    let replaced =
        t.rt.block_on(t.ns.leases().replace("demo", &PostParams::default(), &manifest))
            .expect("replace");
    assert_eq!(replaced.metadata.uid, before.metadata.uid, "the same object");
    assert_eq!(spec_of(&replaced).lease_transitions, Some(0));

    // The next host leads above every term used and above the floor.
    let e = host("reset-e", &cfg);
    let next = started_term(&e, SystemTime::UNIX_EPOCH);
    println!("after the reset: term {next}");
    assert!(
        next > 4 && next > floor,
        "term {next} after terms {terms:?} and floor {floor}; the host logged:\n{}",
        e.output()
    );
    let lease = t.lease("demo").unwrap();
    assert_eq!(spec_of(&lease).lease_transitions, Some(next as i32));
    assert!(floor_term(&t.rt, &t.admin, &t.ns).unwrap() >= next);
    let warned = reset_warning(&e).expect("a warning about the reset");
    println!("warned: {}", warned.json);
    assert_eq!(warned.str("lease"), Some("demo"));
    assert_eq!(warned.u64("lease_transitions"), Some(0));
    assert_eq!(warned.u64("floor"), Some(floor));
}

#[test]
fn a_floor_deleted_while_its_lease_lives_is_made_again_before_the_lease_is_deleted() {
    let t = KubeTest::new("refloor");
    let cfg = floor_config(&t.ns, &t.env, &t.scratch);
    let floors: kube::Api<ConfigMap> = kube::Api::namespaced(t.admin.clone(), &t.ns.name);
    let name = baton::store::kube::floor_name("demo");

    let (terms, mut last) = lead_in_turn(&cfg, &["refloor-a", "refloor-b", "refloor-c"]);
    assert_eq!(terms, [1, 2, 3]);
    let used = *terms.last().unwrap();

    // The floor ConfigMap is deleted while the Lease lives and is held: the
    // holder makes it again, from the Lease, within about a lease duration.
    t.rt.block_on(floors.delete(&name, &DeleteParams::default()))
        .unwrap();
    let deleted_at = Instant::now();
    let remade = loop {
        if let Some(f) = floor_term(&t.rt, &t.admin, &t.ns) {
            break f;
        }
        // About a lease duration; the bound is for a slow machine.
        assert!(
            deleted_at.elapsed() < LD * 2 + SECS(5),
            "the floor was not made again within {:?}; the holder logged:\n{}",
            LD * 2 + SECS(5),
            last.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "floor deleted while held at term {used}: made again after {:.1} s at {remade}",
        deleted_at.elapsed().as_secs_f64()
    );
    assert!(remade >= used, "{remade}");

    // Every host stops, then the Lease is deleted too: nobody running
    // remembers the term; the floor does.
    last.sigterm();
    assert!(last.wait_exit(SECS(30)).success());
    t.rt.block_on(t.ns.leases().delete("demo", &DeleteParams::default()))
        .unwrap();
    let d = host("refloor-d", &cfg);
    let next = started_term(&d, SystemTime::UNIX_EPOCH);
    println!("then the Lease deleted with no host running: the next host leads in term {next}");
    assert!(next > used, "term {next} after terms {terms:?}");
}

#[test]
fn a_lease_reset_in_place_while_held_stops_its_holder_and_terms_go_on_above() {
    let t = KubeTest::new("heldreset");
    let (_, mut hosts) = t.three_hosts();
    settled(&hosts);
    // One hand-over first, so that the floor reserves terms above the
    // current one for this very Lease object.
    let first = running(&hosts).pop().expect("a leader");
    let first = hosts.iter().position(|h| h.name == first).unwrap();
    let stopped = hosts[first].sigterm();
    let (_, taken) = wait_any(&hosts, SECS(15), "the hand-over", stopped, is_start);
    assert!(hosts[first].wait_exit(SECS(30)).success());
    std::thread::sleep(Duration::from_secs(1));
    let leader = running(&hosts).pop().expect("a leader");
    let term = taken.guest_term().unwrap();
    let floor = floor_term(&t.rt, &t.admin, &t.ns).expect("a floor");
    assert!(floor > term, "terms reserved: floor {floor}, term {term}");

    // `kubectl edit` as a person would: leaseTransitions set to 0, the
    // holder, its annotation and its duration left as they are, a fresh
    // renewTime (read, modify, write with the resourceVersion read).
    let reset_at = loop {
        let mut lease = t.lease("demo").unwrap();
        let spec = lease.spec.get_or_insert_default();
        spec.lease_transitions = Some(0);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        let at = SystemTime::now();
        match t
            .rt
            .block_on(t.ns.leases().replace("demo", &PostParams::default(), &lease))
        {
            Ok(written) => {
                assert_eq!(
                    spec_of(&written).holder_identity.as_deref(),
                    Some(leader.as_str())
                );
                break at;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("reset: {e}"),
        }
    };

    // Its holder no longer holds it in its term: it stops its guest at
    // once, as it sees the written Lease (its watch, or its next renewal's
    // conflict), not at the renew deadline of a renewal it could not make
    // (the milliseconds are a figure).
    let holder = hosts.iter().find(|h| h.name == leader).unwrap();
    let stopped = holder.wait_for(SECS(15), "the old term's guest stopped", |e| {
        e.at >= reset_at && e.is(STOPPED, Some("probe"))
    });
    let down = holder.wait_for(SECS(15), "the old term's end", |e| {
        e.at >= reset_at && e.message() == "stepping down"
    });
    println!(
        "reset to leaseTransitions 0 while {leader} led term {term}: its guest stopped {:.0} ms later ({}); \
         it stepped down: {}",
        ms_between(reset_at, stopped.at),
        stopped.str("how").unwrap_or_default(),
        down.str("reason").unwrap_or_default()
    );
    assert_eq!(down.u64("term"), Some(term), "{:?}", down.json);
    assert!(
        [
            "the lease was taken over, overwritten or deleted",
            "the lease was written by another host"
        ]
        .contains(&down.str("reason").unwrap_or_default()),
        "stepped down for another reason than the written Lease: {:?}",
        down.json
    );

    // The next term, on whichever host, is above the old one and the floor.
    let (idx, taken) = wait_any(
        &hosts,
        SECS(15),
        "a guest start after the reset",
        reset_at,
        is_start,
    );
    let next = taken.guest_term().unwrap();
    println!("then {} led term {next} (floor was {floor})", hosts[idx].name);
    assert!(
        next > term && next > floor,
        "term {next} after {term}, floor {floor}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_one_at_a_time(&hosts, &[]);
    assert_eq!(
        spec_of(&t.lease("demo").unwrap()).lease_transitions,
        Some(next as i32)
    );
}

#[test]
fn store_a_running_host_remembers_the_term_when_floor_and_lease_are_both_deleted() {
    let t = KubeTest::new("memfloor");
    t.rt.block_on(async {
        let floors: kube::Api<ConfigMap> = kube::Api::namespaced(t.admin.clone(), &t.ns.name);
        let a = t.store(&[]);
        let held = |holder: &str, term| LeaseRecord {
            instance: Some(format!("{holder}-instance")),
            ..record(Some(holder), term)
        };
        let v1 = a.create("demo", &held("a", 1)).await.unwrap();
        let v2 = a.update("demo", &v1.version, &held("a", 2)).await.unwrap();
        a.update("demo", &v2.version, &record(None, 2)).await.unwrap();
        // A watching host that saw term 2, released.
        let b = t.store(&[]);
        assert_eq!(b.get("demo").await.unwrap().unwrap().record.term, 2);

        // The floor, then the Lease, deleted while no host holds it.
        floors
            .delete(&baton::store::kube::floor_name("demo"), &DeleteParams::default())
            .await
            .unwrap();
        t.ns.leases()
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();

        // Both stores that saw term 2 read the lease as released at 2, and
        // the next term, created at 3, makes the floor again.
        for s in [&a, &b] {
            let gone = s.get("demo").await.unwrap().expect("released at the term seen");
            assert!(gone.version.starts_with(TOMBSTONE), "{}", gone.version);
            assert_eq!((gone.record.holder(), gone.record.term), (None, 2));
        }
        let gone = b.get("demo").await.unwrap().unwrap();
        let created = b.update("demo", &gone.version, &held("b", 3)).await.unwrap();
        assert_eq!(created.record.term, 3);
        let floor = floor_of(&t.admin, &t.ns.name, "demo")
            .await
            .expect("a floor again");
        assert_eq!(floor.get("floor").map(String::as_str), Some("3"));
        // A host that saw nothing can know nothing more than the floor.
        let c = t.store(&[]);
        assert_eq!(c.get("demo").await.unwrap().unwrap().record.term, 3);
    });
}
