//! The elector under paused time, against the in-memory store with faults.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::*;
use crate::store::memory::MemoryStore;
use crate::store::{LeaseRecord, Versioned};

const LEASE: &str = "demo";

fn timings() -> Timings {
    let t = Timings {
        lease_duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(6),
        retry_period: Duration::from_secs(1),
        grace: Duration::from_secs(2),
        request_timeout: Duration::from_secs(1),
    };
    t.validate().unwrap();
    t
}

struct Candidate {
    rx: watch::Receiver<LeaseView>,
    control: ElectorControl,
    task: JoinHandle<()>,
}

fn start(store: &MemoryStore, identity: &str) -> Candidate {
    let cfg = ElectorConfig {
        lease: LEASE.into(),
        identity: identity.into(),
        timings: timings(),
    };
    let (elector, rx) = Elector::new(cfg, Arc::new(store.clone()));
    let control = ElectorControl::default();
    let task = tokio::spawn(elector.run(control.clone()));
    Candidate { rx, control, task }
}

async fn until_leading(c: &mut Candidate) -> Status {
    c.rx.wait_for(|v| v.status.is_leading())
        .await
        .unwrap()
        .status
        .clone()
}

async fn until_not_leading(c: &mut Candidate) -> Status {
    c.rx.wait_for(|v| !v.status.is_leading())
        .await
        .unwrap()
        .status
        .clone()
}

#[tokio::test(start_paused = true)]
async fn a_lone_candidate_leads_with_term_one() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    let s = until_leading(&mut a).await;
    assert_eq!(s.term, 1);
    assert_eq!(s.holder.as_deref(), Some("a"));
    let rec = store.peek(LEASE).unwrap().record;
    assert_eq!(rec.holder(), Some("a"));
    assert_eq!(rec.transitions, 1);
    assert_eq!(rec.lease_duration, timings().lease_duration);
}

#[tokio::test(start_paused = true)]
async fn one_leader_and_a_follower_that_is_not_woken_by_renewals() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    let mut b = start(&store, "b");
    let s =
        b.rx.wait_for(|v| v.status.role == Role::Following)
            .await
            .unwrap()
            .status
            .clone();
    assert_eq!(s.holder.as_deref(), Some("a"));
    assert_eq!(s.term, 1);
    b.rx.borrow_and_update();
    // Ten renewals later the follower's status has not changed.
    sleep(Duration::from_secs(10)).await;
    assert!(!b.rx.has_changed().unwrap(), "a renewal woke the follower");
    assert!(a.rx.borrow().status.is_leading());
    assert!(store.op_counts().update >= 9, "{:?}", store.op_counts());
}

