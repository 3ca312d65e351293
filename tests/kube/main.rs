//! Kubernetes tests: real `baton` processes electing through Lease objects
//! on a real kube-apiserver (v1.20, started by `scripts/kube-testenv.sh`;
//! `scripts/test.sh` starts it before the tests and stops it after). They
//! fail, never skip, when the server is not running.
//!
//! Timings throughout: lease 4 s, renew deadline 2 s, retry period 500 ms,
//! grace 1 s, request timeout 500 ms (2 s + 1 s + 250 ms margin < 4 s).
//! Each test works in a namespace of its own.

mod blackhole;
mod chaos;
mod env;
mod reset;

#[path = "../e2e/moving.rs"]
mod moving;
#[allow(dead_code)]
#[path = "../e2e/spread.rs"]
mod spread;
#[allow(dead_code)]
#[path = "../e2e/status.rs"]
mod status;
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;
#[allow(dead_code)]
#[path = "../e2e/witness.rs"]
mod witness;
#[allow(dead_code)]
#[path = "../e2e/yielding.rs"]
mod yielding;

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use baton::store::TOMBSTONE;
use baton::store::kube::floor::RESERVED_TERMS;
use baton::store::kube::{KubeOptions, KubeStore, LEASE_ROLE, ROLE_LABEL};
use baton::store::{LeaseRecord, LeaseStore, LeaseWatch, StoreError, StoreTimings, Versioned, Yielded};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

use env::{KubeEnv, OwnServer, TestNamespace, compact_etcd, delta, lease_requests};
use support::*;

const STOPPED: &str = "leader task stopped";
const SECS: fn(u64) -> Duration = Duration::from_secs;
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_secs(1);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A configuration on the kubernetes store with one lease and the given
/// plugins; `kubeconfig` may be left to `--kubeconfig`.
fn kube_config(ns: &str, kubeconfig: Option<&Path>, lease: &str, plugins: &[PluginDef]) -> String {
    let mut text = format!("[store]\nkind = \"kubernetes\"\nnamespace = {ns:?}\n");
    if let Some(kc) = kubeconfig {
        text.push_str(&format!("kubeconfig = {:?}\n", kc.display().to_string()));
    }
    text.push_str(&format!(
        "labels = {{ app = \"baton-test\" }}\n\n[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\n\
         retry-period = \"500ms\"\ngrace = \"1s\"\nrequest-timeout = \"500ms\"\n\n[[lease]]\nname = {lease:?}\n"
    ));
    for p in plugins {
        text.push_str(&format!(
            "\n[[plugin]]\nname = {:?}\npath = {:?}\nlease = {lease:?}\nenv = {{ PROBE_MODE = {:?} }}\n",
            p.name,
            p.path.display().to_string(),
            p.mode
        ));
    }
    text
}

/// What `hosts` logged between `from` and `to` but their guests' lines,
/// in time order: the story of a slow hand-over.
fn story(hosts: &[Host], from: SystemTime, to: SystemTime) -> String {
    let mut lines: Vec<(SystemTime, String)> = Vec::new();
    for h in hosts {
        for e in h.all(|e| e.at >= from && e.at <= to && e.str("stream").is_none()) {
            lines.push((e.at, format!("  {}: {}", h.name, e.json)));
        }
    }
    lines.sort();
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

/// Waits until one of `hosts` runs its guest and every one has a role
/// other than pending; the first guest start.
fn settled(hosts: &[Host]) -> Event {
    let (_, first) = wait_any(
        hosts,
        SECS(60),
        "first guest start",
        SystemTime::UNIX_EPOCH,
        is_start,
    );
    for h in hosts {
        h.wait_for(SECS(60), "a status", |e| {
            e.message() == "lease status changed" && e.str("role") != Some("pending")
        });
    }
    first
}

fn is_start(e: &Event) -> bool {
    e.guest_line("probe", "probe start")
}

/// Which hosts run the probe now (started and not stopped); a killed host
/// runs nothing.
fn running(hosts: &[Host]) -> Vec<String> {
    hosts
        .iter()
        .filter(|h| h.all(is_start).len() > h.all(|e| e.is(STOPPED, Some("probe"))).len())
        .map(|h| h.name.clone())
        .collect()
}

/// Every guest run of every host: (start, end, term, host). A run without a
/// stop event ends at `ends[host]` (when it was killed) or `now`.
fn runs(hosts: &[Host], killed: &[(String, SystemTime)]) -> Vec<(SystemTime, SystemTime, u64, String)> {
    let mut all = Vec::new();
    for h in hosts {
        let starts = h.all(is_start);
        let stops = h.all(|e| e.is(STOPPED, Some("probe")));
        let end = killed
            .iter()
            .find(|(n, _)| n == &h.name)
            .map_or_else(SystemTime::now, |(_, at)| *at);
        for (i, s) in starts.iter().enumerate() {
            all.push((
                s.at,
                stops.get(i).map_or(end, |e| e.at),
                s.guest_term().expect("a term"),
                h.name.clone(),
            ));
        }
    }
    all.sort_by_key(|r| r.0);
    all
}

/// No two guest runs overlap, and terms grow with every run.
fn assert_one_at_a_time(
    hosts: &[Host],
    killed: &[(String, SystemTime)],
) -> Vec<(SystemTime, SystemTime, u64, String)> {
    let all = runs(hosts, killed);
    for pair in all.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.1 < b.0,
            "guest runs overlap: {} term {} until {:?}, {} term {} from {:?}",
            a.3,
            a.2,
            a.1,
            b.3,
            b.2,
            b.0
        );
        assert!(b.2 > a.2, "term {} of {} after term {} of {}", b.2, b.3, a.2, a.3);
    }
    all
}

/// The first event matching `pred` at or after `after` on any of `hosts`.
fn wait_any(
    hosts: &[Host],
    timeout: Duration,
    what: &str,
    after: SystemTime,
    pred: impl Fn(&Event) -> bool,
) -> (usize, Event) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut found: Option<(usize, Event)> = None;
        for (i, h) in hosts.iter().enumerate() {
            for e in h.all(|e| e.at >= after && pred(e)) {
                if found.as_ref().is_none_or(|(_, f)| e.at < f.at) {
                    found = Some((i, e));
                }
            }
        }
        if let Some(f) = found {
            return f;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = hosts
                .iter()
                .map(|h| format!("--- {}:\n{}", h.name, h.output()))
                .collect();
            panic!("no {what} within {timeout:?}; logs:\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn lease_of(rt: &tokio::runtime::Runtime, ns: &TestNamespace, name: &str) -> Option<Lease> {
    rt.block_on(ns.leases().get_opt(name)).unwrap()
}

fn spec_of(lease: &Lease) -> LeaseSpec {
    lease.spec.clone().unwrap_or_default()
}

fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    format!(
        "min {:.1} / median {:.1} / max {:.1} ms over {}",
        ms[0],
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    )
}

/// Three hosts (host-a, host-b, host-c) with one cooperative probe on lease
/// "demo" in `ns`, as the admin; returns the configuration and the hosts.
fn three_hosts(env: &KubeEnv, ns: &TestNamespace, s: &Scratch) -> (std::path::PathBuf, Vec<Host>) {
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let hosts = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|n| Host::start(n, &cfg))
        .collect();
    (cfg, hosts)
}

#[test]
fn three_hosts_one_guest_at_a_time_fast_handover_bounded_failover_few_requests() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "elect"));
    let s = Scratch::new();
    let (cfg, mut hosts) = three_hosts(&env, &ns, &s);
    let t0 = SystemTime::UNIX_EPOCH;
    wait_any(&hosts, SECS(60), "first guest start", t0, is_start);
    for h in &hosts {
        h.wait_for(SECS(60), "a status", |e| {
            e.message() == "lease status changed" && e.str("role") != Some("pending")
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        running(&hosts).len(),
        1,
        "exactly one guest runs: {:?}",
        running(&hosts)
    );

    // Idle: the leader renews once per retry period, followers only watch.
    let idle = SECS(6);
    let before = rt.block_on(lease_requests(&admin));
    std::thread::sleep(idle);
    let after = rt.block_on(lease_requests(&admin));
    let idle_requests = delta(&before, &after);
    println!(
        "requests to leases in {idle:?} idle, 1 leader + 2 followers (retry period {RP:?}): {idle_requests:?}"
    );
    let count = |verb: &str| idle_requests.get(verb).copied().unwrap_or(0);
    assert_eq!(count("GET") + count("LIST"), 0, "nobody polls: {idle_requests:?}");
    assert!(
        count("PUT") <= (idle.as_millis() / RP.as_millis()) as u64 + 1,
        "the leader writes at most once per retry period: {idle_requests:?}"
    );
    assert!(
        count("PUT") >= (idle.as_millis() / RP.as_millis()) as u64 - 2,
        "the leader renews: {idle_requests:?}"
    );
    assert_eq!(count("POST"), 0, "no creating: {idle_requests:?}");
    // Each of the three watches is resumed once per lease duration (x 1 to
    // 1.25), the budget that finds a silent connection.
    let rewatches = 3 * (idle.as_millis() / LD.as_millis() + 1) as u64;
    assert!(
        count("WATCH") <= rewatches,
        "each watch resumed at most once per lease duration ({rewatches} in all): {idle_requests:?}"
    );

    // SIGTERM the leader, three times: a standby's guest runs within 500 ms.
    let mut killed: Vec<(String, SystemTime)> = Vec::new();
    let mut handovers = Vec::new();
    for next_name in b'd'..=b'f' {
        let leader = hosts
            .iter()
            .position(|h| running(std::slice::from_ref(h)).len() == 1)
            .expect("a leader");
        let termed = hosts[leader].sigterm();
        let (idx, started) = wait_any(&hosts, SECS(5), "a standby's guest start", termed, is_start);
        assert_ne!(idx, leader);
        let took = ms_between(termed, started.at);
        handovers.push(took);
        assert!(
            took < 500.0,
            "SIGTERM handover took {took:.0} ms; what the hosts logged:\n{}",
            story(&hosts, termed - SECS(1), started.at + SECS(1))
        );
        assert!(hosts[leader].wait_exit(SECS(5)).success());
        assert_eq!(
            hosts[leader].all(|e| e.message() == "released the lease").len(),
            1,
            "{} released the lease",
            hosts[leader].name
        );
        // A new standby takes the stopped host's place.
        let name = format!("host-{}", next_name as char);
        let h = Host::start(&name, &cfg);
        h.wait_for(SECS(60), "following", |e| {
            e.message() == "lease status changed" && e.str("role") == Some("following")
        });
        hosts.push(h);
        std::thread::sleep(Duration::from_millis(300));
    }
    println!(
        "SIGTERM handover (signal to the standby's guest start): {}",
        summary(handovers)
    );

    // SIGKILL the leader: another runs within LD + RP.
    let leader = hosts
        .iter()
        .position(|h| running(std::slice::from_ref(h)).len() == 1)
        .expect("a leader");
    println!("SIGKILL {}", hosts[leader].name);
    let killed_at = hosts[leader].sigkill();
    killed.push((hosts[leader].name.clone(), killed_at));
    let (_, started) = wait_any(
        &hosts,
        LD + RP + SECS(2),
        "a guest start after SIGKILL",
        killed_at,
        is_start,
    );
    let took = ms_between(killed_at, started.at);
    println!(
        "SIGKILL failover: {took:.0} ms (bound LD + RP = {} ms)",
        (LD + RP).as_millis()
    );
    assert!(took <= (LD + RP).as_millis() as f64, "failover took {took:.0} ms");
    std::thread::sleep(Duration::from_millis(500));

    // One at a time throughout, terms growing, and the last term is the
    // Lease's leaseTransitions; each leading host reported the guest's term.
    let all = assert_one_at_a_time(&hosts, &killed);
    let alive: Vec<String> = running(&hosts)
        .into_iter()
        .filter(|n| !killed.iter().any(|(k, _)| k == n))
        .collect();
    assert_eq!(alive.len(), 1, "one guest runs: {alive:?}");
    let last_term = all.last().unwrap().2;
    let spec = spec_of(&lease_of(&rt, &ns, "demo").expect("the Lease"));
    assert_eq!(
        spec.lease_transitions,
        Some(last_term as i32),
        "the term is the Lease's transitions"
    );
    assert_eq!(spec.lease_duration_seconds, Some(4));
    for h in &hosts {
        for led in h.all(|e| e.message() == "lease status changed" && e.str("role") == Some("leading")) {
            let term = led.u64("term").unwrap();
            assert!(
                all.iter().any(|r| r.3 == h.name && r.2 == term),
                "{} led term {term} and its guest ran in it",
                h.name
            );
        }
    }
    println!(
        "terms: {:?}",
        all.iter().map(|r| format!("{}:{}", r.3, r.2)).collect::<Vec<_>>()
    );
}

/// Sends SIGCONT to the API server when dropped, so a failing test never
/// leaves it stopped.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the test API server's pid.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn guests_of_both_worlds_count_the_live_hosts_from_membership_leases() {
    // As the end-to-end test of the same name: the membership records are
    // Leases, listed every retry period.
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "hosts"));
    let s = Scratch::new();
    let head = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nkubeconfig = {:?}\n\n[defaults]\n\
         lease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n\
         request-timeout = \"500ms\"\n",
        ns.name,
        env.admin_kubeconfig.display().to_string()
    );
    let cfg = s.write("baton.toml", &spread::hosts_config(&head));
    // The membership Lease lasts half the lease duration (2 s), listed
    // every retry period.
    spread::guests_count_the_live_hosts(&cfg, SECS(2) + 2 * RP + SECS(1));
}

