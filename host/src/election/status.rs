//! What the elector publishes: the status of a lease, and, while leading,
//! the current [`Term`].

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::clock::Moment;
use super::term::Term;

/// This host's role for one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// No holder is known (before the first round, after giving up without
    /// learning the next holder, or while shutting down).
    Pending,
    /// This host holds the lease.
    Leading,
    /// Another holder is known.
    Following,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Pending => "pending",
            Role::Leading => "leading",
            Role::Following => "following",
        })
    }
}

/// The status of one lease as seen by this host; what guests receive.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Status {
    /// This host's role.
    pub role: Role,
    /// The holder, when known.
    pub holder: Option<String>,
    /// The lease's name.
    pub lease: String,
    /// The newest term this host knows of (the fencing token); 0 if none.
    pub term: u64,
}

impl Status {
    /// The status before the first election round.
    pub fn initial(lease: &str) -> Status {
        Status {
            role: Role::Pending,
            holder: None,
            lease: lease.to_owned(),
            term: 0,
        }
    }

    /// Whether this host leads.
    pub fn is_leading(&self) -> bool {
        self.role == Role::Leading
    }
}

/// What the elector publishes on its watch channel.
///
/// Two views are equal when their statuses are equal: renewals move the
/// term's deadline without waking anybody.
#[derive(Clone, Debug)]
pub struct LeaseView {
    /// The status.
    pub status: Status,
    /// The current term, while leading.
    pub term: Option<Arc<Term>>,
    /// When this status was published, on the term clock.
    pub since: Moment,
    /// The last yield this host saw in the lease's record (a release by
    /// `baton yield`): changing it wakes nobody.
    pub yielded: Option<YieldSeen>,
    /// The holder's address ([`HostInfo::address`](crate::store::HostInfo::address)):
    /// this host's own while it leads, else the one the holder's record
    /// carries; `None` without a holder or when the holder published none.
    /// Set together with the status; a change of it alone wakes watchers
    /// too.
    pub holder_address: Option<String>,
}

/// A yield seen in a lease's record: which host yielded the lease, and
/// until when (on this host's clock, from when it saw the release) that
/// host does not contend for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YieldSeen {
    /// The identity of the host that yielded.
    pub by: String,
    /// When it contends again.
    pub until: Instant,
}

impl LeaseView {
    /// The term to run tasks in: the current one, if this host leads and
    /// the term is not over.
    pub fn leading_term(&self) -> Option<&Arc<Term>> {
        self.term
            .as_ref()
            .filter(|t| self.status.is_leading() && t.number() == self.status.term && !t.is_over())
    }
}

impl PartialEq for LeaseView {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status
    }
}
