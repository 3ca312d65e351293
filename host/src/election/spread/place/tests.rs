//! Tests of the assignment with placement rules ([`assign_placed`]).

use super::*;

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn plain(leases: &[String]) -> BTreeMap<String, Placement> {
    leases.iter().map(|l| (l.clone(), Placement::default())).collect()
}

fn members(hosts: &[(&str, u32)]) -> Vec<Member> {
    hosts
        .iter()
        .map(|(h, w)| Member {
            identity: (*h).to_owned(),
            weight: *w,
        })
        .collect()
}

fn load(a: &BTreeMap<String, String>, host: &str) -> u64 {
    a.values().filter(|h| *h == host).count() as u64
}

fn rules(prefer: &[&str], avoid: &[&str]) -> Placement {
    Placement {
        prefer: prefer.iter().map(|s| (*s).to_owned()).collect(),
        avoid: avoid.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[test]
fn without_rules_and_weights_it_is_the_plain_assignment() {
    let leases = names("lease-", 23);
    for n in [1, 2, 3, 5] {
        let hosts = names("host-", n);
        let a = assign_placed(
            &plain(&leases),
            &hosts.iter().map(|h| Member::new(h)).collect::<Vec<_>>(),
        );
        assert_eq!(a, super::super::assign(&leases, &hosts), "{n} hosts");
        assert_eq!(a.len(), 23);
    }
    assert!(assign_placed(&plain(&leases), &[]).is_empty());
}

#[test]
fn weights_bound_each_host_by_the_floor_and_ceiling_of_its_share() {
    for (m, weights) in [
        (30, vec![1, 2, 3]),
        (31, vec![1, 1, 4]),
        (7, vec![1000, 1]),
        (100, vec![5, 3, 2, 1]),
        (3, vec![2, 2, 2, 2]),
        (0, vec![1, 2]),
    ] {
        let leases = names("lease-", m);
        let hosts: Vec<(String, u32)> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("h{i}"), *w))
            .collect();
        let ms: Vec<Member> = hosts
            .iter()
            .map(|(h, w)| Member {
                identity: h.clone(),
                weight: *w,
            })
            .collect();
        let a = assign_placed(&plain(&leases), &ms);
        assert_eq!(a.len(), m);
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        for (h, w) in &hosts {
            let share = m as u64 * u64::from(*w);
            let (lo, hi) = (share / total, share.div_ceil(total));
            let n = load(&a, h);
            assert!(
                lo <= n && n <= hi,
                "{m} leases, weights {weights:?}: {h} has {n}, not {lo}..={hi}"
            );
        }
    }
}

#[test]
fn the_same_view_gives_the_same_assignment_in_any_order() {
    let leases = names("jobs.", 20);
    let mut placed = plain(&leases);
    placed.insert("jobs.3".into(), rules(&["c", "a"], &[]));
    placed.insert("jobs.4".into(), rules(&[], &["a", "b"]));
    let hosts = members(&[("a", 2), ("b", 1), ("c", 3)]);
    let mut reversed = hosts.clone();
    reversed.reverse();
    let a = assign_placed(&placed, &hosts);
    assert_eq!(a, assign_placed(&placed, &reversed));
    assert_eq!(a, assign_placed(&placed.clone(), &hosts));
}

#[test]
fn the_first_live_preferred_host_always_gets_the_lease() {
    let leases = names("lease-", 9);
    let mut placed = plain(&leases);
    // Four leases pinned to a: more than its bound of 3.
    for l in &leases[..4] {
        placed.insert(l.clone(), rules(&["gone", "a", "b"], &[]));
    }
    let hosts = members(&[("a", 1), ("b", 1), ("c", 1)]);
    let a = assign_placed(&placed, &hosts);
    for l in &leases[..4] {
        assert_eq!(a[l], "a", "{l}");
    }
    // a is over its bound: the others go to b and c.
    assert_eq!(load(&a, "a"), 4);
    assert_eq!(load(&a, "b") + load(&a, "c"), 5);
    assert!(load(&a, "b").abs_diff(load(&a, "c")) <= 1);
    // a gone: the next live one in the list.
    let a2 = assign_placed(&placed, &members(&[("b", 1), ("c", 1)]));
    for l in &leases[..4] {
        assert_eq!(a2[l], "b", "{l}");
    }
    // None of them live: spread as any other lease.
    let a3 = assign_placed(&placed, &members(&[("c", 1), ("d", 1)]));
    assert_eq!(a3.len(), 9);
}

#[test]
fn an_avoided_host_gets_the_lease_only_when_every_live_host_is_avoided() {
    let leases = names("lease-", 12);
    let hosts = members(&[("a", 1), ("b", 1), ("c", 1)]);
    let mut placed = plain(&leases);
    for l in &leases {
        placed.insert(l.clone(), rules(&[], &["a"]));
    }
    let a = assign_placed(&placed, &hosts);
    assert_eq!(load(&a, "a"), 0, "{a:?}");
    assert_eq!((load(&a, "b"), load(&a, "c")), (6, 6));
    // Only avoided hosts live: they take it.
    let only = assign_placed(&placed, &members(&[("a", 1)]));
    assert!(only.values().all(|h| h == "a"));
    // Avoiding one lease moves it and leaves the bounds alone.
    let base = assign_placed(&plain(&leases), &hosts);
    let l = &leases[0];
    let mut one = plain(&leases);
    one.insert(l.clone(), rules(&[], &[base[l].as_str()]));
    let moved = assign_placed(&one, &hosts);
    assert_ne!(moved[l], base[l]);
    for h in ["a", "b", "c"] {
        assert_eq!(load(&moved, h), 4, "{h}: {moved:?}");
    }
}

#[test]
fn a_preference_wins_over_an_avoidance_of_another_host() {
    let mut placed = plain(&names("x-", 2));
    placed.insert("x-0".into(), rules(&["b"], &["a"]));
    placed.insert("x-1".into(), rules(&["b"], &["a"]));
    let a = assign_placed(&placed, &members(&[("a", 1), ("b", 1)]));
    assert_eq!(a["x-0"], "b");
    assert_eq!(a["x-1"], "b");
}
