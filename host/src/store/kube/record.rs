//! The conversion between a Lease object and a [`LeaseRecord`]: the
//! record's fields in the Lease's `spec`, the holder's instance, claims,
//! host and a yield in annotations of baton's, the version as `resourceVersion`.
//! Reading is lenient with what a foreign writer leaves out; writing keeps
//! every field and annotation it does not own.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kube::api::DynamicObject;
use serde_json::{Map, Value};

use super::Inner;
use crate::store::{DEFAULT_WEIGHT, HostInfo, LeaseRecord, StoreError, Versioned, Yielded};

/// The annotation that carries [`LeaseRecord::instance`]: the holder's
/// process, so that two processes under one identity tell their records
/// apart. Written with every write of baton's, removed on release; other
/// writers leave it alone or drop it, and a record without it is nobody's
/// own (see [`LeaseRecord::held_by`]).
pub const HOLDER_INSTANCE: &str = "baton.dev/holder-instance";

/// The annotation that carries [`LeaseRecord::plugins`], the holder's
/// claims: plugin names, comma-separated (plugin names hold no comma).
/// Written with every write of baton's that holds the lease, removed on
/// release; read only with a holder.
pub const PLUGINS: &str = "baton.dev/plugins";

/// The annotations that carry [`LeaseRecord::yielded`]: the identity of the
/// host that yielded the lease, and for how long (milliseconds, as `15000ms`).
/// Written on a release by `baton yield`, removed by every other write of
/// baton's; read only on a Lease without holder.
pub const YIELDED_BY: &str = "baton.dev/yielded-by";
/// See [`YIELDED_BY`].
pub const YIELDED_FOR: &str = "baton.dev/yielded-for";

/// The annotations that carry [`LeaseRecord::host`]: the holder's address
/// (absent when it has none), whether it drains (`true` or `false`) and its
/// weight (a decimal integer). Written with every write of baton's that
/// holds the lease, removed by every other; read only with a holder, and
/// only when [`HOLDER_DRAINING`] or [`HOLDER_WEIGHT`] is there (baton
/// writes both), so a record of an older baton reads as `None`.
pub const HOLDER_ADDRESS: &str = "baton.dev/holder-address";
/// See [`HOLDER_ADDRESS`].
pub const HOLDER_DRAINING: &str = "baton.dev/draining";
/// See [`HOLDER_ADDRESS`].
pub const HOLDER_WEIGHT: &str = "baton.dev/weight";
/// See [`HOLDER_ADDRESS`]: `plugin=sha256:…` pairs, comma-separated
/// ([`HostInfo::versions`]).
pub const HOLDER_VERSIONS: &str = "baton.dev/versions";

/// Reads a Lease object as a record. Lenient with everything a foreign
/// writer may leave out; strict only where a value has the wrong JSON type
/// (which a real API server never serves).
pub fn to_versioned(
    lease: &str,
    obj: &DynamicObject,
    fallback_duration: Duration,
) -> Result<Versioned, StoreError> {
    read_lease(obj, fallback_duration).map_err(|e| StoreError::Malformed {
        lease: lease.to_owned(),
        detail: e.to_string(),
    })
}

/// What makes a Lease object unreadable: a value of the wrong JSON type.
#[derive(Debug, thiserror::Error)]
enum Malformed {
    #[error("the Lease object has no metadata.resourceVersion")]
    NoVersion,
    #[error("spec is not an object: {0}")]
    Spec(Value),
    #[error("spec.{field} is not {expected}: {value}")]
    Field {
        field: &'static str,
        expected: &'static str,
        value: Value,
    },
}

/// [`to_versioned`], with what is malformed as the error.
fn read_lease(obj: &DynamicObject, fallback_duration: Duration) -> Result<Versioned, Malformed> {
    let version = obj
        .metadata
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
        .ok_or(Malformed::NoVersion)?;
    let spec = Spec::of(obj)?;
    let holder = spec.holder()?;
    let lease_duration = spec.lease_duration(fallback_duration)?;
    let term = spec.transitions()?;
    let annotations = obj.metadata.annotations.as_ref();
    Ok(Versioned {
        version,
        record: LeaseRecord {
            // Only with a holder: a foreign writer that took the Lease over
            // and kept the annotations leaves ours behind.
            instance: holder
                .as_ref()
                .and_then(|_| annotations?.get(HOLDER_INSTANCE).cloned()),
            plugins: holder.as_ref().and_then(|_| claimed_plugins(annotations?)),
            host: holder.as_ref().and_then(|_| host_of(annotations?)),
            // Only without a holder: a release by `baton yield`.
            yielded: match &holder {
                Some(_) => None,
                None => annotations.and_then(yield_of),
            },
            holder,
            lease_duration,
            acquire_time: spec.time("acquireTime"),
            renew_time: spec.time("renewTime"),
            term,
        },
    })
}

