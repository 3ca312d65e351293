//! An operator's write to a bucket (`baton kv put` and `delete`): made in a
//! term of its own, so that it fences a leader like any newer term.
//!
//! The write takes the lease first: a record held by the operator, in the
//! lease's next term, written by compare-and-swap like any acquisition.
//! Then it writes the bucket in that term, which raises the bucket's fence
//! above every earlier term: a leader still running in an older term has
//! its writes refused from then on.
//!
//! - **Nobody led** (the record is released, or there is none): the lease
//!   is released again right after the write, and hosts contend at once.
//! - **A host leads**: refused unless forced. Forced, the operator's
//!   record stays held for a full lease duration and is not released: the
//!   displaced leader stops its tasks within its renew deadline and grace,
//!   both shorter than a lease duration, and no other host takes over
//!   before the operator's lease runs out. So no plugin runs on two hosts
//!   at once, even when an operator writes under a running leader.

use std::time::{Duration, SystemTime};

use crate::store::buckets::{Applied, BucketError, BucketName, BucketStore, Limits, Op, Write};
use crate::store::{LeaseRecord, LeaseStore, RELEASED_LEASE_DURATION, StoreError, Versioned};

/// Who writes, where, and whether over a running leader.
pub struct Operator<'a> {
    /// The lease store.
    pub leases: &'a dyn LeaseStore,
    /// Its buckets.
    pub buckets: &'a dyn BucketStore,
    /// The identity written as the lease's holder.
    pub identity: String,
    /// The lease's configured duration: how long a forced write's record
    /// stays held.
    pub lease_duration: Duration,
    /// Whether to write while a host leads.
    pub force: bool,
}

/// What an operator's write did.
#[derive(Debug)]
pub struct Written {
    /// The term it was written in.
    pub term: u64,
    /// The holder it displaced, if forced over one.
    pub displaced: Option<String>,
    /// For each increment, the new value.
    pub applied: Applied,
}

