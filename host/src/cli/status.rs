//! `baton status`: what a lease store holds, for people (`text`) and
//! for scripts (`json`), on either store.
//!
//! [`open`] finds the store the way `baton run` does (the configuration's
//! `[store]`, `--store-dir`, `--kubeconfig`), with errors that name the
//! file, field or server at fault. [`collect`] lists it once and makes a
//! [`Report`]: each lease with its holder, term and expiry, apart from the
//! hosts' membership records (names starting with
//! [`MEMBER_PREFIX`]), and, while the leads are spread, each lease's
//! *preferred holder*: the spreader's own assignment
//! ([`assign_placed`]: placement rules, the weights in the membership
//! records) of the spread leases over the live hosts.
//!
//! Expiry here is judged by the wall clock: the record's renew time plus
//! its duration, against this machine's clock. The hosts themselves judge
//! by when they saw a record change, on their own clocks (see
//! [`crate::election`]), so a figure may differ from theirs by the clock
//! offset between the machines; the text output says so. A host is *live*
//! while its membership record is held and not expired by that rule (and,
//! on Kubernetes, carries baton's labels, as the hosts count only those).
//!
//! The JSON document's shape is stable; fields may be added, never
//! renamed or removed without raising `version`. It is described in
//! `docs/configuration.md` (`baton status`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::config::{Config, StoreConfig};
use crate::election::spread::{MEMBER_PREFIX, Member, Placement, assign_placed};
use crate::store::buckets::BucketStore;
use crate::store::embedded::buckets::EmbeddedBuckets;
use crate::store::{DEFAULT_WEIGHT, LeaseRecord, LeaseStore, StoreError, Versioned};
use crate::support::rounding::{human, secs};

/// The version of the JSON document's shape.
pub const JSON_VERSION: u32 = 1;

/// How `baton status` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Tables for people.
    #[default]
    Text,
    /// One JSON document (see the module documentation).
    Json,
}

/// Whether the leads are spread, and over which leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spreading {
    /// Not spread (the configuration turns it off, or has one lease): no
    /// preferred holders.
    Off,
    /// Spread over these leases: the configuration's, with their placement
    /// rules, as each of its hosts spreads them.
    Leases(BTreeMap<String, Placement>),
    /// No configuration: spread as by default, over the leases the store
    /// holds when there are more than one.
    Default,
}

/// A store opened for `baton status`, and what is known of its spreading.
pub struct Target {
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// `embedded` or `kubernetes`.
    pub kind: &'static str,
    /// Whether the leads are spread, and over which leases.
    pub spreading: Spreading,
    /// Where the store came from, for errors: the file and field, or the
    /// flag.
    pub origin: String,
    /// The configuration and the store's buckets, for its schedules (none
    /// with `--store-dir`).
    pub schedules: Option<(Config, Arc<dyn BucketStore>)>,
}

