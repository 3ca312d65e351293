//! Chaos on the Kubernetes store (the engine is tests/e2e/chaos/engine.rs),
//! on an API server and etcd of the run's own, started here with
//! `scripts/kube-testenv.sh` under an env file of its own, so that killing
//! them disturbs no other test. Besides the host faults: the API server
//! frozen (SIGSTOP) past the renew deadline, the API server killed and
//! started again, etcd killed and started again, the Lease deleted, a
//! foreign writer taking the Lease, and the path between one host and the
//! API server black-holed (a proxy that holds every byte without closing
//! anything) and restored.

#[path = "../e2e/chaos/counter.rs"]
mod counter;
#[path = "../e2e/chaos/engine.rs"]
mod engine;
#[path = "../e2e/chaos/layout.rs"]
mod layout;
#[path = "../e2e/chaos/schedule.rs"]
mod schedule;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, PostParams};
use rand::Rng;
use rand::rngs::StdRng;

use crate::blackhole::BlackHole;
use crate::env::{KubeEnv, OwnServer, TestNamespace};
use crate::support::Scratch;
use engine::{Bed, Fault, HOST_FAULTS, Scenario};

/// The hosts' timings (see `kube_config`).
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);

/// The Kubernetes store, in a fresh namespace of the own server for each
/// segment; each host reaches it through a black hole of its own.
struct KubeBed {
    rt: tokio::runtime::Runtime,
    server: OwnServer,
    ns: Option<TestNamespace>,
    holes: HashMap<String, BlackHole>,
}

impl KubeBed {
    fn leases(&self) -> Api<Lease> {
        self.ns.as_ref().expect("a segment's namespace").leases()
    }

    fn signal(pid: i32, sig: i32) {
        // SAFETY: a plain kill(2) of a process this run started.
        unsafe { libc::kill(pid, sig) };
    }

    /// The admin kubeconfig with its server replaced by `port` on loopback.
    fn kubeconfig_via(env: &KubeEnv, port: u16, path: &Path) {
        let (admin, server) = env.admin_server();
        std::fs::write(path, admin.replace(&server, &format!("https://127.0.0.1:{port}"))).unwrap();
    }

    fn upstream(env: &KubeEnv) -> std::net::SocketAddr {
        env.admin_server()
            .1
            .trim_start_matches("https://")
            .parse()
            .unwrap()
    }

    /// Takes the Lease the way another client would: read, then write
    /// with the read resourceVersion, a holder of its own, a short lease and
    /// the next transition; again on a conflict. When it was written.
    fn foreign_write(&self, duration_secs: i32) -> Option<SystemTime> {
        let leases = self.leases();
        self.rt.block_on(async {
            for _ in 0..10 {
                let mut lease = leases.get_opt("demo").await.ok()??;
                let spec = lease.spec.get_or_insert_with(Default::default);
                let now = MicroTime(chrono_now());
                spec.holder_identity = Some("foreign-writer".into());
                spec.lease_duration_seconds = Some(duration_secs);
                spec.acquire_time = Some(now.clone());
                spec.renew_time = Some(now);
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                match leases.replace("demo", &PostParams::default(), &lease).await {
                    Ok(_) => return Some(SystemTime::now()),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(_) => return None,
                }
            }
            None
        })
    }
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

impl Bed for KubeBed {
    fn store(&self) -> &'static str {
        "kubernetes"
    }

    fn faults(&self) -> Vec<Fault> {
        let mut all = HOST_FAULTS.to_vec();
        all.extend([
            Fault::ApiServerStop,
            Fault::ApiServerRestart,
            Fault::EtcdRestart,
            Fault::DeleteLease,
            Fault::ForeignWriter,
            Fault::BlackHole,
        ]);
        all
    }

    fn timings(&self) -> (Duration, Duration) {
        (LD, RP)
    }

