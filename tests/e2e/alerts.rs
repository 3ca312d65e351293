//! The alerting rules and the dashboard in `deploy/` against what real
//! hosts export. Four hosts go through a stalled leader, a leader paused
//! in a write (refused), a paused leader whose record is garbled, and a
//! hand-over, while each host's `/metrics` is scraped every 100 ms. The
//! scrapes become a `promtool test rules` file (one value per step,
//! `stale` where a scrape failed or a series was gone, as Prometheus
//! records it) whose expected alerts come from a model of each rule
//! computed here from the same samples, at every other step where the
//! model is steady. `promtool check rules` and `promtool test rules` must
//! pass (also on the hand-written cases in
//! `deploy/prometheus/baton-rules.test.yaml`), every alert must have fired
//! at some step, and every `baton_` name in the rules and the dashboard's
//! queries must be in a real scrape. promtool: `BATON_PROMTOOL`, PATH, or
//! `scripts/promtool.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The scrape interval, also promtool's step and evaluation interval.
const STEP_MS: u64 = 100;
const RULES: &str = "deploy/prometheus/baton-rules.yaml";
const DASHBOARD: &str = "deploy/grafana/baton-dashboard.json";

type Labels = BTreeMap<String, String>;

/// Each host's scrape per round (round, host): `None` when it failed (no
/// answer within two and a half rounds).
type Scrapes = BTreeMap<(usize, String), Option<String>>;
type Rounds = Arc<Mutex<Scrapes>>;

/// Scrapes registered hosts every [`STEP_MS`], each on a thread of its own.
struct Scraper {
    start: Instant,
    rounds: Rounds,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Scraper {
    fn new() -> Scraper {
        Scraper {
            start: Instant::now(),
            rounds: Arc::default(),
            stop: Arc::default(),
            threads: Vec::new(),
        }
    }

    /// Scrapes `h` from the next round until the end.
    fn add(&mut self, h: &Host) {
        let addr: std::net::SocketAddr = h.admin_address().parse().unwrap();
        let (name, rounds, stop, start) =
            (h.name.clone(), self.rounds.clone(), self.stop.clone(), self.start);
        let step = Duration::from_millis(STEP_MS);
        self.threads.push(std::thread::spawn(move || {
            let mut round = (start.elapsed().as_millis() as u64 / STEP_MS + 1) as usize;
            while !stop.load(Ordering::SeqCst) {
                let at = start + step * round as u32;
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                // Given up after two and a half steps (a busy machine
                // answers late; a paused host never): the rounds it
                // spans have no sample, `stale` as a failed one.
                let text = scrape(addr, at + step * 25 / 10);
                rounds.lock().unwrap().insert((round, name.clone()), text);
                round = (start.elapsed().as_millis() as u64 / STEP_MS + 1) as usize;
            }
        }));
    }

    /// Waits (up to a minute) until the scrapes so far satisfy `done`: a
    /// phase of the scenario lasts until the scrapes show what its alert
    /// needs, however many a busy machine lost.
    fn wait(&self, what: &str, done: impl Fn(&Scrapes) -> bool) {
        let until = Instant::now() + SECS(60);
        while !done(&self.rounds.lock().unwrap()) {
            assert!(Instant::now() < until, "no scrape showed {what} within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The round of `at`.
    fn round_of(&self, at: Instant) -> usize {
        (at.saturating_duration_since(self.start).as_millis() as u64 / STEP_MS) as usize
    }

    fn finish(self) -> Scrapes {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.rounds.lock().unwrap())
    }
}

/// `GET /metrics` from `addr`, given up at `until` (a paused host answers
/// nothing).
fn scrape(addr: std::net::SocketAddr, until: Instant) -> Option<String> {
    let left = || {
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let mut s = std::net::TcpStream::connect_timeout(&addr, left()?).ok()?;
    s.set_read_timeout(Some(left()?)).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The value of `name` for lease `lease` in a scrape.
fn value_of(text: &str, name: &str, lease: &str) -> Option<f64> {
    samples(text)
        .into_iter()
        .find(|(l, _)| l["__name__"] == name && l.get("lease").map(String::as_str) == Some(lease))
        .map(|(_, v)| v)
}

/// The samples of a Prometheus text body: name and labels, value.
fn samples(text: &str) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, rest) = series.split_once('{').unwrap_or((series, ""));
        let mut labels = Labels::from([("__name__".to_owned(), name.to_owned())]);
        let mut rest = rest.trim_end_matches('}');
        while let Some((key, after)) = rest.split_once("=\"") {
            let end = after.find('"').expect("a closed label value");
            labels.insert(key.trim_start_matches(',').to_owned(), after[..end].to_owned());
            rest = &after[end + 1..];
        }
        out.push((labels, value));
    }
    out
}

/// One series: its labels (with `__name__`, `instance`, `job`) and its
/// value at each round, `None` where it had none.
struct Series {
    labels: Labels,
    first: usize,
    v: Vec<Option<f64>>,
}

impl Series {
    fn name(&self) -> &str {
        &self.labels["__name__"]
    }

    fn is(&self, name: &str, want: &[(&str, &str)]) -> bool {
        self.name() == name
            && want
                .iter()
                .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }

    /// Labels less the name (what a function of the series keeps).
    fn plain(&self) -> Labels {
        let mut l = self.labels.clone();
        l.remove("__name__");
        l
    }

    /// The samples in the range `[r - window, r]`, oldest first.
    fn range(&self, r: usize, window: usize) -> Vec<f64> {
        self.v[r.saturating_sub(window)..=r]
            .iter()
            .flatten()
            .copied()
            .collect()
    }

    /// promtool's notation: `_` before the first sample, `stale` where
    /// a scrape failed or left the series out.
    fn values(&self) -> String {
        let text: Vec<String> = self
            .v
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Some(x) => format!("{x}"),
                None if i < self.first => "_".to_owned(),
                None => "stale".to_owned(),
            })
            .collect();
        text.join(" ")
    }
}

