//! The etcd cluster started by `scripts/etcd-testenv.sh`: its endpoints,
//! certificates and members, from its env file.

use std::collections::BTreeMap;
use std::path::PathBuf;

const HELP: &str = "start the test cluster first: scripts/etcd-testenv.sh start \
                    (scripts/test.sh does it before running the tests)";

/// What the env file of a started cluster says.
pub struct EtcdEnv {
    /// The plain client URLs of the three members.
    pub endpoints: Vec<String>,
    /// Their TLS client URLs (client certificates required).
    pub tls_endpoints: Vec<String>,
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The members' process ids.
    pub pids: Vec<i32>,
    /// etcdctl.
    pub etcdctl: PathBuf,
    pub file: PathBuf,
}

impl EtcdEnv {
    /// Reads the env file (`BATON_ETCD_ENV`, default
    /// `$BATON_CACHE/etcd/run/env.sh`) and checks that the members run.
    /// Fails (never skips) when they do not.
    pub fn load() -> EtcdEnv {
        let file = std::env::var_os("BATON_ETCD_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join("etcd/run/env.sh"));
        let env = EtcdEnv::read(file);
        for pid in &env.pids {
            // SAFETY: signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(*pid, 0) } == 0;
            assert!(
                alive,
                "etcd member pid {pid} (from {}) is not running; {HELP}",
                env.file.display()
            );
        }
        env
    }

    /// Reads the env file `file`, whether its members run or not.
    pub fn read(file: PathBuf) -> EtcdEnv {
        let help = HELP;
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "no etcd test cluster: cannot read {}: {e}; {help}",
                file.display()
            )
        });
        let vars: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), unquote(v)))
            .collect();
        let var = |k: &str| {
            vars.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("{} does not set {k}; {help}", file.display()))
        };
        let list = |k: &str| var(k).split(',').map(str::to_owned).collect::<Vec<_>>();
        EtcdEnv {
            endpoints: list("ETCD_TEST_ENDPOINTS"),
            tls_endpoints: list("ETCD_TEST_TLS_ENDPOINTS"),
            ca: var("ETCD_TEST_CA").into(),
            client_cert: var("ETCD_TEST_CLIENT_CERT").into(),
            client_key: var("ETCD_TEST_CLIENT_KEY").into(),
            pids: var("ETCD_TEST_PIDS")
                .split_whitespace()
                .map(|p| p.parse().expect("a pid"))
                .collect(),
            etcdctl: var("ETCD_TEST_ETCDCTL").into(),
            file: file.clone(),
        }
    }

    /// etcdctl against the plain endpoints, with `args`: its output, or a
    /// panic with what it said.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoints.join(","))
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A value as the shell reads it: the script writes them with `printf
/// %q`, which escapes commas and spaces with a backslash.
fn unquote(v: &str) -> String {
    let v = v.trim().trim_matches(['"', '\'']);
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// The scripts' cache: `BATON_CACHE`, default `~/.cache/baton`.
fn cache_dir() -> PathBuf {
    std::env::var_os("BATON_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/baton"),
        PathBuf::from,
    )
}

/// A 3-member cluster of a test's own (`scripts/etcd-testenv.sh` under an
/// env file of its own), whose members the test kills, pauses and starts
/// again without disturbing other tests; stopped when dropped.
pub struct OwnCluster {
    file: PathBuf,
}

impl OwnCluster {
    pub fn start() -> OwnCluster {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let file = cache_dir().join(format!("etcd/run/own-{}-{n}.env", std::process::id()));
        let cluster = OwnCluster { file };
        cluster.script(&["start"]);
        cluster
    }

    /// Runs `scripts/etcd-testenv.sh ARGS` on this cluster: its output,
    /// or what it said when it failed.
    pub fn try_script(&self, args: &[&str]) -> Result<String, String> {
        let out =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/etcd-testenv.sh"))
                .args(args)
                .env("BATON_ETCD_ENV", &self.file)
                .output()
                .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "scripts/etcd-testenv.sh {args:?} (BATON_ETCD_ENV={}): {}",
                self.file.display(),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Runs `scripts/etcd-testenv.sh ARGS` on this cluster: its output.
    pub fn script(&self, args: &[&str]) -> String {
        self.try_script(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Its env file, read afresh (a revive changes the pids).
    pub fn env(&self) -> EtcdEnv {
        EtcdEnv::read(self.file.clone())
    }

    /// SIGKILL of member `n`.
    pub fn kill(&self, n: usize) {
        self.script(&["kill", &n.to_string()]);
    }

    /// SIGSTOP of member `n`.
    pub fn pause(&self, n: usize) {
        self.script(&["pause", &n.to_string()]);
    }

    /// SIGCONT of member `n`.
    pub fn resume(&self, n: usize) {
        self.script(&["resume", &n.to_string()]);
    }

    /// Starts every member that is gone and resumes every one paused, and
    /// waits for a healthy cluster.
    pub fn revive(&self) {
        self.script(&["revive"]);
    }

    /// The index of the raft leader (waiting up to 30 s for one: an
    /// election may be under way).
    pub fn leader(&self) -> usize {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match self.try_script(&["leader"]) {
                Ok(out) => return out.trim().parse().expect("a member index"),
                Err(e) => assert!(std::time::Instant::now() < until, "no raft leader for 30 s: {e}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The cluster's current revision.
    pub fn revision(&self) -> i64 {
        let out = self.env().etcdctl(&["get", "/", "-w", "json"]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("etcdctl's JSON");
        json["header"]["revision"].as_i64().expect("a revision")
    }

    /// The loopback address of each member's plain client listener.
    pub fn addresses(&self) -> Vec<std::net::SocketAddr> {
        self.env()
            .endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://").parse().expect("host:port"))
            .collect()
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/etcd-testenv.sh"))
                .arg("stop")
                .env("BATON_ETCD_ENV", &self.file)
                .output();
    }
}