    fn config(&mut self, _: &Scratch) -> String {
        let env = self.server.env();
        let admin = self.rt.block_on(env.admin());
        self.ns = None;
        self.holes.clear();
        let ns = self.rt.block_on(TestNamespace::create(admin, "chaos"));
        let text = crate::kube_config(&ns.name, None, "demo", &[]);
        self.ns = Some(ns);
        text
    }

    fn store_table(&mut self, _: &Scratch) -> String {
        let env = self.server.env();
        let admin = self.rt.block_on(env.admin());
        self.ns = None;
        self.holes.clear();
        let ns = self.rt.block_on(TestNamespace::create(admin, "chaos-spread"));
        let text = format!(
            "[store]\nkind = \"kubernetes\"\nnamespace = {:?}\nlabels = {{ app = \"baton-test\" }}\n",
            ns.name
        );
        self.ns = Some(ns);
        text
    }

    fn defaults(&self) -> [String; 2] {
        [
            "[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"2s\"\nretry-period = \"500ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"500ms\"\n"
                .into(),
            "[defaults]\nlease-duration = \"5s\"\nrenew-deadline = \"2500ms\"\nretry-period = \"600ms\"\n\
             grace = \"1s\"\nrequest-timeout = \"600ms\"\n"
                .into(),
        ]
    }

    fn env(&mut self, s: &Scratch, name: &str) -> Vec<(String, String)> {
        let env = self.server.env();
        let hole = self
            .holes
            .entry(name.to_owned())
            .or_insert_with(|| BlackHole::start(Self::upstream(&env)));
        let path = s.dir.path().join(format!("{name}.kubeconfig"));
        Self::kubeconfig_via(&env, hole.port, &path);
        vec![("KUBECONFIG".into(), path.display().to_string())]
    }

    fn inject(
        &mut self,
        fault: Fault,
        rng: &mut StdRng,
        hosts: &[&str],
        _leader: usize,
    ) -> Option<SystemTime> {
        let env = self.server.env();
        match fault {
            Fault::ApiServerStop => {
                Self::signal(env.apiserver_pid, libc::SIGSTOP);
                std::thread::sleep(RD + Duration::from_millis(rng.random_range(100..3000)));
                Self::signal(env.apiserver_pid, libc::SIGCONT);
                Some(SystemTime::now())
            }
            Fault::ApiServerRestart | Fault::EtcdRestart => {
                let pid = if fault == Fault::ApiServerRestart {
                    env.apiserver_pid
                } else {
                    env.etcd_pid
                };
                Self::signal(pid, libc::SIGKILL);
                std::thread::sleep(Duration::from_millis(rng.random_range(0..3000)));
                self.server.script("revive", "");
                Some(SystemTime::now())
            }
            Fault::DeleteLease => {
                let leases = self.leases();
                let at = SystemTime::now();
                let _ = self.rt.block_on(leases.delete("demo", &DeleteParams::default()));
                Some(at)
            }
            Fault::ForeignWriter => self.foreign_write(rng.random_range(1..=3)),
            Fault::BlackHole => {
                let victim = hosts[rng.random_range(0..hosts.len())];
                let hole = &self.holes[victim];
                hole.cut(true);
                let at = SystemTime::now();
                std::thread::sleep(Duration::from_millis(rng.random_range(1000..6000)));
                hole.cut(false);
                Some(at)
            }
            other => panic!("not a fault of the Kubernetes store: {other:?}"),
        }
    }

    fn end(&mut self) {
        for hole in self.holes.values() {
            hole.cut(false);
        }
    }
}

fn bed() -> KubeBed {
    KubeBed {
        rt: crate::runtime(),
        server: OwnServer::start(""),
        ns: None,
        holes: HashMap::new(),
    }
}

#[test]
fn chaos_on_the_kubernetes_store_never_overlaps_terms_or_lands_a_stale_write() {
    engine::run(&mut bed(), Scenario::OneLease);
}

#[test]
fn chaos_on_the_kubernetes_store_with_spread_leases_reloads_and_yields_never_runs_a_plugin_twice() {
    engine::run(&mut bed(), Scenario::Spread);
}
