//! Spreading the leads over the hosts: which host prefers which lease, and
//! the task that steers this host's electors by it.
//!
//! Every host keeps a *membership record* in the lease store: a lease named
//! [`MEMBER_PREFIX`] + its identity, held by the host itself and renewed
//! like any lease ([`member_lease`]). A host is *live* while its record is
//! held and not expired, judged as electors judge a lease: from when the
//! record was seen to change plus the duration written in it ([`Roster`]).
//! From the live hosts and its own leases each host computes the same
//! preferred host per lease ([`assign`]): a bounded-load rendezvous
//! assignment, so each host prefers `floor(M / N)` or `ceil(M / N)` of `M`
//! leases on `N` live hosts, and which host prefers which lease depends
//! only on the names.
//!
//! The [`Spreader`] turns that into each elector's [`Intent`]: contend for
//! a preferred lease; defer on the others ([`Intent::Defer`]): take one
//! that expired at once, one that was released (or never written) only
//! after the preferred host's head start, and lead on in one already led
//! here. Once the view of the live hosts has been steady for the settle
//! time, a lease led here but preferred elsewhere is handed over
//! ([`Intent::HandOver`]: drain, then release). If its preferred host does
//! not take it (it does not serve that lease, or still sees other hosts),
//! whoever takes it next keeps it, and it is handed over again under the
//! same view only after a wait that doubles each time, so hosts that
//! disagree for long move a lease a few times an hour at most. Views agree
//! within a listing or two: every host lists the same records every retry
//! period, and the settle time is two of them.
//!
//! A yield (`baton yield`: [`Intent::StandBy`]) wins over spreading for
//! its duration: the spreader leaves a standing-by elector alone, and does
//! not hand a lease back to a preferred host that yielded it (as the
//! release said, [`LeaseView::yielded`]) until that host's stand-by is
//! over; then the lease goes to its preferred host once, the graceful way.
//! The others take a yielded lease at once, without the head start (the
//! elector's rule, see [`Intent::Defer`]).
//!
//! The leases a reload adds or removes reach the spreader as
//! [`LeaseChange`]s: the assignment is computed again at once (a new view,
//! so hand-overs wait for the settle time again and their waits start
//! over), an added lease is steered from its start (its elector is created
//! deferring, [`Intent::Defer`], and told to contend at once if this host
//! prefers it), and a removed lease's elector is told to stop
//! ([`Intent::Stop`]: drain, release) and no longer steered. Hosts that
//! have not reloaded yet compute other assignments meanwhile (see below).
//!
//! The same listing gives the live hosts that guests of
//! `baton:leader@0.2.0` see ([`Hosts`]). A host whose spreading is off keeps
//! its membership record (and lists) only when one of its plugins asks for
//! them, with no leases to steer.
//!
//! A spreader runs with fixed settings ([`SpreadConfig`]) and steers or
//! not for its whole life. A reload that changes either (spreading turned
//! on or off, new `[spread]` settings or membership timings, the first
//! lease added, a plugin that counts the live hosts added or removed) has
//! [`serve`](crate::serve) replace it: the old one is stopped (its
//! membership record released), the leases it steered are set back to
//! [`Intent::Contend`] if the new one does not steer ([`unsteer`]), and a
//! new one starts with the leases as they are. Until its first listing a
//! spreader changes no intent (the electors go on as they were), so the
//! leases are steered from that listing on. Meanwhile the other hosts may
//! list this host as absent once: they spread the leases without it, for
//! a listing or two, which changes only who tries first for a lease that
//! becomes free then (a hand-over waits for a view steady for the settle
//! time, longer than the gap).
//!
//! None of this touches safety: who may lead is decided by the lease alone,
//! as without spreading. Spreading decides only who tries first.
//!
//! The membership records are listed every retry period. The embedded
//! store reads its directory; the Kubernetes store reads the listing from
//! its watch of the namespace while that is in sync, with no request (a
//! record without baton's labels, as a baton from before them wrote, is
//! not counted; see [its documentation](crate::store::kube#listing-membership-records)).
//!
//! Unstable: hosts with different sets of leases compute different
//! assignments (harmless, but the spread is then uneven).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::clock::TermClock;
use super::elector::{Elector, ElectorConfig, Intent};
use super::status::{LeaseView, Role};
use super::timing::Timings;
use crate::store::{LeaseStore, Versioned};

/// The name prefix of membership records. Lease names of the
/// configuration may not start with it, so `baton status` and watches of
/// the store tell them apart.
pub const MEMBER_PREFIX: &str = "baton-member.";

/// The default head start of a lease's preferred host after a release:
/// seeing the release (a watch event) and writing the lease take
/// milliseconds on either store; a second leaves room for a busy host. It
/// delays only a released lease whose preferred host is absent, never a
/// lease whose holder died (that one expires, and any host takes it).
pub const DEFAULT_HEAD_START: Duration = Duration::from_secs(1);

/// The membership record's lease name for `identity`: [`MEMBER_PREFIX`],
/// then the identity made a valid lease name (lowercase; characters other
/// than letters, digits and `-` become `-`), then, when that changed
/// the identity, a short hash of it so that two identities never share a
/// record.
///
/// ```
/// use baton::election::member_lease;
///
/// assert_eq!(member_lease("node-a"), "baton-member.node-a");
/// assert!(member_lease("Node_A").starts_with("baton-member.node-a-"));
/// assert_ne!(member_lease("Node_A"), member_lease("node_a"));
/// ```
pub fn member_lease(identity: &str) -> String {
    let mut name: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    name = name.trim_matches('-').to_owned();
    if name != identity || name.is_empty() {
        let digest = Sha256::digest(identity.as_bytes());
        let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        name = if name.is_empty() {
            tag
        } else {
            format!("{name}-{tag}")
        };
    }
    // A lease name is at most 253 characters; keep the tail (the hash).
    let max = 253 - MEMBER_PREFIX.len();
    if name.len() > max {
        name = name[name.len() - max..].trim_start_matches('-').to_owned();
    }
    format!("{MEMBER_PREFIX}{name}")
}

