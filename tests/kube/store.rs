//! The store itself against the API server, beyond the contract
//! (`tests/store_contract.rs`): foreign Leases read leniently, the watch
//! and its resumption, the fallback duration, labels, permissions.

use super::*;

#[test]
fn store_reads_foreign_leases_leniently_and_never_erases_their_fields() {
    let t = KubeTest::new("store");
    t.rt.block_on(async {
        let store = t.store(&[("app", "baton")]);
        let leases = t.ns.leases();
        assert_eq!(store.get("missing").await.unwrap(), None);

        // Holder null, no duration, no times, no transitions, no spec fields.
        leases
            .create(
                &PostParams::default(),
                &foreign_lease("bare", LeaseSpec::default()),
            )
            .await
            .unwrap();
        let v = store.get("bare").await.unwrap().unwrap();
        assert_eq!(v.record.holder(), None);
        assert_eq!(v.record.term, 0);
        assert_eq!(v.record.renew_time, None);
        assert_eq!(
            v.record.lease_duration,
            Duration::from_secs(15),
            "the fallback duration"
        );

        // Empty holder; a holder without duration or renew time.
        for (name, holder) in [("empty", ""), ("nodur", "someone")] {
            let spec = LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_transitions: Some(5),
                ..LeaseSpec::default()
            };
            leases
                .create(&PostParams::default(), &foreign_lease(name, spec))
                .await
                .unwrap();
            let v = store.get(name).await.unwrap().unwrap();
            assert_eq!(v.record.holder(), (!holder.is_empty()).then_some(holder));
            assert_eq!(v.record.term, 5);
            assert_eq!(v.record.lease_duration, Duration::from_secs(15));
        }

        // Writing keeps the foreign labels and annotations, adds ours.
        let v = store.get("nodur").await.unwrap().unwrap();
        let w = store
            .update("nodur", &v.version, &record(Some("me"), 6))
            .await
            .unwrap();
        assert_eq!(w.record.holder(), Some("me"));
        assert_eq!(w.record.term, 6);
        let l = leases.get("nodur").await.unwrap();
        let labels = l.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("team").map(String::as_str), Some("other"));
        assert_eq!(labels.get("app").map(String::as_str), Some("baton"));
        assert_eq!(
            l.metadata
                .annotations
                .unwrap()
                .get("other.example/owner")
                .map(String::as_str),
            Some("keep me")
        );
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        assert_eq!(spec.lease_transitions, Some(6));
        assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());

        // A release: empty holder, 1 s.
        let released = LeaseRecord {
            renew_time: Some(SystemTime::now()),
            ..LeaseRecord::new(None, 6, Duration::from_secs(1))
        };
        let r = store.update("nodur", &w.version, &released).await.unwrap();
        let spec = leases.get("nodur").await.unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.acquire_time, None);

        // Compare-and-swap: a stale version conflicts and writes nothing.
        let err = store
            .update("nodur", &w.version, &record(Some("late"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        // A store that has not seen the object reads it first.
        let fresh = t.store(&[]);
        let err = fresh
            .update("nodur", &w.version, &record(Some("late"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(store.get("nodur").await.unwrap().unwrap().version, r.version);
        let again = fresh
            .update("nodur", &r.version, &record(Some("fresh"), 7))
            .await
            .unwrap();
        let l = leases.get("nodur").await.unwrap();
        assert_eq!(
            l.metadata.labels.unwrap().get("team").map(String::as_str),
            Some("other")
        );
        assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("fresh"));
        // Creating an existing lease conflicts; updating a deleted one too.
        assert!(
            store
                .create("nodur", &record(None, 0))
                .await
                .unwrap_err()
                .is_conflict()
        );
        leases.delete("nodur", &DeleteParams::default()).await.unwrap();
        let err = store
            .update("nodur", &again.version, &record(Some("me"), 8))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        // Deleted while held by "fresh": read as still held by it, under a
        // version of its own, until it is re-created through that version
        // (once: a second try conflicts).
        let tombstone = fresh.get("nodur").await.unwrap().expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE));
        assert_eq!(tombstone.record.holder(), Some("fresh"));
        assert_eq!(tombstone.record.term, 7);
        fresh
            .update("nodur", &tombstone.version, &record(Some("fresh"), 7))
            .await
            .unwrap();
        let err = fresh
            .update("nodur", &tombstone.version, &record(Some("fresh"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(
            leases
                .get("nodur")
                .await
                .unwrap()
                .spec
                .unwrap()
                .holder_identity
                .as_deref(),
            Some("fresh")
        );
        leases.delete("nodur", &DeleteParams::default()).await.unwrap();
        // Terms beyond int32 are refused, never wrapped.
        let err = store
            .create("big", &record(Some("me"), 1 << 31))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Refused { .. }), "{err}");

        // Listing sees the labelled ones only when labels are configured.
        let listed: Vec<String> = store.list().await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(listed.is_empty(), "nothing left with app=baton: {listed:?}");
        let listed: Vec<String> = fresh.list().await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, vec!["bare".to_owned(), "empty".to_owned()]);
    });
}

