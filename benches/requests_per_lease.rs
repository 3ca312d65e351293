//! Requests to the API server against the number of leases, on Kubernetes:
//! two real `baton run` hosts share N leases (`BATON_BENCH_LEASES`,
//! default `1,10,100`; spreading is on by default with more than one
//! lease, so each host leads about half) and no plugins, idle for a window
//! of `BATON_BENCH_WINDOW_SECS` (default 30 s); the API server's own
//! counts (`/metrics`, `apiserver_request_total` on Leases and ConfigMaps,
//! after minus before) give the requests per minute per verb.
//!
//! For comparison, client-go 1.20.2's `tools/leaderelection`
//! (`benches/clientgo`, one process per lease and host: a leader and a
//! follower per lease) at the same timings, for the lease counts of
//! `BATON_BENCH_CLIENTGO` (default `1,10`; empty for none): 100 leases would
//! be 200 Go processes polling the server about 500 times a second, too
//! much for the 2-core machine the bench shares, and client-go's requests
//! grow linearly with its processes.
//!
//! Timings: lease 4 s, renew deadline 3 s, retry period 500 ms, baton's
//! grace 500 ms (3 s + 500 ms + 250 ms margin < 4 s), as `versus_client_go`'s
//! fast set; baton's request timeout is its default, min(RP, RD / 2).
//! Every run has a namespace of its own and fresh hosts; baton's hosts run
//! as token users baton-a and baton-b with the deploy Role
//! (`deploy/kubernetes/role.yaml`), client-go as the admin. The window
//! starts once the leases are spread (one leader per lease for client-go:
//! LD + 1 s after start) and have been for a lease duration. One API server
//! of the bench's own (`scripts/kube-testenv.sh start`), so nothing else
//! writes; the tools run one after the other, `BATON_BENCH_RUNS` runs each
//! (default 3).
//!
//! A run whose hosts have not spread the leases within 120 s is not
//! measured: the bench prints the hosts' last lines, records the failure in
//! the JSON (`failed_runs`) and tries again, twice at most per lease count.
//!
//! Prints the per-minute counts per run, a Markdown table of the medians,
//! writes every run to `requests-per-lease.json` and plots requests per
//! minute against leases (`requests-per-lease.svg`, log-log: median, min to
//! max) into `BATON_BENCH_PLOTS` (default `docs/perf/`), with
//! `benches/plot.rs`.
//!
//! Run: `scripts/bench.sh --bench requests_per_lease` (about 9 minutes on
//! a 2-core machine; `BATON_BENCH_LONG=1 scripts/bench.sh` runs it with the
//! others). The Kubernetes test server must be installed
//! (`scripts/kube-testenv.sh install`).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/kube/env.rs"]
#[allow(dead_code)]
mod env;

// benches/plot.rs, shared by the benches (each uses part of it).
#[path = "clientgo.rs"]
mod clientgo;

#[path = "plot.rs"]
#[allow(dead_code)]
mod plot;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::rbac::v1::Role;
use kube::Client;
use serde_json::{Value, json};

use env::{KubeEnv, OwnServer, TestNamespace, leases_config};
use support::*;

const LD: Duration = Duration::from_secs(4);
const RD: Duration = Duration::from_secs(3);
const RP: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_millis(500);

/// Requests per minute (or counts) per "VERB resource".
type Counts = BTreeMap<String, f64>;

/// `apiserver_request_total` on Leases and ConfigMaps, summed per
/// "VERB resource".
async fn requests(admin: &Client) -> Counts {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(req).await.unwrap();
    let mut counts = Counts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let resource = label("resource");
        if resource != "leases" && resource != "configmaps" {
            continue;
        }
        *counts
            .entry(format!("{} {resource}", label("verb")))
            .or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    counts
}

/// What every run needs.
struct Bench {
    env: KubeEnv,
    admin: Client,
    rt: tokio::runtime::Runtime,
    role: Role,
    clientgo: Option<PathBuf>,
    window: Duration,
}

impl Bench {
    /// The requests per minute over the window, per "VERB resource",
    /// leaving out zeros.
    fn measure(&self) -> Counts {
        let before = self.rt.block_on(requests(&self.admin));
        std::thread::sleep(self.window);
        let after = self.rt.block_on(requests(&self.admin));
        let minutes = self.window.as_secs_f64() / 60.0;
        after
            .iter()
            .map(|(k, n)| (k.clone(), (n - before.get(k).copied().unwrap_or(0.0)) / minutes))
            .filter(|(_, n)| *n > 0.0)
            .collect()
    }

    fn namespace(&self, prefix: &str) -> TestNamespace {
        self.rt
            .block_on(TestNamespace::create(self.admin.clone(), prefix))
    }

