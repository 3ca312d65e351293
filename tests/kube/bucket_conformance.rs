//! The bucket contract (`tests/bucket_contract.rs`) on the Kubernetes
//! store: each rule in a namespace of its own, its handles `KubeBuckets`
//! on two clients of their own in turn (as two hosts have), as the admin.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use baton::store::buckets::BucketStore;
use baton::store::kube::buckets::KubeBuckets;

use super::*;

macro_rules! on_kube {
    ($rule:ident) => {
        #[test]
        fn $rule() {
            let t = KubeTest::new("buckets");
            let clients = [t.admin.clone(), t.rt.block_on(t.env.admin())];
            let opened = AtomicUsize::new(0);
            let open = || {
                let client = clients[opened.fetch_add(1, Ordering::SeqCst) % 2].clone();
                Arc::new(KubeBuckets::new(client, &t.ns.name)) as Arc<dyn BucketStore>
            };
            t.rt.block_on(crate::bucket_contract::$rule(open));
        }
    };
}

crate::bucket_contract::for_each_bucket_rule!(on_kube);
