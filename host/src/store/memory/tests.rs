//! Tests of [`memory`](super).

use futures::StreamExt;
use tokio::time::Instant;

use super::*;

fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
    LeaseRecord::new(holder, term, Duration::from_secs(15))
}

fn is_unavailable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable { .. })
}

#[tokio::test]
async fn create_get_update_conflict() {
    let store = MemoryStore::new();
    assert_eq!(store.describe(), "memory store");
    assert_eq!(store.get("demo").await.unwrap(), None);
    let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    assert_eq!(v1.version, "1");
    assert!(
        store
            .create("demo", &record(Some("b"), 1))
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));

    let v2 = store
        .update("demo", &v1.version, &record(Some("a"), 2))
        .await
        .unwrap();
    assert_eq!(v2.version, "2");
    let err = store
        .update("demo", &v1.version, &record(None, 3))
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    assert!(
        store
            .update("nope", "2", &record(None, 3))
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert_eq!(store.get("demo").await.unwrap(), Some(v2.clone()));

    // A clone shares the state.
    let other = store.clone();
    assert_eq!(other.get("demo").await.unwrap(), Some(v2.clone()));

    // Deleted while held: this client reads its tombstone, and
    // updating the tombstone writes the record again; versions keep
    // growing.
    assert!(store.delete("demo"));
    assert!(!store.delete("demo"));
    assert!(
        store
            .update("demo", &v2.version, &record(None, 3))
            .await
            .unwrap_err()
            .is_conflict()
    );
    let tombstone = store.get("demo").await.unwrap().unwrap();
    assert_eq!(tombstone.version, "deleted@2");
    assert_eq!(tombstone.record, v2.record);
    // A client that never saw the record reads it as released at the
    // lease's highest term, and a plain create conflicts with that.
    let stranger = store.client();
    let floor = stranger.get("demo").await.unwrap().unwrap();
    assert_eq!(
        (floor.version.as_str(), floor.record.holder(), floor.record.term),
        ("deleted@term-2", None, 2)
    );
    assert!(
        stranger
            .create("demo", &record(None, 0))
            .await
            .unwrap_err()
            .is_conflict()
    );
    let v3 = store
        .update("demo", &tombstone.version, &record(Some("a"), 2))
        .await
        .unwrap();
    assert_eq!(v3.version, "3");
    assert!(
        stranger
            .update("demo", &floor.version, &record(Some("b"), 3))
            .await
            .unwrap_err()
            .is_conflict(),
        "the floor record it read is gone"
    );

    let err = store.get("Not_Valid").await.unwrap_err();
    assert!(matches!(err, StoreError::Refused { ref lease, .. } if lease == "Not_Valid"));
}