    /// Two baton hosts sharing `leases` leases; an error if they did not
    /// spread them within 120 s.
    fn baton(&self, leases: usize) -> Result<Counts, String> {
        let ns = self.namespace(&format!("rpl-baton-{leases}"));
        for user in ["baton-a", "baton-b"] {
            let mut r = self.role.clone();
            r.metadata.name = Some(format!("baton-{user}"));
            self.rt.block_on(ns.bind(r, user));
        }
        let s = Scratch::new();
        let cfg = s.write(
            "baton.toml",
            &leases_config(&ns.name, [LD, RD, RP, GRACE], leases),
        );
        let mut hosts: Vec<Host> = ["a", "b"]
            .iter()
            .map(|who| {
                let kc = self.env.kubeconfig(&format!("baton-{who}"));
                Host::start_with_args(
                    who,
                    &cfg,
                    &shared_cache_dir(),
                    &[OsStr::new("--kubeconfig"), kc.as_os_str()],
                )
            })
            .collect();
        let spread = |hosts: &[Host]| {
            let (a, b) = (led(&hosts[0]).len(), led(&hosts[1]).len());
            a + b == leases && a.abs_diff(b) <= 1
        };
        let until = Instant::now() + Duration::from_secs(120);
        while !spread(&hosts) {
            if Instant::now() >= until {
                // A failed run, told and counted, not measured.
                let failure = format!(
                    "{leases} leases not spread in 120 s: the hosts lead {} and {}",
                    led(&hosts[0]).len(),
                    led(&hosts[1]).len()
                );
                eprintln!("requests_per_lease: {failure}; their last lines:");
                for h in &hosts {
                    eprintln!("--- {}\n{}", h.name, tail(&h.output(), 30));
                }
                return Err(failure);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let the hand-overs' watches and floors settle.
        std::thread::sleep(LD);
        assert!(spread(&hosts), "{leases} leases: the spread moved while settling");
        let counts = self.measure();
        if !spread(&hosts) {
            eprintln!("requests_per_lease: {leases} leases: the spread moved during the window");
        }
        for h in &mut hosts {
            h.sigterm();
        }
        for h in &mut hosts {
            assert!(h.wait_exit(Duration::from_secs(30)).success(), "{}", h.name);
        }
        Ok(counts)
    }

    /// A client-go leader and follower per lease, `leases` leases.
    fn clientgo(&self, leases: usize) -> Result<Counts, String> {
        let bin = self.clientgo.as_ref().expect("the client-go elector");
        let ns = self.namespace(&format!("rpl-cg-{leases}"));
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut procs: Vec<Child> = Vec::new();
        for who in ["a", "b"] {
            for i in 0..leases {
                procs.push(
                    Command::new(bin)
                        .args([
                            format!("-kubeconfig={}", self.env.admin_kubeconfig.display()),
                            format!("-namespace={}", ns.name),
                            format!("-lease=lease-{i:03}"),
                            format!("-identity=cg-{who}-{i:03}"),
                            format!("-lease-duration={}", ms(LD)),
                            format!("-renew-deadline={}", ms(RD)),
                            format!("-retry-period={}", ms(RP)),
                            "-act-every=1h".to_owned(),
                        ])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start clientgo-elector"),
                );
            }
        }
        // Every lease has a leader within a retry period or two; the
        // followers poll from the start.
        std::thread::sleep(LD + Duration::from_secs(1));
        let counts = self.measure();
        for mut p in procs {
            let _ = p.kill();
            let _ = p.wait();
        }
        Ok(counts)
    }
}

fn counts_list(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "none")
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("{var}: lease counts, comma-separated"))
        })
        .collect()
}

fn total(c: &Counts) -> f64 {
    c.values().sum()
}

/// The median per key over runs (a key missing from a run counts 0).
fn medians(runs: &[Counts]) -> Counts {
    let keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let v: Vec<f64> = runs.iter().map(|r| r.get(k).copied().unwrap_or(0.0)).collect();
            (k.clone(), plot::median(&v))
        })
        .collect()
}

