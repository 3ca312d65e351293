//! Key-value buckets that a stale leader cannot write: the storage behind
//! `wasi:keyvalue`, kept where the lease is, and fenced by the lease's term.
//!
//! A bucket belongs to one lease ([`BucketName`]). Besides its entries it
//! keeps its *fence*: the highest term that claimed it or wrote to it.
//!
//! - [`BucketStore::claim`] raises the fence to a term (a term starting,
//!   before its guests' first call), or fails with [`BucketError::Fenced`]
//!   if a newer term already holds it.
//! - [`BucketStore::apply`] writes a batch of [`Op`]s in one atomic step
//!   that first compares the writer's term with the fence: a write of an
//!   older term is refused, whatever the clocks say. The comparison and the
//!   write are one transaction (the embedded store's SQLite) or one
//!   conditional update (a Kubernetes ConfigMap's `resourceVersion`).
//! - Each entry carries a version from its bucket's revision, which grows
//!   with every write and is never reused, so a compare-and-swap
//!   ([`Op::Swap`]) that read version `v` cannot succeed after the entry was
//!   deleted and written again.
//!
//! Reads are not fenced: they change nothing. An operator writes in a term
//! of its own ([`operator`]).
//!
//! Backends: [`embedded`](crate::store::embedded::buckets) (SQLite in the
//! store's directory), [`kube`](crate::store::kube::buckets) (ConfigMaps in
//! the lease's namespace), [`memory`](crate::store::memory::buckets)
//! (tests).

use std::fmt;

pub mod operator;

/// A bucket: a lease's name and the bucket's name under it. Terms are
/// counted per lease, so a bucket is fenced by the terms of its lease only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketName {
    /// The lease whose terms fence the bucket.
    pub lease: String,
    /// The bucket's name under the lease: a lowercase RFC 1123 label.
    pub bucket: String,
}

impl BucketName {
    /// The bucket `bucket` of `lease`.
    pub fn new(lease: &str, bucket: &str) -> BucketName {
        BucketName {
            lease: lease.to_owned(),
            bucket: bucket.to_owned(),
        }
    }
}

impl fmt::Display for BucketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.lease, self.bucket)
    }
}

/// The longest bucket name (a Kubernetes label value's limit).
pub const MAX_BUCKET_NAME: usize = 63;

/// Checks that `name` can name a bucket: 1 to 63 characters of `a-z`,
/// `0-9` and `-`, starting and ending with a letter or digit.
///
/// ```
/// use baton::store::buckets::validate_bucket_name;
///
/// assert!(validate_bucket_name("cursor-1").is_ok());
/// assert!(validate_bucket_name("Cursor").is_err());
/// ```
pub fn validate_bucket_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = !b.is_empty()
        && b.len() <= MAX_BUCKET_NAME
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid bucket name {name:?}: 1 to {MAX_BUCKET_NAME} characters of a-z, 0-9 and '-', \
             starting and ending with a letter or digit"
        ))
    }
}

/// A stored value and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Vec<u8>,
    /// The bucket's revision when the value was written; never 0.
    pub version: u64,
}

/// One change of a write ([`BucketStore::apply`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` to `value`.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Deletes `key` (nothing if it is absent).
    Delete {
        /// The key.
        key: String,
    },
    /// Adds `delta` to the integer stored at `key` (decimal ASCII, as
    /// `b"42"`), or sets it to `delta` if absent.
    Increment {
        /// The key.
        key: String,
        /// What to add.
        delta: i64,
    },
    /// Sets `key` to `value` only if its version is still `version` (0:
    /// only if it is absent).
    Swap {
        /// The key.
        key: String,
        /// The version read.
        version: u64,
        /// The new value.
        value: Vec<u8>,
    },
}

impl Op {
    /// The key the change is to.
    pub fn key(&self) -> &str {
        match self {
            Op::Set { key, .. } | Op::Delete { key } | Op::Increment { key, .. } | Op::Swap { key, .. } => {
                key
            }
        }
    }
}

/// The limits a write must keep: on each key, each value, and the bucket
/// (the sum of its keys' and values' lengths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest key, in bytes.
    pub key: usize,
    /// The longest value, in bytes.
    pub value: usize,
    /// The most a bucket may hold, in bytes.
    pub bucket: u64,
}