/// `baton status`: opens the store (see [`open`]), lists it once, and
/// prints the report as `output` says.
pub async fn execute(
    config: Option<&Path>,
    store_dir: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let target = open(config, store_dir, kubeconfig).await?;
    let mut report = collect(&target).await?;
    if let Some((cfg, buckets)) = &target.schedules {
        report.schedules = schedules::collect(cfg, buckets, report.now).await;
    }
    match output {
        OutputFormat::Text => print!("{}", report.text()),
        OutputFormat::Json => print!("{}", report.json()),
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the store that `baton status` reads: `--store-dir` if given,
/// else the configuration's `[store]`, with `--kubeconfig` over its
/// `kubeconfig`. Makes no request. Every error names the file and field,
/// or the flag, at fault.
pub async fn open(
    config: Option<&Path>,
    store_dir: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
) -> anyhow::Result<Target> {
    let loaded = config.map(Config::load).transpose()?;
    let file = config.map_or_else(String::new, |p| p.display().to_string());
    let spreading = spreading_of(loaded.as_ref());
    if let Some(dir) = store_dir {
        return open_store_dir(&dir, kubeconfig.is_some(), spreading);
    }
    let Some(mut cfg) = loaded else {
        anyhow::bail!(
            "say which store to show: --config FILE (its [store] section) or --store-dir DIR (an embedded store)"
        );
    };
    let origin = format!("{file}: [store]");
    match &mut cfg.store {
        StoreConfig::Embedded { dir } => {
            let dir = dir.clone();
            if kubeconfig.is_some() {
                anyhow::bail!(
                    "--kubeconfig (or BATON_KUBECONFIG) applies to a kubernetes store, but {file} uses the \
                     embedded store"
                );
            }
            if !cfg.store_declared && !dir.is_dir() {
                anyhow::bail!(
                    "{file}: no [store] section, so its store is the default embedded one at {}, which does \
                     not exist: add the [store] section its hosts use, or pass --store-dir DIR",
                    dir.display()
                );
            }
            let mut target = open_embedded(&dir, origin, spreading)?;
            // The buckets only if they exist: status creates nothing.
            if cfg.plugins.iter().any(|p| p.schedule.is_some())
                && dir.join(crate::store::embedded::buckets::DATABASE).is_file()
                && let Ok(buckets) = EmbeddedBuckets::open(&dir)
            {
                target.schedules = Some((cfg.clone(), Arc::new(buckets)));
            }
            Ok(target)
        }
        StoreConfig::Kubernetes {
            kubeconfig: field, ..
        } => {
            let which = which_kubeconfig(kubeconfig.as_deref(), field.as_deref());
            if let Some(path) = kubeconfig {
                *field = Some(path);
            }
            let mut target = open_kubernetes(&cfg, format!("{origin}, with {which}"), spreading).await?;
            if cfg.plugins.iter().any(|p| p.schedule.is_some())
                && let Ok((_, buckets)) = crate::daemon::open_stores(&cfg).await
            {
                target.schedules = Some((cfg.clone(), buckets));
            }
            Ok(target)
        }
        StoreConfig::Etcd(_) => {
            open_remote(&cfg, "etcd", kubeconfig.is_some(), &file, origin, spreading).await
        }
        StoreConfig::Postgres(_) => {
            open_remote(&cfg, "postgres", kubeconfig.is_some(), &file, origin, spreading).await
        }
    }
}

/// Whether the leads are spread, by the configuration `loaded`, if any.
fn spreading_of(loaded: Option<&Config>) -> Spreading {
    match loaded {
        None => Spreading::Default,
        Some(cfg) if cfg.spread.is_some() => Spreading::Leases(
            cfg.leases
                .iter()
                .map(|l| (l.name.clone(), l.placement.clone()))
                .collect(),
        ),
        Some(_) => Spreading::Off,
    }
}

/// What a record's expiry says at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Held and not expired.
    Held,
    /// Held, but its holder has not renewed it within its duration.
    Expired,
    /// Nobody holds it.
    Released,
    /// Held, with no renew time to judge it by (a foreign writer's).
    Unknown,
}

/// One lease.
#[derive(Clone, Debug, Serialize)]
pub struct LeaseStatus {
    /// Its name.
    pub name: String,
    /// Who holds it; `None`: nobody.
    pub holder: Option<String>,
    /// The holder's address, as its record says (`advertise-address`);
    /// `None`: no holder, or it published none.
    pub holder_address: Option<String>,
    /// Its term.
    pub term: u64,
    /// Held, expired, released or unknown.
    pub state: State,
    /// When it was last renewed (RFC 3339), if the record says.
    #[serde(serialize_with = "rfc3339")]
    pub renewed: Option<SystemTime>,
    /// When it expires or expired (RFC 3339): renewed plus its duration;
    /// `None` when released or without a renew time.
    #[serde(serialize_with = "rfc3339")]
    pub expires: Option<SystemTime>,
    /// Seconds from now to `expires` (negative once expired), to 0.01 s.
    pub seconds_left: Option<f64>,
    /// The duration written in the record, in seconds.
    pub duration_seconds: f64,
    /// The host it goes to under the current membership while the leads
    /// are spread; `None` when they are not, or no host is live, or the
    /// lease is not one of the spread leases.
    pub preferred_holder: Option<String>,
}

/// One host's membership record.
#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    /// The host's identity (the record's holder; for a released record,
    /// the name after [`MEMBER_PREFIX`]).
    pub identity: String,
    /// The record's lease name.
    pub record: String,
    /// The host's address, as its record says (`advertise-address`);
    /// `None`: released, or it published none.
    pub address: Option<String>,
    /// Whether the host drains (`baton drain`): hands its leases over and
    /// takes none.
    pub draining: bool,
    /// Its weight in spreading the leads (1 unless configured).
    pub weight: u32,
    /// Whether the hosts count it as live: held, not expired, and counted.
    pub live: bool,
    /// Whether the hosts count such a record at all (on Kubernetes, only
    /// a membership Lease with baton's labels).
    pub counted: bool,
    /// The record's state.
    pub state: State,
    /// As for a lease.
    #[serde(serialize_with = "rfc3339")]
    pub renewed: Option<SystemTime>,
    /// As for a lease.
    #[serde(serialize_with = "rfc3339")]
    pub expires: Option<SystemTime>,
    /// As for a lease.
    pub seconds_left: Option<f64>,
    /// How many leases it holds, not expired.
    pub leads: usize,
    /// How many leases it is the preferred holder of (`None` when the
    /// leads are not spread).
    pub preferred: Option<usize>,
}

