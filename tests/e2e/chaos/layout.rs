//! The spread scenario of the chaos engine: several leases with spreading
//! on, plugins that append records tagged `plugin@lease`, and the faults
//! that rewrite the configuration file the hosts watch (`--watch`) — a
//! plugin moved to another lease, a lease added, a lease removed, the
//! timings changed — and `baton yield`.
//!
//! The check is per plugin, with the lease each record was written under:
//! no two runs of a plugin (a host, a lease, a term) overlap in time (the
//! old host's last record comes before the new host's first, across every
//! hand-over, as `moving.rs` checks one), and no record of a lease's term
//! is stamped after a newer term of that lease began (its first leading
//! event or its first record). Records after their run's force-stop (or
//! its process's death) are counted as late, as in the one-lease check.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use rand::rngs::StdRng;

use crate::support::*;
use crate::witness::{Record, force_stop_at};

/// The guests' tick in this scenario: a record every 10 ms each (an
/// overlap shorter than that can go unseen).
const TICK_MS: &str = "10";

/// At most this many leases (a lease added past it is not injected).
const MAX_LEASES: usize = 5;

/// One appending plugin.
#[derive(Clone, Debug)]
pub struct PluginAt {
    pub name: String,
    world: &'static str,
    ignore: bool,
    /// The lease it runs under now.
    pub lease: String,
}

/// The configuration the hosts watch, as the test last wrote it.
#[derive(Clone, Debug)]
pub struct Layout {
    store: String,
    defaults: [String; 2],
    /// Which of `defaults` is on.
    timing: usize,
    pub leases: Vec<String>,
    pub plugins: Vec<PluginAt>,
    /// The number in the next added lease's name (a removed name is never
    /// added back: a host refuses that until its hand-over is done).
    next: usize,
    data: PathBuf,
}

impl Layout {
    /// Three leases and four plugins (both worlds, each honouring and
    /// ignoring the change), one lease with two; `store` is the `[store]`
    /// table, `defaults` two `[defaults]` tables the timings change between.
    pub fn new(store: String, defaults: [String; 2], data: &Path) -> Layout {
        let leases: Vec<String> = (0..3).map(|i| format!("l{i}")).collect();
        let mut plugins = Vec::new();
        for (i, (world, ignore)) in [
            ("pollable", false),
            ("future", true),
            ("pollable", true),
            ("future", false),
        ]
        .into_iter()
        .enumerate()
        {
            plugins.push(PluginAt {
                name: format!("p{i}"),
                world,
                ignore,
                lease: leases[i % leases.len()].clone(),
            });
        }
        Layout {
            store,
            defaults,
            timing: 0,
            leases,
            plugins,
            next: 3,
            data: data.to_path_buf(),
        }
    }

    /// The configuration file's text.
    pub fn render(&self) -> String {
        let mut text = format!(
            "{}\n{}\n[spread]\nenabled = true\n",
            self.store, self.defaults[self.timing]
        );
        for l in &self.leases {
            text.push_str(&format!("\n[[lease]]\nname = {l:?}\n"));
        }
        for p in &self.plugins {
            let tag = format!("{}@{}", p.name, p.lease);
            text.push_str(&format!(
                "\n[[plugin]]\nname = {:?}\npath = {:?}\nlease = {:?}\ninherit-env = [\"PROBE_HOST\"]\n\
                 env = {{ PROBE_MODE = \"append\", PROBE_TICK_MS = {TICK_MS:?}, PROBE_TAG = {tag:?}{} }}\n\
                 dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
                p.name,
                guest(&format!("probe_{}.wasm", p.world)).display().to_string(),
                p.lease,
                if p.ignore { ", PROBE_IGNORE = \"1\"" } else { "" },
                self.data.display().to_string(),
            ));
        }
        text
    }

    /// A lease other than `not`.
    fn other_lease(&self, rng: &mut StdRng, not: &str) -> String {
        let others: Vec<&String> = self.leases.iter().filter(|l| *l != not).collect();
        others[rng.random_range(0..others.len())].clone()
    }