#[tokio::test]
async fn list_and_raw_writes() {
    let store = MemoryStore::new();
    let b = store.write_raw("b", record(Some("x"), 4));
    let a = store.create("a", &record(None, 0)).await.unwrap();
    store.write_raw("c", record(None, 0));
    store.delete("c");
    assert_eq!(
        store.list().await.unwrap(),
        vec![("a".to_string(), a.clone()), ("b".to_string(), b.clone())]
    );
    // A raw write ignores versions: the next CAS with the old one fails.
    let b2 = store.write_raw("b", record(Some("y"), 5));
    assert!(
        store
            .update("b", &b.version, &record(None, 6))
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert_eq!(store.peek("b"), Some(b2));
}

#[tokio::test]
async fn op_counts_count_every_request() {
    let store = MemoryStore::new();
    store.get("demo").await.unwrap();
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    store.update("demo", &v.version, &record(None, 1)).await.unwrap();
    store
        .update("demo", &v.version, &record(None, 1))
        .await
        .unwrap_err();
    store.fail_next(1);
    store.get("demo").await.unwrap_err();
    let _watch = store.watch("demo").await.unwrap();
    store.list().await.unwrap();
    // Not counted.
    store.peek("demo");
    store.write_raw("demo", record(None, 9));
    assert_eq!(
        store.op_counts(),
        OpCounts {
            get: 2,
            create: 1,
            update: 2,
            watch: 1,
            list: 1
        }
    );
    store.reset_op_counts();
    assert_eq!(store.op_counts(), OpCounts::default());
}

#[tokio::test(start_paused = true)]
async fn latency_delays_every_operation() {
    let store = MemoryStore::new();
    store.set_latency(Duration::from_secs(2));
    let started = Instant::now();
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    store.update("demo", &v.version, &record(None, 1)).await.unwrap();
    store.get("demo").await.unwrap();
    let _watch = store.watch("demo").await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(8));

    // Failures take the latency too.
    store.fail_next(1);
    store.get("demo").await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(10));

    store.set_latency(Duration::ZERO);
    store.get("demo").await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_slow_update_races_with_writes_made_meanwhile() {
    let store = MemoryStore::new();
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    store.set_latency(Duration::from_secs(1));
    let slow = tokio::spawn({
        let store = store.clone();
        let version = v.version.clone();
        async move { store.update("demo", &version, &record(Some("slow"), 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.write_raw("demo", record(Some("fast"), 1));
    assert!(slow.await.unwrap().unwrap_err().is_conflict());
    assert_eq!(store.peek("demo").unwrap().record.holder(), Some("fast"));
}

#[tokio::test]
async fn unavailable_fails_operations_and_breaks_watches() {
    let store = MemoryStore::new();
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), Some(v.clone()));

    store.set_unavailable(true);
    assert!(is_unavailable(&watch.next().await.unwrap().unwrap_err()));
    assert!(watch.next().await.is_none(), "the watch ends after the error");
    assert!(is_unavailable(&store.get("demo").await.unwrap_err()));
    assert!(is_unavailable(&store.create("x", &v.record).await.unwrap_err()));
    assert!(is_unavailable(
        &store.update("demo", &v.version, &v.record).await.unwrap_err()
    ));
    assert!(is_unavailable(&store.watch("demo").await.err().unwrap()));
    assert!(is_unavailable(&store.list().await.unwrap_err()));
    // Nothing was written.
    assert_eq!(store.peek("demo"), Some(v.clone()));
    assert_eq!(store.peek("x"), None);

    store.set_unavailable(false);
    assert_eq!(store.get("demo").await.unwrap(), Some(v.clone()));
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), Some(v));
}

#[tokio::test]
async fn fail_next_fails_exactly_n_operations() {
    let store = MemoryStore::new();
    store.fail_next(3);
    assert!(is_unavailable(&store.get("demo").await.unwrap_err()));
    assert!(is_unavailable(
        &store.create("demo", &record(None, 0)).await.unwrap_err()
    ));
    assert!(is_unavailable(&store.list().await.unwrap_err()));
    assert_eq!(store.peek("demo"), None);
    store.create("demo", &record(None, 0)).await.unwrap();
    store.get("demo").await.unwrap();

    store.fail_next(5);
    store.fail_next(0);
    store.get("demo").await.unwrap();
}

#[tokio::test]
async fn injected_conflicts_hit_updates_only() {
    let store = MemoryStore::new();
    store.inject_conflict_next(2);
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    store.get("demo").await.unwrap();
    for _ in 0..2 {
        let err = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap_err();
        assert!(err.is_conflict());
    }
    assert_eq!(store.peek("demo"), Some(v.clone()));
    let v2 = store
        .update("demo", &v.version, &record(Some("a"), 1))
        .await
        .unwrap();
    assert_eq!(store.peek("demo"), Some(v2));
}

#[tokio::test(start_paused = true)]
async fn hang_blocks_operations_until_released() {
    let store = MemoryStore::new();
    let v = store.create("demo", &record(None, 0)).await.unwrap();
    store.hang(true);

    // A request timeout fires; the abandoned update never takes effect.
    let timed_out = tokio::time::timeout(
        Duration::from_secs(5),
        store.update("demo", &v.version, &record(Some("a"), 1)),
    )
    .await;
    assert!(timed_out.is_err());
    assert_eq!(store.peek("demo"), Some(v.clone()));

    // A hung request completes once released.
    let pending = tokio::spawn({
        let store = store.clone();
        async move { store.get("demo").await }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!pending.is_finished());
    store.hang(false);
    assert_eq!(pending.await.unwrap().unwrap(), Some(v));
    assert_eq!(store.op_counts().get, 1);
    assert_eq!(store.op_counts().update, 1);
}

#[tokio::test]
async fn watch_yields_current_then_each_change() {
    let store = MemoryStore::new();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), None);

    let v1 = store.create("demo", &record(None, 0)).await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), Some(v1.clone()));
    let v2 = store
        .update("demo", &v1.version, &record(Some("a"), 1))
        .await
        .unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap(), Some(v2));
    let v3 = store.write_raw("demo", record(Some("b"), 2));
    assert_eq!(watch.next().await.unwrap().unwrap(), Some(v3.clone()));
    store.delete("demo");
    // Deleted while held: its tombstone (see the deleted-records rules).
    let tombstone = watch.next().await.unwrap().unwrap().unwrap();
    assert_eq!(tombstone.version, format!("deleted@{}", v3.version));
    assert_eq!(tombstone.record, v3.record);

    // Nothing more until the next change; other leases do not count.
    store.write_raw("other", record(None, 0));
    let quiet = tokio::time::timeout(Duration::from_millis(50), watch.next()).await;
    assert!(quiet.is_err());

    // A second watch starts from the current state.
    let mut second = store.watch("demo").await.unwrap();
    assert_eq!(second.next().await.unwrap().unwrap(), Some(tombstone.clone()));

    // Failed operations do not wake watches.
    store.inject_conflict_next(1);
    store.update("demo", "1", &record(None, 0)).await.unwrap_err();
    let quiet = tokio::time::timeout(Duration::from_millis(50), second.next()).await;
    assert!(quiet.is_err());

    // Breaking watches ends both with an error.
    store.break_watches();
    for w in [&mut watch, &mut second] {
        assert!(is_unavailable(&w.next().await.unwrap().unwrap_err()));
        assert!(w.next().await.is_none());
    }
    // New watches work.
    let mut third = store.watch("demo").await.unwrap();
    assert_eq!(third.next().await.unwrap().unwrap(), Some(tombstone));
}