/// The series of every `baton_` metric but histograms' buckets, over `n`
/// rounds.
fn to_series(rounds: &Scrapes, n: usize) -> Vec<Series> {
    let mut all: BTreeMap<String, Series> = BTreeMap::new();
    for ((r, host), text) in rounds {
        for (mut labels, value) in samples(text.as_deref().unwrap_or_default()) {
            let name = &labels["__name__"];
            if !name.starts_with("baton_") || name.ends_with("_bucket") {
                continue;
            }
            labels.insert("instance".into(), host.clone());
            labels.insert("job".into(), "baton".into());
            let key = format!("{labels:?}");
            let s = all.entry(key).or_insert_with(|| Series {
                labels,
                first: *r,
                v: vec![None; n],
            });
            s.first = s.first.min(*r);
            s.v[*r] = Some(value);
        }
    }
    all.into_values().collect()
}

/// The counter's increase over its samples, resets counted as Prometheus
/// does; `None` with fewer than two samples.
fn increase(samples: &[f64]) -> Option<f64> {
    (samples.len() >= 2).then(|| {
        samples
            .windows(2)
            .map(|w| if w[1] >= w[0] { w[1] - w[0] } else { w[1] })
            .sum()
    })
}

/// The alerts of each rule at round `r`, by the rule's meaning (without
/// `alertname` and `severity`).
fn model(all: &[Series], r: usize) -> BTreeMap<&'static str, BTreeSet<Labels>> {
    let win = |secs: u64| (secs * 1000 / STEP_MS) as usize;
    let mut out: BTreeMap<&'static str, BTreeSet<Labels>> = BTreeMap::new();
    for name in ALERTS {
        out.insert(name, BTreeSet::new());
    }
    let leases: BTreeSet<String> = all
        .iter()
        .filter_map(|s| s.labels.get("lease").cloned())
        .collect();
    for lease in &leases {
        let lease_only = Labels::from([("lease".to_owned(), lease.clone())]);
        let l = lease.as_str();
        // Without a leader: now - the last round some host led, against
        // the largest LD + RP a live host exports.
        let roles: Vec<&Series> = all
            .iter()
            .filter(|s| s.is("baton_lease_role", &[("role", "leading"), ("lease", l)]))
            .collect();
        // The last round some host reported leading the lease, else the
        // first round any reported it.
        let seen: Vec<usize> = (r.saturating_sub(win(900))..=r)
            .filter(|&j| roles.iter().any(|s| s.v[j].is_some()))
            .collect();
        let led = seen
            .iter()
            .copied()
            .filter(|&j| roles.iter().filter_map(|s| s.v[j]).sum::<f64>() > 0.0)
            .max();
        let last_led = led.or_else(|| seen.first().copied());
        let limit = all
            .iter()
            .filter(|s| s.is("baton_lease_duration_seconds", &[("lease", l)]))
            .filter_map(|ld| {
                let rp = all.iter().find(|s| {
                    s.is("baton_lease_retry_period_seconds", &[("lease", l)]) && s.plain() == ld.plain()
                })?;
                Some(ld.v[r]? + rp.v[r]?)
            })
            .reduce(f64::max);
        if let (Some(j), Some(limit)) = (last_led, limit)
            && (r - j) as f64 * STEP_MS as f64 / 1000.0 > limit
        {
            out.get_mut("BatonLeaseWithoutLeader")
                .unwrap()
                .insert(lease_only.clone());
        }
        // Term churn: changes of the highest term any host reports, in 15
        // minutes (a subquery: one point per round with a term).
        let terms: Vec<&Series> = all
            .iter()
            .filter(|s| s.is("baton_lease_term", &[("lease", l)]))
            .collect();
        let highest: Vec<f64> = (r.saturating_sub(win(900))..=r)
            .filter_map(|j| terms.iter().filter_map(|s| s.v[j]).reduce(f64::max))
            .collect();
        let churn = (!highest.is_empty()).then(|| highest.windows(2).filter(|w| w[0] != w[1]).count());
        if churn.is_some_and(|c| c > 3) {
            out.get_mut("BatonLeaseTermChurn").unwrap().insert(lease_only);
        }
    }
    model_per_host(all, r, &mut out);
    out
}

