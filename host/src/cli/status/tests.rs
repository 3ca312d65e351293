//! Tests of [`status`](super).

use super::*;
use crate::store::embedded::EmbeddedStore;
use std::time::Duration;

fn held(holder: Option<&str>, term: u64, renewed: SystemTime, secs: u64) -> Versioned {
    Versioned {
        record: LeaseRecord {
            plugins: None,
            yielded: None,
            host: None,
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(secs),
            acquire_time: Some(renewed),
            renew_time: Some(renewed),
            term,
            instance: None,
        },
        version: "1".into(),
    }
}

#[test]
fn a_report_spreads_over_the_live_hosts_only_and_tells_members_from_leases() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let ago = |s: u64| now - Duration::from_secs(s);
    let names: Vec<String> = (0..6).map(|i| format!("lease-{i}")).collect();
    let mut all: Vec<(String, Versioned)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), held(Some(["a", "b"][i % 2]), i as u64 + 1, ago(1), 4)))
        .collect();
    all.push(("lease-x".into(), held(None, 9, ago(20), 1)));
    all.push(("lease-y".into(), held(Some("c"), 2, ago(10), 4)));
    all.push(("baton-member.a".into(), held(Some("a"), 1, ago(1), 2)));
    all.push(("baton-member.b".into(), held(Some("b"), 1, ago(1), 2)));
    // Dead: expired 3 s ago.
    all.push(("baton-member.c".into(), held(Some("c"), 1, ago(5), 2)));
    // Live by its times, but the hosts do not count it.
    all.push(("baton-member.d".into(), held(Some("d"), 1, ago(1), 2)));
    let counted: BTreeSet<String> = ["a", "b", "c"]
        .iter()
        .map(|h| format!("baton-member.{h}"))
        .collect();
    let r = report(
        "embedded",
        "embedded store at /x".into(),
        &Spreading::Leases(names.iter().map(|n| (n.clone(), Placement::default())).collect()),
        all,
        &counted,
        now,
    );
    assert_eq!(r.live_hosts, ["a", "b"]);
    let want = crate::election::spread::assign(&names, &r.live_hosts);
    for l in &r.leases {
        assert_eq!(l.preferred_holder.as_ref(), want.get(&l.name), "{}", l.name);
    }
    assert_eq!(r.leases.len(), 8, "membership records are not leases");
    let x = r.leases.iter().find(|l| l.name == "lease-x").unwrap();
    assert_eq!(
        (x.state, x.holder.as_deref(), x.seconds_left),
        (State::Released, None, None)
    );
    let y = r.leases.iter().find(|l| l.name == "lease-y").unwrap();
    assert_eq!((y.state, y.seconds_left), (State::Expired, Some(-6.0)));
    let a = r.hosts.iter().find(|h| h.identity == "a").unwrap();
    assert!(a.live && a.counted);
    assert_eq!((a.leads, a.preferred), (3, Some(3)));
    let c = r.hosts.iter().find(|h| h.identity == "c").unwrap();
    assert!(!c.live);
    assert_eq!(
        (c.leads, c.state),
        (0, State::Expired),
        "an expired lease is not led"
    );
    let d = r.hosts.iter().find(|h| h.identity == "d").unwrap();
    assert!(!d.live && !d.counted);

    let text = r.text();
    let row = text.lines().find(|l| l.starts_with("lease-0 ")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cols[..4],
        ["lease-0", "a", "1", want["lease-0"].as_str()],
        "{text}"
    );
    assert!(row.ends_with("in 3s"), "{text}");
    assert!(text.contains("expired 6s ago"), "{text}");
    assert!(text.contains("2 live hosts (a, b)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("d ") && l.contains("not counted")),
        "{text}"
    );

    let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["store"]["kind"], "embedded");
    assert_eq!(json["live_hosts"], serde_json::json!(["a", "b"]));
    let l0 = &json["leases"][0];
    assert_eq!(l0["name"], "lease-0");
    assert_eq!(l0["renewed"], "2027-01-15T07:59:59.000Z");
    assert_eq!(l0["expires"], "2027-01-15T08:00:03.000Z");
    assert_eq!(l0["seconds_left"], 3.0);
    assert_eq!(l0["state"], "held");
    assert_eq!(l0["preferred_holder"], want["lease-0"].as_str());
    assert_eq!(json["leases"][6]["expires"], serde_json::Value::Null);
}

#[test]
fn without_spreading_or_live_hosts_there_is_no_preferred_holder() {
    let now = SystemTime::now();
    let all = vec![
        ("one".to_owned(), held(Some("a"), 1, now, 4)),
        ("two".to_owned(), held(Some("a"), 1, now, 4)),
    ];
    let none = BTreeSet::new();
    let r = report("embedded", "x".into(), &Spreading::Off, all.clone(), &none, now);
    assert!(!r.spreading && r.leases.iter().all(|l| l.preferred_holder.is_none()));
    assert!(!r.text().contains("PREFERRED"));
    // Spread by default (two leases), but no host is live.
    let r = report("embedded", "x".into(), &Spreading::Default, all, &none, now);
    assert!(r.spreading && r.leases.iter().all(|l| l.preferred_holder.is_none()));
    let one = vec![("one".to_owned(), held(Some("a"), 1, now, 4))];
    let r = report("embedded", "x".into(), &Spreading::Default, one, &none, now);
    assert!(!r.spreading, "one lease is not spread by default");
}
#[tokio::test]
async fn an_unreadable_lease_is_shown_as_such_beside_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    for name in ["alpha", "broken", "gamma"] {
        store
            .create(name, &held(Some("a"), 1, SystemTime::now(), 15).record)
            .await
            .unwrap();
    }
    // Its only version garbled: no torn renewal, unreadable.
    let version = dir.path().join("broken.lease").join("00000000000000000001.json");
    std::fs::write(&version, b"{not json").unwrap();
    let target = Target {
        store: Arc::new(store),
        kind: "embedded",
        spreading: Spreading::Off,
        origin: "--store-dir".into(),
        schedules: None,
    };
    let r = collect(&target).await.unwrap();
    let names: Vec<_> = r.leases.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["alpha", "gamma"]);
    assert_eq!(r.unreadable.len(), 1);
    assert_eq!(r.unreadable[0].name, "broken");
    assert!(
        r.unreadable[0].error.contains(&version.display().to_string()),
        "{:?}",
        r.unreadable
    );
    let text = r.text();
    assert!(text.contains("lease broken: unreadable"), "{text}");
    assert!(text.contains("alpha") && text.contains("gamma"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["unreadable"][0]["name"], "broken", "{json}");
}

