//! Terms and their floors: terms never repeat after Leases are deleted,
//! with or without a host running; a watch resumed after a compaction.

use std::collections::BTreeMap;

use super::*;

#[test]
fn store_terms_never_repeat_after_the_lease_is_deleted_even_with_no_host_running() {
    let t = KubeTest::new("floor");
    t.rt.block_on(async {
        let fresh = || t.store(&[]);
        let a = fresh();
        let v1 = a.create("demo", &held("a", 1)).await.unwrap();
        let v2 = a.update("demo", &v1.version, &held("a", 2)).await.unwrap();
        a.update("demo", &v2.version, &record(None, 2)).await.unwrap();
        let floor = floor_of(&t.admin, &t.ns.name, "demo")
            .await
            .expect("a floor ConfigMap");
        println!("floor after terms 1 and 2: {floor:?}");
        // Term 2 reserved the terms up to 2 + 15.
        let reserved = 2 + RESERVED_TERMS - 1;
        assert_eq!(floor.get("floor"), Some(&reserved.to_string()));
        assert_eq!(floor.get("creates").map(String::as_str), Some("1"));

        // Every Lease deleted while no host runs.
        let how = t.env.delete_all_leases(&t.ns).await;
        println!("deleted with {how}");
        assert!(t.ns.leases().get_opt("demo").await.unwrap().is_none());

        // A store that never saw the Lease (a host started now) reads it as
        // released at its floor; the ConfigMap is no Lease, so status lists
        // nothing.
        let seen = fresh().get("demo").await.unwrap().expect("the floor record");
        assert_eq!((seen.record.holder(), seen.record.term), (None, reserved));
        assert!(seen.version.starts_with(TOMBSTONE), "{}", seen.version);
        assert!(fresh().list().await.unwrap().is_empty());

        // Two such hosts race for the next term: one creates the Lease, the
        // other is refused, though the Lease did not exist when it looked.
        let next = reserved + 1;
        let (b, c) = (fresh(), fresh());
        let vb = b.get("demo").await.unwrap().unwrap();
        let vc = c.get("demo").await.unwrap().unwrap();
        let won = b.update("demo", &vb.version, &held("b", next)).await.unwrap();
        assert_eq!(won.record.term, next);
        let lost = c.update("demo", &vc.version, &held("c", next)).await.unwrap_err();
        println!("the loser of the race for term {next}: {lost}");
        assert!(lost.is_conflict(), "{lost:?}");
        let floor = floor_of(&t.admin, &t.ns.name, "demo").await.unwrap();
        assert_eq!(floor.get("floor"), Some(&next.to_string()));
        assert_eq!(floor.get("creates").map(String::as_str), Some("2"));

        // Deleted again while held, seen by a watch: the holder's record,
        // as a tombstone.
        let watcher = fresh();
        let mut w = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut w, 10).await.unwrap().record.holder(), Some("b"));
        t.env.delete_all_leases(&t.ns).await;
        let gone = next_within(&mut w, 10).await.expect("the tombstone");
        assert!(gone.version.starts_with(TOMBSTONE), "{}", gone.version);
        assert_eq!((gone.record.holder(), gone.record.term), (Some("b"), next));

        // Re-created by another writer with leaseTransitions 0: a new term
        // is refused once, the Lease then reads at its floor, and the next
        // term is above it.
        let spec = LeaseSpec {
            holder_identity: Some("foreign".into()),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
        t.ns.leases()
            .create(&PostParams::default(), &foreign_lease("demo", spec))
            .await
            .unwrap();
        let d = fresh();
        let foreign = d.get("demo").await.unwrap().unwrap();
        assert_eq!(foreign.record.term, 0);
        let refused = d
            .update("demo", &foreign.version, &held("d", 1))
            .await
            .unwrap_err();
        println!("a term below the floor: {refused}");
        assert!(refused.is_conflict(), "{refused:?}");
        assert!(
            refused.to_string().contains(&format!("highest term ({next}")),
            "{refused}"
        );
        let reread = d.get("demo").await.unwrap().unwrap();
        assert_eq!(
            (reread.version.as_str(), reread.record.term),
            (foreign.version.as_str(), next)
        );
        let above = d
            .update("demo", &reread.version, &held("d", next + 1))
            .await
            .unwrap();
        assert_eq!(above.record.term, next + 1);
        let lease = t.ns.leases().get("demo").await.unwrap();
        assert_eq!(spec_of(&lease).lease_transitions, Some(next as i32 + 1));

        // A floor garbled by hand is refused, naming the ConfigMap and the
        // fix, and never reset.
        let floors: kube::Api<ConfigMap> = kube::Api::namespaced(t.admin.clone(), &t.ns.name);
        let mut cm = floors.get("baton-terms.demo").await.unwrap();
        cm.data.as_mut().unwrap().insert("floor".into(), "four".into());
        floors
            .replace("baton-terms.demo", &PostParams::default(), &cm)
            .await
            .unwrap();
        t.env.delete_all_leases(&t.ns).await;
        let err = fresh().get("demo").await.unwrap_err();
        println!("a garbled floor: {err}");
        let text = err.to_string();
        assert!(matches!(err, StoreError::Malformed { .. }), "{err:?}");
        assert!(
            text.contains(&format!("ConfigMap {}/baton-terms.demo", t.ns.name)),
            "{text}"
        );
        assert!(
            text.contains("\"four\"") && text.contains("kubectl edit configmap"),
            "{text}"
        );
        let err = fresh().create("demo", &held("e", 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Malformed { .. }), "{err:?}");
        assert_eq!(
            floor_of(&t.admin, &t.ns.name, "demo")
                .await
                .unwrap()
                .get("floor")
                .map(String::as_str),
            Some("four")
        );
    });
}

