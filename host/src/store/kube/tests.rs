//! Tests of [`kube`](super).

use super::record::micro_time;
use super::requests::slim;
use super::*;
use serde_json::{Value, json};

const FALLBACK: Duration = Duration::from_secs(15);

fn object(spec: Value) -> DynamicObject {
    let mut o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "demo",
            "namespace": "ns",
            "resourceVersion": "42",
            "labels": {"team": "other"},
            "annotations": {"owner.example/x": "keep me"},
        },
    }))
    .unwrap();
    if !spec.is_null() {
        o.data["spec"] = spec;
    }
    o
}

#[test]
fn a_full_lease_maps_one_to_one() {
    let o = object(json!({
        "holderIdentity": "host-a",
        "leaseDurationSeconds": 4,
        "acquireTime": "2026-11-29T18:19:49.174601Z",
        "renewTime": "2026-11-29T18:19:51.000002Z",
        "leaseTransitions": 7,
    }));
    let v = to_versioned("demo", &o, FALLBACK).unwrap();
    assert_eq!(v.version, "42");
    assert_eq!(v.record.holder(), Some("host-a"));
    assert_eq!(v.record.lease_duration, Duration::from_secs(4));
    assert_eq!(v.record.term, 7);
    let renew = v.record.renew_time.unwrap();
    assert_eq!(micro_time(renew), "2026-11-29T18:19:51.000002Z");
    assert_eq!(
        micro_time(v.record.acquire_time.unwrap()),
        "2026-11-29T18:19:49.174601Z"
    );

    // And back: the same spec.
    let mut data = json!({"spec": {"somethingNewer": true}});
    write_spec("demo", &mut data, &v.record).unwrap();
    assert_eq!(
        data,
        json!({"spec": {
            "somethingNewer": true,
            "holderIdentity": "host-a",
            "leaseDurationSeconds": 4,
            "acquireTime": "2026-11-29T18:19:49.174601Z",
            "renewTime": "2026-11-29T18:19:51.000002Z",
            "leaseTransitions": 7,
        }})
    );
}

#[test]
fn only_a_lease_whose_transitions_baton_changed_last_is_continuous() {
    let with = |fields: Value| {
        let mut o = object(json!({"leaseTransitions": 4}));
        o.metadata.managed_fields = serde_json::from_value(fields).unwrap();
        o
    };
    let entry = |manager: &str, spec: Value| {
        json!({"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:spec": spec}})
    };
    // Kept slim, an object answers the same, with one entry at most.
    let check = |fields: Value| {
        let full = with(fields);
        let mut slimmed = full.clone();
        slim(&mut slimmed);
        assert!(
            slimmed
                .metadata
                .managed_fields
                .as_ref()
                .is_none_or(|m| m.len() == 1)
        );
        assert_eq!(baton_wrote_transitions(&slimmed), baton_wrote_transitions(&full));
        baton_wrote_transitions(&full)
    };
    let baton = entry("baton", json!({"f:holderIdentity": {}, "f:leaseTransitions": {}}));
    assert!(check(json!([baton.clone()])));
    // kubectl replace of the same object with leaseTransitions 0, as the
    // API server records it (checked on v1.20).
    let replaced = json!([
        entry("baton", json!({"f:holderIdentity": {}})),
        entry("kubectl-replace", json!({"f:leaseTransitions": {}})),
    ]);
    assert!(!check(replaced));
    // No managedFields (cleared, or an old API server), a status
    // subresource's entry: not continuous.
    assert!(!check(Value::Null));
    let mut sub = baton;
    sub["subresource"] = json!("status");
    assert!(!check(json!([sub])));
}

