//! Route labels (`route-label = true`): two real hosts, each "in" a Pod
//! object of its own (Pending: the test server has no kubelet), with
//! POD_NAME set to it. A task on the test's runtime lists the pods carrying
//! the label, 2 ms after each answer; the label must be on exactly the new leader's pod
//! within [`BOUND`] of its term's start (a bound only a stuck label breaks:
//! the latency is a printed figure), after SIGTERM hand-overs and after a
//! SIGKILL (whose stale label the new leader removes), and never on two
//! pods at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
use kube::api::{Api, ListParams};

use super::*;

const KEY: &str = "baton.dev/lead-demo";

/// From a term's start (its host's "lease status changed" to leading) to
/// the label on exactly that host's pod: generous, for a busy machine; the
/// figures are printed.
const BOUND: Duration = Duration::from_secs(5);

/// When the set of pods carrying [`KEY`] changed, and to what.
type Changes = Vec<(SystemTime, Vec<String>)>;

/// Every change of the set of pods carrying [`KEY`], as sampled.
#[derive(Clone, Default)]
struct Samples {
    changes: Arc<Mutex<Changes>>,
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Samples {
    /// Lists the pods carrying the label every 2 ms on `rt` until stopped.
    fn start(rt: &tokio::runtime::Runtime, pods: Api<Pod>) -> Samples {
        let s = Samples::default();
        let task = s.clone();
        rt.spawn(async move {
            while !task.stop.load(Ordering::SeqCst) {
                let listed = pods
                    .list(&ListParams::default().labels(KEY))
                    .await
                    .expect("list pods");
                let at = SystemTime::now();
                let mut names: Vec<String> =
                    listed.items.into_iter().filter_map(|p| p.metadata.name).collect();
                names.sort();
                task.count.fetch_add(1, Ordering::SeqCst);
                {
                    let mut changes = task.changes.lock().unwrap();
                    if changes.last().is_none_or(|(_, last)| *last != names) {
                        changes.push((at, names));
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        s
    }

    /// The first time at or after `after` the label was on exactly `want`,
    /// waiting up to `timeout`.
    fn wait(&self, want: &[&str], after: SystemTime, timeout: Duration) -> SystemTime {
        let deadline = Instant::now() + timeout;
        loop {
            let changes = self.changes.lock().unwrap().clone();
            // The state at `after` counts too (it may hold already).
            let from = changes.iter().rposition(|(at, _)| *at <= after).unwrap_or(0);
            if let Some((at, _)) = changes[from..].iter().find(|(_, names)| names == want) {
                return (*at).max(after);
            }
            assert!(
                Instant::now() < deadline,
                "the label was not on exactly {want:?} within {timeout:?} after {after:?}: {changes:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pods carrying the label at `at`.
    fn at(&self, at: SystemTime) -> Vec<String> {
        let changes = self.changes.lock().unwrap();
        changes
            .iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .map(|(_, n)| n.clone())
            .unwrap_or_default()
    }

    /// The longest time the label was on two pods or more.
    fn longest_on_two(&self) -> Duration {
        let changes = self.changes.lock().unwrap();
        let mut longest = Duration::ZERO;
        for pair in changes.windows(2) {
            if pair[0].1.len() >= 2 {
                longest = longest.max(pair[1].0.duration_since(pair[0].0).unwrap_or_default());
            }
        }
        if let Some((at, names)) = changes.last()
            && names.len() >= 2
        {
            longest = longest.max(at.elapsed().unwrap_or_default());
        }
        longest
    }
}

/// A host of identity `name` in pod `pod`.
fn host_in(name: &str, pod: &str, cfg: &Path) -> Host {
    Host::start_opts(
        name,
        cfg,
        Opts {
            env: &[("POD_NAME", pod)],
            ..Opts::default()
        },
    )
}

/// A host of identity `name` in pod `pod`, with its admin endpoints.
fn host_in_with_admin(name: &str, pod: &str, cfg: &Path) -> Host {
    Host::start_opts(
        name,
        cfg,
        Opts {
            env: &[("POD_NAME", pod)],
            args: &[OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")],
            ..Opts::default()
        },
    )
}

/// When `h` began leading (a term) at or after `after`.
fn began_leading(h: &Host, after: SystemTime) -> SystemTime {
    h.wait_for(SECS(10), "leading", |e| {
        e.at >= after && e.message() == "lease status changed" && e.str("role") == Some("leading")
    })
    .at
}

fn make_pods(t: &KubeTest, names: &[&str]) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(t.admin.clone(), &t.ns.name);
    let accounts: Api<ServiceAccount> = Api::namespaced(t.admin.clone(), &t.ns.name);
    // No controller manager makes the namespace's default account, which
    // the API server's admission wants for a pod.
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("default".into());
    t.rt.block_on(accounts.create(&PostParams::default(), &account))
        .unwrap();
    for name in names {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some((*name).into()),
                labels: Some([("app".to_owned(), "baton-test".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                automount_service_account_token: Some(false),
                containers: vec![Container {
                    name: "baton".into(),
                    image: Some("registry.invalid/baton:none".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        t.rt.block_on(pods.create(&PostParams::default(), &pod)).unwrap();
    }
    pods
}

#[test]
fn the_route_label_follows_the_leader_onto_one_pod_at_a_time() {
    let t = KubeTest::new("route");
    let pods = make_pods(&t, &["pod-a", "pod-b"]);
    let text = t.config("demo", &[probe("probe", "pollable", "cooperative")]);
    let text = text.replacen("name = \"demo\"\n", "name = \"demo\"\nroute-label = true\n", 1);
    let cfg = t.scratch.write("baton.toml", &text);
    let sampling = Instant::now();
    let samples = Samples::start(&t.rt, pods);
    let mut hosts = vec![host_in("host-a", "pod-a", &cfg), host_in("host-b", "pod-b", &cfg)];
    let pod_of = ["pod-a", "pod-b"];
    let first = settled(&hosts);
    let leader = hosts
        .iter()
        .position(|h| h.all(is_start).len() == 1)
        .expect("a leader");
    let began = began_leading(&hosts[leader], SystemTime::UNIX_EPOCH);
    let labelled = samples.wait(&[pod_of[leader]], began, SECS(10));
    let mut from_term = vec![ms_between(began, labelled)];
    assert!(first.at >= began);

    // SIGTERM hand-overs: the old leader takes its label off before it
    // releases; the new one puts it on its own pod.
    let (mut from_signal, mut gaps) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let old = running(&hosts);
        let old = hosts.iter().position(|h| h.name == old[0]).expect("a leader");
        let termed = hosts[old].sigterm();
        let (new, _) = wait_any(&hosts, SECS(15), "a standby's guest start", termed, is_start);
        assert_ne!(new, old);
        let began = began_leading(&hosts[new], termed);
        let labelled = samples.wait(&[pod_of[new]], termed, SECS(10));
        assert!(hosts[old].wait_exit(SECS(15)).success());
        let off = hosts[old].wait_for(SECS(1), "label removed", |e| {
            e.message() == "removed the route label from this pod"
        });
        let released = hosts[old].wait_for(SECS(1), "released", |e| e.message() == "released the lease");
        assert!(off.at <= released.at, "the label is removed before the release");
        from_term.push(ms_between(began, labelled));
        from_signal.push(ms_between(termed, labelled));
        gaps.push(ms_between(off.at, labelled));
        // The stopped host's pod gets a new host.
        let name = format!("host-{}-{round}", pod_of[old]);
        hosts[old] = host_in(&name, pod_of[old], &cfg);
        hosts[old].wait_for(SECS(30), "following", |e| {
            e.message() == "lease status changed" && e.str("role") == Some("following")
        });
    }

    // SIGKILL: the label stays on the dead host's pod until the next term,
    // whose host takes it off before it labels its own.
    let dead = running(&hosts);
    let dead = hosts.iter().position(|h| h.name == dead[0]).expect("a leader");
    let killed = hosts[dead].sigkill();
    let (new, _) = wait_any(&hosts, SECS(30), "a guest start after the kill", killed, is_start);
    let began = began_leading(&hosts[new], killed);
    assert_eq!(
        samples.at(began),
        vec![pod_of[dead].to_owned()],
        "the stale label"
    );
    let labelled = samples.wait(&[pod_of[new]], began, SECS(10));
    let after_kill = ms_between(began, labelled);
    let from_kill = ms_between(killed, labelled);
    let cleaner = hosts[new].wait_for(SECS(5), "stale label removed", |e| {
        e.message() == "removed the route label from other pods"
    });
    assert!(
        cleaner.json.to_string().contains(pod_of[dead]),
        "{}",
        cleaner.json
    );

    // Shutdown: the last leader takes its label off; none is left.
    hosts.remove(dead);
    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        assert!(h.wait_exit(SECS(10)).success());
    }
    std::thread::sleep(Duration::from_millis(50));
    samples.stop.store(true, Ordering::SeqCst);
    assert!(
        samples.at(SystemTime::now()).is_empty(),
        "no label after shutdown"
    );
    let two = samples.longest_on_two();
    let n = samples.count.load(Ordering::SeqCst);
    println!(
        "route label ({n} samples, one per {:.1} ms): term start -> label on exactly the leader's pod: {}; \
         SIGTERM -> label on the new leader's pod alone: {}; old label off -> new label on: {}; \
         after a SIGKILL, the new term's start -> stale label off and own on: {after_kill:.1} ms \
         ({from_kill:.0} ms from the kill); longest on two pods at once: {} ms",
        sampling.elapsed().as_secs_f64() * 1e3 / n as f64,
        summary(from_term.clone()),
        summary(from_signal),
        summary(gaps),
        two.as_millis()
    );
    for ms in from_term.iter().chain([&after_kill]) {
        assert!(
            *ms < BOUND.as_secs_f64() * 1e3,
            "label {ms:.0} ms after the term began"
        );
    }
    // Never on two pods at all: the old leader's label is off before its
    // release, and a new leader clears others before it labels its own
    // (each listing is one consistent snapshot).
    assert!(two.is_zero(), "the label was on two pods for {two:?}");
}

#[test]
fn a_route_label_the_role_refuses_is_logged_and_delays_no_hand_over() {
    let t = KubeTest::new("route-rbac");
    make_pods(&t, &["pod-a", "pod-b"]);
    // The deploy Role without its pods rule, for user baton-a.
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let mut role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let rules = role.rules.as_mut().unwrap();
    let before = rules.len();
    rules.retain(|r| !r.resources.iter().flatten().any(|x| x == "pods"));
    assert_eq!(rules.len(), before - 1, "role.yaml has a pods rule");
    t.rt.block_on(t.ns.bind(role, "baton-a"));
    let kc = t.env.kubeconfig("baton-a");
    let text = kube_config(
        &t.ns.name,
        Some(&kc),
        "demo",
        &[probe("probe", "pollable", "cooperative")],
    );
    let text = text.replacen("name = \"demo\"\n", "name = \"demo\"\nroute-label = true\n", 1);
    let cfg = t.scratch.write("baton.toml", &text);
    let mut hosts = vec![
        host_in_with_admin("host-a", "pod-a", &cfg),
        host_in_with_admin("host-b", "pod-b", &cfg),
    ];
    settled(&hosts);
    // Said at start, by both, naming the verb and the resource.
    for h in &hosts {
        let e = h.wait_for(SECS(15), "the refused listing", |e| {
            e.message()
                .starts_with("listing the pods carrying the route label failed")
        });
        let error = e.str("error").unwrap_or_default().to_owned();
        assert!(error.contains("forbidden") && error.contains("pods"), "{error}");
    }
    let old = hosts
        .iter()
        .position(|h| h.all(is_start).len() == 1)
        .expect("a leader");
    hosts[old].wait_for(SECS(15), "the refused label", |e| {
        e.message().starts_with("labelling this pod failed")
    });
    // Counted too (the host's /metrics, read while it still runs).
    let errors = metric_sum(
        &hosts[old].scrape(),
        "baton_route_label_errors_total",
        &["lease=\"demo\""],
    );
    assert!(errors >= 1.0, "the refused route label is counted: {errors}");
    let termed = hosts[old].sigterm();
    let (new, started) = wait_any(&hosts, SECS(15), "a standby's guest start", termed, is_start);
    assert_ne!(new, old);
    let took = ms_between(termed, started.at);
    // The refused removal held up nothing: the old leader released the
    // lease after it (not at a timeout: the API server said no at once),
    // its guest stopped before the release, and the standby took the lease
    // through the release, not by waiting for it to expire.
    let from_release = assert_handed_over_by_release(&hosts[old], &hosts[new], "demo", termed);
    assert!(hosts[old].wait_exit(SECS(15)).success());
    let refused = hosts[old].wait_for(SECS(1), "the refused removal", |e| {
        e.message()
            .starts_with("removing the route label from this pod failed")
    });
    let released = hosts[old].wait_for(SECS(1), "released", |e| e.message() == "released the lease");
    let delay = ms_between(refused.at, released.at);
    println!(
        "route label refused by RBAC: SIGTERM -> the standby's guest start {took:.0} ms; \
         the refused removal -> the release {delay:.1} ms; the release -> the standby's lead \
         {from_release:.0} ms"
    );
    let error = refused.str("error").unwrap_or_default();
    assert!(
        error.contains("forbidden") && error.contains("pods"),
        "the removal was refused (403), not timed out: {error}"
    );
    assert!(
        refused.at <= released.at,
        "the release came before the refused removal: {:?}, {:?}",
        refused.json,
        released.json
    );
    let pods: Api<Pod> = Api::namespaced(t.admin.clone(), &t.ns.name);
    let labelled =
        t.rt.block_on(pods.list(&ListParams::default().labels(KEY)))
            .unwrap();
    assert!(labelled.items.is_empty(), "no pod labelled");
    hosts[new].sigterm();
    assert!(hosts[new].wait_exit(SECS(15)).success());
}
