//! Key-value buckets that outlive a term, over `wasi:keyvalue`
//! (`0.2.0-draft2`: `store`, `atomics`, `batch`).
//!
//! Needs the `keyvalue` feature, and works in both worlds. Each term runs in
//! a fresh instance, so a plugin keeps what must survive a hand-over (a
//! counter, a cursor, the last item handled) in a bucket: the next leader,
//! on this host or another, reads it back.
//!
//! [`Bucket::open("default")`](Bucket::open) opens the plugin's own bucket,
//! which every plugin may use. Other names (lowercase DNS labels) must be
//! granted in the plugin's `keyvalue` list in the host's configuration; an
//! ungranted name fails with [`Error::AccessDenied`]. Such a bucket belongs
//! to the plugin's lease: every plugin of that lease granted the name sees
//! the same data. The host *fences* the buckets: before the term's
//! first call it claims them for the term, and a write from an older term
//! fails ([`Error::is_fenced`]). So a write that succeeds was made while
//! this host still led, and a task whose write fails should stop (return
//! `Err` or `Ok`, never retry forever).
//!
//! # Blocking and async
//!
//! The `wasi:keyvalue` functions are synchronous imports, so every method
//! here is a plain blocking call, the same in both worlds: a `future-plugin`
//! task calls them directly (no `.await`), and they block the task (its
//! change signal included) for as long as the call takes. A call is one
//! local transaction on the embedded store and one API request on
//! Kubernetes: keep values small and calls few (one per tick, not per
//! item).
//!
//! # Example
//!
//! A counter that a new leader continues:
//!
//! ```no_run
//! use baton_guest::kv::{Bucket, Error};
//!
//! fn tick(term: u64) -> Result<i64, Error> {
//!     let bucket = Bucket::open("default")?;
//!     // Atomic; stored as decimal text ("42").
//!     let total = bucket.increment("ticks", 1)?;
//!     // Any bytes; a read-modify-write retried until no other write
//!     // came between (compare-and-swap).
//!     bucket.update("last", |_old| Some(format!("{total} {term}").into_bytes()))?;
//!     Ok(total)
//! }
//! ```

use std::fmt;

use crate::__private::wasi_bindings::wasi::keyvalue::{atomics, batch, store};

/// The bucket every plugin may open without a grant: its own.
pub const DEFAULT_BUCKET: &str = "default";

/// How many times [`Bucket::update`] tries before it gives up with
/// [`Error::Contended`].
pub const UPDATE_ATTEMPTS: u32 = 100;

/// Why a key-value call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The bucket is not granted to this plugin: list it in the plugin's
    /// `keyvalue` grant (`default` is granted unless the list leaves it
    /// out).
    AccessDenied,
    /// The host has no store of that name.
    NoSuchStore,
    /// Anything else the host reports, in its words: a write refused
    /// because a newer term claimed the bucket ([`Error::is_fenced`]), a
    /// limit (key or value size, keys per bucket), the store being
    /// unreachable, an increment of a value that is not an integer.
    Other(String),
    /// [`Bucket::get_string`] found a value that is not UTF-8.
    NotUtf8 {
        /// The key read.
        key: String,
    },
    /// [`Bucket::update`] lost the compare-and-swap race
    /// [`UPDATE_ATTEMPTS`] times in a row.
    Contended {
        /// The key updated.
        key: String,
    },
}

