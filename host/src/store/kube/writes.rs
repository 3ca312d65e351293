//! The Kubernetes store's writes: a create, or a `PUT` of the whole object
//! last read with its `resourceVersion` as the compare-and-swap (409 on any
//! write in between), each after the lease's *term floor* covers the term
//! written; and, while this store holds a lease, the periodic check that
//! its floor still exists.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use serde_json::{Map, Value};

use super::floor::{Counted, Raised};
use super::requests::{baton_wrote_transitions, is_already_exists, map_error, post_params, slim};
use super::{Inner, KubeStore, to_versioned};
use crate::store::{LeaseRecord, StoreError, Versioned};
use crate::support::rounding::human;

impl KubeStore {
    /// Creates the Lease if there is none and the lease's term floor is
    /// unchanged since this store found the Lease missing; in a term above
    /// the floor, unless `own`: the holder writing its own deleted record
    /// again, in its term.
    pub(super) async fn create_at(
        &self,
        lease: &str,
        record: &LeaseRecord,
        own: bool,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        let mut obj = inner.new_object(lease);
        inner.apply(lease, &mut obj, record)?;
        // Raised (and the create counted) before the Lease appears, so that
        // a reader that finds no Lease again knows it was created between.
        let counted = inner.count_create(lease, record, own).await?;
        let mut created = match inner.api.create(&post_params(), &obj).await {
            Ok(created) => created,
            Err(e) => {
                if is_already_exists(&e) {
                    inner.undo_create(lease, counted);
                }
                return Err(map_error(lease, "create", e));
            }
        };
        slim(&mut created);
        let created = Arc::new(created);
        let v = inner.accept_written(lease, created.clone())?;
        inner.check_floor(lease, &created, &v);
        Ok(v)
    }

    /// The update of a tombstone `version`: the Lease was deleted, so it is
    /// re-created, unless its floor moved since the caller was shown it
    /// (409 if another host re-created it first).
    pub(super) async fn recreate(
        &self,
        lease: &str,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let seen = &self.inner.seen;
        // (The floor's own check is by its version, not the term shown: a
        // floor may be reserved above the record's term.)
        seen.create_floor(lease, version)?;
        let own = seen.is_own_tombstone(lease, version);
        let created = self.create_at(lease, record, own).await;
        if created.as_ref().is_err_and(StoreError::is_conflict) {
            seen.create_refused(lease, version);
        }
        created
    }

    /// Writes `record` over `obj`, the Lease at `version`.
    pub(super) async fn replace(
        &self,
        lease: &str,
        mut obj: DynamicObject,
        version: &str,
        record: &LeaseRecord,
    ) -> Result<Versioned, StoreError> {
        let inner = &self.inner;
        inner.raise_floor(lease, &obj, record).await?;
        // The precondition: the API server refuses the update with 409 if
        // the object's resourceVersion is no longer this one.
        obj.metadata.resource_version = Some(version.to_owned());
        inner.apply(lease, &mut obj, record)?;
        // The API server keeps its managedFields (this host's copy is slim).
        obj.metadata.managed_fields = None;
        let mut written = inner
            .api
            .replace(lease, &post_params(), &obj)
            .await
            .map_err(|e| map_error(lease, "update", e))?;
        slim(&mut written);
        let written = Arc::new(written);
        let v = inner.accept_written(lease, written.clone())?;
        inner.check_floor(lease, &written, &v);
        Ok(v)
    }
}

