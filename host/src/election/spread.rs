//! Spreading the leads over the hosts: which host prefers which lease, and
//! the task that *steers* this host's electors by it.
//!
//! Every host keeps a *membership record* in the lease store: a lease named
//! [`MEMBER_PREFIX`] + its identity, held by the host itself and renewed
//! like any lease ([`member_lease`]). A host is *live* while its record is
//! held and not expired, judged as electors judge a lease: from when the
//! record was seen to change plus the duration written in it ([`Roster`]).
//! From the live hosts that do not drain (their records say so, and their
//! weights) and its own leases each host computes the same preferred host
//! per lease ([`assign_placed`]): a bounded-load rendezvous assignment
//! (host of weight `w` of `W`: `floor` or `ceil` of `M * w / W` of `M`
//! leases) under each lease's `prefer` and `avoid` ([`Placement`]).
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
//! elector's rule, see [`Intent::Defer`]). A drain ([`Intent::Drain`]) is
//! left alone until `baton resume`.
//!
//! None of this touches safety: who may lead is decided by the lease
//! alone; spreading decides only who tries first. Reloads (as
//! [`LeaseChange`]s), membership listings and limits:
//! `docs/architecture.md` ("Spreading").

mod place;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::clock::TermClock;
use super::elector::{Elector, ElectorConfig, Intent};
use super::host::HostHandle;
use super::status::{LeaseView, Role};
use super::timing::Timings;
use crate::store::{LeaseStore, Versioned};

pub use place::{MAX_WEIGHT, Member, Placement, assign_placed};

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
    let leases: BTreeMap<String, Placement> =
        leases.iter().map(|l| (l.clone(), Placement::default())).collect();
    let hosts: Vec<Member> = hosts.iter().map(|h| Member::new(h)).collect();
    assign_placed(&leases, &hosts)
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

    /// The hosts whose membership record is held and has not expired at
    /// `now`, sorted, with what the record says of each: its weight, and
    /// whether it drains ([`HostInfo`](crate::store::HostInfo); a record
    /// without says weight 1, not draining).
    pub fn members(&self, now: Instant) -> Vec<(Member, bool)> {
        let mut live: Vec<(Member, bool)> = self
            .seen
            .values()
            .filter(|(v, since)| now < *since + v.record.lease_duration)
            .filter_map(|(v, _)| {
                let identity = v.record.holder()?.to_owned();
                let info = v.record.host.clone().unwrap_or_default();
                Some((
                    Member {
                        identity,
                        weight: info.weight,
                    },
                    info.draining,
                ))
            })
            .collect();
        live.sort();
        live.dedup_by(|a, b| a.0.identity == b.0.identity);
        live
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
    /// Its `prefer` and `avoid` hosts.
    pub placement: Placement,
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
/// taken back), drains (until `baton resume`), or stands by after a yield
/// (`baton yield` wins over spreading until its time is up).
fn steer(intent: &watch::Sender<Intent>, to: Intent) {
    intent.send_if_modified(|now| {
        let yielding = matches!(*now, Intent::StandBy { until } if Instant::now() < until);
        if matches!(*now, Intent::Stop | Intent::Drain) || yielding || *now == to {
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
    /// The live hosts that take leases (not draining) as last computed,
    /// with their weights, since when they are so, and how many times
    /// they changed.
    view: Vec<Member>,
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
    /// What this host says of itself in its membership record
    /// ([`Spreader::with_host`]).
    host: HostHandle,
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
            view: vec![Member::new(identity)],
            view_since: Instant::now(),
            epoch: 0,
            preferred: (u64::MAX, BTreeMap::new()),
            handed: HashMap::new(),
            hosts,
            changes: None,
            host: HostHandle::default(),
        }
    }

    /// Writes `host` (this host's address, draining, weight) into its
    /// membership record, instead of the defaults.
    pub fn with_host(mut self, host: HostHandle) -> Spreader {
        self.host = host;
        self
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
            host: self.host.subscribe(),
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
            let members = self.roster.members(now);
            self.steer_all(now, members);
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
        let members = self.roster.members(now);
        self.steer_all(now, members);
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

    /// The hosts that take leases, with their weights, from the live
    /// `members` (sorted, each with whether it drains): those that do not
    /// drain, this host by its own handle rather than its record (which
    /// may lag by a renewal).
    fn takers(&self, members: Vec<(Member, bool)>) -> Vec<Member> {
        let own = self.host.get();
        let mut view: Vec<Member> = members
            .into_iter()
            .filter(|(m, draining)| !draining && m.identity != self.identity)
            .map(|(m, _)| m)
            .collect();
        if !own.draining {
            view.push(Member {
                identity: self.identity.clone(),
                weight: own.weight,
            });
            view.sort();
        }
        view
    }

    /// Recomputes the view and every lease's intent at `now`, from the
    /// live `members` the roster counts then.
    fn steer_all(&mut self, now: Instant, members: Vec<(Member, bool)>) {
        let view = self.takers(members);
        if view != self.view {
            let live: Vec<String> = view
                .iter()
                .map(|m| match m.weight {
                    1 => m.identity.clone(),
                    w => format!("{}*{w}", m.identity),
                })
                .collect();
            if self.leases.is_empty() {
                tracing::info!(hosts = live.len(), live = %live.join(","), "the hosts that take leases changed");
            } else {
                tracing::info!(hosts = live.len(), live = %live.join(","), "the hosts that take leases changed; leases are spread again");
            }
            self.view = view;
            self.view_since = now;
            self.epoch += 1;
        }
        let settled = now >= self.view_since + self.cfg.settle;
        if self.preferred.0 != self.epoch {
            // Computed once per view, not every retry period (a lease
            // added, removed or placed anew is a new view).
            let placed: BTreeMap<String, Placement> = self
                .leases
                .iter()
                .map(|l| (l.name.clone(), l.placement.clone()))
                .collect();
            self.preferred = (self.epoch, assign_placed(&placed, &self.view));
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
mod tests;
