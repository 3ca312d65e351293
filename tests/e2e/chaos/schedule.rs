//! The schedule of the chaos runs: the `sched-probe` guest runs `every =
//! "1s"` on whichever host leads, under every fault, and appends `DUE TERM
//! HOST` to a records file of its own for each run it completed while its
//! term still led. This checker reads those records, every host's log
//! (`scheduled run started`, `scheduled run ended`, `scheduled runs
//! skipped`, `scheduled run cut off by its term's end`) and the progress
//! left in the store (`baton kv get --bucket baton-schedules sched`).
//!
//! What must hold (docs/schedules.md, "The guarantees"):
//!
//! - a due time whose end was logged (`scheduled run ended` at `t`: the end
//!   was written) is never started again after `t`, by any host;
//! - a due time completed twice (two records), or completed and then
//!   skipped as `cut-off`, only in the one window: the completing run never
//!   logged its end (its host was killed, paused past its lease or cut off
//!   from the store between the record and writing the end);
//! - every due time from the first one handled to the final `handled` was
//!   completed or skipped, the skips being those the hosts logged (each
//!   covers `count` due times ending at `upto`; one logged as unconfirmed
//!   counts for the handled due times nothing else accounts for), none
//!   skipped twice, and their number equals the sum of `skipped` in the
//!   progress.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::*;

/// The schedule's period.
const PERIOD_MS: u64 = 1000;

