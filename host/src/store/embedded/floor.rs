//! *Term floors*: the floor file and the term marks that keep a lease's
//! highest term across its deletion, and the lock that serialises creates
//! and deletes.

use super::*;

/// What is kept of a lease besides its record: the term floor (the highest
/// term ever written) and how many times the record was created. Both only
/// grow. The floor is the higher of the term marks (`.<lease>.terms/`) and
/// the floor file's; the count is the floor file's, replaced whole (write,
/// fsync, rename) under the lease's lock, so that a writer killed at any
/// point leaves the old state or the new one. Before the floor file, both
/// were written in place into the lock file: such a lock file is read
/// while there is no floor file, and the next create moves them over. No
/// state at all reads as zeros; one written before the create count reads
/// as count 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct LockState {
    pub(super) floor: u64,
    pub(super) creates: u64,
}

/// Reads the [`LockState`] in a lease's floor file (or the lock file of an
/// older baton), without the term marks.
pub(super) fn read_floor_file(files: &LeaseFiles) -> Result<LockState, StoreError> {
    // Two numbers of at most 20 digits each; anything longer is wrong.
    const MOST: u64 = 128;
    let read = |path: &Path| -> Result<Option<String>, StoreError> {
        match File::open(path) {
            Ok(file) => {
                let mut bytes = Vec::new();
                file.take(MOST)
                    .read_to_end(&mut bytes)
                    .map_err(|e| io_error(&files.lease, "cannot read", path, e))?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&files.lease, "cannot read", path, e)),
        }
    };
    let (floor, lock) = (files.floor(), files.lock());
    let (path, text) = match read(&floor)? {
        Some(text) => (&floor, text),
        None => (&lock, read(&lock)?.unwrap_or_default()),
    };
    parse_lock_state(files, path, &text)
}

/// Reads a lease's [`LockState`]: the floor file (or the lock file of an
/// older baton) and the term marks.
pub(super) fn read_lock_state(files: &LeaseFiles) -> Result<LockState, StoreError> {
    let state = read_floor_file(files)?;
    let marks = term_marks(files)?;
    Ok(LockState {
        floor: state.floor.max(marks.last().copied().unwrap_or(0)),
        ..state
    })
}

/// Whether the lease's term floor is at least `term`: the floor file's, or
/// else the term marks' (listed only then).
pub(super) fn floor_reaches(files: &LeaseFiles, term: u64) -> Result<bool, StoreError> {
    if read_floor_file(files)?.floor >= term {
        return Ok(true);
    }
    Ok(term_marks(files)?.last().is_some_and(|&mark| mark >= term))
}

/// Parses the text of a floor file (or of an older baton's lock file).
pub(super) fn parse_lock_state(files: &LeaseFiles, path: &Path, text: &str) -> Result<LockState, StoreError> {
    let bad = || StoreError::Refused {
        lease: files.lease.clone(),
        detail: format!(
            "{}: expected the term floor (the highest term the lease has had) and a create \
             count, two numbers, found {:?}; baton does not guess a floor: write the two \
             numbers there (the floor at least the `transitions` of the lease's record, \
             the count 0)",
            path.display(),
            text.trim()
        ),
    };
    let mut numbers = text
        .split_whitespace()
        .map(|t| t.parse::<u64>().map_err(|_| bad()));
    let state = LockState {
        floor: numbers.next().transpose()?.unwrap_or(0),
        creates: numbers.next().transpose()?.unwrap_or(0),
    };
    if numbers.next().is_some() {
        return Err(bad());
    }
    Ok(state)
}

/// Replaces a lease's floor file atomically and durably (the caller holds
/// the lock): written whole and renamed into place.
pub(super) fn write_lock_state(files: &LeaseFiles, state: LockState) -> Result<(), StoreError> {
    let text = format!("{} {}\n", state.floor, state.creates);
    replace_file(files, &files.floor_temp(), &files.floor(), text.as_bytes())
}

/// The term marks of a lease, lowest first. Names that are not numbers
/// are not marks (an editor's backup file, say) and are left alone.
pub(super) fn term_marks(files: &LeaseFiles) -> Result<Vec<u64>, StoreError> {
    let terms = files.terms();
    let entries = match fs::read_dir(&terms) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(&files.lease, "cannot list", &terms, e)),
    };
    let mut marks = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(&files.lease, "cannot list", &terms, e))?;
        if let Some(term) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
            marks.push(term);
        }
    }
    marks.sort_unstable();
    Ok(marks)
}

/// Raises the lease's term floor to `term`, durably, without a lock: marks
/// only ever add a name, so of two writers raising it at once neither can
/// lower what the other wrote. Keeps the highest few marks.
pub(super) fn raise_floor(files: &LeaseFiles, term: u64) -> Result<(), StoreError> {
    let cannot = |what: &str, path: &Path, e: io::Error| io_error(&files.lease, what, path, e);
    let terms = files.terms();
    let fresh = match fs::create_dir(&terms) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(cannot("cannot create", &terms, e)),
    };
    let mark = terms.join(term.to_string());
    File::create(&mark).map_err(|e| cannot("cannot create", &mark, e))?;
    File::open(&terms)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| cannot("cannot sync", &terms, e))?;
    if fresh {
        sync_dir(files)?;
    }
    let marks = term_marks(files)?;
    for old in marks.iter().rev().skip(KEPT_TERM_MARKS) {
        let _ = fs::remove_file(terms.join(old.to_string()));
    }
    Ok(())
}

/// The longest a reader waits for a create or delete to release a lease's
/// lock (they take milliseconds; the elector's own request timeout usually
/// gives up sooner).
pub(super) const SHARED_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes `lock`, shared or exclusive, without pinning this thread for good
/// behind a holder that keeps it far longer than one create (a stopped
/// process, a stuck fsync): polls it, and fails with the reason `give_up`
/// returns once it returns one.
pub(super) fn take_lock(
    files: &LeaseFiles,
    lock: &File,
    shared: bool,
    give_up: &dyn Fn() -> Option<String>,
) -> Result<(), StoreError> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(detail) = give_up() {
            return Err(StoreError::Unavailable {
                lease: files.lease.clone(),
                detail,
            });
        }
        let attempt = if shared {
            lock.try_lock_shared()
        } else {
            lock.try_lock()
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io_error(&files.lease, "cannot lock", &files.lock(), e));
            }
        }
    }
}
