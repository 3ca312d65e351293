//! A test plugin for schedules (`pollable-plugin` world of
//! `baton:leader@0.4.0`). On each run it first prints
//! `sched run due=UNIX_MS attempt=N on_demand=BOOL term=T` (the run
//! `current-run` gives), or `sched run none term=T` when it gives none,
//! then behaves per `SCHED_MODE`:
//!
//! - `quick` (also when unset): completes at once.
//! - `slow`: works for `SCHED_RUN_MS` milliseconds (default 2000), then
//!   completes; a status change ends the wait at once (the run is cut off).
//! - `stubborn`: sleeps for `SCHED_RUN_MS` milliseconds ignoring the change
//!   signal, then completes (if its term still lasts).
//! - `fail`: prints `sched fail term=T` and returns
//!   `Err("sched failure on purpose")`.
//! - `liar` (built to misbehave): as `slow`, but when the change cuts its
//!   work short it prints `sched liar due=UNIX_MS term=T` and returns `Ok`
//!   without the work done, so its host counts the run done.
//!
//! A run *completes* only if its term still lasts when its work is done:
//! it prints `sched done due=UNIX_MS term=T`, appends one line
//! `DUE_UNIX_MS TERM HOST` (`HOST`: `SCHED_HOST`; `DUE_UNIX_MS` is `none`
//! without a scheduled run) to `SCHED_RECORDS/records` when `SCHED_RECORDS`
//! names a directory granted to it, and returns `Ok`. A run whose term is
//! over by then prints `sched cut off due=UNIX_MS term=T role=R` and
//! returns `Err` without a record, as the contract asks of a run that
//! could not finish: its host counts it as cut off, and the next leader
//! runs the due time again. (A run whose end its host cannot write, its
//! process killed or paused past its lease between the record and that
//! write, leaves a record of a run the host did not count: the window.)
//!
//! Any other mode returns `Err("unknown SCHED_MODE: M")` after the first
//! line. Each line is flushed as soon as it is printed.

use std::io::Write;
use std::time::Duration;

use baton_guest::Status;
use baton_guest::pollable::{self, LeaderTask};
use baton_guest::schedule::{self, ScheduledRun};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `SCHED_RUN_MS`, default 2 s.
fn run_time() -> Duration {
    let ms = env("SCHED_RUN_MS").and_then(|v| v.parse().ok()).unwrap_or(2000);
    Duration::from_millis(ms)
}

/// The due time as the lines print it: Unix milliseconds, or `none`.
fn due_of(run: Option<&ScheduledRun>) -> String {
    run.map_or_else(|| "none".to_owned(), |r| r.due_unix_millis().to_string())
}

/// Appends `DUE TERM HOST` to `SCHED_RECORDS/records`, in one write.
fn record(due: &str, term: u64) -> Result<(), String> {
    let Some(dir) = env("SCHED_RECORDS") else {
        return Ok(());
    };
    let host = env("SCHED_HOST").unwrap_or_else(|| "-".to_owned());
    let path = std::path::Path::new(&dir).join("records");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.write_all(format!("{due} {term} {host}\n").as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let _ = file.sync_data();
    Ok(())
}

struct Probe;

impl LeaderTask for Probe {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        let run = schedule::current_run();
        match &run {
            Some(r) => say(format_args!(
                "sched run due={} attempt={} on_demand={} term={term}",
                r.due_unix_millis(),
                r.attempt,
                r.on_demand
            )),
            None => say(format_args!("sched run none term={term}")),
        }
        let due = due_of(run.as_ref());
        let change = pollable::watch(&status);
        let mode = env("SCHED_MODE").unwrap_or_else(|| "quick".to_owned());
        match mode.as_str() {
            "quick" => {}
            "slow" => {
                change.wait_timeout(run_time());
            }
            "liar" => {
                if change.wait_timeout(run_time()) {
                    say(format_args!("sched liar due={due} term={term}"));
                    return Ok(());
                }
            }
            "stubborn" => pollable::sleep(run_time()),
            "fail" => {
                say(format_args!("sched fail term={term}"));
                return Err("sched failure on purpose".to_owned());
            }
            other => return Err(format!("unknown SCHED_MODE: {other}")),
        }
        let (now, _) = pollable::current_status();
        if !now.is_leading_term(term) {
            say(format_args!(
                "sched cut off due={due} term={term} role={}",
                now.role
            ));
            return Err("cut off: the term ended before the work was done".to_owned());
        }
        record(&due, term)?;
        say(format_args!("sched done due={due} term={term}"));
        Ok(())
    }
}

baton_guest::export_pollable!(Probe);
