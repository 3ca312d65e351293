//! The `LeaseStore` contract, written once: one public function per rule
//! the trait and its module documentation (`baton::store`) promise, run
//! against every store. `tests/core` runs it on the memory and embedded
//! stores, `tests/kube` on the Kubernetes store (each rule in a namespace
//! of its own); both include this file with `#[path]` and name each rule
//! through [`for_each_rule!`], so a rule added here runs everywhere.
//!
//! Each rule takes `open`, which opens another client of one and the same
//! empty store at each call: what another process would have, with its own
//! memory of what it saw (the deleted-records rules depend on it). A rule
//! only asserts what every store promises; what one backend does beyond
//! that (version formats, how far a term floor is raised, fault injection)
//! stays in that store's own tests.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton::store::{LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, TOMBSTONE, Versioned};
use futures::StreamExt;

/// Calls `$runner!(rule)` for every rule of the contract.
macro_rules! for_each_rule {
    ($runner:ident) => {
        $runner!(a_missing_lease_reads_as_none);
        $runner!(create_returns_what_every_client_then_reads);
        $runner!(create_of_an_existing_lease_conflicts);
        $runner!(update_swaps_only_the_current_version);
        $runner!(versions_never_repeat_even_across_a_delete);
        $runner!(delete_if_deletes_only_the_current_version);
        $runner!(a_record_deleted_while_held_reads_as_its_tombstone);
        $runner!(terms_never_repeat_after_a_delete);
        $runner!(list_returns_every_lease_that_exists);
        $runner!(watch_yields_the_current_record_then_every_change);
        $runner!(watch_never_goes_back_behind_the_stores_own_writes);
        $runner!(set_timings_keeps_a_records_own_duration);
        $runner!(invalid_lease_names_are_refused);
    };
}
pub(crate) use for_each_rule;

/// The duration of every record written here (whole seconds, as a
/// Kubernetes Lease holds it).
const DURATION: Duration = Duration::from_secs(4);
/// How long a watch may take to yield a change (an API server's watch).
const EVENT: Duration = Duration::from_secs(5);
/// How long a watch is listened to for a change that must not come.
const QUIET: Duration = Duration::from_millis(300);

/// A record as an elector writes it: renewed now, so that every write
/// differs from the last (an API server keeps the version of a write that
/// changes nothing), in whole microseconds (a Lease's `MicroTime`).
fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let micros = Duration::from_micros(since.as_micros().try_into().unwrap());
    let mut record = LeaseRecord::new(holder, term, DURATION);
    record.renew_time = Some(UNIX_EPOCH + micros);
    record
}

/// The watch's next observation, within [`EVENT`].
async fn next(watch: &mut LeaseWatch) -> Option<Versioned> {
    tokio::time::timeout(EVENT, watch.next())
        .await
        .expect("the watch yields in time")
        .expect("the watch goes on")
        .expect("no error")
}

/// The watch's next observation that differs from `previous` (a watch may
/// yield the same record again).
async fn next_change(watch: &mut LeaseWatch, previous: &Option<Versioned>) -> Option<Versioned> {
    loop {
        let seen = next(watch).await;
        if &seen != previous {
            return seen;
        }
    }
}

/// Asserts that the watch yields nothing but `current` for [`QUIET`].
async fn assert_quiet(watch: &mut LeaseWatch, current: &Option<Versioned>) {
    let deadline = tokio::time::Instant::now() + QUIET;
    while let Ok(seen) = tokio::time::timeout_at(deadline, watch.next()).await {
        let seen = seen.expect("the watch goes on").expect("no error");
        assert_eq!(&seen, current, "nothing changed");
    }
}

/// Whether `read` is what a deleted lease without holder may read as: gone,
/// or released at a term of at least `term` under a tombstone version.
fn reads_released(read: &Option<Versioned>, term: u64) -> bool {
    read.as_ref().is_none_or(|v| {
        v.record.holder().is_none() && v.record.term >= term && v.version.starts_with(TOMBSTONE)
    })
}

