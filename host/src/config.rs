//! The TOML configuration: identity, lease store, leases with their
//! timings, and plugins with their lease, limits and grants.
//!
//! Relative paths are resolved against the configuration file's folder.
//! Every error names the file, and where it can, the line and the field.
//!
//! ```toml
//! # identity = "node-a"          # default: <host name>-<pid>-<random>
//! # instance-pool = false        # default: true (instances from a pool sized at start)
//! # admin-address = "127.0.0.1:9090"  # default: none (no /metrics, /healthz, /readyz)
//! # control-socket = "/run/baton/node-a.sock"  # default: .baton/control/<identity>.sock beside this file
//! # watch = true                 # default: false (reload on SIGHUP only)
//!
//! [store]
//! kind = "embedded"              # a directory of lease files
//! dir = "leases"
//!
//! [defaults]                     # timings for every lease, unless it overrides them
//! lease-duration = "15s"
//! renew-deadline = "10s"
//! retry-period = "2s"
//! grace = "3s"
//! request-timeout = "2s"
//!
//! [[lease]]
//! name = "reconciler"
//!
//! [[plugin]]
//! name = "ticker"
//! path = "ticker.wasm"
//! lease = "reconciler"
//! memory-limit = "64 MiB"
//! env = { GREETING = "hello" }   # variables the guest sees
//! inherit-env = ["TZ"]           # host variables passed through by name
//! dirs = [{ host = "data", guest = "/data", read-only = true }]
//! connect = ["10.0.0.0/8:5432"]  # where it may connect over TCP
//! name-lookup = true             # whether it may resolve names
//! http = ["https://api.example.com", "http://127.0.0.1:8080"]  # where it may send HTTP requests
//! # or with options: { url = "https://ca.internal", ca = "internal-ca.pem", term-headers = false }
//! http-limits = { concurrent = 16, request-body = "10 MiB", response-body = "64 MiB", timeout = "30s" }
//! # the Kubernetes API at http://kubernetes.baton, with the host's credentials
//! kubernetes = { allow = [{ verbs = ["get", "update"], groups = [""], resources = ["configmaps"], namespaces = ["apps"] }] }
//! output-rate = "64 KiB"         # guest output per second; the rest is dropped
//! output-line = "4 KiB"          # the longest line; the rest is cut
//! send-buffer = "64 KiB"         # what each TCP connection may queue in the kernel
//! reload = "next-term"           # or "now": a new version hands the lease over at once
//!
//! [spread]                       # spreading the leads over the hosts
//! enabled = true                 # default: on when the host has more than one lease
//! head-start = "1s"              # the preferred host's head start after a release
//! settle = "4s"                  # default: two retry periods of [defaults]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;
use toml::Spanned;

use crate::election::Timings;
use crate::election::spread::{DEFAULT_FORGET_AFTER, DEFAULT_HEAD_START, MEMBER_PREFIX, SpreadConfig};
use crate::runtime::{
    ConnectGrant, DEFAULT_MEMORY_LIMIT, DirGrant, HttpGrant, HttpLimits, HttpPolicy, KubeGrant, KubeRule,
    NetworkGrant, OutputLimits, PluginSpec,
};
use crate::store::validate_lease_name;