/// A stable 64-bit score of `lease` on `host` (the first bytes of SHA-256:
/// the same on every host, architecture and version).
fn score(lease: &str, host: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(lease.as_bytes());
    h.update([0]);
    h.update(host.as_bytes());
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The preferred host of each lease: a bounded-load rendezvous assignment.
///
/// Each lease ranks the hosts by a hash of (lease, host); the leases, taken
/// in the order of a hash of their names, each go to the highest-ranked host
/// that still has a place: `floor(M / N)` places each, and `M mod N` extra
/// places for whichever hosts come to them first. So every host gets
/// `floor(M / N)` or one more, and the result depends only on the names,
/// never on their order. No hosts: empty.
///
/// ```
/// use baton::election::assign;
///
/// let leases: Vec<String> = (0..30).map(|i| format!("lease-{i}")).collect();
/// let hosts = ["a", "b", "c"].map(String::from);
/// let preferred = assign(&leases, &hosts);
/// for h in &hosts {
///     assert_eq!(preferred.values().filter(|p| *p == h).count(), 10);
/// }
/// ```
pub fn assign(leases: &[String], hosts: &[String]) -> BTreeMap<String, String> {
    let hosts: BTreeSet<&String> = hosts.iter().collect();
    let leases: BTreeSet<&String> = leases.iter().collect();
    let mut out = BTreeMap::new();
    if hosts.is_empty() {
        return out;
    }
    // Every host takes floor(M / N); M mod N of them one more.
    let floor = leases.len() / hosts.len();
    let mut extra = leases.len() % hosts.len();
    let mut order: Vec<&String> = leases.into_iter().collect();
    order.sort_by_cached_key(|l| (score(l, ""), *l));
    let mut load: HashMap<&String, usize> = HashMap::new();
    for lease in order {
        let mut ranked: Vec<&String> = hosts.iter().copied().collect();
        ranked.sort_by_cached_key(|h| (std::cmp::Reverse(score(lease, h)), *h));
        let host = ranked
            .into_iter()
            .find(|h| {
                let n = load.get(h).copied().unwrap_or(0);
                n < floor || (n == floor && extra > 0)
            })
            .expect("N * floor + extra places for M leases");
        let n = load.entry(host).or_default();
        if *n == floor {
            extra -= 1;
        }
        *n += 1;
        out.insert(lease.clone(), host.clone());
    }
    out
}

/// The membership records a host has seen, and when each last changed.
#[derive(Debug, Default)]
pub struct Roster {
    seen: BTreeMap<String, (Versioned, Instant)>,
}

impl Roster {
    /// Takes in a listing of the store (every lease; other than membership
    /// records are ignored), seen at `at`. A record that changed version is
    /// dated `at`; one that is gone from the listing is forgotten.
    pub fn observe(&mut self, listing: &[(String, Versioned)], at: Instant) {
        let mut fresh = BTreeMap::new();
        for (name, v) in listing.iter().filter(|(n, _)| n.starts_with(MEMBER_PREFIX)) {
            let since = match self.seen.get(name) {
                Some((old, since)) if old.version == v.version => *since,
                _ => at,
            };
            fresh.insert(name.clone(), (v.clone(), since));
        }
        self.seen = fresh;
    }

    /// The membership records (name, version) unchanged at `now` for
    /// their lease duration plus `forget_after`, except `own`: records of
    /// hosts long gone, expired or released. Dated by local first sight,
    /// as expiry is, so a host that started a moment ago waits the whole
    /// time too.
    pub fn forgotten(&self, now: Instant, forget_after: Duration, own: &str) -> Vec<(String, String)> {
        self.seen
            .iter()
            .filter(|(name, (v, since))| {
                name.as_str() != own && now >= *since + v.record.lease_duration + forget_after
            })
            .map(|(name, (v, _))| (name.clone(), v.version.clone()))
            .collect()
    }

    /// The identities of the hosts whose membership record is held and
    /// has not expired at `now`, sorted.
    pub fn live(&self, now: Instant) -> Vec<String> {
        let live: BTreeSet<String> = self
            .seen
            .values()
            .filter(|(v, since)| now < *since + v.record.lease_duration)
            .filter_map(|(v, _)| v.record.holder().map(str::to_owned))
            .collect();
        live.into_iter().collect()
    }
}

/// The live hosts as this host last saw them in the store: what guests of
/// `baton:leader@0.2.0` get from `current-hosts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hosts {
    /// How many membership records are held and not expired, this host's
    /// own included.
    pub live: u32,
    /// Whether this host's own record is among them.
    pub this_host_live: bool,
}

impl Hosts {
    /// The live hosts of `live` (sorted identities), for `identity`.
    pub fn of(live: &[String], identity: &str) -> Hosts {
        Hosts {
            live: u32::try_from(live.len()).unwrap_or(u32::MAX),
            this_host_live: live.binary_search_by(|h| h.as_str().cmp(identity)).is_ok(),
        }
    }
}

/// How a [`Spreader`] works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpreadConfig {
    /// The timings of this host's membership record; its retry period is
    /// also how often the store is listed.
    pub member_timings: Timings,
    /// How long after a release a host that does not prefer the lease
    /// waits before taking it ([`DEFAULT_HEAD_START`]).
    pub head_start: Duration,
    /// How long the view of the live hosts must stay the same before a
    /// lease this host leads is handed to the host that prefers it: a
    /// rolling restart or a host that flickers moves no lease back and
    /// forth.
    pub settle: Duration,
    /// How long a membership record must have stayed unchanged past its
    /// lease duration before the hosts delete it ([`DEFAULT_FORGET_AFTER`]).
    pub forget_after: Duration,
}

/// The default of [`SpreadConfig::forget_after`]: a host gone this long is
/// not paused but gone; its record only lengthens every listing. (One
/// that comes back after all writes its record again: the record gates no
/// task.)
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(3600);

impl std::fmt::Display for SpreadConfig {
    /// In words, for the log: `membership record of 7s renewed every 2s
    /// (renew deadline 3s), head start 1s, settle 4s, records of hosts gone
    /// for 1h deleted`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.member_timings;
        let h = |d: Duration| humantime::format_duration(d).to_string();
        write!(
            f,
            "membership record of {} renewed every {} (renew deadline {}), head start {}, settle {}, \
             records of hosts gone for {} deleted",
            h(t.lease_duration),
            h(t.retry_period),
            h(t.renew_deadline),
            h(self.head_start),
            h(self.settle),
            h(self.forget_after)
        )
    }
}