impl Default for Limits {
    /// 512 B keys, 1 MiB values, 16 MiB buckets (a Kubernetes store holds
    /// less: see [`kube`](crate::store::kube::buckets)).
    fn default() -> Limits {
        Limits {
            key: 512,
            value: 1 << 20,
            bucket: 16 << 20,
        }
    }
}

/// A write: its term, its changes, its limits, and a last check that the
/// writer may still act, made after the term's fence was compared and
/// right before the write is made durable.
#[derive(Clone)]
pub struct Write {
    /// The writer's term.
    pub term: u64,
    /// The changes, applied all or none, in order.
    pub ops: Vec<Op>,
    /// The limits they must keep.
    pub limits: Limits,
    /// Whether the writer may still act (its term not past its force-stop
    /// time); `false` refuses the write with [`BucketError::Stopped`].
    pub may_commit: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Write {
    /// A write of `ops` in `term` under `limits` whose writer may always act
    /// (an operator's, a test's).
    pub fn new(term: u64, ops: Vec<Op>, limits: Limits) -> Write {
        Write {
            term,
            ops,
            limits,
            may_commit: std::sync::Arc::new(|| true),
        }
    }
}

/// What a write returned: for each [`Op::Increment`], the new value, in
/// order.
pub type Applied = Vec<i64>;

/// A bucket as listed by [`BucketStore::buckets`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketInfo {
    /// Its name.
    pub name: BucketName,
    /// The highest term that claimed or wrote it.
    pub fence: u64,
    /// How many entries it holds.
    pub entries: u64,
    /// The sum of its keys' and values' lengths, in bytes.
    pub bytes: u64,
}

/// Why a bucket operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// A newer term has claimed or written the bucket: the writer's term is
    /// over, whatever its clock says.
    #[error("bucket {bucket}: refused a write of term {term}: term {fence} has claimed the bucket")]
    Fenced {
        /// The bucket.
        bucket: BucketName,
        /// The writer's term.
        term: u64,
        /// The bucket's fence.
        fence: u64,
    },
    /// The writer's term was past its force-stop time at the last check.
    #[error("bucket {bucket}: refused a write of term {term}: the term is past its force-stop time")]
    Stopped {
        /// The bucket.
        bucket: BucketName,
        /// The writer's term.
        term: u64,
    },
    /// A compare-and-swap found the entry changed since it was read.
    #[error("bucket {bucket}: key {key:?} changed since it was read")]
    Changed {
        /// The bucket.
        bucket: BucketName,
        /// The key.
        key: String,
    },
    /// A write would break a limit.
    #[error("bucket {bucket}: {detail}")]
    Limit {
        /// The bucket.
        bucket: BucketName,
        /// Which limit, and by how much.
        detail: String,
    },
    /// An increment found a value that is not a decimal integer, or would
    /// overflow.
    #[error("bucket {bucket}: key {key:?}: {detail}")]
    NotAnInteger {
        /// The bucket.
        bucket: BucketName,
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The store could not be reached or did not answer in time.
    #[error("bucket {bucket}: store unavailable: {detail}")]
    Unavailable {
        /// The bucket.
        bucket: BucketName,
        /// What went wrong.
        detail: String,
    },
    /// What is stored cannot be read as a bucket.
    #[error("bucket {bucket}: malformed: {detail}")]
    Malformed {
        /// The bucket.
        bucket: BucketName,
        /// What is wrong with it.
        detail: String,
    },
}

impl BucketError {
    /// Whether a newer term fenced the write (or the writer's own term had
    /// ended): a stale leader's write, refused.
    pub fn is_stale(&self) -> bool {
        matches!(self, BucketError::Fenced { .. } | BucketError::Stopped { .. })
    }
}

