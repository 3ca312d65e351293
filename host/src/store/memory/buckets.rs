//! Buckets in memory, for tests: one process, one lock, the fence compared
//! and the write made under it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::store::buckets::{
    Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Write, apply_to_entries, check_fence,
};

/// One bucket's fence, revision and entries.
#[derive(Default, Clone)]
struct Bucket {
    fence: u64,
    revision: u64,
    entries: BTreeMap<String, Entry>,
}

/// Buckets in memory.
#[derive(Default)]
pub struct MemoryBuckets {
    buckets: Mutex<HashMap<BucketName, Bucket>>,
}

impl MemoryBuckets {
    /// An empty store.
    pub fn new() -> MemoryBuckets {
        MemoryBuckets::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<BucketName, Bucket>) -> R) -> R {
        f(&mut self.buckets.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[async_trait::async_trait]
impl BucketStore for MemoryBuckets {
    fn describe(&self) -> String {
        "buckets in memory".into()
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        self.with(|all| {
            let b = all.entry(bucket.clone()).or_default();
            check_fence(bucket, term, b.fence)?;
            Ok(std::mem::replace(&mut b.fence, term))
        })
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        Ok(self.with(|all| all.get(bucket).and_then(|b| b.entries.get(key).cloned())))
    }

    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        Ok(self.with(|all| {
            let b = all.get(bucket);
            keys.iter()
                .map(|k| b.and_then(|b| b.entries.get(k).cloned()))
                .collect()
        }))
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        Ok(self.with(|all| {
            let Some(b) = all.get(bucket) else {
                return Vec::new();
            };
            b.entries
                .keys()
                .filter(|k| after.is_none_or(|a| k.as_str() > a))
                .take(limit)
                .cloned()
                .collect()
        }))
    }

    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        self.with(|all| {
            let b = all.entry(bucket.clone()).or_default();
            check_fence(bucket, write.term, b.fence)?;
            let mut entries = b.entries.clone();
            let applied = apply_to_entries(bucket, &mut entries, b.revision, &write.ops, write.limits)?;
            if !(write.may_commit)() {
                return Err(BucketError::Stopped {
                    bucket: bucket.clone(),
                    term: write.term,
                });
            }
            b.entries = entries;
            b.revision += 1;
            b.fence = write.term;
            Ok(applied)
        })
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        let mut all: Vec<BucketInfo> = self.with(|all| {
            all.iter()
                .filter(|(n, _)| lease.is_none_or(|l| n.lease == l))
                .map(|(n, b)| BucketInfo {
                    name: n.clone(),
                    fence: b.fence,
                    entries: b.entries.len() as u64,
                    bytes: b
                        .entries
                        .iter()
                        .map(|(k, e)| (k.len() + e.value.len()) as u64)
                        .sum(),
                })
                .collect()
        });
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }
}