#[test]
fn store_watch_yields_the_current_record_then_every_change_and_never_goes_back() {
    let t = KubeTest::new("watch");
    t.rt.block_on(async {
        let watcher = t.store(&[]);
        let writer = t.store(&[]);

        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(
            next_within(&mut watch, 10).await,
            None,
            "first the current state: none"
        );
        let mut current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));
        let mut latencies = Vec::new();
        for i in 0..10 {
            let started = Instant::now();
            current = writer
                .update("demo", &current.version, &record(Some("a"), 2 + i))
                .await
                .unwrap();
            assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));
            latencies.push(started.elapsed().as_secs_f64() * 1e3);
        }
        println!("watch: write to event {}", summary(latencies));

        // The current record comes first when watching starts.
        let mut second = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut second, 10).await, Some(current.clone()));
        drop(second);

        // Deletion of a held Lease: its last record, still held, under a
        // version of its own; at the highest term reserved for it (term 2
        // reserved up to 17, and another host's term may have started
        // unseen: its holder is waited out the same way).
        t.ns.leases()
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        let tombstone = next_within(&mut watch, 10).await.expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
        let reserved = 2 + RESERVED_TERMS - 1;
        assert_eq!(
            tombstone.record,
            LeaseRecord {
                plugins: None,
                yielded: None,
                term: reserved,
                ..current.record.clone()
            }
        );
        // A watch started now, and a read, say the same.
        let mut third = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut third, 10).await, Some(tombstone.clone()));
        drop(third);
        assert_eq!(watcher.get("demo").await.unwrap(), Some(tombstone.clone()));
        // Created again above it, released, deleted again: released at its
        // term floor, so the next term is above it.
        let released = record(None, reserved + 1);
        let back = watcher
            .update("demo", &tombstone.version, &released)
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(back.clone()));
        t.ns.leases()
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        let floor = next_within(&mut watch, 10).await.expect("the floor record");
        assert_eq!(floor.version, format!("{TOMBSTONE}term-{}", reserved + 1));
        assert_eq!((floor.record.holder(), floor.record.term), (None, reserved + 1));
        assert_eq!(watcher.get("demo").await.unwrap(), Some(floor.clone()));

        // The watcher's own writes are news before their events arrive:
        // the stream never goes back to an older version.
        let created = watcher
            .update("demo", &floor.version, &record(Some("w"), reserved + 2))
            .await
            .unwrap();
        let updated = watcher
            .update("demo", &created.version, &record(Some("w"), reserved + 3))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(updated.clone()));
        let quiet = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
        assert!(quiet.is_err(), "nothing else: {quiet:?}");
        // Same for a watch started before writes it has not yielded yet.
        let mut late = watcher.watch("demo").await.unwrap();
        let newer = watcher
            .update("demo", &updated.version, &record(Some("w"), reserved + 4))
            .await
            .unwrap();
        assert_eq!(next_within(&mut late, 10).await, Some(newer));
    });
}