#[test]
fn the_membership_lease_of_a_host_gone_for_long_is_deleted_and_comes_back_with_it() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "forget"));
    let s = Scratch::new();
    let head = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nkubeconfig = {:?}\n\n[defaults]\n\
         lease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n\
         request-timeout = \"500ms\"\n\n[spread]\nforget-after = \"2s\"\n",
        ns.name,
        env.admin_kubeconfig.display().to_string()
    );
    let cfg = s.write("baton.toml", &spread::hosts_config(&head));
    spread::a_gone_host_is_forgotten_then_counted_again(&cfg, &[], SECS(2), SECS(2));
}

#[test]
fn three_hosts_spread_thirty_leases_and_take_over_a_dead_hosts_share() {
    // As the end-to-end test of the same name, on Leases: the membership
    // records are Leases too, found by listing the namespace.
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "spread"));
    let s = Scratch::new();
    let data = witness::records_dir(&s);
    let head = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nkubeconfig = {:?}\n\n[defaults]\n\
         lease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n\
         request-timeout = \"500ms\"\n",
        ns.name,
        env.admin_kubeconfig.display().to_string()
    );
    let cfg = s.write("baton.toml", &spread::spread_config(&head, &data));
    // LD + RP, and a few seconds for the moves that follow.
    spread::three_hosts_share_thirty_leases(&cfg, &data, &[], LD + RP + SECS(6));
    let leases = rt.block_on(async {
        kube::Api::<Lease>::namespaced(admin.clone(), &ns.name)
            .list(&Default::default())
            .await
            .unwrap()
    });
    let members = leases
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("baton-member."))
        })
        .count();
    assert_eq!(members, 3, "one membership Lease per host identity");
}

#[test]
fn status_shows_two_hosts_spreading_leases_as_json_and_text() {
    // As the end-to-end test of the same name, on Leases, the kubeconfig
    // given to `baton run` and `baton status` alike by --kubeconfig (the
    // file names none). A membership Lease without baton's labels, as a
    // baton from before them wrote, is shown but not counted, as the hosts
    // do not count it.
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "status"));
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("baton-member.ghost".into()),
            labels: Some([("app".to_owned(), "baton-test".to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(held_by("ghost", 1, 60)),
    };
    rt.block_on(ns.leases().create(&PostParams::default(), &ghost))
        .unwrap();
    let s = Scratch::new();
    let head = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nlabels = {{ app = \"baton-test\" }}\n\n[defaults]\n\
         lease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n\
         request-timeout = \"500ms\"\n",
        ns.name
    );
    let cfg = s.write("baton.toml", &status::status_config(&head));
    let args = [OsStr::new("--kubeconfig"), env.admin_kubeconfig.as_os_str()];
    status::two_hosts_as_status_shows_them(&cfg, &args, &args, LD, "kubernetes");
    let json_args = [args[0], args[1], OsStr::new("-o"), OsStr::new("json")];
    let json: serde_json::Value = serde_json::from_str(&status::status(&cfg, &json_args)).unwrap();
    assert!(
        json["store"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(&ns.name)),
        "{json:#}"
    );
    let ghost = json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["identity"] == "ghost")
        .unwrap_or_else(|| panic!("{json:#}"));
    assert_eq!(
        (&ghost["counted"], &ghost["live"]),
        (&false.into(), &false.into()),
        "{json:#}"
    );
    // Both hosts have stopped and released their records.
    assert_eq!(json["live_hosts"], serde_json::json!([]), "{json:#}");
    let text = status::status(&cfg, &args);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ghost ") && l.contains("not counted")),
        "{text}"
    );
}

#[test]
fn a_hundred_leases_on_two_hosts_cost_one_write_per_lease_per_retry_period_and_read_only_after_a_failed_write()
 {
    // The API server's own counts (/metrics) over an idle window: each
    // lease's leader renews once per retry period and reads nothing; the
    // hosts find the live hosts (their membership Leases, every retry
    // period) in their watch's memory, with no request; each host keeps one
    // watch of the namespace's Leases, resumed once per lease duration. A
    // lease is read only after a write of its elector failed: a renewal
    // slower than the request timeout (500 ms: a busy 2-core machine has
    // them) is retried, conflicts and is answered by a read. Each read must
    // follow such a failure, which the hosts count (/metrics).
    const LEASES: u64 = 100;
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "hundred"));
    let s = Scratch::new();
    let mut text = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nkubeconfig = {:?}\n\n[defaults]\n\
         lease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n\
         request-timeout = \"500ms\"\n",
        ns.name,
        env.admin_kubeconfig.display().to_string()
    );
    for i in 0..LEASES {
        text.push_str(&format!("\n[[lease]]\nname = \"lease-{i:03}\"\n"));
    }
    let cfg = s.write("baton.toml", &text);
    let admin_args = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    let hosts = ["a", "b"].map(|n| Host::start_with_args(n, &cfg, &shared_cache_dir(), &admin_args));
    let led = |h: &Host| support::led(h).len() as u64;
    // Failed requests of the electors that are answered by a read.
    let failures = |hosts: &[Host]| -> f64 {
        hosts
            .iter()
            .map(|h| {
                let text = h.scrape();
                ["conflict", "timeout"]
                    .iter()
                    .map(|kind| {
                        support::metric_sum(
                            &text,
                            "baton_lease_store_errors_total",
                            &[&format!("kind=\"{kind}\"")],
                        )
                    })
                    .sum::<f64>()
            })
            .sum()
    };
    let until = Instant::now() + SECS(60);
    while led(&hosts[0]) + led(&hosts[1]) != LEASES || led(&hosts[0]).abs_diff(LEASES / 2) > 1 {
        assert!(
            Instant::now() < until,
            "not spread: {} and {}",
            led(&hosts[0]),
            led(&hosts[1])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let the hand-overs' watches and floors settle.
    std::thread::sleep(SECS(2));
    let idle = SECS(6);
    let failed_before = failures(&hosts);
    let before = rt.block_on(lease_requests(&admin));
    std::thread::sleep(idle);
    let requests = delta(&before, &rt.block_on(lease_requests(&admin)));
    // A read in the window answers a failure counted by the time it ends.
    std::thread::sleep(SECS(1));
    let failed = (failures(&hosts) - failed_before) as u64;
    let count = |verb: &str| requests.get(verb).copied().unwrap_or(0);
    let periods = (idle.as_millis() / RP.as_millis()) as u64;
    let records = LEASES + 2;
    println!(
        "requests to leases in {idle:?} idle, {LEASES} leases and 2 membership Leases on 2 hosts \
         (retry period {RP:?}): {requests:?}; writes per record per retry period: {:.2}; \
         failed writes (conflicts, timeouts) the hosts counted: {failed}",
        count("PUT") as f64 / (records * periods) as f64
    );
    assert!(
        count("GET") <= failed,
        "a lease is read only after a failed write: {requests:?}, {failed} failures"
    );
    assert_eq!(count("POST"), 0, "no creating: {requests:?}");
    assert!(
        count("PUT") <= records * (periods + 1) + failed,
        "at most one write per record per retry period, and a retry per failure: {requests:?}"
    );
    assert!(
        count("PUT") >= records * (periods - 2),
        "every record is renewed: {requests:?}"
    );
    // Listing the membership Leases from the API server cost one LIST per
    // host per retry period here (24 in 6 s); the namespace's watch serves
    // it now, and an idle host in sync lists nothing.
    println!(
        "list requests in {idle:?}: {} (2 hosts finding the live hosts every retry period: {} listings)",
        count("LIST"),
        2 * periods
    );
    assert_eq!(
        count("LIST"),
        0,
        "the membership listing is served from the watch: {requests:?}"
    );
    // One watch per host for the whole namespace, resumed once per lease
    // duration (x 1 to 1.25): at most two ends of it in 6 s, and one more
    // per host as slack for a shared watch broken and started again (still
    // one per namespace). One watch per lease cost 209 to 275 here: each of
    // 204 watches resumed.
    let rewatches = 2 * (idle.as_millis() / LD.as_millis() + 2) as u64;
    println!(
        "watch requests in {idle:?}: {} for {} records on 2 hosts (at most {rewatches}: one watch per host and namespace)",
        count("WATCH"),
        records
    );
    assert!(
        count("WATCH") <= rewatches,
        "one watch per host, resumed at most once per lease duration ({rewatches} in all): {requests:?}"
    );
    for mut h in hosts {
        h.sigterm();
        assert!(h.wait_exit(SECS(30)).success());
    }
}

#[test]
fn a_leader_paused_past_its_lease_never_appends_after_its_terms_force_stop() {
    // As the end-to-end test of the same name, on Leases: three hosts whose
    // guests append term-tagged records back to back to one file, the
    // leader stopped with SIGSTOP past its lease, again and again, with the
    // CPUs busy.
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "pauses"));
    let s = Scratch::new();
    let data = witness::records_dir(&s);
    let mut text = kube_config(&ns.name, Some(&env.admin_kubeconfig), "demo", &[]);
    text.push_str(&witness::appender_plugins("demo", &data));
    let cfg = s.write("appenders.toml", &text);
    let mut hosts = witness::start_hosts(&cfg, &["h1", "h2", "h3"], &[]);
    const PAUSES: usize = 6;
    {
        let _load = witness::CpuLoad::start(2);
        witness::pause_leaders(&hosts, PAUSES, LD + Duration::from_millis(500));
        std::thread::sleep(SECS(1));
    }
    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        assert!(h.wait_exit(SECS(15)).success(), "{}", h.name);
    }
    let seen = witness::check_records(&data.join("records"), &hosts);
    println!(
        "{PAUSES} pauses of the leader past its lease on Kubernetes, CPUs busy: {} records in {} terms, all \
         stamped before their term's force-stop, none out of order",
        seen.records,
        seen.terms.len()
    );
    assert!(
        seen.terms.len() >= PAUSES,
        "only {} terms wrote: {:?}",
        seen.terms.len(),
        seen.terms
    );
}

