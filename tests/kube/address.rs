//! Where the leader is, on Leases: the scenario of
//! `tests/e2e/leader_address.rs` (two hosts advertising different
//! addresses, one through `POD_IP`; `/leases` and `baton status` name each
//! holder and its address, before and after a SIGTERM hand-over), with
//! the address checked on the Lease objects themselves.

use super::*;
use baton::store::kube::HOLDER_ADDRESS;

#[test]
fn the_holders_address_is_on_its_leases_and_in_status_across_a_hand_over() {
    let t = KubeTest::new("address");
    let cfg = t
        .scratch
        .write("baton.toml", &leader_address::address_config(&t.head()));
    let on_lease = |name: &str| {
        let lease = t.lease(name).unwrap_or_else(|| panic!("no Lease {name}"));
        let holder = spec_of(&lease).holder_identity.filter(|h| !h.is_empty());
        let annotations = lease.metadata.annotations.unwrap_or_default();
        (holder, annotations.get(HOLDER_ADDRESS).cloned())
    };
    leader_address::hosts_name_the_leader_and_its_address(&cfg, SECS(20), |leases| {
        for (name, holder) in leases {
            let (on_object, address) = on_lease(name);
            assert_eq!(&on_object, holder, "{name}");
            let want = holder.as_deref().map(leader_address::address);
            assert_eq!(address.as_deref(), want, "{name}'s annotation");
        }
        for host in ["a", "b"] {
            let (holder, address) = on_lease(&format!("baton-member.{host}"));
            assert_eq!(holder.as_deref(), Some(host));
            assert_eq!(address.as_deref(), Some(leader_address::address(host)));
        }
    });
    // b's released membership Lease carries no address.
    let (holder, address) = on_lease("baton-member.b");
    assert_eq!((holder, address), (None, None));
}
