//! The memory store: leases in a map in this process, with fault injection,
//! for unit tests of the elector.
//!
//! Clones of a [`MemoryStore`] share their state, so a test can hand one
//! clone to the code under test and keep another to inject faults, write as a
//! foreign host would, and count requests.
//!
//! # Deleted records
//!
//! The store follows the [deleted records](super#deleted-records) rules like
//! the embedded store: it keeps each lease's highest term (its *floor*) and
//! counts creates, and each *client* remembers what it saw, as each process
//! does with a real store. Clones are one client; [`MemoryStore::client`]
//! makes another (give each elector of a test its own).
//!
//! # Faults
//!
//! Each operation ([`get`](LeaseStore::get), [`create`](LeaseStore::create),
//! [`update`](LeaseStore::update), [`watch`](LeaseStore::watch),
//! [`list`](LeaseStore::list)) goes through these steps:
//!
//! 1. It is counted (see [`MemoryStore::op_counts`]), whatever happens next.
//! 2. Its fate is decided: [`StoreError::Refused`] for an invalid lease name
//!    (returned at once), [`StoreError::Unavailable`] if the store is
//!    [unavailable](MemoryStore::set_unavailable) or a
//!    [failure is pending](MemoryStore::fail_next), [`StoreError::Conflict`]
//!    for an update if a [conflict is pending](MemoryStore::inject_conflict_next).
//! 3. It waits out the [latency](MemoryStore::set_latency) with
//!    [`tokio::time::sleep`], so tests under `tokio::time::pause()` run
//!    instantly.
//! 4. It waits while the store [hangs](MemoryStore::hang).
//! 5. It fails as decided, or takes effect (the compare-and-swap happens
//!    here, so it races with whatever happened meanwhile).
//!
//! Versions are decimal numbers from one counter for the whole store, so
//! they increase and never repeat, even after a lease is deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream;
use tokio::sync::watch;

use super::deleted::{DeletedRecords, Found};
use super::{
    ANY_LEASE, LeaseRecord, LeaseStore, LeaseWatch, StoreError, TOMBSTONE, Versioned, validate_lease_name,
};

/// How many operations of each kind a [`MemoryStore`] was asked to do,
/// including those that failed or are still in progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Calls to [`LeaseStore::get`].
    pub get: u64,
    /// Calls to [`LeaseStore::create`].
    pub create: u64,
    /// Calls to [`LeaseStore::update`] and [`LeaseStore::delete_if`].
    pub update: u64,
    /// Calls to [`LeaseStore::watch`].
    pub watch: u64,
    /// Calls to [`LeaseStore::list`].
    pub list: u64,
}

/// An in-process lease store with fault injection; see the [module
/// documentation](self).
///
/// Cloning shares the state.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    /// What this client saw of each lease.
    seen: Arc<DeletedRecords>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryStore")
            .field("leases", &state.leases.len())
            .field("unavailable", &state.unavailable)
            .field("counts", &state.counts)
            .finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    /// `true` while operations hang.
    hang: watch::Sender<bool>,
    /// Bumped to break every open watch.
    breaks: watch::Sender<u64>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            hang: watch::Sender::new(false),
            breaks: watch::Sender::new(0),
        }
    }
}

#[derive(Default)]
struct State {
    /// Every lease ever touched, with its current record (`None`: absent).
    /// The channel is the storage: watches subscribe to it.
    leases: BTreeMap<String, watch::Sender<Option<Versioned>>>,
    /// Each lease's highest term ever written and how many times its record
    /// was created (as the embedded store's lock file keeps them).
    history: BTreeMap<String, History>,
    /// The last version handed out.
    last_version: u64,
    latency: Duration,
    unavailable: bool,
    fail_next: u64,
    conflict_next: u64,
    panic_next_update: bool,
    panic_next_watch: bool,
    counts: OpCounts,
}

impl State {
    fn next_version(&mut self) -> String {
        self.last_version += 1;
        self.last_version.to_string()
    }

