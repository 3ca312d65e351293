//! Tests of [`claims`](super).

use super::*;
use crate::election::TermClock;
use crate::store::LeaseStore;
use crate::store::memory::MemoryStore;

fn held(holder: &str, term: u64, plugins: &[&str]) -> LeaseRecord {
    LeaseRecord {
        holder: Some(holder.into()),
        lease_duration: Duration::from_secs(10),
        acquire_time: None,
        renew_time: None,
        term,
        instance: None,
        yielded: None,
        host: None,
        plugins: Some(plugins.iter().map(|p| p.to_string()).collect()),
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn term(lease: &str) -> Arc<Term> {
    let clock = TermClock::system();
    let until = clock.now() + Duration::from_secs(60);
    Term::begin(lease, 1, Duration::from_secs(1), clock, until)
}

#[tokio::test(start_paused = true)]
async fn a_plugin_claimed_by_another_live_lease_waits_until_the_claim_is_dropped() {
    let store = Arc::new(MemoryStore::new());
    let other = store.create("la", &held("x", 7, &["p"])).await.unwrap();
    let gate = Arc::new(ClaimGate::new(store.clone()));
    let (t, claims) = (term("lb"), LeaseClaims::new());
    claims.add("p");
    t.confirm_claims(&claims.listed());
    let admit = {
        let (gate, t, claims) = (gate.clone(), t.clone(), claims.clone());
        tokio::spawn(async move { gate.admit("p", &t, &claims, Duration::from_millis(100)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!admit.is_finished(), "started beside lease la's claim");
    // lb sorts after la: it took its claim back while la's stands.
    assert!(claims.listed().is_empty());
    store
        .update("la", &other.version, &held("x", 7, &["q"]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(claims.listed(), vec!["p".to_owned()]);
    t.confirm_claims(&claims.listed());
    assert!(admit.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_expires_unrenewed_no_longer_counts() {
    let store = Arc::new(MemoryStore::new());
    store.create("lb", &held("y", 3, &["p"])).await.unwrap();
    let gate = ClaimGate::new(store.clone());
    let (t, claims) = (term("la"), LeaseClaims::new());
    claims.add("p");
    t.confirm_claims(&claims.listed());
    let started = Instant::now();
    // la sorts first: it keeps its claim and waits out lb's lease.
    assert!(gate.admit("p", &t, &claims, Duration::from_millis(250)).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(10), "waited {waited:?}");
    assert_eq!(claims.listed(), vec!["p".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_deleted_from_the_store_counts_for_its_lease_duration() {
    let store = Arc::new(MemoryStore::new());
    store.create("la", &held("x", 2, &["p"])).await.unwrap();
    let gate = ClaimGate::new(store.clone());
    let at = Instant::now();
    assert_eq!(gate.rivals("p", "lb", at).await.unwrap().len(), 1);
    store.delete("la");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(gate.rivals("p", "lb", Instant::now()).await.unwrap().len(), 1);
    // Gone since the listing at 5 s: it counts until 15 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(gate.rivals("p", "lb", Instant::now()).await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(gate.rivals("p", "lb", Instant::now()).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_delays_the_start_only_until_the_term_is_over() {
    let store = Arc::new(MemoryStore::new());
    let gate = ClaimGate::new(store.clone());
    let (t, claims) = (term("la"), LeaseClaims::new());
    claims.add("p");
    t.confirm_claims(&claims.listed());
    store.hang(true);
    let ender = {
        let t = t.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            t.end(t.clock().now());
        })
    };
    let admitted =
        tokio::time::timeout(secs(6), gate.admit("p", &t, &claims, Duration::from_millis(100))).await;
    assert_eq!(
        admitted.ok(),
        Some(false),
        "a hung listing held the gate past the term"
    );
    ender.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn only_a_confirmed_claim_lets_a_task_start() {
    let store = Arc::new(MemoryStore::new());
    let gate = ClaimGate::new(store);
    let (t, claims) = (term("la"), LeaseClaims::new());
    claims.add("p");
    let waiting = tokio::time::timeout(
        Duration::from_secs(1),
        gate.admit("p", &t, &claims, Duration::from_millis(100)),
    );
    assert!(waiting.await.is_err(), "started before a write listed it");
    t.end(t.clock().now());
    assert!(!gate.admit("p", &t, &claims, Duration::from_millis(100)).await);
}