#[test]
fn holders_addresses_and_hosts_drains_and_weights_are_shown_in_text_and_json() {
    use crate::store::HostInfo;
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let renewed = now - Duration::from_secs(1);
    let with = |mut v: Versioned, address: Option<&str>, draining: bool, weight: u32| {
        v.record.host = Some(HostInfo {
            address: address.map(str::to_owned),
            draining,
            weight,
            versions: [("probe".to_owned(), format!("sha256:{}", "a".repeat(64)))].into(),
        });
        v
    };
    let all = vec![
        (
            "alpha".to_owned(),
            with(held(Some("a"), 3, renewed, 4), Some("10.0.0.1:80"), false, 1),
        ),
        ("beta".to_owned(), held(Some("b"), 2, renewed, 4)),
        (
            "baton-member.a".to_owned(),
            with(held(Some("a"), 1, renewed, 2), Some("10.0.0.1:80"), true, 2),
        ),
        ("baton-member.b".to_owned(), held(Some("b"), 1, renewed, 2)),
    ];
    let counted: BTreeSet<String> = ["baton-member.a".into(), "baton-member.b".into()].into();
    let r = report("embedded", "store".into(), &Spreading::Off, all, &counted, now);
    let alpha = &r.leases[0];
    assert_eq!(alpha.holder_address.as_deref(), Some("10.0.0.1:80"));
    assert_eq!(r.leases[1].holder_address, None);
    let (a, b) = (&r.hosts[0], &r.hosts[1]);
    assert_eq!(
        (a.address.as_deref(), a.draining, a.weight),
        (Some("10.0.0.1:80"), true, 2)
    );
    assert_eq!((b.address.as_deref(), b.draining, b.weight), (None, false, 1));
    let text = r.text();
    assert!(text.contains("LEASE  HOLDER  ADDRESS      TERM"), "{text}");
    assert!(text.contains("alpha  a       10.0.0.1:80     3"), "{text}");
    assert!(text.contains("beta   b       -               2"), "{text}");
    assert!(text.contains("a (draining)"), "{text}");
    assert!(text.contains("WEIGHT"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(json["leases"][0]["holder_address"], "10.0.0.1:80");
    assert_eq!(json["leases"][1]["holder_address"], serde_json::Value::Null);
    assert_eq!(json["hosts"][0]["address"], "10.0.0.1:80");
    assert_eq!(
        (&json["hosts"][0]["draining"], &json["hosts"][0]["weight"]),
        (&true.into(), &2.into())
    );
    // Host a's versions, from both records it holds, once.
    let digest = format!("sha256:{}", "a".repeat(64));
    assert!(
        text.contains(&format!("PLUGIN  HOST  DIGEST\nprobe   a     {digest}")),
        "{text}"
    );
    assert_eq!(
        json["versions"],
        serde_json::json!([{"plugin": "probe", "host": "a", "digest": digest}])
    );
}

#[test]
fn the_preferred_holders_follow_placement_rules_and_the_hosts_weights() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let renewed = now - Duration::from_secs(1);
    let member = |h: &str, weight: u32| {
        let mut v = held(Some(h), 1, renewed, 10);
        v.record.host = Some(crate::store::HostInfo {
            address: None,
            draining: false,
            weight,
            versions: Default::default(),
        });
        (format!("baton-member.{h}"), v)
    };
    let mut all = vec![member("a", 2), member("b", 1)];
    all.extend((0..6).map(|i| (format!("lease-{i}"), held(Some("a"), 1, renewed, 10))));
    let counted: BTreeSet<String> = ["a", "b"].iter().map(|h| format!("baton-member.{h}")).collect();
    let mut placed: BTreeMap<String, Placement> = (0..6)
        .map(|i| (format!("lease-{i}"), Placement::default()))
        .collect();
    let r = report(
        "embedded",
        "x".into(),
        &Spreading::Leases(placed.clone()),
        all.clone(),
        &counted,
        now,
    );
    let shares = |r: &Report, h: &str| r.hosts.iter().find(|x| x.identity == h).unwrap().preferred;
    assert_eq!(
        (shares(&r, "a"), shares(&r, "b")),
        (Some(4), Some(2)),
        "by weight"
    );
    placed.get_mut("lease-0").unwrap().prefer = vec!["b".into()];
    placed.get_mut("lease-1").unwrap().avoid = vec!["b".into()];
    let r = report(
        "embedded",
        "x".into(),
        &Spreading::Leases(placed),
        all,
        &counted,
        now,
    );
    let preferred = |l: &str| {
        r.leases
            .iter()
            .find(|x| x.name == l)
            .and_then(|x| x.preferred_holder.clone())
    };
    assert_eq!(preferred("lease-0").as_deref(), Some("b"));
    assert_eq!(preferred("lease-1").as_deref(), Some("a"));
}