/// Where buckets live. One per lease store.
///
/// Implementations make [`claim`](BucketStore::claim) and
/// [`apply`](BucketStore::apply) atomic with respect to every other writer,
/// in this process or another: the fence is compared and the write made in
/// one step.
#[async_trait::async_trait]
pub trait BucketStore: Send + Sync + 'static {
    /// A short description for logs.
    fn describe(&self) -> String;

    /// Raises `bucket`'s fence to `term` (creating the bucket if needed) and
    /// returns the fence it had before; [`BucketError::Fenced`] if it is
    /// already higher. Claiming again in the same term changes nothing.
    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError>;

    /// The value and version of `key`; `None` if absent (or the bucket is).
    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError>;

    /// The values of `keys`, in order, read at one moment.
    async fn get_many(&self, bucket: &BucketName, keys: &[String])
    -> Result<Vec<Option<Entry>>, BucketError>;

    /// Up to `limit` keys after `after` (all from the first if `None`), in
    /// byte order.
    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError>;

    /// Applies `write` if its term is not older than the bucket's fence, and
    /// raises the fence to it: all of its ops or none.
    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError>;

    /// Every bucket, or those of `lease`, for `baton kv`.
    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError>;
}

/// Applies `ops` to a bucket's entries in memory: the one implementation of
/// what each op means, for the backends that load a bucket, change it and
/// write it back (memory, Kubernetes). `revision` is the bucket's revision
/// before the write; every entry written gets `revision + 1`. Returns the
/// increments' results and the bucket's new size in bytes, or the error
/// that refuses the whole write.
pub fn apply_to_entries(
    bucket: &BucketName,
    entries: &mut std::collections::BTreeMap<String, Entry>,
    revision: u64,
    ops: &[Op],
    limits: Limits,
) -> Result<Applied, BucketError> {
    let version = revision + 1;
    let mut applied = Vec::new();
    for op in ops {
        check_key(bucket, op.key(), limits)?;
        match op {
            Op::Set { key, value } => {
                check_value(bucket, key, value, limits)?;
                entries.insert(
                    key.clone(),
                    Entry {
                        value: value.clone(),
                        version,
                    },
                );
            }
            Op::Delete { key } => {
                entries.remove(key);
            }
            Op::Increment { key, delta } => {
                let next = incremented(bucket, key, entries.get(key).map(|e| e.value.as_slice()), *delta)?;
                entries.insert(
                    key.clone(),
                    Entry {
                        value: next.to_string().into_bytes(),
                        version,
                    },
                );
                applied.push(next);
            }
            Op::Swap {
                key,
                version: seen,
                value,
            } => {
                let now = entries.get(key).map_or(0, |e| e.version);
                if now != *seen {
                    return Err(BucketError::Changed {
                        bucket: bucket.clone(),
                        key: key.clone(),
                    });
                }
                check_value(bucket, key, value, limits)?;
                entries.insert(
                    key.clone(),
                    Entry {
                        value: value.clone(),
                        version,
                    },
                );
            }
        }
    }
    let size: u64 = entries
        .iter()
        .map(|(k, e)| (k.len() + e.value.len()) as u64)
        .sum();
    check_size(bucket, size, limits)?;
    Ok(applied)
}

/// The new value of an increment of `current` by `delta`.
pub fn incremented(
    bucket: &BucketName,
    key: &str,
    current: Option<&[u8]>,
    delta: i64,
) -> Result<i64, BucketError> {
    let not_integer = |detail: String| BucketError::NotAnInteger {
        bucket: bucket.clone(),
        key: key.to_owned(),
        detail,
    };
    let now = match current {
        None => 0,
        Some(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| not_integer("the value is not a decimal integer".into()))?,
    };
    now.checked_add(delta)
        .ok_or_else(|| not_integer(format!("{now} + {delta} overflows a 64-bit integer")))
}

/// Refuses a key longer than the limit.
pub fn check_key(bucket: &BucketName, key: &str, limits: Limits) -> Result<(), BucketError> {
    if key.len() > limits.key {
        return Err(BucketError::Limit {
            bucket: bucket.clone(),
            detail: format!(
                "key of {} bytes, longer than the limit of {} bytes",
                key.len(),
                limits.key
            ),
        });
    }
    Ok(())
}