impl Error {
    /// Whether the host refused a write because this task's term is over:
    /// a newer term has claimed the bucket, or the term is past its
    /// force-stop time. Whatever the status says yet, stop.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Other(m)
            if m.contains("has claimed the bucket") || m.contains("past its force-stop time"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::AccessDenied => {
                f.write_str("access denied: the bucket is not in this plugin's keyvalue grant")
            }
            Error::NoSuchStore => f.write_str("no such store"),
            Error::Other(message) => f.write_str(message),
            Error::NotUtf8 { key } => write!(f, "the value of {key:?} is not UTF-8"),
            Error::Contended { key } => write!(
                f,
                "gave up updating {key:?}: it changed under each of {UPDATE_ATTEMPTS} attempts"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<store::Error> for Error {
    fn from(e: store::Error) -> Error {
        match e {
            store::Error::AccessDenied => Error::AccessDenied,
            store::Error::NoSuchStore => Error::NoSuchStore,
            store::Error::Other(message) => Error::Other(message),
        }
    }
}

/// An open bucket: a map from string keys to byte values.
///
/// Opening is cheap; a task may keep a bucket for its whole term. A bucket
/// is never shared with another instance, but the data is: the next term's
/// instance sees what this one wrote.
#[derive(Debug)]
pub struct Bucket {
    inner: store::Bucket,
    name: String,
}

impl Bucket {
    /// Opens bucket `name`: [`DEFAULT_BUCKET`] for the plugin's own, or a
    /// name granted in its `keyvalue` list (else [`Error::AccessDenied`]).
    pub fn open(name: &str) -> Result<Bucket, Error> {
        Ok(Bucket {
            inner: store::open(name)?,
            name: name.to_owned(),
        })
    }

    /// The name it was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value of `key`, or `None` when it is not set.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.inner.get(key)?)
    }

    /// The value of `key` as text; [`Error::NotUtf8`] when it is not.
    pub fn get_string(&self, key: &str) -> Result<Option<String>, Error> {
        self.get(key)?
            .map(|bytes| String::from_utf8(bytes).map_err(|_| Error::NotUtf8 { key: key.to_owned() }))
            .transpose()
    }

    /// Sets `key` to `value`, replacing any value.
    pub fn set(&self, key: &str, value: impl AsRef<[u8]>) -> Result<(), Error> {
        Ok(self.inner.set(key, value.as_ref())?)
    }

    /// Deletes `key`; deleting a key that is not set is fine.
    pub fn delete(&self, key: &str) -> Result<(), Error> {
        Ok(self.inner.delete(key)?)
    }

    /// Whether `key` is set.
    pub fn exists(&self, key: &str) -> Result<bool, Error> {
        Ok(self.inner.exists(key)?)
    }

    /// The keys of the bucket, fetched a page at a time as the iterator
    /// goes; an error ends it after being yielded once.
    pub fn keys(&self) -> Keys<'_> {
        Keys {
            bucket: self,
            page: Vec::new().into_iter(),
            cursor: None,
            done: false,
        }
    }

    /// Adds `delta` to the integer at `key` (0 when not set) in one atomic
    /// step and returns the new value. The value is stored as decimal text
    /// (`b"42"`); a value that is not an integer is an [`Error::Other`].
    pub fn increment(&self, key: &str, delta: i64) -> Result<i64, Error> {
        Ok(atomics::increment(&self.inner, key, delta)?)
    }

    /// Reads `key` for a compare-and-swap: see [`Cas`].
    pub fn cas(&self, key: &str) -> Result<Cas, Error> {
        Ok(Cas {
            inner: atomics::Cas::new(&self.inner, key)?,
        })
    }

    /// Replaces the value of `key` with `f(current value)`, by
    /// compare-and-swap: if another write came between the read and the
    /// write, `f` is called again with the newer value (at most
    /// [`UPDATE_ATTEMPTS`] times). When `f` gives `None` nothing is
    /// written. Returns what was written.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton_guest::kv::Error> {
    /// let bucket = baton_guest::kv::Bucket::open("default")?;
    /// // Appends to a log kept in one value.
    /// bucket.update("log", |old| {
    ///     let mut log = old.unwrap_or_default().to_vec();
    ///     log.extend_from_slice(b"one more line\n");
    ///     Some(log)
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn update<F>(&self, key: &str, mut f: F) -> Result<Option<Vec<u8>>, Error>
    where
        F: FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    {
        let mut cas = self.cas(key)?;
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(new) = f(cas.current()?.as_deref()) else {
                return Ok(None);
            };
            match cas.swap(&new) {
                Ok(()) => return Ok(Some(new)),
                Err(CasError::Conflict(fresh)) => cas = fresh,
                Err(CasError::Store(e)) => return Err(e),
            }
        }
        Err(Error::Contended { key: key.to_owned() })
    }

