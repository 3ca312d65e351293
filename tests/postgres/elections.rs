//! Real `baton` hosts electing through the postgres store.

use std::time::Duration;

use super::*;
use crate::support::Host;

#[test]
fn two_hosts_elect_one_leader_and_hand_over_on_sigterm() {
    let t = PgTest::new("elect");
    let cfg = t.scratch.write(
        "baton.toml",
        &format!("{}\n[[lease]]\nname = \"demo\"\n", t.head()),
    );
    let role = |r: &'static str| {
        move |e: &support::Event| e.message() == "lease status changed" && e.str("role") == Some(r)
    };
    let mut a = Host::start("a", &cfg);
    a.wait_for(Duration::from_secs(60), "a leading", role("leading"));
    let b = Host::start("b", &cfg);
    b.wait_for(Duration::from_secs(60), "b following", role("following"));
    let stop = a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(30)).success());
    let ms = support::assert_handed_over_by_release(&a, &b, "demo", stop);
    println!("postgres: the leader's release to the other host leading: {ms:.1} ms");
}
