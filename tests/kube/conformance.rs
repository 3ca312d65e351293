//! The store contract (`tests/store_contract.rs`) on the Kubernetes store:
//! each rule in a namespace of its own, every client a `KubeStore` of its
//! own on it (as another host's), as the admin, without labels.

use super::*;

macro_rules! on_kube {
    ($rule:ident) => {
        #[test]
        fn $rule() {
            let t = KubeTest::new("conformance");
            t.rt.block_on(crate::store_contract::$rule(|| t.store(&[])));
        }
    };
}

crate::store_contract::for_each_rule!(on_kube);
