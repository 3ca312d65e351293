//! Plugins through the host: the `kubernetes` grant in and after a term,
//! `baton yield`, a plugin moved between leases.

use super::*;

#[test]
fn a_plugin_applies_an_object_through_the_host_in_its_term_and_never_after_a_newer_one() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, WatchEvent, WatchParams};
    let t = KubeTest::new("apply");
    // The host's client is user baton-a with the deploy Role (Leases, and
    // ConfigMaps get/create/update): the API server's RBAC applies on top
    // of the plugin's grant.
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    t.rt.block_on(t.ns.bind(role, "baton-a"));
    let kc = t.env.kubeconfig("baton-a");
    let mut text = kube_config(&t.ns.name, Some(&kc), "demo", &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"applier\"\npath = {:?}\nlease = \"demo\"\ninherit-env = [\"PROBE_HOST\", \"PROBE_TRAP_AT_END\"]\n\
         env = {{ HTTP_MODE = \"apply\", HTTP_TICK_MS = \"100\", K8S_NS = {:?}, K8S_NAME = \"applied\" }}\n\
         kubernetes = {{ kubeconfig = {:?}, allow = [{{ verbs = [\"get\", \"create\", \"update\"], groups = [\"\"], \
         resources = [\"configmaps\"], namespaces = [{:?}] }}] }}\n",
        guest("http_probe.wasm").display().to_string(),
        t.ns.name,
        kc.display().to_string(),
        t.ns.name
    ));
    let cfg = t.scratch.write("baton.toml", &text);

    // Every version of the object, as a watch sees it: its term and writer.
    let history: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>> = Default::default();
    let seen = history.clone();
    let maps: Api<ConfigMap> = Api::namespaced(t.admin.clone(), &t.ns.name);
    t.rt.spawn(async move {
        let params = WatchParams::default()
            .fields("metadata.name=applied")
            .timeout(290);
        let mut events = maps.watch(&params, "0").await.unwrap().boxed();
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    eprintln!("the test's watch of the object: {e}");
                    continue;
                }
            };
            if let WatchEvent::Added(cm) | WatchEvent::Modified(cm) = event {
                let data = cm.data.unwrap_or_default();
                let term = data.get("term").and_then(|t| t.parse().ok()).unwrap_or(0);
                seen.lock()
                    .unwrap()
                    .push((term, data.get("writer").cloned().unwrap_or_default()));
            }
        }
    });

    // Host a dumps the guest's memory when it traps: the guest traps on
    // purpose at the end of its term (`PROBE_TRAP_AT_END`).
    let dumps = t.scratch.dir.path().join("coredumps");
    let dumps_env = dumps.display().to_string();
    let start = |name: &str, extra: &[(&str, &str)]| {
        let mut env = vec![("PROBE_HOST", name)];
        env.extend_from_slice(extra);
        Host::start_opts(
            name,
            &cfg,
            Opts {
                env: &env,
                ..Opts::default()
            },
        )
    };
    let mut a = start(
        "apply-a",
        &[("BATON_COREDUMP_DIR", &dumps_env), ("PROBE_TRAP_AT_END", "1")],
    );
    let applied = a.wait_for(SECS(60), "a's first write", |e| {
        e.guest_line("applier", "http apply ok")
    });
    // Its term: 1, unless a busy machine made it miss term 1's renew
    // deadline before its guest wrote (then it led again, in term 2).
    let term_of = |message: &str| -> u64 {
        message
            .split_whitespace()
            .find_map(|w| w.strip_prefix("term="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no term in {message:?}"))
    };
    let ta = term_of(applied.message());
    assert!(
        a.all(|e| e.message() == "lease status changed" && e.str("role") == Some("leading"))
            .iter()
            .any(|e| e.u64("term") == Some(ta)),
        "{}: not a term a led",
        applied.message()
    );
    // Outside the grant: refused by the host, before the API server.
    let secrets = a.wait_for(SECS(10), "the secrets request", |e| {
        e.guest_line("applier", "http secrets")
    });
    assert_eq!(
        secrets.message(),
        format!("http secrets error ErrorCode::HttpRequestDenied term={ta}")
    );
    let refusal = a.wait_for(SECS(5), "the refusal in the log", |e| {
        e.message().starts_with("Kubernetes API request refused") && e.str("plugin") == Some("applier")
    });
    println!(
        "refused: {}: {}",
        refusal.message(),
        refusal.str("request").unwrap_or_default()
    );
    assert_eq!(
        refusal.str("request").map(str::to_owned),
        Some(format!("list secrets (core) in namespace {:?}", t.ns.name))
    );

    let b = start("apply-b", &[]);
    b.wait_for(SECS(60), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    // Each term writes a few times (every 100 ms): waited for, however
    // long a busy machine takes, not assumed of a second.
    let writes_of = |term: u64| history.lock().unwrap().iter().filter(|(t, _)| *t == term).count();
    let wait_writes = |term: u64| {
        let until = Instant::now() + SECS(30);
        while writes_of(term) < 3 {
            assert!(
                Instant::now() < until,
                "term {term} wrote the object {} times: {:?}",
                writes_of(term),
                history.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_writes(ta);
    a.sigterm();
    assert!(a.wait_exit(SECS(15)).success());
    let applied = b.wait_for(SECS(30), "b's first write", |e| {
        e.guest_line("applier", "http apply ok")
    });
    let tb = term_of(applied.message());
    assert!(tb > ta, "{}", applied.message());
    wait_writes(tb);

    // The object's history: every write carries its writer's term, terms
    // never go back, and nothing of a's terms after b's first write.
    let history = history.lock().unwrap().clone();
    let terms: Vec<u64> = history.iter().map(|(t, _)| *t).collect();
    println!("the object's versions, by term: {terms:?}");
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "a term went back: {history:?}"
    );
    for (term, writer) in &history {
        let expected = if *term <= ta { "apply-a" } else { "apply-b" };
        assert_eq!(writer, expected, "{history:?}");
    }
    let (ones, twos) = (
        terms.iter().filter(|t| **t == ta).count(),
        terms.iter().filter(|t| **t == tb).count(),
    );
    assert!(ones >= 3 && twos >= 3, "{terms:?}");
    // The guest never saw the host's credentials.
    let kubeconfig = std::fs::read_to_string(&kc).unwrap();
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("a token in baton-a's kubeconfig");
    for h in [&a, &b] {
        assert!(
            !h.output().contains(token),
            "{}: the token reached the log",
            h.name
        );
    }
    // Nor its memory: the dump of a's instance, taken as it trapped at the
    // end of its term, holds what the guest received (the object's name
    // and namespace, the API server's answers) and not the token.
    let written = a
        .events()
        .into_iter()
        .find(|e| e.message() == "core dump of the trapped instance written")
        .expect("a wrote the core dump of its trapped guest");
    let path = std::path::PathBuf::from(written.str("path").unwrap());
    let memory = std::fs::read(&path).unwrap();
    let holds = |needle: &str| memory.windows(needle.len()).any(|w| w == needle.as_bytes());
    println!(
        "the guest's core dump: {} bytes, {}",
        memory.len(),
        path.display()
    );
    for seen in ["resourceVersion", "\"name\":\"applied\"", t.ns.name.as_str()] {
        assert!(holds(seen), "the dump lacks {seen:?}: not the guest's memory?");
    }
    assert!(!holds(token), "the token is in the guest's memory");
}

#[test]
fn yield_hands_the_lease_over_through_the_api_server_and_the_yielder_stays_out_for_its_time() {
    let t = KubeTest::new("yield");
    let cfg = t.scratch.write(
        "baton.toml",
        &t.config("demo", &[probe("probe", "pollable", "cooperative")]),
    );
    yielding::two_hosts_yield(&cfg, &|name| Host::start(name, &cfg), "kubernetes store");
    // The yield's annotations went with the write that took the Lease over.
    let lease = t.lease("demo").expect("the Lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(baton::store::kube::YIELDED_BY),
        "{annotations:?}"
    );

    // The store: a release that says it was a yield reads back so, as
    // annotations beside any other; the next write drops them.
    t.rt.block_on(async {
        let store = t.store(&[]);
        let held = store.create("yielded", &record(Some("a"), 1)).await.unwrap();
        let released = LeaseRecord {
            lease_duration: Duration::from_secs(1),
            yielded: Some(Yielded {
                by: "a".into(),
                duration: Duration::from_millis(12_500),
            }),
            ..record(None, 1)
        };
        let r = store.update("yielded", &held.version, &released).await.unwrap();
        let read = store.get("yielded").await.unwrap().unwrap();
        assert_eq!(read.record.yielded, released.yielded);
        let object = t.ns.leases().get("yielded").await.unwrap();
        let a = object.metadata.annotations.unwrap_or_default();
        assert_eq!(a.get("baton.dev/yielded-by").map(String::as_str), Some("a"));
        assert_eq!(
            a.get("baton.dev/yielded-for").map(String::as_str),
            Some("12500ms")
        );
        store
            .update("yielded", &r.version, &record(Some("b"), 2))
            .await
            .unwrap();
        let read = store.get("yielded").await.unwrap().unwrap();
        assert_eq!(read.record.yielded, None);
        let a =
            t.ns.leases()
                .get("yielded")
                .await
                .unwrap()
                .metadata
                .annotations
                .unwrap_or_default();
        assert!(!a.keys().any(|k| k.starts_with("baton.dev/yielded")), "{a:?}");
    });
}

#[test]
fn a_plugin_moved_to_a_lease_another_host_leads_never_runs_on_both() {
    // As the end-to-end test of the same name, on Leases.
    let t = KubeTest::new("moving");
    let head = format!(
        "{}\n[defaults]\nlease-duration = \"5s\"\nrenew-deadline = \"2s\"\nretry-period = \"300ms\"\n\
         grace = \"2s\"\nrequest-timeout = \"500ms\"\n",
        store_table(&t.ns.name, Some(&t.env.admin_kubeconfig), false)
    );
    moving::a_moved_plugin_never_runs_on_both(&t.scratch, &head);
}

/// A request through the `kubernetes` grant in flight at the force-stop (a
/// watch the guest waits on, ignoring the change) goes with its connection:
/// the API server's side (a proxy the test runs in front of it) sees the
/// connection reset at the force-stop time, not closed in order later. The
/// instance's client is its own, so the reset touches nothing else.
#[test]
fn a_kubernetes_request_in_flight_is_dropped_with_its_connection_at_the_force_stop() {
    let t = KubeTest::new("grant-stop");
    let (hole, proxied) = crate::outages::proxied_kubeconfig(&t.env, &t.scratch);
    let mut text = t.config("demo", &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"watcher\"\npath = {:?}\nlease = \"demo\"\n\
         env = {{ HTTP_MODE = \"hang\", HTTP_URL = \"http://kubernetes.baton/api/v1/namespaces/{}/configmaps?watch=true\" }}\n\
         kubernetes = {{ kubeconfig = {:?}, allow = [{{ verbs = [\"watch\"], groups = [\"\"], \
         resources = [\"configmaps\"], namespaces = [{:?}] }}] }}\n",
        guest("http_probe.wasm").display().to_string(),
        t.ns.name,
        proxied.display().to_string(),
        t.ns.name
    ));
    let cfg = t.scratch.write("baton.toml", &text);
    let mut h = Host::start("grant-stop", &cfg);
    h.wait_for(SECS(60), "the guest's start", |e| {
        e.is("leader task started", Some("watcher"))
    });
    // The watch is under way (the API server answers its head at once).
    std::thread::sleep(SECS(2));
    assert!(
        hole.ends().is_empty(),
        "no connection ended yet: {:?}",
        hole.ends()
    );
    let termed = h.sigterm();
    let stopped = h.wait_for(SECS(10), "the forced stop", |e| e.is(STOPPED, Some("watcher")));
    assert!(h.wait_exit(SECS(10)).success());
    let force_stop = witness::force_stop_at(&stopped);
    let ends = hole.ends();
    println!(
        "a watch in flight: SIGTERM, the force-stop {:.0} ms later; the connection ended {:?}",
        ms_between(termed, force_stop),
        ends.iter()
            .map(|e| format!(
                "{:+.1} ms from the force-stop by {}",
                ms_between(force_stop, e.at),
                if e.reset { "a reset" } else { "a FIN" }
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(ends.len(), 1, "the grant's one connection: {ends:?}");
    assert!(ends[0].reset, "reset, not closed in order: {ends:?}");
    assert!(
        ms_between(force_stop, ends[0].at) < 50.0,
        "ended {:.1} ms after the force-stop",
        ms_between(force_stop, ends[0].at)
    );
    assert!(
        ms_between(termed, ends[0].at) >= GRACE.as_millis() as f64 - 50.0,
        "the grace was honoured"
    );
}
