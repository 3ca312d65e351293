//! The bucket contract (`tests/bucket_contract.rs`) on the stores that need
//! no server: each rule on a new, empty store.

/// On the memory store: every handle the same `MemoryBuckets`.
mod memory {
    use std::sync::Arc;

    use baton::store::buckets::BucketStore;
    use baton::store::memory::buckets::MemoryBuckets;

    macro_rules! on_memory {
        ($rule:ident) => {
            #[tokio::test]
            async fn $rule() {
                let store = Arc::new(MemoryBuckets::new());
                crate::bucket_contract::$rule(|| store.clone() as Arc<dyn BucketStore>).await;
            }
        };
    }

    crate::bucket_contract::for_each_bucket_rule!(on_memory);
}

/// On the embedded store in a temporary directory: every handle the
/// database opened anew (another SQLite connection, as another process
/// has).
mod embedded {
    use std::sync::Arc;

    use baton::store::buckets::BucketStore;
    use baton::store::embedded::buckets::EmbeddedBuckets;

    macro_rules! on_embedded {
        ($rule:ident) => {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $rule() {
                let dir = tempfile::tempdir().unwrap();
                let store = dir.path().join("leases");
                crate::bucket_contract::$rule(|| {
                    Arc::new(EmbeddedBuckets::open(&store).unwrap()) as Arc<dyn BucketStore>
                })
                .await;
            }
        };
    }

    crate::bucket_contract::for_each_bucket_rule!(on_embedded);
}

/// Hosts started together open one new database at once: each opens it
/// (switching to WAL and writing the schema may be refused at once with
/// `SQLITE_BUSY`; opening waits that out, as a busy write does).
#[test]
fn hosts_started_together_all_open_a_new_embedded_database() {
    use baton::store::embedded::buckets::EmbeddedBuckets;

    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("leases");
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            let opened: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        EmbeddedBuckets::open(&store).map(|_| ())
                    })
                })
                .collect();
            for o in opened {
                o.join().unwrap().unwrap();
            }
        });
    }
}
