//! What the elector publishes: the status of a lease, and, while leading,
//! the deadline of the current term.

use std::fmt;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::time::Instant;

/// This host's role for one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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

/// The deadline of one term: the moment until which this host may act as
/// leader. Each term has its own, so a task of an old term keeps the
/// deadline of its own term even after a new term has begun.
#[derive(Debug)]
pub struct TermDeadline {
    term: u64,
    until: Mutex<Instant>,
}

impl TermDeadline {
    /// A deadline for `term`, valid until `until`.
    pub fn new(term: u64, until: Instant) -> Arc<TermDeadline> {
        Arc::new(TermDeadline {
            term,
            until: Mutex::new(until),
        })
    }

    /// The term this deadline belongs to.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Until when this host may act as leader in this term.
    pub fn until(&self) -> Instant {
        *self.until.lock().expect("term deadline lock")
    }

    /// Moves the deadline (after a confirmed renewal).
    pub(crate) fn extend_to(&self, until: Instant) {
        *self.until.lock().expect("term deadline lock") = until;
    }

    /// Ends the term no later than `at`.
    pub(crate) fn end_by(&self, at: Instant) {
        let mut until = self.until.lock().expect("term deadline lock");
        if at < *until {
            *until = at;
        }
    }
}

/// What the elector publishes on its watch channel.
///
/// Two views are equal when their statuses are equal: renewals move the
/// term deadline without waking anybody.
#[derive(Clone, Debug)]
pub struct LeaseView {
    /// The status.
    pub status: Status,
    /// The deadline of the current term, while leading.
    pub deadline: Option<Arc<TermDeadline>>,
    /// When this status was published (to measure how fast tasks react).
    pub since: Instant,
}

impl PartialEq for LeaseView {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status
    }
}
