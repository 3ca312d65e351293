//! The etcd store against the cluster: what etcd adds to the contract
//! (revisions, compaction, the floor kept in the same transaction, keys
//! written by hand).

use std::time::Duration;

use baton::store::{LeaseRecord, LeaseStore, TOMBSTONE};
use futures::StreamExt;

use super::*;

fn held(holder: &str, term: u64) -> LeaseRecord {
    LeaseRecord::new(Some(holder), term, Duration::from_secs(4))
}

#[test]
fn a_watch_delivers_every_write_in_order_once_and_never_goes_back() {
    let t = EtcdTest::new("watch");
    let (a, b) = (t.store(), t.store());
    t.rt.block_on(async {
        let mut v = a.create("demo", &held("a", 1)).await.unwrap();
        let mut watch = b.watch("demo").await.unwrap();
        let first = watch.next().await.unwrap().unwrap().unwrap();
        assert_eq!(first.version, v.version);
        let mut written = Vec::new();
        for _ in 0..50 {
            v = a.update("demo", &v.version, &held("a", 1)).await.unwrap();
            written.push(v.version.clone());
        }
        // The stream passes on the newest change not yet taken: each
        // version seen is one written, in order, and the last is the last.
        let mut seen: Vec<String> = Vec::new();
        while seen.last() != written.last() {
            let next = tokio::time::timeout(Duration::from_secs(10), watch.next())
                .await
                .expect("the watch keeps up")
                .unwrap()
                .unwrap()
                .unwrap();
            seen.push(next.version);
        }
        let positions: Vec<usize> = seen
            .iter()
            .map(|s| written.iter().position(|w| w == s).expect("a version written"))
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "in order, once each: {positions:?}"
        );
        println!("50 renewals watched: {} observations", seen.len());
    });
}

#[test]
fn a_watch_compacted_past_lists_again_and_goes_on() {
    let t = EtcdTest::new("compact");
    let (a, b) = (t.store(), t.store());
    t.rt.block_on(async {
        let mut v = a.create("demo", &held("a", 1)).await.unwrap();
        let mut watch = b.watch("demo").await.unwrap();
        watch.next().await.unwrap().unwrap();
        // Many writes and a compaction past them while the watch is held
        // up: it resumes from a compacted revision, is cancelled, lists
        // again and delivers the newest.
        for _ in 0..20 {
            v = a.update("demo", &v.version, &held("a", 1)).await.unwrap();
        }
        let rev: i64 = v.version.split('-').next().unwrap().parse().unwrap();
        t.env.etcdctl(&["compact", &rev.to_string()]);
        v = a.update("demo", &v.version, &held("a", 1)).await.unwrap();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), watch.next())
                .await
                .expect("the watch goes on")
                .unwrap()
                .unwrap()
                .unwrap();
            if next.version == v.version {
                break;
            }
        }
    });
}

#[test]
fn a_new_term_raises_the_floor_in_the_same_transaction_and_a_deleted_record_reads_at_it() {
    let t = EtcdTest::new("floor");
    let (a, b) = (t.store(), t.store());
    t.rt.block_on(async {
        let v = a.create("demo", &held("a", 1)).await.unwrap();
        let v = a.update("demo", &v.version, &held("b", 2)).await.unwrap();
        let floor = t
            .env
            .etcdctl(&["get", "--print-value-only", &format!("{}term/demo", t.prefix)]);
        assert_eq!(
            floor.trim().parse::<u64>().unwrap(),
            2,
            "the floor holds the new term"
        );
        // Released, then deleted by hand: read at its floor, as released.
        let released = LeaseRecord::new(None, 2, Duration::from_secs(1));
        a.update("demo", &v.version, &released).await.unwrap();
        t.env.etcdctl(&["del", &format!("{}lease/demo", t.prefix)]);
        let read = b.get("demo").await.unwrap().expect("read at the floor");
        assert!(read.version.starts_with(TOMBSTONE), "{read:?}");
        assert_eq!((read.record.holder(), read.record.term), (None, 2));
        // A term not above the floor is refused; the next one is taken.
        assert!(
            b.update("demo", &read.version, &held("b", 2))
                .await
                .unwrap_err()
                .is_conflict()
        );
        let read = b.get("demo").await.unwrap().unwrap();
        let taken = b.update("demo", &read.version, &held("b", 3)).await.unwrap();
        assert_eq!(taken.record.term, 3);
    });
}

#[test]
fn a_record_written_by_hand_below_its_floor_reads_at_the_floor() {
    let t = EtcdTest::new("below");
    let a = t.store();
    t.rt.block_on(async {
        let v = a.create("demo", &held("a", 1)).await.unwrap();
        a.update("demo", &v.version, &held("a", 5)).await.unwrap();
        let key = format!("{}lease/demo", t.prefix);
        t.env.etcdctl(&[
            "put",
            &key,
            r#"{"holder":"x","leaseDuration":"4s","transitions":1}"#,
        ]);
        let read = t.store().get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.term, 5, "never below a term given out");
    });
}

#[test]
fn undecodable_keys_are_named_and_spare_the_others_in_listings() {
    let t = EtcdTest::new("garbled");
    let a = t.store();
    t.rt.block_on(async {
        a.create("good", &held("a", 1)).await.unwrap();
        t.env
            .etcdctl(&["put", &format!("{}lease/bad", t.prefix), "{not json"]);
        let e = a.get("bad").await.unwrap_err();
        assert!(e.to_string().contains(&format!("{}lease/bad", t.prefix)), "{e}");
        let (read, unreadable) = a.list_readable().await.unwrap();
        assert_eq!(read.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["good"]);
        assert_eq!(unreadable.len(), 1, "{unreadable:?}");
    });
}
