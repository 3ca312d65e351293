//! Where the leader is: two hosts that advertise different addresses (one
//! with `--advertise-address`, one through `POD_IP`, as on Kubernetes)
//! spread two leases on the embedded store. Each host's `/leases` and
//! `baton status --json` must name each lease's holder and the holder's
//! address, and say which leases this host leads; after the SIGTERM
//! hand-over of one host, both name the other host and its address, and
//! the stopped host's released membership record carries no address.
//! Run on the embedded store by `tests/e2e/main.rs` and on Leases by
//! `tests/kube/address.rs`.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::status::status;
use crate::support::*;

const A: &str = "10.0.0.1:8080";
/// Host b's `POD_IP`, advertised as it is.
const B: &str = "10.0.0.2";

pub fn address(host: &str) -> &'static str {
    match host {
        "a" => A,
        "b" => B,
        other => panic!("no host {other}"),
    }
}

/// `h`'s `/leases`, checked against itself: its host, and for each lease
/// a holder's address that is the holder's, `leading` only for its own.
/// Returns lease -> holder.
fn leases(h: &Host) -> Vec<(String, Option<String>)> {
    let (code, body) = h.admin_get("/leases");
    assert_eq!(code, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["host"]["identity"], h.name.as_str(), "{doc:#}");
    assert_eq!(doc["host"]["address"], address(&h.name), "{doc:#}");
    let entries = doc["leases"].as_array().unwrap();
    entries
        .iter()
        .map(|l| {
            let holder = l["holder"].as_str().map(str::to_owned);
            let want = holder.as_deref().map(address);
            assert_eq!(l["holder_address"].as_str(), want, "{doc:#}");
            assert_eq!(
                l["leading"],
                holder.as_deref() == Some(h.name.as_str()),
                "{doc:#}"
            );
            assert_eq!(l["lead_until"].is_string(), l["leading"] == true, "{doc:#}");
            (l["lease"].as_str().unwrap().to_owned(), holder)
        })
        .collect()
}

/// Waits until every host's `/leases` gives every lease the holder `want`
/// says, for each lease.
fn wait_leases(hosts: &[&Host], want: impl Fn(&[(String, Option<String>)]) -> bool, within: Duration) {
    let start = Instant::now();
    loop {
        let seen: Vec<_> = hosts.iter().map(|h| leases(h)).collect();
        let agree = seen.windows(2).all(|w| w[0] == w[1]);
        if agree && want(&seen[0]) {
            return;
        }
        assert!(start.elapsed() < within, "/leases: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `baton status --json`: each lease's holder and address as `holders`
/// says, and each host's address (none for a released record).
fn check_status(cfg: &Path, holders: &[(String, Option<String>)]) -> Value {
    let json: Value =
        serde_json::from_str(&status(cfg, &[OsStr::new("--output"), OsStr::new("json")])).unwrap();
    for (lease, holder) in holders {
        let l = json["leases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == lease.as_str())
            .unwrap_or_else(|| panic!("{lease}: {json:#}"));
        assert_eq!(l["holder"].as_str(), holder.as_deref(), "{json:#}");
        assert_eq!(
            l["holder_address"].as_str(),
            holder.as_deref().map(address),
            "{json:#}"
        );
    }
    for h in json["hosts"].as_array().unwrap() {
        let id = h["identity"].as_str().unwrap();
        let want = (h["state"] == "held").then(|| address(id));
        assert_eq!(h["address"].as_str(), want, "{json:#}");
        assert_eq!(h["draining"], false, "{json:#}");
    }
    json
}

/// The configuration of the scenario: `head` (the `[store]` and
/// `[defaults]` tables) and two leases without plugins.
pub fn address_config(head: &str) -> String {
    format!("{head}\n[[lease]]\nname = \"job-0\"\n\n[[lease]]\nname = \"job-1\"\n")
}

/// The scenario (see the module documentation) on the configuration
/// `cfg` (written by [`address_config`]), each step bounded by `within`;
/// `spread` checks the store once the two hosts lead one lease each
/// (lease -> holder).
pub fn hosts_name_the_leader_and_its_address(
    cfg: &Path,
    within: Duration,
    spread: impl Fn(&[(String, Option<String>)]),
) {
    let admin = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    let args_a = [
        admin[0],
        admin[1],
        OsStr::new("--advertise-address"),
        OsStr::new(A),
    ];
    let a = Host::start_opts(
        "a",
        cfg,
        Opts {
            args: &args_a,
            ..Opts::default()
        },
    );
    let mut b = Host::start_opts(
        "b",
        cfg,
        Opts {
            args: &admin,
            env: &[("POD_IP", B)],
            ..Opts::default()
        },
    );
    // Spread: one lease each, as both hosts see it.
    let one_each = |l: &[(String, Option<String>)]| {
        let holders: Vec<_> = l.iter().map(|(_, h)| h.as_deref()).collect();
        holders.len() == 2 && holders.contains(&Some("a")) && holders.contains(&Some("b"))
    };
    let start = Instant::now();
    wait_leases(&[&a, &b], one_each, within);
    println!("spread, as /leases says, after {:?}", start.elapsed());
    let before = leases(&a);
    spread(&before);
    let json = check_status(cfg, &before);
    assert_eq!(json["live_hosts"], serde_json::json!(["a", "b"]), "{json:#}");
    let text = status(cfg, &[]);
    let header = text
        .lines()
        .find(|l| l.starts_with("LEASE "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(header.contains("HOLDER  ADDRESS"), "{text}");
    for (lease, holder) in &before {
        let holder = holder.as_deref().unwrap();
        let row = text
            .lines()
            .find(|r| r.starts_with(&format!("{lease} ")))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1..3], [holder, address(holder)], "{text}");
    }

    // b hands its lease over on SIGTERM: both name a and its address.
    let stopped = b.sigterm();
    assert!(b.wait_exit(within).success());
    let all_a = |l: &[(String, Option<String>)]| l.iter().all(|(_, h)| h.as_deref() == Some("a"));
    wait_leases(&[&a], all_a, within);
    println!(
        "a leads both, as its /leases says, {:.0} ms after b's SIGTERM",
        ms_between(stopped, std::time::SystemTime::now())
    );
    let after = leases(&a);
    assert_eq!(after.len(), 2);
    let json = check_status(cfg, &after);
    assert_eq!(json["live_hosts"], serde_json::json!(["a"]), "{json:#}");
    let b_record = json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["identity"] == "b");
    assert!(
        b_record.is_some_and(|h| h["state"] == "released" && h["address"].is_null()),
        "{json:#}"
    );
}
