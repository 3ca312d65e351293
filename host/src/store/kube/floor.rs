//! *Term floors*: the highest term each lease ever had, kept in a ConfigMap
//! that outlives the Lease, so that a Lease deleted while no host runs does
//! not restart its terms at 1 and repeat a fencing token. The design, the
//! ConfigMap's data and the measurements are in `docs/kubernetes.md`
//! ("Terms after a Lease is deleted").
//!
//! The ConfigMap is [`floor_name`] (`baton-terms.<lease>`), in the Lease's
//! namespace; a ConfigMap so that no selector for Leases matches it.
//! Invariants:
//!
//! - a write that starts a new term first makes sure the floor covers it,
//!   reserving [`RESERVED_TERMS`] at a time; reserved terms are given out
//!   only while baton last changed the Lease's `leaseTransitions`;
//! - a create first checks that the floor is unchanged since its caller
//!   found the Lease missing, and counts the create: of two hosts that saw
//!   the same deleted Lease, only one creates it;
//! - a missing Lease reads as released at its floor (see
//!   [`deleted`](super::super::deleted)); the holder remakes a deleted
//!   floor within about a lease duration ([`Floors::ensure`]);
//! - a floor garbled by hand is refused, never reset: the error names the
//!   ConfigMap and the fix;
//! - a write is first tried against the floor this store last read or
//!   wrote, when that floor asks for one (its resourceVersion makes a stale
//!   one a conflict); every other decision is made on a fresh read. The
//!   floors seen come from a watch of them ([`watch`]), or, without it,
//!   from a *read ahead* before a followed lease's next term ([`ahead`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ObjectMeta};

use super::gate::Gated;

use super::ROLE_LABEL;
use super::requests::{map_error, post_params, rv_number};
use crate::store::StoreError;

mod ahead;
mod watch;

/// The prefix of every floor ConfigMap's name.
pub const FLOOR_PREFIX: &str = "baton-terms.";

/// The annotation on a floor ConfigMap naming its lease (the name alone may
/// be shortened, see [`floor_name`]).
pub const FLOOR_LEASE_ANNOTATION: &str = "baton.dev/lease";

/// The longest object name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// How often a floor write that lost a race is tried again before the store
/// reports the lease unavailable; each loser reads the floor again, and
/// only a host starting a term writes it, so a few are plenty.
const WRITE_ATTEMPTS: usize = 5;

/// The name of `lease`'s floor ConfigMap: `baton-terms.<lease>`, or, for a
/// lease name too long for that, its first characters and a hash of the
/// whole name.
///
/// ```
/// use baton::store::kube::floor_name;
///
/// assert_eq!(floor_name("jobs.billing"), "baton-terms.jobs.billing");
/// let long = "a".repeat(250);
/// assert!(floor_name(&long).len() <= 253);
/// assert_ne!(floor_name(&long), floor_name(&format!("{}b", &long[1..])));
/// ```
pub fn floor_name(lease: &str) -> String {
    let name = format!("{FLOOR_PREFIX}{lease}");
    if name.len() <= MAX_NAME {
        return name;
    }
    // FNV-1a, 64 bits: stable across versions and platforms, which a
    // std hasher does not promise.
    let hash = lease.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let keep = MAX_NAME - FLOOR_PREFIX.len() - 17;
    // A lease name is ASCII; the cut must end a label with a letter or digit.
    let head = lease[..keep].trim_end_matches(['.', '-']);
    format!("{FLOOR_PREFIX}{head}-{hash:016x}")
}

/// How many terms a floor write reserves: a host starting term *T* raises
/// the floor to *T* + 15, so that the next fifteen terms of the same Lease
/// need no write of the floor (a hand-over stays one write of the Lease).
/// After a deletion, terms go on above the reserved ones: the numbers
/// skipped cost nothing, since a fencing token needs only to grow.
pub const RESERVED_TERMS: u64 = 16;

