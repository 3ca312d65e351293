//! Scenarios and their verdicts. The default one is the contract's: lead;
//! run a while; lose the lead and expect the task to return by itself
//! within the grace; lead again in a newer term and expect a fresh
//! instance; run; lose again.

use std::time::Duration;

use super::{Event, Harness};
use crate::supervisor::TaskEnd;
use crate::support::rounding::human;

/// How long a term's first instance may take to start (compiling is done
/// before; a Python or JavaScript guest's start-up is in it).
const START_LIMIT: Duration = Duration::from_secs(30);

/// How long past the grace a stop may take to be reported.
const REPORT_SLACK: Duration = Duration::from_secs(2);

/// One step's verdict.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// The step, in words.
    pub step: String,
    /// Whether what was expected happened.
    pub passed: bool,
    /// What happened.
    pub detail: String,
}

impl Verdict {
    fn new(step: impl Into<String>, passed: bool, detail: impl Into<String>) -> Verdict {
        Verdict {
            step: step.into(),
            passed,
            detail: detail.into(),
        }
    }
}

/// Runs the default scenario, each term running for `run` before it is
/// lost.
pub async fn default_scenario(h: &mut Harness, run: Duration) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for _ in 0..2 {
        let seen = h.recorder.events().len();
        let term = h.lead();
        let started = expect_start(h, seen, term).await;
        let ok = started.passed;
        verdicts.push(started);
        if !ok {
            break;
        }
        verdicts.push(expect_running(h, seen, run).await);
        let seen = h.recorder.events().len();
        let returned = returned(h);
        h.lose();
        verdicts.push(expect_return(h, seen, returned).await);
    }
    verdicts
}

/// `lead`: the term's instance starts.
async fn expect_start(h: &Harness, seen: usize, term: u64) -> Verdict {
    let step = format!("lead in term {term}: a fresh instance starts");
    match h
        .recorder
        .wait_for(seen, START_LIMIT, |e| *e == Event::Started)
        .await
    {
        Some(_) => Verdict::new(step, true, "started"),
        None => {
            let ended = ended_since(h, seen);
            Verdict::new(
                step,
                false,
                format!("no instance started within {}{ended}", human(START_LIMIT)),
            )
        }
    }
}

/// `run`: the task keeps running (or is done: `ok`) while the term lasts.
async fn expect_running(h: &Harness, seen: usize, run: Duration) -> Verdict {
    let step = format!("run {} while leading: no error, no trap", human(run));
    let failed = |e: &Event| matches!(e, Event::Ended(TaskEnd::Failed | TaskEnd::Trapped));
    if let Some((_, e)) = h.recorder.wait_for(seen, run, failed).await {
        return Verdict::new(
            step,
            false,
            format!("the task {} while its term lasted", ending(&e)),
        );
    }
    let done = h.recorder.events()[seen..].contains(&Event::Ended(TaskEnd::Finished));
    let detail = if done {
        "returned `ok` (done for the term)"
    } else {
        "still running"
    };
    Verdict::new(step, true, detail)
}

/// Whether the last instance started has returned.
fn returned(h: &Harness) -> bool {
    let last = h.recorder.events().into_iter().rev().find_map(|e| match e {
        Event::Started => Some(false),
        Event::Ended(_) => Some(true),
        _ => None,
    });
    last == Some(true)
}

/// `lose`: the change fires; the task returns by itself within the grace
/// (unless it had `returned` before).
async fn expect_return(h: &Harness, seen: usize, returned: bool) -> Verdict {
    let grace = h.grace();
    let step = format!(
        "lose the lead: the task returns within the grace ({})",
        human(grace)
    );
    if returned {
        return Verdict::new(step, true, "it had already returned");
    }
    let stopped = |e: &Event| matches!(e, Event::Stopped { .. });
    match h.recorder.wait_for(seen, grace + REPORT_SLACK, stopped).await {
        Some((_, Event::Stopped { forced: false, after })) => Verdict::new(
            step,
            true,
            format!("returned by itself {} after the change", human(after)),
        ),
        Some((_, Event::Stopped { forced: true, after })) => Verdict::new(
            step,
            false,
            format!(
                "ignored the change: stopped by force {} after it (the grace is {}); \
                 a task must watch its change signal and return",
                human(after),
                human(grace)
            ),
        ),
        _ => Verdict::new(
            step,
            false,
            format!("not gone {} after the grace", human(REPORT_SLACK)),
        ),
    }
}

/// The runs that ended since `seen`, for a message.
fn ended_since(h: &Harness, seen: usize) -> String {
    let ends: Vec<String> = h.recorder.events()[seen..]
        .iter()
        .filter_map(|e| match e {
            Event::Ended(_) => Some(ending(e)),
            _ => None,
        })
        .collect();
    if ends.is_empty() {
        String::new()
    } else {
        format!(" ({})", ends.join(", "))
    }
}

/// How a run ended, in words.
fn ending(e: &Event) -> String {
    match e {
        Event::Ended(TaskEnd::Finished) => "returned `ok`".into(),
        Event::Ended(TaskEnd::Failed) => "returned an error".into(),
        Event::Ended(TaskEnd::Trapped) => "trapped".into(),
        Event::Ended(TaskEnd::Forced) => "was stopped by force".into(),
        Event::Ended(TaskEnd::NotStarted) => "did not start".into(),
        other => format!("{other:?}"),
    }
}