fn detail(c: &Counts) -> String {
    c.iter()
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let started = Instant::now();
    let runs: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let window = Duration::from_secs(
        std::env::var("BATON_BENCH_WINDOW_SECS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(30),
    );
    let lease_counts = counts_list("BATON_BENCH_LEASES", "1,10,100");
    let clientgo_counts = counts_list("BATON_BENCH_CLIENTGO", "1,10");
    let plots = std::env::var_os("BATON_BENCH_PLOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf")));
    let clientgo = (!clientgo_counts.is_empty()).then(clientgo::build);

    eprintln!("requests_per_lease: starting an API server of its own (scripts/kube-testenv.sh start)");
    let server = OwnServer::start("");
    let env = server.env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let admin = rt.block_on(env.admin());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let bench = Bench {
        env,
        admin,
        rt,
        role,
        clientgo,
        window,
    };
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    println!(
        "requests_per_lease: two hosts, leases {lease_counts:?} (client-go: {clientgo_counts:?}), lease {LD:?}, \
         renew {RD:?}, retry {RP:?}, {window:?} idle, {runs} runs each, kube-apiserver 1.20.2, {date}"
    );

    let mut measured: BTreeMap<(usize, &str), Vec<Counts>> = BTreeMap::new();
    let mut failures: Vec<Value> = Vec::new();
    let all: BTreeSet<usize> = lease_counts.iter().chain(&clientgo_counts).copied().collect();
    for &n in &all {
        for (tool, wanted) in [("baton", &lease_counts), ("client-go", &clientgo_counts)] {
            if !wanted.contains(&n) {
                continue;
            }
            // A failed run is tried again, twice at most per count.
            let (mut done, mut failed) = (0, 0);
            while done < runs {
                let i = done;
                let result = if tool == "baton" {
                    bench.baton(n)
                } else {
                    bench.clientgo(n)
                };
                let c = match result {
                    Ok(c) => c,
                    Err(e) => {
                        failures.push(json!({ "tool": tool, "leases": n, "error": e }));
                        failed += 1;
                        assert!(failed <= 2, "{tool}, {n} leases: {failed} failed runs");
                        continue;
                    }
                };
                done += 1;
                println!(
                    "{tool:<9} {n:>3} leases, run {}: {:>8.0} / min ({})",
                    i + 1,
                    total(&c),
                    detail(&c)
                );
                measured.entry((n, tool)).or_default().push(c);
            }
        }
    }
    drop(bench);
    drop(server);
    let took = started.elapsed();

    if !failures.is_empty() {
        println!("\nfailed runs, tried again: {failures:?}");
    }
    let mut table = vec![
        "| leases | tool | requests / min (min - max) | per lease | by verb (medians) |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for ((n, tool), v) in &measured {
        let totals: Vec<f64> = v.iter().map(total).collect();
        let lo = totals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = totals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let m = plot::median(&totals);
        table.push(format!(
            "| {n} | {tool} | {m:.0} ({lo:.0} - {hi:.0}) | {:.1} | {} |",
            m / *n as f64,
            detail(&medians(v))
        ));
    }
    println!(
        "\nMarkdown ({runs} runs each, {:.0} s windows, {date}, took {:.1} min):\n\n{}",
        window.as_secs_f64(),
        took.as_secs_f64() / 60.0,
        table.join("\n")
    );

    std::fs::create_dir_all(&plots).unwrap();
    let mut raw = serde_json::Map::new();
    raw.insert("date".into(), json!(date));
    raw.insert("took_s".into(), json!(took.as_secs()));
    raw.insert("runs".into(), json!(runs));
    raw.insert("failed_runs".into(), json!(failures));
    raw.insert("window_s".into(), json!(window.as_secs_f64()));
    raw.insert(
        "timings".into(),
        json!({ "lease_ms": LD.as_millis() as u64, "renew_ms": RD.as_millis() as u64,
                "retry_ms": RP.as_millis() as u64, "grace_ms": GRACE.as_millis() as u64 }),
    );
    for ((n, tool), v) in &measured {
        raw.insert(format!("{tool}/{n}"), json!({ "per_minute": v }));
    }
    std::fs::write(
        plots.join("requests-per-lease.json"),
        serde_json::to_string_pretty(&Value::Object(raw)).unwrap() + "\n",
    )
    .unwrap();

    // Lines: each tool's total, and each of its verbs.
    let mut series = Vec::new();
    let mut tools = 0;
    for tool in ["baton", "client-go"] {
        let points = |f: &dyn Fn(&Counts) -> f64| -> Vec<(f64, Vec<f64>)> {
            measured
                .iter()
                .filter(|((_, t), _)| *t == tool)
                .map(|((n, _), v)| (*n as f64, v.iter().map(f).collect()))
                .collect()
        };
        if points(&total).is_empty() {
            continue;
        }
        tools += 1;
        series.push(plot::Series {
            name: format!("{tool}: all requests"),
            color: plot::color(tool),
            points: points(&total),
        });
        let verbs: BTreeSet<String> = measured
            .iter()
            .filter(|((_, t), _)| *t == tool)
            .flat_map(|(_, v)| v.iter().flat_map(|c| c.keys().cloned()))
            .collect();
        for verb in verbs {
            // The palette's other colours, blue and red being the tools'.
            let i = 2 + (series.len() - tools) % 6;
            series.push(plot::Series {
                name: format!("{tool}: {verb}"),
                color: plot::palette(i),
                points: points(&|c: &Counts| c.get(&verb).copied().unwrap_or(0.0)),
            });
        }
    }
    plot::sweep(
        &plots.join("requests-per-lease.svg"),
        &format!(
            "Two hosts idle: requests per minute to the API server against leases ({runs} runs; median, min to max)"
        ),
        "leases shared by the two hosts (log scale)",
        "requests / minute (log scale)",
        &series,
        true,
        true,
    )
    .unwrap();
    println!("\nwrote {}/requests-per-lease.{{json,svg}}", plots.display());
}