#[test]
fn foreign_and_sparse_leases_are_read_without_errors() {
    // No spec at all.
    let v = to_versioned("demo", &object(Value::Null), FALLBACK).unwrap();
    assert_eq!(v.record.holder, None);
    assert_eq!(v.record.term, 0);
    assert_eq!(v.record.renew_time, None);

    // Null and empty holders are no holder.
    for holder in [Value::Null, json!("")] {
        let v = to_versioned("demo", &object(json!({"holderIdentity": holder})), FALLBACK).unwrap();
        assert_eq!(v.record.holder(), None);
    }

    // A holder without a usable duration gets the fallback.
    for d in [Value::Null, json!(0), json!(-5)] {
        let o = object(json!({"holderIdentity": "x", "leaseDurationSeconds": d}));
        let v = to_versioned("demo", &o, FALLBACK).unwrap();
        assert_eq!(v.record.lease_duration, FALLBACK, "{d}");
    }
    let o = object(json!({"holderIdentity": "x"}));
    assert_eq!(
        to_versioned("demo", &o, FALLBACK).unwrap().record.lease_duration,
        FALLBACK
    );

    // Missing or unreadable times, negative transitions.
    let o = object(json!({
        "holderIdentity": "x",
        "leaseDurationSeconds": 10,
        "renewTime": "yesterday",
        "leaseTransitions": -3,
    }));
    let v = to_versioned("demo", &o, FALLBACK).unwrap();
    assert_eq!(v.record.renew_time, None);
    assert_eq!(v.record.acquire_time, None);
    assert_eq!(v.record.term, 0);
}

#[test]
fn a_listing_keeps_the_prefix_sorted_by_name_and_reads_objects_as_they_are() {
    let named = |name: &str, rv: &str, spec: Value| {
        let mut o = object(spec);
        o.metadata.name = Some(name.into());
        o.metadata.resource_version = Some(rv.into());
        o
    };
    let held = json!({"holderIdentity": "b", "leaseDurationSeconds": 2, "leaseTransitions": 3});
    let objects = [
        named("m.b", "7", held.clone()),
        named("other", "8", json!("not even an object")),
        named("m.a", "5", json!({})),
    ];
    let listing = listed("m.", &objects, FALLBACK).unwrap();
    let names: Vec<&str> = listing.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["m.a", "m.b"],
        "sorted, only the prefix (an unreadable other is no error)"
    );
    assert_eq!(listing[1].1.version, "7");
    assert_eq!(listing[1].1.record.holder(), Some("b"));
    assert_eq!(listing[1].1.record.term, 3);
    assert_eq!(listing[0].1.record.holder(), None);
    assert!(matches!(
        listed("", &objects, FALLBACK),
        Err(StoreError::Malformed { lease, .. }) if lease == "other"
    ));
}

#[test]
fn wrong_types_and_missing_versions_are_malformed() {
    for (spec, says) in [
        (json!("not an object"), "spec is not an object: \"not an object\""),
        (
            json!({"holderIdentity": 5}),
            "spec.holderIdentity is not a string: 5",
        ),
        (
            json!({"leaseDurationSeconds": "4s"}),
            "spec.leaseDurationSeconds is not an integer: \"4s\"",
        ),
        (
            json!({"leaseTransitions": 1.5}),
            "spec.leaseTransitions is not an integer: 1.5",
        ),
    ] {
        match to_versioned("demo", &object(spec.clone()), FALLBACK) {
            Err(StoreError::Malformed { lease, detail }) => assert_eq!((&*lease, &*detail), ("demo", says)),
            other => panic!("{spec}: expected Malformed, got {other:?}"),
        }
    }
    let mut o = object(json!({}));
    o.metadata.resource_version = None;
    assert!(matches!(
        to_versioned("demo", &o, FALLBACK),
        Err(StoreError::Malformed { detail, .. }) if detail == "the Lease object has no metadata.resourceVersion"
    ));
}

#[test]
fn writes_refuse_what_a_lease_cannot_hold_and_keep_other_fields() {
    let record = |d: Duration, t: u64| LeaseRecord {
        plugins: None,
        yielded: None,
        host: None,
        instance: None,
        holder: None,
        lease_duration: d,
        acquire_time: None,
        renew_time: None,
        term: t,
    };
    let mut data = json!({});
    for (r, what) in [
        (record(Duration::from_millis(1500), 1), "whole seconds"),
        (record(Duration::ZERO, 1), "whole seconds"),
        (record(Duration::from_secs(1), 1 << 31), "int32"),
    ] {
        match write_spec("demo", &mut data, &r) {
            Err(StoreError::Refused { detail, .. }) => assert!(detail.contains(what), "{detail}"),
            other => panic!("expected Refused, got {other:?}"),
        }
    }
    // A release: empty holder, times removed, everything else kept.
    let mut data = json!({"spec": {
            "holderIdentity": "x",
            "acquireTime": "2026-11-29T18:19:49.174601Z",
            "preferredHolder": "y",
        }, "status": {"foo": 1}});
    write_spec("demo", &mut data, &record(Duration::from_secs(1), 3)).unwrap();
    assert_eq!(
        data,
        json!({"spec": {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "leaseTransitions": 3,
                "preferredHolder": "y",
            }, "status": {"foo": 1}})
    );
}

