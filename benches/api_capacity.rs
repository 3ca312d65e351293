//! The API server's capacity for lease renewals, and what baton does as it
//! nears it: two real `baton run` hosts (release or dev, as built) share N
//! leases (`BATON_BENCH_LEASES`, default 1000) with no plugins, at each
//! retry period of `BATON_BENCH_RETRY_MS` (default `4000,2000,1000,750`), so
//! the offered load is N / RP renewals a second (250 to 1,333 at the
//! defaults). The other timings scale with the retry period as client-go's
//! defaults do (lease 7.5 RP rounded up to a second, renew deadline 5 RP;
//! grace 1 RP; request timeout min(RP, RD / 2) = RP): RP 2 s is baton's
//! default set but for its grace (3 s).
//!
//! Each step starts an API server of its own (`scripts/kube-testenv.sh
//! start`: etcd and kube-apiserver on this machine) and fresh hosts, waits
//! until they lead every lease between them (or 180 s), lets them settle a
//! lease duration and measures a window of `BATON_BENCH_WINDOW_SECS`
//! (default 20 s):
//!
//! - the renewals the API server answered a second (`apiserver_request_total`,
//!   PUT on Leases) and any reads (GET, LIST) of Leases;
//! - the reads of term floors a second (GET on ConfigMaps): each holder
//!   checks its lease's floor once per lease duration;
//! - its PUT latency (`apiserver_request_duration_seconds`, p50 / p99 as
//!   bucket bounds: its buckets start at 50 ms);
//! - baton's renewal latency, both hosts' `baton_lease_renewal_seconds`
//!   summed (p50 / p99 as bucket bounds, 1 ms doubling);
//! - leads lost in the window (a lease that changed hands: a leader that
//!   missed its renew deadline), and the leases led at its end;
//! - CPU of each host, kube-apiserver and etcd (user + system, % of a core).
//!
//! Prints a line per step and a Markdown table; writes every step to
//! `api-capacity.json` and plots the latencies against the offered rate
//! (`api-capacity.svg`) into `BATON_BENCH_PLOTS` (default `docs/perf/`).
//! docs/performance-journal.md turns the figures into a fleet model.
//!
//! Run: `BATON_BENCH_PROFILE=release scripts/bench.sh --bench api_capacity`
//! (about 10 minutes on 2 cores; the Kubernetes test server must be
//! installed: `scripts/kube-testenv.sh install`).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../tests/kube/env.rs"]
#[allow(dead_code)]
mod env;

#[path = "plot.rs"]
#[allow(dead_code)]
mod plot;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::rbac::v1::Role;
use kube::Client;
use serde_json::{Value, json};

use env::{OwnServer, TestNamespace, leases_config};
use support::*;

/// Cumulative histogram counts per upper bound (seconds), summed over the
/// series that matched.
type Buckets = BTreeMap<u64, f64>;

/// The bucket bound in microseconds, so that it can key a map.
fn bound_us(le: &str) -> u64 {
    if le == "+Inf" {
        u64::MAX
    } else {
        (le.parse::<f64>().unwrap() * 1e6).round() as u64
    }
}

