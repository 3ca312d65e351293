//! What can be wrong with a configuration: [`ConfigError`] says where (the
//! file, and the line when known) and [`ConfigErrorKind`] what, naming the
//! lease, plugin, section or field at fault. The messages are part of the
//! interface: operators and tests read them. Each message includes its
//! cause's, so none is also given as a `source`.

use std::time::Duration;

use crate::election::TimingError;
use crate::election::spread::MEMBER_PREFIX;

/// A configuration that cannot be used: `FILE[:LINE]: WHAT`.
#[derive(Debug, thiserror::Error)]
#[error("{file}{}: {kind}", line_suffix(*.line))]
pub struct ConfigError {
    /// The file as given (`<configuration>` for text without one).
    pub file: String,
    /// The line at fault, when the error is at one.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: ConfigErrorKind,
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

/// What is wrong with a configuration, naming what is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigErrorKind {
    /// The file cannot be read.
    #[error("cannot read the configuration: {0}")]
    Unreadable(std::io::Error),
    /// Not TOML, or not this file's tables (an unknown field, a wrong
    /// type): the TOML parser's message.
    #[error("{0}")]
    Syntax(String),
    /// A lease name that is not a valid one (the store's rule, in words).
    #[error("lease {lease:?}: field `name`: {reason}")]
    LeaseName {
        /// The lease.
        lease: String,
        /// Why not.
        reason: String,
    },
    /// A lease name kept for the hosts' membership records.
    #[error(
        "lease {0:?}: field `name`: names starting with {prefix:?} are kept for the hosts' \
         membership records",
        prefix = MEMBER_PREFIX
    )]
    ReservedLeaseName(String),
    /// Two `[[lease]]` tables of one name.
    #[error("lease {0:?} is declared twice")]
    LeaseDeclaredTwice(String),
    /// A lease's timings break the timing rules.
    #[error("lease {lease:?}: unsafe timings: {error}")]
    UnsafeTimings {
        /// The lease.
        lease: String,
        /// The rule broken (boxed: timings are large).
        error: Box<TimingError>,
    },
    /// A host both in a lease's `prefer` and its `avoid`.
    #[error("lease {lease:?}: host {host:?} is in both `prefer` and `avoid`; name it in one of them")]
    PreferAndAvoid {
        /// The lease.
        lease: String,
        /// The host named in both.
        host: String,
    },
    /// An empty host name in a lease's `prefer` or `avoid`.
    #[error("lease {lease:?}: field `{field}`: a host identity is empty")]
    EmptyPlacementHost {
        /// The lease.
        lease: String,
        /// `prefer` or `avoid`.
        field: &'static str,
    },
    /// A `weight` outside 1..=MAX_WEIGHT.
    #[error("field `weight`: {0} is not a weight: a whole number from 1 to {max}", max = crate::election::spread::MAX_WEIGHT)]
    Weight(i64),
    /// A lease duration a Kubernetes Lease cannot hold.
    #[error(
        "lease {lease:?}: lease-duration {} is not a whole number of seconds: a Kubernetes Lease \
         holds leaseDurationSeconds; use {}s or {}s",
        humantime::format_duration(*.duration),
        .duration.as_secs(),
        .duration.as_secs() + 1
    )]
    FractionalLeaseDuration {
        /// The lease.
        lease: String,
        /// Its lease duration.
        duration: Duration,
    },
    /// `route-label = true` on a lease of a store without pods.
    #[error(
        "lease {0:?}: field `route-label`: the route label is put on this host's Kubernetes pod; \
         it needs `[store] kind = \"kubernetes\"`"
    )]
    RouteLabelWithoutPods(String),
    /// A plugin's field that cannot be used, and why.
    #[error("plugin {plugin:?}: field `{field}`: {reason}")]
    PluginField {
        /// The plugin.
        plugin: String,
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A plugin without a name.
    #[error("plugin: field `name` is empty")]
    EmptyPluginName,
    /// A plugin name that a lease record cannot list.
    #[error(
        "plugin {0:?}: field `name`: no commas or control characters (lease records list plugins by name)"
    )]
    PluginName(String),
    /// Two `[[plugin]]` tables of one name.
    #[error("plugin {0:?} is declared twice")]
    PluginDeclaredTwice(String),
    /// A plugin under a lease no `[[lease]]` table declares.
    #[error(
        "plugin {plugin:?}: field `lease`: lease {lease:?} is not declared in a [[lease]] table \
         (declared: {})",
        declared_list(.declared)
    )]
    UndeclaredLease {
        /// The plugin.
        plugin: String,
        /// The lease it names.
        lease: String,
        /// The leases declared.
        declared: Vec<String>,
    },
    /// A grant that cannot be used: the capability's parser says which
    /// key (or path into it, `kubernetes.allow[0].verbs`) and why.
    #[error("plugin {plugin:?}: field `{field}`: {reason}")]
    Grant {
        /// The plugin.
        plugin: String,
        /// The key at fault, or a path into its value.
        field: String,
        /// Why not, as the capability's parser says it.
        reason: String,
    },
    /// A `memory-limit` below 1 MiB.
    #[error("plugin {0:?}: field `memory-limit`: below 1 MiB")]
    MemoryLimitTooSmall(String),
    /// An `[store]` setting of an etcd store that cannot work.
    #[error("[store] (kind = \"etcd\"): {0}")]
    Etcd(String),
    /// An `[store]` setting of a PostgreSQL store that cannot work.
    #[error("[store] (kind = \"postgres\"): {0}")]
    Postgres(String),
    /// `[store] namespace` is not a namespace name.
    #[error("[store]: field `namespace`: {0}")]
    Namespace(InvalidNamespace),
    /// A label that Kubernetes refuses.
    #[error(
        "[store]: field `labels`: invalid label {key:?} = {value:?}: keys are non-empty, values at \
         most 63 characters"
    )]
    Label {
        /// The label's key.
        key: String,
        /// Its value.
        value: String,
    },
    /// baton's own label, which the operator may not set.
    #[error(
        "[store]: field `labels`: {0:?} is baton's own label (every Lease it writes carries \
         {0}={role}; its watch selects its Leases by it): choose another key",
        role = crate::store::kube::LEASE_ROLE
    )]
    OwnLabel(String),
    /// `[defaults]` timings that break the rules, while the membership
    /// records need them.
    #[error("[defaults]: unsafe timings (the hosts' membership records derive theirs from them): {0}")]
    UnsafeDefaults(Box<TimingError>),
    /// A `[spread] head-start` of zero, or one a lease duration long.
    #[error(
        "[spread]: field `head-start`: {} must be above zero and below the lease duration ({}): a \
         released lease whose preferred host is absent waits that long, which should never exceed \
         what a crashed holder costs",
        humantime::format_duration(*.head_start),
        humantime::format_duration(*.lease_duration)
    )]
    HeadStart {
        /// The head start configured.
        head_start: Duration,
        /// The `[defaults]` lease duration.
        lease_duration: Duration,
    },
    /// A `[spread] forget-after` of zero.
    #[error(
        "[spread]: field `forget-after`: must be above zero: the membership record of a host gone \
         that long is deleted"
    )]
    ZeroForgetAfter,
    /// A `[registry]` field that cannot be used.
    #[error("[registry]: field `{field}`: {reason}")]
    Registry {
        /// The field.
        field: &'static str,
        /// Why not.
        reason: String,
    },
    /// An `admin-address` that is not one.
    #[error("field `admin-address`: {0}")]
    AdminAddress(AdminAddressError),
    /// An `advertise-address` that cannot be one.
    #[error("field `advertise-address`: {0}")]
    AdvertiseAddress(AdvertiseAddressError),
    /// An empty `identity`.
    #[error("field `identity` is empty (leave it out for a unique default)")]
    EmptyIdentity,
}

