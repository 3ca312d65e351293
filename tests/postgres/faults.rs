//! Faults of the server under the store and under real hosts: restarts
//! (fast, immediate), backends terminated, the server paused, and a
//! failover to a standby that missed the newest writes. Each on an
//! environment of the test's own ([`OwnServer`]).

use std::time::Duration;

use baton::store::LeaseRecord;
use baton::store::postgres::BEFORE_PROMOTION;

use super::env::OwnServer;
use super::*;

/// A record held by `holder` in `term`.
fn held(holder: &str, term: u64) -> LeaseRecord {
    LeaseRecord::new(Some(holder), term, Duration::from_secs(4))
}

#[test]
fn after_a_failover_that_lost_writes_no_term_is_given_twice_and_the_old_holder_is_waited_out() {
    let own = OwnServer::start();
    let t = PgTest::on(own.env(), "failover");
    let a = t.store_at(&t.env.failover_url);
    let v1 = t.rt.block_on(a.create("demo", &held("a", 1))).unwrap();
    // Replicated, then cut off: the next term is written on the primary
    // only.
    std::thread::sleep(Duration::from_millis(500));
    own.script(&["hold-replication"]);
    let released = LeaseRecord::new(None, 1, baton::store::RELEASED_LEASE_DURATION);
    let v2 = t.rt.block_on(a.update("demo", &v1.version, &released)).unwrap();
    let v3 =
        t.rt.block_on(a.update("demo", &v2.version, &held("b", 2)))
            .unwrap();
    assert_eq!(v3.record.term, 2);
    own.script(&["failover"]);
    // A host that knew nothing: it finds term 1 held... by nobody known,
    // in a term above every term the lost timeline can have given.
    let c = t.store_at(&own.env().failover_url);
    let seen =
        t.rt.block_on(c.get("demo"))
            .unwrap()
            .expect("the record survived");
    assert_eq!(seen.record.holder(), Some(BEFORE_PROMOTION));
    assert!(seen.record.term >= 1_000_000_000, "{:?}", seen.record);
    // The release it may have read before: not written over.
    let stale = t.rt.block_on(c.update("demo", &v2.version, &held("c", 2)));
    assert!(stale.is_err_and(|e| e.is_conflict()));
    let taken =
        t.rt.block_on(c.update("demo", &seen.version, &held("c", seen.record.term + 1)))
            .expect("taken over the unknown holder");
    assert!(taken.record.term > 1_000_000_000);
    // The lost term's holder, back on the new primary: its version is gone.
    let b = t.rt.block_on(a.update("demo", &v3.version, &held("b", 2)));
    assert!(b.is_err_and(|e| e.is_conflict()));
}
