//! Where and how the etcd store keeps a lease: its keys under the
//! configured prefix, the record as stored, the *term floor*'s value, and
//! the versions handed out.
//!
//! - `<prefix>lease/<lease>`: the record, as JSON (the embedded store's
//!   form of [`LeaseRecord`]) with a random id of its write, so that no two
//!   writes store the same bytes;
//! - `<prefix>term/<lease>`: the lease's term floor, the highest term it
//!   was ever written with, zero-padded to 20 digits so that etcd's
//!   byte-wise comparison of values is a numeric one; written in the same
//!   transaction as every write that starts a term or creates the record,
//!   never deleted by baton;
//! - `<prefix>creates/<lease>`: how many times the record was created (so
//!   that a reader that finds it missing twice knows whether it was
//!   created and deleted in between), written with every create.
//!
//! A version is `<mod_revision>-<hash>`: the revision orders versions; the
//! hash of the stored bytes (which hold the write id) makes a version name
//! one write only, even after a restore from a snapshot has reused
//! revisions. It contains no `@` (see [`TOMBSTONE`](crate::store::TOMBSTONE)).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{LeaseRecord, StoreError};

/// The key of `lease`'s record under `prefix`.
pub(super) fn lease_key(prefix: &str, lease: &str) -> String {
    format!("{prefix}lease/{lease}")
}

/// The key prefix of every record under `prefix`.
pub(super) fn leases_prefix(prefix: &str) -> String {
    format!("{prefix}lease/")
}

/// The key of `lease`'s term floor under `prefix`.
pub(super) fn floor_key(prefix: &str, lease: &str) -> String {
    format!("{prefix}term/{lease}")
}

/// The key of `lease`'s create count under `prefix`.
pub(super) fn creates_key(prefix: &str, lease: &str) -> String {
    format!("{prefix}creates/{lease}")
}

/// A number as stored in a floor: 20 digits, so that bytes compare as
/// numbers do.
pub(super) fn pad(n: u64) -> String {
    format!("{n:020}")
}

/// The number stored at `key` (a term floor or a create count).
pub(super) fn decode_number(lease: &str, key: &str, bytes: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| StoreError::Malformed {
            lease: lease.to_owned(),
            detail: format!(
                "{key} holds {:?}, not a number; baton writes it: put back a number at least as \
                 high as the lease's highest term, or delete it with `etcdctl del {key}` while no \
                 host leads the lease",
                String::from_utf8_lossy(bytes)
            ),
        })
}

/// What is stored at a lease's key.
#[derive(Serialize, Deserialize)]
struct Stored<'r> {
    /// Chosen at random for each write; absent in a record written by
    /// hand.
    #[serde(default)]
    write: String,
    #[serde(flatten)]
    record: std::borrow::Cow<'r, LeaseRecord>,
}

/// `record` as stored, with a fresh write id.
pub(super) fn encode_record(record: &LeaseRecord) -> Vec<u8> {
    let stored = Stored {
        write: format!("{:016x}", rand::random::<u64>()),
        record: std::borrow::Cow::Borrowed(record),
    };
    serde_json::to_vec(&stored).expect("a lease record serializes")
}

/// The record stored as `bytes` at `key`.
pub(super) fn decode_record(lease: &str, key: &str, bytes: &[u8]) -> Result<LeaseRecord, StoreError> {
    serde_json::from_slice::<Stored<'static>>(bytes)
        .map(|s| s.record.into_owned())
        .map_err(|e| StoreError::Malformed {
            lease: lease.to_owned(),
            detail: format!(
                "the record at {key} is not a lease record ({e}); write a valid one, or delete it \
                 with `etcdctl del {key}` (its term floor stays, so terms are not reused)"
            ),
        })
}

/// The version of the bytes `value` written at `mod_revision`.
pub(super) fn version_of(mod_revision: i64, value: &[u8]) -> String {
    let hash = Sha256::digest(value);
    format!(
        "{mod_revision}-{:02x}{:02x}{:02x}{:02x}",
        hash[0], hash[1], hash[2], hash[3]
    )
}

/// The revision in `version`, if it is one of this store's.
pub(super) fn revision_of(version: &str) -> Option<i64> {
    version.split_once('-')?.0.parse().ok()
}
