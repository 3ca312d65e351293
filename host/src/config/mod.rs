//! The TOML configuration: identity, lease store, leases with their
//! timings, and plugins with their lease, limits and grants. Every field,
//! its default and its errors: `docs/configuration.md`.
//!
//! Invariants: a [`Config`] is checked in full (every lease's timings obey
//! the timing rules, every plugin names a declared lease, every grant
//! parses) before anything uses it; relative paths are resolved against
//! the configuration file's folder; every error ([`ConfigError`]) names the
//! file, and where it can, the line and the lease, plugin or field.

mod error;
mod etcd;
mod health_check;
mod overrides;
pub mod own_files;
mod parse;
mod postgres;
mod raw_plugin;
mod registry;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::election::Timings;
use crate::election::spread::{
    DEFAULT_FORGET_AFTER, DEFAULT_HEAD_START, MEMBER_PREFIX, Placement, SpreadConfig,
};
use crate::runtime::{DEFAULT_MEMORY_LIMIT, PluginSpec};
use crate::store::validate_lease_name;

pub use error::{AdminAddressError, AdvertiseAddressError, ConfigError, ConfigErrorKind, InvalidNamespace};
pub use etcd::etcd_endpoint;
pub use overrides::{LoadError, OverrideError, Overrides};
use raw_plugin::RawPlugin;
pub use registry::{OciSource, RegistryConfig};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawConfig {
    identity: Option<String>,
    cache_dir: Option<PathBuf>,
    coredump_dir: Option<PathBuf>,
    instance_pool: Option<bool>,
    admin_address: Option<Spanned<toml::Value>>,
    advertise_address: Option<Spanned<String>>,
    control_socket: Option<PathBuf>,
    watch: Option<bool>,
    weight: Option<i64>,
    store: Option<RawStore>,
    #[serde(default)]
    defaults: RawTimings,
    #[serde(default, rename = "lease")]
    leases: Vec<RawLease>,
    #[serde(default, rename = "plugin")]
    plugins: Vec<RawPlugin>,
    #[serde(default)]
    spread: RawSpread,
    registry: Option<registry::RawRegistry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawSpread {
    enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    head_start: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    settle: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    forget_after: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, tag = "kind")]
enum RawStore {
    #[serde(rename = "embedded")]
    Embedded { dir: Option<PathBuf> },
    #[serde(rename = "kubernetes")]
    Kubernetes {
        namespace: Option<String>,
        kubeconfig: Option<PathBuf>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        pod: Option<String>,
        #[serde(rename = "pod-namespace")]
        pod_namespace: Option<String>,
    },
    #[serde(rename = "etcd")]
    Etcd {
        endpoints: Option<Vec<String>>,
        prefix: Option<String>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        user: Option<String>,
        #[serde(rename = "password-file")]
        password_file: Option<PathBuf>,
        #[serde(default, rename = "dial-timeout", with = "humantime_serde")]
        dial_timeout: Option<Duration>,
        #[serde(default, rename = "request-timeout", with = "humantime_serde")]
        request_timeout: Option<Duration>,
    },
    #[serde(rename = "postgres")]
    Postgres {
        url: Option<String>,
        #[serde(rename = "url-file")]
        url_file: Option<PathBuf>,
        schema: Option<String>,
        ca: Option<PathBuf>,
        #[serde(rename = "pool-size")]
        pool_size: Option<usize>,
        #[serde(default, rename = "connect-timeout", with = "humantime_serde")]
        connect_timeout: Option<Duration>,
        #[serde(default, rename = "request-timeout", with = "humantime_serde")]
        request_timeout: Option<Duration>,
        watch: Option<String>,
        #[serde(default, rename = "poll-interval", with = "humantime_serde")]
        poll_interval: Option<Duration>,
    },
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore::Embedded { dir: None }
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawTimings {
    #[serde(default, with = "humantime_serde")]
    lease_duration: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    renew_deadline: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    retry_period: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    grace: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    request_timeout: Option<Duration>,
}

impl RawTimings {
    /// These timings over `base`'s. An unset request timeout is derived
    /// from the result: the retry period, capped at half the renew deadline
    /// (so a renewal that times out leaves room for another).
    fn over(&self, base: &RawTimings) -> Timings {
        let d = Timings::default();
        let renew_deadline = self
            .renew_deadline
            .or(base.renew_deadline)
            .unwrap_or(d.renew_deadline);
        let retry_period = self.retry_period.or(base.retry_period).unwrap_or(d.retry_period);
        Timings {
            lease_duration: self
                .lease_duration
                .or(base.lease_duration)
                .unwrap_or(d.lease_duration),
            renew_deadline,
            retry_period,
            grace: self.grace.or(base.grace).unwrap_or(d.grace),
            request_timeout: self
                .request_timeout
                .or(base.request_timeout)
                .unwrap_or_else(|| retry_period.min(renew_deadline / 2)),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawLease {
    name: Spanned<String>,
    #[serde(default)]
    route_label: bool,
    #[serde(default)]
    prefer: Vec<String>,
    #[serde(default)]
    avoid: Vec<String>,
    #[serde(flatten)]
    timings: RawTimings,
}

/// `catch-up`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RawCatchUp {
    Latest,
    All,
}

/// `overlap`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RawOverlap {
    Skip,
    QueueOne,
    Replace,
}

/// When a new version of a plugin (its file or its settings changed, seen
/// by a reload) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum ReloadMode {
    /// From the lease's next term (the default): the running task is left
    /// alone.
    #[default]
    #[serde(rename = "next-term")]
    NextTerm,
    /// At once: a host that leads the lease hands it over (its tasks are
    /// told, then drained; the lease released) and contends again.
    #[serde(rename = "now")]
    Now,
}

/// Where leases are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreConfig {
    /// A directory on this machine.
    Embedded {
        /// The directory.
        dir: PathBuf,
    },
    /// `coordination.k8s.io/v1` Lease objects on a Kubernetes API server.
    Kubernetes {
        /// The namespace of the Lease objects; `None`: the kubeconfig
        /// context's namespace, the in-cluster service account's, or
        /// `default`.
        namespace: Option<String>,
        /// The kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, or
        /// the in-cluster service account.
        kubeconfig: Option<PathBuf>,
        /// Labels written on the Lease objects.
        labels: BTreeMap<String, String>,
        /// This host's pod, for route labels; `None`: the `POD_NAME`
        /// environment variable.
        pod: Option<String>,
        /// The pod's namespace; `None`: `POD_NAMESPACE`, else the store's
        /// namespace.
        pod_namespace: Option<String>,
    },
    /// Keys of an etcd v3 cluster. Settings left out here are taken from
    /// the `ETCDCTL_*` environment variables when the store is opened
    /// ([`EtcdConfig::options`]).
    Etcd(EtcdConfig),
    /// Rows of a PostgreSQL database. Settings left out here are taken
    /// from libpq's environment when the store is opened
    /// ([`PostgresConfig::options`]).
    Postgres(PostgresConfig),
}