impl Malformed {
    fn field(field: &'static str, expected: &'static str, value: &Value) -> Malformed {
        Malformed::Field {
            field,
            expected,
            value: value.clone(),
        }
    }
}

/// A Lease's `spec`, read field by field: a missing `spec`, and a field
/// that is `null`, read as missing.
struct Spec<'a>(Option<&'a Map<String, Value>>);

impl<'a> Spec<'a> {
    fn of(obj: &'a DynamicObject) -> Result<Spec<'a>, Malformed> {
        match obj.data.get("spec") {
            None | Some(Value::Null) => Ok(Spec(None)),
            Some(Value::Object(spec)) => Ok(Spec(Some(spec))),
            Some(other) => Err(Malformed::Spec(other.clone())),
        }
    }

    fn field(&self, name: &str) -> Option<&'a Value> {
        self.0?.get(name).filter(|v| !v.is_null())
    }

    /// `holderIdentity`; empty reads as none.
    fn holder(&self) -> Result<Option<String>, Malformed> {
        match self.field("holderIdentity") {
            None => Ok(None),
            Some(Value::String(h)) if h.is_empty() => Ok(None),
            Some(Value::String(h)) => Ok(Some(h.clone())),
            Some(other) => Err(Malformed::field("holderIdentity", "a string", other)),
        }
    }

    /// `leaseDurationSeconds`; the fallback duration when it is missing or
    /// not positive.
    fn lease_duration(&self, fallback_duration: Duration) -> Result<Duration, Malformed> {
        let Some(v) = self.field("leaseDurationSeconds") else {
            return Ok(fallback_duration);
        };
        match v.as_i64() {
            Some(s) if s > 0 => Ok(Duration::from_secs(s as u64)),
            Some(_) => Ok(fallback_duration),
            None => Err(Malformed::field("leaseDurationSeconds", "an integer", v)),
        }
    }

    /// `leaseTransitions`, the term; 0 when missing or negative.
    fn transitions(&self) -> Result<u64, Malformed> {
        let Some(v) = self.field("leaseTransitions") else {
            return Ok(0);
        };
        match v.as_i64() {
            Some(t) => Ok(t.max(0) as u64),
            None => Err(Malformed::field("leaseTransitions", "an integer", v)),
        }
    }

    /// A MicroTime field; one that does not parse reads as missing.
    fn time(&self, name: &str) -> Option<SystemTime> {
        self.field(name)
            .and_then(Value::as_str)
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    }
}

