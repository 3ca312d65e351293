//! Tests of [`deleted`](super).

use std::time::Duration;

use super::*;

fn v(version: &str, holder: Option<&str>, term: u64) -> Versioned {
    Versioned {
        version: version.into(),
        record: LeaseRecord {
            plugins: None,
            yielded: None,
            host: None,
            instance: None,
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(10),
            acquire_time: None,
            renew_time: None,
            term,
        },
    }
}

fn missing(floor: Option<u64>, creates: Option<u64>) -> Found {
    Found::Missing {
        last: None,
        floor,
        creates,
    }
}

#[test]
fn a_record_deleted_while_held_reads_as_one_tombstone_until_written_again() {
    let d = DeletedRecords::default();
    d.found("l", Found::Record(v("x-1", Some("a"), 3)));
    let t = d.found("l", missing(Some(3), Some(1))).unwrap();
    assert_eq!(t.version, "deleted@x-1");
    assert_eq!(t.record.holder(), Some("a"));
    // Read again: the same version, so readers keep their dates.
    assert_eq!(d.found("l", missing(Some(3), Some(1))), Some(t.clone()));
    assert_eq!(d.create_floor("l", "deleted@x-1").unwrap(), 3);
    assert!(d.create_floor("l", "deleted@x-0").unwrap_err().is_conflict());
    // Written again: a record, no tombstone.
    d.wrote("l", &v("y-1", Some("a"), 3));
    assert!(d.tombstone("l").is_none());
    assert!(d.create_floor("l", "deleted@x-1").is_err());
}

#[test]
fn a_released_record_deleted_reads_as_its_floor_or_as_gone() {
    let d = DeletedRecords::default();
    d.found("l", Found::Record(v("x-1", None, 4)));
    let f = d.found("l", missing(Some(4), Some(1))).unwrap();
    assert_eq!(f.version, "deleted@term-4");
    assert_eq!((f.record.holder(), f.record.term), (None, 4));
    assert_eq!(d.create_floor("l", &f.version).unwrap(), 4);
    // A backend without a floor (Kubernetes): gone.
    let k = DeletedRecords::default();
    k.found("l", Found::Record(v("7", None, 4)));
    assert_eq!(k.found("l", missing(None, None)), None);
}

#[test]
fn a_recreate_and_second_deletion_between_reads_dates_the_holder_again() {
    let d = DeletedRecords::default();
    d.found("l", Found::Record(v("x-1", Some("a"), 2)));
    let first = d.found("l", missing(Some(2), Some(1))).unwrap();
    let again = d.found("l", missing(Some(2), Some(2))).unwrap();
    assert_eq!(again.version, format!("{}+1", first.version));
    assert_eq!(again.record, first.record);
    assert_eq!(d.create_floor("l", &again.version).unwrap(), 2);
    // A higher term started since, by a write not seen here: its
    // holder is unknown and may lead, so the tombstone stands for it at
    // that term, dated anew (the create count moved too).
    let later = d.found("l", missing(Some(5), Some(3))).unwrap();
    assert_eq!(later.version, "deleted@x-1+2");
    assert_eq!((later.record.holder(), later.record.term), (Some("a"), 5));
    assert_eq!(d.create_floor("l", &later.version).unwrap(), 5);
    // The floor alone moving keeps the version: nothing was created.
    let still = d.found("l", missing(Some(6), Some(3))).unwrap();
    assert_eq!((still.version.as_str(), still.record.term), ("deleted@x-1+2", 6));
}

#[test]
fn a_deletion_event_carries_the_last_state_and_is_learned_once() {
    let d = DeletedRecords::default();
    d.found("l", Found::Record(v("10", Some("a"), 1)));
    let by_read = d.found("l", missing(None, None)).unwrap();
    let by_event = d
        .found(
            "l",
            Found::Missing {
                last: Some(v("10", Some("a"), 1)),
                floor: None,
                creates: None,
            },
        )
        .unwrap();
    assert_eq!(by_read, by_event, "one deletion, one version");
    // A deletion of a state this store never read (a foreign write,
    // then the delete): the event's state counts.
    let foreign = d
        .found(
            "l",
            Found::Missing {
                last: Some(v("12", Some("b"), 2)),
                floor: None,
                creates: None,
            },
        )
        .unwrap();
    assert_eq!(foreign.version, "deleted@12");
    assert_eq!(foreign.record.holder(), Some("b"));
}

#[test]
fn a_read_overtaken_by_an_own_write_reports_the_write() {
    let d = DeletedRecords::default();
    d.found("l", Found::Record(v("x-1", Some("a"), 1)));
    let ticket = d.ticket("l");
    d.wrote("l", &v("x-2", Some("a"), 1));
    let old = Found::Record(v("x-1", Some("a"), 1));
    assert_eq!(d.found_since("l", ticket, old).unwrap().version, "x-2");
    let ticket = d.ticket("l");
    let new = Found::Record(v("x-3", Some("b"), 2));
    assert_eq!(d.found_since("l", ticket, new).unwrap().version, "x-3");
}