/// What a store holds, at one time.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// [`JSON_VERSION`].
    pub version: u32,
    /// The store.
    pub store: StoreSummary,
    /// When it was read (RFC 3339): what `seconds_left` counts from.
    #[serde(serialize_with = "rfc3339_at")]
    pub now: SystemTime,
    /// Whether the leads are spread (and so preferred holders given).
    pub spreading: bool,
    /// The leases, by name.
    pub leases: Vec<LeaseStatus>,
    /// The membership records, by identity.
    pub hosts: Vec<HostStatus>,
    /// The records that cannot be read, by name (not in `leases` or
    /// `hosts`).
    pub unreadable: Vec<UnreadableLease>,
    /// The live hosts' identities, sorted: the membership the preferred
    /// holders are computed under.
    pub live_hosts: Vec<String>,
    /// The configuration's scheduled plugins (with `--config`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<schedules::ScheduleStatus>,
    /// The digests of the plugins from registries each host has loaded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<versions::VersionStatus>,
}

/// A record that cannot be read: the hosts leave it as it is.
#[derive(Clone, Debug, Serialize)]
pub struct UnreadableLease {
    /// The lease's name.
    pub name: String,
    /// Why it cannot be read (the file and what is wrong with it).
    pub error: String,
}

/// Which store a report is of.
#[derive(Clone, Debug, Serialize)]
pub struct StoreSummary {
    /// `embedded` or `kubernetes`.
    pub kind: &'static str,
    /// Where it is: its directory, or its namespace and API server.
    pub description: String,
}

fn rfc3339<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339_at(t, s),
        None => s.serialize_none(),
    }
}

fn rfc3339_at<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// A record's state, expiry and seconds left at `now`.
fn expiry(r: &LeaseRecord, now: SystemTime) -> (State, Option<SystemTime>, Option<f64>) {
    match (r.holder(), r.renew_time) {
        (None, _) => (State::Released, None, None),
        (Some(_), None) => (State::Unknown, None, None),
        (Some(_), Some(renewed)) => {
            let at = renewed + r.lease_duration;
            match at.duration_since(now) {
                Ok(left) if !left.is_zero() => (State::Held, Some(at), Some(secs(left))),
                Ok(_) => (State::Expired, Some(at), Some(0.0)),
                Err(past) => (State::Expired, Some(at), Some(-secs(past.duration()))),
            }
        }
    }
}

