//! What every Kubernetes test starts from ([`KubeTest`]: the server, a
//! runtime, the admin's client, a namespace of its own and a scratch
//! directory), the configuration they write, and the helpers several test
//! files share: the hosts' runs and roles, the Lease objects as the admin
//! sees them, and the store opened on the test's namespace.

use super::*;

/// The `[defaults]` table of these tests: lease 4 s, renew deadline 2 s,
/// retry period 500 ms, grace 1 s, request timeout 500 ms.
pub const DEFAULTS: &str = "[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\n\
     retry-period = \"500ms\"\ngrace = \"1s\"\nrequest-timeout = \"500ms\"\n";

/// One test's world: the test server, a runtime for the requests the test
/// makes itself, the admin's client, a namespace of its own (deleted when
/// dropped) and a scratch directory.
pub struct KubeTest {
    /// Dropped first: its deletion runs on the runtime.
    pub ns: TestNamespace,
    pub admin: kube::Client,
    pub scratch: Scratch,
    pub rt: tokio::runtime::Runtime,
    pub env: KubeEnv,
}

impl KubeTest {
    /// A test on the shared test server, in a new namespace named after
    /// `prefix`.
    pub fn new(prefix: &str) -> KubeTest {
        KubeTest::on(KubeEnv::load(), prefix)
    }

    /// A test on the server `env` (one the test started itself).
    pub fn on(env: KubeEnv, prefix: &str) -> KubeTest {
        let rt = runtime();
        let admin = rt.block_on(env.admin());
        let ns = rt.block_on(TestNamespace::create(admin.clone(), prefix));
        KubeTest {
            ns,
            admin,
            scratch: Scratch::new(),
            rt,
            env,
        }
    }

    /// The `[store]` table on this test's namespace with the admin's
    /// kubeconfig, and [`DEFAULTS`]: what a configuration starts with.
    pub fn head(&self) -> String {
        format!(
            "{}\n{DEFAULTS}",
            store_table(&self.ns.name, Some(&self.env.admin_kubeconfig), false)
        )
    }

    /// A configuration as the admin with one lease and `plugins` (see
    /// [`kube_config`]).
    pub fn config(&self, lease: &str, plugins: &[PluginDef]) -> String {
        kube_config(&self.ns.name, Some(&self.env.admin_kubeconfig), lease, plugins)
    }

    /// The store on this test's namespace, as the admin (see [`store`]).
    pub fn store(&self, labels: &[(&str, &str)]) -> KubeStore {
        store(self.admin.clone(), &self.ns.name, labels)
    }

    /// The Lease `name` in this test's namespace, if it exists.
    pub fn lease(&self, name: &str) -> Option<Lease> {
        lease_of(&self.rt, &self.ns, name)
    }

    /// Three hosts (host-a, host-b, host-c) with one cooperative probe on
    /// lease "demo", as the admin, with their admin endpoints (for
    /// [`HostCounts`]); the configuration and the hosts.
    pub fn three_hosts(&self) -> (std::path::PathBuf, Vec<Host>) {
        let cfg = self.scratch.write(
            "baton.toml",
            &self.config("demo", &[probe("probe", "pollable", "cooperative")]),
        );
        let hosts = ["host-a", "host-b", "host-c"]
            .iter()
            .map(|n| host_with_admin(n, &cfg))
            .collect();
        (cfg, hosts)
    }
}

/// A host of identity `name` on `cfg` with its admin endpoints on a free
/// port: its `/metrics` tell what it did ([`HostCounts`]).
pub fn host_with_admin(name: &str, cfg: &Path) -> Host {
    let admin_args = [OsStr::new("--admin-address"), OsStr::new("127.0.0.1:0")];
    Host::start_with_args(name, cfg, &shared_cache_dir(), &admin_args)
}

/// The `[store]` table on namespace `ns`, with `kubeconfig` (else it is
/// left to `--kubeconfig`) and, if `labelled`, the label `app=baton-test`.
pub fn store_table(ns: &str, kubeconfig: Option<&Path>, labelled: bool) -> String {
    let mut text = format!("[store]\nkind = \"kubernetes\"\nnamespace = {ns:?}\n");
    if let Some(kc) = kubeconfig {
        text.push_str(&format!("kubeconfig = {:?}\n", kc.display().to_string()));
    }
    if labelled {
        text.push_str("labels = { app = \"baton-test\" }\n");
    }
    text
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A configuration on the kubernetes store with one lease and the given
/// plugins; `kubeconfig` may be left to `--kubeconfig`.
pub fn kube_config(ns: &str, kubeconfig: Option<&Path>, lease: &str, plugins: &[PluginDef]) -> String {
    let mut text = format!(
        "{}\n{DEFAULTS}\n[[lease]]\nname = {lease:?}\n",
        store_table(ns, kubeconfig, true)
    );
    text.push_str(&plugin_tables(lease, plugins));
    text
}

/// What `hosts` logged between `from` and `to` but their guests' lines,
/// in time order: the story of a slow hand-over.
pub fn story(hosts: &[Host], from: SystemTime, to: SystemTime) -> String {
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
pub fn settled(hosts: &[Host]) -> Event {
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

pub fn is_start(e: &Event) -> bool {
    e.guest_line("probe", "probe start")
}

/// Which hosts run the probe now (started and not stopped); a killed host
/// runs nothing.
pub fn running(hosts: &[Host]) -> Vec<String> {
    hosts
        .iter()
        .filter(|h| h.all(is_start).len() > h.all(|e| e.is(STOPPED, Some("probe"))).len())
        .map(|h| h.name.clone())
        .collect()
}

/// Every guest run of every host: (start, end, term, host). A run without a
/// stop event ends at `ends[host]` (when it was killed) or `now`.
pub fn runs(hosts: &[Host], killed: &[(String, SystemTime)]) -> Vec<(SystemTime, SystemTime, u64, String)> {
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
pub fn assert_one_at_a_time(
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
pub fn wait_any(
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

pub fn lease_of(rt: &tokio::runtime::Runtime, ns: &TestNamespace, name: &str) -> Option<Lease> {
    rt.block_on(ns.leases().get_opt(name)).unwrap()
}

pub fn spec_of(lease: &Lease) -> LeaseSpec {
    lease.spec.clone().unwrap_or_default()
}

pub fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    format!(
        "min {:.1} / median {:.1} / max {:.1} ms over {}",
        ms[0],
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len()
    )
}

pub fn store(client: kube::Client, ns: &str, labels: &[(&str, &str)]) -> KubeStore {
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

/// A record of `holder` in `term` for [`LD`], acquired and renewed now.
pub fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
    LeaseRecord {
        acquire_time: Some(SystemTime::now()),
        renew_time: Some(SystemTime::now()),
        ..LeaseRecord::new(holder, term, LD)
    }
}

pub fn foreign_lease(name: &str, spec: LeaseSpec) -> Lease {
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

pub async fn next_within(watch: &mut LeaseWatch, secs: u64) -> Option<Versioned> {
    tokio::time::timeout(Duration::from_secs(secs), watch.next())
        .await
        .expect("the watch yields in time")
        .expect("the watch goes on")
        .expect("no error")
}

/// Writes `spec` over the Lease `name` as a raw client would, with the
/// labels `labels` (none of baton's), reading again on a 409; the version
/// written.
pub async fn foreign_write(
    ns: &TestNamespace,
    name: &str,
    labels: &[(&str, &str)],
    spec: LeaseSpec,
) -> String {
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

pub fn held_by(holder: &str, transitions: i32, seconds: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(seconds),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// The data of `lease`'s term floor ConfigMap, if it has one.
pub async fn floor_of(
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