#[test]
fn reads_older_than_a_write_and_repeated_deletions_are_reported_safely() {
    let seen = DeletedRecords::default();
    let w = |version: &str, holder: Option<&str>| v(version, holder, 3);
    let none = |floor, creates| missing(Some(floor), Some(creates));
    // A read that began before this store's own write reports the write.
    let since = seen.ticket("l");
    seen.wrote("l", &w("x-2", Some("me")));
    assert_eq!(
        seen.found_since("l", since, Found::Record(w("x-1", Some("old")))),
        Some(w("x-2", Some("me")))
    );
    let since = seen.ticket("l");
    assert_eq!(
        seen.found_since("l", since, none(3, 1)).unwrap().version,
        "deleted@x-2"
    );
    // A read that began before the write reports it, not the deletion.
    let since = seen.ticket("l");
    seen.wrote("l", &w("y-1", Some("me")));
    assert_eq!(
        seen.found_since("l", since, none(3, 2)),
        Some(w("y-1", Some("me")))
    );
    // Deleted: one tombstone, reported again by every read, until the
    // backend counts another create (the record was written again and
    // deleted again between two reads): then a new version makes the
    // others date the holder's lease from that read.
    let since = seen.ticket("l");
    let first = seen.found_since("l", since, none(3, 2)).unwrap();
    assert_eq!(first.version, "deleted@y-1");
    assert_eq!(seen.found_since("l", since, none(3, 2)), Some(first.clone()));
    let renewed = seen.found_since("l", since, none(3, 3)).unwrap();
    assert_eq!(renewed.version, "deleted@y-1+1");
    assert_eq!(renewed.record, first.record);
    assert_eq!(seen.found_since("l", since, none(3, 3)), Some(renewed.clone()));
    assert_eq!(seen.create_floor("l", "deleted@y-1+1").unwrap(), 3);
    assert!(seen.create_floor("l", "deleted@y-1").is_err());
    assert_eq!(
        seen.found_since("l", since, none(3, 5)).unwrap().version,
        "deleted@y-1+2"
    );
    // A higher term started (and deleted) since: the tombstone of this
    // store's own write stays as it is (it writes it again in its own
    // term, which the backend refuses if another host wrote since)...
    let own = seen.found_since("l", since, none(4, 6)).unwrap();
    assert_eq!((own.version.as_str(), own.record.term), ("deleted@y-1+3", 3));
    assert_eq!(seen.create_floor("l", "deleted@y-1+3").unwrap(), 3);
    // ...while another store's stands for the newer term's unknown holder.
    let other = DeletedRecords::default();
    other.found("l", Found::Record(w("y-1", Some("me"))));
    let lifted = other.found("l", none(4, 6)).unwrap();
    assert_eq!((lifted.version.as_str(), lifted.record.term), ("deleted@y-1", 4));
    assert!(seen.create_floor("l", "deleted@y-1+2").is_err());
}

#[test]
fn an_own_tombstone_whose_create_is_refused_by_the_floor_stands_for_another_holder() {
    // b led term 2 and was paused; c took term 3, unseen by b's store; the
    // record was deleted. b's store reports b's own record as the tombstone.
    let d = DeletedRecords::default();
    let mut own = v("x-2", Some("b"), 2);
    own.record.instance = Some("b-1".into());
    d.wrote("l", &own);
    let t = d.found("l", missing(Some(3), Some(2))).unwrap();
    assert_eq!((t.version.as_str(), t.record.term), ("deleted@x-2", 2));
    assert!(d.is_own_tombstone("l", &t.version));
    // b's create over it, at floor 2, is refused: the floor is 3.
    d.create_refused("l", &t.version);
    let after = d.found("l", missing(Some(3), Some(2))).unwrap();
    assert_ne!(after.version, t.version, "dated anew");
    assert_eq!(after.record.term, 3, "at the floor");
    assert!(!after.record.held_by("b", "b-1"), "no longer b's own");
    assert!(!d.is_own_tombstone("l", &after.version));
    assert_eq!(d.create_floor("l", &after.version).unwrap(), 3);
    // The deletion learned again (a watch event carrying the old record)
    // does not make it b's own again.
    let again = d.found(
        "l",
        Found::Missing {
            last: Some(own.clone()),
            floor: Some(3),
            creates: Some(2),
        },
    );
    assert_eq!(again, Some(after.clone()));
    // Another host's tombstone is left as it is.
    let other = DeletedRecords::default();
    other.found("l", Found::Record(v("x-3", Some("c"), 3)));
    let ct = other.found("l", missing(Some(3), Some(1))).unwrap();
    other.create_refused("l", &ct.version);
    assert_eq!(other.found("l", missing(Some(3), Some(1))), Some(ct));
}