/// A configuration that cannot be used; the message names the file, line
/// and field at fault.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawConfig {
    identity: Option<String>,
    cache_dir: Option<PathBuf>,
    coredump_dir: Option<PathBuf>,
    instance_pool: Option<bool>,
    admin_address: Option<Spanned<toml::Value>>,
    control_socket: Option<PathBuf>,
    watch: Option<bool>,
    store: Option<RawStore>,
    #[serde(default)]
    defaults: RawTimings,
    #[serde(default, rename = "lease")]
    leases: Vec<RawLease>,
    #[serde(default, rename = "plugin")]
    plugins: Vec<RawPlugin>,
    #[serde(default)]
    spread: RawSpread,
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
    #[serde(flatten)]
    timings: RawTimings,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawPlugin {
    name: Spanned<String>,
    path: Spanned<PathBuf>,
    lease: Spanned<String>,
    memory_limit: Option<ByteSize>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    inherit_env: Vec<String>,
    #[serde(default)]
    dirs: Vec<RawDir>,
    #[serde(default)]
    connect: Vec<Spanned<String>>,
    #[serde(default)]
    name_lookup: bool,
    #[serde(default)]
    http: Vec<Spanned<RawHttpGrant>>,
    http_limits: Option<RawHttpLimits>,
    kubernetes: Option<RawKubeGrant>,
    output_rate: Option<ByteSize>,
    output_line: Option<ByteSize>,
    send_buffer: Option<ByteSize>,
    #[serde(default)]
    reload: ReloadMode,
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

/// An `http` grant: an origin, or a table with options.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawHttpGrant {
    Origin(String),
    Table(RawHttpGrantTable),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawHttpGrantTable {
    url: String,
    ca: Option<PathBuf>,
    term_headers: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawKubeGrant {
    kubeconfig: Option<PathBuf>,
    term_headers: Option<bool>,
    allow: Vec<RawKubeRule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawKubeRule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    namespaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawHttpLimits {
    concurrent: Option<usize>,
    request_body: Option<ByteSize>,
    response_body: Option<ByteSize>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawDir {
    host: PathBuf,
    guest: String,
    #[serde(default)]
    read_only: bool,
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
    },
}

/// One lease and its timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease's name.
    pub name: String,
    /// Its validated timings.
    pub timings: Timings,
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
    /// The control socket (`baton yield`) as the file sets it
    /// (`control-socket`); `None`: the default, see
    /// [`crate::control::ControlSocket::bind_default`].
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
    /// Whether the host watches its configuration file and plugin files
    /// and reloads when they change (`watch = true`, or `--watch`).
    pub watch: bool,
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
fn validate_namespace(ns: &str) -> Result<(), String> {
    if ns.len() > 63 || ns.contains('.') || validate_lease_name(ns).is_err() {
        return Err(format!(
            "invalid namespace {ns:?}: must be a lowercase RFC 1123 label (at most 63 characters \
             of a-z, 0-9 and '-', starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Reads an admin address: an IP address and a port, such as
/// `127.0.0.1:9090` or `[::]:9090` (port 0: any free port). The error says
/// what is wrong (no host names: the address is bound as given).
pub fn parse_admin_address(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse::<SocketAddr>().map_err(|_| {
        format!(
            "{text:?} is not an IP address and port: write it like \"127.0.0.1:9090\" (this host only), \
             \"0.0.0.0:9090\" (every IPv4 interface) or \"[::]:9090\"; host names are not resolved"
        )
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: cannot read the configuration: {e}", path.display())))?;
        Config::parse(&text, Some(path))
    }

    /// Parses and validates configuration text; `source` is the file it came
    /// from (for messages and relative paths).
    pub fn parse(text: &str, source: Option<&Path>) -> Result<Config, ConfigError> {
        let file = source.map_or_else(|| "<configuration>".to_owned(), |p| p.display().to_string());
        let base = source
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| format!(":{}", line_of(text, s.start)))
                .unwrap_or_default();
            ConfigError(format!("{file}{at}: {}", e.message()))
        })?;
        let err_at =
            |offset: usize, msg: String| ConfigError(format!("{file}:{}: {msg}", line_of(text, offset)));

        let defaults = &raw.defaults;
        let mut leases: Vec<LeaseConfig> = Vec::new();
        for lease in &raw.leases {
            let name = lease.name.get_ref();
            let at = lease.name.span().start;
            validate_lease_name(name)
                .map_err(|e| err_at(at, format!("lease {name:?}: field `name`: {e}")))?;
            if name.starts_with(MEMBER_PREFIX) {
                return Err(err_at(
                    at,
                    format!(
                        "lease {name:?}: field `name`: names starting with {MEMBER_PREFIX:?} are kept for \
                         the hosts' membership records"
                    ),
                ));
            }
            if leases.iter().any(|l| &l.name == name) {
                return Err(err_at(at, format!("lease {name:?} is declared twice")));
            }
            let timings = lease.timings.over(defaults);
            timings
                .validate()
                .map_err(|e| err_at(at, format!("lease {name:?}: unsafe timings: {e}")))?;
            if matches!(raw.store, Some(RawStore::Kubernetes { .. })) {
                let d = timings.lease_duration;
                if d.subsec_nanos() != 0 || d.as_secs() > i32::MAX as u64 {
                    return Err(err_at(
                        at,
                        format!(
                            "lease {name:?}: lease-duration {} is not a whole number of seconds: a \
                             Kubernetes Lease holds leaseDurationSeconds; use {}s or {}s",
                            humantime::format_duration(d),
                            d.as_secs(),
                            d.as_secs() + 1
                        ),
                    ));
                }
            }
            leases.push(LeaseConfig {
                name: name.clone(),
                timings,
            });
        }

        let mut plugins: Vec<PluginConfig> = Vec::new();
        for p in &raw.plugins {
            let name = p.name.get_ref();
            let at = p.name.span().start;
            if name.is_empty() {
                return Err(err_at(at, "plugin: field `name` is empty".into()));
            }
            if name.contains(',') || name.chars().any(char::is_control) {
                return Err(err_at(
                    at,
                    format!(
                        "plugin {name:?}: field `name`: no commas or control characters (lease records list plugins by name)"
                    ),
                ));
            }
            if plugins.iter().any(|q| &q.spec.name == name) {
                return Err(err_at(at, format!("plugin {name:?} is declared twice")));
            }
            let lease = p.lease.get_ref();
            if !leases.iter().any(|l| &l.name == lease) {
                let declared: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
                return Err(err_at(
                    p.lease.span().start,
                    format!(
                        "plugin {name:?}: field `lease`: lease {lease:?} is not declared in a [[lease]] table \
                         (declared: {})",
                        if declared.is_empty() {
                            "none".to_owned()
                        } else {
                            declared.join(", ")
                        }
                    ),
                ));
            }
            let mut env: Vec<(String, String)> = p.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            for var in &p.inherit_env {
                match std::env::var(var) {
                    Ok(v) => env.push((var.clone(), v)),
                    Err(_) => {
                        tracing::warn!(plugin = %name, variable = %var, "inherit-env: not set on the host; not passed")
                    }
                }
            }
            let dirs = p
                .dirs
                .iter()
                .map(|d| DirGrant {
                    host: resolve(&d.host),
                    guest: d.guest.clone(),
                    read_only: d.read_only,
                })
                .collect();
            let mut connect = Vec::new();
            for grant in &p.connect {
                let parsed = grant.get_ref().parse::<ConnectGrant>().map_err(|e| {
                    err_at(
                        grant.span().start,
                        format!("plugin {name:?}: field `connect`: {e}"),
                    )
                })?;
                connect.push(parsed);
            }
            let network = NetworkGrant {
                connect,
                name_lookup: p.name_lookup,
            };
            let mut http_grants = Vec::new();
            for grant in &p.http {
                let field_err =
                    |e: String| err_at(grant.span().start, format!("plugin {name:?}: field `http`: {e}"));
                let parsed = match grant.get_ref() {
                    RawHttpGrant::Origin(url) => url.parse::<HttpGrant>().map_err(field_err)?,
                    RawHttpGrant::Table(t) => {
                        let mut g = t.url.parse::<HttpGrant>().map_err(field_err)?;
                        g.ca = t.ca.as_deref().map(resolve);
                        g.term_headers = t.term_headers.unwrap_or(true);
                        g
                    }
                };
                http_grants.push(parsed);
            }
            let defaults = HttpLimits::default();
            let http_limits = match &p.http_limits {
                None => defaults,
                Some(l) => HttpLimits {
                    concurrent: l.concurrent.unwrap_or(defaults.concurrent),
                    request_body: l.request_body.map_or(defaults.request_body, |b| b.as_u64()),
                    response_body: l.response_body.map_or(defaults.response_body, |b| b.as_u64()),
                    timeout: l.timeout.unwrap_or(defaults.timeout),
                },
            };
            if http_limits.concurrent == 0 || http_limits.timeout.is_zero() {
                return Err(err_at(
                    at,
                    format!(
                        "plugin {name:?}: field `http-limits`: `concurrent` and `timeout` must be above zero \
                         (to refuse every request, grant no `http`)"
                    ),
                ));
            }
            let mut http = HttpPolicy::new(&http_grants, http_limits)
                .map_err(|e| err_at(at, format!("plugin {name:?}: field `http`: {e}")))?;
            if let Some(k) = &p.kubernetes {
                const VERBS: [&str; 9] = [
                    "get",
                    "list",
                    "watch",
                    "create",
                    "update",
                    "patch",
                    "delete",
                    "deletecollection",
                    "*",
                ];
                let mut rules = Vec::new();
                for (i, r) in k.allow.iter().enumerate() {
                    let field = |what: &str| format!("plugin {name:?}: field `kubernetes.allow[{i}].{what}`");
                    if let Some(v) = r.verbs.iter().find(|v| !VERBS.contains(&v.as_str())) {
                        return Err(err_at(
                            at,
                            format!(
                                "{}: {v:?} is not a verb: use {}",
                                field("verbs"),
                                VERBS.join(", ")
                            ),
                        ));
                    }
                    for (what, list) in [
                        ("verbs", &r.verbs),
                        ("groups", &r.groups),
                        ("resources", &r.resources),
                        ("namespaces", &r.namespaces),
                    ] {
                        if list.is_empty() {
                            return Err(err_at(
                                at,
                                format!(
                                    "{}: empty, which allows nothing (`\"*\"` allows any; the core group is `\"\"`)",
                                    field(what)
                                ),
                            ));
                        }
                    }
                    rules.push(KubeRule {
                        verbs: r.verbs.clone(),
                        groups: r.groups.clone(),
                        resources: r.resources.clone(),
                        namespaces: r.namespaces.clone(),
                    });
                }
                http = http.with_kubernetes(KubeGrant {
                    rules,
                    kubeconfig: k.kubeconfig.as_deref().map(resolve),
                    term_headers: k.term_headers.unwrap_or(true),
                });
            }
            let memory_limit = p.memory_limit.map_or(DEFAULT_MEMORY_LIMIT, |m| m.as_u64());
            if memory_limit < ByteSize::mib(1).as_u64() {
                return Err(err_at(
                    at,
                    format!("plugin {name:?}: field `memory-limit`: below 1 MiB"),
                ));
            }
            let defaults = OutputLimits::default();
            let output = OutputLimits {
                bytes_per_second: p.output_rate.map_or(defaults.bytes_per_second, |r| r.as_u64()),
                line: p.output_line.map_or(defaults.line, |l| {
                    usize::try_from(l.as_u64()).unwrap_or(usize::MAX)
                }),
            };
            if output.line > crate::runtime::output::MAX_OUTPUT_LINE {
                return Err(err_at(
                    at,
                    format!(
                        "plugin {name:?}: field `output-line`: at most {} KiB (longer lines are cut)",
                        crate::runtime::output::MAX_OUTPUT_LINE / 1024
                    ),
                ));
            }
            if output.bytes_per_second == 0 || output.line == 0 {
                return Err(err_at(
                    at,
                    format!(
                        "plugin {name:?}: fields `output-rate` and `output-line` must be above zero \
                         (to silence a plugin, filter its log target: BATON_LOG=info,guest=off)"
                    ),
                ));
            }
            let send_buffer = p
                .send_buffer
                .map_or(crate::runtime::connections::DEFAULT_SEND_BUFFER, |b| b.as_u64());
            if !(4 << 10..=64 << 20).contains(&send_buffer) {
                return Err(err_at(
                    at,
                    format!(
                        "plugin {name:?}: field `send-buffer`: {} is not between 4 KiB and 64 MiB \
                         (what each TCP connection may queue in the kernel)",
                        ByteSize::b(send_buffer)
                    ),
                ));
            }
            plugins.push(PluginConfig {
                spec: PluginSpec {
                    name: name.clone(),
                    path: resolve(p.path.get_ref()),
                    memory_limit,
                    env,
                    dirs,
                    network,
                    http,
                    output,
                    send_buffer,
                },
                lease: lease.clone(),
                reload: p.reload,
            });
        }

        let store_declared = raw.store.is_some();
        let store = match raw.store.unwrap_or_default() {
            RawStore::Embedded { dir } => StoreConfig::Embedded {
                dir: dir
                    .map(|d| resolve(&d))
                    .unwrap_or_else(|| base.join(".baton").join("leases")),
            },
            RawStore::Kubernetes {
                namespace,
                kubeconfig,
                labels,
            } => {
                if let Some(ns) = &namespace {
                    validate_namespace(ns)
                        .map_err(|e| ConfigError(format!("{file}: [store]: field `namespace`: {e}")))?;
                }
                for (k, v) in &labels {
                    if k.is_empty() || k.len() > 316 || v.len() > 63 {
                        return Err(ConfigError(format!(
                            "{file}: [store]: field `labels`: invalid label {k:?} = {v:?}: keys are \
                             non-empty, values at most 63 characters"
                        )));
                    }
                    if k == crate::store::kube::ROLE_LABEL {
                        return Err(ConfigError(format!(
                            "{file}: [store]: field `labels`: {k:?} is baton's own label (every Lease \
                             it writes carries {k}={}; its watch selects its Leases by it): choose \
                             another key",
                            crate::store::kube::LEASE_ROLE
                        )));
                    }
                }
                StoreConfig::Kubernetes {
                    namespace,
                    kubeconfig: kubeconfig.map(|p| resolve(&p)),
                    labels,
                }
            }
        };
        let spreading = raw.spread.enabled.unwrap_or(leases.len() > 1);
        let base = RawTimings::default().over(defaults);
        let membership = match base.validate() {
            Ok(()) => {
                let head_start = raw.spread.head_start.unwrap_or(DEFAULT_HEAD_START);
                if head_start.is_zero() || head_start >= base.lease_duration {
                    return Err(ConfigError(format!(
                        "{file}: [spread]: field `head-start`: {} must be above zero and below the \
                         lease duration ({}): a released lease whose preferred host is absent waits that \
                         long, which should never exceed what a crashed holder costs",
                        humantime::format_duration(head_start),
                        humantime::format_duration(base.lease_duration)
                    )));
                }
                let forget_after = raw.spread.forget_after.unwrap_or(DEFAULT_FORGET_AFTER);
                if forget_after.is_zero() {
                    return Err(ConfigError(format!(
                        "{file}: [spread]: field `forget-after`: must be above zero: the membership \
                         record of a host gone that long is deleted"
                    )));
                }
                Some(SpreadConfig {
                    forget_after,
                    member_timings: member_timings(base),
                    head_start,
                    settle: raw.spread.settle.unwrap_or(base.retry_period * 2),
                })
            }
            Err(e) if spreading => {
                return Err(ConfigError(format!(
                    "{file}: [defaults]: unsafe timings (the hosts' membership records derive theirs from them): {e}"
                )));
            }
            Err(_) => None,
        };
        let spread = membership.filter(|_| spreading);
        let admin_address = match &raw.admin_address {
            None => None,
            Some(a) => {
                let parsed = match a.get_ref() {
                    toml::Value::String(text) => parse_admin_address(text),
                    other => Err(format!(
                        "must be a string like \"127.0.0.1:9090\" (found: {})",
                        other.type_str()
                    )),
                };
                Some(parsed.map_err(|e| err_at(a.span().start, format!("field `admin-address`: {e}")))?)
            }
        };
        Ok(Config {
            admin_address,
            spread,
            membership,
            source: source.map(Path::to_path_buf),
            identity_declared: raw.identity.is_some(),
            identity: match raw.identity {
                Some(i) if i.trim().is_empty() => {
                    return Err(ConfigError(format!(
                        "{file}: field `identity` is empty (leave it out for a unique default)"
                    )));
                }
                Some(i) => i,
                None => default_identity(),
            },
            cache_dir: raw.cache_dir.map(|d| resolve(&d)),
            coredump_dir: raw.coredump_dir.map(|d| resolve(&d)),
            instance_pool: raw.instance_pool.unwrap_or(true),
            watch: raw.watch.unwrap_or(false),
            control_socket: raw.control_socket.map(|p| resolve(&p)),
            store,
            store_declared,
            leases,
            plugins,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
identity = "a"
[store]
kind = "embedded"
dir = "leases"
[defaults]
grace = "1s"
[[lease]]
name = "demo"
lease-duration = "4s"
renew-deadline = "2s"
retry-period = "500ms"
[[plugin]]
name = "ticker"
path = "t.wasm"
lease = "demo"
memory-limit = "64 MiB"
env = { A = "1" }
"#;

    #[test]
    fn parses_a_full_configuration() {
        let c = Config::parse(GOOD, Some(Path::new("/etc/baton/baton.toml"))).unwrap();
        assert_eq!(c.identity, "a");
        assert_eq!(
            c.store,
            StoreConfig::Embedded {
                dir: "/etc/baton/leases".into()
            }
        );
        assert_eq!(c.leases[0].timings.lease_duration, Duration::from_secs(4));
        assert_eq!(c.leases[0].timings.grace, Duration::from_secs(1));
        assert_eq!(c.plugins[0].spec.path, PathBuf::from("/etc/baton/t.wasm"));
        assert_eq!(c.plugins[0].spec.memory_limit, 64 * 1024 * 1024);
        assert_eq!(c.plugins[0].spec.env, vec![("A".to_owned(), "1".to_owned())]);
        assert!(c.instance_pool, "the instance pool is on by default");
        assert!(c.store_declared);
        let bare = Config::parse(
            "[[lease]]\nname = \"demo\"\n",
            Some(Path::new("/etc/baton/b.toml")),
        )
        .unwrap();
        assert!(!bare.store_declared, "no [store] section");
        assert_eq!(
            bare.store,
            StoreConfig::Embedded {
                dir: "/etc/baton/.baton/leases".into()
            }
        );
        let off = Config::parse(&format!("instance-pool = false\n{GOOD}"), None).unwrap();
        assert!(!off.instance_pool);
        assert_eq!(c.control_socket, None, "the default");
        let set = Config::parse(
            &format!("control-socket = \"run/a.sock\"\n{GOOD}"),
            Some(Path::new("/etc/baton/baton.toml")),
        )
        .unwrap();
        assert_eq!(set.control_socket, Some(PathBuf::from("/etc/baton/run/a.sock")));
    }

    #[test]
    fn unknown_fields_name_file_and_line() {
        let text = "[[lease]]\nname = \"x\"\nlease-duraton = \"4s\"\n";
        let e = Config::parse(text, Some(Path::new("b.toml")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.toml:"), "{e}");
        assert!(e.contains("lease-duraton"), "{e}");
    }

    #[test]
    fn unsafe_timings_name_the_lease_and_line() {
        let text = "[[lease]]\nname = \"x\"\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"1s\"\n";
        let e = Config::parse(text, Some(Path::new("b.toml")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.toml:2: lease \"x\": unsafe timings"), "{e}");
        assert!(
            e.contains("renew-deadline + grace + margin must be shorter than lease-duration"),
            "{e}"
        );
    }

    #[test]
    fn undeclared_lease_is_named() {
        let text =
            "[[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"dmo\"\n";
        let e = Config::parse(text, Some(Path::new("b.toml")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.toml:6: plugin \"p\": field `lease`"), "{e}");
        assert!(e.contains("declared: demo"), "{e}");
    }

    #[test]
    fn spreading_is_on_with_more_than_one_lease_and_its_settings_are_checked() {
        let one = Config::parse("[[lease]]\nname = \"a\"\n", None).unwrap();
        assert!(one.spread.is_none());
        let two = "[defaults]\nretry-period = \"1s\"\n[[lease]]\nname = \"a\"\n[[lease]]\nname = \"b\"\n";
        let s = Config::parse(two, None)
            .unwrap()
            .spread
            .expect("on with two leases");
        assert_eq!(s.head_start, DEFAULT_HEAD_START);
        assert_eq!(s.settle, Duration::from_secs(2));
        assert_eq!(s.member_timings.retry_period, Duration::from_secs(1));
        assert_eq!(s.member_timings.lease_duration, Duration::from_secs(7));
        s.member_timings.validate().unwrap();
        for (ld, rd, rp) in [
            (2000, 1000, 200),
            (4000, 2000, 500),
            (1000, 500, 100),
            (3000, 2000, 1000),
        ] {
            let ms = Duration::from_millis;
            let base = Timings {
                lease_duration: ms(ld),
                renew_deadline: ms(rd),
                retry_period: ms(rp),
                grace: ms(0),
                request_timeout: ms(rp).min(ms(rd) / 2),
            };
            let m = member_timings(base);
            m.validate().unwrap_or_else(|e| panic!("{base:?}: {e}"));
            assert!(m.lease_duration <= base.lease_duration);
        }
        let off = format!("{two}[spread]\nenabled = false\n");
        assert!(Config::parse(&off, None).unwrap().spread.is_none());
        let e = Config::parse(
            &format!("{two}[spread]\nhead-start = \"20s\"\n"),
            Some(Path::new("s.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("s.toml: [spread]: field `head-start`"), "{e}");
        assert!(e.contains("below the lease duration (15s)"), "{e}");
        let e = Config::parse(
            "[[lease]]\nname = \"baton-member.x\"\n",
            Some(Path::new("m.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("m.toml:2: lease \"baton-member.x\""), "{e}");
        assert!(e.contains("membership records"), "{e}");
    }

    #[test]
    fn the_admin_address_is_off_by_default_and_checked_naming_the_field() {
        assert_eq!(Config::parse("", None).unwrap().admin_address, None);
        let c = Config::parse("admin-address = \"127.0.0.1:9090\"\n", None).unwrap();
        assert_eq!(c.admin_address, Some("127.0.0.1:9090".parse().unwrap()));
        let c = Config::parse("admin-address = \"[::]:0\"\n", None).unwrap();
        assert_eq!(c.admin_address, Some("[::]:0".parse().unwrap()));
        for bad in ["localhost:9090", "127.0.0.1", ":9090", "127.0.0.1:99999"] {
            let e = Config::parse(
                &format!("identity = \"a\"\nadmin-address = {bad:?}\n"),
                Some(Path::new("a.toml")),
            )
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("a.toml:2: field `admin-address`: "), "{e}");
            assert!(e.contains("is not an IP address and port"), "{e}");
        }
        let e = Config::parse("admin-address = 9090\n", Some(Path::new("a.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("a.toml:1: field `admin-address`: must be a string"),
            "{e}"
        );
    }

    #[test]
    fn a_blank_identity_is_refused() {
        let e = Config::parse("identity = \" \"\n", Some(Path::new("b.toml")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("field `identity` is empty"), "{e}");
    }

    #[test]
    fn a_kubernetes_store_is_parsed_with_defaults_and_paths() {
        let text = "[store]\nkind = \"kubernetes\"\nnamespace = \"baton\"\nkubeconfig = \"kube.yaml\"\n\
                    labels = { app = \"baton\" }\n[[lease]]\nname = \"demo\"\n";
        let c = Config::parse(text, Some(Path::new("/etc/baton/baton.toml"))).unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Kubernetes {
                namespace: Some("baton".into()),
                kubeconfig: Some("/etc/baton/kube.yaml".into()),
                labels: [("app".to_owned(), "baton".to_owned())].into(),
            }
        );
        let c = Config::parse("[store]\nkind = \"kubernetes\"\n", None).unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Kubernetes {
                namespace: None,
                kubeconfig: None,
                labels: BTreeMap::new(),
            }
        );
        let e = Config::parse(
            "[store]\nkind = \"kubernetes\"\nnamespace = \"Bad_NS\"\n",
            Some(Path::new("k.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("k.toml: [store]: field `namespace`: invalid namespace"),
            "{e}"
        );
        let e = Config::parse(
            "[store]\nkind = \"kubernetes\"\ndir = \"x\"\n",
            Some(Path::new("k.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `dir`"), "{e}");
        // baton's own label is not the operator's to set.
        let e = Config::parse(
            "[store]\nkind = \"kubernetes\"\nlabels = { \"baton.dev/role\" = \"x\" }\n",
            Some(Path::new("k.toml")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"baton.dev/role\" is baton's own label"), "{e}");
    }

    #[test]
    fn a_kubernetes_store_refuses_lease_durations_in_fractions_of_a_second() {
        let text = "[store]\nkind = \"kubernetes\"\n[[lease]]\nname = \"demo\"\nlease-duration = \"4500ms\"\n\
                    renew-deadline = \"2s\"\nretry-period = \"500ms\"\ngrace = \"1s\"\n";
        let e = Config::parse(text, Some(Path::new("k.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "k.toml:4: lease \"demo\": lease-duration 4s 500ms is not a whole number of seconds"
            ),
            "{e}"
        );
        assert!(e.contains("use 4s or 5s"), "{e}");
        // The embedded store takes it.
        Config::parse(&text.replace("kubernetes", "embedded"), None).unwrap();
    }

    #[test]
    fn default_identities_differ() {
        assert_ne!(default_identity(), default_identity());
    }
}