#[test]
fn two_hosts_under_one_identity_never_both_lead_and_the_second_says_why() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "same-identity"));
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let a = Host::start("same", &cfg);
    let first = a.wait_for(SECS(60), "a's guest start", is_start);
    let lease = lease_of(&rt, &ns, "demo").expect("the Lease");
    let instance = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("baton.dev/holder-instance"))
        .cloned();
    assert!(instance.is_some(), "no holder instance on the Lease: {lease:?}");
    let mut b = Host::start("same", &cfg);
    let status = b.wait_exit(SECS(30));
    assert_eq!(status.code(), Some(1), "b: {status}; its log:\n{}", b.output());
    let output = b.output();
    assert!(
        output.contains("identities must be unique per process"),
        "b did not say why; its log:\n{output}"
    );
    assert!(b.all(is_start).is_empty(), "b ran a guest");
    std::thread::sleep(LD);
    let starts = a.all(is_start);
    assert_eq!(starts.len(), 1, "a's guest restarted: {starts:?}");
    let spec = spec_of(&lease_of(&rt, &ns, "demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some("same"));
    assert_eq!(spec.lease_transitions.map(|t| t as u64), first.guest_term());
}

/// A proxy to the API server that the test can cut, and a kubeconfig
/// (written into `s`) that reaches the server through it.
fn proxied_kubeconfig(env: &KubeEnv, s: &Scratch) -> (blackhole::BlackHole, std::path::PathBuf) {
    let (admin_config, server) = env.admin_server();
    let upstream: std::net::SocketAddr = server.trim_start_matches("https://").parse().unwrap();
    let hole = blackhole::BlackHole::start(upstream);
    let proxied = s.write(
        "proxied.kubeconfig",
        &admin_config.replace(&server, &format!("https://127.0.0.1:{}", hole.port)),
    );
    (hole, proxied)
}

#[test]
fn a_leader_whose_connection_goes_silent_stops_by_its_deadline_and_another_takes_over_in_time() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "leader-hole"));
    let s = Scratch::new();
    // a, the leader, reaches the API server through a proxy the test cuts.
    let (hole, proxied) = proxied_kubeconfig(&env, &s);
    let plugins = [
        probe("probe", "pollable", "cooperative"),
        probe("stubborn", "future", "block"),
    ];
    let through = s.write("a.toml", &kube_config(&ns.name, Some(&proxied), "demo", &plugins));
    let direct = s.write(
        "b.toml",
        &kube_config(&ns.name, Some(&env.admin_kubeconfig), "demo", &plugins),
    );
    let a = Host::start("host-a", &through);
    a.wait_for(SECS(60), "a leads", is_start);
    let b = Host::start("host-b", &direct);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(2));

    // Cut a's path without closing it: its renewals hang.
    hole.cut(true);
    let cut_at = SystemTime::now();
    let down = a.wait_for(SECS(10), "a steps down", |e| {
        e.at >= cut_at && e.message() == "stepping down"
    });
    let down_ms = ms_between(cut_at, down.at);
    // Each hung renewal was given up after the request timeout (500 ms),
    // or at the renew deadline if that came first.
    let timeouts =
        a.all(|e| e.at >= cut_at && e.at <= down.at && e.message().starts_with("renewal timed out"));
    let mut gaps: Vec<f64> = Vec::new();
    let mut last = cut_at;
    for e in &timeouts {
        gaps.push(ms_between(last, e.at));
        last = e.at;
    }
    println!(
        "a leader cut off: {} renewals timed out, {:?} ms apart; stepped down {down_ms:.0} ms after the cut",
        timeouts.len(),
        gaps.iter().map(|g| g.round() as i64).collect::<Vec<_>>()
    );
    // (The last attempt may instead end at the renew deadline, when the
    // time left in the term is shorter than the request timeout.)
    assert!(!timeouts.is_empty(), "no renewal timed out: {timeouts:?}");
    let limit = (RP + Duration::from_millis(500)).as_secs_f64() * 1e3 + 300.0;
    assert!(
        gaps.iter().all(|&g| g <= limit),
        "a hung renewal outlasted the request timeout: gaps {gaps:?} ms (limit {limit:.0})"
    );
    assert!(
        down_ms <= RD.as_secs_f64() * 1e3 + 300.0,
        "stepped down {down_ms:.0} ms after the cut (renew deadline {RD:?})"
    );
    let mut force_stop = cut_at;
    for p in ["probe", "stubborn"] {
        let e = a.wait_for(SECS(10), "a's guest stopped", |e| {
            e.at >= cut_at && e.is(STOPPED, Some(p))
        });
        force_stop = force_stop.max(witness::force_stop_at(&e));
        assert!(
            ms_between(e.at, witness::force_stop_at(&e)) >= -20.0,
            "{p} stopped {:.0} ms after its force-stop time",
            ms_between(witness::force_stop_at(&e), e.at)
        );
    }
    // b takes over within LD + RP of the cut (plus its watch's news and
    // its guests' start), never before a's force-stop time.
    let taken = b.wait_for(SECS(15), "b takes over", is_start);
    let took = ms_between(cut_at, taken.at);
    let bound = (LD + RP).as_secs_f64() * 1e3 + 1000.0;
    println!(
        "b took over {took:.0} ms after the cut (bound {bound:.0} ms), {:.0} ms after a's last force-stop time",
        ms_between(force_stop, taken.at)
    );
    assert!(
        took <= bound,
        "b took over {took:.0} ms after the cut (bound {bound:.0} ms)"
    );
    assert!(taken.at >= force_stop, "b started before a's force-stop time");
    hole.cut(false);
}

#[test]
fn a_follower_whose_connection_goes_silent_notices_within_a_lease_duration() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "black-hole"));
    let s = Scratch::new();
    // b reaches the API server through a proxy the test can cut.
    let (hole, proxied) = proxied_kubeconfig(&env, &s);
    let plugins = [probe("probe", "pollable", "cooperative")];
    let direct = s.write(
        "a.toml",
        &kube_config(&ns.name, Some(&env.admin_kubeconfig), "demo", &plugins),
    );
    let through = s.write("b.toml", &kube_config(&ns.name, Some(&proxied), "demo", &plugins));
    let a = Host::start("host-a", &direct);
    a.wait_for(SECS(60), "a leads", is_start);
    let b = Host::start("host-b", &through);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(1));

    // Cut b's path without closing it: its watch goes silent.
    hole.cut(true);
    let cut_at = SystemTime::now();
    let noticed = b.wait_for(SECS(20), "b notices its silent watch", |e| {
        e.at >= cut_at && e.message().starts_with("the lease watch broke")
    });
    let took = ms_between(cut_at, noticed.at);
    // The watch asks the server to end it after one lease duration (x 1 to
    // 1.25); silence past that plus request-timeout and a second ends it.
    let bound = (LD.as_secs_f64() * 1.25 + 0.5 + 1.0) * 1e3 + 500.0;
    println!("a follower's watch went silent: it noticed {took:.0} ms later (bound {bound:.0} ms)");
    assert!(
        took <= bound,
        "noticed {took:.0} ms after the cut (bound {bound:.0} ms)"
    );
    assert!(b.all(is_start).is_empty(), "b ran a guest while cut off");

    // Restored: b follows again, and takes over promptly when a leaves.
    hole.cut(false);
    let restored = SystemTime::now();
    b.wait_for(SECS(20), "b watches again", |e| {
        e.at >= restored && e.message() == "watching the lease again"
    });
    let termed = a.sigterm();
    let taken = b.wait_for(SECS(10), "b takes over", is_start);
    println!(
        "after the path was restored: b took over {:.0} ms after a's SIGTERM",
        ms_between(termed, taken.at)
    );
}

