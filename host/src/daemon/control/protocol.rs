//! The control protocol: one JSON object on one line each way, one request
//! per connection; every reply carries [`VERSION`].

use super::*;

/// The protocol's version, in every reply.
pub const VERSION: u32 = 1;

/// The longest request line.
pub(super) const MAX_REQUEST: u64 = 64 * 1024;

/// A request to a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Request {
    /// Hand the lease over and do not contend for it for `for_ms`
    /// milliseconds (default: one lease duration).
    Yield {
        /// The lease.
        lease: String,
        /// How long not to contend for it, in milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// The host's leases, its identity and configuration file.
    Leases,
    /// One extra run of a scheduled plugin, by the host that leads it.
    RunNow {
        /// The plugin.
        plugin: String,
    },
    /// Drain the host: hand over every lease it leads (one by one, each
    /// released before the next, or all at once) and take none until
    /// [`Request::Resume`]; answered once it leads nothing, or after
    /// `wait_ms`.
    Drain {
        /// Hand them all over at once.
        #[serde(default)]
        all_at_once: bool,
        /// How long to wait for it to lead nothing, in milliseconds.
        wait_ms: u64,
    },
    /// Stop draining: contend for the leases again.
    Resume,
}

/// Why a request was not done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Failure {
    /// The host does not lead the lease.
    NotLeader,
    /// The host has no such lease.
    NoSuchLease,
    /// The host is shutting down.
    ShuttingDown,
    /// The lease's tasks were not confirmed stopped: it was not released,
    /// and expires on its own.
    NotReleased,
    /// The request could not be read.
    BadRequest,
    /// The peer is neither this process's user nor root.
    Forbidden,
    /// The host has no such plugin with a schedule.
    NoSuchSchedule,
    /// A drain did not end within its wait: the host still leads a lease.
    StillLeading,
}

/// One lease a drain handed over, in a reply to [`Request::Drain`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HandedOver {
    /// The lease.
    pub lease: String,
    /// The term that ended.
    pub term: u64,
    /// Whether it was released (its tasks confirmed gone); `false`: not
    /// released, it expires on its own.
    pub released: bool,
    /// From the start of the drain until the tasks were gone, in
    /// milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_ms: Option<f64>,
    /// The host that took it, if one did within [`HANDOVER_WAIT`] of the
    /// release, and its term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_holder: Option<String>,
    /// See `new_holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_term: Option<u64>,
}

/// One lease of a host, in a reply to [`Request::Leases`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// The lease.
    pub lease: String,
    /// This host's role.
    pub role: Role,
    /// The holder, when known.
    pub holder: Option<String>,
    /// The newest term this host knows of.
    pub term: u64,
    /// While this host stands by after a yield: when it contends again
    /// (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yielded_until: Option<String>,
}

/// A host's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u32,
    /// Whether the request was done.
    pub ok: bool,
    /// The host's identity.
    pub identity: String,
    /// What happened, for people.
    pub message: String,
    /// Why not, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The lease asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// A yield: the term handed over. Not leading: the newest term known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// Not leading: who holds the lease, if anyone is known to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// A yield: how long the tasks took to stop, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_ms: Option<f64>,
    /// A yield: the host that took the lease, if one did within
    /// [`HANDOVER_WAIT`] of the release, and its term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_holder: Option<String>,
    /// See `new_holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_term: Option<u64>,
    /// A yield: milliseconds from the yield to the other host's taking the
    /// lease, as this host saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover_ms: Option<f64>,
    /// A yield: when this host contends for the lease again (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contend_again_at: Option<String>,
    /// A yield: how long it does not contend, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contend_again_in_ms: Option<u64>,
    /// Leases: the configuration file the host runs, as an absolute path
    /// (symbolic links not resolved: a client resolves both when it
    /// compares, so a file behind a link that changed since, as a
    /// Kubernetes ConfigMap's is, still matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Leases: each of its leases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseState>,
    /// Leases, drain, resume: whether the host drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    /// A drain: the leases it handed over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handed_over: Vec<HandedOver>,
}

impl Reply {
    pub(super) fn new(identity: &str) -> Reply {
        Reply {
            version: VERSION,
            identity: identity.to_owned(),
            ..Reply::default()
        }
    }

    pub(super) fn failed(identity: &str, failure: Failure, message: String) -> Reply {
        Reply {
            failure: Some(failure),
            message,
            ..Reply::new(identity)
        }
    }
}
