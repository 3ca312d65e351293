//! What the configuration grants one plugin (`PluginSpec`), and the
//! grants in one line for the log.

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime::config::ConfigGrant;
use crate::runtime::http::HttpPolicy;
use crate::runtime::keyvalue::BucketGrant;
use crate::runtime::network::NetworkGrant;
use crate::runtime::output::OutputLimits;

/// A directory a plugin may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
    /// Whether the guest may only read it.
    pub read_only: bool,
}

/// What the host needs to know to run one plugin.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// The plugin's name, used in logs and errors.
    pub name: String,
    /// The component file.
    pub path: PathBuf,
    /// The manifest digest of a component pulled from a registry (logged
    /// with each task's start); `None` for a file.
    pub digest: Option<String>,
    /// The most linear memory one instance may use, in bytes.
    pub memory_limit: u64,
    /// Environment variables the guest sees (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Directories the guest may use (nothing else is visible).
    pub dirs: Vec<DirGrant>,
    /// Where the guest may connect (nowhere by default).
    pub network: NetworkGrant,
    /// Where the guest may send HTTP requests, and its limits (nowhere by
    /// default).
    pub http: HttpPolicy,
    /// How much the guest may print.
    pub output: OutputLimits,
    /// The send buffer of each of its TCP connections (`SO_SNDBUF`), in
    /// bytes: what one may still deliver if the host is paused or killed
    /// across its force-stop.
    pub send_buffer: u64,
    /// The buckets it may open (`wasi:keyvalue`) and their limits.
    pub keyvalue: BucketGrant,
    /// Its configuration values (`wasi:config`).
    pub config: ConfigGrant,
    /// Its health check's settings (`health-check`), if the host is to
    /// call the check its component exports (`baton:leader@0.4.0`).
    pub health_check: Option<HealthCheck>,
}

/// How a plugin's health check is called (its `health-check` table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// How often, while this host leads and the task runs.
    pub period: Duration,
    /// How long one check may take (less than `period`).
    pub timeout: Duration,
    /// How many failures in a row hand the lease over (at least 1).
    pub threshold: u32,
    /// How long this host then stays out of contention for the lease.
    pub back_off: Duration,
}

impl HealthCheck {
    /// The defaults of the fields not given: checked every 10 s, each
    /// within 2 s, 3 failures in a row hand over, then 1 min out.
    pub const DEFAULT: HealthCheck = HealthCheck {
        period: Duration::from_secs(10),
        timeout: Duration::from_secs(2),
        threshold: 3,
        back_off: Duration::from_secs(60),
    };
}

impl PluginSpec {
    /// What the plugin is granted, in one line for the log: environment
    /// variable names (not values), directories, network.
    ///
    /// ```
    /// use baton::runtime::{DirGrant, HttpPolicy, NetworkGrant, PluginSpec};
    ///
    /// let spec = PluginSpec {
    ///     name: "sync".into(),
    ///     path: "sync.wasm".into(),
    ///     digest: None,
    ///     memory_limit: 64 << 20,
    ///     env: vec![("TOKEN".into(), "secret".into())],
    ///     dirs: vec![DirGrant { host: "/srv/data".into(), guest: "/data".into(), read_only: true }],
    ///     network: NetworkGrant { connect: vec!["10.0.0.0/8:5432".parse().unwrap()], name_lookup: false },
    ///     http: HttpPolicy::new(&["https://api.example.com".parse().unwrap()], Default::default()).unwrap(),
    ///     output: Default::default(),
    ///     send_buffer: 64 << 10,
    ///     keyvalue: Default::default(),
    ///     config: Default::default(),
    ///     health_check: None,
    /// };
    /// assert_eq!(
    ///     spec.grants(),
    ///     "env TOKEN; dir /srv/data as /data (read-only); connect 10.0.0.0/8:5432; http https://api.example.com"
    /// );
    /// ```
    pub fn grants(&self) -> String {
        let mut parts = Vec::new();
        if !self.env.is_empty() {
            let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
            parts.push(format!("env {}", names.join(",")));
        }
        for d in &self.dirs {
            let mode = if d.read_only { "read-only" } else { "read-write" };
            parts.push(format!("dir {} as {} ({mode})", d.host.display(), d.guest));
        }
        if !self.network.connect.is_empty() {
            let to: Vec<String> = self.network.connect.iter().map(|g| g.to_string()).collect();
            parts.push(format!("connect {}", to.join(",")));
        }
        if self.network.name_lookup {
            parts.push("name-lookup".into());
        }
        let http: Vec<String> = self.http.grants().map(|g| g.to_string()).collect();
        if !http.is_empty() {
            parts.push(format!("http {}", http.join(",")));
        }
        if let Some(k) = self.http.kubernetes() {
            let rules: Vec<String> = k
                .rules
                .iter()
                .map(|r| {
                    format!(
                        "{} {} in {}",
                        r.verbs.join("/"),
                        r.resources.join("/"),
                        r.namespaces.join("/")
                    )
                })
                .collect();
            parts.push(format!("kubernetes {}", rules.join(",")));
        }
        if self.keyvalue.buckets != BucketGrant::default().buckets {
            parts.push(format!("keyvalue {}", self.keyvalue.buckets.join(",")));
        }
        let keys: Vec<&str> = self.config.keys().collect();
        if !keys.is_empty() {
            parts.push(format!("config {}", keys.join(",")));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join("; ")
        }
    }
}