/// A store's first read of a lease: nothing, and a watch starts with
/// nothing; deleting it deletes nothing.
pub async fn a_missing_lease_reads_as_none<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    assert_eq!(store.get("missing").await.unwrap(), None);
    let mut watch = store.watch("missing").await.unwrap();
    assert_eq!(next(&mut watch).await, None, "first the current state: none");
    assert!(!store.delete_if("missing", "1").await.unwrap());
    assert!(store.list().await.unwrap().is_empty());
}

/// A create writes the record as given; every client then reads it under
/// the version the create returned.
pub async fn create_returns_what_every_client_then_reads<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    let written = record(Some("a"), 1);
    let created = store.create("demo", &written).await.unwrap();
    assert_eq!(created.record, written);
    assert_eq!(store.get("demo").await.unwrap(), Some(created.clone()));
    assert_eq!(open().get("demo").await.unwrap(), Some(created));
}

/// A create of a lease that exists conflicts, from any client, and writes
/// nothing.
pub async fn create_of_an_existing_lease_conflicts<S: LeaseStore>(open: impl Fn() -> S) {
    let (a, b) = (open(), open());
    let created = a.create("demo", &record(Some("a"), 1)).await.unwrap();
    for (client, holder) in [(&a, "a"), (&b, "b")] {
        let err = client.create("demo", &record(Some(holder), 1)).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
    }
    assert_eq!(b.get("demo").await.unwrap(), Some(created));
}