    fn channel(&mut self, lease: &str) -> &watch::Sender<Option<Versioned>> {
        self.leases
            .entry(lease.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
    }

    fn current(&self, lease: &str) -> Option<Versioned> {
        self.leases.get(lease).and_then(|tx| tx.borrow().clone())
    }

    /// Stores a record under a new version and tells the watches.
    fn put(&mut self, lease: &str, record: LeaseRecord) -> Versioned {
        let versioned = Versioned {
            record,
            version: self.next_version(),
        };
        let history = self.history.entry(lease.to_owned()).or_default();
        history.floor = history.floor.max(versioned.record.term);
        let created = self
            .channel(lease)
            .send_replace(Some(versioned.clone()))
            .is_none();
        if created {
            self.history.entry(lease.to_owned()).or_default().creates += 1;
        }
        versioned
    }

    /// What a read finds: the record, or what is known of a missing one.
    fn found(&self, lease: &str) -> Found {
        match self.current(lease) {
            Some(v) => Found::Record(v),
            None => {
                let h = self.history.get(lease).copied().unwrap_or_default();
                Found::Missing {
                    last: None,
                    floor: Some(h.floor),
                    creates: Some(h.creates),
                }
            }
        }
    }

    /// Creates the record if there is none and the lease's highest term is
    /// still `floor` (as the embedded store does).
    fn create_at(&mut self, lease: &str, record: &LeaseRecord, floor: u64) -> Result<Versioned, StoreError> {
        if let Some(current) = self.current(lease) {
            return Err(StoreError::Conflict {
                lease: lease.into(),
                detail: format!("already exists (version {})", current.version),
            });
        }
        let highest = self.history.get(lease).map_or(0, |h| h.floor);
        if highest > floor {
            return Err(StoreError::Conflict {
                lease: lease.into(),
                detail: format!("the lease's highest term is {highest}, not {floor}: it was written since"),
            });
        }
        if record.term < highest {
            return Err(StoreError::Refused {
                lease: lease.into(),
                detail: format!("term {} is below the lease's highest term {highest}", record.term),
            });
        }
        Ok(self.put(lease, record.clone()))
    }
}

/// A lease's highest term and create count.
#[derive(Clone, Copy, Debug, Default)]
struct History {
    floor: u64,
    creates: u64,
}

/// The kinds of operation, for counting and fault decisions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Create,
    Update,
    Delete,
    Watch,
    List,
}

impl MemoryStore {
    /// An empty store without faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Another client of the same store: it shares the records, the faults
    /// and the counts, but remembers what it saw on its own (as another
    /// process would; see [deleted records](self#deleted-records)).
    pub fn client(&self) -> MemoryStore {
        MemoryStore {
            shared: self.shared.clone(),
            seen: Arc::default(),
        }
    }