    /// Moves a plugin to another lease; what it did.
    pub fn move_plugin(&mut self, rng: &mut StdRng) -> String {
        let i = rng.random_range(0..self.plugins.len());
        let to = self.other_lease(rng, &self.plugins[i].lease);
        let p = &mut self.plugins[i];
        let said = format!("{} moved from {} to {to}", p.name, p.lease);
        p.lease = to;
        said
    }

    /// Adds a lease and moves a plugin to it; `None` at [`MAX_LEASES`].
    pub fn add_lease(&mut self, rng: &mut StdRng) -> Option<String> {
        if self.leases.len() >= MAX_LEASES {
            return None;
        }
        let name = format!("l{}", self.next);
        self.next += 1;
        self.leases.push(name.clone());
        let i = rng.random_range(0..self.plugins.len());
        let p = &mut self.plugins[i];
        let said = format!("lease {name} added, {} moved to it from {}", p.name, p.lease);
        p.lease = name;
        Some(said)
    }

    /// Removes a lease (two stay at least), its plugins moved to the
    /// others; `None` with two.
    pub fn remove_lease(&mut self, rng: &mut StdRng) -> Option<String> {
        if self.leases.len() <= 2 {
            return None;
        }
        let gone = self.leases.remove(rng.random_range(0..self.leases.len()));
        let mut moved = Vec::new();
        for i in 0..self.plugins.len() {
            if self.plugins[i].lease == gone {
                let to = self.leases[rng.random_range(0..self.leases.len())].clone();
                moved.push(format!("{} to {to}", self.plugins[i].name));
                self.plugins[i].lease = to;
            }
        }
        Some(format!("lease {gone} removed; moved: {moved:?}"))
    }

    /// Switches to the other `[defaults]` table.
    pub fn change_timings(&mut self) -> String {
        self.timing = 1 - self.timing;
        format!("timings: {}", self.defaults[self.timing].replace('\n', " "))
    }

    /// A lease that gates a plugin now.
    pub fn busy_lease(&self, rng: &mut StdRng) -> String {
        self.plugins[rng.random_range(0..self.plugins.len())]
            .lease
            .clone()
    }
}

