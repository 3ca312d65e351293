//! Hand-over benchmark on the embedded store: two real `baton` processes
//! running a real guest; how long from stopping the leader until the other
//! host's guest runs.
//!
//! - graceful: SIGTERM the leader (drain, release, file-change notification);
//! - crash: SIGKILL the leader (the standby waits out the lease).
//!
//! And how a leader's tasks stop at a SIGTERM (the figures the end-to-end
//! tests print but do not judge): a guest that returns at the change (from
//! its term's end to its return, `after_ms`), and one that ignores it and
//! is stopped by force (from the force-stop time the host computed to the
//! stop, as logged).
//!
//! Timings are client-go's fast row from shared/anchors.md (lease 4 s,
//! renew deadline 3 s, retry period 500 ms; grace 500 ms), so the figures
//! compare with its 0.05 / 0.44 / 0.75 s graceful and 4.0 / 4.3 / 4.9 s crash
//! hand-overs measured on these machines.
//!
//! Run: `scripts/bench.sh` (builds the guests, then `cargo bench --bench
//! handover`). `BATON_BENCH_RUNS` sets the number of runs (default 8).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

#[path = "../tests/e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::time::Duration;

use support::*;

fn config_text(store: &std::path::Path) -> String {
    format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\n\
         retry-period = \"500ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"bench\"\n\
         [[plugin]]\nname = \"probe\"\npath = {:?}\nlease = \"bench\"\n",
        store.display().to_string(),
        guest("probe_pollable.wasm").display().to_string()
    )
}

/// One hand-over: start a leader and a standby, stop the leader with
/// `signal`, return milliseconds until the standby's guest printed its
/// first line.
fn handover(signal: i32) -> f64 {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config_text(&s.store()));
    let mut a = Host::start("leader", &cfg);
    a.wait_for(Duration::from_secs(30), "leader's guest", |e| {
        e.guest_line("probe", "probe start")
    });
    let b = Host::start("standby", &cfg);
    b.wait_for(Duration::from_secs(30), "standby following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    // Let the leader renew a few times, so a crash lands mid-lease.
    std::thread::sleep(Duration::from_millis(1250));
    let stopped = if signal == libc::SIGKILL {
        a.sigkill()
    } else {
        a.signal(signal)
    };
    let started = b.wait_for(Duration::from_secs(10), "standby's guest", |e| {
        e.guest_line("probe", "probe start")
    });
    ms_between(stopped, started.at)
}

/// One SIGTERM of a host leading a guest that returns at the change and
/// one that ignores it: the first's `after_ms`, and the forced stop's
/// lateness after its force-stop time, in ms.
fn stops() -> (f64, f64) {
    let s = Scratch::new();
    let probe = guest("probe_pollable.wasm").display().to_string();
    let text = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n[defaults]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\n\
         retry-period = \"500ms\"\ngrace = \"500ms\"\n[[lease]]\nname = \"bench\"\n\
         [[plugin]]\nname = \"returns\"\npath = {probe:?}\nlease = \"bench\"\nenv = {{ PROBE_MODE = \"cooperative\" }}\n\
         [[plugin]]\nname = \"ignores\"\npath = {probe:?}\nlease = \"bench\"\nenv = {{ PROBE_MODE = \"busy\" }}\n",
        s.store().display().to_string()
    );
    let cfg = s.write("baton.toml", &text);
    let mut h = Host::start("leader", &cfg);
    h.wait_for(Duration::from_secs(30), "both guests", |e| {
        e.guest_line("returns", "probe start")
    });
    std::thread::sleep(Duration::from_millis(500));
    h.sigterm();
    h.wait_exit(Duration::from_secs(10));
    let stop = |plugin: &str| {
        h.all(|e| e.is("leader task stopped", Some(plugin)))
            .pop()
            .unwrap_or_else(|| panic!("{plugin} did not stop: {}", tail(&h.output(), 20)))
    };
    let returned = stop("returns");
    let forced = stop("ignores");
    let force_stop_at = humantime::parse_rfc3339(forced.str("force_stop_at").unwrap()).unwrap();
    (
        returned.f64("after_ms").unwrap(),
        ms_between(force_stop_at, forced.at),
    )
}

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let median = if ms.len() % 2 == 1 {
        ms[ms.len() / 2]
    } else {
        (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0
    };
    println!(
        "{name:<9} runs {:>2}  min {:>8.1} ms  median {:>8.1} ms  max {:>8.1} ms",
        ms.len(),
        ms[0],
        median,
        ms[ms.len() - 1]
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass
    // nothing: run only as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runs: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8);
    println!("baton hand-over on the embedded store (lease 4s, renew 3s, retry 500ms, grace 500ms)");
    let graceful: Vec<f64> = (0..runs).map(|_| handover(libc::SIGTERM)).collect();
    summary("graceful", graceful.clone());
    let crash: Vec<f64> = (0..runs).map(|_| handover(libc::SIGKILL)).collect();
    summary("crash", crash.clone());
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "vs client-go 4s/3s/0.5s (medians 440 ms graceful, 4300 ms crash): graceful {:.0}x faster, crash {:.2}x",
        440.0 / median(graceful).max(0.001),
        4300.0 / median(crash)
    );
    let (returned, late): (Vec<f64>, Vec<f64>) = (0..runs).map(|_| stops()).unzip();
    println!(
        "a SIGTERM's stops: from the term's end to a guest's return at the change; from the force-stop time to a forced stop"
    );
    summary("returned", returned);
    summary("forced", late);
}
