//! The Kubernetes store's reads: what it remembers of each lease (the
//! recent objects, for read-modify-write and to tell stale events), how an
//! object the API server sent becomes a record, what a missing Lease reads
//! as, and the listings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DynamicObject, ListParams};

use super::gate::Class;
use super::requests::{map_error, rv_number, slim};
use super::{Inner, KEEP_OBJECTS, KubeStore, OWN_REQUEST_TIMEOUT, Recent, to_versioned};
use crate::store::deleted::Found;
use crate::store::{ANY_LEASE, LeaseRecord, StoreError, Versioned};
use crate::support::rounding::human;

impl KubeStore {
    /// The Lease as the API server holds it, or the record of a deleted
    /// one.
    pub(super) async fn read(&self, lease: &str) -> Result<Option<Versioned>, StoreError> {
        let inner = &self.inner;
        match inner
            .api
            .get_opt(lease)
            .await
            .map_err(|e| map_error(lease, "get", e))?
        {
            Some(mut obj) => {
                slim(&mut obj);
                inner.accept(lease, Arc::new(obj)).map(Some)
            }
            None => inner.deleted(lease, None, None).await,
        }
    }
}

impl Inner {
    /// The duration read for a Lease with a holder but no usable
    /// `leaseDurationSeconds`, now.
    pub(super) fn fallback_duration(&self) -> Duration {
        self.watch.timings.fallback_duration()
    }

