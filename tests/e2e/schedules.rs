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

/// The `due=` of a host event (`scheduled run started`, `... ended`, ...),
/// in ms since the epoch.
fn due_ms(e: &Event, key: &str) -> u64 {
    let at = humantime::parse_rfc3339(e.str(key).expect(key)).unwrap();
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// `ms` since the epoch as a time.
fn at_ms(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(ms)
}

/// The host's events about `plugin`'s schedule.
struct Sched {
    /// Due times of the runs started, in order.
    started: Vec<u64>,
    /// Due times of the runs ended, with the event.
    ended: Vec<(u64, Event)>,
    /// Skips logged: (reason, first due, last due, count).
    skips: Vec<(String, u64, u64, u64)>,
    /// Runs replaced by the next due time.
    replaced: Vec<Event>,
}

impl Sched {
    fn of(h: &Host, plugin: &str) -> Sched {
        let mine = |e: &Event| e.str("plugin") == Some(plugin);
        let started = h
            .all(|e| mine(e) && e.message() == "scheduled run started")
            .iter()
            .map(|e| due_ms(e, "due"))
            .collect();
        let ended = h
            .all(|e| mine(e) && e.message() == "scheduled run ended")
            .into_iter()
            .map(|e| (due_ms(&e, "due"), e))
            .collect();
        let skips = h
            .all(|e| mine(e) && e.message().starts_with("scheduled runs skipped"))
            .iter()
            .map(|e| {
                let (upto, count) = (due_ms(e, "upto"), e.u64("count").unwrap());
                let reason = e.str("reason").unwrap().to_owned();
                (reason, upto - (count - 1) * 1000, upto, count)
            })
            .collect();
        let replaced = h.all(|e| mine(e) && e.message() == "scheduled run replaced by the next due time");
        Sched {
            started,
            ended,
            skips,
            replaced,
        }
    }

    fn skipped(&self, reason: &str) -> u64 {
        self.skips.iter().filter(|s| s.0 == reason).map(|s| s.3).sum()
    }

    /// Every due time (every second) from the first handled to the last
    /// was handled once: run to its end, or skipped for a reason.
    fn assert_each_due_handled_once(&self, plugin: &str) -> u64 {
        let mut handled: Vec<u64> = self.ended.iter().map(|(d, _)| *d).collect();
        for (_, first, upto, _) in &self.skips {
            handled.extend((*first..=*upto).step_by(1000));
        }
        handled.sort_unstable();
        let gaps: Vec<u64> = handled.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g == 1000),
            "{plugin}: every due time handled once, run or skipped: handled {handled:?}, skips {:?}",
            self.skips
        );
        *handled.last().expect("handled")
    }
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
    let mut h = Host::start_opts(
        "h",
        &cfg,
        Opts {
            args: &admin,
            ..Opts::default()
        },
    );
    // Enough runs of each, however long they take on this machine: two
    // runs of `skip` ended, a queued run of `queue` (one whose due time
    // came before the run before it ended), six runs of `replace`.
    let queued = |q: &Sched| {
        q.ended
            .iter()
            .any(|(d, ended)| q.started.iter().any(|s| s > d && ended.at > at_ms(*s)))
    };
    let deadline = std::time::Instant::now() + SECS(90);
    loop {
        let (skip, queue, replace) = (
            Sched::of(&h, "skip"),
            Sched::of(&h, "queue"),
            Sched::of(&h, "replace"),
        );
        if skip.ended.len() >= 2 && queue.started.len() >= 3 && queued(&queue) && replace.started.len() >= 6 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not enough runs: skip {:?}, queue {:?}, replace {:?}; log:\n{}",
            skip.started,
            queue.started,
            replace.started,
            h.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The metrics agree with the logs (a run is logged, then counted: read
    // both until they are at rest).
    let agree = || {
        let text = h.scrape();
        let (skip, replace) = (Sched::of(&h, "skip"), Sched::of(&h, "replace"));
        let series = |name: &str, labels: &[&str]| metric_sum(&text, name, labels) as usize;
        let got = [
            series(
                "baton_schedule_runs_total",
                &["plugin=\"skip\"", "outcome=\"ok\""],
            ),
            series("baton_schedule_lateness_seconds_count", &["plugin=\"skip\""]),
            series(
                "baton_schedule_skipped_total",
                &["plugin=\"skip\"", "reason=\"overlap\""],
            ),
            series(
                "baton_schedule_runs_total",
                &["plugin=\"replace\"", "outcome=\"failed\""],
            ),
        ];
        let logged = [
            skip.ended.len(),
            skip.ended.len(),
            skip.skipped("overlap") as usize,
            replace.replaced.len(),
        ];
        (got == logged).then_some(()).ok_or((got, logged, text))
    };
    let mut tries = 0;
    while let Err((got, logged, text)) = agree() {
        tries += 1;
        assert!(tries < 50, "metrics {got:?}, logs {logged:?}: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    h.sigterm();
    h.wait_exit(SECS(30));

    // skip: a run's due times that came while it ran (a 2.5 s run: at least
    // two) are skipped as overlapping; the next run is a later due time.
    let skip = Sched::of(&h, "skip");
    let handled = skip.assert_each_due_handled_once("skip");
    for (due, _) in &skip.ended {
        assert!(
            skip.skips
                .iter()
                .any(|(r, first, upto, _)| r == "overlap" && *first == due + 1000 && *upto >= due + 2000),
            "skip: the due times while the run of {due} ran were not skipped: {:?}",
            skip.skips
        );
    }
    let gaps = |d: &[u64]| -> Vec<u64> { d.windows(2).map(|w| w[1] - w[0]).collect() };
    assert!(
        gaps(&skip.started).iter().all(|g| *g >= 3000 && g % 1000 == 0),
        "skip: {:?}",
        skip.started
    );
    let p = progress(&cfg, "skip");
    assert_eq!(p["handled"].as_u64(), Some(handled), "{p}");
    assert_eq!(
        p["skipped"]["overlap"].as_u64(),
        Some(skip.skipped("overlap")),
        "{p}"
    );
    assert!(skip.skipped("overlap") >= 2, "{:?}", skip.skips);

    // queue-one: the latest due time that came while a run ran is run
    // after it (late), the ones before it superseded; none is skipped as
    // overlapping.
    let queue = Sched::of(&h, "queue");
    let handled = queue.assert_each_due_handled_once("queue");
    assert!(queued(&queue), "queue-one: nothing queued: {:?}", queue.started);
    assert_eq!(queue.skipped("overlap"), 0, "{:?}", queue.skips);
    assert!(queue.skipped("superseded") >= 1, "{:?}", queue.skips);
    let p = progress(&cfg, "queue");
    assert_eq!(p["handled"].as_u64(), Some(handled), "{p}");
    assert_eq!(
        p["skipped"]["superseded"].as_u64(),
        Some(queue.skipped("superseded")),
        "{p}"
    );

    // replace: every run that ended was replaced when the next due time
    // came (never sooner), none completed.
    let replace = Sched::of(&h, "replace");
    let handled = replace.assert_each_due_handled_once("replace");
    assert!(h.all(|e| e.guest_line("replace", "sched done")).is_empty());
    assert!(replace.replaced.len() >= 5, "{:?}", replace.started);
    assert_eq!(
        replace.replaced.len(),
        replace.ended.len(),
        "replace: {:?}",
        replace.started
    );
    for ((due, ended), r) in replace.ended.iter().zip(&replace.replaced) {
        let outcome = ended.str("outcome").unwrap_or("");
        assert!(outcome.contains("replaced"), "{:?}", ended.json);
        // (5 ms: the clock's granularity.)
        assert!(
            r.at + Duration::from_millis(5) >= at_ms(due + 1000) && r.at <= ended.at,
            "replace: the run of {due} was replaced before the next due time: {:?}",
            r.json
        );
    }
    assert_eq!(replace.skipped("overlap"), 0, "{:?}", replace.skips);
    let p = progress(&cfg, "replace");
    assert_eq!(p["handled"].as_u64(), Some(handled), "{p}");

    // The figures (benches/schedule_lateness): how late each run started.
    for plugin in ["skip", "queue", "replace"] {
        let late: Vec<f64> = h
            .all(|e| e.message() == "scheduled run started" && e.str("plugin") == Some(plugin))
            .iter()
            .map(|e| e.f64("late_ms").unwrap())
            .collect();
        println!(
            "{plugin}: dues {:?}, started {late:?} ms late",
            Sched::of(&h, plugin).started
        );
    }
}

#[test]
fn jitter_spreads_the_starts_within_its_bound() {
    let s = Scratch::new();
    let cfg = config_with(&s, &probe("spread", "every = \"1s\"\njitter = \"400ms\""));
    let h = Host::start("h", &cfg);
    // Four starts, however long they take here.
    let started = |h: &Host| h.all(|e| e.message() == "scheduled run started");
    let deadline = std::time::Instant::now() + SECS(60);
    while started(&h).len() < 4 {
        assert!(std::time::Instant::now() < deadline, "not 4 runs: {}", h.output());
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = started(&h);
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