#[test]
fn api_server_outage_stops_the_leader_in_time_and_one_leader_resumes() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "outage"));
    let s = Scratch::new();
    // A guest that ignores the change: it must be stopped by force.
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "block")],
        ),
    );
    // With their admin endpoints: liveness must hold through the outage.
    let admin_args = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    let hosts: Vec<Host> = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|n| Host::start_with_args(n, &cfg, &shared_cache_dir(), &admin_args))
        .collect();
    settled(&hosts);
    let addresses: Vec<String> = hosts.iter().map(Host::admin_address).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let leader = hosts
        .iter()
        .position(|h| running(std::slice::from_ref(h)).len() == 1)
        .expect("a leader");

    // Stop the API server for longer than the renew deadline (and the lease).
    let outage = LD + SECS(1);
    let before = rt.block_on(lease_requests(&admin));
    let stopped_at = SystemTime::now();
    // SAFETY: kill(2) on the test API server's pid.
    assert_eq!(unsafe { libc::kill(env.apiserver_pid, libc::SIGSTOP) }, 0);
    let resume = Resume(env.apiserver_pid);
    // /healthz answers 200 on every host throughout: an unreachable store
    // is no reason to restart a host.
    let mut polls = 0;
    while SystemTime::now().duration_since(stopped_at).unwrap() < outage {
        for (h, addr) in hosts.iter().zip(&addresses) {
            let (status, body) = http_get(addr, "/healthz").unwrap();
            assert_eq!(status, 200, "{} during the outage: {body}", h.name);
            polls += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(resume);
    println!("/healthz answered 200 {polls} times on the three hosts during the outage");
    let resumed_at = SystemTime::now();

    // The leader's guest was stopped (by force) before the lease could have
    // expired anywhere: the last renewal others saw began at most RP before
    // the outage, so none could take over before stopped_at - RP + LD.
    let stop = hosts[leader].wait_for(SECS(1), "the leader's forced stop", |e| {
        e.is(STOPPED, Some("probe"))
    });
    let after = ms_between(stopped_at, stop.at);
    let bound = (RD + GRACE).as_millis() as f64 + 100.0;
    let expiry = (LD - RP).as_millis() as f64;
    println!(
        "API server stopped for {outage:?}: the leader's guest was stopped by force {after:.0} ms into it \
         (renew deadline + grace = {} ms; the lease could expire elsewhere at {expiry:.0} ms at the earliest)",
        (RD + GRACE).as_millis()
    );
    assert_eq!(stop.str("how"), Some("forced"));
    assert!(
        after <= bound && after < expiry,
        "stopped {after:.0} ms into the outage"
    );
    let gave_up = hosts[leader].wait_for(SECS(1), "stepping down", |e| e.message() == "stepping down");
    println!(
        "the leader stepped down {:.0} ms into the outage",
        ms_between(stopped_at, gave_up.at)
    );

    // Nobody started a guest while the API server was away.
    for h in &hosts {
        let during: Vec<Event> = h.all(|e| is_start(e) && e.at > stopped_at && e.at < resumed_at);
        assert!(
            during.is_empty(),
            "{} started a guest during the outage: {during:?}",
            h.name
        );
    }

    // When it is back, the election resumes by itself: exactly one leader.
    let (idx, started) = wait_any(
        &hosts,
        LD + SECS(6),
        "a guest start after the outage",
        resumed_at,
        is_start,
    );
    println!(
        "after the API server came back, {} ran the guest {:.0} ms later",
        hosts[idx].name,
        ms_between(resumed_at, started.at)
    );
    std::thread::sleep(LD + SECS(1));
    assert_eq!(running(&hosts).len(), 1, "one leader: {:?}", running(&hosts));
    assert_one_at_a_time(&hosts, &[]);
    // What the three hosts asked for, from just before the outage until
    // now (requests sent while the server was stopped are counted when it
    // serves them): retries are spaced by the retry period, no storm.
    let after = rt.block_on(lease_requests(&admin));
    let total = SystemTime::now().duration_since(stopped_at).unwrap();
    let requests = delta(&before, &after);
    println!("requests to leases over the {total:.1?} from the outage to now, 3 hosts: {requests:?}");
    let all: u64 = requests.values().sum();
    // Unhindered: the leader's renewals, and each follower re-reading and
    // re-watching about once per retry period while it cannot: 3 hosts x
    // (1 + 2 per retry period) is a generous ceiling.
    let ceiling = 3 * (1 + 2 * (total.as_millis() / RP.as_millis()) as u64);
    assert!(
        all <= ceiling,
        "{all} requests, more than {ceiling}: {requests:?}"
    );
    let spec = spec_of(&lease_of(&rt, &ns, "demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some(hosts[idx].name.as_str()));
    // And after it; the leader counted what failed meanwhile.
    for (h, addr) in hosts.iter().zip(&addresses) {
        assert_eq!(http_get(addr, "/healthz").unwrap().0, 200, "{}", h.name);
    }
    let errors = metric_sum(
        &hosts[leader].scrape(),
        "baton_lease_store_errors_total",
        &["lease=\"demo\""],
    );
    assert!(errors >= 1.0, "the old leader's failed requests are counted");
}

#[test]
fn a_deleted_or_foreign_written_lease_converges_to_one_leader_without_overlap() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "foreign"));
    let s = Scratch::new();
    let (_, mut hosts) = three_hosts(&env, &ns, &s);
    let first = settled(&hosts);
    std::thread::sleep(Duration::from_secs(1));

    // Deleted while held: the holder may still run its guest and sees the
    // deletion no sooner than the others, so nobody else may start. It
    // re-creates the Lease at its next renewal and leads on, same term.
    let leader = running(&hosts).pop().expect("a leader");
    let term = first.guest_term().unwrap();
    let deleted_at = SystemTime::now();
    rt.block_on(ns.leases().delete("demo", &DeleteParams::default()))
        .unwrap();
    let recreated = loop {
        if let Some(lease) = lease_of(&rt, &ns, "demo") {
            break lease;
        }
        assert!(
            ms_between(deleted_at, SystemTime::now()) < 3000.0,
            "the Lease was not re-created"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    println!(
        "Lease deleted while held: it was back {:.0} ms later, held by {:?} in term {:?} (leader {leader}, term {term})",
        ms_between(deleted_at, SystemTime::now()),
        spec_of(&recreated).holder_identity,
        spec_of(&recreated).lease_transitions,
    );
    assert_eq!(
        spec_of(&recreated).holder_identity.as_deref(),
        Some(leader.as_str())
    );
    assert_eq!(spec_of(&recreated).lease_transitions, Some(term as i32));
    std::thread::sleep(LD);
    for h in &hosts {
        let moved: Vec<Event> =
            h.all(|e| e.at >= deleted_at && (is_start(e) || e.is(STOPPED, Some("probe"))));
        assert!(
            moved.is_empty(),
            "{}: no guest stopped or started after the delete: {moved:?}",
            h.name
        );
    }
    assert_eq!(running(&hosts), vec![leader.clone()]);

    // Overwritten by a foreign writer with its own labels and annotations,
    // a 2 s lease and a term of its own: the leader stops at once, the
    // others wait out the foreign lease, then one takes over with the next
    // term, keeping the foreign fields. The writer does what any client
    // must: read, modify, write with the read resourceVersion, and read
    // again when the leader renewed in between (409 Conflict).
    let tries_until = Instant::now() + SECS(10);
    let overwritten_at = loop {
        assert!(
            Instant::now() < tries_until,
            "the foreign overwrite kept conflicting"
        );
        let mut lease = lease_of(&rt, &ns, "demo").unwrap();
        lease
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "other".into());
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("other.example/owner".into(), "keep me".into());
        lease.spec = Some(LeaseSpec {
            holder_identity: Some("foreign-writer".into()),
            lease_duration_seconds: Some(2),
            lease_transitions: Some(40),
            ..LeaseSpec::default()
        });
        let at = SystemTime::now();
        match rt.block_on(ns.leases().replace("demo", &PostParams::default(), &lease)) {
            Ok(_) => break at,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("foreign overwrite: {e}"),
        }
    };
    let (idx, taken) = wait_any(
        &hosts,
        SECS(6),
        "a guest start after the overwrite",
        overwritten_at,
        is_start,
    );
    let waited = ms_between(overwritten_at, taken.at);
    println!(
        "Lease overwritten by a foreign holder (2 s lease): {} took over after {waited:.0} ms, term {}",
        hosts[idx].name,
        taken.guest_term().unwrap()
    );
    assert!(waited >= 1900.0, "the foreign lease was honoured: {waited:.0} ms");
    assert_eq!(taken.guest_term(), Some(41));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(running(&hosts).len(), 1);
    assert_one_at_a_time(&hosts, &[]);
    let lease = lease_of(&rt, &ns, "demo").unwrap();
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("team").map(String::as_str),
        Some("other"),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("baton-test"),
        "{labels:?}"
    );
    assert_eq!(
        lease
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("other.example/owner")
            .map(String::as_str),
        Some("keep me")
    );
    assert_eq!(
        spec_of(&lease).holder_identity.as_deref(),
        Some(hosts[idx].name.as_str())
    );

    // Deleted after its holder died: the others honour the dead holder's
    // lease from when they saw the deletion, then one takes over.
    let killed_at = hosts[idx].sigkill();
    let killed = vec![(hosts[idx].name.clone(), killed_at)];
    let deleted_at = SystemTime::now();
    rt.block_on(ns.leases().delete("demo", &DeleteParams::default()))
        .unwrap();
    let (next, taken) = wait_any(
        &hosts,
        LD + SECS(3),
        "a guest start after the delete",
        deleted_at,
        is_start,
    );
    let waited = ms_between(deleted_at, taken.at);
    println!(
        "Lease deleted after its holder was killed: {} took over after {waited:.0} ms, term {:?}",
        hosts[next].name,
        taken.guest_term()
    );
    assert!(
        waited >= LD.as_millis() as f64 - 50.0,
        "the dead holder's lease was honoured: {waited:.0} ms"
    );
    // Above every term the killed holder may have started: term 41
    // reserved up to 41 + 15 (see the Kubernetes store's term floors). A
    // host that lost the race for term 41 may have reserved the next 16
    // (its floor write lands before its Lease write fails), so the term is
    // 57 or, once per losing host, 16 higher: terms only need to grow.
    let term = taken.guest_term().unwrap_or(0);
    let losers = hosts.len() as u64 - 1;
    assert!(
        term > 41 + RESERVED_TERMS - 1
            && term <= 41 + RESERVED_TERMS * (1 + losers)
            && (term - 41) % RESERVED_TERMS == 0,
        "term {term} after the deletion; the hosts' story:\n{}",
        story(&hosts, killed_at, SystemTime::now())
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_one_at_a_time(&hosts, &killed);
}

#[test]
fn a_foreign_write_that_drops_the_labels_is_no_deletion_and_the_hosts_see_every_change() {
    // The hosts watch their Leases through one watch per namespace that
    // selects baton's labels; the API server reports a Lease that loses
    // them as DELETED. Neither that nor a foreign holder that writes no
    // labels may look like a free Lease, or go unseen.
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "nolabels"));
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let hosts: Vec<Host> = ["host-a", "host-b"]
        .iter()
        .map(|n| Host::start(n, &cfg))
        .collect();
    settled(&hosts);
    std::thread::sleep(SECS(1));
    let leader = running(&hosts).pop().expect("a leader");

    // 1. The labels of the held Lease dropped: nothing moves, and the
    // leader's next renewal puts them back.
    let dropped_at = SystemTime::now();
    let how = rt.block_on(env.drop_labels(&ns, "demo", &["baton.dev/role", "app"]));
    let until = Instant::now() + SECS(3);
    loop {
        let labels = lease_of(&rt, &ns, "demo")
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        if labels.get("baton.dev/role").map(String::as_str) == Some("lease") {
            break;
        }
        assert!(Instant::now() < until, "the labels were not put back: {labels:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "labels dropped ({how}) from the Lease {leader} holds: put back by its renewal {:.0} ms later",
        ms_between(dropped_at, SystemTime::now())
    );
    std::thread::sleep(LD);
    for h in &hosts {
        let moved: Vec<Event> =
            h.all(|e| e.at >= dropped_at && (is_start(e) || e.is(STOPPED, Some("probe"))));
        assert!(
            moved.is_empty(),
            "{}: a guest stopped or started: {moved:?}",
            h.name
        );
    }
    assert_eq!(running(&hosts), vec![leader.clone()]);

    // 2. A foreign holder takes the Lease over without baton's labels, for
    // 60 s: the leader stops, nobody takes it meanwhile.
    let taken_at = SystemTime::now();
    rt.block_on(foreign_write(
        &ns,
        "demo",
        &[("team", "other")],
        held_by("foreign-writer", 40, 60),
    ));
    let (_, stopped) = wait_any(&hosts, SECS(3), "the leader's stop", taken_at, |e| {
        e.is(STOPPED, Some("probe"))
    });
    println!(
        "a foreign holder without labels: the leader's guest stopped {:.0} ms later",
        ms_between(taken_at, stopped.at)
    );
    // 3. It renews twice, still without labels; then releases. The hosts
    // see the release through their watches (a host that missed it would
    // wait out the 60 s lease) and one takes over at once.
    for i in 0..2 {
        std::thread::sleep(SECS(1));
        rt.block_on(foreign_write(
            &ns,
            "demo",
            &[("team", "other")],
            held_by("foreign-writer", 40, 60 + i),
        ));
    }
    std::thread::sleep(SECS(1));
    assert!(
        running(&hosts).is_empty(),
        "nobody leads while the foreign holder does"
    );
    let released_at = SystemTime::now();
    rt.block_on(foreign_write(
        &ns,
        "demo",
        &[("team", "other")],
        held_by("", 40, 1),
    ));
    let (idx, started) = wait_any(
        &hosts,
        SECS(10),
        "a guest start after the release",
        released_at,
        is_start,
    );
    let took = ms_between(released_at, started.at);
    println!(
        "the foreign holder released the Lease without labels: {} took over {took:.0} ms later, term {:?}",
        hosts[idx].name,
        started.guest_term()
    );
    assert!(took < (RP * 2).as_millis() as f64, "{took:.0} ms");
    assert_eq!(started.guest_term(), Some(41));
    let labels = lease_of(&rt, &ns, "demo")
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    for (k, v) in [
        ("baton.dev/role", "lease"),
        ("app", "baton-test"),
        ("team", "other"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
    }
    std::thread::sleep(SECS(1));
    assert_eq!(running(&hosts).len(), 1);
    assert_one_at_a_time(&hosts, &[]);
}

#[test]
fn rbac_the_deploy_role_is_enough_and_its_absence_is_a_clear_forbidden() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "rbac"));
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    rt.block_on(ns.bind(role, "baton-a"));
    let s = Scratch::new();
    // The kubeconfig comes from the command line here.
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            None,
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let kc = |user: &str| env.kubeconfig(user).into_os_string();
    let allowed = Host::start_with_args(
        "rbac-a",
        &cfg,
        &shared_cache_dir(),
        &[OsStr::new("--kubeconfig"), kc("baton-a").as_os_str()],
    );
    allowed.wait_for(SECS(60), "the allowed host's guest", is_start);
    let denied = Host::start_with_args(
        "rbac-nobody",
        &cfg,
        &shared_cache_dir(),
        &[OsStr::new("--kubeconfig"), kc("nobody").as_os_str()],
    );
    let refusal = denied.wait_for(SECS(60), "a forbidden error", |e| {
        e.str("error").is_some_and(|m| m.contains("forbidden"))
    });
    let message = refusal.str("error").unwrap().to_owned();
    println!("user without the Role: {}: {message}", refusal.message());
    assert!(message.contains("User \"nobody\" cannot"), "{message}");
    assert!(message.contains("resource \"leases\""), "{message}");
    assert!(
        message.contains(&format!("namespace \"{}\"", ns.name)),
        "{message}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(denied.all(is_start).is_empty());
    assert!(allowed.all(|e| e.message() == "stepping down").is_empty());
    let spec = spec_of(&lease_of(&rt, &ns, "demo").unwrap());
    assert_eq!(spec.holder_identity.as_deref(), Some("rbac-a"));
}