/// The rules whose alerts are per host (and plugin).
fn model_per_host(all: &[Series], r: usize, out: &mut BTreeMap<&'static str, BTreeSet<Labels>>) {
    let win = |secs: u64| (secs * 1000 / STEP_MS) as usize;
    for s in all {
        let rose = |window| increase(&s.range(r, window)).is_some_and(|x| x > 0.0);
        if s.is("baton_plugin_forced_stops_total", &[]) && rose(win(900)) {
            out.get_mut("BatonPluginForcedStops").unwrap().insert(s.plain());
        }
        if s.is("baton_plugin_keyvalue_operations_total", &[("outcome", "stale")]) && rose(win(3600)) {
            out.get_mut("BatonPluginStaleWrites").unwrap().insert(s.plain());
        }
        if s.is("baton_lease_seconds_since_renewal", &[]) {
            let rd = all
                .iter()
                .find(|d| d.is("baton_lease_renew_deadline_seconds", &[]) && d.plain() == s.plain());
            if let (Some(since), Some(rd)) = (s.v[r], rd.and_then(|d| d.v[r]))
                && since > rd
            {
                out.get_mut("BatonLeaseRenewOverdue").unwrap().insert(s.plain());
            }
        }
    }
    // Store errors other than conflicts, summed by lease and host.
    let mut sums: BTreeMap<Labels, f64> = BTreeMap::new();
    for s in all.iter().filter(|s| s.is("baton_lease_store_errors_total", &[])) {
        if s.labels["kind"] == "conflict" {
            continue;
        }
        if let Some(x) = increase(&s.range(r, win(300))) {
            let key = Labels::from([
                ("lease".to_owned(), s.labels["lease"].clone()),
                ("instance".to_owned(), s.labels["instance"].clone()),
            ]);
            *sums.entry(key).or_default() += x;
        }
    }
    for (labels, sum) in sums {
        if sum > 0.0 {
            out.get_mut("BatonLeaseStoreErrors").unwrap().insert(labels);
        }
    }
}

const ALERTS: [&str; 6] = [
    "BatonLeaseWithoutLeader",
    "BatonLeaseTermChurn",
    "BatonPluginForcedStops",
    "BatonLeaseStoreErrors",
    "BatonLeaseRenewOverdue",
    "BatonPluginStaleWrites",
];

