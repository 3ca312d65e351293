//! Plugins' key-value buckets on the Kubernetes store, with real hosts and
//! the kv-counter guest (`tests/guests/kv-counter`): the count goes on
//! across a hand-over and across `kubectl delete leases --all`; `baton kv`
//! reads and writes the ConfigMaps, refuses to write under a running leader
//! unless forced, and a forced write fences it; a leader paused in the
//! middle of a write cannot land it once a newer term wrote. Every version
//! of the bucket's ConfigMap is watched, so a stale write that landed
//! would be seen even if it was overwritten at once.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use baton::store::buckets::BucketName;
use baton::store::kube::buckets::{BUCKET_ROLE, bucket_object_name};

use super::*;

/// A configuration on the test's namespace as `user` (the admin when
/// `None`), lease "demo" and one kv-counter plugin "counter" with `env`.
fn counter_config(t: &KubeTest, user: Option<&str>, file: &str, env: &str) -> std::path::PathBuf {
    let kc = user.map_or_else(|| t.env.admin_kubeconfig.clone(), |u| t.env.kubeconfig(u));
    let mut text = kube_config(&t.ns.name, Some(&kc), "demo", &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"counter\"\npath = {:?}\nlease = \"demo\"\nenv = {{ {env} }}\n",
        guest("kv_counter.wasm").display().to_string()
    ));
    t.scratch.write(file, &text)
}

/// `baton kv ARGS --config CFG`: (exit code, stdout, stderr).
fn kv(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let out = baton()
        .arg("kv")
        .args(args)
        .arg("--config")
        .arg(cfg)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "baton kv {}: exit {:?}: {}{}",
        args.join(" "),
        out.status.code(),
        stdout.trim(),
        stderr.trim()
    );
    (
        out.status.code().unwrap_or(-1),
        stdout.into_owned(),
        stderr.into_owned(),
    )
}

/// `baton kv get count`, which must succeed: (count, what follows it).
fn stored_count(cfg: &Path) -> (u64, String) {
    let (code, value, err) = kv(cfg, &["get", "count"]);
    assert_eq!(code, 0, "{err}");
    let (n, rest) = value.split_once(' ').unwrap_or_else(|| panic!("{value:?}"));
    (n.parse().unwrap(), rest.to_owned())
}

/// The `n=` of a guest line.
fn n_of(e: &Event) -> u64 {
    e.message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("n="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no n= in {:?}", e.message()))
}

fn kv_ok(e: &Event) -> bool {
    e.guest_line("counter", "kv ok")
}

/// Every value of key "count" of the bucket "demo/counter", in the order
/// of the ConfigMap's versions, as a watch of the test's own sees them (a
/// version that changed only the fence is left out).
fn watch_count(t: &KubeTest) -> Arc<Mutex<Vec<String>>> {
    let history: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = history.clone();
    let maps: Api<ConfigMap> = Api::namespaced(t.admin.clone(), &t.ns.name);
    let name = bucket_object_name(&BucketName::new("demo", "counter"));
    t.rt.spawn(async move {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut events = maps.watch(&params, "0").await.unwrap().boxed();
        while let Some(event) = events.next().await {
            let Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm)) = event else {
                continue;
            };
            let json = cm
                .data
                .unwrap_or_default()
                .remove("entries.json")
                .unwrap_or_default();
            let entries: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
            if let Some(v) = entries.pointer("/count/v").and_then(|v| v.as_str()) {
                let value = base64::engine::general_purpose::STANDARD.decode(v).unwrap();
                let value = String::from_utf8(value).unwrap();
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&value) {
                    seen.push(value);
                }
            }
        }
    });
    history
}

/// The term of a stored value `"<n> <term>"` (`None` for another writer's).
fn term_of(value: &str) -> Option<u64> {
    value.split_whitespace().nth(1).and_then(|t| t.parse().ok())
}

