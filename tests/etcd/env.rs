//! The etcd cluster started by `scripts/etcd-testenv.sh`: its endpoints,
//! certificates and members, from its env file.

use std::collections::BTreeMap;
use std::path::PathBuf;

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
        let help = "start the test cluster first: scripts/etcd-testenv.sh start \
                    (scripts/test.sh does it before running the tests)";
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
        let env = EtcdEnv {
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
        };
        for pid in &env.pids {
            // SAFETY: signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(*pid, 0) } == 0;
            assert!(
                alive,
                "etcd member pid {pid} (from {}) is not running; {help}",
                file.display()
            );
        }
        env
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