/// A watch on a new Lease "demo" that the server ends every 2 s, after its
/// first observation; the store that created the Lease, and the request
/// counts from before the watch started.
struct ShortWatch {
    writer: KubeStore,
    current: Versioned,
    before: std::collections::BTreeMap<String, f64>,
    watch: LeaseWatch,
}

impl ShortWatch {
    async fn start(admin: &kube::Client, ns: &TestNamespace) -> ShortWatch {
        let options = KubeOptions {
            fallback_duration: Duration::from_secs(15),
            request_timeout: Duration::from_secs(2),
            watch_timeout_secs: Some(2),
            ..KubeOptions::default()
        };
        let watcher = KubeStore::with_client(admin.clone(), &ns.name, "test".into(), &options);
        let writer = store(admin.clone(), &ns.name, &[]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let before = lease_requests(admin).await;
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));
        ShortWatch {
            writer,
            current,
            before,
            watch,
        }
    }
}

#[test]
fn store_watch_is_resumed_after_the_server_ends_it_without_listing_again() {
    let t = KubeTest::new("resume");
    t.rt.block_on(async {
        let ShortWatch {
            writer,
            mut current,
            before,
            mut watch,
        } = ShortWatch::start(&t.admin, &t.ns).await;
        // Four server-side watch timeouts pass, quietly (about 8.5 s on an
        // idle machine; waited for, however long a busy one takes), then
        // changes still arrive: the watch was resumed each time. The
        // watches are counted against the time the window took (from
        // `before`, which ShortWatch::start read, to the count below).
        let window = Instant::now();
        loop {
            let quiet = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
            assert!(quiet.is_err(), "nothing changed: {quiet:?}");
            let watches = delta(&before, &lease_requests(&t.admin).await)
                .get("WATCH")
                .copied()
                .unwrap_or(0);
            if watches >= 4 {
                break;
            }
            assert!(
                window.elapsed() < SECS(60),
                "the watch was not resumed four times: {watches} watches ended"
            );
        }
        for i in 0..3 {
            current = writer
                .update("demo", &current.version, &record(Some("a"), 2 + i))
                .await
                .unwrap();
            assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));
        }
        let requests = delta(&before, &lease_requests(&t.admin).await);
        // The start's first watch and its first event came before `window`
        // began: a second of slack for them.
        let elapsed = window.elapsed() + SECS(1);
        println!("watch with a 2 s server timeout, over {elapsed:.1?}: {requests:?}");
        let count = |verb: &str| requests.get(verb).copied().unwrap_or(0);
        assert_eq!(
            count("LIST"),
            1,
            "listed once, when the watch started: {requests:?}"
        );
        // At least the four the quiet 8.5 s hold; at most one per 2 s of
        // the window, and the first and the one still open.
        let most = elapsed.as_secs() / 2 + 2;
        assert!(
            (4..=most).contains(&count("WATCH")),
            "resumed every 2 s ({most} at most over {elapsed:.1?}): {requests:?}"
        );
        assert_eq!(count("GET"), 0, "{requests:?}");
    });
}

#[test]
fn store_watch_stays_current_through_a_busy_watch_cache_without_listing_again() {
    let t = KubeTest::new("busy");
    t.rt.block_on(async {
        let ShortWatch {
            writer,
            current,
            before,
            mut watch,
        } = ShortWatch::start(&t.admin, &t.ns).await;
        // 300 writes to another Lease while "demo" stays quiet, more than
        // the API server's watch cache starts with for leases (100 events;
        // it may grow under load). Every resume (the server ends the watch
        // every 2 s) must still succeed without an error or a new list:
        // the store resumes from the newest resourceVersion it knows,
        // which the bookmarks it asks for keep current. (This does not
        // force a 410 Gone; none could be provoked on this server.)
        let mut noise = writer.create("noise", &record(Some("n"), 1)).await.unwrap();
        for i in 0..300 {
            noise = writer
                .update("noise", &noise.version, &record(Some("n"), 2 + i))
                .await
                .unwrap();
        }
        let quiet = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
        assert!(
            quiet.is_err(),
            "no error and no event for the quiet Lease: {quiet:?}"
        );
        let changed = writer
            .update("demo", &current.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(changed));
        let requests = delta(&before, &lease_requests(&t.admin).await);
        println!("watch through 300 foreign writes and 2 s server timeouts: {requests:?}");
        assert_eq!(
            requests.get("LIST").copied().unwrap_or(0),
            1,
            "listed once, when the watch started: {requests:?}"
        );
    });
}

