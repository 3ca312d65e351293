//! Claims: no plugin runs under two leases at once, on any two hosts.
//!
//! A term keeps its plugins to itself on one lease; a plugin that moves to
//! another lease (a reload), or that two hosts' configurations put under
//! different leases, would run under each. So every record a host writes
//! while it leads lists the plugins it may run in that term, its *claims*
//! ([`LeaseRecord::plugins`]), and a plugin's task starts under lease `L`
//! only once the *claim gate* ([`ClaimGate`]) finds that
//!
//! 1. a write of the term, confirmed by the store, lists the plugin
//!    ([`Term::claimed`]), and then
//! 2. a listing of the store begun after that write shows no other lease
//!    whose record claims the plugin and is live: held, and not yet
//!    expired as this host judges expiry (the record unchanged for its
//!    lease duration since this host first saw it, the elector's own rule).
//!
//! Two hosts that each claim, then list, cannot both miss the other's
//! claim: whichever lists second sees the claim written before the first
//! one's listing. A plugin stays claimed until its task is gone
//! ([`LeaseClaims::remove`] runs when its supervisor returns), so a claim
//! outlives every instance of the plugin; a holder that dies stops its
//! instances at its force-stop time, before its lease expires.
//!
//! When two leases claim a plugin at once and neither runs it, the lease
//! whose name sorts later takes its claim back ([`LeaseClaims::retract`])
//! until the other's is gone, so one of them goes ahead. A plugin claimed
//! elsewhere waits, saying why, for as long as it is (a configuration that
//! puts it under another lease on another host keeps it waiting).
//!
//! A lease that disappears from a listing (its record deleted, or
//! unreadable) is taken to hold what it last held, as the stores read a record deleted while held:
//! until it has been gone for its lease duration.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::Term;
use crate::store::{LeaseRecord, LeaseStore, StoreError, Versioned};

/// The plugins this host claims under one lease, shared by the host's
/// wiring (which adds a plugin when it starts serving it and removes it
/// once its task is gone), the lease's elector (which writes them into
/// every record it leads with) and the plugins' gates (which take a claim
/// back while another lease's comes first).
#[derive(Clone, Debug, Default)]
pub struct LeaseClaims {
    plugins: Arc<watch::Sender<BTreeMap<String, Claim>>>,
}

/// One plugin's claim under a lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// How many of its supervisors serve it here (a reload may add one
    /// while the one it replaced still drains).
    serving: usize,
    /// Taken back for now by its gate.
    retracted: bool,
}

impl LeaseClaims {
    /// No claims.
    pub fn new() -> LeaseClaims {
        LeaseClaims::default()
    }

    /// Claims `plugin` for one more supervisor of it.
    pub fn add(&self, plugin: &str) {
        self.plugins.send_modify(|p| {
            p.entry(plugin.to_owned()).or_default().serving += 1;
        });
    }

    /// Drops one supervisor's claim of `plugin`, whose task is gone; the
    /// claim goes once no supervisor of it is left.
    pub fn remove(&self, plugin: &str) {
        self.plugins.send_if_modified(|p| {
            let Some(claim) = p.get_mut(plugin) else {
                return false;
            };
            claim.serving -= 1;
            if claim.serving == 0 {
                p.remove(plugin);
            }
            true
        });
    }

    /// Takes the claim of `plugin` back for now (its task does not run).
    pub fn retract(&self, plugin: &str) {
        self.set_retracted(plugin, true);
    }

    /// Claims `plugin` again after [`retract`](Self::retract).
    pub fn restore(&self, plugin: &str) {
        self.set_retracted(plugin, false);
    }

    fn set_retracted(&self, plugin: &str, retracted: bool) {
        self.plugins.send_if_modified(|p| match p.get_mut(plugin) {
            Some(claim) if claim.retracted != retracted => {
                claim.retracted = retracted;
                true
            }
            _ => false,
        });
    }

    /// The plugins claimed now, sorted, for a record.
    pub fn listed(&self) -> Vec<String> {
        listed(&self.plugins.borrow())
    }

    /// News of every change, for the elector.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Claim>> {
        self.plugins.subscribe()
    }
}

/// The claimed plugins of a [`LeaseClaims`] value.
pub fn listed(plugins: &BTreeMap<String, Claim>) -> Vec<String> {
    plugins
        .iter()
        .filter(|(_, claim)| !claim.retracted)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Another lease's claim on a plugin, as a listing showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rival {
    /// The lease.
    pub lease: String,
    /// Its holder.
    pub holder: String,
    /// Its term.
    pub term: u64,
}

/// A listing of the store, and when it began.
struct Listing {
    began: Instant,
    leases: Result<Arc<Vec<(String, Versioned)>>, StoreError>,
}

/// When this host first saw a lease's version, and what it held.
struct Sighting {
    version: Option<String>,
    record: LeaseRecord,
    at: Instant,
}

/// The listings and sightings shared by every plugin of one host.
struct Shared {
    last: Option<Listing>,
    seen: HashMap<String, Sighting>,
}

/// Decides when a plugin's task may start (see the [module
/// documentation](self)); one per host and store.
pub struct ClaimGate {
    store: Arc<dyn LeaseStore>,
    shared: Mutex<Shared>,
}

impl ClaimGate {
    /// A gate on the leases of `store`.
    pub fn new(store: Arc<dyn LeaseStore>) -> ClaimGate {
        ClaimGate {
            store,
            shared: Mutex::new(Shared {
                last: None,
                seen: HashMap::new(),
            }),
        }
    }