#[tokio::test(start_paused = true)]
async fn a_crashed_leader_is_replaced_after_the_lease_duration() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    let mut b = start(&store, "b");
    b.rx.wait_for(|v| v.status.role == Role::Following).await.unwrap();
    sleep(Duration::from_millis(3500)).await;
    let last_renewal = Instant::now() - Duration::from_millis(500);
    a.task.abort(); // a crash: no release
    let s = until_leading(&mut b).await;
    let took = Instant::now() - last_renewal;
    assert_eq!(s.term, 2);
    assert!(took >= timings().lease_duration, "took over after {took:?}");
    assert!(
        took <= timings().lease_duration + timings().retry_period,
        "took over after {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_makes_the_leader_step_down_at_the_renew_deadline() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    sleep(Duration::from_millis(2500)).await;
    let deadline = a.rx.borrow().deadline.clone().unwrap();
    let confirmed_until = deadline.until();
    store.set_unavailable(true);
    let lost = until_not_leading(&mut a).await;
    assert_eq!(lost.role, Role::Pending);
    let now = Instant::now();
    assert!(
        now <= confirmed_until,
        "stepped down late: {:?}",
        now - confirmed_until
    );
    assert!(deadline.until() <= now);
    // The lease itself could only expire for others a full lease after the
    // last renewal: the task's force-stop bound (RD + grace) comes first.
    let last_renewal_start = confirmed_until - timings().renew_deadline;
    assert!(deadline.until() + timings().grace < last_renewal_start + timings().lease_duration);
    // The store comes back: the same host regains the lease, in a new term.
    store.set_unavailable(false);
    let s = until_leading(&mut a).await;
    assert_eq!(s.term, 2);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_cannot_stretch_the_lead() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    let deadline = a.rx.borrow().deadline.clone().unwrap();
    store.hang(true);
    let until = deadline.until();
    until_not_leading(&mut a).await;
    assert!(Instant::now() <= until + Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_foreign_write_makes_the_leader_step_down_at_once() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    let before = Instant::now();
    store.write_raw(
        LEASE,
        LeaseRecord {
            holder: Some("intruder".into()),
            lease_duration: Duration::from_secs(30),
            acquire_time: None,
            renew_time: None,
            transitions: 7,
        },
    );
    let s = until_not_leading(&mut a).await;
    assert_eq!(s.role, Role::Following);
    assert_eq!(s.holder.as_deref(), Some("intruder"));
    assert_eq!(s.term, 7);
    assert!(Instant::now() - before < Duration::from_millis(10));
    // When the intruder's lease runs out, `a` takes over with a newer term.
    let s = until_leading(&mut a).await;
    assert_eq!(s.term, 8);
}

#[tokio::test(start_paused = true)]
async fn resign_keeps_the_lease_until_drained_then_releases_for_a_prompt_takeover() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    let mut b = start(&store, "b");
    b.rx.wait_for(|v| v.status.role == Role::Following).await.unwrap();

    a.control.resign.cancel();
    let s = until_not_leading(&mut a).await;
    assert_eq!(s.role, Role::Pending);
    // Draining takes longer than a lease renewal period: still ours.
    sleep(Duration::from_secs(3)).await;
    assert_eq!(store.peek(LEASE).unwrap().record.holder(), Some("a"));
    assert!(!b.rx.borrow().status.is_leading());

    let released_at = Instant::now();
    a.control.drained.cancel();
    a.task.await.unwrap();
    assert_ne!(store.peek(LEASE).unwrap().record.holder(), Some("a"));
    let s = until_leading(&mut b).await;
    assert_eq!(s.term, 2);
    assert!(Instant::now() - released_at < Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn release_is_retried_on_conflict() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    a.control.resign.cancel();
    until_not_leading(&mut a).await;
    store.inject_conflict_next(2);
    a.control.drained.cancel();
    a.task.await.unwrap();
    let rec = store.peek(LEASE).unwrap().record;
    assert_eq!(rec.holder(), None);
    assert_eq!(rec.lease_duration, RELEASED_LEASE_DURATION);
    assert_eq!(rec.transitions, 1, "a release keeps the term");
}

#[tokio::test(start_paused = true)]
async fn terms_grow_on_every_change_of_holder_and_survive_deletion() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    assert_eq!(until_leading(&mut a).await.term, 1);
    let mut b = start(&store, "b");
    b.rx.wait_for(|v| v.status.role == Role::Following).await.unwrap();
    a.task.abort();
    assert_eq!(until_leading(&mut b).await.term, 2);
    // Someone deletes the record: the leader steps down, re-creates it,
    // and never reuses a term.
    store.delete(LEASE);
    let s =
        b.rx.wait_for(|v| v.status.is_leading() && v.status.term != 2)
            .await
            .unwrap()
            .status
            .clone();
    assert!(s.term > 2, "term {}", s.term);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_within_the_renew_deadline_keep_the_lead() {
    let store = MemoryStore::new();
    let mut a = start(&store, "a");
    until_leading(&mut a).await;
    a.rx.borrow_and_update();
    store.fail_next(3);
    sleep(Duration::from_secs(5)).await;
    assert!(!a.rx.has_changed().unwrap(), "a transient failure cost the lead");
}

#[test]
fn expiry_is_judged_from_local_observation_and_the_records_duration() {
    let now = Instant::now();
    let record = |holder: Option<&str>, secs| Versioned {
        record: LeaseRecord {
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(secs),
            acquire_time: None,
            // Timestamps inside the record are ignored, even absurd ones.
            renew_time: Some(std::time::UNIX_EPOCH),
            transitions: 3,
        },
        version: "1".into(),
    };
    let obs = |r, seen_at| Observation {
        record: Some(r),
        seen_at,
    };
    let seen = now - Duration::from_secs(5);
    assert_eq!(
        follower_decision(&obs(record(Some("x"), 30), seen), "me", now),
        Decision::WaitUntil(seen + Duration::from_secs(30))
    );
    assert_eq!(
        follower_decision(&obs(record(Some("x"), 4), seen), "me", now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&obs(record(None, 30), seen), "me", now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&obs(record(Some(""), 30), seen), "me", now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&obs(record(Some("me"), 30), seen), "me", now),
        Decision::Acquire
    );
    let none = Observation {
        record: None,
        seen_at: now,
    };
    assert_eq!(follower_decision(&none, "me", now), Decision::Acquire);
    let s = follower_status(Some(&obs(record(Some("x"), 30), seen)), "demo", "me", 1);
    assert_eq!(
        (s.role, s.holder.as_deref(), s.term),
        (Role::Following, Some("x"), 3)
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_at_start_is_retried_with_back_off_not_hammered() {
    let store = MemoryStore::new();
    store.set_unavailable(true);
    let mut a = start(&store, "a");
    sleep(Duration::from_secs(10)).await;
    let counts = store.op_counts();
    // One read per retry period (jittered x [1, 1.5]) at most, plus watch attempts.
    assert!(counts.get <= 11, "{counts:?}");
    assert!(!a.rx.borrow().status.is_leading());
    store.set_unavailable(false);
    let s = until_leading(&mut a).await;
    assert_eq!(s.term, 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_keeps_refusing_what_it_shows_is_retried_with_back_off() {
    // A free lease whose writes conflict while reads show it unchanged
    // (for example a store whose own bookkeeping refuses the write): the
    // candidate must not spin, writing once per retry period at most.
    let store = MemoryStore::new();
    store.write_raw(
        LEASE,
        LeaseRecord {
            holder: None,
            lease_duration: Duration::from_secs(1),
            acquire_time: None,
            renew_time: None,
            transitions: 4,
        },
    );
    store.inject_conflict_next(1_000);
    let a = start(&store, "a");
    sleep(Duration::from_secs(10)).await;
    let counts = store.op_counts();
    assert!(counts.create + counts.update <= 11, "{counts:?}");
    assert!(counts.update >= 5, "it keeps trying: {counts:?}");
    assert!(!a.rx.borrow().status.is_leading());
    store.inject_conflict_next(0);
    let mut a = a;
    let s = until_leading(&mut a).await;
    assert_eq!(s.term, 5);
}