/// Each alert's severity, summary and description, from the rules file
/// (as written there: one line each).
fn rule_texts(rules: &str) -> BTreeMap<String, [String; 3]> {
    let mut out: BTreeMap<String, [String; 3]> = BTreeMap::new();
    let mut current = String::new();
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ") {
            current = name.to_owned();
            out.insert(current.clone(), Default::default());
        }
        for (i, key) in ["severity: ", "summary: ", "description: "].iter().enumerate() {
            if let (Some(value), Some(texts)) = (line.strip_prefix(key), out.get_mut(&current)) {
                texts[i] = value.trim_matches('"').to_owned();
            }
        }
    }
    out
}

/// `template` with each `{{ $labels.NAME }}` replaced.
fn render(template: &str, labels: &Labels) -> String {
    let mut out = template.to_owned();
    while let Some(at) = out.find("{{ $labels.") {
        let end = at + out[at..].find("}}").expect("a closed template");
        let name = out[at + "{{ $labels.".len()..end].trim();
        out = format!(
            "{}{}{}",
            &out[..at],
            labels.get(name).cloned().unwrap_or_default(),
            &out[end + 2..]
        );
    }
    out
}

/// A YAML string (JSON's quoting is YAML's).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The `promtool test rules` file: the series and, at every other round
/// where each rule's alerts stay the same for 3 rounds either side, the
/// alerts the model expects. Returns it and the alerts that fired.
fn test_file(rules: &Path, all: &[Series], n: usize) -> (String, BTreeSet<&'static str>) {
    let texts = rule_texts(&std::fs::read_to_string(rules).unwrap());
    let models: Vec<_> = (0..n).map(|r| model(all, r)).collect();
    let mut out = format!(
        "rule_files: [{}]\nevaluation_interval: {STEP_MS}ms\ntests:\n  - interval: {STEP_MS}ms\n    input_series:\n",
        q(&rules.display().to_string())
    );
    for s in all {
        let selector = format!(
            "{}{{{}}}",
            s.name(),
            s.plain()
                .iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        out += &format!(
            "      - series: {}\n        values: {}\n",
            q(&selector),
            q(&s.values())
        );
    }
    out += "    alert_rule_test:\n";
    let mut fired = BTreeSet::new();
    for r in (3..n.saturating_sub(3)).step_by(2) {
        for alert in ALERTS {
            let now = &models[r][alert];
            if (r - 3..=r + 3).any(|i| &models[i][alert] != now) {
                continue;
            }
            if !now.is_empty() {
                fired.insert(alert);
            }
            out += &format!(
                "      - eval_time: {}ms\n        alertname: {alert}\n        exp_alerts:",
                r as u64 * STEP_MS
            );
            out += if now.is_empty() { " []\n" } else { "\n" };
            let [severity, summary, description] = &texts[alert];
            for labels in now {
                let mut all_labels = labels.clone();
                all_labels.insert("severity".into(), severity.clone());
                out += &format!("          - exp_labels: {}\n", q_map(&all_labels));
                let notes = Labels::from([
                    ("summary".to_owned(), render(summary, labels)),
                    ("description".to_owned(), render(description, labels)),
                ]);
                out += &format!("            exp_annotations: {}\n", q_map(&notes));
            }
        }
    }
    (out, fired)
}

fn q_map(m: &Labels) -> String {
    let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}: {}", q(v))).collect();
    format!("{{{}}}", items.join(", "))
}

/// promtool: `BATON_PROMTOOL`, else on PATH, else the one
/// `scripts/promtool.sh` unpacked into the cache.
fn promtool() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_PROMTOOL") {
        return p.into();
    }
    let cached = PathBuf::from(
        std::env::var("BATON_CACHE")
            .unwrap_or_else(|_| format!("{}/.cache/baton", std::env::var("HOME").unwrap_or_default())),
    )
    .join("promtool/promtool");
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    on_path.or_else(|| cached.is_file().then_some(cached)).unwrap_or_else(|| {
        panic!("no promtool: set BATON_PROMTOOL, put it on PATH, or run scripts/promtool.sh (scripts/test.sh does)")
    })
}

/// Runs promtool with `args`; panics with its output if it fails.
fn run_promtool(args: &[&std::ffi::OsStr], keep: &Path) {
    let out = std::process::Command::new(promtool())
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {args:?} failed (files kept in {}):\n{}",
        keep.display(),
        tail(&text, 60)
    );
}

/// Every `baton_` identifier in `text`.
fn baton_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("baton_") {
        if at > 0 && text.as_bytes()[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.insert(name);
    }
    names
}

