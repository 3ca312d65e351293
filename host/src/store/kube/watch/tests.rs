//! Tests of [`watch`](super).

use kube::api::WatchEvent;
use serde_json::json;
use tokio::time::Instant;

use super::demux::{Delivery, SharedState, Signal, Taken, Unserved, WATCH_LAG_ALLOWANCE};
use super::follower::moves_forward;
use super::*;
use crate::store::{ANY_LEASE, StoreError};

fn lease(name: &str, rv: u64, labels: &[(&str, &str)]) -> DynamicObject {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv.to_string(), "labels": labels},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 4, "leaseTransitions": 1},
    }))
    .unwrap()
}

fn selector() -> BTreeMap<String, String> {
    [("baton.dev/role", "lease"), ("app", "baton")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const LABELS: &[(&str, &str)] = &[("baton.dev/role", "lease"), ("app", "baton"), ("team", "x")];

fn rv_of(d: &Delivery) -> (String, bool) {
    match d {
        Delivery::Object(o) => (o.metadata.resource_version.clone().unwrap(), false),
        Delivery::Deleted(o) => (o.metadata.resource_version.clone().unwrap(), true),
    }
}

fn taken(signal: &Signal) -> Option<(String, bool)> {
    match signal.take() {
        Taken::Delivery(d) => Some(rv_of(&d)),
        Taken::Nothing => None,
        Taken::Broken(e) => panic!("broken: {e}"),
    }
}

#[test]
fn the_selector_is_every_label_and_a_lease_must_carry_each() {
    assert_eq!(label_selector(&selector()), "app=baton,baton.dev/role=lease");
    assert!(
        selects(&selector(), &lease("l", 1, LABELS)),
        "extra labels do not matter"
    );
    assert!(!selects(
        &selector(),
        &lease("l", 1, &[("baton.dev/role", "lease")])
    ));
    assert!(!selects(
        &selector(),
        &lease("l", 1, &[("baton.dev/role", "lease"), ("app", "other")])
    ));
    let mut bare = lease("l", 1, &[]);
    bare.metadata.labels = None;
    assert!(!selects(&selector(), &bare));
    assert!(
        selects(&BTreeMap::new(), &bare),
        "an empty selector selects everything"
    );
}

#[test]
fn a_deletion_is_confirmed_by_what_a_read_finds() {
    // Gone: a deletion. Found with the labels: deleted and created
    // again (or the labels put back) since; the shared watch sees it.
    // Found without them: a foreign write dropped the labels, not a
    // deletion; the lease is watched on its own.
    assert!(matches!(Confirmed::of(None, &selector()), Confirmed::Gone));
    assert!(matches!(
        Confirmed::of(Some(lease("l", 7, LABELS)), &selector()),
        Confirmed::Selected(o) if o.metadata.resource_version.as_deref() == Some("7")
    ));
    assert!(matches!(
        Confirmed::of(Some(lease("l", 8, &[("team", "x")])), &selector()),
        Confirmed::Unselected(o) if o.metadata.resource_version.as_deref() == Some("8")
    ));
}

#[test]
fn the_resume_point_never_moves_back() {
    assert!(moves_forward("10", "11"));
    assert!(moves_forward("10", "10"));
    assert!(
        !moves_forward("10", "9"),
        "a DELETED event carrying the previous state"
    );
    assert!(!moves_forward("10", ""));
    assert!(moves_forward("", "3"));
    assert!(moves_forward("10", "abc"), "not a number: the newest wins");
}

/// A state with a synced run and the given routes.
fn state_with(routes: &[(&str, &Arc<Signal>)]) -> (SharedState, u64) {
    let mut state = SharedState::default();
    for (lease, signal) in routes {
        state.route(lease, (*signal).clone());
    }
    let generation = state.new_run().generation;
    state.synced(
        generation,
        vec![lease("a", 1, LABELS), lease("b", 2, LABELS)],
        "2",
    );
    (state, generation)
}

#[test]
fn events_reach_only_the_watches_of_their_lease_newest_first() {
    let (a1, a2, b) = (Arc::default(), Arc::default(), Arc::default());
    let (mut state, generation) = state_with(&[("a", &a1), ("a", &a2), ("b", &b)]);
    assert_eq!(
        state.run.as_ref().unwrap().cache.len(),
        2,
        "the list fills the cache"
    );

    state.apply(generation, WatchEvent::Modified(lease("a", 5, LABELS)));
    state.apply(generation, WatchEvent::Modified(lease("a", 6, LABELS)));
    // A lease nobody here watches: cached, handed to nobody.
    state.apply(generation, WatchEvent::Added(lease("c", 7, LABELS)));
    assert_eq!(
        taken(&a1),
        Some(("6".into(), false)),
        "the newest replaces the older"
    );
    assert_eq!(taken(&a2), Some(("6".into(), false)), "every watch of the lease");
    assert_eq!(taken(&a1), None);
    assert_eq!(taken(&b), None, "not another lease's watch");
    let cache = &state.run.as_ref().unwrap().cache;
    assert_eq!(cache["a"].metadata.resource_version.as_deref(), Some("6"));
    assert!(cache.contains_key("c"));

    // DELETED (a deletion, or the labels dropped): out of the cache,
    // handed on as such; bookmarks are nobody's.
    state.apply(generation, WatchEvent::Deleted(lease("b", 8, LABELS)));
    assert_eq!(taken(&b), Some(("8".into(), true)));
    assert!(!state.run.as_ref().unwrap().cache.contains_key("b"));
    let bookmark = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"resourceVersion": "9"},
    }))
    .unwrap();
    state.apply(generation, WatchEvent::Bookmark(bookmark));
    assert_eq!((taken(&a1), taken(&b)), (None, None));

    // An event of an older run changes nothing.
    state.apply(generation - 1, WatchEvent::Modified(lease("a", 10, LABELS)));
    assert_eq!(taken(&a1), None);
}