/// No value of a term below `newer` after the first value of `newer`.
fn assert_no_stale_after(history: &[String], newer: u64) {
    let first = history
        .iter()
        .position(|v| term_of(v) == Some(newer))
        .expect("a value of the newer term");
    let stale: Vec<&String> = history[first..]
        .iter()
        .filter(|v| term_of(v).is_some_and(|t| t < newer))
        .collect();
    assert!(
        stale.is_empty(),
        "values of older terms after term {newer}'s first: {stale:?} in {history:?}"
    );
}

#[test]
fn kv_counter_counts_on_across_a_hand_over_and_a_delete_of_every_lease() {
    let t = KubeTest::new("kv-handover");
    // The hosts and `baton kv` run as user baton-a with the deploy Role.
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    t.rt.block_on(t.ns.bind(role, "baton-a"));
    let cfg = counter_config(&t, Some("baton-a"), "baton.toml", "KV_INTERVAL_MS = \"50\"");
    let history = watch_count(&t);
    let mut a = Host::start("kv-a", &cfg);
    a.wait_for(SECS(60), "a's writes", |e| kv_ok(e) && n_of(e) >= 5);
    let mut b = Host::start("kv-b", &cfg);
    b.wait_for(SECS(60), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    a.sigterm();
    assert!(a.wait_exit(SECS(10)).success());
    let a_last = a.all(kv_ok).last().cloned().unwrap();
    assert!(
        a.all(|e| e.guest_line("counter", "kv error")).is_empty(),
        "{}",
        a.output()
    );
    let b_first = b.wait_for(SECS(30), "b's first write", kv_ok);
    println!("a's last: {}; b's first: {}", a_last.message(), b_first.message());
    assert_eq!(n_of(&b_first), n_of(&a_last) + 1, "the count goes on");
    assert!(b_first.guest_term() > a_last.guest_term(), "terms grow");
    b.wait_for(SECS(30), "more of b's writes", |e| {
        kv_ok(e) && n_of(e) >= n_of(&b_first) + 3
    });
    let (n, term) = stored_count(&cfg);
    assert!(
        n >= n_of(&b_first) + 3 && term == b_first.guest_term().unwrap().to_string(),
        "{n} {term}"
    );

    // The bucket is a ConfigMap labelled as one, which a delete of every
    // Lease leaves alone; the term floor keeps the next terms above its
    // fence, so a new leader's writes land.
    b.sigterm();
    assert!(b.wait_exit(SECS(10)).success());
    let b_last = b.all(kv_ok).last().cloned().unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(t.admin.clone(), &t.ns.name);
    let selector = format!("{ROLE_LABEL}={BUCKET_ROLE}");
    let listed =
        t.rt.block_on(maps.list(&ListParams::default().labels(&selector)))
            .unwrap();
    let names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    assert_eq!(names, ["baton-bucket.demo.counter"], "{selector}");
    let how = t.rt.block_on(t.env.delete_all_leases(&t.ns));
    assert!(t.lease("demo").is_none());
    let kept = t.rt.block_on(maps.get_opt("baton-bucket.demo.counter")).unwrap();
    assert!(kept.is_some(), "{how} deleted the bucket");
    let (n, term) = stored_count(&cfg);
    assert_eq!(
        (n, term),
        (n_of(&b_last), b_last.guest_term().unwrap().to_string())
    );
    let (code, listed, err) = kv(&cfg, &["list", "-o", "json"]);
    assert_eq!(code, 0, "kv list under the deploy Role: {err}");
    assert!(listed.contains("\"bucket\": \"counter\""), "{listed}");
    let c = Host::start("kv-c", &cfg);
    let c_first = c.wait_for(SECS(60), "c's first write", kv_ok);
    println!("after {how}: c's first {}", c_first.message());
    assert_eq!(n_of(&c_first), n_of(&b_last) + 1);
    assert!(c_first.guest_term() > b_last.guest_term());
    std::thread::sleep(Duration::from_millis(500));
    let history = history.lock().unwrap().clone();
    assert_no_stale_after(&history, b_first.guest_term().unwrap());
    assert_no_stale_after(&history, c_first.guest_term().unwrap());
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_BUCKET_WRITE_DELAY: a build with --features test-hooks"
)]
fn baton_kv_lists_reads_writes_and_a_forced_write_fences_the_running_leader() {
    let t = KubeTest::new("kv-cli");
    // Each write of the leader's guest waits 3 s in the host before it
    // reaches the store: a forced put lands while one is in flight.
    let cfg = counter_config(&t, None, "baton.toml", "KV_INTERVAL_MS = \"100\"");
    let (code, out, err) = kv(&cfg, &["put", "note", "before"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("written to bucket demo/counter in term 1"), "{out}");
    assert_eq!(kv(&cfg, &["get", "note"]).1, "before");
    let (code, _, err) = kv(&cfg, &["get", "missing"]);
    assert!(code != 0 && err.contains("no key \"missing\""), "{err}");
    let holder = spec_of(&t.lease("demo").unwrap()).holder_identity;
    assert!(
        holder.unwrap_or_default().is_empty(),
        "the operator released the lease"
    );
    let history = watch_count(&t);
    let mut h = Host::start_opts(
        "kv-h",
        &cfg,
        Opts {
            env: &[("BATON_TEST_BUCKET_WRITE_DELAY", "3s")],
            ..Opts::default()
        },
    );
    let first = h.wait_for(SECS(60), "a write", kv_ok);
    let term = first.guest_term().unwrap();
    assert!(term >= 2, "after the operator's term 1: {}", first.message());

    let (code, listed, err) = kv(&cfg, &["list", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["bucket"], "counter", "{listed}");
    assert_eq!(listed[0]["entries"], 2, "{listed}");
    assert!(listed[0]["fence"].as_u64() >= Some(term), "{listed}");
    let (_, keys, _) = kv(&cfg, &["list", "--plugin", "counter"]);
    assert_eq!(keys.lines().collect::<Vec<_>>(), ["count", "note"]);
    let (_, got, _) = kv(&cfg, &["get", "count", "-o", "json"]);
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert!(
        got["value"].as_str().unwrap().ends_with(&format!(" {term}")),
        "{got}"
    );
    assert!(got["version"].as_u64() > Some(0), "{got}");

    // Refused while h leads, and the message names it.
    let (code, _, err) = kv(&cfg, &["put", "count", "100 operator"]);
    assert!(code != 0, "{err}");
    assert!(
        err.contains("is held by \"kv-h\"") && err.contains(&format!("in term {term}")),
        "{err}"
    );
    let (code, _, err) = kv(&cfg, &["delete", "note"]);
    assert!(code != 0 && err.contains("is held by \"kv-h\""), "{err}");

    // Forced, right after the guest began a write: that write is refused.
    let since = SystemTime::now();
    let tried = h.wait_for(SECS(10), "a try", |e| {
        e.at >= since && e.guest_line("counter", "kv try")
    });
    let (code, out, err) = kv(&cfg, &["put", "count", "100 operator", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("in term {}", term + 1)) && out.contains("kv-h was displaced"),
        "{out}"
    );
    let refused = h.wait_for(SECS(10), "the stale write refused", |e| {
        (e.message() == "refused a stale write" && e.str("plugin") == Some("counter"))
            || e.guest_line("counter", "kv error")
    });
    println!(
        "the write tried {:.0} ms before the refusal: {}",
        ms_between(tried.at, refused.at),
        refused.json
    );
    assert_eq!(
        stored_count(&cfg),
        (100, "operator".to_owned()),
        "the operator's value stands"
    );

    // The next term (the operator's lease ran out) counts on from it.
    let next = h.wait_for(SECS(30), "a write of a later term", |e| {
        kv_ok(e) && e.guest_term() > Some(term)
    });
    assert_eq!(
        (n_of(&next), next.guest_term()),
        (101, Some(term + 2)),
        "{}",
        next.message()
    );
    let history = history.lock().unwrap().clone();
    let put = history
        .iter()
        .position(|v| v == "100 operator")
        .expect("the put's version");
    for v in &history[put..] {
        assert!(
            v == "100 operator" || term_of(v) >= Some(term + 2),
            "after the put: {v:?} in {history:?}"
        );
    }
    assert!(
        history[..put].iter().all(|v| term_of(v) == Some(term)),
        "{history:?}"
    );

    h.sigterm();
    assert!(h.wait_exit(SECS(10)).success());
    let (code, out, err) = kv(&cfg, &["delete", "note"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("written to bucket demo/counter"), "{out}");
    let (code, _, err) = kv(&cfg, &["get", "note"]);
    assert!(code != 0 && err.contains("no key \"note\""), "{err}");
    assert_eq!(kv(&cfg, &["list", "--plugin", "counter"]).1.trim(), "count");
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_BUCKET_WRITE_DELAY: a build with --features test-hooks"
)]
fn a_leader_paused_in_the_middle_of_a_write_cannot_land_it_after_a_newer_term_wrote() {
    let t = KubeTest::new("kv-paused");
    let cfg = counter_config(&t, None, "baton.toml", "KV_INTERVAL_MS = \"20\"");
    let history = watch_count(&t);
    // Each of a's writes waits 4 s in the host, past the lease, before it
    // reaches the store.
    let a = Host::start_opts(
        "kv-a",
        &cfg,
        Opts {
            env: &[("BATON_TEST_BUCKET_WRITE_DELAY", "4s")],
            ..Opts::default()
        },
    );
    a.wait_for(SECS(60), "a's first write", kv_ok);
    let mut b = Host::start("kv-b", &cfg);
    b.wait_for(SECS(60), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    let since = SystemTime::now();
    let tried = a.wait_for(SECS(10), "a's next try", |e| {
        e.at >= since && e.guest_line("counter", "kv try")
    });
    // The guest calls the write right after its line; under load it may
    // not have yet when the line is read. The write then waits out its
    // delay in the host, where the pause must catch it.
    std::thread::sleep(Duration::from_millis(300));
    let stopped_at = a.signal(libc::SIGSTOP);
    let a_term = tried.guest_term().unwrap();
    let a_ok = a.all(kv_ok).last().cloned().unwrap();
    let b_first = b.wait_for(SECS(30), "b's first write", kv_ok);
    let b_term = b_first.guest_term().unwrap();
    println!(
        "a paused {:.0} ms after `{}`; b's first write {:.0} ms after the pause: {}",
        ms_between(tried.at, stopped_at),
        tried.message(),
        ms_between(stopped_at, b_first.at),
        b_first.message()
    );
    assert!(b_term > a_term);
    assert_eq!(
        n_of(&b_first),
        n_of(&a_ok) + 1,
        "a's paused write was not in the store"
    );
    assert_eq!(n_of(&tried), n_of(&b_first), "both wrote the same count");
    a.signal(libc::SIGCONT);
    let refused = a.wait_for(SECS(10), "a's write refused", |e| {
        e.message() == "refused a stale write"
    });
    println!("a resumed: {}", refused.json);
    assert_eq!(refused.u64("term"), Some(a_term));
    let error = refused.str("error").unwrap_or_default();
    assert!(error.contains(&format!("term {b_term} has claimed")), "{error}");
    assert!(
        a.all(|e| kv_ok(e) && n_of(e) == n_of(&tried)).is_empty(),
        "a's guest saw its write land"
    );
    b.wait_for(SECS(10), "b's writes after a resumed", |e| {
        kv_ok(e) && e.at > refused.at
    });
    b.sigterm();
    assert!(b.wait_exit(SECS(10)).success());
    let b_last = b.all(kv_ok).last().cloned().unwrap();
    assert_eq!(stored_count(&cfg), (n_of(&b_last), b_term.to_string()));
    std::thread::sleep(Duration::from_millis(300));
    let history = history.lock().unwrap().clone();
    println!(
        "{} versions of the count, the first {:?}",
        history.len(),
        &history[..3.min(history.len())]
    );
    assert_no_stale_after(&history, b_term);
    let a_values = history.iter().filter(|v| term_of(v) == Some(a_term)).count();
    assert_eq!(
        a_values as u64,
        n_of(&a_ok),
        "exactly a's acknowledged writes are in the history"
    );
}