/// `[store] kind = "postgres"`: how to reach the database and where the
/// leases live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A connection URL (`postgres://user@host:port/db?sslmode=...`) or
    /// libpq key-value string; `None`: read from `url_file`, else libpq's
    /// variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
    /// `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGPASSFILE`).
    pub url: Option<String>,
    /// A file holding the URL (it may hold a password).
    pub url_file: Option<PathBuf>,
    /// The schema of baton's tables (default `baton`).
    pub schema: String,
    /// The CA of the server's certificate; `None`: the URL's
    /// `sslrootcert`, `PGSSLROOTCERT`, else the Web PKI roots.
    pub ca: Option<PathBuf>,
    /// The most connections of the store's pool (default 4).
    pub pool_size: usize,
    /// The bound on connecting (default 5 s).
    pub connect_timeout: Duration,
    /// The bound on the store's own requests (default 5 s).
    pub request_timeout: Duration,
    /// How changes are heard: `"notify"` (default) or `"poll"`.
    pub watch: crate::store::postgres::WatchMode,
    /// How often a polling store reads (default 1 s).
    pub poll_interval: Duration,
}

/// `[store] kind = "etcd"`: how to reach the cluster and where the leases
/// live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs (`http://` or `https://`); empty: `ETCDCTL_ENDPOINTS`,
    /// else `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// The prefix of every key (default `/baton/`).
    pub prefix: String,
    /// The CA of the servers' certificates; `None`: `ETCDCTL_CACERT`, else
    /// the Web PKI roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (with `key`); `None`: `ETCDCTL_CERT`.
    pub cert: Option<PathBuf>,
    /// The client certificate's key; `None`: `ETCDCTL_KEY`.
    pub key: Option<PathBuf>,
    /// The etcd user; `None`: `ETCDCTL_USER` (`name` or `name:password`).
    pub user: Option<String>,
    /// A file holding the user's password; `None`: `ETCDCTL_PASSWORD`, or
    /// the password in `ETCDCTL_USER`.
    pub password_file: Option<PathBuf>,
    /// The bound on connecting; `None`: `ETCDCTL_DIAL_TIMEOUT`, else 2 s.
    pub dial_timeout: Option<Duration>,
    /// The bound on the store's own requests (listings, its watch, bucket
    /// requests, `baton status` and `baton kv`); `None`:
    /// `ETCDCTL_COMMAND_TIMEOUT`, else 5 s. The electors' requests keep
    /// each lease's `request-timeout`, and the watch's bound is the
    /// shortest of those if shorter.
    pub request_timeout: Option<Duration>,
}

