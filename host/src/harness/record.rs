//! What a plugin did under the harness, kept with when (real time) and in
//! which term: its output lines ([`OutputLog`], the output capability's
//! tap), its bucket writes ([`RecordingBuckets`], around the memory store)
//! and its HTTP requests ([`StubHttp`], the answers of the scenario's
//! stubs).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;

use super::Harness;
use crate::runtime::{HttpStub, OutputTap, StubRequest, StubResponse};
use crate::store::buckets::{Applied, BucketError, BucketInfo, BucketName, BucketStore, Entry, Op, Write};

/// A list kept under a lock, each item with when it came.
#[derive(Debug)]
pub struct Log<T> {
    items: Mutex<Vec<(Instant, T)>>,
}

impl<T> Default for Log<T> {
    fn default() -> Self {
        Log {
            items: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Clone> Log<T> {
    fn push(&self, item: T) {
        self.push_at(Instant::now(), item);
    }

    fn push_at(&self, at: Instant, item: T) {
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, item));
    }

    /// Everything so far, with when.
    pub fn all(&self) -> Vec<(Instant, T)> {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many so far.
    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none came.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items after the first `from`.
    pub fn since(&self, from: usize) -> Vec<T> {
        let items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.iter().skip(from).map(|(_, t)| t.clone()).collect()
    }
}

/// The plugin's output lines: (stream, text).
#[derive(Debug, Default)]
pub struct OutputLog(pub Log<(&'static str, String)>);

impl OutputTap for OutputLog {
    fn line(&self, stream: &'static str, text: &str) {
        self.0.push((stream, text.to_owned()));
    }
}

/// One write the plugin asked for.
#[derive(Clone, Debug)]
pub struct WriteRecord {
    /// The bucket's name.
    pub bucket: String,
    /// The writer's term.
    pub term: u64,
    /// The keys it set, with their values.
    pub sets: Vec<(String, Vec<u8>)>,
    /// Whether it landed; else why not.
    pub result: Result<(), String>,
}

/// The memory store, its plugin writes recorded (the host's own, to the
/// schedules' bucket, are not the plugin's).
pub struct RecordingBuckets {
    inner: Arc<dyn BucketStore>,
    /// The plugin's writes.
    pub writes: Log<WriteRecord>,
}

impl RecordingBuckets {
    /// Around `inner`.
    pub fn new(inner: Arc<dyn BucketStore>) -> RecordingBuckets {
        RecordingBuckets {
            inner,
            writes: Log::default(),
        }
    }
}

#[async_trait::async_trait]
impl BucketStore for RecordingBuckets {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        self.inner.claim(bucket, term).await
    }

    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        self.inner.get(bucket, key).await
    }

    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        self.inner.get_many(bucket, keys).await
    }

    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        self.inner.list_keys(bucket, after, limit).await
    }

    /// Recorded as of when it was asked (a write asked before its term's
    /// change fired is not after it, however long it takes).
    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        let (term, asked) = (write.term, Instant::now());
        let sets = write
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Set { key, value } | Op::Swap { key, value, .. } => Some((key.clone(), value.clone())),
                _ => None,
            })
            .collect();
        let result = self.inner.apply(bucket, write).await;
        if bucket.bucket != crate::supervisor::SCHEDULES_BUCKET {
            self.writes.push_at(
                asked,
                WriteRecord {
                    bucket: bucket.bucket.clone(),
                    term,
                    sets,
                    result: result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                },
            );
        }
        result
    }

    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        self.inner.buckets(lease).await
    }
}

/// One stubbed answer: a URL (exact, or a prefix ending in `*`), a
/// method (any if `None`), and the response.
#[derive(Clone, Debug)]
pub struct Stub {
    /// The URL, or a prefix and `*`.
    pub url: String,
    /// The method, upper case; any if `None`.
    pub method: Option<String>,
    /// The answer.
    pub response: StubResponse,
}

impl Stub {
    fn matches(&self, request: &StubRequest) -> bool {
        let url = match self.url.strip_suffix('*') {
            Some(prefix) => request.url.starts_with(prefix),
            None => request.url == self.url || request.url == format!("{}/", self.url),
        };
        url && self
            .method
            .as_ref()
            .is_none_or(|m| m.eq_ignore_ascii_case(&request.method))
    }
}

/// The scenario's HTTP stubs, first match wins, and every request seen.
#[derive(Debug, Default)]
pub struct StubHttp {
    /// The stubs, in order.
    pub stubs: Vec<Stub>,
    /// Each request and whether a stub answered it.
    pub requests: Log<(StubRequest, bool)>,
}

impl HttpStub for StubHttp {
    fn answer(&self, request: StubRequest) -> StubResponse {
        let found = self.stubs.iter().find(|s| s.matches(&request));
        self.requests.push((request.clone(), found.is_some()));
        match found {
            Some(stub) => stub.response.clone(),
            None => StubResponse {
                status: 404,
                headers: vec![("content-type".into(), "text/plain".into())],
                body: Bytes::from(format!(
                    "baton test: no stub for {} {}",
                    request.method, request.url
                )),
            },
        }
    }
}

/// What the plugin did, and where its buckets are.
pub struct Subject {
    /// Its output lines.
    pub output: Arc<OutputLog>,
    /// How many of them a `stdout-contains` has looked at.
    pub stdout_checked: Mutex<usize>,
    /// The stubs' record, if the scenario has stubs.
    pub http: Option<Arc<StubHttp>>,
    /// How many requests an `http-requests` has looked at.
    pub http_checked: Mutex<usize>,
    /// Its writes, recorded.
    pub buckets: Arc<RecordingBuckets>,
    /// The store itself (an operator's writes are not the plugin's).
    pub store: Arc<dyn BucketStore>,
    /// The buckets it may open, by its names for them.
    pub bucket_names: Vec<String>,
}

impl Subject {
    /// The stored bucket behind the plugin's name for one (`None`: its only
    /// one); `Err` says why there is none.
    pub fn bucket(&self, h: &Harness, name: Option<&str>) -> Result<BucketName, String> {
        let name = match name {
            Some(n) if self.bucket_names.iter().any(|b| b == n) => n,
            Some(n) => {
                return Err(format!(
                    "the plugin has no bucket {n:?} (it may open: {})",
                    self.bucket_names.join(", ")
                ));
            }
            None => match self.bucket_names.as_slice() {
                [only] => only,
                [] => return Err("the plugin may open no bucket".into()),
                _ => {
                    return Err(format!(
                        "name the bucket: it may open {}",
                        self.bucket_names.join(", ")
                    ));
                }
            },
        };
        let stored = if name == crate::runtime::OWN_BUCKET {
            h.plugin().name()
        } else {
            name
        };
        Ok(BucketName::new(h.lease(), stored))
    }
}
