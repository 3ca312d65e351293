//! The store contract (`tests/store_contract.rs`) on the etcd store: each
//! rule under a key prefix of its own, every client an `EtcdStore` of its
//! own (as another host's).

use super::*;

macro_rules! on_etcd {
    ($rule:ident) => {
        #[test]
        fn $rule() {
            let t = EtcdTest::new("conformance");
            t.rt.block_on(crate::store_contract::$rule(|| t.store()));
        }
    };
}

crate::store_contract::for_each_rule!(on_etcd);