#[test]
fn a_failure_reaches_every_watch_and_ends_the_run() {
    let (a, b) = (Arc::default(), Arc::default());
    let (mut state, generation) = state_with(&[("a", &a), ("b", &b)]);
    let mut status = state.run.as_ref().unwrap().status.subscribe();
    state.apply(generation, WatchEvent::Modified(lease("a", 5, LABELS)));
    let error = StoreError::Unavailable {
        lease: ANY_LEASE.into(),
        detail: "watch expired (410 Gone)".into(),
    };
    assert!(
        state.fail(generation + 1, &error).is_none(),
        "not the current run"
    );
    assert!(state.fail(generation, &error).is_some());
    assert!(state.run.is_none(), "the next watch lists afresh");
    assert!(matches!(
        &*status.borrow_and_update(),
        Some(Err(StoreError::Unavailable { .. }))
    ));
    for signal in [&a, &b] {
        // The error comes before anything delivered.
        match signal.take() {
            Taken::Broken(e) => assert!(e.about("a").to_string().contains("lease \"a\"")),
            other => panic!("{other:?}"),
        }
    }
    // Joining clears what a former run left.
    a.deliver(Delivery::Object(lease("a", 6, LABELS).into()));
    a.break_with(error);
    a.clear();
    assert!(matches!(a.take(), Taken::Nothing));
}

fn names(listed: Result<Vec<DynamicObject>, Unserved>) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = listed
        .unwrap()
        .into_iter()
        .map(|o| (o.metadata.name.unwrap(), o.metadata.resource_version.unwrap()))
        .collect();
    names.sort();
    names
}

#[test]
fn the_cache_serves_listings_only_while_in_sync_with_every_event_applied() {
    let now = Instant::now();
    let mut state = SharedState::default();
    assert_eq!(state.cached("m.", now).err(), Some(Unserved::NotRunning));
    let generation = state.new_run().generation;
    assert_eq!(
        state.cached("m.", now).err(),
        Some(Unserved::Syncing),
        "listing, or its watch not accepted yet"
    );
    state.synced(
        generation,
        vec![
            lease("m.a", 3, LABELS),
            lease("m.b", 4, LABELS),
            lease("other", 5, LABELS),
        ],
        "5",
    );
    assert_eq!(
        names(state.cached("m.", now)),
        [("m.a".into(), "3".into()), ("m.b".into(), "4".into())],
        "only the prefix"
    );
    assert_eq!(names(state.cached("", now)).len(), 3);

    // Every event received is in the listing: the newest version of
    // each, a new record, and none of a deleted one.
    state.apply(generation, WatchEvent::Modified(lease("m.a", 6, LABELS)));
    state.apply(generation, WatchEvent::Modified(lease("m.a", 7, LABELS)));
    state.apply(generation, WatchEvent::Added(lease("m.c", 8, LABELS)));
    state.apply(generation, WatchEvent::Deleted(lease("m.b", 9, LABELS)));
    assert_eq!(
        names(state.cached("m.", now)),
        [("m.a".into(), "7".into()), ("m.c".into(), "8".into())]
    );

    // Failed (a 410, a silent connection): nothing served until a new
    // run has listed.
    assert!(
        state
            .fail(
                generation,
                &StoreError::Unavailable {
                    lease: ANY_LEASE.into(),
                    detail: "watch expired (410 Gone)".into(),
                }
            )
            .is_some()
    );
    assert_eq!(state.cached("m.", now).err(), Some(Unserved::NotRunning));
    let generation = state.new_run().generation;
    state.synced(generation, vec![lease("m.a", 12, LABELS)], "12");
    assert_eq!(names(state.cached("m.", now)), [("m.a".into(), "12".into())]);
}