/// A lease's floor as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Floor {
    /// The highest term given out or reserved; 0 without a ConfigMap.
    pub term: u64,
    /// How many times the Lease was created.
    pub creates: u64,
    /// The process that last raised the floor.
    pub raised_by: Option<String>,
    /// The uid of the Lease whose new term last raised the floor.
    pub raised_on: Option<String>,
    /// The ConfigMap's resourceVersion; `None` without a ConfigMap.
    pub version: Option<String>,
}

/// What raising a floor for a new term found.
#[derive(Debug, PartialEq, Eq)]
pub enum Raised {
    /// The floor covers the new term, for the Lease object to be written.
    Done,
    /// The floor is at or above the new term for another Lease object than
    /// the one to be written: the Lease was re-created (by another writer)
    /// with a lower `leaseTransitions`. The floor is given.
    Behind(u64),
}

/// A create counted in the floor ([`Floors::raise_for_create`]), to take
/// back if the Lease is not created ([`Floors::undo_create`]).
#[derive(Debug)]
pub struct Counted {
    /// The floor as the count found it.
    before: Floor,
    /// The floor ConfigMap's resourceVersion the count wrote.
    version: Option<String>,
}

/// The floor ConfigMaps of one namespace, and the floor last seen of each
/// lease (floors only grow, so one seen covering a term still does).
#[derive(Clone)]
pub struct Floors {
    api: Gated<ConfigMap>,
    namespace: String,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    ahead: Arc<ahead::Ahead>,
    watch: Arc<watch::FloorWatch>,
}

/// A floor as this store last read or wrote it, with its ConfigMap (`None`:
/// there was none), the base of the next write.
#[derive(Clone)]
struct Seen {
    floor: Floor,
    object: Option<ConfigMap>,
    /// When the read was answered or the write made.
    at: Instant,
}