/// Compare-and-swap: an update with the current version writes and returns
/// a new version; a stale version, or a lease that does not exist,
/// conflicts and writes nothing.
pub async fn update_swaps_only_the_current_version<S: LeaseStore>(open: impl Fn() -> S) {
    let (a, b) = (open(), open());
    let v1 = a.create("demo", &record(Some("a"), 1)).await.unwrap();
    let written = record(Some("a"), 2);
    let v2 = a.update("demo", &v1.version, &written).await.unwrap();
    assert_ne!(v2.version, v1.version);
    assert_eq!(v2.record, written);
    assert_eq!(a.get("demo").await.unwrap(), Some(v2.clone()));
    assert_eq!(b.get("demo").await.unwrap(), Some(v2.clone()));

    // A stale version loses, for the client that wrote it and another.
    for client in [&a, &b] {
        let err = client
            .update("demo", &v1.version, &record(Some("late"), 3))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
    }
    assert_eq!(a.get("demo").await.unwrap(), Some(v2.clone()));

    // Another client writes over what it read; the first one sees it.
    let v3 = b
        .update("demo", &v2.version, &record(Some("b"), 3))
        .await
        .unwrap();
    assert_eq!(a.get("demo").await.unwrap(), Some(v3.clone()));

    // A lease that does not exist.
    let err = a
        .update("other", &v3.version, &record(Some("a"), 1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(a.get("other").await.unwrap(), None);
}

/// Every write gets a version never used before for the lease, even once
/// the lease was deleted and written again.
pub async fn versions_never_repeat_even_across_a_delete<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    let mut current = store.create("demo", &record(None, 1)).await.unwrap();
    let mut versions = HashSet::from([current.version.clone()]);
    for term in 2..5 {
        current = store
            .update("demo", &current.version, &record(None, term))
            .await
            .unwrap();
        assert!(versions.insert(current.version.clone()), "{current:?}");
    }
    assert!(store.delete_if("demo", &current.version).await.unwrap());
    // Written again through what a client reads now (gone, or released).
    let fresh = open();
    current = match fresh.get("demo").await.unwrap() {
        Some(read) => fresh
            .update("demo", &read.version, &record(Some("b"), read.record.term + 1))
            .await
            .unwrap(),
        None => fresh.create("demo", &record(Some("b"), 5)).await.unwrap(),
    };
    assert!(versions.insert(current.version.clone()), "{current:?}");
    current = fresh
        .update("demo", &current.version, &record(Some("b"), current.record.term))
        .await
        .unwrap();
    assert!(versions.insert(current.version.clone()), "{current:?}");
}

/// `delete_if` deletes only the version given, once; then the lease is
/// not listed, reads as free, and the old version conflicts.
pub async fn delete_if_deletes_only_the_current_version<S: LeaseStore>(open: impl Fn() -> S) {
    let (a, b) = (open(), open());
    let v1 = a.create("demo", &record(None, 1)).await.unwrap();
    let v2 = a.update("demo", &v1.version, &record(None, 1)).await.unwrap();
    assert!(
        !a.delete_if("demo", &v1.version).await.unwrap(),
        "a stale version"
    );
    assert_eq!(a.get("demo").await.unwrap(), Some(v2.clone()));

    assert!(b.delete_if("demo", &v2.version).await.unwrap());
    assert!(!a.delete_if("demo", &v2.version).await.unwrap(), "already gone");
    for client in [&a, &b] {
        let read = client.get("demo").await.unwrap();
        assert!(reads_released(&read, 1), "{read:?}");
        if let Some(read) = read {
            assert!(
                !client.delete_if("demo", &read.version).await.unwrap(),
                "nothing to delete"
            );
        }
    }
    let err = a
        .update("demo", &v2.version, &record(Some("a"), 2))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(a.list().await.unwrap().is_empty());
}

/// A record deleted while held reads, for a client that saw it, as its
/// last state still held, under a tombstone version that stays the same
/// from read to read; the holder writes it again through that version,
/// once. A client that never saw it finds no holder.
pub async fn a_record_deleted_while_held_reads_as_its_tombstone<S: LeaseStore>(open: impl Fn() -> S) {
    let (holder, follower, operator) = (open(), open(), open());
    let held = holder.create("demo", &record(Some("a"), 1)).await.unwrap();
    assert_eq!(follower.get("demo").await.unwrap(), Some(held.clone()));
    let seen = operator.get("demo").await.unwrap().unwrap();
    assert!(operator.delete_if("demo", &seen.version).await.unwrap());

    let mut tombstones = Vec::new();
    for client in [&holder, &follower] {
        let tombstone = client.get("demo").await.unwrap().expect("the tombstone");
        assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
        assert_eq!(tombstone.record.holder(), Some("a"));
        assert!(tombstone.record.term >= 1, "{tombstone:?}");
        assert_eq!(
            client.get("demo").await.unwrap(),
            Some(tombstone.clone()),
            "read again"
        );
        tombstones.push(tombstone);
    }
    assert_eq!(
        tombstones[0].record, held.record,
        "the holder's own record, as it was"
    );
    let stranger = open().get("demo").await.unwrap();
    assert!(reads_released(&stranger, 1), "{stranger:?}");

    // The holder's renewal writes it again, once; the others' tombstones
    // are stale from then on.
    let renewed = holder
        .update("demo", &tombstones[0].version, &record(Some("a"), 1))
        .await
        .unwrap();
    assert!(!renewed.version.starts_with(TOMBSTONE));
    let err = holder
        .update("demo", &tombstones[0].version, &record(Some("a"), 1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let taken = record(Some("b"), tombstones[1].record.term + 1);
    let err = follower
        .update("demo", &tombstones[1].version, &taken)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(follower.get("demo").await.unwrap(), Some(renewed));
}

/// A lease deleted once released is never written again at a term it had:
/// a plain create conflicts (read it and update what was read); clients
/// that never saw it read it released at a term no lower than its last,
/// and of two that race to write the next term, one wins.
pub async fn terms_never_repeat_after_a_delete<S: LeaseStore>(open: impl Fn() -> S) {
    let a = open();
    let v1 = a.create("demo", &record(Some("a"), 1)).await.unwrap();
    let v2 = a
        .update("demo", &v1.version, &record(Some("a"), 2))
        .await
        .unwrap();
    let released = a.update("demo", &v2.version, &record(None, 2)).await.unwrap();
    assert!(a.delete_if("demo", &released.version).await.unwrap());

    for term in [1, 2, 3] {
        let err = open().create("demo", &record(Some("c"), term)).await.unwrap_err();
        assert!(err.is_conflict(), "term {term}: {err}");
    }
    let (b, c) = (open(), open());
    let read_b = b
        .get("demo")
        .await
        .unwrap()
        .expect("released at its highest term");
    let read_c = c
        .get("demo")
        .await
        .unwrap()
        .expect("released at its highest term");
    assert!(reads_released(&Some(read_b.clone()), 2), "{read_b:?}");
    assert_eq!(read_b, read_c);
    let next = read_b.record.term + 1;
    let won = b
        .update("demo", &read_b.version, &record(Some("b"), next))
        .await
        .unwrap();
    assert_eq!(won.record.term, next);
    let err = c
        .update("demo", &read_c.version, &record(Some("c"), next))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(a.get("demo").await.unwrap(), Some(won));
}

/// `list` returns every lease that exists, by name, as a read finds it
/// (not one deleted); `list_prefixed` those of a prefix; `list_readable`
/// the same as `list` when every record is readable.
pub async fn list_returns_every_lease_that_exists<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    store.create("jobs", &record(Some("a"), 1)).await.unwrap();
    store.create("reports", &record(None, 1)).await.unwrap();
    store
        .create("baton-member.host-a", &record(Some("host-a"), 1))
        .await
        .unwrap();
    let gone = store.create("gone", &record(None, 1)).await.unwrap();
    assert!(store.delete_if("gone", &gone.version).await.unwrap());

    let reader = open();
    let mut listed = reader.list().await.unwrap();
    listed.sort_by(|x, y| x.0.cmp(&y.0));
    let names: Vec<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["baton-member.host-a", "jobs", "reports"]);
    for (name, versioned) in &listed {
        assert_eq!(
            reader.get(name).await.unwrap().as_ref(),
            Some(versioned),
            "{name}"
        );
    }
    let members = reader.list_prefixed("baton-member.").await.unwrap();
    assert_eq!(members, listed[..1]);
    let (mut readable, unreadable) = reader.list_readable().await.unwrap();
    readable.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!((readable, unreadable), (listed, Vec::new()));
}

/// A watch yields the current record first, then every change in order
/// (a deletion while held as its tombstone), nothing for other leases; a
/// watch started later starts from the current state.
pub async fn watch_yields_the_current_record_then_every_change<S: LeaseStore>(open: impl Fn() -> S) {
    let (watcher, writer) = (open(), open());
    let mut watch = watcher.watch("demo").await.unwrap();
    let mut current = next(&mut watch).await;
    assert_eq!(current, None, "first the current state: none");

    let mut written = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
    for term in 1..5 {
        if term > 1 {
            written = writer
                .update("demo", &written.version, &record(Some("a"), term))
                .await
                .unwrap();
        }
        current = next_change(&mut watch, &current).await;
        assert_eq!(current, Some(written.clone()));
    }
    writer.create("demo.other", &record(Some("a"), 1)).await.unwrap();
    writer.create("demox", &record(Some("a"), 1)).await.unwrap();
    assert_quiet(&mut watch, &current).await;

    assert!(open().delete_if("demo", &written.version).await.unwrap());
    current = next_change(&mut watch, &current).await;
    let tombstone = current.clone().expect("the tombstone");
    assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
    assert_eq!(tombstone.record.holder(), Some("a"));
    assert!(tombstone.record.term >= 4, "{tombstone:?}");

    let mut second = watcher.watch("demo").await.unwrap();
    assert_eq!(
        next(&mut second).await,
        current,
        "a new watch starts from the current state"
    );
    assert_eq!(
        watcher.get("demo").await.unwrap(),
        current,
        "and a read says the same"
    );
}

/// Reads and watches never report a state older than one the same store
/// reported or wrote. A store's own writes need not reach its watches (the
/// embedded store's do not: its writer has them already), but once written
/// nothing older is yielded; another client's write is yielded, in order.
pub async fn watch_never_goes_back_behind_the_stores_own_writes<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    let v1 = store.create("demo", &record(Some("w"), 1)).await.unwrap();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(next(&mut watch).await, Some(v1.clone()));
    let v2 = store
        .update("demo", &v1.version, &record(Some("w"), 2))
        .await
        .unwrap();
    let v3 = store
        .update("demo", &v2.version, &record(Some("w"), 3))
        .await
        .unwrap();
    assert_eq!(store.get("demo").await.unwrap(), Some(v3.clone()));
    assert_quiet(&mut watch, &Some(v3.clone())).await;
    let v4 = open()
        .update("demo", &v3.version, &record(Some("w"), 4))
        .await
        .unwrap();
    assert_yields_in_order(&mut watch, &[v3.clone(), v4.clone()]).await;

    // A watch started later starts from the current state, then follows.
    let mut late = store.watch("demo").await.unwrap();
    assert_eq!(next(&mut late).await, Some(v4.clone()));
    let v5 = open()
        .update("demo", &v4.version, &record(Some("w"), 5))
        .await
        .unwrap();
    assert_yields_in_order(&mut late, &[v4, v5]).await;
}