    /// Makes every operation started from now on take `latency` (slept with
    /// [`tokio::time::sleep`]) before it takes effect. Zero by default.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// While `true`, every operation fails with [`StoreError::Unavailable`]
    /// (after its latency), and every open watch yields that error and ends.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
        if unavailable {
            self.break_watches();
        }
    }

    /// Makes each of the next `n` operations (of any kind) fail with
    /// [`StoreError::Unavailable`]. Replaces any count still pending; `0`
    /// cancels.
    pub fn fail_next(&self, n: u64) {
        self.state().fail_next = n;
    }

    /// Makes each of the next `n` updates fail with [`StoreError::Conflict`]
    /// without writing, as if another host had written just before. Replaces
    /// any count still pending; `0` cancels.
    pub fn inject_conflict_next(&self, n: u64) {
        self.state().conflict_next = n;
    }

    /// Makes the next update panic, as a bug in a store would: for testing
    /// that a dead elector is noticed. (Reads are spared, so that the
    /// panic hits the elector, not its subscription.)
    pub fn panic_next_update(&self) {
        self.state().panic_next_update = true;
    }

    /// Makes the next watch request panic: for testing that an elector
    /// whose subscription died stops.
    pub fn panic_next_watch(&self) {
        self.state().panic_next_watch = true;
    }

    /// While `true`, operations do not complete: those waiting (after their
    /// latency) resume only when this is set back to `false`. For testing
    /// request timeouts. Watches already open keep delivering.
    pub fn hang(&self, hang: bool) {
        self.shared.hang.send_replace(hang);
    }

    /// Makes every open watch yield [`StoreError::Unavailable`] and end, as
    /// when a connection to a store breaks. New watches are not affected.
    pub fn break_watches(&self) {
        self.shared.breaks.send_modify(|n| *n += 1);
    }

    /// Writes a record as a foreign writer would: at once, whatever the
    /// current version, without faults or counting. Watches see it.
    pub fn write_raw(&self, lease: &str, record: LeaseRecord) -> Versioned {
        self.state().put(lease, record)
    }

    /// Deletes a lease at once, without faults or counting; returns whether
    /// it existed. The lease's floor stays; watches see the deletion (see
    /// [deleted records](self#deleted-records)).
    pub fn delete(&self, lease: &str) -> bool {
        let state = self.state();
        match state.leases.get(lease) {
            Some(tx) => tx.send_replace(None).is_some(),
            None => false,
        }
    }

    /// The current record of a lease as stored (`None` once deleted),
    /// without faults or counting.
    pub fn peek(&self, lease: &str) -> Option<Versioned> {
        self.state().current(lease)
    }

    /// How many operations of each kind were requested so far.
    pub fn op_counts(&self) -> OpCounts {
        self.state().counts
    }

    /// Sets every operation count back to zero.
    pub fn reset_op_counts(&self) {
        self.state().counts = OpCounts::default();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock must not hide its own
        // failure behind poisoning errors.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Steps 1 to 4 of an operation (see the module documentation); returns
    /// the state to let it take effect in, or the error it fails with.
    async fn begin(&self, op: Op, lease: &str) -> Result<MutexGuard<'_, State>, StoreError> {
        let (latency, failure) = {
            let mut state = self.state();
            let counts = &mut state.counts;
            match op {
                Op::Get => counts.get += 1,
                Op::Create => counts.create += 1,
                Op::Update | Op::Delete => counts.update += 1,
                Op::Watch => counts.watch += 1,
                Op::List => counts.list += 1,
            }
            if op == Op::Update && std::mem::take(&mut state.panic_next_update) {
                drop(state);
                injected_panic(format!("injected panic in a store update of lease {lease:?}"));
            }
            if op == Op::Watch && std::mem::take(&mut state.panic_next_watch) {
                drop(state);
                injected_panic(format!("injected panic in a watch of lease {lease:?}"));
            }
            if op != Op::List {
                validate_lease_name(lease).map_err(|e| StoreError::Refused {
                    lease: lease.into(),
                    detail: e.to_string(),
                })?;
            }
            let failure = if state.unavailable {
                Some(unavailable(lease, "store is unavailable (injected)"))
            } else if state.fail_next > 0 {
                state.fail_next -= 1;
                Some(unavailable(lease, "injected failure"))
            } else if op == Op::Update && state.conflict_next > 0 {
                state.conflict_next -= 1;
                Some(StoreError::Conflict {
                    lease: lease.into(),
                    detail: "injected conflict".into(),
                })
            } else {
                None
            };
            (state.latency, failure)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut hang = self.shared.hang.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = hang.wait_for(|hanging| !*hanging).await;
        match failure {
            Some(error) => Err(error),
            None => Ok(self.state()),
        }
    }
}

fn unavailable(lease: &str, detail: &str) -> StoreError {
    StoreError::Unavailable {
        lease: lease.into(),
        detail: detail.into(),
    }
}

#[async_trait::async_trait]
impl LeaseStore for MemoryStore {
    fn describe(&self) -> String {
        "memory store".into()
    }

    async fn get(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        let state = self.begin(Op::Get, lease).await?;
        let found = state.found(lease);
        drop(state);
        Ok(self.seen.found(lease, found))
    }

