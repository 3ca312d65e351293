//! The contract's own scenario, and the verdicts every scenario shares.
//!
//! For a plugin without a schedule: lead; run a while; lose the lead and
//! expect the task to return by itself within the grace; lead again in a
//! newer term (a fresh instance); run; pause past the lease, so the term
//! ends during the pause and the task is stopped at once on resuming;
//! lead again; run; lose. For a scheduled plugin, a simulated day (or its
//! first 48 due times, if fewer hours hold them) in three terms, handed
//! over twice, and each due time completed once.

use std::time::Duration;

use super::script::{Action, Expect, Script, Step};
use super::verdict::Verdict;
use super::{Event, Harness};
use crate::schedule::Schedule;
use crate::supervisor::TaskEnd;
use crate::support::rounding::human;

/// How long a term's first instance may take to start (compiling is done
/// before; a Python or JavaScript guest's start-up is in it).
const START_LIMIT: Duration = Duration::from_secs(30);

/// How long past the limit a stop may take to be reported.
const REPORT_SLACK: Duration = Duration::from_secs(5);

/// The most due times of the scheduled plugin's simulated day.
const DAY_RUNS: usize = 48;

/// The contract's scenario for the plugin `h` runs, each term running for
/// `run` (real time) before it is lost; for a scheduled plugin, `schedule`
/// gives the day's length.
pub fn default_script(h: &Harness, run: Duration, schedule: Option<&Schedule>) -> Script {
    let step = |action| Step {
        action,
        expect: Expect::default(),
    };
    let steps = match (schedule, h.virtual_time()) {
        (Some(schedule), Some(v)) => {
            let start = v.now();
            let mut end = start + Duration::from_secs(24 * 3600);
            let mut due = start;
            for _ in 0..DAY_RUNS {
                match schedule.when.next_after(due) {
                    Some(next) if next <= end => due = next,
                    _ => break,
                }
            }
            if due > start && due < end {
                end = due + Duration::from_millis(1);
            }
            let third = end.duration_since(start).unwrap_or_default() / 3;
            let mut steps = Vec::new();
            for _ in 0..3 {
                steps.extend([
                    step(Action::Lead),
                    step(Action::Advance(third)),
                    step(Action::Lose),
                ]);
            }
            steps
        }
        _ => {
            let past = h.lease_duration() + Duration::from_secs(1);
            let term = [step(Action::Lead), step(Action::Wait(run))];
            let mut steps = Vec::new();
            steps.extend(term.clone());
            steps.push(step(Action::Lose));
            steps.extend(term.clone());
            steps.push(step(Action::Pause(past)));
            steps.extend(term);
            steps.push(step(Action::Lose));
            steps
        }
    };
    Script {
        name: "the contract's scenario".into(),
        file: "(built in)".into(),
        start: None,
        config: Default::default(),
        http: Vec::new(),
        require_runs: schedule.is_some(),
        steps,
    }
}

/// `lead`: the term's instance starts.
pub(super) async fn expect_start(h: &Harness, seen: usize, term: u64, label: &str) -> Verdict {
    let step = format!("{label}: lead in term {term}: a fresh instance starts");
    match h
        .recorder
        .wait_for(seen, START_LIMIT, |e| *e == Event::Started)
        .await
    {
        Some(_) => Verdict::new(step, true, "started"),
        None => {
            let ends = endings(h, seen);
            let ended = if ends.is_empty() {
                String::new()
            } else {
                format!(" ({})", ends.join(", "))
            };
            Verdict::new(
                step,
                false,
                format!("no instance started within {}{ended}", human(START_LIMIT)),
            )
        }
    }
}

/// `wait`: the task keeps running (or is done: `ok`) for `run`.
pub(super) async fn expect_running(h: &Harness, seen: usize, run: Duration, step: &str) -> Verdict {
    let step = format!("{step} while leading: no error, no trap");
    let failed = |e: &Event| matches!(e, Event::Ended(TaskEnd::Failed | TaskEnd::Trapped));
    if let Some((_, e)) = h.recorder.wait_for(seen, run, failed).await {
        return Verdict::new(
            step,
            false,
            format!("the task {} while its term lasted", ending(&e)),
        );
    }
    let events = h.recorder.events();
    let detail = if h.term().is_none() {
        "not leading"
    } else if events[seen..].contains(&Event::Ended(TaskEnd::Finished)) {
        "returned `ok` (done for the term)"
    } else {
        "still running"
    };
    Verdict::new(step, true, detail)
}