#[test]
fn unsafe_or_unrepresentable_timings_are_refused_at_start_up() {
    let env = KubeEnv::load();
    let s = Scratch::new();
    let base = kube_config("baton", Some(&env.admin_kubeconfig), "demo", &[]);
    // A request timeout longer than the lease itself.
    let cfg = s.write(
        "slow.toml",
        &base.replace("request-timeout = \"500ms\"", "request-timeout = \"5s\""),
    );
    let out = baton().args(["run", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{}", stderr.trim());
    assert!(!out.status.success());
    assert!(
        stderr
            .contains("lease \"demo\": unsafe timings: request-timeout must be shorter than renew-deadline"),
        "{stderr}"
    );
    // A lease duration a Lease object cannot hold.
    let cfg = s.write(
        "frac.toml",
        &base.replace("lease-duration = \"4s\"", "lease-duration = \"4500ms\""),
    );
    let out = baton().args(["run", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{}", stderr.trim());
    assert!(!out.status.success());
    assert!(
        stderr.contains("lease-duration 4s 500ms is not a whole number of seconds"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// The store itself against the API server.

fn store(client: kube::Client, ns: &str, labels: &[(&str, &str)]) -> KubeStore {
    KubeStore::with_client(
        client,
        ns,
        "test".into(),
        &KubeOptions {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            fallback_duration: Duration::from_secs(15),
            request_timeout: Duration::from_secs(2),
            ..KubeOptions::default()
        },
    )
}

fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
    LeaseRecord {
        plugins: None,
        yielded: None,
        instance: None,
        holder: holder.map(str::to_owned),
        lease_duration: Duration::from_secs(4),
        acquire_time: Some(SystemTime::now()),
        renew_time: Some(SystemTime::now()),
        term,
    }
}

fn foreign_lease(name: &str, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("team".to_owned(), "other".to_owned())].into()),
            annotations: Some([("other.example/owner".to_owned(), "keep me".to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

#[test]
fn store_reads_foreign_leases_leniently_and_never_erases_their_fields() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "store").await;
        let store = store(admin.clone(), &ns.name, &[("app", "baton")]);
        let leases = ns.leases();
        assert_eq!(store.get("missing").await.unwrap(), None);

        // Holder null, no duration, no times, no transitions, no spec fields.
        leases
            .create(
                &PostParams::default(),
                &foreign_lease("bare", LeaseSpec::default()),
            )
            .await
            .unwrap();
        let v = store.get("bare").await.unwrap().unwrap();
        assert_eq!(v.record.holder(), None);
        assert_eq!(v.record.term, 0);
        assert_eq!(v.record.renew_time, None);
        assert_eq!(
            v.record.lease_duration,
            Duration::from_secs(15),
            "the fallback duration"
        );

        // Empty holder; a holder without duration or renew time.
        for (name, holder) in [("empty", ""), ("nodur", "someone")] {
            let spec = LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_transitions: Some(5),
                ..LeaseSpec::default()
            };
            leases
                .create(&PostParams::default(), &foreign_lease(name, spec))
                .await
                .unwrap();
            let v = store.get(name).await.unwrap().unwrap();
            assert_eq!(v.record.holder(), (!holder.is_empty()).then_some(holder));
            assert_eq!(v.record.term, 5);
            assert_eq!(v.record.lease_duration, Duration::from_secs(15));
        }

        // Writing keeps the foreign labels and annotations, adds ours.
        let v = store.get("nodur").await.unwrap().unwrap();
        let w = store
            .update("nodur", &v.version, &record(Some("me"), 6))
            .await
            .unwrap();
        assert_eq!(w.record.holder(), Some("me"));
        assert_eq!(w.record.term, 6);
        let l = leases.get("nodur").await.unwrap();
        let labels = l.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("team").map(String::as_str), Some("other"));
        assert_eq!(labels.get("app").map(String::as_str), Some("baton"));
        assert_eq!(
            l.metadata
                .annotations
                .unwrap()
                .get("other.example/owner")
                .map(String::as_str),
            Some("keep me")
        );
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        assert_eq!(spec.lease_transitions, Some(6));
        assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());

        // A release: empty holder, 1 s.
        let released = LeaseRecord {
            plugins: None,
            yielded: None,
            instance: None,
            holder: None,
            lease_duration: Duration::from_secs(1),
            acquire_time: None,
            renew_time: Some(SystemTime::now()),
            term: 6,
        };
        let r = store.update("nodur", &w.version, &released).await.unwrap();
        let spec = leases.get("nodur").await.unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.acquire_time, None);

        // Compare-and-swap: a stale version conflicts and writes nothing.
        let err = store
            .update("nodur", &w.version, &record(Some("late"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        // A store that has not seen the object reads it first.
        let fresh = self::store(admin.clone(), &ns.name, &[]);
        let err = fresh
            .update("nodur", &w.version, &record(Some("late"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(store.get("nodur").await.unwrap().unwrap().version, r.version);
        let again = fresh
            .update("nodur", &r.version, &record(Some("fresh"), 7))
            .await
            .unwrap();
        let l = leases.get("nodur").await.unwrap();
        assert_eq!(
            l.metadata.labels.unwrap().get("team").map(String::as_str),
            Some("other")
        );
        assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("fresh"));
        // Creating an existing lease conflicts; updating a deleted one too.
        assert!(
            store
                .create("nodur", &record(None, 0))
                .await
                .unwrap_err()
                .is_conflict()
        );
        leases.delete("nodur", &DeleteParams::default()).await.unwrap();
        let err = store
            .update("nodur", &again.version, &record(Some("me"), 8))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        // Deleted while held by "fresh": read as still held by it, under a
        // version of its own, until it is re-created through that version
        // (once: a second try conflicts).
        let tombstone = fresh.get("nodur").await.unwrap().expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE));
        assert_eq!(tombstone.record.holder(), Some("fresh"));
        assert_eq!(tombstone.record.term, 7);
        fresh
            .update("nodur", &tombstone.version, &record(Some("fresh"), 7))
            .await
            .unwrap();
        let err = fresh
            .update("nodur", &tombstone.version, &record(Some("fresh"), 7))
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        assert_eq!(
            leases
                .get("nodur")
                .await
                .unwrap()
                .spec
                .unwrap()
                .holder_identity
                .as_deref(),
            Some("fresh")
        );
        leases.delete("nodur", &DeleteParams::default()).await.unwrap();
        // Terms beyond int32 are refused, never wrapped.
        let err = store
            .create("big", &record(Some("me"), 1 << 31))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Refused { .. }), "{err}");

        // Listing sees the labelled ones only when labels are configured.
        let listed: Vec<String> = store.list().await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(listed.is_empty(), "nothing left with app=baton: {listed:?}");
        let listed: Vec<String> = fresh.list().await.unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, vec!["bare".to_owned(), "empty".to_owned()]);
    });
}

async fn next_within(watch: &mut LeaseWatch, secs: u64) -> Option<Versioned> {
    tokio::time::timeout(Duration::from_secs(secs), watch.next())
        .await
        .expect("the watch yields in time")
        .expect("the watch goes on")
        .expect("no error")
}