/// One lease this host serves, as the spreader steers it.
pub struct SteeredLease {
    /// The lease's name.
    pub name: String,
    /// Its elector's intent.
    pub intent: watch::Sender<Intent>,
    /// Its elector's status.
    pub view: watch::Receiver<LeaseView>,
}

/// A change of the leases a [`Spreader`] steers (a reload).
pub enum LeaseChange {
    /// Steer this lease too, from now on. Its elector should start
    /// deferring ([`Intent::Defer`]): the spreader tells it to contend if
    /// this host prefers the lease.
    Add(SteeredLease),
    /// Stop steering the lease of this name, and tell its elector to stop
    /// ([`Intent::Stop`]: drain, release, return).
    Remove(String),
}

/// Sets an elector's intent back to [`Intent::Contend`] when nothing
/// steers it any more (spreading turned off by a reload), as the spreader
/// would: never over a stop, nor over a stand-by whose time is not up.
pub fn unsteer(intent: &watch::Sender<Intent>) {
    steer(intent, Intent::Contend);
}

/// Sets an elector's intent unless it was told to stop (a stop is never
/// taken back) or stands by after a yield (`baton yield` wins over
/// spreading until its time is up).
fn steer(intent: &watch::Sender<Intent>, to: Intent) {
    intent.send_if_modified(|now| {
        let yielding = matches!(*now, Intent::StandBy { until } if Instant::now() < until);
        if *now == Intent::Stop || yielding || *now == to {
            return false;
        }
        *now = to;
        true
    });
}

/// The hand-overs of one lease under one view of the live hosts.
#[derive(Clone, Copy, Debug, Default)]
struct HandOvers {
    /// The view's number.
    epoch: u64,
    /// How many, and when the last one was.
    count: u32,
    last: Option<Instant>,
}

/// The longest wait between two hand-overs of a lease under one view, in
/// settle times: the wait doubles from one settle time after each
/// hand-over that its preferred host did not take, up to 64 (about four
/// minutes with the defaults), so hosts that disagree for long move a
/// lease a few times an hour at most.
const MAX_RETRY_SETTLES: u32 = 64;

/// Keeps this host's membership record and steers its electors; see the
/// [module documentation](self).
pub struct Spreader {
    identity: String,
    store: Arc<dyn LeaseStore>,
    cfg: SpreadConfig,
    leases: Vec<SteeredLease>,
    roster: Roster,
    /// The live hosts as last computed, since when they are so, and how
    /// many times they changed.
    view: Vec<String>,
    view_since: Instant,
    epoch: u64,
    /// The preferred host of each lease under the view numbered so.
    preferred: (u64, BTreeMap<String, String>),
    /// The hand-overs of each lease under the current view.
    handed: HashMap<String, HandOvers>,
    /// Where the live hosts are published (for guests).
    hosts: watch::Sender<Hosts>,
    /// Leases added and removed at run time ([`Spreader::follow`]).
    changes: Option<mpsc::UnboundedReceiver<LeaseChange>>,
}

impl Spreader {
    /// A spreader for the host `identity`, steering `leases` (none: it only
    /// keeps the membership record and publishes the live hosts), and
    /// publishing the live hosts in `hosts`.
    pub fn new(
        identity: &str,
        store: Arc<dyn LeaseStore>,
        cfg: SpreadConfig,
        leases: Vec<SteeredLease>,
        hosts: watch::Sender<Hosts>,
    ) -> Spreader {
        Spreader {
            identity: identity.to_owned(),
            store,
            cfg,
            leases,
            roster: Roster::default(),
            view: vec![identity.to_owned()],
            view_since: Instant::now(),
            epoch: 0,
            preferred: (u64::MAX, BTreeMap::new()),
            handed: HashMap::new(),
            hosts,
            changes: None,
        }
    }

    /// Takes lease additions and removals from `changes` while it runs
    /// (see the [module documentation](self)).
    pub fn follow(mut self, changes: mpsc::UnboundedReceiver<LeaseChange>) -> Spreader {
        self.changes = Some(changes);
        self
    }

    /// Takes in a lease added or removed at `now`: the leases are spread
    /// again at the next steering (a new view: hand-overs wait for the
    /// settle time again, and their waits start over); a removed lease's
    /// elector is told to stop.
    pub fn change(&mut self, change: LeaseChange, now: Instant) {
        match change {
            LeaseChange::Add(lease) => {
                tracing::info!(lease = %lease.name, "lease added: the leases are spread again");
                self.leases.retain(|l| l.name != lease.name);
                self.leases.push(lease);
            }
            LeaseChange::Remove(name) => {
                let Some(i) = self.leases.iter().position(|l| l.name == name) else {
                    return;
                };
                let lease = self.leases.remove(i);
                lease.intent.send_replace(Intent::Stop);
                self.handed.remove(&name);
                tracing::info!(lease = %name, "lease removed: no longer steered; the leases are spread again");
            }
        }
        self.view_since = now;
        self.epoch += 1;
    }