impl Floors {
    /// The floors in `namespace`.
    pub(super) fn new(store: &Gated<DynamicObject>, namespace: &str) -> Floors {
        Floors {
            api: store.other(|client| Api::namespaced(client, namespace)),
            namespace: namespace.to_owned(),
            seen: Arc::default(),
            ahead: Arc::default(),
            watch: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // Every change is one assignment: a poisoned lock is used as is.
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `floor` (in `object`) as `lease`'s, unless the one kept is a
    /// later version of the ConfigMap (a read answered before a write of
    /// this store's, say).
    fn remember(&self, lease: &str, floor: &Floor, object: Option<&ConfigMap>) {
        let number = |floor: &Floor| floor.version.as_deref().and_then(rv_number);
        let mut seen = self.seen();
        if let Some(kept) = seen.get(lease)
            && let (Some(kept), Some(new)) = (number(&kept.floor), number(floor))
            && kept > new
        {
            return;
        }
        let object = object.map(|object| {
            let mut object = object.clone();
            // Never sent back: the API server keeps its own.
            object.metadata.managed_fields = None;
            object
        });
        let at = Instant::now();
        let floor = floor.clone();
        seen.insert(lease.to_owned(), Seen { floor, object, at });
    }

    /// Whether `lease`'s floor ConfigMap holds at least `term` as this
    /// store last saw it, and that is current: the floors are watched, or
    /// it was read or written less than `within` ago.
    pub fn seen_holding(&self, lease: &str, term: u64, within: Duration) -> bool {
        let watched = self.watched();
        self.seen().get(lease).is_some_and(|kept| {
            kept.floor.version.is_some() && kept.floor.term >= term && (watched || kept.at.elapsed() < within)
        })
    }

    /// `lease`'s floor ConfigMap was deleted (or lost its label).
    fn forget(&self, lease: &str) {
        self.seen().remove(lease);
    }

    /// The floor and ConfigMap this store last read or wrote for `lease`.
    fn last_seen(&self, lease: &str) -> Option<(Option<ConfigMap>, Floor)> {
        let seen = self.seen();
        let kept = seen.get(lease)?;
        Some((kept.object.clone(), kept.floor.clone()))
    }

    /// Where `lease`'s floor is kept, for messages.
    pub fn describe(&self, lease: &str) -> String {
        format!("ConfigMap {}/{}", self.namespace, floor_name(lease))
    }

    /// Reads `lease`'s floor (0 if it has none).
    pub async fn read(&self, lease: &str) -> Result<Floor, StoreError> {
        Ok(self.fetch(lease).await?.1)
    }

    async fn fetch(&self, lease: &str) -> Result<(Option<ConfigMap>, Floor), StoreError> {
        let object = self
            .api
            .get_opt(&floor_name(lease))
            .await
            .map_err(|e| self.error(lease, "get", e))?;
        let floor = match &object {
            Some(object) => self.parse(lease, object)?,
            None => Floor::default(),
        };
        self.remember(lease, &floor, object.as_ref());
        Ok((object, floor))
    }

    fn parse(&self, lease: &str, object: &ConfigMap) -> Result<Floor, StoreError> {
        let data = object.data.clone().unwrap_or_default();
        let number = |key: &str| -> Result<u64, StoreError> {
            let value = data.get(key);
            value
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| StoreError::Malformed {
                    lease: lease.to_owned(),
                    detail: format!(
                        "the term floor in {}, data.{key}, is {}, not a number: baton keeps the \
                     lease's highest term there and never resets it; set data.floor to the \
                     highest term the lease had (at least the Lease's spec.leaseTransitions) \
                     and data.creates to a number (kubectl edit configmap -n {} {}), or \
                     delete the ConfigMap to start the terms again at 1",
                        self.describe(lease),
                        value.map_or("missing".to_owned(), |v| format!("{v:?}")),
                        self.namespace,
                        floor_name(lease),
                    ),
                })
        };
        Ok(Floor {
            term: number("floor")?,
            creates: number("creates")?,
            raised_by: data.get("raised-by").cloned(),
            raised_on: data.get("raised-on").cloned(),
            version: object.metadata.resource_version.clone(),
        })
    }

    /// Before a create of `lease`'s Lease at `term`: checks that the floor
    /// is still the one read when the Lease was found missing (its
    /// resourceVersion `base`, `None` for no ConfigMap) and that `term` is
    /// above it (unless `own`: the holder writing its deleted record again
    /// in its own term), raises it to `term` if below, and counts the
    /// create. A conflict if anyone wrote
    /// the floor since: another host created the Lease, or started a term
    /// on it, after this one looked.
    pub async fn raise_for_create(
        &self,
        lease: &str,
        base: Option<&str>,
        term: u64,
        own: bool,
        instance: Option<&str>,
    ) -> Result<Counted, StoreError> {
        let mut before = None;
        let written = self
            .raise(lease, |floor| {
                before = Some(floor.clone());
                if !own && floor.term > 0 && term <= floor.term {
                    return Err(StoreError::Conflict {
                        lease: lease.to_owned(),
                        detail: format!(
                            "term {term} is not above the lease's highest term {} ({}): terms never repeat",
                            floor.term,
                            self.describe(lease)
                        ),
                    });
                }
                if floor.version.as_deref() != base {
                    return Err(StoreError::Conflict {
                        lease: lease.to_owned(),
                        detail: format!(
                            "the lease's term floor ({}) changed since the Lease was found missing: \
                         another host wrote first",
                            self.describe(lease)
                        ),
                    });
                }
                Ok(Some(Floor {
                    term: floor.term.max(term),
                    // Only ever compared for a change.
                    creates: floor.creates.wrapping_add(1),
                    raised_by: instance.map(str::to_owned),
                    raised_on: None,
                    version: None,
                }))
            })
            .await?;
        Ok(Counted {
            before: before.unwrap_or_default(),
            version: written.and_then(|w| w.version),
        })
    }

    /// Takes back a counted create whose Lease was not created (another
    /// host's create came first: 409 AlreadyExists), if nobody wrote the
    /// floor since: its term goes back to what it was, so that the next
    /// hand-over is not taken for a re-created Lease and does not skip
    /// a term. Nothing can have given a term out on the count: a create
    /// and a new term over a Lease both write the floor first (a new term
    /// is covered without a write only by a floor raised for that Lease
    /// object, which a count never is), and any write makes this one
    /// conflict. Best effort: a floor left raised skips a term, which
    /// fencing tokens allow. A floor the count created is left alone.
    pub async fn undo_create(&self, lease: &str, counted: &Counted) -> Result<bool, StoreError> {
        if counted.before.version.is_none() || counted.version.is_none() {
            return Ok(false);
        }
        let undone = self
            .raise(lease, |floor| {
                // Anyone's write since: left as it is (read again after a
                // conflict, which then finds the version changed).
                Ok((floor.version == counted.version).then(|| Floor {
                    term: counted.before.term,
                    creates: floor.creates,
                    raised_by: counted.before.raised_by.clone(),
                    raised_on: counted.before.raised_on.clone(),
                    version: None,
                }))
            })
            .await?;
        Ok(undone.is_some())
    }

    /// Before a write of the Lease object `uid` of `lease` that starts
    /// `term`: makes sure the floor covers it, reserving
    /// [`RESERVED_TERMS`] terms when it must be raised.
    ///
    /// `continuous`: the object's `leaseTransitions` was last written by
    /// baton (see `super::baton_wrote_transitions`), so it is the highest
    /// term baton wrote to this object. Only then may a reserved term be
    /// given out: a floor at or above `term`, raised for this same object,
    /// is [`Raised::Done`], with no request if this store saw it so (terms
    /// only grow within one object while baton alone writes them, so
    /// `term` was not written to it yet, and the object's resourceVersion
    /// decides who writes it). A floor at or above `term` raised for
    /// another object, or for an object whose `leaseTransitions` someone
    /// else wrote (reset in place by `kubectl replace`, a GitOps tool), is
    /// [`Raised::Behind`]: `term` may have been given out already.
    pub async fn raise_for_term(
        &self,
        lease: &str,
        term: u64,
        uid: Option<&str>,
        continuous: bool,
        instance: Option<&str>,
    ) -> Result<Raised, StoreError> {
        let covers = |floor: &Floor| {
            continuous && floor.term >= term && uid.is_some() && floor.raised_on.as_deref() == uid
        };
        let known = self.seen().get(lease).map(|kept| kept.floor.clone());
        if known.as_ref().is_some_and(covers) {
            return Ok(Raised::Done);
        }
        let mut behind = None;
        self.raise(lease, |floor| {
            behind = None;
            if floor.term < term {
                return Ok(Some(Floor {
                    term: term + RESERVED_TERMS - 1,
                    creates: floor.creates,
                    raised_by: instance.map(str::to_owned),
                    raised_on: uid.map(str::to_owned),
                    version: None,
                }));
            }
            if !covers(floor) {
                behind = Some(floor.term);
            }
            Ok(None)
        })
        .await?;
        Ok(behind.map_or(Raised::Done, Raised::Behind))
    }

    /// Makes sure the floor holds at least `term`, the term the Lease
    /// object `uid` shows: re-creates a deleted floor ConfigMap, and raises
    /// one found below the Lease (edited by hand). Returns the floor found
    /// if it was raised, `None` if it already held `term`. Always reads the
    /// ConfigMap (the floor seen before may have been deleted since).
    pub async fn ensure(
        &self,
        lease: &str,
        term: u64,
        uid: Option<&str>,
        instance: Option<&str>,
    ) -> Result<Option<Floor>, StoreError> {
        let mut raised = None;
        self.raise(lease, |floor| {
            if floor.term >= term {
                raised = None;
                return Ok(None);
            }
            raised = Some(floor.clone());
            Ok(Some(Floor {
                term,
                creates: floor.creates,
                raised_by: instance.map(str::to_owned),
                raised_on: uid.map(str::to_owned),
                version: None,
            }))
        })
        .await?;
        Ok(raised)
    }

    /// Asks `change` for the new floor (`None`: leave it) and writes that
    /// with the resourceVersion it was based on; again on a lost race. The
    /// first try is based on the floor this store last read or wrote, if
    /// `change` writes over it (a stale one is a conflict); every other
    /// answer of `change` is based on a fresh read.
    async fn raise(
        &self,
        lease: &str,
        mut change: impl FnMut(&Floor) -> Result<Option<Floor>, StoreError>,
    ) -> Result<Option<Floor>, StoreError> {
        if let Some((object, floor)) = self.last_seen(lease)
            && let Ok(Some(new)) = change(&floor)
        {
            match self.write(lease, object, &new).await {
                Ok(object) => return Ok(Some(self.wrote(lease, new, &object))),
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let (object, floor) = self.fetch(lease).await?;
            let Some(new) = change(&floor)? else {
                return Ok(None);
            };
            match self.write(lease, object, &new).await {
                Ok(object) => return Ok(Some(self.wrote(lease, new, &object))),
                Err(e) if e.is_conflict() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Unavailable {
            lease: lease.to_owned(),
            detail: format!(
                "{WRITE_ATTEMPTS} writes of the term floor in {} lost a race: {}",
                self.describe(lease),
                last.map_or_else(String::new, |e| e.to_string())
            ),
        })
    }

    /// `new` was written as `object`: remembered, and returned as written.
    fn wrote(&self, lease: &str, mut new: Floor, object: &ConfigMap) -> Floor {
        new.version = object.metadata.resource_version.clone();
        if new.raised_on.is_none() {
            new.raised_on = Some(String::new());
        }
        self.remember(lease, &new, Some(object));
        new
    }

    /// Writes `new` over `object`, the floor's ConfigMap as read, or
    /// creates the ConfigMap if there was none.
    async fn write(
        &self,
        lease: &str,
        object: Option<ConfigMap>,
        new: &Floor,
    ) -> Result<ConfigMap, StoreError> {
        let data = floor_data(new);
        match object {
            Some(mut object) => {
                // Keeps everything else, and the resourceVersion read: the
                // API server refuses the write (409) if anyone wrote in
                // between.
                object.data = Some(data);
                self.api
                    .replace(&floor_name(lease), &post_params(), &object)
                    .await
                    .map_err(|e| self.error(lease, "update", e))
            }
            None => self
                .api
                .create(&post_params(), &self.new_config_map(lease, data))
                .await
                .map_err(|e| self.error(lease, "create", e)),
        }
    }

    /// A new floor ConfigMap for `lease`, holding `data`.
    fn new_config_map(&self, lease: &str, data: BTreeMap<String, String>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(floor_name(lease)),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/managed-by".to_owned(), "baton".to_owned()),
                    (ROLE_LABEL.to_owned(), watch::FLOOR_ROLE.to_owned()),
                ])),
                annotations: Some(BTreeMap::from([(
                    FLOOR_LEASE_ANNOTATION.to_owned(),
                    lease.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    /// A request error about the floor, saying which object it was and, if
    /// refused, what the host's role lacks.
    fn error(&self, lease: &str, verb: &str, err: kube::Error) -> StoreError {
        let about = format!("the term floor ({})", self.describe(lease));
        match map_error(lease, verb, err) {
            StoreError::Refused { lease, detail } => StoreError::Refused {
                lease,
                detail: format!(
                    "{detail} ({about}: baton keeps each lease's highest term in a ConfigMap \
                     and needs get, create and update on configmaps in this namespace, as \
                     deploy/kubernetes/role.yaml grants)"
                ),
            },
            StoreError::Conflict { lease, detail } => StoreError::Conflict {
                lease,
                detail: format!("{about}: {detail}"),
            },
            StoreError::Unavailable { lease, detail } => StoreError::Unavailable {
                lease,
                detail: format!("{about}: {detail}"),
            },
            StoreError::Malformed { lease, detail } => StoreError::Malformed {
                lease,
                detail: format!("{about}: {detail}"),
            },
        }
    }
}

/// A floor as its ConfigMap's data.
fn floor_data(floor: &Floor) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([
        ("floor".to_owned(), floor.term.to_string()),
        ("creates".to_owned(), floor.creates.to_string()),
    ]);
    if let Some(by) = &floor.raised_by {
        data.insert("raised-by".to_owned(), by.clone());
    }
    data.insert(
        "raised-on".to_owned(),
        floor.raised_on.clone().unwrap_or_default(),
    );
    data
}