#[test]
fn store_watch_yields_the_current_record_then_every_change_and_never_goes_back() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "watch").await;
        let watcher = store(admin.clone(), &ns.name, &[]);
        let writer = store(admin.clone(), &ns.name, &[]);

        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(
            next_within(&mut watch, 2).await,
            None,
            "first the current state: none"
        );
        let mut current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(current.clone()));
        let mut latencies = Vec::new();
        for i in 0..10 {
            let started = Instant::now();
            current = writer
                .update("demo", &current.version, &record(Some("a"), 2 + i))
                .await
                .unwrap();
            assert_eq!(next_within(&mut watch, 2).await, Some(current.clone()));
            latencies.push(started.elapsed().as_secs_f64() * 1e3);
        }
        println!("watch: write to event {}", summary(latencies));

        // The current record comes first when watching starts.
        let mut second = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut second, 2).await, Some(current.clone()));
        drop(second);

        // Deletion of a held Lease: its last record, still held, under a
        // version of its own; at the highest term reserved for it (term 2
        // reserved up to 17, and another host's term may have started
        // unseen: its holder is waited out the same way).
        ns.leases()
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        let tombstone = next_within(&mut watch, 2).await.expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
        let reserved = 2 + RESERVED_TERMS - 1;
        assert_eq!(
            tombstone.record,
            LeaseRecord {
                plugins: None,
                yielded: None,
                term: reserved,
                ..current.record.clone()
            }
        );
        // A watch started now, and a read, say the same.
        let mut third = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut third, 2).await, Some(tombstone.clone()));
        drop(third);
        assert_eq!(watcher.get("demo").await.unwrap(), Some(tombstone.clone()));
        // Created again above it, released, deleted again: released at its
        // term floor, so the next term is above it.
        let released = LeaseRecord {
            plugins: None,
            yielded: None,
            instance: None,
            holder: None,
            ..record(None, reserved + 1)
        };
        let back = watcher
            .update("demo", &tombstone.version, &released)
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(back.clone()));
        ns.leases()
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        let floor = next_within(&mut watch, 2).await.expect("the floor record");
        assert_eq!(floor.version, format!("{TOMBSTONE}term-{}", reserved + 1));
        assert_eq!((floor.record.holder(), floor.record.term), (None, reserved + 1));
        assert_eq!(watcher.get("demo").await.unwrap(), Some(floor.clone()));

        // The watcher's own writes are news before their events arrive:
        // the stream never goes back to an older version.
        let created = watcher
            .update("demo", &floor.version, &record(Some("w"), reserved + 2))
            .await
            .unwrap();
        let updated = watcher
            .update("demo", &created.version, &record(Some("w"), reserved + 3))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(updated.clone()));
        let quiet = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
        assert!(quiet.is_err(), "nothing else: {quiet:?}");
        // Same for a watch started before writes it has not yielded yet.
        let mut late = watcher.watch("demo").await.unwrap();
        let newer = watcher
            .update("demo", &updated.version, &record(Some("w"), reserved + 4))
            .await
            .unwrap();
        assert_eq!(next_within(&mut late, 2).await, Some(newer));
    });
}

/// A watch on a new Lease "demo" that the server ends every 2 s, after its
/// first observation; the store that created the Lease, and the request
/// counts from before the watch started.
struct ShortWatch {
    writer: KubeStore,
    current: Versioned,
    before: std::collections::BTreeMap<String, f64>,
    watch: LeaseWatch,
}

impl ShortWatch {
    async fn start(admin: &kube::Client, ns: &TestNamespace) -> ShortWatch {
        let options = KubeOptions {
            fallback_duration: Duration::from_secs(15),
            request_timeout: Duration::from_secs(2),
            watch_timeout_secs: Some(2),
            ..KubeOptions::default()
        };
        let watcher = KubeStore::with_client(admin.clone(), &ns.name, "test".into(), &options);
        let writer = store(admin.clone(), &ns.name, &[]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let before = lease_requests(admin).await;
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(current.clone()));
        ShortWatch {
            writer,
            current,
            before,
            watch,
        }
    }
}

#[test]
fn store_watch_is_resumed_after_the_server_ends_it_without_listing_again() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "resume").await;
        let ShortWatch {
            writer,
            mut current,
            before,
            mut watch,
        } = ShortWatch::start(&admin, &ns).await;
        // Four server-side watch timeouts pass, quietly, then changes still
        // arrive: the watch was resumed each time.
        let quiet = tokio::time::timeout(Duration::from_millis(8500), watch.next()).await;
        assert!(quiet.is_err(), "nothing changed: {quiet:?}");
        for i in 0..3 {
            current = writer
                .update("demo", &current.version, &record(Some("a"), 2 + i))
                .await
                .unwrap();
            assert_eq!(next_within(&mut watch, 3).await, Some(current.clone()));
        }
        let requests = delta(&before, &lease_requests(&admin).await);
        println!("watch with a 2 s server timeout, over 9 s: {requests:?}");
        let count = |verb: &str| requests.get(verb).copied().unwrap_or(0);
        assert_eq!(
            count("LIST"),
            1,
            "listed once, when the watch started: {requests:?}"
        );
        assert!(
            (4..=6).contains(&count("WATCH")),
            "resumed every 2 s: {requests:?}"
        );
        assert_eq!(count("GET"), 0, "{requests:?}");
    });
}

#[test]
fn store_watch_stays_current_through_a_busy_watch_cache_without_listing_again() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "busy").await;
        let ShortWatch {
            writer,
            current,
            before,
            mut watch,
        } = ShortWatch::start(&admin, &ns).await;
        // 300 writes to another Lease while "demo" stays quiet, more than
        // the API server's watch cache starts with for leases (100 events;
        // it may grow under load). Every resume (the server ends the watch
        // every 2 s) must still succeed without an error or a new list:
        // the store resumes from the newest resourceVersion it knows,
        // which the bookmarks it asks for keep current. (This does not
        // force a 410 Gone; none could be provoked on this server.)
        let mut noise = writer.create("noise", &record(Some("n"), 1)).await.unwrap();
        for i in 0..300 {
            noise = writer
                .update("noise", &noise.version, &record(Some("n"), 2 + i))
                .await
                .unwrap();
        }
        let quiet = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
        assert!(
            quiet.is_err(),
            "no error and no event for the quiet Lease: {quiet:?}"
        );
        let changed = writer
            .update("demo", &current.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 3).await, Some(changed));
        let requests = delta(&before, &lease_requests(&admin).await);
        println!("watch through 300 foreign writes and 2 s server timeouts: {requests:?}");
        assert_eq!(
            requests.get("LIST").copied().unwrap_or(0),
            1,
            "listed once, when the watch started: {requests:?}"
        );
    });
}

/// Writes `spec` over the Lease `name` as a raw client would, with the
/// labels `labels` (none of baton's), reading again on a 409; the version
/// written.
async fn foreign_write(ns: &TestNamespace, name: &str, labels: &[(&str, &str)], spec: LeaseSpec) -> String {
    loop {
        let mut lease = ns.leases().get(name).await.unwrap();
        lease.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        lease.spec = Some(spec.clone());
        match ns.leases().replace(name, &PostParams::default(), &lease).await {
            Ok(written) => return written.metadata.resource_version.unwrap(),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("foreign write of {name}: {e}"),
        }
    }
}

fn held_by(holder: &str, transitions: i32, seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(seconds),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

#[test]
fn a_lease_without_duration_reads_with_the_fallback_the_stores_timings_set_after_a_reload() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "fallback").await;
        // Opened with a fallback of 15 s (the longest lease of a host).
        let store = store(admin.clone(), &ns.name, &[("app", "baton")]);
        let written = store.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut watch = store.watch("demo").await.unwrap();
        let first = next_within(&mut watch, 5).await.expect("the Lease");
        assert_eq!(first.version, written.version);
        // A foreign holder that promised no duration, in the shared watch's
        // selection.
        let labels = [(ROLE_LABEL, LEASE_ROLE), ("app", "baton")];
        let foreign = |term| LeaseSpec {
            holder_identity: Some("foreign".into()),
            lease_transitions: Some(term),
            ..LeaseSpec::default()
        };
        foreign_write(&ns, "demo", &labels, foreign(2)).await;
        let seen = next_within(&mut watch, 5).await.expect("the foreign write");
        assert_eq!(seen.record.holder(), Some("foreign"));
        assert_eq!(seen.record.lease_duration, Duration::from_secs(15), "watched");
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(15), "read");

        // A reload made the longest lease 40 s: what is read from then on
        // reads so, by get, list and the watch already open.
        store.set_timings(StoreTimings {
            fallback_duration: Duration::from_secs(40),
            request_timeout: Duration::from_secs(1),
        });
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(40), "read after");
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            listed[0].1.record.lease_duration,
            Duration::from_secs(40),
            "listed after"
        );
        foreign_write(&ns, "demo", &labels, foreign(3)).await;
        let seen = next_within(&mut watch, 5)
            .await
            .expect("the second foreign write");
        assert_eq!(seen.record.term, 3);
        assert_eq!(
            seen.record.lease_duration,
            Duration::from_secs(40),
            "watched after"
        );
        // A Lease with a duration reads with its own, as ever.
        store
            .update("demo", &seen.version, &record(Some("b"), 4))
            .await
            .unwrap();
        let read = store.get("demo").await.unwrap().unwrap();
        assert_eq!(read.record.lease_duration, Duration::from_secs(4));
    });
}

#[test]
fn store_watch_follows_leases_without_its_labels_and_never_reads_a_dropped_label_as_a_deletion() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "unlabeled").await;
        let watcher = store(admin.clone(), &ns.name, &[("app", "baton")]);
        let writer = store(admin.clone(), &ns.name, &[("app", "baton")]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let labels = ns.leases().get("demo").await.unwrap().metadata.labels.unwrap();
        assert_eq!(
            labels.get("baton.dev/role").map(String::as_str),
            Some("lease"),
            "baton labels every Lease it writes: {labels:?}"
        );
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(current.clone()));

        // The labels dropped (the shared watch, which selects by them, says
        // DELETED): the Lease is read as it is, still held, not deleted.
        let how = env.drop_labels(&ns, "demo", &["baton.dev/role", "app"]).await;
        let dropped = ns.leases().get("demo").await.unwrap();
        let seen = next_within(&mut watch, 2).await.expect("the Lease, not a deletion");
        println!("labels dropped by {how}: read as {seen:?}");
        assert_eq!(Some(&seen.version), dropped.metadata.resource_version.as_ref());
        assert!(!seen.version.starts_with(TOMBSTONE));
        assert_eq!((seen.record.holder(), seen.record.term), (Some("a"), 1));

        // Without the labels, every change is still seen.
        let before = lease_requests(&admin).await;
        for i in 0..3 {
            let version = foreign_write(&ns, "demo", &[("team", "other")], held_by("foreign", 10 + i, 60)).await;
            let seen = next_within(&mut watch, 2).await.unwrap();
            assert_eq!(seen.version, version);
            assert_eq!((seen.record.holder(), seen.record.term), (Some("foreign"), 10 + i as u64));
        }
        let requests = delta(&before, &lease_requests(&admin).await);
        println!("three foreign writes (each a GET and a PUT) of a Lease without baton's labels, watched: {requests:?}");

        // Baton's next write puts the labels back (keeping the foreign one);
        // changes go on being seen, through the shared watch again.
        let foreign = watcher.get("demo").await.unwrap().unwrap();
        let written = writer
            .update("demo", &foreign.version, &record(Some("b"), 13))
            .await
            .unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(written.clone()));
        let labels = ns.leases().get("demo").await.unwrap().metadata.labels.unwrap();
        for (k, v) in [("baton.dev/role", "lease"), ("app", "baton"), ("team", "other")] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
        }
        let version = foreign_write(
            &ns,
            "demo",
            &[("baton.dev/role", "lease"), ("app", "baton")],
            held_by("c", 14, 4),
        )
        .await;
        assert_eq!(next_within(&mut watch, 2).await.unwrap().version, version);

        // A Lease someone else created without the labels, before the
        // watch started, and one created after: both followed.
        ns.leases()
            .create(&PostParams::default(), &foreign_lease("pre", held_by("x", 3, 60)))
            .await
            .unwrap();
        let mut pre = watcher.watch("pre").await.unwrap();
        let first = next_within(&mut pre, 2).await.unwrap();
        assert_eq!((first.record.holder(), first.record.term), (Some("x"), 3));
        let version = foreign_write(&ns, "pre", &[], held_by("y", 4, 60)).await;
        assert_eq!(next_within(&mut pre, 2).await.unwrap().version, version);
        let mut late = watcher.watch("late").await.unwrap();
        assert_eq!(next_within(&mut late, 2).await, None);
        ns.leases()
            .create(&PostParams::default(), &foreign_lease("late", held_by("z", 5, 60)))
            .await
            .unwrap();
        let created = next_within(&mut late, 2).await.unwrap();
        assert_eq!((created.record.holder(), created.record.term), (Some("z"), 5));
        // And deleted while held: its last record, held, as for any Lease.
        ns.leases()
            .delete("pre", &DeleteParams::default())
            .await
            .unwrap();
        let tombstone = next_within(&mut pre, 2).await.expect("the last record");
        assert!(tombstone.version.starts_with(TOMBSTONE), "{tombstone:?}");
        assert_eq!(tombstone.record.holder(), Some("y"));
        // The other watches heard nothing of all that.
        for w in [&mut watch, &mut late] {
            let quiet = tokio::time::timeout(Duration::from_millis(300), w.next()).await;
            assert!(quiet.is_err(), "nothing else: {quiet:?}");
        }
    });
}

