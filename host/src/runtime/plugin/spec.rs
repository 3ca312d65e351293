//! What the configuration says of one plugin (`PluginSpec`): its file, its
//! memory limit, its health check and each capability's grant.

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime::guest::Grants;

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
    /// What each capability grants it (nothing by default).
    pub grants: Grants,
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
    /// variable names (not values), directories, network, and so on, each
    /// capability in the order registered.
    ///
    /// ```
    /// use baton::runtime::{DirGrant, Grants, HttpPolicy, NetworkGrant, PluginSpec, SocketsGrant};
    ///
    /// let spec = PluginSpec {
    ///     name: "sync".into(),
    ///     path: "sync.wasm".into(),
    ///     digest: None,
    ///     memory_limit: 64 << 20,
    ///     grants: Grants {
    ///         env: vec![("TOKEN".into(), "secret".into())],
    ///         files: vec![DirGrant { host: "/srv/data".into(), guest: "/data".into(), read_only: true }],
    ///         sockets: SocketsGrant {
    ///             network: NetworkGrant { connect: vec!["10.0.0.0/8:5432".parse().unwrap()], name_lookup: false },
    ///             ..Default::default()
    ///         },
    ///         http: HttpPolicy::new(&["https://api.example.com".parse().unwrap()], Default::default()).unwrap(),
    ///         ..Default::default()
    ///     },
    ///     health_check: None,
    /// };
    /// assert_eq!(
    ///     spec.grants(),
    ///     "env TOKEN; dir /srv/data as /data (read-only); connect 10.0.0.0/8:5432; http https://api.example.com"
    /// );
    /// ```
    pub fn grants(&self) -> String {
        let parts = self.grants.describe();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join("; ")
        }
    }
}