/// The leases declared, for [`ConfigErrorKind::UndeclaredLease`].
fn declared_list(declared: &[String]) -> String {
    if declared.is_empty() {
        "none".to_owned()
    } else {
        declared.join(", ")
    }
}

/// A Kubernetes namespace name that is not one.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid namespace {0:?}: must be a lowercase RFC 1123 label (at most 63 characters of a-z, 0-9 \
     and '-', starting and ending with a letter or digit)"
)]
pub struct InvalidNamespace(pub String);

/// An admin address that is not an IP address and a port.
#[derive(Debug, thiserror::Error)]
pub enum AdminAddressError {
    /// Text that does not parse (a host name is not resolved).
    #[error(
        "{0:?} is not an IP address and port: write it like \"127.0.0.1:9090\" (this host only), \
         \"0.0.0.0:9090\" (every IPv4 interface) or \"[::]:9090\"; host names are not resolved"
    )]
    NotAnAddress(String),
    /// Not a string in the file.
    #[error("must be a string like \"127.0.0.1:9090\" (found: {0})")]
    NotAString(&'static str),
}

/// An advertised address (`advertise-address`) that cannot be one.
#[derive(Debug, thiserror::Error)]
pub enum AdvertiseAddressError {
    /// Empty.
    #[error("is empty (leave it out to advertise none, or the pod IP on Kubernetes)")]
    Empty,
    /// Holds whitespace.
    #[error("{0:?} holds whitespace: write it like \"10.1.2.3:8080\" or \"http://node-a:8080\"")]
    Whitespace(String),
}