#[test]
fn api_errors_map_to_store_errors() {
    let api = |code: u16, message: &str| {
        kube::Error::Api(
            kube::core::Status::failure(message, "Reason")
                .with_code(code)
                .boxed(),
        )
    };
    assert!(map_error("l", "update", api(409, "conflict")).is_conflict());
    let forbidden = map_error(
        "l",
        "create",
        api(
            403,
            "leases.coordination.k8s.io is forbidden: User \"nobody\" cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"x\"",
        ),
    );
    match forbidden {
        StoreError::Refused { detail, .. } => {
            assert!(detail.starts_with("forbidden: "), "{detail}");
            assert!(detail.contains("cannot create resource \"leases\""), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    for code in [410, 429, 500, 503, 504] {
        assert!(
            matches!(
                map_error("l", "get", api(code, "x")),
                StoreError::Unavailable { .. }
            ),
            "{code}"
        );
    }
    assert!(matches!(
        map_error("l", "create", api(422, "invalid")),
        StoreError::Refused { .. }
    ));
}

#[test]
fn the_holders_host_round_trips_through_annotations_and_leaves_with_the_holder() {
    use crate::store::HostInfo;
    let host = HostInfo {
        address: Some("10.1.2.3:8080".into()),
        draining: true,
        weight: 3,
        versions: [
            ("a".to_owned(), format!("sha256:{}", "1".repeat(64))),
            ("b".to_owned(), format!("sha256:{}", "2".repeat(64))),
        ]
        .into(),
    };
    let held = LeaseRecord {
        host: Some(host.clone()),
        instance: Some("i1".into()),
        ..LeaseRecord::new(Some("host-a"), 4, FALLBACK)
    };
    let read_back = |record: &LeaseRecord| {
        let mut o = object(Value::Null);
        write_annotations(&mut o.metadata.annotations, record);
        write_spec("demo", &mut o.data, record).unwrap();
        (
            to_versioned("demo", &o, FALLBACK).unwrap().record,
            o.metadata.annotations,
        )
    };
    let (read, annotations) = read_back(&held);
    assert_eq!(read.host, Some(host.clone()));
    assert_eq!(read.holder_address(), Some("10.1.2.3:8080"));
    let a = annotations.unwrap();
    assert_eq!(a[HOLDER_ADDRESS], "10.1.2.3:8080");
    assert_eq!(
        (a[HOLDER_DRAINING].as_str(), a[HOLDER_WEIGHT].as_str()),
        ("true", "3")
    );
    assert_eq!(a["owner.example/x"], "keep me");
    // Without an address: none written, none read.
    let bare = LeaseRecord {
        host: Some(HostInfo::default()),
        ..held.clone()
    };
    let (read, annotations) = read_back(&bare);
    assert_eq!(read.host, Some(HostInfo::default()));
    assert!(!annotations.unwrap().contains_key(HOLDER_ADDRESS));
    // A release, or another holder's write, drops the previous holder's.
    let mut o = object(Value::Null);
    write_annotations(&mut o.metadata.annotations, &held);
    for next in [
        LeaseRecord::new(None, 4, FALLBACK),
        LeaseRecord::new(Some("host-b"), 5, FALLBACK),
    ] {
        let mut o = o.clone();
        write_annotations(&mut o.metadata.annotations, &next);
        write_spec("demo", &mut o.data, &next).unwrap();
        let a = o.metadata.annotations.clone().unwrap();
        assert!(
            [HOLDER_ADDRESS, HOLDER_DRAINING, HOLDER_WEIGHT]
                .iter()
                .all(|k| !a.contains_key(*k)),
            "{a:?}"
        );
        assert_eq!(to_versioned("demo", &o, FALLBACK).unwrap().record.host, None);
    }
    // Annotations left by a holder that a foreign writer released are not
    // read without a holder; an older baton's record (none of them) reads
    // as no host.
    let mut o = object(json!({"holderIdentity": ""}));
    write_annotations(&mut o.metadata.annotations, &held);
    assert_eq!(to_versioned("demo", &o, FALLBACK).unwrap().record.host, None);
    let o = object(json!({"holderIdentity": "host-a"}));
    assert_eq!(to_versioned("demo", &o, FALLBACK).unwrap().record.host, None);
}
