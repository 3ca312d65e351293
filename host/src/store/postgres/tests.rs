//! Unit tests of the PostgreSQL store's logic without a server: schema
//! names, the terms of timelines. The store against a real PostgreSQL is
//! tested in `tests/postgres`.

use super::reads::term_base;
use super::validate_schema;

#[test]
fn schema_names_are_plain_lowercase_identifiers() {
    assert!(validate_schema("baton").is_ok());
    assert!(validate_schema("baton_2").is_ok());
    for bad in ["", "Baton", "2baton", "ba-ton", "a\"b", &"x".repeat(64)] {
        let e = validate_schema(bad).unwrap_err().to_string();
        assert!(e.contains("field `schema`"), "{bad:?}: {e}");
    }
}

#[test]
fn a_timeline_starts_its_terms_above_every_older_timeline() {
    assert_eq!(term_base(1), 0);
    assert_eq!(term_base(2), 1_000_000_000);
    assert_eq!(term_base(3), 2_000_000_000);
    assert_eq!(term_base(0), 0);
}