    /// The values of `keys`, in order (`None` for a key not set), read
    /// together.
    pub fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let found = batch::get_many(&self.inner, &keys)?;
        Ok(found.into_iter().map(|kv| kv.map(|(_, v)| v)).collect())
    }

    /// Sets every pair in one write: in baton all of them or, on an error,
    /// none.
    pub fn set_many<K, V>(&self, pairs: &[(K, V)]) -> Result<(), Error>
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let pairs: Vec<(String, Vec<u8>)> = pairs
            .iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_vec()))
            .collect();
        Ok(batch::set_many(&self.inner, &pairs)?)
    }

    /// Deletes every key in one write: in baton all of them or, on an
    /// error, none.
    pub fn delete_many(&self, keys: &[&str]) -> Result<(), Error> {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        Ok(batch::delete_many(&self.inner, &keys)?)
    }
}

/// The keys of a bucket: see [`Bucket::keys`].
#[derive(Debug)]
pub struct Keys<'a> {
    bucket: &'a Bucket,
    page: std::vec::IntoIter<String>,
    cursor: Option<String>,
    done: bool,
}

impl Iterator for Keys<'_> {
    type Item = Result<String, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(key) = self.page.next() {
                return Some(Ok(key));
            }
            if self.done {
                return None;
            }
            match self.bucket.inner.list_keys(self.cursor.as_deref()) {
                Ok(response) => {
                    self.done = response.cursor.is_none();
                    self.cursor = response.cursor;
                    self.page = response.keys.into_iter();
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e.into()));
                }
            }
        }
    }
}

/// A value read for a compare-and-swap: [`Cas::swap`] writes only if the
/// value is still the one read.
///
/// [`Bucket::update`] is the usual way to use it.
#[derive(Debug)]
pub struct Cas {
    inner: atomics::Cas,
}

impl Cas {
    /// The value read (`None`: the key was not set).
    pub fn current(&self) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.inner.current()?)
    }

    /// Writes `value` if the key still has the value read; else gives
    /// [`CasError::Conflict`] with a fresh read, to try again.
    pub fn swap(self, value: &[u8]) -> Result<(), CasError> {
        atomics::swap(self.inner, value).map_err(|e| match e {
            atomics::CasError::CasFailed(fresh) => CasError::Conflict(Cas { inner: fresh }),
            atomics::CasError::StoreError(e) => CasError::Store(e.into()),
        })
    }
}

/// Why [`Cas::swap`] did not write.
#[derive(Debug)]
pub enum CasError {
    /// The value changed since it was read; here it is read again.
    Conflict(Cas),
    /// The write failed (see [`Error`]); a fenced write ends up here.
    Store(Error),
}

impl fmt::Display for CasError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CasError::Conflict(_) => f.write_str("the value changed since it was read"),
            CasError::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CasError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_went_wrong_and_fencing_is_recognised() {
        let fenced =
            Error::Other("bucket default: refused a write of term 3: term 4 has claimed the bucket".into());
        assert!(fenced.is_fenced());
        let stopped = Error::Other(
            "bucket demo/default: refused a write of term 3: the term is past its force-stop time".into(),
        );
        assert!(stopped.is_fenced());
        assert!(!Error::Other("value too large".into()).is_fenced());
        assert!(!Error::AccessDenied.is_fenced());
        assert!(Error::AccessDenied.to_string().contains("keyvalue grant"));
        assert_eq!(
            fenced.to_string(),
            "bucket default: refused a write of term 3: term 4 has claimed the bucket"
        );
        assert!(Error::Contended { key: "k".into() }.to_string().contains("\"k\""));
    }
}