#[test]
fn a_lease_without_duration_reads_with_the_fallback_the_stores_timings_set_after_a_reload() {
    let t = KubeTest::new("fallback");
    t.rt.block_on(async {
        // Opened with a fallback of 15 s (the longest lease of a host).
        let store = t.store(&[("app", "baton")]);
        let written = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut watch = store.watch("demo").await.unwrap();
        let first = next_within(&mut watch, 10).await.expect("the Lease");
        assert_eq!(first.version, written.version);
        // A foreign holder that promised no duration, in the shared watch's
        // selection.
        let labels = [(ROLE_LABEL, LEASE_ROLE), ("app", "baton")];
        let foreign = |term| LeaseSpec {
            holder_identity: Some("foreign".into()),
            lease_transitions: Some(term),
            ..LeaseSpec::default()
        };
        foreign_write(&t.ns, "demo", &labels, foreign(2)).await;
        let seen = next_within(&mut watch, 10).await.expect("the foreign write");
        assert_eq!(seen.record.holder(), Some("foreign"));
        assert_eq!(seen.record.lease_duration, Duration::from_secs(15), "watched");
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(15), "read");

        // A reload made the longest lease 40 s: what is read from then on
        // reads so, by get, list and the watch already open.
        store.set_timings(StoreTimings {
            fallback_duration: Duration::from_secs(40),
            request_timeout: Duration::from_secs(1),
        });
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(40), "read after");
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            listed[0].1.record.lease_duration,
            Duration::from_secs(40),
            "listed after"
        );
        foreign_write(&t.ns, "demo", &labels, foreign(3)).await;
        let seen = next_within(&mut watch, 10)
            .await
            .expect("the second foreign write");
        assert_eq!(seen.record.term, 3);
        assert_eq!(
            seen.record.lease_duration,
            Duration::from_secs(40),
            "watched after"
        );
        // A Lease with a duration reads with its own, as ever.
        store
            .update("demo", &seen.version, &record(Some("b"), 4))
            .await
            .unwrap();
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(4));
    });
}