/// Lists `target`'s store once and makes the report; `now` is taken after
/// the listing. A store that cannot be listed is an error naming it.
pub async fn collect(target: &Target) -> anyhow::Result<Report> {
    let store = &target.store;
    let failed = |e: StoreError| {
        let detail = match e {
            StoreError::Unavailable { detail, .. } => format!("unavailable: {detail}"),
            StoreError::Conflict { detail, .. }
            | StoreError::Malformed { detail, .. }
            | StoreError::Refused { detail, .. } => detail,
        };
        anyhow::anyhow!(
            "{}: {}: cannot list its leases: {detail}",
            target.origin,
            store.describe()
        )
    };
    let (all, unreadable) = store.list_readable().await.map_err(failed)?;
    // The records the hosts count, read as they read them.
    let counted: BTreeSet<String> = store
        .list_prefixed(MEMBER_PREFIX)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut report = report(
        target.kind,
        store.describe(),
        &target.spreading,
        all,
        &counted,
        SystemTime::now(),
    );
    report.unreadable = unreadable
        .into_iter()
        .map(|(name, error)| UnreadableLease { name, error })
        .collect();
    Ok(report)
}

/// The report of a listing (`all`: every record, membership records
/// included; `counted`: the names of the membership records the hosts
/// count), at `now`.
pub fn report(
    kind: &'static str,
    description: String,
    spreading: &Spreading,
    all: Vec<(String, Versioned)>,
    counted: &BTreeSet<String>,
    now: SystemTime,
) -> Report {
    let versions = versions::rows(&all);
    let (members, leases): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(name, _)| name.starts_with(MEMBER_PREFIX));
    let live = live_members(&members, counted, now);
    let live_hosts: Vec<String> = live.iter().map(|m| m.identity.clone()).collect();
    let spread: Option<BTreeMap<String, Placement>> = match spreading {
        Spreading::Off => None,
        Spreading::Leases(placed) => Some(placed.clone()),
        Spreading::Default => (leases.len() > 1).then(|| {
            leases
                .iter()
                .map(|(n, _)| (n.clone(), Placement::default()))
                .collect()
        }),
    };
    // As the hosts assign them: placement rules, and the weights their
    // membership records say.
    let preferred: Option<BTreeMap<String, String>> =
        spread.as_ref().map(|placed| assign_placed(placed, &live));
    let leases = lease_rows(leases, preferred.as_ref(), now);
    let hosts = host_rows(members, counted, &leases, preferred.as_ref(), now);
    Report {
        version: JSON_VERSION,
        store: StoreSummary { kind, description },
        now,
        spreading: spread.is_some(),
        leases,
        hosts,
        unreadable: Vec::new(),
        live_hosts,
        schedules: Vec::new(),
        versions,
    }
}

/// The identity of a membership record's host: its holder, or the name
/// after the prefix.
fn member_identity(name: &str, r: &LeaseRecord) -> String {
    r.holder().unwrap_or(&name[MEMBER_PREFIX.len()..]).to_owned()
}

/// Whether a record in `state` is held, as far as this machine can tell.
fn live(state: State) -> bool {
    matches!(state, State::Held | State::Unknown)
}

/// The hosts whose membership records are counted and live, sorted.
fn live_members(members: &[(String, Versioned)], counted: &BTreeSet<String>, now: SystemTime) -> Vec<Member> {
    let mut live_members: Vec<Member> = members
        .iter()
        .filter(|(name, v)| counted.contains(name) && live(expiry(&v.record, now).0))
        .map(|(name, v)| Member {
            identity: member_identity(name, &v.record),
            weight: v.record.host.as_ref().map_or(DEFAULT_WEIGHT, |h| h.weight),
        })
        .collect();
    live_members.sort_by(|a, b| a.identity.cmp(&b.identity));
    live_members.dedup_by(|a, b| a.identity == b.identity);
    live_members
}