    /// Runs until `stop` is cancelled: keeps the membership record (its
    /// own elector, released on the way out) and, every retry period,
    /// lists the store and steers the electors.
    pub async fn run(mut self, clock: TermClock, stop: CancellationToken) {
        let member = ElectorConfig {
            lease: member_lease(&self.identity),
            identity: self.identity.clone(),
            timings: self.cfg.member_timings,
        };
        let (elector, mut member_status, member_intent) = Elector::new(member, self.store.clone(), clock);
        let membership = tokio::spawn(elector.run());
        let period = self.cfg.member_timings.retry_period;
        // The first listing waits (a retry period at most) for this host's
        // own record, so that guests do not see a count without it first.
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = timeout(period, member_status.wait_for(|v| v.status.role != Role::Pending)) => {}
        }
        let mut changes = self.changes.take();
        let mut next = Instant::now();
        // Nothing is steered before the first listing: without one, this
        // host would see itself alone and prefer every lease.
        let mut listed = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sleep_until(next) => {}
                change = next_change(&mut changes) => {
                    // Steered at once, on the last listing.
                    let now = Instant::now();
                    self.change(change, now);
                    if listed {
                        self.steer_now(now);
                    }
                    continue;
                }
            }
            listed = true;
            next = Instant::now() + period;
            match timeout(
                self.cfg.member_timings.request_timeout,
                self.store.list_prefixed(MEMBER_PREFIX),
            )
            .await
            {
                Ok(Ok(listing)) => self.roster.observe(&listing, Instant::now()),
                Ok(Err(e)) => tracing::debug!(error = %e, "listing the hosts failed; keeping the last view"),
                Err(_) => tracing::debug!("listing the hosts timed out; keeping the last view"),
            }
            let now = Instant::now();
            // Counted again even when the listing failed: records seen
            // before expire meanwhile, this host's own included.
            let live = self.roster.live(now);
            let hosts = Hosts::of(&live, &self.identity);
            self.hosts
                .send_if_modified(|h| std::mem::replace(h, hosts) != hosts);
            self.steer_all(now, live);
            self.forget_gone(now).await;
        }
        member_intent.send_replace(Intent::Stop);
        let _ = timeout(self.cfg.member_timings.renew_deadline, membership).await;
    }

    /// Deletes the membership records of hosts gone for
    /// [`SpreadConfig::forget_after`] ([`Roster::forgotten`]), each only if
    /// it is still the version seen ([`LeaseStore::delete_if`]): a host
    /// that wrote its record since keeps it. Every host does this; the
    /// first delete wins and the others find the record changed or gone.
    async fn forget_gone(&mut self, now: Instant) {
        let own = member_lease(&self.identity);
        for (name, version) in self.roster.forgotten(now, self.cfg.forget_after, &own) {
            let bound = self.cfg.member_timings.request_timeout;
            match timeout(bound, self.store.delete_if(&name, &version)).await {
                Ok(Ok(true)) => {
                    tracing::info!(record = %name, gone_for = %humantime::format_duration(self.cfg.forget_after),
                    "membership record of a host gone for long deleted")
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(record = %name, error = %e, "deleting a gone host's membership record failed")
                }
                Err(_) => {
                    tracing::debug!(record = %name, "deleting a gone host's membership record timed out")
                }
            }
        }
    }

    /// Steers every lease at `now`, from the live hosts of the last
    /// listing (taken in by [`Roster::observe`]).
    pub fn steer_now(&mut self, now: Instant) {
        let live = self.roster.live(now);
        self.steer_all(now, live);
    }

    /// Whether a lease led here may be handed over now: not yet under this
    /// view, or its last hand-over long enough ago (the preferred host did
    /// not take it: it saw other hosts then, or does not serve the lease).
    fn may_hand_over(&self, lease: &str, now: Instant) -> bool {
        match self.handed.get(lease) {
            Some(h) if h.epoch == self.epoch => {
                let wait = self.cfg.settle * (1u32 << h.count.min(MAX_RETRY_SETTLES.ilog2()));
                h.last.is_none_or(|last| now >= last + wait)
            }
            _ => true,
        }
    }

    /// Recomputes the view and every lease's intent at `now`, from the
    /// `live` hosts (sorted) the roster counts then.
    fn steer_all(&mut self, now: Instant, mut live: Vec<String>) {
        if !live.contains(&self.identity) {
            live.push(self.identity.clone());
            live.sort();
        }
        if live != self.view {
            if self.leases.is_empty() {
                tracing::info!(hosts = live.len(), live = %live.join(","), "the live hosts changed");
            } else {
                tracing::info!(hosts = live.len(), live = %live.join(","), "the live hosts changed; leases are spread again");
            }
            self.view = live;
            self.view_since = now;
            self.epoch += 1;
        }
        let settled = now >= self.view_since + self.cfg.settle;
        if self.preferred.0 != self.epoch {
            // Computed once per view, not every retry period.
            let names: Vec<String> = self.leases.iter().map(|l| l.name.clone()).collect();
            self.preferred = (self.epoch, assign(&names, &self.view));
        }
        let preferred = &self.preferred.1;
        for lease in &self.leases {
            let Some(host) = preferred.get(&lease.name) else {
                continue;
            };
            let (status, yielded) = {
                let view = lease.view.borrow();
                (view.status.clone(), view.yielded.clone())
            };
            // The preferred host yielded this lease (`baton yield`) and does
            // not contend for it yet: it is not handed back before then.
            let preferred_yields = yielded.is_some_and(|y| y.by == *host && now < y.until);
            let current = *lease.intent.borrow();
            let head_start = self.cfg.head_start;
            let to = match current {
                _ if *host == self.identity => Intent::Contend,
                // A hand-over under way (the term is resigning, or was
                // released and nobody took it yet).
                Intent::HandOver { term, .. } if status.term == term && status.role != Role::Following => {
                    current
                }
                // Led here, preferred elsewhere, the view steady, and not
                // handed over lately under this view: hand it over.
                _ if status.role == Role::Leading
                    && settled
                    && !preferred_yields
                    && self.may_hand_over(&lease.name, now) =>
                {
                    tracing::info!(lease = %lease.name, term = status.term, to = %host, "handing the lease over to the host that prefers it");
                    let epoch = self.epoch;
                    let h = self.handed.entry(lease.name.clone()).or_default();
                    if h.epoch != epoch {
                        *h = HandOvers {
                            epoch,
                            ..HandOvers::default()
                        };
                    }
                    h.count += 1;
                    h.last = Some(now);
                    Intent::HandOver {
                        term: status.term,
                        head_start,
                    }
                }
                // Lead on if leading; let the preferred host go first.
                _ => Intent::Defer { head_start },
            };
            steer(&lease.intent, to);
        }
    }
}

