//! The bucket contract (`tests/bucket_contract.rs`) on the postgres store:
//! each rule in a schema of its own, its handles on stores of their own
//! (as two hosts have).

use std::sync::Arc;

use baton::store::buckets::BucketStore;

use super::*;

macro_rules! on_postgres {
    ($rule:ident) => {
        #[test]
        fn $rule() {
            let t = PgTest::new("buckets");
            let stores = [t.store(), t.store()];
            let opened = std::sync::atomic::AtomicUsize::new(0);
            let open = || {
                let store = &stores[opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 2];
                Arc::new(store.buckets()) as Arc<dyn BucketStore>
            };
            t.rt.block_on(crate::bucket_contract::$rule(open));
        }
    };
}

crate::bucket_contract::for_each_bucket_rule!(on_postgres);