/// Why an operator's write was not made.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// A host holds the lease, and the write was not forced.
    #[error(
        "lease {lease:?} is held by {holder:?} in term {term}: a write now would fence its running \
         tasks; stop it, `baton yield {lease}`, or pass --force (the lease is then kept from every \
         host for one lease duration, {})",
        humantime::format_duration(*.lease_duration)
    )]
    Led {
        /// The lease.
        lease: String,
        /// Its holder.
        holder: String,
        /// Its term.
        term: u64,
        /// Its lease duration.
        lease_duration: Duration,
    },
    /// The lease store failed or another host wrote the lease first.
    #[error("{0}")]
    Lease(#[from] StoreError),
    /// The bucket refused the write.
    #[error("{0}")]
    Bucket(#[from] BucketError),
}

impl Operator<'_> {
    /// Writes `ops` to `bucket` in a term of its own; see the [module
    /// documentation](self).
    pub async fn write(
        &self,
        bucket: &BucketName,
        ops: Vec<Op>,
        limits: Limits,
    ) -> Result<Written, OperatorError> {
        let lease = bucket.lease.as_str();
        let (taken, holder) = self.take(lease).await?;
        let term = taken.record.term;
        let applied = self.buckets.apply(bucket, Write::new(term, ops, limits)).await;
        if holder.is_none() {
            let released = LeaseRecord::new(None, term, RELEASED_LEASE_DURATION);
            self.leases.update(lease, &taken.version, &released).await?;
        }
        Ok(Written {
            term,
            displaced: holder,
            applied: applied?,
        })
    }

    /// Takes the lease in its next term: reads the record, then writes it
    /// by compare-and-swap; again, reading anew, when another writer wrote
    /// in between (a leader renewing: forced, that happens whenever the
    /// read and the write straddle a renewal). Returns the operator's
    /// version and the holder it displaced.
    async fn take(&self, lease: &str) -> Result<(Versioned, Option<String>), OperatorError> {
        let mut attempt = 1;
        loop {
            let current = self.leases.get(lease).await?;
            let (term, holder) = current.as_ref().map_or((0, None), |v| {
                (v.record.term, v.record.holder().map(str::to_owned))
            });
            if let Some(holder) = &holder
                && !self.force
            {
                return Err(OperatorError::Led {
                    lease: lease.to_owned(),
                    holder: holder.clone(),
                    term,
                    lease_duration: self.lease_duration,
                });
            }
            let now = SystemTime::now();
            let mut record = LeaseRecord::new(Some(&self.identity), term + 1, self.lease_duration);
            record.acquire_time = Some(now);
            record.renew_time = Some(now);
            record.instance = Some(format!("{:016x}", rand::random::<u64>()));
            let taken = match &current {
                Some(v) => self.leases.update(lease, &v.version, &record).await,
                None => self.leases.create(lease, &record).await,
            };
            match taken {
                Ok(taken) => return Ok((taken, holder)),
                Err(e) if e.is_conflict() && attempt < TAKE_ATTEMPTS => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// How many times [`Operator::take`] reads and writes the lease before a
/// conflict is the answer.
const TAKE_ATTEMPTS: u32 = 10;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::memory::buckets::MemoryBuckets;

    fn set(key: &str) -> Vec<Op> {
        vec![Op::Set {
            key: key.into(),
            value: b"v".to_vec(),
        }]
    }

    #[tokio::test]
    async fn a_write_takes_a_term_of_its_own_and_fences_the_older_ones() {
        let leases = MemoryStore::new();
        let buckets = Arc::new(MemoryBuckets::new());
        let b = BucketName::new("demo", "p");
        leases
            .create("demo", &LeaseRecord::new(None, 4, RELEASED_LEASE_DURATION))
            .await
            .unwrap();
        buckets.claim(&b, 4).await.unwrap();
        let op = Operator {
            leases: &leases,
            buckets: &*buckets,
            identity: "baton-kv".into(),
            lease_duration: Duration::from_secs(15),
            force: false,
        };
        let written = op.write(&b, set("k"), Limits::default()).await.unwrap();
        assert_eq!((written.term, written.displaced), (5, None));
        let after = leases.get("demo").await.unwrap().unwrap().record;
        assert_eq!(
            (after.holder(), after.term),
            (None, 5),
            "released in its own term"
        );
        let stale = buckets
            .apply(&b, Write::new(4, set("k"), Limits::default()))
            .await
            .unwrap_err();
        assert!(stale.is_stale(), "{stale}");
    }

    #[tokio::test]
    async fn a_held_lease_is_refused_unless_forced_and_then_kept() {
        let leases = MemoryStore::new();
        let buckets = MemoryBuckets::new();
        let b = BucketName::new("demo", "p");
        leases
            .create(
                "demo",
                &LeaseRecord::new(Some("node-a"), 7, Duration::from_secs(15)),
            )
            .await
            .unwrap();
        let mut op = Operator {
            leases: &leases,
            buckets: &buckets,
            identity: "baton-kv".into(),
            lease_duration: Duration::from_secs(15),
            force: false,
        };
        let e = op.write(&b, set("k"), Limits::default()).await.unwrap_err();
        assert!(e.to_string().contains("held by \"node-a\" in term 7"), "{e}");
        op.force = true;
        let written = op.write(&b, set("k"), Limits::default()).await.unwrap();
        assert_eq!((written.term, written.displaced.as_deref()), (8, Some("node-a")));
        let after = leases.get("demo").await.unwrap().unwrap().record;
        assert_eq!(
            (after.holder(), after.lease_duration),
            (Some("baton-kv"), Duration::from_secs(15))
        );
    }

    #[tokio::test]
    async fn a_forced_write_reads_again_after_a_renewal_in_between_and_gives_up_in_the_end() {
        let leases = MemoryStore::new();
        let buckets = MemoryBuckets::new();
        let b = BucketName::new("demo", "p");
        let held = LeaseRecord::new(Some("node-a"), 7, Duration::from_secs(15));
        leases.create("demo", &held).await.unwrap();
        let op = Operator {
            leases: &leases,
            buckets: &buckets,
            identity: "baton-kv".into(),
            lease_duration: Duration::from_secs(15),
            force: true,
        };
        // The leader's renewals land between the operator's reads and
        // writes, three times.
        leases.inject_conflict_next(3);
        let written = op.write(&b, set("k"), Limits::default()).await.unwrap();
        assert_eq!((written.term, written.displaced.as_deref()), (8, Some("node-a")));
        // Every time: a conflict, named as one.
        leases.inject_conflict_next(u64::from(TAKE_ATTEMPTS));
        let e = op.write(&b, set("k"), Limits::default()).await.unwrap_err();
        assert!(matches!(&e, OperatorError::Lease(s) if s.is_conflict()), "{e}");
    }
}
