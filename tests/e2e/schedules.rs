//! Scheduled plugins with real hosts on the embedded store: each due time
//! run once across hand-overs, a run cut off by its term run again by the
//! next leader, the overlap policies, suspend and `baton run-now` over
//! reloads, and `baton status`. (Under chaos: `chaos/schedule.rs`.)

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A `[[plugin]]` of the sched-probe named `name`, with `extra` lines.
fn probe(name: &str, extra: &str) -> String {
    format!(
        "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\n{extra}\n",
        guest("sched_probe.wasm").display().to_string()
    )
}

fn config_with(s: &Scratch, tables: &str) -> std::path::PathBuf {
    let mut text = config(&s.store(), &[]);
    text.push_str(tables);
    s.write("baton.toml", &text)
}

/// The records the probes appended: (due ms, term, host), in file order.
fn records(dir: &Path) -> Vec<(u64, u64, String)> {
    std::fs::read_to_string(dir.join("records"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].parse().unwrap(), w[1].parse().unwrap(), w[2].to_owned())
        })
        .collect()
}

/// The plugin's progress, as `baton kv` reads it.
fn progress(cfg: &Path, plugin: &str) -> Value {
    let out = baton()
        .args(["kv", "get", "--config"])
        .arg(cfg)
        .args(["--bucket", "baton-schedules", plugin])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// The `due=` of a guest line.
fn due_of(e: &Event) -> u64 {
    e.message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("due="))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn each_due_time_runs_once_across_hand_overs() {
    let s = Scratch::new();
    let data = s.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let extra = format!(
        "every = \"500ms\"\ninherit-env = [\"SCHED_HOST\"]\nenv = {{ SCHED_RECORDS = \"/data\" }}\ndirs = [{{ host = {:?}, guest = \"/data\" }}]",
        data.display().to_string()
    );
    let cfg = config_with(&s, &probe("tick", &extra));
    let a = Host::start_opts(
        "a",
        &cfg,
        Opts {
            env: &[("SCHED_HOST", "a")],
            ..Opts::default()
        },
    );
    a.wait_for(SECS(30), "runs", |e| e.guest_line("tick", "sched done"));
    std::thread::sleep(SECS(2));
    let mut b = Host::start_opts(
        "b",
        &cfg,
        Opts {
            env: &[("SCHED_HOST", "b")],
            ..Opts::default()
        },
    );
    a.sigterm();
    b.wait_for(SECS(30), "b runs", |e| e.guest_line("tick", "sched done"));
    std::thread::sleep(SECS(2));
    b.sigterm();
    b.wait_exit(SECS(10));
    let all = records(&data);
    let mut seen = BTreeMap::new();
    for (due, term, host) in &all {
        assert!(
            seen.insert(*due, (*term, host.clone())).is_none(),
            "due {due} completed twice: {all:?}"
        );
    }
    assert!(
        all.iter().any(|r| r.2 == "a") && all.iter().any(|r| r.2 == "b"),
        "{all:?}"
    );
    let p = progress(&cfg, "tick");
    let skipped: u64 = p["skipped"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    let (first, last) = (*seen.keys().next().unwrap(), *seen.keys().last().unwrap());
    let dues = (last - first) / 500 + 1;
    assert_eq!(
        dues,
        seen.len() as u64 + skipped,
        "every due time from the first run to the last ran once or was skipped: {p}"
    );
    assert_eq!(p["handled"].as_u64(), Some(last));
}

#[test]
fn a_run_cut_off_by_its_term_runs_again_on_the_next_leader() {
    let s = Scratch::new();
    let extra = "every = \"1s\"\nstarting-deadline = \"30s\"\ninherit-env = [\"SCHED_MODE\"]\nenv = { SCHED_RUN_MS = \"60000\" }";
    let cfg = config_with(&s, &probe("job", extra));
    let mut a = Host::start_opts(
        "a",
        &cfg,
        Opts {
            env: &[("SCHED_MODE", "stubborn")],
            ..Opts::default()
        },
    );
    let first = a.wait_for(SECS(30), "a's run", |e| e.guest_line("job", "sched run"));
    let due = due_of(&first);
    a.sigterm();
    a.wait_for(SECS(10), "forced", |e| e.is("leader task stopped", Some("job")));
    a.wait_exit(SECS(10));
    let b = Host::start_opts(
        "b",
        &cfg,
        Opts {
            env: &[("SCHED_MODE", "quick")],
            ..Opts::default()
        },
    );
    let again = b.wait_for(SECS(30), "b's run", |e| e.guest_line("job", "sched run"));
    assert_eq!(due_of(&again), due, "{}", again.message());
    assert!(again.message().contains("attempt=1"), "{}", again.message());
    b.wait_for(SECS(10), "done", |e| {
        e.guest_line("job", &format!("sched done due={due}"))
    });
    let later = b.wait_for(SECS(10), "the next", |e| {
        e.guest_line("job", "sched run") && due_of(e) > due
    });
    assert!(later.message().contains("attempt=0"), "{}", later.message());
}

#[test]
fn overlapping_runs_are_skipped_queued_or_replaced() {
    let s = Scratch::new();
    let slow = "env = { SCHED_MODE = \"slow\", SCHED_RUN_MS = \"2500\" }\nevery = \"1s\"";
    let tables = [
        probe("skip", slow),
        probe("queue", &format!("{slow}\noverlap = \"queue-one\"")),
        probe("replace", &format!("{slow}\noverlap = \"replace\"")),
    ]
    .concat();
    let cfg = config_with(&s, &tables);
    let admin = ["--admin-address".as_ref(), "127.0.0.1:0".as_ref()];
    let h = Host::start_opts(
        "h",
        &cfg,
        Opts {
            args: &admin,
            ..Opts::default()
        },
    );
    std::thread::sleep(SECS(9));
    let dues = |p: &str| -> Vec<u64> {
        h.all(|e| e.guest_line(p, "sched run"))
            .iter()
            .map(due_of)
            .collect()
    };
    let gaps = |d: &[u64]| -> Vec<u64> { d.windows(2).map(|w| w[1] - w[0]).collect() };
    let skip = dues("skip");
    assert!(
        skip.len() >= 2 && gaps(&skip).iter().all(|g| *g == 3000),
        "skip: {skip:?}"
    );
    let queue = dues("queue");
    assert!(
        queue.len() >= 3 && gaps(&queue).iter().all(|g| *g == 2000 || *g == 3000),
        "queue-one: {queue:?}"
    );
    // The queued run starts late, when the one before it ends.
    let late = |p: &str| -> Vec<f64> {
        h.all(|e| e.message() == "scheduled run started" && e.str("plugin") == Some(p))
            .iter()
            .map(|e| e.f64("late_ms").unwrap())
            .collect()
    };
    assert!(
        late("queue").iter().any(|ms| *ms > 400.0),
        "queue-one: {:?}",
        late("queue")
    );
    assert!(
        late("skip").iter().all(|ms| *ms < 400.0),
        "skip: {:?}",
        late("skip")
    );
    let replace = dues("replace");
    assert!(
        replace.len() >= 6 && gaps(&replace).iter().all(|g| *g == 1000),
        "replace: {replace:?}"
    );
    assert!(h.all(|e| e.guest_line("replace", "sched done")).is_empty());
    let replaced = h.all(|e| {
        e.message() == "scheduled run replaced by the next due time" && e.str("plugin") == Some("replace")
    });
    assert!(replaced.len() >= 5);
    let p = progress(&cfg, "skip");
    assert!(p["skipped"]["overlap"].as_u64().unwrap() >= 2, "{p}");
    let p = progress(&cfg, "queue");
    assert!(p["skipped"]["superseded"].as_u64().unwrap() >= 1, "{p}");
    // The metrics agree with the logs.
    let text = h.scrape();
    let runs = metric_sum(
        &text,
        "baton_schedule_runs_total",
        &["plugin=\"skip\"", "outcome=\"ok\""],
    );
    let ended = h.all(|e| e.message() == "scheduled run ended" && e.str("plugin") == Some("skip"));
    assert_eq!(runs as usize, ended.len(), "{text}");
    let replaced = metric_sum(
        &text,
        "baton_schedule_runs_total",
        &["plugin=\"replace\"", "outcome=\"failed\""],
    );
    assert!(replaced >= 5.0, "{text}");
    let overlap = metric_sum(
        &text,
        "baton_schedule_skipped_total",
        &["plugin=\"skip\"", "reason=\"overlap\""],
    );
    assert!(overlap >= 2.0, "{text}");
    let late = metric_sum(
        &text,
        "baton_schedule_lateness_seconds_count",
        &["plugin=\"skip\""],
    );
    assert_eq!(late as usize, ended.len(), "{text}");
}

#[test]
fn jitter_spreads_the_starts_within_its_bound() {
    let s = Scratch::new();
    let cfg = config_with(&s, &probe("spread", "every = \"1s\"\njitter = \"400ms\""));
    let h = Host::start("h", &cfg);
    std::thread::sleep(SECS(7));
    let started = h.all(|e| e.message() == "scheduled run started");
    let jitter: Vec<f64> = started.iter().map(|e| e.f64("jitter_ms").unwrap()).collect();
    let late: Vec<f64> = started.iter().map(|e| e.f64("late_ms").unwrap()).collect();
    println!("jitter 400 ms: waited {jitter:?}, started {late:?} ms after the due times");
    assert!(jitter.len() >= 4, "{jitter:?}");
    assert!(
        jitter.iter().all(|ms| *ms < 400.0),
        "within the jitter: {jitter:?}"
    );
    assert!(
        jitter.iter().any(|ms| *ms > 20.0),
        "spread by the jitter: {jitter:?}"
    );
    // The start comes after its wait (the rest is the wake-up and the
    // fenced write of the start: its figures are benches/schedule_lateness).
    for (j, l) in jitter.iter().zip(&late) {
        assert!(l + 1.0 >= *j, "started {l} ms late after a wait of {j} ms");
    }
}

#[test]
fn suspend_and_run_now_work_over_reloads_and_status_shows_the_runs() {
    let s = Scratch::new();
    let cfg = config_with(
        &s,
        &probe(
            "nightly",
            "schedule = \"0 3 * * *\"\ntime-zone = \"Europe/Berlin\"",
        ),
    );
    let h = Host::start_opts(
        "h",
        &cfg,
        Opts {
            args: &["--watch".as_ref()],
            ..Opts::default()
        },
    );
    h.wait_for(SECS(30), "leading", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("leading")
    });
    let ask = || {
        baton()
            .args(["run-now", "nightly", "--config"])
            .arg(&cfg)
            .output()
            .unwrap()
    };
    let mut out = ask();
    for _ in 0..50 {
        if out.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        out = ask();
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = h.wait_for(SECS(10), "the run asked for", |e| {
        e.guest_line("nightly", "sched run")
    });
    assert!(run.message().contains("on_demand=true"), "{}", run.message());
    h.wait_for(SECS(10), "done", |e| e.guest_line("nightly", "sched done"));
    // Every second, suspended by a reload: nothing runs; resumed: it runs.
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "schedule = \"0 3 * * *\"\ntime-zone = \"Europe/Berlin\"",
        "every = \"1s\"\nsuspend = true",
    );
    std::fs::write(&cfg, &text).unwrap();
    h.wait_for(SECS(10), "reloaded", |e| e.message() == "schedule changed");
    std::thread::sleep(SECS(3));
    assert_eq!(
        h.all(|e| e.guest_line("nightly", "sched run")).len(),
        1,
        "suspended: no run"
    );
    std::fs::write(&cfg, text.replace("suspend = true", "suspend = false")).unwrap();
    h.wait_for(SECS(10), "resumed", |e| {
        e.guest_line("nightly", "sched run") && e.message().contains("on_demand=false")
    });
    h.wait_for(SECS(10), "done", |e| {
        e.guest_line("nightly", "sched done") && !e.message().contains("none")
    });
    let out = baton()
        .args(["status", "-o", "json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sched = &report["schedules"][0];
    assert_eq!(sched["plugin"], "nightly");
    assert_eq!(sched["schedule"], "every 1s");
    assert!(sched["runs"].as_array().unwrap().len() >= 2, "{sched}");
    assert!(
        sched["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["on_demand"] == true),
        "{sched}"
    );
    let text = baton().args(["status", "--config"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("plugin nightly (lease demo): every 1s; next due"),
        "{text}"
    );
}
