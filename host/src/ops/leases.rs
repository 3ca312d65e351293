//! `GET /leases` on the admin address: each lease of this host's
//! configuration as its elector last published it: the holder, the term,
//! the holder's address, and whether this host leads it.
//!
//! Read from the views the health checks watch ([`Health::views`]), so it
//! costs no store request and answers even while the store is away: it is
//! this host's view, at most a retry period behind the store. The document's
//! shape is stable (fields may be added, never renamed or removed); it is
//! described in `docs/operations.md`.

use std::time::SystemTime;

use serde::Serialize;

use crate::election::{LeaseView, Role};
use crate::ops::health::Health;

/// This host, as `/leases` names it.
#[derive(Clone, Debug, Serialize)]
pub struct Host {
    /// Its identity.
    pub identity: String,
    /// Its advertised address, if any.
    pub address: Option<String>,
}

/// The document `/leases` answers.
#[derive(Clone, Debug, Serialize)]
pub struct Leases {
    /// This host.
    pub host: Host,
    /// Each lease it serves, by name.
    pub leases: Vec<LeaseEntry>,
}

/// One lease, as this host sees it.
#[derive(Clone, Debug, Serialize)]
pub struct LeaseEntry {
    /// The lease.
    pub lease: String,
    /// Its holder, if known.
    pub holder: Option<String>,
    /// The newest term known (0: none yet).
    pub term: u64,
    /// The holder's address, as its record says (this host's own while it
    /// leads); `None` without a holder or when it published none.
    pub holder_address: Option<String>,
    /// Whether this host leads it.
    pub leading: bool,
    /// This host's role: `leading`, `following` or `pending`.
    pub role: Role,
    /// While this host leads: when its term ends unless renewed (the renew
    /// deadline, RFC 3339, by this host's clock).
    pub lead_until: Option<String>,
}

/// The entry of one view.
fn entry(lease: String, view: &LeaseView) -> LeaseEntry {
    let s = &view.status;
    let lead_until = view
        .leading_term()
        .map(|t| t.wall_time(t.lead_until()))
        .map(|at: SystemTime| humantime::format_rfc3339_millis(at).to_string());
    LeaseEntry {
        lease,
        holder: s.holder.clone(),
        term: s.term,
        holder_address: view.holder_address.clone().filter(|_| s.holder.is_some()),
        leading: lead_until.is_some(),
        role: s.role,
        lead_until,
    }
}

/// The document for `host`, from the leases `health` watches.
pub fn leases(host: &Host, health: &Health) -> Leases {
    let mut leases: Vec<LeaseEntry> = health
        .views()
        .into_iter()
        .map(|(lease, view)| entry(lease, &view))
        .collect();
    leases.sort_by(|a, b| a.lease.cmp(&b.lease));
    Leases {
        host: host.clone(),
        leases,
    }
}

/// [`leases`] as JSON text.
pub fn json(host: &Host, health: &Health) -> String {
    let mut text = serde_json::to_string_pretty(&leases(host, health)).expect("a document serializes");
    text.push('\n');
    text
}