/// One lease and its timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease's name.
    pub name: String,
    /// Its validated timings.
    pub timings: Timings,
    /// Which hosts it goes to first, and which it avoids, when the leads
    /// are spread (`prefer`, `avoid`).
    pub placement: Placement,
    /// Whether the leader's pod carries the lease's route label
    /// (`route-label`; Kubernetes only).
    pub route_label: bool,
}

/// One plugin and the lease that gates it.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// What the runtime needs.
    pub spec: PluginSpec,
    /// The lease that gates it.
    pub lease: String,
    /// When a new version of it runs after a reload.
    pub reload: ReloadMode,
    /// Its schedule: `None` runs its task once per term.
    pub schedule: Option<crate::schedule::Schedule>,
    /// Where its component comes from when its `path` is an `oci://`
    /// reference; `spec.path` is then the pulled file, once pulled.
    pub source: Option<OciSource>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// This host's identity, unique per process.
    pub identity: String,
    /// Whether the identity was set (in the file or on the command line),
    /// rather than made up at random.
    pub identity_declared: bool,
    /// Where compiled code is cached.
    pub cache_dir: Option<PathBuf>,
    /// Where a core dump of each trapping instance is written, if anywhere.
    pub coredump_dir: Option<PathBuf>,
    /// Whether instances run from a pool of slots sized at start (the
    /// default; see [`crate::runtime::PoolLimits`]) rather than being
    /// allocated on demand.
    pub instance_pool: bool,
    /// Where the admin endpoints (`/metrics`, `/healthz`, `/readyz`) are
    /// served; `None`: nowhere (the default). Port 0 picks a free port,
    /// logged at start.
    pub admin_address: Option<SocketAddr>,
    /// How others reach this host's service (`advertise-address`, or
    /// `--advertise-address`), published in every record it holds; `None`:
    /// the `POD_IP` environment variable if set, else no address (see
    /// [`Config::advertised`]).
    pub advertise_address: Option<String>,
    /// The control socket (`baton yield`) as the file sets it
    /// (`control-socket`); `None`: the default, see
    /// [`crate::daemon::control::ControlSocket::bind_default`].
    pub control_socket: Option<PathBuf>,
    /// Where leases are kept.
    pub store: StoreConfig,
    /// Whether the file has a `[store]` section (without one, the store is
    /// the default: an embedded store beside the file).
    pub store_declared: bool,
    /// The leases this host contends for.
    pub leases: Vec<LeaseConfig>,
    /// The plugins it runs.
    pub plugins: Vec<PluginConfig>,
    /// How the leads are spread over the hosts; `None`: not at all (one
    /// lease, or turned off).
    pub spread: Option<SpreadConfig>,
    /// This host's membership record, kept while spreading, or while a
    /// plugin asks for the live hosts (`baton:leader@0.2.0`) when not:
    /// the same settings as `spread`. `None` only when the `[defaults]`
    /// timings are unsafe and spreading is off.
    pub membership: Option<SpreadConfig>,
    /// This host's weight when the leads are spread (`weight`, 1 by
    /// default): its share of the leases is in proportion.
    pub weight: u32,
    /// Whether the host watches its configuration file and plugin files
    /// and reloads when they change (`watch = true`, or `--watch`).
    pub watch: bool,
    /// How it talks to registries (`[registry]`).
    pub registry: RegistryConfig,
}

/// The timings of a host's membership record, from the `[defaults]`
/// timings `base`: half the lease duration (in whole seconds from 2 s up,
/// as a Kubernetes Lease holds them), so that the other hosts stop counting
/// a dead host before its leases expire and its leases go to the hosts
/// that prefer them under the new count; half the renew deadline; the same
/// retry period; no grace (the record gates no task). Where that breaks
/// the timing rules, `base` with no grace.
fn member_timings(base: Timings) -> Timings {
    let half = base.lease_duration / 2;
    let lease_duration = if half >= Duration::from_secs(1) {
        Duration::from_secs(half.as_secs())
    } else {
        half
    };
    let renew_deadline = lease_duration / 2;
    let short = Timings {
        lease_duration,
        renew_deadline,
        retry_period: base.retry_period,
        grace: Duration::ZERO,
        request_timeout: base.request_timeout.min(renew_deadline / 2),
    };
    if short.validate().is_ok() {
        short
    } else {
        Timings {
            grace: Duration::ZERO,
            ..base
        }
    }
}