/// The leases' rows, sorted by name, with their preferred holders while
/// the leads are spread.
fn lease_rows(
    leases: Vec<(String, Versioned)>,
    preferred: Option<&BTreeMap<String, String>>,
    now: SystemTime,
) -> Vec<LeaseStatus> {
    let mut rows: Vec<LeaseStatus> = leases
        .into_iter()
        .map(|(name, v)| {
            let r = &v.record;
            let (state, expires, seconds_left) = expiry(r, now);
            LeaseStatus {
                preferred_holder: preferred.and_then(|p| p.get(&name)).cloned(),
                name,
                holder: r.holder().map(str::to_owned),
                holder_address: r.holder_address().map(str::to_owned),
                term: r.term,
                state,
                renewed: r.renew_time,
                expires,
                seconds_left,
                duration_seconds: secs(r.lease_duration),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The hosts' rows, sorted by identity: how many of `leases` each leads
/// and, while the leads are spread, is preferred for.
fn host_rows(
    members: Vec<(String, Versioned)>,
    counted: &BTreeSet<String>,
    leases: &[LeaseStatus],
    preferred: Option<&BTreeMap<String, String>>,
    now: SystemTime,
) -> Vec<HostStatus> {
    let mut hosts: Vec<HostStatus> = members
        .into_iter()
        .map(|(name, v)| {
            let r = &v.record;
            let id = member_identity(&name, r);
            let (state, expires, seconds_left) = expiry(r, now);
            let is_counted = counted.contains(&name);
            let host = r
                .host
                .clone()
                .filter(|_| r.holder().is_some())
                .unwrap_or_default();
            HostStatus {
                address: host.address,
                draining: host.draining,
                weight: host.weight,
                live: is_counted && live(state),
                counted: is_counted,
                leads: leases
                    .iter()
                    .filter(|l| l.holder.as_deref() == Some(id.as_str()) && live(l.state))
                    .count(),
                preferred: preferred.map(|p| p.values().filter(|h| **h == id).count()),
                identity: id,
                record: name,
                state,
                renewed: r.renew_time,
                expires,
                seconds_left,
            }
        })
        .collect();
    hosts.sort_by(|a, b| (&a.identity, &a.record).cmp(&(&b.identity, &b.record)));
    hosts
}

/// `in 3.72s`, `expired 1.5s ago`, `released`, `unknown`.
fn expires_text(state: State, seconds_left: Option<f64>) -> String {
    let d = |s: f64| human(std::time::Duration::from_secs_f64(s.abs()));
    match (state, seconds_left) {
        (State::Released, _) => "released".to_owned(),
        (State::Held, Some(s)) => format!("in {}", d(s)),
        (State::Expired, Some(s)) => format!("expired {} ago", d(s)),
        _ => "unknown".to_owned(),
    }
}

/// Rows of columns, padded to the widest cell; the columns in `right` are
/// aligned right. No trailing spaces.
fn table(rows: &[Vec<String>], right: &[usize]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = widths[c] - cell.chars().count();
            let last = c + 1 == row.len();
            if right.contains(&c) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if !last {
                    line.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

impl Report {
    /// The report as tables: the store, its leases (with the preferred
    /// holder while spread), the hosts' membership records, and how the
    /// preferred holders were found.
    pub fn text(&self) -> String {
        let mut out = format!("{}\n", self.store.description);
        if self.leases.is_empty() && self.hosts.is_empty() && self.unreadable.is_empty() {
            out.push_str("no leases\n");
            return out;
        }
        if !self.leases.is_empty() {
            out.push('\n');
            out.push_str(&self.leases_table());
        }
        if !self.unreadable.is_empty() {
            out.push('\n');
            for u in &self.unreadable {
                out.push_str(&format!(
                    "lease {}: unreadable, left as it is by the hosts: {}\n",
                    u.name, u.error
                ));
            }
        }
        if !self.hosts.is_empty() {
            out.push('\n');
            out.push_str(&self.hosts_table());
        }
        if !self.schedules.is_empty() {
            out.push('\n');
            out.push_str(&schedules::table(&self.schedules, 5));
        }
        if !self.versions.is_empty() {
            out.push('\n');
            out.push_str(&versions::table(&self.versions));
        }
        out.push('\n');
        out.push_str(&self.footer());
        out
    }

    /// The table of the leases (an ADDRESS column when a holder has one).
    fn leases_table(&self) -> String {
        let addresses = self.leases.iter().any(|l| l.holder_address.is_some());
        let mut header = vec!["LEASE", "HOLDER"];
        if addresses {
            header.push("ADDRESS");
        }
        header.push("TERM");
        if self.spreading {
            header.push("PREFERRED");
        }
        header.push("EXPIRES");
        let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
        for l in &self.leases {
            let mut row = vec![l.name.clone(), l.holder.clone().unwrap_or_else(|| "-".into())];
            if addresses {
                row.push(l.holder_address.clone().unwrap_or_else(|| "-".into()));
            }
            row.push(l.term.to_string());
            if self.spreading {
                row.push(l.preferred_holder.clone().unwrap_or_else(|| "-".into()));
            }
            row.push(expires_text(l.state, l.seconds_left));
            rows.push(row);
        }
        table(&rows, &[if addresses { 3 } else { 2 }])
    }

    /// The table of the hosts' membership records (ADDRESS and WEIGHT
    /// columns when a host has an address or a weight other than 1; a
    /// draining host marked so).
    fn hosts_table(&self) -> String {
        let addresses = self.hosts.iter().any(|h| h.address.is_some());
        let weights = self.hosts.iter().any(|h| h.weight != DEFAULT_WEIGHT);
        let mut header = vec!["HOST (membership record)"];
        if addresses {
            header.push("ADDRESS");
        }
        let first = header.len();
        header.push("LEADS");
        if weights {
            header.push("WEIGHT");
        }
        if self.spreading {
            header.push("PREFERRED");
        }
        let right: Vec<usize> = (first..header.len()).collect();
        header.push("EXPIRES");
        let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
        for h in &self.hosts {
            let mut row = vec![match h.draining {
                true => format!("{} (draining)", h.identity),
                false => h.identity.clone(),
            }];
            if addresses {
                row.push(h.address.clone().unwrap_or_else(|| "-".into()));
            }
            row.push(h.leads.to_string());
            if weights {
                row.push(h.weight.to_string());
            }
            if let Some(n) = h.preferred.filter(|_| self.spreading) {
                row.push(n.to_string());
            }
            let mut expires = expires_text(h.state, h.seconds_left);
            if !h.counted {
                expires.push_str(" (not counted: the hosts count only records with baton's labels)");
            }
            row.push(expires);
            rows.push(row);
        }
        table(&rows, &right)
    }

    /// The live hosts, how the preferred holders were found, and how expiry
    /// is judged.
    fn footer(&self) -> String {
        let live = match self.live_hosts.len() {
            0 => "no live hosts".to_owned(),
            1 => format!("1 live host ({})", self.live_hosts[0]),
            n => format!("{n} live hosts ({})", self.live_hosts.join(", ")),
        };
        let mut out = String::new();
        if self.spreading && !self.live_hosts.is_empty() {
            out.push_str(&format!(
                "Leads spread over {live}: PREFERRED is the host each lease goes to under that membership,\n\
                 by the hosts' own assignment.\n"
            ));
        } else if self.spreading {
            out.push_str("Leads spread, but no live hosts: no lease has a preferred host.\n");
        } else if !self.hosts.is_empty() {
            out.push_str(&format!("Leads not spread; {live}.\n"));
        }
        out.push_str(
            "(expiry from each record's wall-clock renew time and this machine's clock; the hosts\n\
             judge it by when they saw the record change, on their own clocks)\n",
        );
        out
    }

    /// The report as one JSON document (see the module documentation).
    pub fn json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a report serializes");
        text.push('\n');
        text
    }
}

pub mod schedules;
mod stores;
pub mod versions;

use stores::{open_embedded, open_kubernetes, open_remote, open_store_dir, which_kubeconfig};

#[cfg(test)]
mod tests;
