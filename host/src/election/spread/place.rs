//! The assignment with placement rules: per lease, hosts to prefer and to
//! avoid, and per host a weight.
//!
//! Invariants, for the same leases, rules and hosts on every host (the
//! order they are given in does not matter, only the order of a `prefer`
//! list does):
//! - a lease with a live host in its `prefer` list goes to the first one
//!   in that list, whatever the loads;
//! - otherwise it goes to a host it does not `avoid`, if any is live; to
//!   an avoided one only when every live host is avoided;
//! - within that, bounded-load rendezvous: host `h` of weight `w` takes
//!   `floor(M * w / W)` leases or `ceil(M * w / W)` (`M` leases, `W` the
//!   sum of the weights), as long as the two rules above leave room; a
//!   host over its bound by a preference takes no lease it is not pinned
//!   to while another host has room.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::score;

/// The heaviest weight a host may have: enough for hosts a thousand times
/// apart in size, small enough that `M * W` never overflows.
pub const MAX_WEIGHT: u32 = 1000;

/// Where one lease should go, as its `[[lease]]` table says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Host identities, in order: the first live one always gets the lease.
    pub prefer: Vec<String>,
    /// Host identities that get the lease only when every live host is
    /// among them.
    pub avoid: Vec<String>,
}

impl Placement {
    /// Whether it has no rule.
    pub fn is_empty(&self) -> bool {
        self.prefer.is_empty() && self.avoid.is_empty()
    }
}

/// A live host as the assignment counts it: its identity and weight
/// (1..=[`MAX_WEIGHT`]; 0 is taken as 1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// The host's identity.
    pub identity: String,
    /// Its weight.
    pub weight: u32,
}

impl Member {
    /// A host of weight 1.
    pub fn new(identity: &str) -> Member {
        Member {
            identity: identity.to_owned(),
            weight: 1,
        }
    }
}

/// The preferred host of each lease of `leases` under its placement rules,
/// among the live `hosts`; see the [module documentation](self). No hosts:
/// empty.
pub fn assign_placed(leases: &BTreeMap<String, Placement>, hosts: &[Member]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(mut loads) = Loads::new(hosts, leases.len() as u64) else {
        return out;
    };
    // Pinned first: a preferred live host gets the lease whatever its load.
    let mut rest: Vec<&String> = Vec::new();
    for (lease, p) in leases {
        match p.prefer.iter().find(|h| loads.weight.contains_key(h.as_str())) {
            Some(h) => {
                loads.take(h);
                out.insert(lease.clone(), h.clone());
            }
            None => rest.push(lease),
        }
    }
    // Leases that avoid hosts before the others, while every host has
    // room: so an avoidance moves a lease, not the bounds.
    rest.sort_by_cached_key(|l| (leases[*l].avoid.is_empty(), score(l, ""), *l));
    for lease in rest {
        let avoid: BTreeSet<&str> = leases[lease].avoid.iter().map(String::as_str).collect();
        let mut ranked: Vec<String> = loads.weight.keys().cloned().collect();
        ranked.sort_by_cached_key(|h| {
            (
                avoid.contains(h.as_str()),
                std::cmp::Reverse(score(lease, h)),
                h.clone(),
            )
        });
        // Every live host avoided: they are all allowed.
        let allowed = match ranked.iter().filter(|h| !avoid.contains(h.as_str())).count() {
            0 => ranked.len(),
            n => n,
        };
        let host = loads.pick(&ranked[..allowed]);
        loads.take(&host);
        out.insert(lease.clone(), host);
    }
    out
}

/// The hosts' weights, bounds and loads while leases are assigned.
struct Loads {
    weight: BTreeMap<String, u64>,
    /// `floor(M * w / W)`, and whether that is the whole share.
    floor: HashMap<String, (u64, bool)>,
    /// Places above the floors left, for hosts whose share is not whole.
    extra: u64,
    load: HashMap<String, u64>,
}

impl Loads {
    /// For `m` leases on `hosts`; `None` without hosts.
    fn new(hosts: &[Member], m: u64) -> Option<Loads> {
        let mut weight: BTreeMap<String, u64> = BTreeMap::new();
        for h in hosts {
            let w = u64::from(h.weight.clamp(1, MAX_WEIGHT));
            // One identity twice (it should not be): the heavier counts.
            let e = weight.entry(h.identity.clone()).or_default();
            *e = (*e).max(w);
        }
        let total: u64 = weight.values().sum();
        if total == 0 {
            return None;
        }
        let floor: HashMap<String, (u64, bool)> = weight
            .iter()
            .map(|(h, w)| (h.clone(), (m * w / total, (m * w).is_multiple_of(total))))
            .collect();
        let extra = m - floor.values().map(|f| f.0).sum::<u64>();
        Some(Loads {
            weight,
            floor,
            extra,
            load: HashMap::new(),
        })
    }

    fn load(&self, host: &str) -> u64 {
        self.load.get(host).copied().unwrap_or(0)
    }

    /// Whether `host` has room for one more lease within its bound.
    fn has_room(&self, host: &str) -> bool {
        let (floor, whole) = self.floor[host];
        let n = self.load(host);
        n < floor || (n == floor && !whole && self.extra > 0)
    }

    /// The first of `ranked` with room; without (preferences took it),
    /// the least loaded for its weight, the first of those on a tie.
    fn pick(&self, ranked: &[String]) -> String {
        ranked
            .iter()
            .find(|h| self.has_room(h))
            .or_else(|| {
                ranked
                    .iter()
                    .min_by(|a, b| (self.load(a) * self.weight[*b]).cmp(&(self.load(b) * self.weight[*a])))
            })
            .cloned()
            .expect("at least one live host")
    }

    /// Counts one more lease on `host`.
    fn take(&mut self, host: &str) {
        let n = self.load.entry(host.to_owned()).or_default();
        *n += 1;
        if *n > self.floor[host].0 {
            self.extra = self.extra.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests;