#[test]
fn store_watch_follows_leases_without_its_labels_and_never_reads_a_dropped_label_as_a_deletion() {
    let t = KubeTest::new("unlabeled");
    t.rt.block_on(async {
        let watcher = t.store(&[("app", "baton")]);
        let writer = t.store(&[("app", "baton")]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let labels = t.ns.leases().get("demo").await.unwrap().metadata.labels.unwrap();
        assert_eq!(
            labels.get("baton.dev/role").map(String::as_str),
            Some("lease"),
            "baton labels every Lease it writes: {labels:?}"
        );
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(current.clone()));

        // The labels dropped (the shared watch, which selects by them, says
        // DELETED): the Lease is read as it is, still held, not deleted.
        let how = t.env.drop_labels(&t.ns, "demo", &["baton.dev/role", "app"]).await;
        let dropped = t.ns.leases().get("demo").await.unwrap();
        let seen = next_within(&mut watch, 10).await.expect("the Lease, not a deletion");
        println!("labels dropped by {how}: read as {seen:?}");
        assert_eq!(Some(&seen.version), dropped.metadata.resource_version.as_ref());
        assert!(!seen.version.starts_with(TOMBSTONE));
        assert_eq!((seen.record.holder(), seen.record.term), (Some("a"), 1));

        // Without the labels, every change is still seen.
        let before = lease_requests(&t.admin).await;
        for i in 0..3 {
            let version = foreign_write(&t.ns, "demo", &[("team", "other")], held_by("foreign", 10 + i, 60)).await;
            let seen = next_within(&mut watch, 10).await.unwrap();
            assert_eq!(seen.version, version);
            assert_eq!((seen.record.holder(), seen.record.term), (Some("foreign"), 10 + i as u64));
        }
        let requests = delta(&before, &lease_requests(&t.admin).await);
        println!("three foreign writes (each a GET and a PUT) of a Lease without baton's labels, watched: {requests:?}");

        // Baton's next write puts the labels back (keeping the foreign one);
        // changes go on being seen, through the shared watch again.
        let foreign = watcher.get("demo").await.unwrap().unwrap();
        let written = writer
            .update("demo", &foreign.version, &record(Some("b"), 13))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 10).await, Some(written.clone()));
        let labels = t.ns.leases().get("demo").await.unwrap().metadata.labels.unwrap();
        for (k, v) in [("baton.dev/role", "lease"), ("app", "baton"), ("team", "other")] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
        }
        let version = foreign_write(
            &t.ns,
            "demo",
            &[("baton.dev/role", "lease"), ("app", "baton")],
            held_by("c", 14, 4),
        )
        .await;
        assert_eq!(next_within(&mut watch, 10).await.unwrap().version, version);

        // A Lease someone else created without the labels, before the
        // watch started, and one created after: both followed.
        t.ns.leases()
            .create(&PostParams::default(), &foreign_lease("pre", held_by("x", 3, 60)))
            .await
            .unwrap();
        let mut pre = watcher.watch("pre").await.unwrap();
        let first = next_within(&mut pre, 10).await.unwrap();
        assert_eq!((first.record.holder(), first.record.term), (Some("x"), 3));
        let version = foreign_write(&t.ns, "pre", &[], held_by("y", 4, 60)).await;
        assert_eq!(next_within(&mut pre, 10).await.unwrap().version, version);
        let mut late = watcher.watch("late").await.unwrap();
        assert_eq!(next_within(&mut late, 10).await, None);
        t.ns.leases()
            .create(&PostParams::default(), &foreign_lease("late", held_by("z", 5, 60)))
            .await
            .unwrap();
        let created = next_within(&mut late, 10).await.unwrap();
        assert_eq!((created.record.holder(), created.record.term), (Some("z"), 5));
        // And deleted while held: its last record, held, as for any Lease.
        t.ns.leases()
            .delete("pre", &DeleteParams::default())
            .await
            .unwrap();
        let tombstone = next_within(&mut pre, 10).await.expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
        assert_eq!(tombstone.record.holder(), Some("y"));
        // The other watches heard nothing of all that.
        for w in [&mut watch, &mut late] {
            let quiet = tokio::time::timeout(Duration::from_millis(300), w.next()).await;
            assert!(quiet.is_err(), "nothing else: {quiet:?}");
        }
    });
}

#[test]
fn store_requests_without_permission_are_refused_naming_user_verb_and_resource() {
    let t = KubeTest::new("denied");
    t.rt.block_on(async {
        let nobody = store(t.env.client(&t.env.kubeconfig("nobody")).await, &t.ns.name, &[]);
        // A create raises the lease's term floor (a ConfigMap) first.
        for (verb, resource, err) in [
            ("get", "leases", nobody.get("demo").await.unwrap_err()),
            (
                "get",
                "configmaps",
                nobody.create("demo", &record(Some("x"), 1)).await.unwrap_err(),
            ),
            (
                "list",
                "leases",
                nobody.watch("demo").await.err().expect("refused"),
            ),
        ] {
            println!("{verb}: {err}");
            match &err {
                StoreError::Refused { lease, detail } => {
                    assert_eq!(lease, "demo");
                    assert!(detail.starts_with("forbidden: "), "{detail}");
                    assert!(
                        detail.contains(&format!("User \"nobody\" cannot {verb} resource \"{resource}\"")),
                        "{detail}"
                    );
                    assert!(
                        detail.contains(&format!("namespace \"{}\"", t.ns.name)),
                        "{detail}"
                    );
                    if resource == "configmaps" {
                        assert!(
                            detail.contains("baton-terms.demo") && detail.contains("role.yaml"),
                            "{detail}"
                        );
                    }
                }
                other => panic!("{verb}: expected Refused, got {other:?}"),
            }
        }
    });
}