#[test]
fn store_requests_without_permission_are_refused_naming_user_verb_and_resource() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "denied").await;
        let nobody = store(env.client(&env.kubeconfig("nobody")).await, &ns.name, &[]);
        // A create raises the lease's term floor (a ConfigMap) first.
        for (verb, resource, err) in [
            ("get", "leases", nobody.get("demo").await.unwrap_err()),
            (
                "get",
                "configmaps",
                nobody.create("demo", &record(Some("x"), 1)).await.unwrap_err(),
            ),
            (
                "list",
                "leases",
                nobody.watch("demo").await.err().expect("refused"),
            ),
        ] {
            println!("{verb}: {err}");
            match &err {
                StoreError::Refused { lease, detail } => {
                    assert_eq!(lease, "demo");
                    assert!(detail.starts_with("forbidden: "), "{detail}");
                    assert!(
                        detail.contains(&format!("User \"nobody\" cannot {verb} resource \"{resource}\"")),
                        "{detail}"
                    );
                    assert!(detail.contains(&format!("namespace \"{}\"", ns.name)), "{detail}");
                    if resource == "configmaps" {
                        assert!(
                            detail.contains("baton-terms.demo") && detail.contains("role.yaml"),
                            "{detail}"
                        );
                    }
                }
                other => panic!("{verb}: expected Refused, got {other:?}"),
            }
        }
    });
}

/// The data of `lease`'s term floor ConfigMap, if it has one.
async fn floor_of(
    admin: &kube::Client,
    ns: &str,
    lease: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    let floors: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), ns);
    floors
        .get_opt(&baton::store::kube::floor_name(lease))
        .await
        .unwrap()
        .map(|cm| cm.data.unwrap_or_default())
}

#[test]
fn store_terms_never_repeat_after_the_lease_is_deleted_even_with_no_host_running() {
    let env = KubeEnv::load();
    let rt = runtime();
    rt.block_on(async {
        let admin = env.admin().await;
        let ns = TestNamespace::create(admin.clone(), "floor").await;
        let fresh = || store(admin.clone(), &ns.name, &[]);
        let held = |holder: &str, term| LeaseRecord {
            plugins: None,
            yielded: None,
            instance: Some(format!("{holder}-instance")),
            ..record(Some(holder), term)
        };
        let a = fresh();
        let v1 = a.create("demo", &held("a", 1)).await.unwrap();
        let v2 = a.update("demo", &v1.version, &held("a", 2)).await.unwrap();
        a.update("demo", &v2.version, &record(None, 2)).await.unwrap();
        let floor = floor_of(&admin, &ns.name, "demo")
            .await
            .expect("a floor ConfigMap");
        println!("floor after terms 1 and 2: {floor:?}");
        // Term 2 reserved the terms up to 2 + 15.
        let reserved = 2 + RESERVED_TERMS - 1;
        assert_eq!(floor.get("floor"), Some(&reserved.to_string()));
        assert_eq!(floor.get("creates").map(String::as_str), Some("1"));

        // Every Lease deleted while no host runs.
        let how = env.delete_all_leases(&ns).await;
        println!("deleted with {how}");
        assert!(ns.leases().get_opt("demo").await.unwrap().is_none());

        // A store that never saw the Lease (a host started now) reads it as
        // released at its floor; the ConfigMap is no Lease, so status lists
        // nothing.
        let seen = fresh().get("demo").await.unwrap().expect("the floor record");
        assert_eq!((seen.record.holder(), seen.record.term), (None, reserved));
        assert!(seen.version.starts_with(TOMBSTONE), "{}", seen.version);
        assert!(fresh().list().await.unwrap().is_empty());

        // Two such hosts race for the next term: one creates the Lease, the
        // other is refused, though the Lease did not exist when it looked.
        let next = reserved + 1;
        let (b, c) = (fresh(), fresh());
        let vb = b.get("demo").await.unwrap().unwrap();
        let vc = c.get("demo").await.unwrap().unwrap();
        let won = b.update("demo", &vb.version, &held("b", next)).await.unwrap();
        assert_eq!(won.record.term, next);
        let lost = c.update("demo", &vc.version, &held("c", next)).await.unwrap_err();
        println!("the loser of the race for term {next}: {lost}");
        assert!(lost.is_conflict(), "{lost:?}");
        let floor = floor_of(&admin, &ns.name, "demo").await.unwrap();
        assert_eq!(floor.get("floor"), Some(&next.to_string()));
        assert_eq!(floor.get("creates").map(String::as_str), Some("2"));

        // Deleted again while held, seen by a watch: the holder's record,
        // as a tombstone.
        let watcher = fresh();
        let mut w = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut w, 5).await.unwrap().record.holder(), Some("b"));
        env.delete_all_leases(&ns).await;
        let gone = next_within(&mut w, 5).await.expect("the tombstone");
        assert!(gone.version.starts_with(TOMBSTONE), "{}", gone.version);
        assert_eq!((gone.record.holder(), gone.record.term), (Some("b"), next));

        // Re-created by another writer with leaseTransitions 0: a new term
        // is refused once, the Lease then reads at its floor, and the next
        // term is above it.
        let spec = LeaseSpec {
            holder_identity: Some("foreign".into()),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
        ns.leases()
            .create(&PostParams::default(), &foreign_lease("demo", spec))
            .await
            .unwrap();
        let d = fresh();
        let foreign = d.get("demo").await.unwrap().unwrap();
        assert_eq!(foreign.record.term, 0);
        let refused = d
            .update("demo", &foreign.version, &held("d", 1))
            .await
            .unwrap_err();
        println!("a term below the floor: {refused}");
        assert!(refused.is_conflict(), "{refused:?}");
        assert!(
            refused.to_string().contains(&format!("highest term ({next}")),
            "{refused}"
        );
        let reread = d.get("demo").await.unwrap().unwrap();
        assert_eq!(
            (reread.version.as_str(), reread.record.term),
            (foreign.version.as_str(), next)
        );
        let above = d
            .update("demo", &reread.version, &held("d", next + 1))
            .await
            .unwrap();
        assert_eq!(above.record.term, next + 1);
        let lease = ns.leases().get("demo").await.unwrap();
        assert_eq!(spec_of(&lease).lease_transitions, Some(next as i32 + 1));

        // A floor garbled by hand is refused, naming the ConfigMap and the
        // fix, and never reset.
        let floors: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), &ns.name);
        let mut cm = floors.get("baton-terms.demo").await.unwrap();
        cm.data.as_mut().unwrap().insert("floor".into(), "four".into());
        floors
            .replace("baton-terms.demo", &PostParams::default(), &cm)
            .await
            .unwrap();
        env.delete_all_leases(&ns).await;
        let err = fresh().get("demo").await.unwrap_err();
        println!("a garbled floor: {err}");
        let text = err.to_string();
        assert!(matches!(err, StoreError::Malformed { .. }), "{err:?}");
        assert!(
            text.contains(&format!("ConfigMap {}/baton-terms.demo", ns.name)),
            "{text}"
        );
        assert!(
            text.contains("\"four\"") && text.contains("kubectl edit configmap"),
            "{text}"
        );
        let err = fresh().create("demo", &held("e", 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Malformed { .. }), "{err:?}");
        assert_eq!(
            floor_of(&admin, &ns.name, "demo")
                .await
                .unwrap()
                .get("floor")
                .map(String::as_str),
            Some("four")
        );
    });
}

#[test]
fn terms_never_repeat_when_every_lease_is_deleted_while_no_host_runs() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "terms"));
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let host = |name: &str| Host::start_with(name, &cfg, &shared_cache_dir());
    let term_of = |h: &Host| {
        h.wait_for(SECS(60), "the guest's start", is_start)
            .guest_term()
            .expect("a term")
    };

    // Stopped cleanly (the Lease released), then every Lease deleted.
    let mut a = host("terms-a");
    let first = term_of(&a);
    a.sigterm();
    assert!(a.wait_exit(SECS(30)).success());
    let how = rt.block_on(env.delete_all_leases(&ns));
    assert!(lease_of(&rt, &ns, "demo").is_none());
    let mut b = host("terms-b");
    let second = term_of(&b);
    println!("released at term {first}, every Lease deleted ({how}): the next host leads in term {second}");
    assert_eq!(second, first + 1);

    // Killed while holding it (never released), then every Lease deleted:
    // nobody is left to remember the term but the floor.
    b.sigkill();
    rt.block_on(env.delete_all_leases(&ns));
    let started = Instant::now();
    let c = host("terms-c");
    let third = term_of(&c);
    println!(
        "held at term {second} by a killed host, every Lease deleted: the next host leads in term {third} after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(third, second + 1);
    assert_eq!(
        spec_of(&lease_of(&rt, &ns, "demo").unwrap()).lease_transitions,
        Some(third as i32)
    );
}

