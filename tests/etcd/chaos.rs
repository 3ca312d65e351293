//! Chaos on the etcd store (the engine is tests/e2e/chaos/engine.rs), on a
//! 3-member cluster of the run's own ([`OwnCluster`]), so that killing its
//! members disturbs no other test. Besides the host faults: a member
//! killed and started again, the raft leader killed and started again, a
//! member frozen (SIGSTOP) past the renew deadline, two members killed (the
//! quorum lost) and started again, every member killed and started again,
//! a compaction to the current revision, the record deleted (`etcdctl
//! del`), a foreign client taking the record, and the path between one
//! host and the members black-holed (a proxy per member that holds every
//! byte without closing anything) and restored.

#[path = "../e2e/chaos/counter.rs"]
mod counter;
#[path = "../e2e/chaos/engine.rs"]
mod engine;
#[path = "../e2e/chaos/layout.rs"]
mod layout;
#[path = "../e2e/chaos/schedule.rs"]
mod schedule;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use rand::Rng;
use rand::rngs::StdRng;

use crate::env::OwnCluster;
use crate::faults::blackhole::BlackHole;
use crate::support::Scratch;
use engine::{Bed, Fault, HOST_FAULTS, Scenario};

/// The hosts' timings (the first of [`Bed::defaults`]).
const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(2);
const RP: Duration = Duration::from_millis(500);

/// The etcd store under a fresh key prefix of the own cluster for each
/// segment; each host reaches the members through black holes of its own.
struct EtcdBed {
    rt: tokio::runtime::Runtime,
    cluster: OwnCluster,
    prefix: String,
    /// Per host name: a proxy to each member.
    holes: HashMap<String, Vec<BlackHole>>,
}

impl EtcdBed {
    /// A fresh prefix for a segment, and its `[store]` table.
    fn fresh_store(&mut self, what: &str) -> String {
        self.holes.clear();
        self.prefix = format!("/baton-test/{what}-{:08x}/", rand::random::<u32>());
        format!(
            "[store]\nkind = \"etcd\"\nendpoints = [{}]\nprefix = {:?}\n",
            self.cluster
                .env()
                .endpoints
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.prefix
        )
    }

    fn lease_key(&self) -> String {
        format!("{}lease/demo", self.prefix)
    }

    /// Takes the record the way another client would: read, then a
    /// transaction comparing its revision that writes a holder of its own,
    /// a short lease and the next term (the floor left as it is). When it
    /// was written.
    fn foreign_write(&self, duration_secs: u64) -> Option<SystemTime> {
        let endpoints = self.cluster.env().endpoints;
        let key = self.lease_key();
        self.rt.block_on(async {
            let mut client = Client::connect(&endpoints, None).await.ok()?;
            for _ in 0..10 {
                let got = client.get(key.as_str(), None).await.ok()?;
                let kv = got.kvs().first()?;
                let old: serde_json::Value = serde_json::from_slice(kv.value()).ok()?;
                let now = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
                let record = serde_json::json!({
                    "write": format!("{:016x}", rand::random::<u64>()),
                    "holder": "foreign-writer",
                    "leaseDuration": format!("{duration_secs}s"),
                    "acquireTime": now,
                    "renewTime": now,
                    "transitions": old["transitions"].as_u64().unwrap_or(0) + 1,
                });
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then([TxnOp::put(key.as_str(), record.to_string(), None)]);
                if client.txn(txn).await.ok()?.succeeded() {
                    return Some(SystemTime::now());
                }
            }
            None
        })
    }
}