/// The dashboard's queries: every panel target's `expr` and every
/// variable's query.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    for v in dashboard["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = v["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// The dashboard's panel queries as recording rules (Grafana's variables
/// given values), for `promtool check rules` to parse.
fn dashboard_as_rules(queries: &[String]) -> String {
    let mut out = "groups:\n  - name: dashboard\n    rules:\n".to_owned();
    for (i, q) in queries
        .iter()
        .filter(|q| !q.starts_with("label_values("))
        .enumerate()
    {
        let expr = q
            .replace("$__rate_interval", "1m")
            .replace("$lease", ".*")
            .replace("$plugin", ".*");
        out += &format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        );
    }
    out
}

/// A host of `cfg` serving its admin endpoints on a free port, with `args`
/// and `env`.
fn start(name: &str, cfg: &Path, args: &[&str], env: &[(&str, &str)]) -> Host {
    let mut all: Vec<&std::ffi::OsStr> = vec!["--admin-address".as_ref(), "127.0.0.1:0".as_ref()];
    all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    Host::start_opts(
        name,
        cfg,
        Opts {
            args: &all,
            env,
            ..Opts::default()
        },
    )
}

fn leading(e: &Event) -> bool {
    e.message() == "lease status changed"
        && e.str("lease") == Some("demo")
        && e.str("role") == Some("leading")
}