/// Whether the last instance started has returned (or none started).
pub(super) fn returned(h: &Harness) -> bool {
    let last = h.recorder.events().into_iter().rev().find_map(|e| match e {
        Event::Started => Some(false),
        Event::Ended(_) => Some(true),
        _ => None,
    });
    last != Some(false)
}

/// `lose`: the change fires; the task returns by itself within `limit`
/// (unless it had `returned` before); a scheduled run it cut off returns
/// an error, not `ok`.
pub(super) async fn expect_return(
    h: &Harness,
    seen: usize,
    returned: bool,
    limit: Duration,
    label: &str,
) -> Verdict {
    let grace = h.grace();
    let step = if limit == grace {
        format!(
            "{label}: lose the lead: the task returns within the grace ({})",
            human(grace)
        )
    } else {
        format!("{label}: lose the lead: the task returns within {}", human(limit))
    };
    if returned {
        return Verdict::new(step, true, "no task was running");
    }
    let changed = h.ended.last().map(|(_, at)| *at);
    // A term's run reports its stop; a scheduled run, its end.
    let gone = |e: &Event| matches!(e, Event::Stopped { .. } | Event::Ended(_));
    let Some((index, event)) = h.recorder.wait_for(seen, grace + REPORT_SLACK, gone).await else {
        return Verdict::new(
            step,
            false,
            format!("not gone {} after the grace", human(REPORT_SLACK)),
        );
    };
    let forced = match event {
        Event::Stopped { forced, .. } => forced,
        Event::Ended(end) => end == TaskEnd::Forced,
        _ => false,
    };
    let after = match (h.recorder.time_of(index), changed) {
        (Some(at), Some(change)) => at.saturating_duration_since(change),
        _ => Duration::ZERO,
    };
    if forced {
        return Verdict::new(
            step,
            false,
            format!(
                "ignored the change: stopped by force {} after it (the grace is {}); \
                 a task must watch its change signal and return",
                human(after),
                human(grace)
            ),
        );
    }
    if let Some(due) = ok_after_change(h, seen).await {
        return Verdict::new(
            step,
            false,
            format!(
                "its run for {due} returned `ok` {} after the change cut it short: the host counts it done \
                 and no leader runs it again; a run the change cuts off must return an error",
                human(after)
            ),
        );
    }
    if after > limit {
        return Verdict::new(
            step,
            false,
            format!("returned by itself, but {} after the change", human(after)),
        );
    }
    Verdict::new(
        step,
        true,
        format!("returned by itself {} after the change", human(after)),
    )
}

/// The due time of a scheduled run that returned `ok` after the first
/// `seen` events (its end is recorded a moment after it returned).
async fn ok_after_change(h: &Harness, seen: usize) -> Option<String> {
    if !h.scheduled() {
        return None;
    }
    let ran_ok = |e: &Event| matches!(e, Event::Ran { outcome: "ok", .. });
    match h.recorder.wait_for(seen, Duration::from_secs(1), ran_ok).await {
        Some((_, Event::Ran { due, .. })) => Some(super::verdict::stamp(due)),
        _ => None,
    }
}

/// How a run ended, in words.
pub(super) fn ending(e: &Event) -> String {
    match e {
        Event::Ended(TaskEnd::Finished) => "returned `ok`".into(),
        Event::Ended(TaskEnd::Failed) => "returned an error".into(),
        Event::Ended(TaskEnd::Trapped) => "trapped".into(),
        Event::Ended(TaskEnd::Forced) => "was stopped by force".into(),
        Event::Ended(TaskEnd::NotStarted) => "did not start".into(),
        other => format!("{other:?}"),
    }
}

/// How the events since `seen` ended, in words (for details).
pub fn endings(h: &Harness, seen: usize) -> Vec<String> {
    h.recorder.events()[seen..]
        .iter()
        .filter(|e| matches!(e, Event::Ended(_)))
        .map(ending)
        .collect()
}