    /// Waits until `plugin` may start in `term` (`true`), or the term is
    /// over first (`false`). `claims` are this host's claims under the
    /// term's lease; `poll` is how often to look again while it waits.
    pub async fn admit(&self, plugin: &str, term: &Arc<Term>, claims: &LeaseClaims, poll: Duration) -> bool {
        let lease = term.lease();
        let mut retracted = false;
        let mut told: Option<Vec<Rival>> = None;
        let admitted = loop {
            if !retracted && !confirmed(plugin, term).await {
                break false;
            }
            // A hung store delays the start, never past the term.
            let listed = tokio::select! {
                listed = self.rivals(plugin, lease, Instant::now()) => listed,
                _ = term.over() => break false,
            };
            let rivals = match listed {
                Ok(rivals) => rivals,
                Err(e) => {
                    tracing::warn!(plugin, lease, term = term.number(), error = %e, "leader task waits: the store cannot be listed to check that no other lease claims the plugin");
                    if !pause(term, poll).await {
                        break false;
                    }
                    continue;
                }
            };
            if rivals.is_empty() && !retracted {
                break true;
            }
            let first = rivals.iter().any(|r| r.lease.as_str() < lease);
            if told.as_ref() != Some(&rivals) && !rivals.is_empty() {
                let by: Vec<String> = rivals
                    .iter()
                    .map(|r| format!("lease {} (holder {}, term {})", r.lease, r.holder, r.term))
                    .collect();
                tracing::info!(
                    plugin,
                    lease,
                    term = term.number(),
                    claimed_by = by.join(", "),
                    "leader task waits: another lease claims the plugin; it starts once that claim is gone (dropped, released, taken over or expired)"
                );
                told = Some(rivals.clone());
            }
            match (retracted, first) {
                (false, true) => {
                    claims.retract(plugin);
                    retracted = true;
                }
                (true, false) => {
                    claims.restore(plugin);
                    retracted = false;
                    continue;
                }
                _ => {}
            }
            if !pause(term, poll).await {
                break false;
            }
        };
        if retracted {
            claims.restore(plugin);
        }
        if admitted && told.is_some() {
            tracing::info!(
                plugin,
                lease,
                term = term.number(),
                "leader task: no other lease claims the plugin now"
            );
        }
        admitted
    }

    /// The other leases whose live records claim `plugin`, by a listing
    /// begun at `after` or later.
    async fn rivals(&self, plugin: &str, lease: &str, after: Instant) -> Result<Vec<Rival>, StoreError> {
        let mut shared = self.shared.lock().await;
        let fresh = shared.last.as_ref().is_some_and(|l| l.began >= after);
        if !fresh {
            let began = Instant::now();
            // An unreadable lease counts as one absent: what it last
            // held, for its lease duration.
            let leases = self
                .store
                .list_readable()
                .await
                .map(|(leases, _)| Arc::new(leases));
            if let Ok(leases) = &leases {
                note(&mut shared.seen, leases, Instant::now());
            }
            shared.last = Some(Listing { began, leases });
        }
        let listing = shared.last.as_ref().expect("listed");
        listing.leases.clone()?;
        let now = Instant::now();
        Ok(shared
            .seen
            .iter()
            .filter(|(name, _)| name.as_str() != lease)
            .filter(|(_, s)| s.record.claims(plugin) && now < s.at + s.record.lease_duration)
            .map(|(name, s)| Rival {
                lease: name.clone(),
                holder: s.record.holder().unwrap_or_default().to_owned(),
                term: s.record.term,
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }
}

impl PartialOrd for Rival {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rival {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.lease, &self.holder, self.term).cmp(&(&other.lease, &other.holder, other.term))
    }
}

/// Updates `seen` by a listing read at `now`: a new version is first seen
/// now; a lease absent from the listing keeps its last record, first seen
/// absent now (as a deleted record reads).
fn note(seen: &mut HashMap<String, Sighting>, leases: &[(String, Versioned)], now: Instant) {
    let listed: BTreeSet<&str> = leases.iter().map(|(n, _)| n.as_str()).collect();
    for (name, v) in leases {
        let same = seen
            .get(name)
            .is_some_and(|s| s.version.as_deref() == Some(v.version.as_str()));
        if !same {
            seen.insert(
                name.clone(),
                Sighting {
                    version: Some(v.version.clone()),
                    record: v.record.clone(),
                    at: now,
                },
            );
        }
    }
    seen.retain(|name, s| {
        if listed.contains(name.as_str()) {
            return true;
        }
        if s.version.is_some() {
            s.version = None;
            s.at = now;
        }
        s.record.holder().is_some() && now < s.at + s.record.lease_duration
    });
}

/// Waits until a confirmed write of `term` lists `plugin`; `false` if the
/// term is over first.
async fn confirmed(plugin: &str, term: &Arc<Term>) -> bool {
    let mut claimed = term.claimed();
    tokio::select! {
        c = claimed.wait_for(|c| c.iter().any(|p| p == plugin)) => c.is_ok() && !term.is_over(),
        _ = term.over() => false,
    }
}

/// Sleeps `poll`; `false` if the term is over first.
async fn pause(term: &Arc<Term>, poll: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(poll) => !term.is_over(),
        _ = term.over() => false,
    }
}

#[cfg(test)]
mod tests;