/// A default identity, unique per process: host name, process id and a
/// random suffix (two processes with one identity would flip-flop).
pub fn default_identity() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let suffix: u32 = rand::random::<u32>() & 0xff_ffff;
    format!("{host}-{}-{suffix:06x}", std::process::id())
}

/// Checks a Kubernetes namespace name: an RFC 1123 label (at most 63
/// characters of a-z, 0-9 and '-', starting and ending with a letter or
/// digit).
fn validate_namespace(ns: &str) -> Result<(), InvalidNamespace> {
    if ns.len() > 63 || ns.contains('.') || validate_lease_name(ns).is_err() {
        return Err(InvalidNamespace(ns.to_owned()));
    }
    Ok(())
}

/// Checks an advertised address (`advertise-address`): any text others
/// can use to reach the host (`10.1.2.3:8080`, `http://node-a:8080`,
/// `10.1.2.3`), not empty and without whitespace.
pub fn validate_advertise_address(text: &str) -> Result<(), AdvertiseAddressError> {
    if text.is_empty() {
        return Err(AdvertiseAddressError::Empty);
    }
    if text.chars().any(char::is_whitespace) {
        return Err(AdvertiseAddressError::Whitespace(text.to_owned()));
    }
    Ok(())
}

/// The environment variable whose value is the advertised address when
/// `advertise-address` is not set: the pod's IP, which the Kubernetes
/// downward API gives (`status.podIP`).
pub const POD_IP_VAR: &str = "POD_IP";

impl Config {
    /// The address this host publishes: `advertise-address` if set, else
    /// the value of [`POD_IP_VAR`] as it is (an IP without a port) if that
    /// is set and valid, else none.
    pub fn advertised(&self) -> Option<String> {
        if let Some(address) = &self.advertise_address {
            return Some(address.clone());
        }
        let ip = std::env::var(POD_IP_VAR).ok()?;
        match validate_advertise_address(&ip) {
            Ok(()) => Some(ip),
            Err(e) => {
                tracing::warn!(variable = POD_IP_VAR, error = %e, "not advertised");
                None
            }
        }
    }
}

/// Reads an admin address: an IP address and a port, such as
/// `127.0.0.1:9090` or `[::]:9090` (port 0: any free port). The error says
/// what is wrong (no host names: the address is bound as given).
pub fn parse_admin_address(text: &str) -> Result<SocketAddr, AdminAddressError> {
    text.trim()
        .parse::<SocketAddr>()
        .map_err(|_| AdminAddressError::NotAnAddress(text.to_owned()))
}

/// The folder relative paths in the configuration are taken from: the
/// file's own, made absolute (`--config run.toml` names the current
/// folder; wasmtime's cache, for one, takes absolute paths only); the
/// current folder for text without a file.
fn base_of(source: Option<&Path>) -> PathBuf {
    let folder = source
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf())
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            line: None,
            kind: ConfigErrorKind::Unreadable(e),
        })?;
        Config::parse(&text, Some(path))
    }

    /// Parses and validates configuration text; `source` is the file it came
    /// from (for messages and relative paths). One conversion per section
    /// ([`parse`]).
    pub fn parse(text: &str, source: Option<&Path>) -> Result<Config, ConfigError> {
        let src = parse::Source {
            file: source.map_or_else(|| "<configuration>".to_owned(), |p| p.display().to_string()),
            text,
            base: base_of(source),
        };
        let mut raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError {
            file: src.file.clone(),
            line: e.span().map(|s| line_of(text, s.start)),
            kind: ConfigErrorKind::Syntax(e.message().to_owned()),
        })?;
        let leases = src.leases(&raw)?;
        let registry = src.registry(raw.registry.as_ref())?;
        let plugins = src.plugins(&mut raw, &leases, &registry)?;
        let store_declared = raw.store.is_some();
        let store = src.store(raw.store.take())?;
        let (membership, spreading) = src.spread(&raw, leases.len())?;
        let admin_address = src.admin_address(&raw)?;
        Ok(Config {
            admin_address,
            advertise_address: src.advertise_address(raw.advertise_address.take())?,
            spread: membership.filter(|_| spreading),
            membership,
            source: source.map(Path::to_path_buf),
            identity_declared: raw.identity.is_some(),
            identity: src.identity(raw.identity)?,
            cache_dir: raw.cache_dir.map(|d| src.resolve(&d)),
            coredump_dir: raw.coredump_dir.map(|d| src.resolve(&d)),
            instance_pool: raw.instance_pool.unwrap_or(true),
            watch: raw.watch.unwrap_or(false),
            weight: src.weight(raw.weight)?,
            control_socket: raw.control_socket.map(|p| src.resolve(&p)),
            store,
            store_declared,
            leases,
            plugins,
            registry,
        })
    }
}

#[cfg(test)]
mod tests;