/// The buckets of histogram `name` over every series whose labels contain
/// all of `labels`.
fn buckets(text: &str, name: &str, labels: &[&str]) -> Buckets {
    let mut sum = Buckets::new();
    let prefix = format!("{name}_bucket{{");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((series, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if !labels.iter().all(|l| series.contains(l)) {
            continue;
        }
        let Some(le) = series
            .split(',')
            .find_map(|l| l.strip_prefix("le=\""))
            .map(|v| v.trim_end_matches('"'))
        else {
            continue;
        };
        *sum.entry(bound_us(le)).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    sum
}

fn minus(after: &Buckets, before: &Buckets) -> Buckets {
    after
        .iter()
        .map(|(le, n)| (*le, n - before.get(le).copied().unwrap_or(0.0)))
        .collect()
}

/// The bound of the first bucket holding quantile `q`, in ms (`INFINITY`
/// past the last bound); `NAN` if nothing was counted.
fn quantile(b: &Buckets, q: f64) -> f64 {
    let total = b.get(&u64::MAX).copied().unwrap_or(0.0);
    if total <= 0.0 {
        return f64::NAN;
    }
    b.iter()
        .find(|(_, n)| **n >= q * total)
        .map_or(f64::NAN, |(le, _)| {
            if *le == u64::MAX {
                f64::INFINITY
            } else {
                *le as f64 / 1e3
            }
        })
}

/// The API server's metrics, as text.
fn server_metrics(rt: &tokio::runtime::Runtime, admin: &Client) -> String {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    rt.block_on(admin.request_text(req)).unwrap()
}

/// How many leases changed hands on `h` so far: its "leading" events for
/// leases (its membership record left out).
fn leads_taken(h: &Host) -> usize {
    h.all(|e| {
        e.message() == "lease status changed"
            && e.str("role") == Some("leading")
            && !e.str("lease").unwrap_or("").starts_with("baton-member.")
    })
    .len()
}

/// One step's figures.
struct Step {
    retry_ms: u64,
    offered: f64,
    answered: f64,
    reads: f64,
    /// GETs of term floors (ConfigMaps) a second: the holders' checks.
    floor_reads: f64,
    server_p50: f64,
    server_p99: f64,
    renew_p50: f64,
    renew_p99: f64,
    renewals: f64,
    lost: usize,
    led: usize,
    cpu: BTreeMap<&'static str, f64>,
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.is_infinite() {
        "> max".into()
    } else {
        format!("{v}")
    }
}

/// One step: N leases at retry period `rp`, on a fresh API server.
fn step(leases: usize, rp: Duration, window: Duration, role: &Role) -> Step {
    let own = OwnServer::start("");
    let env = own.env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let admin = rt.block_on(env.admin());
    let ns = rt.block_on(TestNamespace::create(admin.clone(), "capacity"));
    for user in ["baton-a", "baton-b"] {
        let mut r = role.clone();
        r.metadata.name = Some(format!("baton-{user}"));
        rt.block_on(ns.bind(r, user));
    }
    // A Lease holds whole seconds: 7.5 RP rounded up.
    let ld = Duration::from_secs((rp * 15 / 2).as_millis().div_ceil(1000) as u64);
    let (rd, grace) = (rp * 5, rp);
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &leases_config(&ns.name, [ld, rd, rp, grace], leases),
    );
    let mut hosts: Vec<Host> = ["a", "b"]
        .iter()
        .map(|who| {
            let kc = env.kubeconfig(&format!("baton-{who}"));
            Host::start_with_args(
                who,
                &cfg,
                &shared_cache_dir(),
                &[
                    OsStr::new("--kubeconfig"),
                    kc.as_os_str(),
                    OsStr::new("--admin-address"),
                    OsStr::new("127.0.0.1:0"),
                ],
            )
        })
        .collect();
    let led = |hosts: &[Host]| led(&hosts[0]).len() + led(&hosts[1]).len();
    let started = Instant::now();
    let until = started + Duration::from_secs(180);
    while led(&hosts) < leases && Instant::now() < until {
        for h in &mut hosts {
            assert!(
                h.exited().is_none(),
                "host {} exited:\n{}",
                h.name,
                tail(&h.output(), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "api_capacity: RP {rp:?}: {} of {leases} leases led after {:.1} s",
        led(&hosts),
        started.elapsed().as_secs_f64()
    );
    std::thread::sleep(ld);

    let pids = [
        ("host a", hosts[0].pid()),
        ("host b", hosts[1].pid()),
        ("kube-apiserver", env.apiserver_pid),
        ("etcd", env.etcd_pid),
    ];
    let renewals = |hosts: &[Host]| -> Buckets {
        let mut sum = Buckets::new();
        for h in hosts {
            for (le, n) in buckets(&h.scrape(), "baton_lease_renewal_seconds", &[]) {
                *sum.entry(le).or_insert(0.0) += n;
            }
        }
        sum
    };
    let put = ["resource=\"leases\"", "verb=\"PUT\""];
    let taken_before: usize = hosts.iter().map(leads_taken).sum();
    let cpu_before: Vec<f64> = pids.iter().map(|(_, p)| cpu_secs(*p)).collect();
    let server_before = server_metrics(&rt, &admin);
    let renew_before = renewals(&hosts);
    let t0 = Instant::now();
    std::thread::sleep(window);
    let server_after = server_metrics(&rt, &admin);
    let renew_after = renewals(&hosts);
    let cpu_after: Vec<f64> = pids.iter().map(|(_, p)| cpu_secs(*p)).collect();
    let secs = t0.elapsed().as_secs_f64();
    let taken_after: usize = hosts.iter().map(leads_taken).sum();

    let requests = |text: &str| env::requests_in(text, "leases");
    let counts = env::delta(&requests(&server_before), &requests(&server_after));
    let floors = |text: &str| env::requests_in(text, "configmaps");
    let floor_counts = env::delta(&floors(&server_before), &floors(&server_after));
    let put_latency = minus(
        &buckets(&server_after, "apiserver_request_duration_seconds", &put),
        &buckets(&server_before, "apiserver_request_duration_seconds", &put),
    );
    let renew = minus(&renew_after, &renew_before);
    let cpu = pids
        .iter()
        .zip(cpu_before.iter().zip(&cpu_after))
        .map(|((name, _), (b, a))| (*name, (a - b) / secs * 100.0))
        .collect();
    let led_now = led(&hosts);
    for mut h in hosts {
        h.sigterm();
        let _ = h.wait_exit(Duration::from_secs(60));
    }
    drop(ns);
    drop(own);
    Step {
        retry_ms: rp.as_millis() as u64,
        offered: leases as f64 / rp.as_secs_f64(),
        answered: counts.get("PUT").copied().unwrap_or(0) as f64 / secs,
        reads: (counts.get("GET").copied().unwrap_or(0) + counts.get("LIST").copied().unwrap_or(0)) as f64,
        floor_reads: floor_counts.get("GET").copied().unwrap_or(0) as f64 / secs,
        server_p50: quantile(&put_latency, 0.5),
        server_p99: quantile(&put_latency, 0.99),
        renew_p50: quantile(&renew, 0.5),
        renew_p99: quantile(&renew, 0.99),
        renewals: renew.get(&u64::MAX).copied().unwrap_or(0.0) / secs,
        lost: taken_after - taken_before,
        led: led_now,
        cpu,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let started = Instant::now();
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let leases: usize = var("BATON_BENCH_LEASES", "1000")
        .parse()
        .expect("BATON_BENCH_LEASES");
    let window = Duration::from_secs(var("BATON_BENCH_WINDOW_SECS", "20").parse().expect("a number"));
    let retries: Vec<Duration> = var("BATON_BENCH_RETRY_MS", "4000,2000,1000,750")
        .split(',')
        .map(|ms| {
            Duration::from_millis(
                ms.trim()
                    .parse()
                    .expect("BATON_BENCH_RETRY_MS: ms, comma-separated"),
            )
        })
        .collect();
    let plots = std::env::var_os("BATON_BENCH_PLOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf")));
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/role.yaml");
    let role: Role = serde_saphyr::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let profile = if cfg!(debug_assertions) { "dev" } else { "release" };
    println!(
        "api_capacity: two hosts, {leases} leases, retry periods {retries:?}, {window:?} windows, \
         {profile} build, kube-apiserver 1.20.2 and etcd on this machine, {date}"
    );
    let mut steps = Vec::new();
    for rp in retries {
        let s = step(leases, rp, window, &role);
        let cpu: Vec<String> = s.cpu.iter().map(|(k, v)| format!("{k} {v:.1} %")).collect();
        println!(
            "RP {:>5} ms: offered {:>6.0}/s, answered {:>6.0}/s, reads {}, floor reads {:.1}/s, server PUT p50 {} p99 {} ms, \
             baton renewal p50 {} p99 {} ms ({:.0}/s), leads lost {}, led {}/{leases}; CPU {}",
            s.retry_ms,
            s.offered,
            s.answered,
            s.reads,
            s.floor_reads,
            ms(s.server_p50),
            ms(s.server_p99),
            ms(s.renew_p50),
            ms(s.renew_p99),
            s.renewals,
            s.lost,
            s.led,
            cpu.join(", ")
        );
        steps.push(s);
    }
    let took = started.elapsed();

    let mut table = vec![
        "| retry period | offered / s | answered / s | server PUT p50 / p99 (ms) | baton renewal p50 / p99 (ms) | request timeout | leads lost | CPU: host a, host b, apiserver, etcd (% of a core) |".to_owned(),
        "|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    for s in &steps {
        table.push(format!(
            "| {} ms | {:.0} | {:.0} | ≤ {} / ≤ {} | ≤ {} / ≤ {} | {} ms | {} | {:.1}, {:.1}, {:.1}, {:.1} |",
            s.retry_ms,
            s.offered,
            s.answered,
            ms(s.server_p50),
            ms(s.server_p99),
            ms(s.renew_p50),
            ms(s.renew_p99),
            s.retry_ms,
            s.lost,
            s.cpu["host a"],
            s.cpu["host b"],
            s.cpu["kube-apiserver"],
            s.cpu["etcd"],
        ));
    }
    println!(
        "\nMarkdown ({leases} leases, {:.0} s windows, {profile}, {date}, took {:.1} min):\n\n{}",
        window.as_secs_f64(),
        took.as_secs_f64() / 60.0,
        table.join("\n")
    );

    std::fs::create_dir_all(&plots).unwrap();
    let finite = |v: f64| if v.is_finite() { json!(v) } else { Value::Null };
    let raw: Vec<Value> = steps
        .iter()
        .map(|s| {
            json!({
                "retry_ms": s.retry_ms, "offered_per_s": s.offered, "answered_per_s": s.answered,
                "lease_reads": s.reads, "floor_reads_per_s": s.floor_reads,
                "server_put_p50_ms": finite(s.server_p50), "server_put_p99_ms": finite(s.server_p99),
                "renewal_p50_ms": finite(s.renew_p50), "renewal_p99_ms": finite(s.renew_p99),
                "renewals_per_s": s.renewals, "leads_lost": s.lost, "led": s.led, "cpu_percent": s.cpu,
            })
        })
        .collect();
    std::fs::write(
        plots.join("api-capacity.json"),
        serde_json::to_string_pretty(&json!({
            "date": date, "leases": leases, "window_s": window.as_secs_f64(), "profile": profile,
            "took_s": took.as_secs(), "steps": raw,
        }))
        .unwrap()
            + "\n",
    )
    .unwrap();
    let line = |name: &str, color, f: &dyn Fn(&Step) -> f64| plot::Series {
        name: name.to_owned(),
        color,
        points: steps
            .iter()
            .map(|s| (s.offered, vec![f(s)]))
            .filter(|(_, v)| v[0].is_finite())
            .collect(),
    };
    plot::sweep(
        &plots.join("api-capacity.svg"),
        &format!("{leases} leases on two hosts: renewal latency against the offered renewals a second"),
        "renewals offered a second (N / retry period, log scale)",
        "ms (bucket bound, log scale)",
        &[
            line("baton's renewal p99", plot::color("baton"), &|s| s.renew_p99),
            line("baton's renewal p50", plot::palette(2), &|s| s.renew_p50),
            line("API server PUT p99", plot::palette(3), &|s| s.server_p99),
            line("request timeout (= retry period)", plot::palette(4), &|s| {
                s.retry_ms as f64
            }),
        ],
        true,
        true,
    )
    .unwrap();
    println!("\nwrote {}/api-capacity.{{json,svg}}", plots.display());
}