#[test]
fn a_watch_resumed_from_a_compacted_version_gets_410_gone_and_lists_afresh() {
    // No watch cache: watches are served by etcd itself, so a compaction
    // makes every older version too old, and no bookmark moves an idle
    // watch's version on.
    let server = OwnServer::start("--watch-cache=false");
    let env = server.env();
    let rt = runtime();
    let admin = rt.block_on(env.admin());

    // The store: a watch of a Lease nobody writes, while other Leases
    // change (written by someone else, without baton's labels, so that the
    // store's shared watch, which selects by them, hears nothing and stays
    // at its version) and etcd is compacted past it. The server ends the
    // watch after 2 s; resumed from its version, it gets 410 and the
    // stream ends with it; a new watch lists afresh and follows changes
    // again.
    rt.block_on(async {
        let ns = TestNamespace::create(admin.clone(), "gone").await;
        let options = KubeOptions {
            fallback_duration: Duration::from_secs(15),
            request_timeout: Duration::from_secs(2),
            watch_timeout_secs: Some(2),
            ..KubeOptions::default()
        };
        let watcher = KubeStore::with_client(admin.clone(), &ns.name, "test".into(), &options);
        let writer = store(admin.clone(), &ns.name, &[]);
        let current = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
        let mut watch = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut watch, 2).await, Some(current.clone()));
        ns.leases()
            .create(
                &PostParams::default(),
                &foreign_lease("other", held_by("b", 1, 60)),
            )
            .await
            .unwrap();
        let mut other = String::new();
        for i in 0..3 {
            other = foreign_write(&ns, "other", &[], held_by("b", 2 + i, 60)).await;
        }
        compact_etcd(&env, &other);
        let ended = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the resumed watch answers")
            .expect("an error, not the end");
        println!("a watch resumed from before a compaction: {ended:?}");
        match &ended {
            Err(StoreError::Unavailable { lease, detail }) => {
                assert_eq!(lease, "demo");
                assert!(detail.contains("410 Gone"), "{detail}");
            }
            other => panic!("expected 410 Gone as unavailable, got {other:?}"),
        }
        assert!(watch.next().await.is_none(), "the stream ends with the error");
        let mut again = watcher.watch("demo").await.unwrap();
        assert_eq!(next_within(&mut again, 2).await, Some(current.clone()));
        let newer = writer
            .update("demo", &current.version, &record(Some("a"), 1))
            .await
            .unwrap();
        assert_eq!(next_within(&mut again, 2).await, Some(newer));
    });

    // A host following a Lease held by someone else (so nobody writes it):
    // its watch (resumed every lease duration) gets 410 after a compaction,
    // it polls and watches again, and takes the Lease as soon as it is
    // released.
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "gone-host"));
    let spec = LeaseSpec {
        holder_identity: Some("someone-else".into()),
        lease_duration_seconds: Some(60),
        lease_transitions: Some(5),
        ..LeaseSpec::default()
    };
    rt.block_on(
        ns.leases()
            .create(&PostParams::default(), &foreign_lease("demo", spec)),
    )
    .unwrap();
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    let host = Host::start_with("gone-b", &cfg, &shared_cache_dir());
    host.wait_for(SECS(60), "following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    let writer = rt.block_on(async { store(admin.clone(), &ns.name, &[]) });
    let mut other = rt
        .block_on(writer.create("other", &record(Some("b"), 1)))
        .unwrap();
    for _ in 0..3 {
        other = rt
            .block_on(writer.update("other", &other.version, &record(Some("b"), 1)))
            .unwrap();
    }
    compact_etcd(&env, &other.version);
    let compacted = SystemTime::now();
    let broke = host.wait_for(SECS(10), "the watch's 410 Gone", |e| {
        e.message().starts_with("the lease watch broke") && e.str("error").is_some_and(|m| m.contains("410"))
    });
    println!(
        "a follower's watch got 410 Gone {:.0} ms after the compaction: {}",
        ms_between(compacted, broke.at),
        broke.str("error").unwrap()
    );
    let rewatched = host.wait_for(SECS(10), "watching again", |e| {
        e.message() == "watching the lease again" && e.at >= broke.at
    });
    println!(
        "it watched again {:.0} ms later",
        ms_between(broke.at, rewatched.at)
    );
    let mut lease = lease_of(&rt, &ns, "demo").unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
    let released = SystemTime::now();
    rt.block_on(ns.leases().replace("demo", &PostParams::default(), &lease))
        .unwrap();
    let started = host.wait_for(SECS(10), "the guest's start", is_start);
    let took = ms_between(released, started.at);
    println!(
        "the Lease released: the host's guest started {took:.0} ms later, in term {:?}",
        started.guest_term()
    );
    assert!(took < (RP * 2).as_millis() as f64, "{took:.0} ms");
    assert_eq!(started.guest_term(), Some(6));
}

#[test]
fn a_plugin_applies_an_object_through_the_host_in_its_term_and_never_after_a_newer_one() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, WatchEvent, WatchParams};
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "apply"));
    // The host's client is user baton-a with the deploy Role (Leases, and
    // ConfigMaps get/create/update): the API server's RBAC applies on top
    // of the plugin's grant.
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    rt.block_on(ns.bind(role, "baton-a"));
    let kc = env.kubeconfig("baton-a");
    let s = Scratch::new();
    let mut text = kube_config(&ns.name, Some(&kc), "demo", &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"applier\"\npath = {:?}\nlease = \"demo\"\ninherit-env = [\"PROBE_HOST\", \"PROBE_TRAP_AT_END\"]\n\
         env = {{ HTTP_MODE = \"apply\", HTTP_TICK_MS = \"100\", K8S_NS = {:?}, K8S_NAME = \"applied\" }}\n\
         kubernetes = {{ kubeconfig = {:?}, allow = [{{ verbs = [\"get\", \"create\", \"update\"], groups = [\"\"], \
         resources = [\"configmaps\"], namespaces = [{:?}] }}] }}\n",
        guest("http_probe.wasm").display().to_string(),
        ns.name,
        kc.display().to_string(),
        ns.name
    ));
    let cfg = s.write("baton.toml", &text);

    // Every version of the object, as a watch sees it: its term and writer.
    let history: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>> = Default::default();
    let seen = history.clone();
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns.name);
    rt.spawn(async move {
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
    let dumps = s.dir.path().join("coredumps");
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
    assert!(applied.message().contains("term=1"), "{}", applied.message());
    // Outside the grant: refused by the host, before the API server.
    let secrets = a.wait_for(SECS(10), "the secrets request", |e| {
        e.guest_line("applier", "http secrets")
    });
    assert_eq!(
        secrets.message(),
        "http secrets error ErrorCode::HttpRequestDenied term=1"
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
        Some(format!("list secrets (core) in namespace {:?}", ns.name))
    );

    let b = start("apply-b", &[]);
    b.wait_for(SECS(60), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(1));
    a.sigterm();
    assert!(a.wait_exit(SECS(10)).success());
    let applied = b.wait_for(SECS(30), "b's first write", |e| {
        e.guest_line("applier", "http apply ok")
    });
    assert!(applied.message().contains("term=2"), "{}", applied.message());
    std::thread::sleep(SECS(1));

    // The object's history: every write carries its writer's term, terms
    // never go back, and nothing of term 1 after term 2's first write.
    let history = history.lock().unwrap().clone();
    let terms: Vec<u64> = history.iter().map(|(t, _)| *t).collect();
    println!("the object's versions, by term: {terms:?}");
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "a term went back: {history:?}"
    );
    for (term, writer) in &history {
        let expected = if *term == 1 { "apply-a" } else { "apply-b" };
        assert_eq!(writer, expected, "{history:?}");
    }
    let (ones, twos) = (
        terms.iter().filter(|t| **t == 1).count(),
        terms.iter().filter(|t| **t == 2).count(),
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
    for seen in ["resourceVersion", "\"name\":\"applied\"", ns.name.as_str()] {
        assert!(holds(seen), "the dump lacks {seen:?}: not the guest's memory?");
    }
    assert!(!holds(token), "the token is in the guest's memory");
}

#[test]
fn yield_hands_the_lease_over_through_the_api_server_and_the_yielder_stays_out_for_its_time() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "yield"));
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &kube_config(
            &ns.name,
            Some(&env.admin_kubeconfig),
            "demo",
            &[probe("probe", "pollable", "cooperative")],
        ),
    );
    yielding::two_hosts_yield(&cfg, &|name| Host::start(name, &cfg), "kubernetes store", 1000.0);
    // The yield's annotations went with the write that took the Lease over.
    let lease = lease_of(&rt, &ns, "demo").expect("the Lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(baton::store::kube::YIELDED_BY),
        "{annotations:?}"
    );

    // The store: a release that says it was a yield reads back so, as
    // annotations beside any other; the next write drops them.
    rt.block_on(async {
        let store = store(admin.clone(), &ns.name, &[]);
        let held = store.create("yielded", &record(Some("a"), 1)).await.unwrap();
        let released = LeaseRecord {
            holder: None,
            lease_duration: Duration::from_secs(1),
            plugins: None,
            yielded: Some(Yielded {
                by: "a".into(),
                duration: Duration::from_millis(12_500),
            }),
            ..record(None, 1)
        };
        let r = store.update("yielded", &held.version, &released).await.unwrap();
        let read = store.get("yielded").await.unwrap().unwrap();
        assert_eq!(read.record.yielded, released.yielded);
        let object = ns.leases().get("yielded").await.unwrap();
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
        let a = ns
            .leases()
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
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin, "moving"));
    let s = Scratch::new();
    let head = format!(
        "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nkubeconfig = {:?}\n\n[defaults]\n\
         lease-duration = \"5s\"\nrenew-deadline = \"2s\"\nretry-period = \"300ms\"\ngrace = \"2s\"\n\
         request-timeout = \"500ms\"\n",
        ns.name,
        env.admin_kubeconfig.display().to_string()
    );
    moving::a_moved_plugin_never_runs_on_both(&s, &head);
}

/// A request through the `kubernetes` grant in flight at the force-stop (a
/// watch the guest waits on, ignoring the change) goes with its connection:
/// the API server's side (a proxy the test runs in front of it) sees the
/// connection reset at the force-stop time, not closed in order later. The
/// instance's client is its own, so the reset touches nothing else.
#[test]
fn a_kubernetes_request_in_flight_is_dropped_with_its_connection_at_the_force_stop() {
    let env = KubeEnv::load();
    let rt = runtime();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "grant-stop"));
    let s = Scratch::new();
    let (hole, proxied) = proxied_kubeconfig(&env, &s);
    let mut text = kube_config(&ns.name, Some(&env.admin_kubeconfig), "demo", &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"watcher\"\npath = {:?}\nlease = \"demo\"\n\
         env = {{ HTTP_MODE = \"hang\", HTTP_URL = \"http://kubernetes.baton/api/v1/namespaces/{}/configmaps?watch=true\" }}\n\
         kubernetes = {{ kubeconfig = {:?}, allow = [{{ verbs = [\"watch\"], groups = [\"\"], \
         resources = [\"configmaps\"], namespaces = [{:?}] }}] }}\n",
        guest("http_probe.wasm").display().to_string(),
        ns.name,
        proxied.display().to_string(),
        ns.name
    ));
    let cfg = s.write("baton.toml", &text);
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
