//! The store's files: a lease's directory of version files, its term
//! marks, *floor* and lock files ([`LeaseFiles`]), and the record as stored.

use super::*;

/// Name suffix of a lease's directory.
pub(super) const LEASE_SUFFIX: &str = ".lease";

/// Name suffix of a lease's record in an older baton (see
/// [`EmbeddedStore::open`]).
pub(super) const LEGACY_SUFFIX: &str = ".lease.json";

/// How many versions below the newest are kept. Enough that a writer can
/// tell, right after its link, whether the next version was written over
/// its own (see [`confirm`]) unless this many writes came in that moment;
/// few enough that reading the directory stays cheap.
pub(super) const KEPT_VERSIONS: u64 = 16;

/// How many of the highest term marks are kept in `.<lease>.terms/`.
pub(super) const KEPT_TERM_MARKS: usize = 4;

/// How old a temporary file must be before a writer removes it as left by
/// a writer that died or stopped. A write takes milliseconds; a writer
/// stopped for longer loses its write (its link finds no file), which is
/// what it would get anyway after its lease ran out.
pub(super) const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// How many times a read starts over when the newest version it listed was
/// removed before it could open it (a dozen writes in between).
pub(super) const READ_ATTEMPTS: usize = 100;

/// What is stored in a version file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StoredRecord {
    /// Chosen at random when the lease is created.
    pub(super) incarnation: String,
    /// 1 when created, plus one with each update.
    pub(super) counter: u64,
    /// Chosen at random for each write (empty in records of an older baton).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) write: String,
    /// The `write` id of the version this one replaced (empty for the first).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) replaced: String,
    /// The counter of the newest fsynced version at or below this one (its
    /// own if it was fsynced; 0: not known, written by an older baton). That
    /// version's file is never taken for a new version nor removed while it
    /// is the newest fsynced one, so that a crash that tears every renewal
    /// after it leaves it to read (see [Crash safety](self#crash-safety)).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) durable: u64,
    /// The lease record itself.
    pub(super) record: LeaseRecord,
}

impl StoredRecord {
    pub(super) fn version(&self) -> String {
        format!("{}-{}", self.incarnation, self.counter)
    }

    /// Whether [`StoredRecord::version`] is `version` (without making it).
    pub(super) fn is_version(&self, version: &str) -> bool {
        version
            .strip_prefix(self.incarnation.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|counter| counter.parse() == Ok(self.counter) && !counter.starts_with(['0', '+']))
    }

    pub(super) fn into_versioned(self) -> Versioned {
        Versioned {
            version: self.version(),
            record: self.record,
        }
    }
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A fresh random id, as 16 hex digits.
pub(super) fn random_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The name of the version file of `counter`.
pub(super) fn version_name(counter: u64) -> String {
    format!("{counter:020}.json")
}

/// The counter of a version file's name, if it is one.
pub(super) fn version_counter(name: &[u8]) -> Option<u64> {
    // Run for every entry of every listing: plain arithmetic.
    let digits = name.strip_suffix(b".json")?;
    if digits.len() != 20 {
        return None;
    }
    let mut counter: u64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        counter = counter.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
    }
    Some(counter)
}

/// The files of one (validated) lease. Only the two paths every request
/// uses are kept; the others are made when needed (a renewal uses none).
#[derive(Clone, Debug)]
pub(super) struct LeaseFiles {
    pub(super) lease: String,
    /// The store's directory.
    pub(super) dir: Arc<PathBuf>,
    /// The lease's directory, holding its versions.
    pub(super) versions: PathBuf,
}

impl LeaseFiles {
    pub(super) fn new(dir: Arc<PathBuf>, lease: &str) -> LeaseFiles {
        let mut versions =
            PathBuf::with_capacity(dir.as_os_str().len() + lease.len() + LEASE_SUFFIX.len() + 1);
        versions.push(&*dir);
        versions.push(lease);
        versions.as_mut_os_string().push(LEASE_SUFFIX);
        LeaseFiles {
            lease: lease.to_owned(),
            dir,
            versions,
        }
    }

    /// `.<lease><suffix>` in the store's directory.
    fn dotted(&self, suffix: &str) -> PathBuf {
        self.dir.join(format!(".{}{suffix}", self.lease))
    }

    /// The term marks.
    pub(super) fn terms(&self) -> PathBuf {
        self.dotted(".terms")
    }

    pub(super) fn lock(&self) -> PathBuf {
        self.dotted(".lock")
    }

    pub(super) fn floor(&self) -> PathBuf {
        self.dotted(".floor")
    }

    pub(super) fn floor_temp(&self) -> PathBuf {
        self.dotted(".floor.tmp")
    }

    /// The record of an older baton.
    pub(super) fn legacy(&self) -> PathBuf {
        self.dir.join(format!("{}{LEGACY_SUFFIX}", self.lease))
    }

    /// The path of a version file, for messages.
    pub(super) fn version_path(&self, counter: u64) -> PathBuf {
        self.versions.join(version_name(counter))
    }
}
