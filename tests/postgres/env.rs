//! The PostgreSQL environment started by `scripts/pg-testenv.sh`: its
//! URLs and certificates from its env file, and its fault commands.

use std::collections::BTreeMap;
use std::path::PathBuf;

const HELP: &str = "start the test server first: scripts/pg-testenv.sh start \
                    (scripts/test.sh does it before running the tests)";

/// What the env file of a started environment says.
#[derive(Clone)]
pub struct PgEnv {
    /// The application role on the primary.
    pub url: String,
    /// A superuser on the primary.
    pub admin_url: String,
    /// A role that may connect but create nothing.
    pub limited_url: String,
    /// Both nodes, read-write wanted (follows a failover).
    pub failover_url: String,
    /// Through pgbouncer in transaction mode.
    pub pooler_url: String,
    /// The CA of the servers' certificate.
    pub ca: PathBuf,
    pub primary_port: u16,
    pub psql: PathBuf,
    pub file: PathBuf,
}

impl PgEnv {
    /// Reads the env file (`BATON_PG_ENV`, default
    /// `$BATON_CACHE/postgres/run/env.sh`) and checks that the primary
    /// runs. Fails (never skips) when it does not.
    pub fn load() -> PgEnv {
        let file = std::env::var_os("BATON_PG_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join("postgres/run/env.sh"));
        let env = PgEnv::read(file);
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", env.primary_port)).is_ok(),
            "the PostgreSQL primary on port {} (from {}) does not accept connections; {HELP}",
            env.primary_port,
            env.file.display()
        );
        env
    }

    /// Reads the env file `file`, whether its servers run or not.
    pub fn read(file: PathBuf) -> PgEnv {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "no PostgreSQL test server: cannot read {}: {e}; {HELP}",
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
                .unwrap_or_else(|| panic!("{} does not set {k}; {HELP}", file.display()))
        };
        PgEnv {
            url: var("PG_TEST_URL"),
            admin_url: var("PG_TEST_ADMIN_URL"),
            limited_url: var("PG_TEST_LIMITED_URL"),
            failover_url: var("PG_TEST_FAILOVER_URL"),
            pooler_url: var("PG_TEST_POOLER_URL"),
            ca: var("PG_TEST_CA").into(),
            primary_port: var("PG_TEST_PRIMARY_PORT").parse().expect("a port"),
            psql: var("PG_TEST_PSQL").into(),
            file: file.clone(),
        }
    }

    /// psql as the administrator on the primary running `sql`: its
    /// output (unaligned, tuples only), or a panic with what it said.
    pub fn psql(&self, sql: &str) -> String {
        let out = std::process::Command::new(&self.psql)
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.admin_url,
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

/// A value as the shell reads it: the script writes them with `printf
/// %q`, which escapes some characters with a backslash.
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

/// A primary, standby and pooler of a test's own (`scripts/pg-testenv.sh`
/// under an env file of its own), which the test stops, pauses and fails
/// over without disturbing other tests; stopped when dropped.
pub struct OwnServer {
    file: PathBuf,
}

impl OwnServer {
    pub fn start() -> OwnServer {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let file = cache_dir().join(format!("postgres/run/own-{}-{n}.env", std::process::id()));
        let server = OwnServer { file };
        server.script(&["start"]);
        server
    }

    /// The environment as its env file says now (a failover rewrites it).
    pub fn env(&self) -> PgEnv {
        PgEnv::read(self.file.clone())
    }

    /// Runs `scripts/pg-testenv.sh` with `args` on this environment: its
    /// output, or a panic with what it said.
    pub fn script(&self, args: &[&str]) -> String {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-testenv.sh");
        let out = std::process::Command::new(script)
            .args(args)
            .env("BATON_PG_ENV", &self.file)
            .output()
            .expect("run scripts/pg-testenv.sh");
        assert!(
            out.status.success(),
            "pg-testenv.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-testenv.sh");
        let _ = std::process::Command::new(script)
            .arg("stop")
            .env("BATON_PG_ENV", &self.file)
            .output();
    }
}