/// The records' directory of a segment (granted to the guest as `/sched`).
pub fn records_dir(s: &Scratch) -> PathBuf {
    let dir = s.dir.path().join("sched");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `[[plugin]]` table of the scheduled probe under "demo", writing its
/// records in `dir`; the host's name comes from `SCHED_HOST`.
pub fn plugin(dir: &Path) -> String {
    format!(
        "\n[[plugin]]\nname = \"sched\"\npath = {:?}\nlease = \"demo\"\nevery = \"{PERIOD_MS}ms\"\n\
         inherit-env = [\"SCHED_HOST\"]\nenv = {{ SCHED_MODE = \"quick\", SCHED_RECORDS = \"/sched\" }}\n\
         dirs = [{{ host = {:?}, guest = \"/sched\" }}]\n",
        guest("sched_probe.wasm").display().to_string(),
        dir.display().to_string(),
    )
}

/// An RFC 3339 time of the host's log as Unix milliseconds.
fn ms_of(text: &str) -> u64 {
    let t = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// One scheduled run's event of a host process.
#[derive(Debug)]
struct Logged {
    host: String,
    /// Index of the process.
    process: usize,
    term: u64,
    due: u64,
    at: std::time::SystemTime,
}

fn logged(hosts: &[&Host], message: &str, on_demand_too: bool) -> Vec<(Logged, Event)> {
    let mut out = Vec::new();
    for (process, h) in hosts.iter().enumerate() {
        for e in h.all(|e| e.is(message, Some("sched"))) {
            if !on_demand_too && e.json.get("on_demand").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            let l = Logged {
                host: h.name.clone(),
                process,
                term: e.u64("term").unwrap(),
                due: ms_of(e.str("due").or(e.str("upto")).unwrap()),
                at: e.at,
            };
            out.push((l, e));
        }
    }
    out
}

/// The progress left in the store.
fn progress(config: &Path, env: &[(String, String)]) -> Value {
    let out = baton()
        .args(["kv", "get", "--config"])
        .arg(config)
        .args(["--bucket", "baton-schedules", "sched"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the schedule's progress: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A percentile of sorted values (nearest rank).
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Why the run of `due` in `term` on `host` left no end: from what the
/// host's processes logged of it.
fn why_no_end(hosts: &[&Host], host: &str, term: u64, due: u64) -> &'static str {
    let of_term = |e: &Event| e.str("plugin") == Some("sched") && e.u64("term") == Some(term);
    for h in hosts.iter().filter(|h| h.name == host) {
        if !h
            .all(|e| {
                of_term(e)
                    && e.message().starts_with("scheduled run cut off")
                    && e.str("due").map(ms_of) == Some(due)
            })
            .is_empty()
        {
            return "cut off by its term's end";
        }
        if !h
            .all(|e| of_term(e) && e.message().starts_with("cannot read or write"))
            .is_empty()
        {
            return "store failed, then the term ended";
        }
        if !h
            .all(|e| of_term(e) && e.message().starts_with("the schedule's progress is fenced"))
            .is_empty()
        {
            return "fenced by a newer term";
        }
    }
    "its process killed"
}

/// Checks the schedule's records, logs and progress; panics with the
/// reason on a broken rule, and prints the figures.
pub fn check(config: &Path, env: &[(String, String)], hosts: &[&Host], dir: &Path, seed: u64) {
    let p = progress(config, env);
    let handled = p["handled"].as_u64();
    let stored_skips: BTreeMap<String, u64> = p["skipped"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect())
        .unwrap_or_default();
    // The records: (due, term, host), in file order.
    let records: Vec<(u64, u64, String)> = std::fs::read_to_string(dir.join("records"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((
                w.first()?.parse().ok()?,
                w.get(1)?.parse().ok()?,
                (*w.get(2)?).to_owned(),
            ))
        })
        .collect();
    let started = logged(hosts, "scheduled run started", false);
    let ended = logged(hosts, "scheduled run ended", true);
    // Rule 1: an ended due time is never started again afterwards.
    for (end, _) in &ended {
        for (start, e) in &started {
            assert!(
                !(start.due == end.due && start.at > end.at),
                "seed {seed}: due {} ended in term {} on {} (process {}) at {:?}, started again after it: {}",
                end.due,
                end.term,
                end.host,
                end.process,
                end.at,
                e.json
            );
        }
        assert!(
            handled.is_some_and(|h| end.due <= h),
            "seed {seed}: due {} logged as ended (term {}, {}) but the progress handled only up to {handled:?}: {p}",
            end.due,
            end.term,
            end.host
        );
    }
    let ended_run = |due: u64, term: u64, host: &str| {
        ended
            .iter()
            .any(|(l, _)| l.due == due && l.term == term && l.host == host)
    };
    // Rule 2: completions, each due time once but in the window.
    let mut completed: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    for (due, term, host) in &records {
        completed.entry(*due).or_default().push((*term, host.clone()));
    }
    let mut doubles = Vec::new();
    for (due, runs) in &completed {
        for (term, host) in &runs[..runs.len() - 1] {
            assert!(
                !ended_run(*due, *term, host),
                "seed {seed}: due {due} completed {} times {runs:?}, though its run in term {term} on {host} logged its end",
                runs.len()
            );
            doubles.push(format!(
                "{due} in terms {:?}: {}",
                runs.iter().map(|r| r.0).collect::<Vec<_>>(),
                why_no_end(hosts, host, *term, *due)
            ));
        }
    }
    // Rule 3: the skips the hosts logged, each due time once.
    let mut skipped: BTreeMap<u64, String> = BTreeMap::new();
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    for h in hosts {
        for e in h.all(|e| e.is("scheduled runs skipped", Some("sched"))) {
            let (count, upto) = (e.u64("count").unwrap(), ms_of(e.str("upto").unwrap()));
            let reason = e.str("reason").unwrap().to_owned();
            *by_reason.entry(reason.clone()).or_default() += count;
            for k in 0..count {
                let due = upto - k * PERIOD_MS;
                let before = skipped.insert(due, reason.clone());
                assert!(
                    before.is_none(),
                    "seed {seed}: due {due} skipped twice ({before:?}, then {reason} by {}: {})",
                    h.name,
                    e.json
                );
            }
        }
    }
    // A skip logged as unconfirmed (its write unanswered as the term
    // ended) landed if its due times are handled and nothing else accounts
    // for them.
    for h in hosts {
        let unconfirmed = h.all(|e| {
            e.message().starts_with("scheduled runs skipped, unconfirmed") && e.str("plugin") == Some("sched")
        });
        for e in unconfirmed {
            let (count, upto) = (e.u64("count").unwrap(), ms_of(e.str("upto").unwrap()));
            let reason = e.str("reason").unwrap().to_owned();
            let landed: Vec<u64> = (0..count)
                .map(|k| upto - k * PERIOD_MS)
                .filter(|d| {
                    handled.is_some_and(|h| *d <= h) && !skipped.contains_key(d) && !completed.contains_key(d)
                })
                .collect();
            println!(
                "  unconfirmed skip by {}: {count} up to {upto} ({reason}), {} landed",
                h.name,
                landed.len()
            );
            for due in landed {
                skipped.insert(due, reason.clone());
                *by_reason.entry(reason.clone()).or_default() += 1;
            }
        }
    }
    let mut window_skips = Vec::new();
    for (due, reason) in &skipped {
        let Some(runs) = completed.get(due) else {
            continue;
        };
        let (term, host) = runs.last().unwrap();
        assert!(
            reason == "cut-off" && !ended_run(*due, *term, host),
            "seed {seed}: due {due} completed ({runs:?}) and skipped ({reason})"
        );
        window_skips.push(format!(
            "{due} completed in term {term}, then skipped: {}",
            why_no_end(hosts, host, *term, *due)
        ));
    }
    let accounted: BTreeSet<u64> = completed.keys().chain(skipped.keys()).copied().collect();
    let (Some(first), Some(last)) = (accounted.first().copied(), handled) else {
        panic!("seed {seed}: the schedule handled nothing: {p}; records {records:?}");
    };
    let mut late: Vec<f64> = started.iter().filter_map(|(_, e)| e.f64("late_ms")).collect();
    late.sort_by(f64::total_cmp);
    let reasons: Vec<String> = by_reason.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "  sched: {} runs started, {} due times completed over {} s, doubles {} (window), completed then skipped {} (window), skipped {} ({}), lateness p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        started.len(),
        completed.len(),
        (last - first) / 1000 + 1,
        doubles.len(),
        window_skips.len(),
        skipped.len(),
        if reasons.is_empty() {
            "none".to_owned()
        } else {
            reasons.join(", ")
        },
        pct(&late, 50.0),
        pct(&late, 99.0),
        late.last().copied().unwrap_or(f64::NAN),
    );
    for d in doubles.iter().chain(&window_skips) {
        println!("    window: {d}");
    }
    // Compared last, once the figures are out: every skip is logged.
    let unlogged: BTreeMap<&String, i128> = stored_skips
        .iter()
        .map(|(k, n)| {
            (
                k,
                i128::from(*n) - i128::from(by_reason.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n != 0)
        .collect();
    assert!(
        by_reason == stored_skips,
        "seed {seed}: the skips logged {by_reason:?} are not those of the progress {stored_skips:?} (not logged: {unlogged:?}): {p}"
    );
    let missing: Vec<u64> = (0..)
        .map(|k| first + k * PERIOD_MS)
        .take_while(|d| *d <= last)
        .filter(|d| !accounted.contains(d))
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: {} due times up to handled {last} neither completed nor skipped: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

#[cfg(test)]
mod tests {
    use super::{ms_of, pct};

    #[test]
    fn times_and_percentiles_are_read() {
        assert_eq!(ms_of("1970-01-01T00:00:01.500Z"), 1500);
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(pct(&v, 50.0), 2.0);
        assert_eq!(pct(&v, 99.0), 4.0);
    }
}