#[test]
fn a_create_that_lost_the_race_takes_its_count_back_and_no_term_is_skipped() {
    // Two hosts start on a lease that does not exist. One counts its create
    // in the floor and creates the Lease in term 1; the other read the
    // floor of that count before the Lease appeared (a missing Lease reads
    // as released at its floor), so it counts a create in term 2, and the
    // API server refuses its Lease: AlreadyExists. That count must not be
    // taken for a term given out, or the next hand-over skips term 2.
    let t = KubeTest::new("count");
    t.rt.block_on(async {
        let (a, b) = (t.store(&[]), t.store(&[]));
        let v1 = a.create("demo", &held("a", 1)).await.unwrap();
        let lost = b.create("demo", &held("b", 2)).await.unwrap_err();
        println!("the create that lost: {lost}");
        assert!(lost.is_conflict(), "{lost:?}");
        // Taken back in the background: the floor is 1 again, the count stays.
        let start = std::time::Instant::now();
        let floor = loop {
            let floor = floor_of(&t.admin, &t.ns.name, "demo").await.unwrap();
            if floor.get("floor").map(String::as_str) == Some("1") {
                break floor;
            }
            assert!(
                start.elapsed() < SECS(15),
                "the count was not taken back: {floor:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(floor.get("creates").map(String::as_str), Some("2"), "{floor:?}");
        // The holder releases; the other takes the next term, 2.
        let released = a.update("demo", &v1.version, &record(None, 1)).await.unwrap();
        let next = b.update("demo", &released.version, &held("b", 2)).await.unwrap();
        assert_eq!(next.record.term, 2);
    });
}

#[test]
fn terms_never_repeat_when_every_lease_is_deleted_while_no_host_runs() {
    let t = KubeTest::new("terms");
    let cfg = t.scratch.write(
        "baton.toml",
        &t.config("demo", &[probe("probe", "pollable", "cooperative")]),
    );
    let host = |name: &str| Host::start_with(name, &cfg, &shared_cache_dir());
    let term_of = |h: &Host| {
        h.wait_for(SECS(60), "the guest's start", is_start)
            .guest_term()
            .expect("a term")
    };

    // Stopped cleanly (the Lease released), then every Lease deleted.
    let mut a = host("terms-a");
    let first = term_of(&a);
    a.sigterm();
    assert!(a.wait_exit(SECS(30)).success());
    let how = t.rt.block_on(t.env.delete_all_leases(&t.ns));
    assert!(t.lease("demo").is_none());
    let mut b = host("terms-b");
    let second = term_of(&b);
    println!("released at term {first}, every Lease deleted ({how}): the next host leads in term {second}");
    assert_eq!(second, first + 1);

    // Killed while holding it (never released), then every Lease deleted:
    // nobody is left to remember the term but the floor.
    b.sigkill();
    t.rt.block_on(t.env.delete_all_leases(&t.ns));
    let started = Instant::now();
    let c = host("terms-c");
    let third = term_of(&c);
    println!(
        "held at term {second} by a killed host, every Lease deleted: the next host leads in term {third} after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(third, second + 1);
    assert_eq!(
        spec_of(&t.lease("demo").unwrap()).lease_transitions,
        Some(third as i32)
    );
}

#[test]
fn a_watch_resumed_from_a_compacted_version_gets_410_gone_and_lists_afresh() {
    // No watch cache: watches are served by etcd itself, so a compaction
    // makes every older version too old, and no bookmark moves an idle
    // watch's version on.
    let server = OwnServer::start("--watch-cache=false");
    let t = KubeTest::on(server.env(), "gone");

    // The store: a watch of a Lease nobody writes, while other Leases
    // change (written by someone else, without baton's labels, so that the
    // store's shared watch, which selects by them, hears nothing and stays
    // at its version) and etcd is compacted past it. The server ends the
    // watch after 2 s; resumed from its version, it gets 410 and the
    // stream ends with it; a new watch lists afresh and follows changes
    // again.
    t.rt.block_on(async {
        let options = KubeOptions {
            fallback_duration: Duration::from_secs(15),
            request_timeout: Duration::from_secs(2),
            watch_timeout_secs: Some(2),
            ..KubeOptions::default()
        };
        let watcher = KubeStore::with_client(t.admin.clone(), &t.ns.name, "test".into(), &options);
        let writer = t.store(&[]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));
        t.ns.leases()
            .create(
                &PostParams::default(),
                &foreign_lease("other", held_by("b", 1, 60)),
            )
            .await
            .unwrap();
        let mut other = String::new();
        for i in 0..3 {
            other = foreign_write(&t.ns, "other", &[], held_by("b", 2 + i, 60)).await;
        }
        compact_etcd(&t.env, &other);
        let ended = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the resumed watch answers")
            .expect("an error, not the end");
        println!("a watch resumed from before a compaction: {ended:?}");
        match &ended {
            Err(StoreError::Unavailable { lease, detail }) => {
                assert_eq!(lease, "demo");
                assert!(detail.contains("410 Gone"), "{detail}");
            }
            other => panic!("expected 410 Gone as unavailable, got {other:?}"),
        }
        assert!(watch.next().await.is_none(), "the stream ends with the error");
        let mut again = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut again, 10).await, Some(current.clone()));
        let newer = writer
            .update("demo", &current.version, &record(Some("a"), 1))
            .await
            .unwrap();
        assert_eq!(next_within(&mut again, 10).await, Some(newer));
    });

    // A host following a Lease held by someone else (so nobody writes it):
    // its watch (resumed every lease duration) gets 410 after a compaction,
    // it polls and watches again, and takes the Lease as soon as it is
    // released.
    // In a second namespace.
    let ns = t.rt.block_on(TestNamespace::create(t.admin.clone(), "gone-host"));
    let spec = LeaseSpec {
        holder_identity: Some("someone-else".into()),
        lease_duration_seconds: Some(60),
        lease_transitions: Some(5),
        ..LeaseSpec::default()
    };
    t.rt.block_on(
        ns.leases()
            .create(&PostParams::default(), &foreign_lease("demo", spec)),
    )
    .unwrap();
    let cfg = t.scratch.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&t.env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let host = Host::start_with("gone-b", &cfg, &shared_cache_dir());
    host.wait_for(SECS(60), "following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    let writer = t.rt.block_on(async { store(t.admin.clone(), &ns.name, &[]) });
    let mut other =
        t.rt.block_on(writer.create("other", &record(Some("b"), 1)))
            .unwrap();
    for _ in 0..3 {
        other =
            t.rt.block_on(writer.update("other", &other.version, &record(Some("b"), 1)))
                .unwrap();
    }
    compact_etcd(&t.env, &other.version);
    let compacted = SystemTime::now();
    let broke = host.wait_for(SECS(30), "the watch's 410 Gone", |e| {
        e.message().starts_with("the lease watch broke") && e.str("error").is_some_and(|m| m.contains("410"))
    });
    println!(
        "a follower's watch got 410 Gone {:.0} ms after the compaction: {}",
        ms_between(compacted, broke.at),
        broke.str("error").unwrap()
    );
    let rewatched = host.wait_for(SECS(30), "watching again", |e| {
        e.message() == "watching the lease again" && e.at >= broke.at
    });
    println!(
        "it watched again {:.0} ms later",
        ms_between(broke.at, rewatched.at)
    );
    let mut lease = lease_of(&t.rt, &ns, "demo").unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
    let released = SystemTime::now();
    t.rt.block_on(ns.leases().replace("demo", &PostParams::default(), &lease))
        .unwrap();
    // Through the resumed watch: at once (the milliseconds are a figure),
    // well within a quarter of the 60 s foreign lease a host that missed
    // the release would wait out.
    let started = host.wait_for(SECS(30), "the guest's start", is_start);
    let took = ms_between(released, started.at);
    println!(
        "the Lease released: the host's guest started {took:.0} ms later, in term {:?}",
        started.guest_term()
    );
    assert!(
        took < 15_000.0,
        "started {took:.0} ms after the release: not through the watch (the foreign lease is 60 s)"
    );
    assert_eq!(started.guest_term(), Some(6));
}

#[test]
fn store_term_starts_and_idle_holders_make_no_floor_reads() {
    // A follower reads its leases' floors ahead, and a holder watches the
    // floors: a term start writes the floor, or finds that it covers the
    // term, without reading the ConfigMap first, and a holder reads no
    // floor while it renews (without the permission to watch, once per
    // lease duration).
    let t = KubeTest::new("ahead");
    t.rt.block_on(async {
        let (a, b) = (t.store(&[]), t.store(&[]));
        let v1 = a.create("demo", &held("a", 1)).await.unwrap();
        let mut wa = a.watch("demo").await.unwrap();
        let ahead = floor_requests(&t).await;
        let mut wb = b.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut wb, 10).await.unwrap().record.holder(), Some("a"));
        // The floor is read ahead in the background.
        read_ahead(&t, &ahead).await;
        let released = a.update("demo", &v1.version, &record(None, 1)).await.unwrap();
        let seen = until_version(&mut wb, &released.version).await;

        // Term 2 over the term-1 Lease: the floor must be raised (a create
        // counts, it reserves nothing), with one write and no read.
        let before = floor_requests(&t).await;
        let v2 = b.update("demo", &seen.version, &held("b", 2)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let raised = since(&t, &before).await;
        println!("floor requests of term 2's start: {raised:?}");
        assert_eq!(raised, BTreeMap::from([("PUT".to_owned(), 1)]));
        let floor = floor_of(&t.admin, &t.ns.name, "demo").await.unwrap();
        assert_eq!(floor.get("floor"), Some(&(1 + RESERVED_TERMS).to_string()));

        // Renewals: the first periodic check of the floor, a lease
        // duration after term 2's start wrote it, reads it once and starts
        // the floors' watch (one LIST); from then on renewals read nothing.
        let renew = |n: usize, mut last: Versioned| {
            let b = &b;
            async move {
                for _ in 0..n {
                    tokio::time::sleep(LD / 4).await;
                    last = b.update("demo", &last.version, &held("b", 2)).await.unwrap();
                }
                last
            }
        };
        let before = floor_requests(&t).await;
        let last = renew(5, v2).await;
        // The watch starts in the background: its listing is waited for
        // (a busy machine may start it after the last renewal).
        let waited = Instant::now();
        let listed = loop {
            let listed = delta(&before, &floor_requests(&t).await);
            if listed.get("LIST").is_some_and(|&n| n >= 1) || waited.elapsed() > SECS(15) {
                break listed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let first = since(&t, &before).await;
        println!(
            "floor requests of renewals over {:?}: {first:?}, all: {listed:?}",
            LD * 5 / 4
        );
        assert_eq!(first, BTreeMap::from([("GET".to_owned(), 1)]));
        assert!(listed.get("LIST").is_some_and(|&n| n >= 1), "{listed:?}");
        let before = floor_requests(&t).await;
        let last = renew(8, last).await;
        let idle = since(&t, &before).await;
        println!("floor requests of renewals over {:?}, watched: {idle:?}", LD * 2);
        assert!(idle.is_empty(), "{idle:?}");

        // The other store saw the floor raised and read it ahead: term 3 is
        // covered, and starts with no floor request.
        let ahead = floor_requests(&t).await;
        let released = b.update("demo", &last.version, &record(None, 2)).await.unwrap();
        let seen = until_version(&mut wa, &released.version).await;
        read_ahead(&t, &ahead).await;
        let before = floor_requests(&t).await;
        let v3 = a.update("demo", &seen.version, &held("a", 3)).await.unwrap();
        assert_eq!(v3.record.term, 3);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let covered = since(&t, &before).await;
        println!("floor requests of term 3's start: {covered:?}");
        assert!(covered.is_empty(), "{covered:?}");

        // Without list and watch on ConfigMaps (a Role older than the
        // floor watch): the floor is read ahead. One changed since (here
        // by hand) makes the write based on it a conflict (409), and the
        // term start reads the floor and writes again.
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
        let mut role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
        for rule in role.rules.iter_mut().flatten() {
            if rule.resources.iter().flatten().any(|r| r == "configmaps") {
                rule.verbs.retain(|v| v != "list" && v != "watch");
            }
        }
        t.ns.bind(role, "baton-a").await;
        let c = store(t.env.client(&t.env.kubeconfig("baton-a")).await, &t.ns.name, &[]);
        let v1 = a.create("other", &held("a", 1)).await.unwrap();
        let ahead = floor_requests(&t).await;
        let mut wc = c.watch("other").await.unwrap();
        assert_eq!(next_within(&mut wc, 10).await.unwrap().record.holder(), Some("a"));
        read_ahead(&t, &ahead).await;
        let floors: kube::Api<ConfigMap> = kube::Api::namespaced(t.admin.clone(), &t.ns.name);
        let mut cm = floors.get("baton-terms.other").await.unwrap();
        cm.metadata
            .annotations
            .get_or_insert_default()
            .insert("edited".into(), "by hand".into());
        floors
            .replace("baton-terms.other", &PostParams::default(), &cm)
            .await
            .unwrap();
        let released = a.update("other", &v1.version, &record(None, 1)).await.unwrap();
        let seen = until_version(&mut wc, &released.version).await;
        let before = floor_requests(&t).await;
        let v2 = c.update("other", &seen.version, &held("c", 2)).await.unwrap();
        assert_eq!(v2.record.term, 2);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stale = since(&t, &before).await;
        println!("floor requests of a term start on a stale floor: {stale:?}");
        let expected = [("GET", 1), ("PUT", 2)].map(|(verb, n)| (verb.to_owned(), n));
        assert_eq!(stale, BTreeMap::from(expected));
        let floor = floor_of(&t.admin, &t.ns.name, "other").await.unwrap();
        assert_eq!(floor.get("floor"), Some(&(1 + RESERVED_TERMS).to_string()));

        // Its floor is checked by reads, once per lease duration: the
        // watch is refused.
        let before = floor_requests(&t).await;
        let mut last = v2;
        for _ in 0..10 {
            tokio::time::sleep(LD / 4).await;
            last = c.update("other", &last.version, &held("c", 2)).await.unwrap();
        }
        let checks = since(&t, &before).await;
        println!(
            "floor requests of renewals over {:?}, the watch refused: {checks:?}",
            LD * 10 / 4
        );
        assert!(checks.get("GET").is_some_and(|&n| n >= 2), "{checks:?}");
    });
}

/// Waits until the API server has answered a read of a floor since
/// `before` (a store's read ahead, in the background: however long a busy
/// machine takes), then half a second more for the store to take in the
/// answer.
async fn read_ahead(t: &KubeTest, before: &BTreeMap<String, f64>) {
    let waited = Instant::now();
    loop {
        let reads = since(t, before).await.get("GET").copied().unwrap_or(0);
        if reads >= 1 {
            break;
        }
        assert!(waited.elapsed() < SECS(15), "no floor was read ahead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The API server's requests to ConfigMaps so far, per verb.
async fn floor_requests(t: &KubeTest) -> BTreeMap<String, f64> {
    requests_to(&t.admin, "configmaps").await
}

/// The reads and writes of ConfigMaps since `before` (GET, PUT, POST).
/// Watches are left out (one is counted when it ends, which its
/// server-side timeout decides), and so are listings: they start a watch,
/// and the API server counts them for every namespace (seen: a listing
/// of another's in a suite run).
async fn since(t: &KubeTest, before: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    let mut counts = delta(before, &floor_requests(t).await);
    counts.retain(|verb, _| ["GET", "PUT", "POST"].contains(&verb.as_str()));
    counts
}

/// A record of `holder` in `term`, with its instance.
fn held(holder: &str, term: u64) -> LeaseRecord {
    LeaseRecord {
        instance: Some(format!("{holder}-instance")),
        ..record(Some(holder), term)
    }
}

/// The watch's observations until the one at `version`.
async fn until_version(watch: &mut LeaseWatch, version: &str) -> Versioned {
    loop {
        let v = next_within(watch, 10).await.expect("an observation");
        if v.version == version {
            return v;
        }
    }
}