impl Inner {
    /// A new Lease object named `lease`, empty.
    fn new_object(&self, lease: &str) -> DynamicObject {
        DynamicObject {
            types: Some(TypeMeta {
                api_version: self.resource.api_version.clone(),
                kind: self.resource.kind.clone(),
            }),
            metadata: ObjectMeta {
                name: Some(lease.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            data: Value::Object(Map::new()),
        }
    }

    /// Before `record` is written over `current` (a Lease object): raises
    /// the term floor if the record starts a new term.
    async fn raise_floor(
        &self,
        lease: &str,
        current: &DynamicObject,
        record: &LeaseRecord,
    ) -> Result<(), StoreError> {
        let written = to_versioned(lease, current, self.fallback_duration())?
            .record
            .term;
        if record.term < written {
            // Never written by the elector (its records come from what it
            // read); refused so that terms only grow within one object
            // while baton alone writes them (see `baton_wrote_transitions`).
            return Err(StoreError::Conflict {
                lease: lease.to_owned(),
                detail: format!(
                    "term {} would lower the Lease's leaseTransitions ({written}): terms never go back",
                    record.term
                ),
            });
        }
        if record.term == written {
            return Ok(());
        }
        let uid = current.metadata.uid.as_deref();
        let continuous = baton_wrote_transitions(current);
        let instance = record.instance.as_deref();
        match self
            .floors
            .raise_for_term(lease, record.term, uid, continuous, instance)
            .await?
        {
            Raised::Done => Ok(()),
            Raised::Behind(floor) => Err(self.behind_floor(lease, record.term, written, floor, continuous)),
        }
    }

    /// Before the Lease is created: checks that the floor is unchanged
    /// since this store found the Lease missing, and counts the create.
    async fn count_create(
        &self,
        lease: &str,
        record: &LeaseRecord,
        own: bool,
    ) -> Result<Counted, StoreError> {
        let seen = self.recent().get(lease).and_then(|r| r.floor_version.clone());
        let base = match seen {
            Some(base) => base,
            // Never found missing by this store: as the floor is now.
            None => self.floors.read(lease).await?.version,
        };
        self.floors
            .raise_for_create(
                lease,
                base.as_deref(),
                record.term,
                own,
                record.instance.as_deref(),
            )
            .await
    }

    /// Another host created the Lease after this store counted its own
    /// create: takes the count back in the background, bounded by the
    /// request timeout (the caller gets its conflict at once).
    fn undo_create(self: &Arc<Self>, lease: &str, counted: Counted) {
        let inner = self.clone();
        let lease = lease.to_owned();
        tokio::spawn(async move {
            let bound = inner.watch.request_timeout();
            match tokio::time::timeout(bound, inner.floors.undo_create(&lease, &counted)).await {
                Ok(Ok(true)) => {
                    tracing::debug!(%lease, "another host created the Lease first: this host's count of its create taken back")
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%lease, error = %e, "cannot take back the count of a create that did not happen")
                }
                Err(_) => {
                    tracing::debug!(%lease, "taking back the count of a create that did not happen timed out")
                }
            }
        });
    }

    /// A write of `term` over a Lease at `written` found the lease's
    /// highest term at `floor`, not below it: the Lease was re-created or
    /// replaced by another writer. Remembers the floor (the Lease reads at
    /// it from now on), warns, and returns the conflict.
    fn behind_floor(&self, lease: &str, term: u64, written: u64, floor: u64, continuous: bool) -> StoreError {
        {
            let mut recent = self.recent();
            let recent = recent.entry(lease.to_owned()).or_default();
            recent.floor = recent.floor.max(floor);
        }
        let how = if continuous {
            "re-created by another writer"
        } else {
            "written by another writer (replaced or edited in place)"
        };
        tracing::warn!(
            lease,
            lease_transitions = written,
            floor,
            floor_object = %self.floors.describe(lease),
            "the Lease's leaseTransitions is below the lease's highest term: it was {how}; \
             terms continue above {floor}"
        );
        StoreError::Conflict {
            lease: lease.to_owned(),
            detail: format!(
                "the Lease's leaseTransitions ({written}) is not above the lease's highest \
                 term ({floor}, in {}): it was {how}; term {term} may have been given out \
                 already, so terms continue above {floor}",
                self.floors.describe(lease),
            ),
        }
    }

    /// After this store wrote `written` (read as `v`): if it holds the
    /// lease and has not checked the floor for a lease duration, checks in
    /// the background that the floor holds the Lease's term, and re-creates
    /// or raises it if not (a floor ConfigMap deleted while its Lease
    /// lives, which no new term would notice while the floor seen before
    /// covers it). So a floor deleted while its lease is held is back
    /// within about a lease duration, before a deletion of the Lease would
    /// need it. A floor this store read or wrote, holding the term, within
    /// a lease duration counts as checked (the term start's own raise), and
    /// while the floors are watched, a floor seen holding the term does.
    /// The first check starts the floors' watch.
    fn check_floor(self: &Arc<Self>, lease: &str, written: &DynamicObject, v: &Versioned) {
        let duration = v.record.lease_duration;
        if v.record.holder().is_none()
            || self.floors.seen_holding(lease, v.record.term, duration)
            || !self.floor_check_due(lease, duration)
        {
            return;
        }
        // From now on the floors are watched, if the Role allows it.
        self.floors
            .start_watch(&tokio::runtime::Handle::current(), &self.watch.timings);
        let inner = self.clone();
        let lease = lease.to_owned();
        let term = v.record.term;
        let uid = written.metadata.uid.clone();
        let instance = v.record.instance.clone();
        tokio::spawn(async move {
            inner
                .ensure_floor(&lease, term, uid.as_deref(), instance.as_deref())
                .await;
        });
    }

    /// Whether the floor of `lease` was not checked for `lease_duration`;
    /// if so, it counts as checked now.
    fn floor_check_due(&self, lease: &str, lease_duration: Duration) -> bool {
        let now = Instant::now();
        let mut recent = self.recent();
        let recent = recent.entry(lease.to_owned()).or_default();
        if recent
            .floor_checked
            .is_some_and(|at| now.duration_since(at) < lease_duration)
        {
            return false;
        }
        recent.floor_checked = Some(now);
        true
    }

    /// The background step of [`Inner::check_floor`]: makes sure the floor
    /// holds `term`, warns if it did not; on an error, the check is due
    /// again at the next write.
    async fn ensure_floor(&self, lease: &str, term: u64, uid: Option<&str>, instance: Option<&str>) {
        let bound = self.watch.request_timeout();
        let ensured = tokio::time::timeout(bound, self.floors.ensure(lease, term, uid, instance)).await;
        match ensured {
            Ok(Ok(None)) => {}
            Ok(Ok(Some(found))) => tracing::warn!(
                lease = %lease,
                term,
                found = found.term,
                floor_object = %self.floors.describe(lease),
                "the lease's term floor was {}; raised to the Lease's term",
                if found.version.is_none() { "missing (deleted)" } else { "below the Lease's term" }
            ),
            Ok(Err(e)) => {
                // Tried again at the next renewal.
                self.recent().entry(lease.to_owned()).or_default().floor_checked = None;
                tracing::warn!(lease = %lease, error = %e, "cannot check the lease's term floor");
            }
            Err(_) => {
                self.recent().entry(lease.to_owned()).or_default().floor_checked = None;
                tracing::warn!(lease = %lease, timeout = %human(bound), "checking the lease's term floor timed out");
            }
        }
    }
}