/// The next lease change; pending forever without (more of) them.
async fn next_change(changes: &mut Option<mpsc::UnboundedReceiver<LeaseChange>>) -> LeaseChange {
    if let Some(rx) = changes {
        if let Some(change) = rx.recv().await {
            return change;
        }
        *changes = None;
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn loads(a: &BTreeMap<String, String>, hosts: &[String]) -> Vec<usize> {
        hosts
            .iter()
            .map(|h| a.values().filter(|p| *p == h).count())
            .collect()
    }

    #[test]
    fn every_host_gets_at_most_the_ceiling_and_the_rest_fill_up() {
        for (m, n) in [(30, 3), (30, 2), (31, 3), (100, 7), (5, 8), (1, 3), (0, 2)] {
            let leases = names("lease-", m);
            let hosts = names("host-", n);
            let a = assign(&leases, &hosts);
            assert_eq!(a.len(), m);
            let l = loads(&a, &hosts);
            assert!(
                l.iter().all(|&x| x == m / n || x == m.div_ceil(n)),
                "{m} on {n}: {l:?}"
            );
        }
    }

    #[test]
    fn the_assignment_depends_only_on_the_names() {
        let leases = names("jobs.", 20);
        let hosts = names("node-", 4);
        let mut rl = leases.clone();
        rl.reverse();
        let mut rh = hosts.clone();
        rh.reverse();
        assert_eq!(assign(&leases, &hosts), assign(&rl, &rh));
    }

    #[test]
    fn a_host_joining_or_leaving_moves_few_leases() {
        // The least a join can move is M / (N + 1); bounded loads move more
        // than plain rendezvous hashing, but stay within a small multiple.
        let leases = names("lease-", 30);
        let three = names("host-", 3);
        let four = names("host-", 4);
        let a = assign(&leases, &three);
        let b = assign(&leases, &four);
        let moved = leases.iter().filter(|l| a[*l] != b[*l]).count();
        assert!(moved <= 2 * 30 / 4 + 1, "a join moved {moved} of 30");
        let two = names("host-", 2);
        let c = assign(&leases, &two);
        let moved = leases.iter().filter(|l| a[*l] != c[*l]).count();
        assert!(moved <= 2 * 30 / 3 + 1, "a leave moved {moved} of 30");
    }

    #[test]
    fn member_leases_are_valid_lease_names_and_distinct() {
        for id in [
            "node-a",
            "Node_A",
            "node_a",
            "a.b",
            "-x-",
            "___",
            &"x".repeat(300),
        ] {
            let name = member_lease(id);
            crate::store::validate_lease_name(&name).unwrap_or_else(|e| panic!("{id:?}: {e}"));
            assert!(name.starts_with(MEMBER_PREFIX));
        }
        assert_ne!(member_lease("Node_A"), member_lease("node_a"));
        assert_ne!(member_lease("___"), member_lease("__"));
    }

    use crate::election::tests::timings;
    use crate::store::memory::MemoryStore;
    use tokio::task::JoinHandle;

    /// A host: its electors and its spreader, on its own client of one store.
    struct Host {
        views: Vec<(String, watch::Receiver<LeaseView>)>,
        intents: Vec<watch::Sender<Intent>>,
        tasks: Vec<JoinHandle<()>>,
        hosts: watch::Receiver<Hosts>,
        identity: String,
        client: Arc<dyn LeaseStore>,
        clock: TermClock,
        changes: mpsc::UnboundedSender<LeaseChange>,
        hosts_tx: watch::Sender<Hosts>,
        /// Its spreader, if one runs: its settings, stop and task.
        spreader: Option<(SpreadConfig, CancellationToken, JoinHandle<()>)>,
    }

    const HEAD_START: Duration = Duration::from_millis(500);

    fn spread_cfg() -> SpreadConfig {
        SpreadConfig {
            forget_after: DEFAULT_FORGET_AFTER,
            member_timings: timings(),
            head_start: HEAD_START,
            settle: Duration::from_secs(2),
        }
    }

    /// An elector of `name` for `identity`, started with `initial`.
    fn elector(
        client: &Arc<dyn LeaseStore>,
        clock: &TermClock,
        identity: &str,
        name: &str,
        initial: Option<Intent>,
    ) -> (JoinHandle<()>, SteeredLease) {
        let cfg = ElectorConfig {
            lease: name.to_owned(),
            identity: identity.into(),
            timings: timings(),
        };
        let (elector, view, intent) = Elector::new(cfg, client.clone(), clock.clone());
        if let Some(initial) = initial {
            intent.send_replace(initial);
        }
        let task = tokio::spawn(async move {
            let _ = elector.run().await;
        });
        let lease = SteeredLease {
            name: name.to_owned(),
            intent,
            view,
        };
        (task, lease)
    }

    impl Host {
        fn start(store: &MemoryStore, clock: &TermClock, identity: &str, leases: &[String]) -> Host {
            Host::start_with(store, clock, identity, leases, Some(spread_cfg()))
        }

        /// A host of `leases`, spreading with `spread` (`None`: off).
        fn start_with(
            store: &MemoryStore,
            clock: &TermClock,
            identity: &str,
            leases: &[String],
            spread: Option<SpreadConfig>,
        ) -> Host {
            let client: Arc<dyn LeaseStore> = Arc::new(store.client());
            let mut tasks = Vec::new();
            let mut steered = Vec::new();
            let mut views = Vec::new();
            let mut intents = Vec::new();
            for name in leases {
                let (task, lease) = elector(&client, clock, identity, name, None);
                tasks.push(task);
                views.push((name.clone(), lease.view.clone()));
                intents.push(lease.intent.clone());
                steered.push(lease);
            }
            let (hosts_tx, hosts) = watch::channel(Hosts::default());
            let (changes, _) = mpsc::unbounded_channel();
            let mut host = Host {
                views,
                intents,
                tasks,
                hosts,
                identity: identity.to_owned(),
                client,
                clock: clock.clone(),
                changes,
                hosts_tx,
                spreader: None,
            };
            if let Some(cfg) = spread {
                host.start_spreader(cfg, steered);
            }
            host
        }

        fn start_spreader(&mut self, cfg: SpreadConfig, steered: Vec<SteeredLease>) {
            let (changes, changes_rx) = mpsc::unbounded_channel();
            let spreader = Spreader::new(
                &self.identity,
                self.client.clone(),
                cfg,
                steered,
                self.hosts_tx.clone(),
            )
            .follow(changes_rx);
            let stop = CancellationToken::new();
            let task = tokio::spawn(spreader.run(self.clock.clone(), stop.clone()));
            self.changes = changes;
            self.spreader = Some((cfg, stop, task));
        }

        /// A reload changes spreading to `spread`, as `baton run` applies
        /// it: the running spreader is stopped and awaited, the leases set
        /// back to contending if spreading is now off, and a new spreader
        /// started with every lease.
        async fn respread(&mut self, spread: Option<SpreadConfig>) {
            if let Some((_, stop, task)) = self.spreader.take() {
                stop.cancel();
                task.await.unwrap();
            }
            match spread {
                None => {
                    for intent in &self.intents {
                        unsteer(intent);
                    }
                }
                Some(cfg) => {
                    let steered = self
                        .views
                        .iter()
                        .zip(&self.intents)
                        .map(|((name, view), intent)| SteeredLease {
                            name: name.clone(),
                            intent: intent.clone(),
                            view: view.clone(),
                        })
                        .collect();
                    self.start_spreader(cfg, steered);
                }
            }
        }

        /// Each lease's term, in order.
        fn terms(&self) -> Vec<u64> {
            self.views.iter().map(|(_, v)| v.borrow().status.term).collect()
        }

        /// A reload adds `name`: its elector starts deferring, as `baton
        /// run` starts it, and the spreader steers it.
        fn add(&mut self, name: &str) {
            let initial = Intent::Defer {
                head_start: HEAD_START,
            };
            let (task, lease) = elector(&self.client, &self.clock, &self.identity, name, Some(initial));
            self.tasks.push(task);
            self.views.push((name.to_owned(), lease.view.clone()));
            self.intents.push(lease.intent.clone());
            self.changes.send(LeaseChange::Add(lease)).unwrap();
        }

        /// A reload removes `name`.
        fn remove(&self, name: &str) {
            self.changes.send(LeaseChange::Remove(name.to_owned())).unwrap();
        }

        fn intent(&self, name: &str) -> Intent {
            let i = self.views.iter().position(|(n, _)| n == name).unwrap();
            *self.intents[i].borrow()
        }

        fn leads(&self, name: &str) -> bool {
            self.views
                .iter()
                .any(|(n, v)| n == name && v.borrow().status.is_leading())
        }

        /// Waits until this host counts `live` hosts, itself among them.
        async fn counts(&self, live: u32, within: Duration) {
            let want = Hosts {
                live,
                this_host_live: true,
            };
            let mut rx = self.hosts.clone();
            let seen = timeout(within, rx.wait_for(|h| *h == want)).await;
            assert!(seen.is_ok(), "counts {:?}, want {want:?}", *self.hosts.borrow());
        }

        fn leading(&self) -> usize {
            self.views
                .iter()
                .filter(|(_, v)| v.borrow().status.is_leading())
                .count()
        }

        /// Dies: nothing is released.
        fn kill(self) {
            for t in self.tasks {
                t.abort();
            }
            if let Some((_, _, task)) = self.spreader {
                task.abort();
            }
        }
    }

    fn leads(hosts: &[&Host]) -> Vec<usize> {
        hosts.iter().map(|h| h.leading()).collect()
    }

    /// No lease is led by two hosts at once.
    fn no_overlap(hosts: &[&Host], leases: &[String]) {
        for l in leases {
            let n = hosts
                .iter()
                .filter(|h| {
                    h.views
                        .iter()
                        .any(|(name, v)| name == l && v.borrow().status.is_leading())
                })
                .count();
            assert!(n <= 1, "{l} led by {n} hosts");
        }
    }

    /// Hosts `a` and `b` spreading two leases, settled at one each; and the
    /// index of the lease `a` leads.
    async fn two_hosts_settled(store: &MemoryStore, clock: &TermClock) -> (Vec<String>, Host, Host, usize) {
        let leases = names("lease-", 2);
        let a = Host::start(store, clock, "a", &leases);
        let b = Host::start(store, clock, "b", &leases);
        settle(&[&a, &b], &leases, &[1, 1], Duration::from_secs(20)).await;
        let i = a
            .views
            .iter()
            .position(|(_, v)| v.borrow().status.is_leading())
            .unwrap();
        (leases, a, b, i)
    }

    async fn settle(hosts: &[&Host], leases: &[String], want: &[usize], within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            no_overlap(hosts, leases);
            if leads(hosts) == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "leads {:?}, want {want:?}",
                leads(hosts)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn three_hosts_share_the_leases_and_the_survivors_take_a_dead_hosts_share() {
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let leases = names("lease-", 12);
        let a = Host::start(&store, &clock, "a", &leases);
        // a takes everything while alone; b and c join and get their share
        // handed over.
        settle(&[&a], &leases, &[12], Duration::from_secs(5)).await;
        let b = Host::start(&store, &clock, "b", &leases);
        let c = Host::start(&store, &clock, "c", &leases);
        settle(&[&a, &b, &c], &leases, &[4, 4, 4], Duration::from_secs(20)).await;
        for h in [&a, &b, &c] {
            h.counts(3, Duration::ZERO).await;
        }
        // Steady: nothing moves any more.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(leads(&[&a, &b, &c]), [4, 4, 4]);
        // c dies: its leases expire (10 s) and a and b share all of them.
        c.kill();
        settle(&[&a, &b], &leases, &[6, 6], Duration::from_secs(30)).await;
        a.counts(2, Duration::from_secs(2)).await;
        b.counts(2, Duration::from_secs(2)).await;
        // It comes back: the share is 4 each again.
        let c = Host::start(&store, &clock, "c", &leases);
        settle(&[&a, &b, &c], &leases, &[4, 4, 4], Duration::from_secs(30)).await;
        for h in [&a, &b, &c] {
            h.counts(3, Duration::from_secs(2)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_record_of_a_host_gone_for_long_is_deleted_and_written_again_when_it_comes_back() {
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let leases = names("lease-", 2);
        let forget_after = Duration::from_secs(30);
        let cfg = SpreadConfig {
            forget_after,
            ..spread_cfg()
        };
        let a = Host::start_with(&store, &clock, "a", &leases, Some(cfg));
        let b = Host::start_with(&store, &clock, "b", &leases, Some(cfg));
        a.counts(2, Duration::from_secs(5)).await;
        // b dies: its record expires (10 s), then stays for forget_after
        // and a little more (one listing), then is gone; a's stays.
        b.kill();
        a.counts(1, Duration::from_secs(12)).await;
        tokio::time::sleep(forget_after - Duration::from_secs(2)).await;
        assert!(store.peek(&member_lease("b")).is_some(), "deleted too early");
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(store.peek(&member_lease("b")).is_none(), "not deleted");
        assert!(store.peek(&member_lease("a")).is_some(), "its own record");
        // A deleted record is not a tombstone for a: b coming back is
        // counted again.
        let b = Host::start_with(&store, &clock, "b", &leases, Some(cfg));
        a.counts(2, Duration::from_secs(5)).await;
        b.counts(2, Duration::from_secs(5)).await;
        // Released records go too (a host stopped the clean way).
        b.spreader.as_ref().unwrap().1.cancel();
        a.counts(1, Duration::from_secs(5)).await;
        tokio::time::sleep(forget_after + Duration::from_secs(12)).await;
        assert!(
            store.peek(&member_lease("b")).is_none(),
            "a released record stays"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_host_that_does_not_serve_its_preferred_leases_is_offered_them_less_and_less_often() {
        // b prefers some of a's leases but does not serve them: a hands each
        // over, takes it back after the head start, and offers it again
        // only after a wait that doubles.
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let leases = names("lease-", 6);
        let a = Host::start(&store, &clock, "a", &leases);
        settle(&[&a], &leases, &[6], Duration::from_secs(5)).await;
        let _b = Host::start(&store, &clock, "b", &[]);
        tokio::time::sleep(Duration::from_secs(75)).await;
        let early = a.terms();
        // Offered after 2 s (settle), then 4, 8, 16 and 32 s after each.
        assert!(early.iter().any(|&t| t > 1), "nothing was offered: {early:?}");
        assert!(early.iter().all(|&t| t <= 7), "offered too often: {early:?}");
        tokio::time::sleep(Duration::from_secs(60)).await;
        let late = a.terms();
        for (e, l) in early.iter().zip(&late) {
            assert!(
                l - e <= 1,
                "offered more than once in a minute: {early:?} -> {late:?}"
            );
        }
        assert_eq!(a.leading(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_yield_wins_over_spreading_for_its_time_then_the_lease_goes_back_once() {
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let (leases, a, b, i) = two_hosts_settled(&store, &clock).await;
        let (lease, a_view) = &a.views[i];
        let b_view = &b.views[i].1;
        let term = a_view.borrow().status.term;
        // a yields its lease for 30 s: b takes it at once, although a is
        // its preferred host (no head start: a does not want it).
        let yielded = Instant::now();
        a.intents[i].send_replace(Intent::StandBy {
            until: yielded + Duration::from_secs(30),
        });
        let mut rx = b_view.clone();
        rx.wait_for(|v| v.status.is_leading()).await.unwrap();
        assert!(
            yielded.elapsed() < Duration::from_millis(100),
            "b took {lease} {:?} after the yield",
            yielded.elapsed()
        );
        let b_term = b_view.borrow().status.term;
        assert_eq!(b_term, term + 1);
        // For the yield's time neither spreader moves it: a's does not make
        // a contend, b's does not hand it back to a (which would not take
        // it), in a loop or at all.
        for _ in 0..28 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            no_overlap(&[&a, &b], &leases);
            let now = b_view.borrow().status.clone();
            assert!(now.is_leading() && now.term == b_term, "{lease} moved: {now:?}");
            assert!(matches!(*a.intents[i].borrow(), Intent::StandBy { .. }));
        }
        // Then it goes back to a, which prefers it, once, and stays.
        let mut rx = a_view.clone();
        timeout(Duration::from_secs(10), rx.wait_for(|v| v.status.is_leading()))
            .await
            .expect("the lease goes back to a after the yield")
            .unwrap();
        assert!(yielded.elapsed() >= Duration::from_secs(30));
        assert_eq!(a_view.borrow().status.term, b_term + 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let now = a_view.borrow().status.clone();
        assert!(now.is_leading() && now.term == b_term + 1, "{now:?}");
        assert_eq!(leads(&[&a, &b]), [1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_added_and_removed_at_run_time_are_spread_and_a_removed_one_is_released() {
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let mut leases = names("lease-", 4);
        let mut a = Host::start(&store, &clock, "a", &leases);
        let mut b = Host::start(&store, &clock, "b", &leases);
        settle(&[&a, &b], &leases, &[2, 2], Duration::from_secs(20)).await;
        let ab = ["a".to_owned(), "b".to_owned()];
        // Two leases added by a reload on a, then on b a second later:
        // each is led once, by the host that prefers it, and the spread
        // stays even.
        let added = names("added-", 2);
        for l in &added {
            a.add(l);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let preferred = assign(&[leases.clone(), added.clone()].concat(), &ab);
        for l in &added {
            let want = if preferred[l] == "a" {
                Intent::Contend
            } else {
                Intent::Defer {
                    head_start: HEAD_START,
                }
            };
            assert_eq!(a.intent(l), want, "{l} on a, steered from its start");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for l in &added {
            b.add(l);
        }
        leases.extend(added.iter().cloned());
        settle(&[&a, &b], &leases, &[3, 3], Duration::from_secs(30)).await;
        for l in &leases {
            let by = if a.leads(l) { "a" } else { "b" };
            assert_eq!(preferred[l], by, "{l}");
        }
        // Steady: nothing moves any more.
        tokio::time::sleep(Duration::from_secs(20)).await;
        no_overlap(&[&a, &b], &leases);
        assert_eq!(leads(&[&a, &b]), [3, 3]);
        // Two leases removed, one led by each: on a first. a's elector is
        // told to stop (drain, release); b, not reloaded yet, may take
        // a's; once both reloaded nobody leads either, and the four left
        // are spread evenly again.
        let gone: Vec<String> = ["a", "b"]
            .iter()
            .map(|h| leases.iter().find(|l| preferred[*l] == *h).unwrap().clone())
            .collect();
        for l in &gone {
            a.remove(l);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        for l in &gone {
            assert_eq!(a.intent(l), Intent::Stop);
        }
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            no_overlap(&[&a, &b], &leases);
        }
        for l in &gone {
            assert!(!a.leads(l), "{l} still led by a");
            b.remove(l);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        for l in &gone {
            assert_eq!(b.intent(l), Intent::Stop);
        }
        leases.retain(|l| !gone.contains(l));
        let all: Vec<String> = [leases.clone(), gone.clone()].concat();
        let start = Instant::now();
        loop {
            no_overlap(&[&a, &b], &all);
            let led = |h: &Host| leases.iter().filter(|l| h.leads(l)).count();
            if !gone.iter().any(|l| a.leads(l) || b.leads(l)) && [led(&a), led(&b)] == [2, 2] {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not spread again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        no_overlap(&[&a, &b], &all);
        for l in &gone {
            assert!(!a.leads(l) && !b.leads(l), "{l} led after its removal");
            let held = store.client().get(l).await.unwrap();
            assert!(
                held.is_none_or(|v| v.record.holder().is_none()),
                "{l} not released"
            );
        }
        let preferred = assign(&leases, &ab);
        for l in &leases {
            let by = if a.leads(l) { "a" } else { "b" };
            assert_eq!(preferred[l], by, "{l}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_now_stand_by_is_not_overwritten_and_the_lease_comes_back_in_a_new_term() {
        // reload = "now" stands a lease by for one retry period: the
        // spreader leaves that alone, the lease is handed over, and it
        // ends up led by its preferred host again, in a later term.
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let (leases, a, b, i) = two_hosts_settled(&store, &clock).await;
        let term = a.views[i].1.borrow().status.term;
        let until = Instant::now() + timings().retry_period;
        a.intents[i].send_replace(Intent::StandBy { until });
        while Instant::now() < until {
            assert_eq!(*a.intents[i].borrow(), Intent::StandBy { until });
            no_overlap(&[&a, &b], &leases);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut rx = a.views[i].1.clone();
        timeout(Duration::from_secs(30), rx.wait_for(|v| v.status.is_leading()))
            .await
            .expect("back to a")
            .unwrap();
        assert!(a.views[i].1.borrow().status.term > term);
        tokio::time::sleep(Duration::from_secs(30)).await;
        no_overlap(&[&a, &b], &leases);
        assert_eq!(leads(&[&a, &b]), [1, 1]);
        assert!(a.views[i].1.borrow().status.is_leading());
    }

    #[tokio::test(start_paused = true)]
    async fn unsteering_leaves_a_stop_and_a_stand_by_whose_time_is_not_up() {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        let cases = [
            (Intent::Defer { head_start: second }, Intent::Contend),
            (
                Intent::HandOver {
                    term: 3,
                    head_start: second,
                },
                Intent::Contend,
            ),
            (Intent::Contend, Intent::Contend),
            (Intent::Stop, Intent::Stop),
            (
                Intent::StandBy { until: now + second },
                Intent::StandBy { until: now + second },
            ),
            (Intent::StandBy { until: now }, Intent::Contend),
        ];
        for (before, after) in cases {
            let (intent, _rx) = watch::channel(before);
            unsteer(&intent);
            assert_eq!(*intent.borrow(), after, "from {before:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn spreading_turned_on_changed_and_off_at_run_time_spreads_then_moves_nothing() {
        // As reloads apply it: two hosts start with spreading off; turned
        // on (a first, then b), the leases are spread by the assignment;
        // new settings (a spreader replaced, its record released and taken
        // again) move nothing; turned off (a first, then b), every lease
        // goes back to contending, is still led by one host, and nothing
        // moves any more, a stand-by left alone.
        let store = MemoryStore::new();
        let clock = TermClock::paused();
        let leases = names("lease-", 4);
        let ab = ["a".to_owned(), "b".to_owned()];
        let mut a = Host::start_with(&store, &clock, "a", &leases, None);
        settle(&[&a], &leases, &[4], Duration::from_secs(5)).await;
        let mut b = Host::start_with(&store, &clock, "b", &leases, None);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(leads(&[&a, &b]), [4, 0], "not spread while off");
        assert!(b.intents.iter().all(|i| *i.borrow() == Intent::Contend));
        // On, on a: alone in its listing, it keeps all four.
        a.respread(Some(spread_cfg())).await;
        a.counts(1, Duration::from_secs(3)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(leads(&[&a, &b]), [4, 0]);
        // On, on b too: b's share is handed over, each lease once.
        let before = a.terms();
        b.respread(Some(spread_cfg())).await;
        settle(&[&a, &b], &leases, &[2, 2], Duration::from_secs(20)).await;
        let preferred = assign(&leases, &ab);
        for l in &leases {
            let by = if a.leads(l) { "a" } else { "b" };
            assert_eq!(preferred[l], by, "{l}");
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        no_overlap(&[&a, &b], &leases);
        assert_eq!(leads(&[&a, &b]), [2, 2]);
        let moved: Vec<u64> = a.terms().iter().zip(&before).map(|(t, b)| t - b).collect();
        assert!(moved.iter().all(|m| *m <= 1), "a lease moved twice: {moved:?}");
        // New settings on b (its spreader replaced, its record released
        // and taken again): nothing moves.
        let terms = (a.terms(), b.terms());
        let slower = SpreadConfig {
            settle: Duration::from_secs(3),
            head_start: Duration::from_secs(1),
            ..spread_cfg()
        };
        b.respread(Some(slower)).await;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            no_overlap(&[&a, &b], &leases);
        }
        assert_eq!((a.terms(), b.terms()), terms, "a lease moved");
        assert_eq!(leads(&[&a, &b]), [2, 2]);
        b.counts(2, Duration::ZERO).await;
        // a yields one of its leases for a minute, and turns spreading
        // off: its stand-by is left alone, the others contend.
        let i = a
            .views
            .iter()
            .position(|(_, v)| v.borrow().status.is_leading())
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        a.intents[i].send_replace(Intent::StandBy { until });
        a.respread(None).await;
        assert_eq!(*a.intents[i].borrow(), Intent::StandBy { until });
        for (j, intent) in a.intents.iter().enumerate().filter(|(j, _)| *j != i) {
            assert_eq!(*intent.borrow(), Intent::Contend, "{}", leases[j]);
        }
        // b, still spreading, takes the yielded lease; then b turns it off.
        let mut rx = b.views[i].1.clone();
        timeout(Duration::from_secs(5), rx.wait_for(|v| v.status.is_leading()))
            .await
            .expect("b takes the yielded lease")
            .unwrap();
        b.respread(None).await;
        assert!(b.intents.iter().all(|i| *i.borrow() == Intent::Contend));
        // Nothing steers any more: nothing moves, past the stand-by too.
        let terms = (a.terms(), b.terms());
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            no_overlap(&[&a, &b], &leases);
        }
        assert_eq!((a.terms(), b.terms()), terms, "a lease moved");
        assert_eq!(leads(&[&a, &b]), [1, 3]);
        // Both records released: the other host is not counted.
        for id in ["a", "b"] {
            let record = store.client().get(&member_lease(id)).await.unwrap();
            assert!(
                record.is_none_or(|v| v.record.holder().is_none()),
                "{id}'s record"
            );
        }
    }
}