#[test]
fn a_watch_that_does_not_deliver_this_stores_writes_stops_serving_listings() {
    let t0 = Instant::now();
    let later = |d: Duration| t0 + d;
    let mut state = SharedState::default();
    // Writes before the watch is in sync are not awaited (the list
    // may include them).
    state.wrote(3, t0);
    let generation = state.new_run().generation;
    state.wrote(4, t0);
    state.synced(generation, vec![lease("m.a", 5, LABELS)], "10");
    assert_eq!(state.run.as_ref().unwrap().unconfirmed, None);
    // A write the watch has reached already: nothing awaited.
    state.wrote(9, t0);
    assert_eq!(state.run.as_ref().unwrap().unconfirmed, None);

    // A write the watch delivers within the allowance: served all along.
    state.wrote(11, t0);
    state.wrote(12, later(Duration::from_millis(100)));
    assert_eq!(
        state.run.as_ref().unwrap().unconfirmed,
        Some((11, t0)),
        "the first one awaited"
    );
    assert!(state.cached("m.", later(WATCH_LAG_ALLOWANCE)).is_ok());
    state.apply(generation, WatchEvent::Modified(lease("m.a", 11, LABELS)));
    assert_eq!(state.run.as_ref().unwrap().unconfirmed, None);

    // One it does not deliver: listings go to the API server once it
    // is older than the allowance, until the watch reaches it (a
    // bookmark counts: the server says the watch is current).
    let t1 = later(Duration::from_secs(5));
    state.wrote(20, t1);
    assert!(state.cached("m.", t1 + WATCH_LAG_ALLOWANCE).is_ok());
    match state.cached("m.", t1 + WATCH_LAG_ALLOWANCE + Duration::from_millis(1)) {
        Err(Unserved::Lagging { rv: 20, .. }) => {}
        other => panic!("{other:?}"),
    }
    state.apply(generation, WatchEvent::Modified(lease("m.b", 19, LABELS)));
    assert!(
        state.cached("m.", t1 + Duration::from_secs(2)).is_err(),
        "not there yet"
    );
    let bookmark = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"resourceVersion": "21"},
    }))
    .unwrap();
    state.apply(generation, WatchEvent::Bookmark(bookmark));
    assert_eq!(
        names(state.cached("m.", t1 + Duration::from_secs(2))),
        [("m.a".into(), "11".into()), ("m.b".into(), "19".into())]
    );
}

#[tokio::test]
async fn only_writes_of_leases_the_watch_selects_are_awaited() {
    let shared = SharedWatch::new(config());
    let generation = {
        let mut state = shared.state();
        let generation = state.new_run().generation;
        state.synced(generation, vec![], "1");
        generation
    };
    shared.wrote(&lease("foreign", 5, &[("team", "x")]));
    assert_eq!(shared.state().run_of(generation).unwrap().unconfirmed, None);
    shared.wrote(&lease("m.a", 6, LABELS));
    assert!(matches!(
        shared.state().run_of(generation).unwrap().unconfirmed,
        Some((6, _))
    ));
    assert!(shared.cached("m.").is_ok(), "within the allowance");
}

fn config() -> WatchConfig {
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    WatchConfig {
        api: Gated::new(
            kube::Api::namespaced_with(
                client,
                "ns",
                &kube::api::ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&()),
            ),
            crate::store::kube::gate::RequestGate::new(|| Duration::from_millis(500)).into(),
        ),
        selector: selector(),
        timings: Arc::new(LiveTimings::new(StoreTimings {
            fallback_duration: Duration::from_secs(4),
            request_timeout: Duration::from_millis(500),
        })),
        watch_timeout_secs: None,
    }
}

#[tokio::test]
async fn registrations_wake_on_their_leases_events_and_the_last_one_stops_the_watch() {
    let shared = Arc::new(SharedWatch::new(config()));
    let a = shared.register("a");
    let b = shared.register("b");
    let generation = {
        let mut state = shared.state();
        let generation = state.new_run().generation;
        state.synced(generation, vec![lease("a", 1, LABELS)], "1");
        generation
    };
    let waiting = tokio::spawn(async move {
        let d = b.next().await.unwrap();
        (rv_of(&d), b)
    });
    tokio::task::yield_now().await;
    shared
        .state()
        .apply(generation, WatchEvent::Modified(lease("a", 2, LABELS)));
    shared
        .state()
        .apply(generation, WatchEvent::Modified(lease("b", 3, LABELS)));
    let (got, b) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ("3".into(), false));
    assert_eq!(rv_of(&a.next().await.unwrap()), ("2".into(), false));
    drop(a);
    assert!(shared.state().run.is_some(), "b still watches");
    drop(b);
    let state = shared.state();
    assert!(
        state.run.is_none() && state.routes.is_empty(),
        "nobody watches: stopped"
    );
}

#[tokio::test]
async fn a_watch_that_cannot_start_fails_every_join_with_the_lease_named() {
    // Nothing listens on the discard port: the list fails, and every
    // lease waiting for the shared watch hears why, under its name.
    let shared = Arc::new(SharedWatch::new(config()));
    let a = shared.register("a");
    let b = shared.register("b");
    let (ra, rb) = tokio::join!(a.join(), b.join());
    for (r, name) in [(ra, "a"), (rb, "b")] {
        match r {
            Err(StoreError::Unavailable { lease, .. }) => assert_eq!(lease, name),
            other => panic!("{other:?}"),
        }
    }
    assert!(shared.state().run.is_none(), "failed: the next join lists afresh");
}