/// The holder's claims, from the [`PLUGINS`] annotation.
fn claimed_plugins(annotations: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let listed = annotations.get(PLUGINS)?;
    Some(
        listed
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// The holder's host, from the [`HOLDER_ADDRESS`], [`HOLDER_DRAINING`] and
/// [`HOLDER_WEIGHT`] annotations; a weight that does not parse reads as
/// the default.
fn host_of(annotations: &BTreeMap<String, String>) -> Option<HostInfo> {
    let draining = annotations.get(HOLDER_DRAINING);
    let weight = annotations.get(HOLDER_WEIGHT);
    if draining.is_none() && weight.is_none() {
        return None;
    }
    Some(HostInfo {
        address: annotations.get(HOLDER_ADDRESS).filter(|a| !a.is_empty()).cloned(),
        draining: draining.is_some_and(|d| d == "true"),
        weight: weight.and_then(|w| w.parse().ok()).unwrap_or(DEFAULT_WEIGHT),
        versions: annotations
            .get(HOLDER_VERSIONS)
            .map(|v| {
                v.split(',')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(p, d)| (p.to_owned(), d.to_owned()))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// A yield, from the [`YIELDED_BY`] and [`YIELDED_FOR`] annotations.
fn yield_of(annotations: &BTreeMap<String, String>) -> Option<Yielded> {
    let by = annotations.get(YIELDED_BY).filter(|b| !b.is_empty())?;
    let duration = humantime::parse_duration(annotations.get(YIELDED_FOR)?).ok()?;
    Some(Yielded {
        by: by.clone(),
        duration,
    })
}

/// Writes the record's fields into an object's `spec`, keeping any other
/// field of it.
pub fn write_spec(lease: &str, data: &mut Value, record: &LeaseRecord) -> Result<(), StoreError> {
    let refused = |detail: String| StoreError::Refused {
        lease: lease.to_owned(),
        detail,
    };
    let d = record.lease_duration;
    if d.subsec_nanos() != 0 || d.as_secs() == 0 || d.as_secs() > i32::MAX as u64 {
        return Err(refused(format!(
            "a Kubernetes Lease holds its duration in whole seconds (1 to {}); {} cannot be written",
            i32::MAX,
            humantime::format_duration(d)
        )));
    }
    let transitions = i32::try_from(record.term).map_err(|_| {
        refused(format!(
            "term {} does not fit in leaseTransitions (an int32)",
            record.term
        ))
    })?;
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    let root = data.as_object_mut().expect("an object");
    let spec = root.entry("spec").or_insert_with(|| Value::Object(Map::new()));
    if !spec.is_object() {
        *spec = Value::Object(Map::new());
    }
    let spec = spec.as_object_mut().expect("an object");
    spec.insert(
        "holderIdentity".into(),
        Value::String(record.holder.clone().unwrap_or_default()),
    );
    spec.insert("leaseDurationSeconds".into(), Value::from(d.as_secs()));
    let mut time = |name: &str, t: Option<SystemTime>| match t {
        Some(t) => {
            spec.insert(name.into(), Value::String(micro_time(t)));
        }
        None => {
            spec.remove(name);
        }
    };
    time("acquireTime", record.acquire_time);
    time("renewTime", record.renew_time);
    spec.insert("leaseTransitions".into(), Value::from(transitions));
    Ok(())
}

/// A Kubernetes MicroTime: RFC 3339 in UTC with microseconds.
pub(super) fn micro_time(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

impl Inner {
    /// Writes `record` and this host's labels into `obj`, leaving everything
    /// else as it is.
    pub(super) fn apply(
        &self,
        lease: &str,
        obj: &mut DynamicObject,
        record: &LeaseRecord,
    ) -> Result<(), StoreError> {
        let labels = obj.metadata.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in &self.watch.selector {
            labels.insert(k.clone(), v.clone());
        }
        write_annotations(&mut obj.metadata.annotations, record);
        write_spec(lease, &mut obj.data, record)
    }
}

/// Writes the record's annotations ([`HOLDER_INSTANCE`], [`PLUGINS`], the
/// host's and a yield's) into `annotations`, removing those the record
/// does not carry and keeping every other.
pub fn write_annotations(annotations: &mut Option<BTreeMap<String, String>>, record: &LeaseRecord) {
    let a = annotations.get_or_insert_with(BTreeMap::new);
    let mut set = |key: &str, value: Option<String>| match value {
        Some(v) => {
            a.insert(key.into(), v);
        }
        None => {
            a.remove(key);
        }
    };
    let held = record.holder().is_some();
    set(HOLDER_INSTANCE, record.instance.clone());
    set(
        PLUGINS,
        record.plugins.as_ref().filter(|_| held).map(|p| p.join(",")),
    );
    let host = record.host.as_ref().filter(|_| held);
    set(HOLDER_ADDRESS, host.and_then(|h| h.address.clone()));
    set(HOLDER_DRAINING, host.map(|h| h.draining.to_string()));
    set(HOLDER_WEIGHT, host.map(|h| h.weight.to_string()));
    let versions = host.filter(|h| !h.versions.is_empty()).map(|h| {
        let pairs: Vec<String> = h.versions.iter().map(|(p, d)| format!("{p}={d}")).collect();
        pairs.join(",")
    });
    set(HOLDER_VERSIONS, versions);
    let yielded = record.yielded.as_ref().filter(|_| !held);
    set(YIELDED_BY, yielded.map(|y| y.by.clone()));
    set(
        YIELDED_FOR,
        yielded.map(|y| format!("{}ms", y.duration.as_millis())),
    );
    if a.is_empty() {
        *annotations = None;
    }
}