/// The events the rules are about, with real hosts scraped throughout;
/// returns the scrapes and the hosts still running.
fn run_scenario(s: &Scratch) -> (Scrapes, Vec<Host>) {
    let mut text = config(&s.store(), &[probe("stubborn", "future", "block")]);
    text += &format!(
        "\n[[plugin]]\nname = \"counter\"\npath = {:?}\nlease = \"demo\"\nenv = {{ KV_INTERVAL_MS = \"50\" }}\n",
        guest("kv_counter.wasm").display().to_string()
    );
    let cfg = s.write("baton.toml", &text);
    let mut scraper = Scraper::new();
    // a leads, then its election stalls: it still says it leads, past its
    // renew deadline; its tasks are stopped by force; b takes over.
    let mut a = start("a", &cfg, &["--test-stall-election-runtime", "2s"], &[]);
    scraper.add(&a);
    a.wait_for(SECS(60), "a leads", leading);
    let delay = [("BATON_TEST_BUCKET_WRITE_DELAY", "3s")];
    let b = start("b", &cfg, &[], &delay);
    scraper.add(&b);
    b.wait_for(SECS(60), "b leads", leading);
    // a's overdue renewal, as scrapes of a show it (a few in a row, for
    // the alert's evaluation), however many scrapes a busy machine lost.
    scraper.wait("a's renewal overdue in three scrapes", |rounds| {
        let overdue = |text: &str| {
            let since = value_of(text, "baton_lease_seconds_since_renewal", "demo");
            let rd = value_of(text, "baton_lease_renew_deadline_seconds", "demo");
            since.zip(rd).is_some_and(|(since, rd)| since > rd)
        };
        rounds
            .iter()
            .filter(|((_, h), text)| h == "a" && text.as_deref().is_some_and(overdue))
            .count()
            >= 3
    });
    std::thread::sleep(SECS(1));
    a.sigkill();
    // b paused in a write (delayed 3 s in the host): c takes over, and b's
    // write is refused when it resumes.
    b.wait_for(SECS(60), "b's write", |e| e.guest_line("counter", "kv try"));
    std::thread::sleep(Duration::from_millis(300));
    b.signal(libc::SIGSTOP);
    let c = start("c", &cfg, &[], &[]);
    scraper.add(&c);
    c.wait_for(SECS(60), "c's first write", |e| e.guest_line("counter", "kv ok"));
    b.signal(libc::SIGCONT);
    b.wait_for(SECS(30), "b's write refused", |e| {
        e.message() == "refused a stale write"
    });
    // b knows c's term before the record goes, so that b's takeover below
    // is dated from the deletion (a frozen leader that missed c's term
    // waits out c's unknown lease first: crash.rs).
    b.wait_for(SECS(30), "b follows c", |e| {
        e.message() == "lease status changed" && e.str("holder") == Some("c")
    });
    // c paused and its record garbled: b cannot take the lease (store
    // errors) for longer than LD + RP; c killed and the lease deleted, b
    // takes it.
    let mut c = c;
    c.signal(libc::SIGSTOP);
    let paused = Instant::now();
    garble_lease(&s.store(), "demo", "garbage\n");
    std::thread::sleep((paused + Duration::from_millis(4200)).saturating_duration_since(Instant::now()));
    // And until a scrape of b that late (LD + RP + 1 s after the pause)
    // came, however many a busy machine lost: the lease was without a
    // leader for longer than LD + RP by the scrapes.
    let late = scraper.round_of(paused + Duration::from_millis(3200));
    scraper.wait("a scrape of b after LD + RP", |rounds| {
        rounds
            .iter()
            .any(|((r, h), text)| *r >= late && h == "b" && text.is_some())
    });
    c.sigkill();
    let deleted = std::time::SystemTime::now();
    delete_lease(&s.store(), "demo");
    b.wait_for(SECS(30), "b leads again", |e| e.at >= deleted && leading(e));
    // One more term: b hands over to d on SIGTERM.
    let d = start("d", &cfg, &[], &[]);
    scraper.add(&d);
    d.wait_for(SECS(60), "d follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    let mut b = b;
    let handed = std::time::SystemTime::now();
    b.sigterm();
    d.wait_for(SECS(30), "the hand-over", |e| e.at >= handed && leading(e));
    b.wait_exit(SECS(30));
    std::thread::sleep(Duration::from_millis(1000));
    (scraper.finish(), vec![d])
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls the election runtime: needs a build with --features test-hooks"
)]
fn alert_rules_fire_on_what_real_hosts_export_and_the_dashboard_names_real_metrics() {
    let started = Instant::now();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let rules = repo.join(RULES);
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo.join(DASHBOARD)).unwrap())
            .unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    let queries = dashboard_queries(&dashboard);
    let s = Scratch::new();
    // The generated files, kept when a check fails.
    let keep = std::env::temp_dir().join(format!("baton-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&keep).unwrap();
    let write = |name: &str, text: &str| {
        let path = keep.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    run_promtool(&["check".as_ref(), "rules".as_ref(), rules.as_os_str()], &keep);
    // The hand-written cases beside the rules.
    let cases = repo.join("deploy/prometheus/baton-rules.test.yaml");
    run_promtool(&["test".as_ref(), "rules".as_ref(), cases.as_os_str()], &keep);
    let dash_rules = write("dashboard-rules.yaml", &dashboard_as_rules(&queries));
    run_promtool(
        &["check".as_ref(), "rules".as_ref(), dash_rules.as_os_str()],
        &keep,
    );

    let (rounds, hosts) = run_scenario(&s);
    let scenario = started.elapsed();
    // Every name the rules and the dashboard use is in a real scrape.
    let exported: BTreeSet<String> = rounds
        .values()
        .flatten()
        .flat_map(|t| samples(t).into_iter().map(|(l, _)| l["__name__"].clone()))
        .collect();
    let mut used = baton_names(&rules_text);
    used.extend(queries.iter().flat_map(|q| baton_names(q)));
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "named in {RULES} or {DASHBOARD} but in no scrape: {missing:?}"
    );

    let n = rounds.keys().map(|(r, _)| r + 1).max().unwrap();
    let series = to_series(&rounds, n);
    let (file, fired) = test_file(&rules, &series, n);
    let tests = write("baton-rules.test.yaml", &file);
    let not_fired: Vec<_> = ALERTS.iter().filter(|a| !fired.contains(*a)).collect();
    assert!(
        not_fired.is_empty(),
        "never fired in the run: {not_fired:?} (files kept in {})",
        keep.display()
    );
    let checked = Instant::now();
    run_promtool(&["test".as_ref(), "rules".as_ref(), tests.as_os_str()], &keep);
    println!(
        "alerts: {n} rounds of {STEP_MS} ms, {} series, {} alert tests, scenario {scenario:.1?}, promtool test {:.1?}, all {:.1?}",
        series.len(),
        file.matches("- eval_time:").count(),
        checked.elapsed(),
        started.elapsed()
    );
    drop(hosts);
    std::fs::remove_dir_all(&keep).unwrap();
}
