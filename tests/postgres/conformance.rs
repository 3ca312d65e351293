//! The store contract (`tests/store_contract.rs`) on the postgres store:
//! each rule in a schema of its own, every client a `PostgresStore` of its
//! own (as another host's).

use super::*;

macro_rules! on_postgres {
    ($rule:ident) => {
        #[test]
        fn $rule() {
            let t = PgTest::new("conformance");
            t.rt.block_on(crate::store_contract::$rule(|| t.store()));
        }
    };
}

crate::store_contract::for_each_rule!(on_postgres);