impl Bed for EtcdBed {
    fn store(&self) -> &'static str {
        "etcd"
    }

    fn faults(&self) -> Vec<Fault> {
        let mut all = HOST_FAULTS.to_vec();
        all.extend([
            Fault::MemberKill,
            Fault::EtcdLeaderKill,
            Fault::MemberStop,
            Fault::QuorumLoss,
            Fault::EtcdRestart,
            Fault::Compaction,
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
        let store = self.fresh_store("chaos");
        format!("{store}\n{}\n[[lease]]\nname = \"demo\"\n", self.defaults()[0])
    }

    fn store_table(&mut self, _: &Scratch) -> String {
        self.fresh_store("chaos-spread")
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

    fn env(&mut self, _: &Scratch, name: &str) -> Vec<(String, String)> {
        let cluster = &self.cluster;
        let holes = self
            .holes
            .entry(name.to_owned())
            .or_insert_with(|| cluster.addresses().into_iter().map(BlackHole::start).collect());
        let endpoints = holes
            .iter()
            .map(|h| format!("http://127.0.0.1:{}", h.port))
            .collect::<Vec<_>>()
            .join(",");
        vec![("BATON_ETCD_ENDPOINTS".into(), endpoints)]
    }

    fn inject(
        &mut self,
        fault: Fault,
        rng: &mut StdRng,
        hosts: &[&str],
        leader: usize,
    ) -> Option<SystemTime> {
        let ms = |rng: &mut StdRng, from: u64, to: u64| Duration::from_millis(rng.random_range(from..to));
        match fault {
            Fault::MemberKill | Fault::EtcdLeaderKill => {
                let raft = self.cluster.leader();
                let victim = if fault == Fault::EtcdLeaderKill {
                    raft
                } else {
                    (raft + rng.random_range(1..3)) % 3
                };
                self.cluster.kill(victim);
                std::thread::sleep(ms(rng, 0, 4000));
                self.cluster.revive();
                Some(SystemTime::now())
            }
            Fault::MemberStop => {
                let victim = rng.random_range(0..3);
                self.cluster.pause(victim);
                std::thread::sleep(RD + ms(rng, 100, 3000));
                self.cluster.resume(victim);
                Some(SystemTime::now())
            }
            Fault::QuorumLoss => {
                let spared = rng.random_range(0..3);
                for n in (0..3).filter(|n| *n != spared) {
                    self.cluster.kill(n);
                }
                // Sometimes shorter than the renew deadline (the leader
                // may keep its term), sometimes past the lease.
                std::thread::sleep(ms(rng, 200, (LD + RD).as_millis() as u64));
                self.cluster.revive();
                Some(SystemTime::now())
            }
            Fault::EtcdRestart => {
                for n in 0..3 {
                    self.cluster.kill(n);
                }
                std::thread::sleep(ms(rng, 0, 3000));
                self.cluster.revive();
                Some(SystemTime::now())
            }
            Fault::Compaction => {
                let rev = self.cluster.revision();
                self.cluster.env().etcdctl(&["compact", &rev.to_string()]);
                Some(SystemTime::now())
            }
            Fault::DeleteLease => {
                let at = SystemTime::now();
                self.cluster.env().etcdctl(&["del", &self.lease_key()]);
                Some(at)
            }
            Fault::ForeignWriter => self.foreign_write(rng.random_range(1..=3)),
            Fault::BlackHole => {
                // The leader half of the time: a follower's is cheap.
                let victim = if rng.random_bool(0.5) {
                    hosts[leader]
                } else {
                    hosts[rng.random_range(0..hosts.len())]
                };
                let holes = &self.holes[victim];
                for h in holes {
                    h.cut(true);
                }
                let at = SystemTime::now();
                std::thread::sleep(ms(rng, 1000, 6000));
                for h in holes {
                    h.cut(false);
                }
                Some(at)
            }
            other => panic!("not a fault of the etcd store: {other:?}"),
        }
    }

    fn end(&mut self) {
        for h in self.holes.values().flatten() {
            h.cut(false);
        }
        self.cluster.revive();
    }
}

fn bed() -> EtcdBed {
    EtcdBed {
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
        cluster: OwnCluster::start(),
        prefix: String::new(),
        holes: HashMap::new(),
    }
}

#[test]
fn chaos_on_the_etcd_store_never_overlaps_terms_or_lands_a_stale_write() {
    engine::run(&mut bed(), Scenario::OneLease);
}

#[test]
fn chaos_on_the_etcd_store_with_spread_leases_reloads_and_yields_never_runs_a_plugin_twice() {
    engine::run(&mut bed(), Scenario::Spread);
}
