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

#[test]
fn answers_out_of_order_are_no_rewind_and_one_below_its_mark_is() {
    use super::Mark;
    let mut highest = Mark::default();
    assert!(!highest.note(10, 2, highest));
    // Two requests in flight together: the later answer (12) is noted
    // before the earlier one (11); both were sent after revision 10.
    let (first, second) = (highest, highest);
    assert!(!highest.note(12, 2, second));
    assert!(
        !highest.note(11, 2, first),
        "an answer out of order is not a rewind"
    );
    assert_eq!(highest.at_least(0), highest);
    // Sent after revision 12 was seen, answered at 5: the cluster went back.
    let mark = highest;
    let stale = highest;
    assert!(highest.note(5, 2, mark));
    // Another answer to a request sent before the rewind was noticed is not
    // a second rewind; answers after it are compared with the new cluster.
    assert!(!highest.note(6, 2, stale));
    let mark = highest;
    assert!(!highest.note(7, 2, mark));
    // A raft term below the mark's is a rewind too (a replaced cluster).
    let mark = highest;
    assert!(highest.note(8, 1, mark));
    // A watch's resume point raises the mark.
    let mark = highest.at_least(100);
    assert!(highest.note(90, 1, mark));
}
