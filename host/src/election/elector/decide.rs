//! The elector's decisions: plain functions of what it knows, without I/O
//! or clocks of their own, so that each is tested on its own.

use std::time::Duration;

use tokio::time::Instant;

use super::{Intent, Me};
use crate::election::status::{Role, Status};
use crate::store::Versioned;
use crate::store::subscription::Sighting;

/// What a host that does not lead should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Try to take the lease now.
    Acquire,
    /// The holder's lease is valid until then.
    WaitUntil(Instant),
}

/// Decides whether a host that does not lead may try to take the lease.
///
/// The lease is free when it does not exist, has no holder, is held by this
/// very process (its identity and instance), or has expired: expiry is judged from the local
/// time at which the record was *seen to change* plus the duration written
/// in the record, never from timestamps inside it (immune to clock offsets
/// between hosts, and to candidates configured with other durations).
pub fn follower_decision(known: &Sighting, me: &Me, now: Instant) -> Decision {
    let Some(current) = &known.record else {
        return Decision::Acquire;
    };
    match current.record.holder() {
        None => Decision::Acquire,
        Some(_) if current.record.held_by(&me.identity, &me.instance) => Decision::Acquire,
        // Another holder, or another process under this identity.
        Some(_) => {
            let expiry = known.at + current.record.lease_duration;
            if now >= expiry {
                Decision::Acquire
            } else {
                Decision::WaitUntil(expiry)
            }
        }
    }
}

/// The status a host that does not lead reports.
pub fn follower_status(known: Option<&Sighting>, lease: &str, me: &Me, known_term: u64) -> Status {
    let record = known.and_then(|k| k.record.as_ref()).map(|v| &v.record);
    let term = record.map_or(0, |r| r.term).max(known_term);
    match record
        .filter(|r| !r.held_by(&me.identity, &me.instance))
        .and_then(|r| r.holder())
    {
        Some(holder) => Status {
            role: Role::Following,
            holder: Some(holder.to_owned()),
            lease: lease.to_owned(),
            term,
        },
        _ => Status {
            role: Role::Pending,
            holder: None,
            lease: lease.to_owned(),
            term,
        },
    }
}

/// What a record seen while this host holds the lease means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The record this host last wrote: nothing new.
    Same,
    /// A later version still held by this host in its term (a write whose
    /// answer was missed, or the record deleted while held, read as its
    /// tombstone): adopt it and lead on.
    Ours(Box<Versioned>),
    /// Another holder, no holder, or no record: the lease is lost.
    Lost,
}

/// Judges what a store reports while this host holds the lease in `term`,
/// its last write being `current`.
pub fn judge_sighting(record: Option<&Versioned>, current: &Versioned, me: &Me, term: u64) -> Verdict {
    match record {
        Some(r) if r.version == current.version => Verdict::Same,
        Some(r) if r.record.held_by(&me.identity, &me.instance) && r.record.term == term => {
            Verdict::Ours(Box::new(r.clone()))
        }
        _ => Verdict::Lost,
    }
}

/// How far off a draining host's next try is: far enough to be never, as
/// it contends again only when told to (its intent changes).
const DRAINING_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The earliest time a host that does not lead may try to take the lease,
/// given what it wants (`intent`), what it knows of the record (`known`) and
/// its own back-off (`not_before`); `None` when it must stop.
///
/// A host that defers to another lets the preferred host go first: by
/// `head_start` after a release or an absence, and once the holder's lease
/// expired by `head_start` or half a retry period, whichever is shorter, so
/// that failover stays within a lease duration and a retry period even if
/// the preferred host is gone too. A lease another host yielded is not
/// wanted by anyone now, so nobody waits for it.
pub fn contend_after(
    intent: Intent,
    known: Option<&Sighting>,
    me: &Me,
    not_before: Instant,
    retry_period: Duration,
) -> Option<Instant> {
    let head_start = match intent {
        Intent::Stop => return None,
        Intent::StandBy { until } => return Some(not_before.max(until)),
        // Woken by the intent's change, never by this time.
        Intent::Drain => return Some(not_before.max(Instant::now() + DRAINING_WAIT)),
        Intent::Contend => return Some(not_before),
        Intent::Defer { head_start } | Intent::HandOver { head_start, .. } => head_start,
    };
    let Some(k) = known else {
        return Some(not_before);
    };
    let after = match k.record.as_ref() {
        Some(v) if v.record.holder().is_some() => {
            if v.record.held_by(&me.identity, &me.instance) {
                return Some(not_before);
            }
            k.at + v.record.lease_duration + head_start.min(retry_period / 2)
        }
        Some(v) if v.record.yielded.as_ref().is_some_and(|y| y.by != me.identity) => return Some(not_before),
        _ => k.at + head_start,
    };
    Some(not_before.max(after))
}

/// Whether a host leading in `term`, which it began at `began`, goes on
/// leading under `intent` at `now`. A stand-by asked for in this term
/// hands the lease over even once its time has passed (a renewal slower
/// than it let the time pass before it was seen); one whose time has come
/// otherwise contends again.
pub fn keeps_leading(intent: Intent, term: u64, began: Instant, now: Instant) -> bool {
    match intent {
        Intent::Contend | Intent::Defer { .. } => true,
        Intent::HandOver { term: t, .. } => t != term,
        Intent::StandBy { until } => now >= until && until <= began,
        Intent::Drain | Intent::Stop => false,
    }
}