/// Writes `text` to `cfg` as an editor would save it (a new file renamed
/// over the old one: a watcher never reads half of it), then waits until
/// each of `hosts` has applied a reload (panics if one refuses it, or
/// applies none within 30 s). When the file was written.
pub fn rewrite(cfg: &Path, text: &str, hosts: &[&Host]) -> SystemTime {
    let applied = |h: &Host| h.all(|e| e.message() == "reload applied").len();
    let refused = |h: &Host| h.all(|e| e.message() == "reload refused").len();
    let before: Vec<(usize, usize)> = hosts.iter().map(|h| (applied(h), refused(h))).collect();
    let tmp = cfg.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    let at = SystemTime::now();
    std::fs::rename(&tmp, cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (h, (a, r)) in hosts.iter().zip(before) {
        // Not inside a wait_for predicate: that holds the log's lock.
        while applied(h) <= a {
            assert!(
                refused(h) == r,
                "{}: reload refused:\n{}\nthe file:\n{text}",
                h.name,
                tail(&h.output(), 10)
            );
            assert!(
                Instant::now() < deadline,
                "{}: no reload applied within 30 s:\n{}",
                h.name,
                tail(&h.output(), 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    at
}

/// `baton yield LEASE --for FOR --config CFG`: when it was asked, if the
/// host leading the lease yielded it (it may be between leaders now).
pub fn yield_lease(cfg: &Path, lease: &str, rng: &mut StdRng) -> Option<SystemTime> {
    let r#for = format!("{}ms", rng.random_range(500..4000));
    let at = SystemTime::now();
    let out = baton()
        .args(["yield", lease, "--for", &r#for, "--config"])
        .arg(cfg)
        .output()
        .expect("run baton yield");
    let said = String::from_utf8_lossy(if out.status.success() {
        &out.stdout
    } else {
        &out.stderr
    })
    .trim()
    .to_owned();
    println!("  baton yield {lease} --for {}: {said}", r#for);
    out.status.success().then_some(at)
}

/// One run of a plugin: a host, the lease and its term.
type Run = (String, String, u64);

/// What the per-plugin check found.
#[derive(Debug, Default)]
pub struct PluginFigures {
    pub records: usize,
    /// Distinct (lease, term) that wrote.
    pub terms: usize,
    /// Two runs of one plugin whose records overlap in time.
    pub overlaps: usize,
    /// A record of a lease's term after a newer term of that lease began.
    pub stale: usize,
    /// A record after its run's force-stop (or its process's death).
    pub late: usize,
    /// A plugin's run followed by one on another host.
    pub handovers: usize,
}

/// A host process's log and when the test killed it, if it did.
pub struct Logged<'a> {
    pub host: &'a Host,
    pub killed: Option<SystemTime>,
}

/// The end of every run, by the hosts' logs: its force-stop time, or its
/// process's death; a stopped task's lease is that of the task started
/// last for the plugin on that host (one at a time per host).
fn run_ends(all: &[Logged]) -> HashMap<(String, Run), SystemTime> {
    let mut ends: HashMap<(String, Run), SystemTime> = HashMap::new();
    for p in all {
        let h = &p.host.name;
        let mut lease_of: HashMap<String, String> = HashMap::new();
        for e in p.host.events() {
            let (Some(plugin), Some(term)) = (e.str("plugin"), e.u64("term")) else {
                continue;
            };
            if e.message() == "leader task started" {
                let lease = e.str("lease").unwrap_or_default().to_owned();
                lease_of.insert(plugin.to_owned(), lease.clone());
                if let Some(killed) = p.killed {
                    ends.entry((plugin.to_owned(), (h.clone(), lease, term)))
                        .or_insert(killed);
                }
            } else if e.message() == "leader task stopped" {
                let lease = lease_of.get(plugin).cloned().unwrap_or_default();
                let at = force_stop_at(&e);
                let end = ends
                    .entry((plugin.to_owned(), (h.clone(), lease, term)))
                    .or_insert(at);
                *end = (*end).max(at);
            }
        }
    }
    ends
}

/// When each (lease, term) began, by the hosts' logs (their first leading
/// event of it).
fn term_begins(all: &[Logged]) -> HashMap<(String, u64), SystemTime> {
    let mut begins: HashMap<(String, u64), SystemTime> = HashMap::new();
    for p in all {
        for e in p
            .host
            .all(|e| e.message() == "lease status changed" && e.str("role") == Some("leading"))
        {
            let (Some(lease), Some(term)) = (e.str("lease"), e.u64("term")) else {
                continue;
            };
            let b = begins.entry((lease.to_owned(), term)).or_insert(e.at);
            *b = (*b).min(e.at);
        }
    }
    begins
}

/// A record with its plugin and lease (from its tag `plugin@lease`).
struct Tagged {
    line: usize,
    plugin: String,
    lease: String,
    r: Record,
}

fn read_records(file: &Path) -> Vec<Tagged> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .enumerate()
        .map(|(n, line)| {
            let r = Record::parse(n, line);
            let (plugin, lease) = r
                .guest
                .split_once('@')
                .unwrap_or_else(|| panic!("line {}: no plugin@lease tag: {line}", n + 1));
            Tagged {
                line: n + 1,
                plugin: plugin.to_owned(),
                lease: lease.to_owned(),
                r,
            }
        })
        .collect()
}

/// The check (see the module documentation) of the records in `file`.
pub fn check(file: &Path, all: &[Logged]) -> PluginFigures {
    let mut f = PluginFigures::default();
    let ends = run_ends(all);
    let mut begins = term_begins(all);
    let records = read_records(file);
    // Per plugin, per run: the first and last record's time.
    let mut spans: BTreeMap<String, HashMap<Run, (SystemTime, SystemTime)>> = BTreeMap::new();
    for t in &records {
        f.records += 1;
        let run: Run = (t.r.host.clone(), t.lease.clone(), t.r.term);
        match ends.get(&(t.plugin.clone(), run.clone())) {
            Some(end) if ms_between(*end, t.r.at) <= 5.0 => {}
            Some(end) => {
                f.late += 1;
                eprintln!(
                    "line {}: {}@{} stamped {:.1} ms after its run's end: {run:?}",
                    t.line,
                    t.plugin,
                    t.lease,
                    ms_between(*end, t.r.at)
                );
            }
            None => {
                f.late += 1;
                eprintln!("line {}: {} logged no end of {run:?}", t.line, t.plugin);
            }
        }
        let b = begins.entry((t.lease.clone(), t.r.term)).or_insert(t.r.at);
        *b = (*b).min(t.r.at);
        let span = spans
            .entry(t.plugin.clone())
            .or_default()
            .entry(run)
            .or_insert((t.r.at, t.r.at));
        span.0 = span.0.min(t.r.at);
        span.1 = span.1.max(t.r.at);
    }
    f.stale = stale(&records, &begins);
    for (plugin, runs) in &spans {
        let mut runs: Vec<(&Run, &(SystemTime, SystemTime))> = runs.iter().collect();
        runs.sort_by_key(|(_, (first, _))| *first);
        // The run that wrote last among those begun so far.
        let mut latest: Option<(&Run, SystemTime)> = None;
        for pair in runs.windows(2) {
            if pair[0].0.0 != pair[1].0.0 {
                f.handovers += 1;
            }
        }
        for (run, (first, last)) in &runs {
            if let Some((before, until)) = latest
                && until >= *first
            {
                f.overlaps += 1;
                eprintln!(
                    "{plugin}: {before:?} wrote until {:.1} ms after {run:?} began",
                    ms_between(*first, until)
                );
            }
            if latest.is_none_or(|(_, until)| *last > until) {
                latest = Some((run, *last));
            }
        }
    }
    f.terms = spans
        .values()
        .flat_map(|runs| runs.keys().map(|(_, l, t)| (l.clone(), *t)))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    f
}

/// Records of a lease's term stamped after a newer term of that lease
/// began.
fn stale(records: &[Tagged], begins: &HashMap<(String, u64), SystemTime>) -> usize {
    // Per lease: the earliest beginning of any term newer than each term.
    let mut by_lease: BTreeMap<&str, BTreeMap<u64, SystemTime>> = BTreeMap::new();
    for ((lease, term), at) in begins {
        by_lease.entry(lease).or_default().insert(*term, *at);
    }
    let mut newer: HashMap<(&str, u64), SystemTime> = HashMap::new();
    for (lease, terms) in &by_lease {
        let mut min: Option<SystemTime> = None;
        for (term, at) in terms.iter().rev() {
            if let Some(m) = min {
                newer.insert((lease, *term), m);
            }
            min = Some(min.map_or(*at, |m| m.min(*at)));
        }
    }
    let mut n = 0;
    for t in records {
        if let Some(began) = newer.get(&(t.lease.as_str(), t.r.term))
            && t.r.at > *began
        {
            n += 1;
            eprintln!(
                "line {}: {}@{} of term {} stamped {:.1} ms after a newer term of {} began",
                t.line,
                t.plugin,
                t.lease,
                t.r.term,
                ms_between(*began, t.r.at),
                t.lease
            );
        }
    }
    n
}

/// Waits until every plugin of `layout` has a record stamped after the
/// call in `file`, within `within`: none is left wedged by the faults.
pub fn wait_all_run(file: &Path, layout: &Layout, within: Duration) {
    let from = SystemTime::now();
    let deadline = Instant::now() + within;
    loop {
        let records = read_records(file);
        let missing: Vec<String> = layout
            .plugins
            .iter()
            .filter(|p| {
                !records
                    .iter()
                    .rev()
                    .take_while(|t| t.r.at > from)
                    .any(|t| t.plugin == p.name && t.lease == p.lease)
            })
            .map(|p| format!("{}@{}", p.name, p.lease))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no record of {missing:?} within {within:?} after the last fault"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
