//! The etcd store's layout and errors, without a server (the store itself
//! is tested against a real cluster: tests/etcd).

use super::layout::*;
use crate::store::{LeaseRecord, StoreError, TOMBSTONE};

#[test]
fn padded_numbers_compare_as_bytes_as_they_do_as_numbers() {
    let numbers = [0u64, 1, 9, 10, 99, 100, 12_345, u64::MAX / 2, u64::MAX];
    for a in numbers {
        for b in numbers {
            assert_eq!(pad(a).cmp(&pad(b)), a.cmp(&b), "{a} vs {b}");
        }
        assert_eq!(decode_number("l", "k", pad(a).as_bytes()).unwrap(), a);
    }
}

#[test]
fn a_record_round_trips_and_no_two_writes_store_the_same_bytes() {
    let record = LeaseRecord::new(Some("a"), 7, std::time::Duration::from_secs(4));
    let (one, two) = (encode_record(&record), encode_record(&record));
    assert_ne!(one, two, "each write has an id of its own");
    assert_eq!(decode_record("demo", "/baton/lease/demo", &one).unwrap(), record);
    assert_ne!(
        version_of(5, &one),
        version_of(5, &two),
        "a version names one write"
    );
    assert_eq!(revision_of(&version_of(5, &one)), Some(5));
    assert!(
        !version_of(5, &one).contains('@'),
        "no version looks like a {TOMBSTONE} one"
    );
}

#[test]
fn undecodable_values_are_malformed_naming_the_key_and_the_fix() {
    let e = decode_record("demo", "/baton/lease/demo", b"{not json").unwrap_err();
    assert!(
        matches!(&e, StoreError::Malformed { lease, .. } if lease == "demo"),
        "{e}"
    );
    assert!(
        e.to_string().contains("/baton/lease/demo") && e.to_string().contains("etcdctl del"),
        "{e}"
    );
    let e = decode_number("demo", "/baton/term/demo", b"seven").unwrap_err();
    assert!(e.to_string().contains("/baton/term/demo"), "{e}");
}

#[test]
fn keys_keep_records_floors_and_counts_apart() {
    assert_eq!(lease_key("/baton/", "demo"), "/baton/lease/demo");
    assert_eq!(floor_key("/baton/", "demo"), "/baton/term/demo");
    assert_eq!(creates_key("/baton/", "demo"), "/baton/creates/demo");
    assert!(lease_key("/baton/", "demo").starts_with(&leases_prefix("/baton/")));
    assert!(!floor_key("/baton/", "demo").starts_with(&leases_prefix("/baton/")));
}