    async fn create(&self, lease: &str, record: &LeaseRecord) -> Result<Versioned, StoreError> {
        let mut state = self.begin(Op::Create, lease).await?;
        let created = state.create_at(lease, record, 0)?;
        drop(state);
        self.seen.wrote(lease, &created);
        Ok(created)
    }

    async fn delete_if(&self, lease: &str, version: &str) -> Result<bool, StoreError> {
        // Checked and deleted under one lock: atomic with every write.
        let state = self.begin(Op::Delete, lease).await?;
        match (state.current(lease), state.leases.get(lease)) {
            (Some(current), Some(tx)) if current.version == version => Ok(tx.send_replace(None).is_some()),
            _ => Ok(false),
        }
    }

    async fn update(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let mut state = self.begin(Op::Update, lease).await?;
        let written = if version.starts_with(TOMBSTONE) {
            let floor = self.seen.create_floor(lease, version)?;
            let created = state.create_at(lease, record, floor);
            if created.as_ref().is_err_and(StoreError::is_conflict) {
                self.seen.create_refused(lease, version);
            }
            created?
        } else {
            match state.current(lease) {
                None => {
                    return Err(StoreError::Conflict {
                        lease: lease.into(),
                        detail: format!("does not exist (expected version {version})"),
                    });
                }
                Some(current) if current.version != version => {
                    return Err(StoreError::Conflict {
                        lease: lease.into(),
                        detail: format!("version is {}, not {version}", current.version),
                    });
                }
                Some(_) => state.put(lease, record.clone()),
            }
        };
        drop(state);
        self.seen.wrote(lease, &written);
        Ok(written)
    }

    async fn watch(&self, lease: &str) -> Result<LeaseWatch, StoreError> {
        let mut state = self.begin(Op::Watch, lease).await?;
        let records = state.channel(lease).subscribe();
        drop(state);
        let watch = MemoryWatch {
            lease: lease.to_owned(),
            store: self.clone(),
            records,
            breaks: self.shared.breaks.subscribe(),
            first: true,
        };
        Ok(Box::pin(stream::unfold(Some(watch), MemoryWatch::next)))
    }

    async fn list(&self) -> Result<Vec<(String, Versioned)>, StoreError> {
        let state = self.begin(Op::List, ANY_LEASE).await?;
        Ok(state
            .leases
            .iter()
            .filter_map(|(lease, tx)| Some((lease.clone(), tx.borrow().clone()?)))
            .collect())
    }
}

/// The state of a watch stream.
struct MemoryWatch {
    lease: String,
    /// The client watching: what it saw decides how a deletion reads.
    store: MemoryStore,
    records: watch::Receiver<Option<Versioned>>,
    breaks: watch::Receiver<u64>,
    /// The current record has not been yielded yet.
    first: bool,
}

type WatchStep = Option<(Result<Option<Versioned>, StoreError>, Option<MemoryWatch>)>;

impl MemoryWatch {
    /// Yields the current record first, then the record after each change,
    /// until the watch is broken (`None` state: the stream ends).
    async fn next(watch: Option<MemoryWatch>) -> WatchStep {
        let mut watch = watch?;
        if watch.first {
            watch.first = false;
        } else {
            tokio::select! {
                biased;
                _ = watch.breaks.changed() => {
                    let error = unavailable(&watch.lease, "watch broken (injected)");
                    return Some((Err(error), None));
                }
                // The store holds the sender, and the stream holds the store's
                // shared state only through it; if it is gone, end.
                changed = watch.records.changed() => changed.ok()?,
            }
        }
        watch.records.borrow_and_update();
        let found = watch.store.state().found(&watch.lease);
        let seen = watch.store.seen.found(&watch.lease, found);
        Some((Ok(seen), Some(watch)))
    }
}

#[cfg(test)]
mod tests;

pub mod buckets;

/// Unwinds with `message` as the panic's payload, as `panic!` would, but
/// without the panic hook: an injected panic is expected, and its message
/// and backtrace would read like a failure in the test output.
fn injected_panic(message: String) -> ! {
    std::panic::resume_unwind(Box::new(message))
}