    pub(super) fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recent>> {
        // Every change to the map is complete in one step: a poisoned lock
        // is used as is.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers an object as the latest seen of its lease (shared with
    /// the watch's cache, not copied).
    pub(super) fn remember(&self, lease: &str, obj: Arc<DynamicObject>) {
        let mut recent = self.recent();
        let recent = recent.entry(lease.to_owned()).or_default();
        let rv = obj.metadata.resource_version.as_deref().unwrap_or_default();
        recent.newest = recent.newest.max(rv_number(rv).unwrap_or(0));
        let list = &mut recent.objects;
        if list
            .back()
            .is_some_and(|last| last.metadata.resource_version == obj.metadata.resource_version)
        {
            return;
        }
        list.push_back(obj);
        while list.len() > KEEP_OBJECTS {
            list.pop_front();
        }
    }

    /// The lease does not exist (any more), as of `rv` if known; `last` is
    /// its final state if the deletion event told it. Reads its term floor
    /// and returns what to hand the caller: the tombstone if the last known
    /// state had a holder, else the floor record, or `None` for a lease
    /// that never had a term.
    pub(super) async fn deleted(
        &self,
        lease: &str,
        last: Option<&DynamicObject>,
        rv: Option<&str>,
    ) -> Result<Option<Versioned>, StoreError> {
        {
            let mut recent = self.recent();
            let recent = recent.entry(lease.to_owned()).or_default();
            recent.objects.clear();
            recent.newest = recent.newest.max(rv.and_then(rv_number).unwrap_or(0));
        }
        let last = last.and_then(|obj| self.versioned(lease, obj).ok());
        let floor = self.floors.read(lease).await?;
        self.recent().entry(lease.to_owned()).or_default().floor_version = Some(floor.version.clone());
        Ok(self.seen.found(
            lease,
            Found::Missing {
                last,
                floor: Some(floor.term),
                creates: Some(floor.creates),
            },
        ))
    }

    /// Reads an object as a record, with the term floor learned for its
    /// lease if that is higher than its `leaseTransitions`.
    pub(super) fn versioned(&self, lease: &str, obj: &DynamicObject) -> Result<Versioned, StoreError> {
        let mut v = to_versioned(lease, obj, self.fallback_duration())?;
        if let Some(floor) = self.recent().get(lease).map(|r| r.floor) {
            v.record.term = v.record.term.max(floor);
        }
        Ok(v)
    }

    /// Whether something newer than `rv` was already learned of `lease`
    /// (and handed to the caller): a watch event that old is history.
    pub(super) fn is_stale(&self, lease: &str, rv: &str) -> bool {
        let Some(n) = rv_number(rv) else { return false };
        self.recent().get(lease).is_some_and(|r| r.newest > n)
    }

    /// The object of `lease` at `version`, if it was seen.
    pub(super) fn seen_at(&self, lease: &str, version: &str) -> Option<DynamicObject> {
        self.recent()
            .get(lease)?
            .objects
            .iter()
            .rev()
            .find(|o| o.metadata.resource_version.as_deref() == Some(version))
            .map(|o| DynamicObject::clone(o))
    }

    /// Converts an object the API server sent in answer to a read (or a
    /// watch), and remembers it.
    pub(super) fn accept(&self, lease: &str, obj: Arc<DynamicObject>) -> Result<Versioned, StoreError> {
        let v = self.versioned(lease, &obj)?;
        let uid = obj.metadata.uid.as_deref();
        self.floors
            .read_ahead(lease, v.record.term, uid, &self.watch.timings);
        self.remember(lease, obj);
        self.seen.found(lease, Found::Record(v.clone()));
        Ok(v)
    }

    /// Converts the object the API server answered a write with, and
    /// remembers it.
    pub(super) fn accept_written(
        &self,
        lease: &str,
        obj: Arc<DynamicObject>,
    ) -> Result<Versioned, StoreError> {
        let v = self.versioned(lease, &obj)?;
        // The shared watch must deliver it: how its cache is known to be
        // current (see "Listing membership records" in docs/kubernetes.md).
        self.shared.wrote(&obj);
        self.remember(lease, obj);
        self.seen.wrote(lease, &v);
        Ok(v)
    }

    /// Lists the namespace's Leases with `selector` (`k=v,k=v`; empty:
    /// every Lease) from the API server.
    pub(super) async fn list_objects(&self, selector: &str) -> Result<Vec<DynamicObject>, StoreError> {
        let mut params = ListParams::default();
        if !selector.is_empty() {
            params = params.labels(selector);
        }
        let list = tokio::time::timeout(OWN_REQUEST_TIMEOUT, self.api.list(&params))
            .await
            .map_err(|_| StoreError::Unavailable {
                lease: ANY_LEASE.into(),
                detail: format!("listing leases timed out after {}", human(OWN_REQUEST_TIMEOUT)),
            })?
            .map_err(|e| map_error(ANY_LEASE, "list", e))?;
        let mut items = list.items;
        items.iter_mut().for_each(slim);
        Ok(items)
    }

    /// The class of a write of `record` over `current`: [`Class::Hold`]
    /// for a renewal or a release by the holder (same term, same holder or
    /// none), [`Class::Elect`] for the rest.
    pub(super) fn class_of_write(&self, lease: &str, current: &DynamicObject, record: &LeaseRecord) -> Class {
        let Ok(now) = to_versioned(lease, current, self.fallback_duration()) else {
            return Class::Elect;
        };
        let now = now.record;
        let holder_writes = now.holder.is_some() && (record.holder.is_none() || record.holder == now.holder);
        if now.term == record.term && holder_writes {
            Class::Hold
        } else {
            Class::Elect
        }
    }

    /// The object of `lease` at `version`: the one seen, else the Lease as
    /// the API server holds it if that is still at `version` (a conflict
    /// if it is not, or is missing).
    pub(super) async fn object_at(&self, lease: &str, version: &str) -> Result<DynamicObject, StoreError> {
        if let Some(obj) = self.seen_at(lease, version) {
            return Ok(obj);
        }
        let current = self
            .api
            .get_opt(lease)
            .await
            .map_err(|e| map_error(lease, "get", e))?;
        let Some(mut current) = current else {
            return Err(StoreError::Conflict {
                lease: lease.to_owned(),
                detail: format!("does not exist (expected version {version})"),
            });
        };
        slim(&mut current);
        self.accept(lease, Arc::new(current.clone()))?;
        let current_version = current.metadata.resource_version.clone().unwrap_or_default();
        if current_version != version {
            return Err(StoreError::Conflict {
                lease: lease.to_owned(),
                detail: format!("version is {current_version}, not {version}"),
            });
        }
        Ok(current)
    }
}

/// The objects whose names start with `prefix`, read as records (as they
/// are, without term floors or deleted records: a listing reports what the
/// API server holds), sorted by name.
pub(super) fn listed(
    prefix: &str,
    objects: &[DynamicObject],
    fallback_duration: Duration,
) -> Result<Vec<(String, Versioned)>, StoreError> {
    let mut leases = Vec::new();
    for obj in objects {
        let name = obj.metadata.name.clone().unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        leases.push((name.clone(), to_versioned(&name, obj, fallback_duration)?));
    }
    leases.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(leases)
}