/// Refuses a value longer than the limit.
pub fn check_value(bucket: &BucketName, key: &str, value: &[u8], limits: Limits) -> Result<(), BucketError> {
    if value.len() > limits.value {
        return Err(BucketError::Limit {
            bucket: bucket.clone(),
            detail: format!(
                "value of {} bytes for key {key:?}, longer than the limit of {} bytes",
                value.len(),
                limits.value
            ),
        });
    }
    Ok(())
}

/// Refuses a bucket that would hold more than the limit.
pub fn check_size(bucket: &BucketName, size: u64, limits: Limits) -> Result<(), BucketError> {
    if size > limits.bucket {
        return Err(BucketError::Limit {
            bucket: bucket.clone(),
            detail: format!(
                "the bucket would hold {size} bytes, more than the limit of {} bytes",
                limits.bucket
            ),
        });
    }
    Ok(())
}

/// Refuses a write of `term` to a bucket fenced at `fence`.
pub fn check_fence(bucket: &BucketName, term: u64, fence: u64) -> Result<(), BucketError> {
    if fence > term {
        return Err(BucketError::Fenced {
            bucket: bucket.clone(),
            term,
            fence,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn b() -> BucketName {
        BucketName::new("demo", "counter")
    }

    #[test]
    fn increments_are_decimal_and_start_at_zero() {
        let mut entries = BTreeMap::new();
        let ops = [
            Op::Increment {
                key: "n".into(),
                delta: 5,
            },
            Op::Increment {
                key: "n".into(),
                delta: -2,
            },
        ];
        let applied = apply_to_entries(&b(), &mut entries, 7, &ops, Limits::default()).unwrap();
        assert_eq!(applied, vec![5, 3]);
        assert_eq!(
            entries["n"],
            Entry {
                value: b"3".to_vec(),
                version: 8
            }
        );
    }

    #[test]
    fn a_swap_fails_once_the_entry_changed_even_if_rewritten() {
        let mut entries = BTreeMap::new();
        let set = [Op::Set {
            key: "k".into(),
            value: b"a".to_vec(),
        }];
        apply_to_entries(&b(), &mut entries, 0, &set, Limits::default()).unwrap();
        apply_to_entries(
            &b(),
            &mut entries,
            1,
            &[Op::Delete { key: "k".into() }],
            Limits::default(),
        )
        .unwrap();
        apply_to_entries(&b(), &mut entries, 2, &set, Limits::default()).unwrap();
        let swap = [Op::Swap {
            key: "k".into(),
            version: 1,
            value: b"b".to_vec(),
        }];
        let e = apply_to_entries(&b(), &mut entries, 3, &swap, Limits::default()).unwrap_err();
        assert!(matches!(e, BucketError::Changed { .. }), "{e}");
        let swap = [Op::Swap {
            key: "k".into(),
            version: 3,
            value: b"b".to_vec(),
        }];
        apply_to_entries(&b(), &mut entries, 3, &swap, Limits::default()).unwrap();
    }

    #[test]
    fn limits_name_the_bucket_and_the_limit() {
        let mut entries = BTreeMap::new();
        let limits = Limits {
            key: 4,
            value: 4,
            bucket: 9,
        };
        let long_key = [Op::Set {
            key: "abcde".into(),
            value: vec![],
        }];
        let e = apply_to_entries(&b(), &mut entries, 0, &long_key, limits).unwrap_err();
        assert!(
            e.to_string().contains("demo/counter") && e.to_string().contains("limit of 4 bytes"),
            "{e}"
        );
        let full = [
            Op::Set {
                key: "a".into(),
                value: b"1234".to_vec(),
            },
            Op::Set {
                key: "b".into(),
                value: b"1234".to_vec(),
            },
        ];
        let e = apply_to_entries(&b(), &mut entries, 0, &full, limits).unwrap_err();
        assert!(
            e.to_string().contains("10 bytes, more than the limit of 9"),
            "{e}"
        );
    }

    #[test]
    fn an_older_term_is_fenced() {
        assert!(check_fence(&b(), 3, 3).is_ok());
        assert!(check_fence(&b(), 4, 3).is_ok());
        let e = check_fence(&b(), 2, 3).unwrap_err();
        assert!(
            e.is_stale() && e.to_string().contains("term 3 has claimed"),
            "{e}"
        );
    }
}