/// Reads `watch` until it yields the last of `states`, asserting that
/// what it yields goes forward through them only; then that it stays
/// there.
async fn assert_yields_in_order(watch: &mut LeaseWatch, states: &[Versioned]) {
    let last = states.last().expect("a state");
    let mut at = 0;
    loop {
        let seen = next(watch).await.expect("a record");
        let Some(index) = states.iter().position(|s| *s == seen) else {
            panic!("{seen:?} is none of {states:?}");
        };
        assert!(index >= at, "went back from {:?} to {seen:?}", states[at]);
        at = index;
        if &seen == last {
            break;
        }
    }
    assert_quiet(watch, &Some(last.clone())).await;
}

/// New store timings apply to what is read from then on; a record that
/// has a duration keeps its own, by get, list and a watch already open.
pub async fn set_timings_keeps_a_records_own_duration<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    let created = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(next(&mut watch).await, Some(created.clone()));
    store.set_timings(StoreTimings {
        fallback_duration: Duration::from_secs(40),
        request_timeout: Duration::from_secs(1),
    });
    assert_eq!(store.get("demo").await.unwrap(), Some(created.clone()));
    assert_eq!(
        store.list().await.unwrap(),
        vec![("demo".to_owned(), created.clone())]
    );
    // Renewed by another client: a store's own writes need not reach its
    // watches.
    let renewed = open()
        .update("demo", &created.version, &record(Some("a"), 1))
        .await
        .unwrap();
    let seen = next_change(&mut watch, &Some(created)).await;
    assert_eq!(seen, Some(renewed));
    assert_eq!(seen.unwrap().record.lease_duration, DURATION);
}

/// A store never writes a record under a name that
/// `validate_lease_name` refuses: the create is refused, naming the lease.
pub async fn invalid_lease_names_are_refused<S: LeaseStore>(open: impl Fn() -> S) {
    let store = open();
    for bad in ["Not_Valid", "UPPER"] {
        assert!(baton::store::validate_lease_name(bad).is_err());
        match store.create(bad, &record(Some("a"), 1)).await {
            Err(StoreError::Refused { lease, .. }) => assert_eq!(lease, bad),
            other => panic!("{bad:?}: expected Refused, got {other:?}"),
        }
    }
    assert!(store.list().await.unwrap().is_empty());
}
