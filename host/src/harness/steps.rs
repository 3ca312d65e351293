//! Runs a scenario's steps on a [`Harness`]: each action, the verdict on
//! what it must bring about (a lead starts a fresh instance; a loss sees
//! the task return within the grace), then the step's expectations
//! ([`expect`](super::expect)).

use std::time::{Duration, SystemTime};

use super::expect::{Marks, each_due_once, expectations};
use super::record::Subject;
use super::scenario::{expect_return, expect_running, expect_start, returned};
use super::script::{Action, Script, Step};
use super::verdict::{Verdict, spoken, stamp};
use super::{Event, Harness};
use crate::runtime::CheckOutcome;
use crate::store::buckets::{Limits, Op, Write};
use crate::support::rounding::human;

/// How long, in real time, a schedule may take to get back to waiting
/// after a due time (its run included) before an advance goes on without
/// it.
pub const SETTLE: Duration = Duration::from_secs(30);

/// Runs `script`'s steps; a verdict per step and per expectation, and at
/// the end, for a scheduled plugin, one on its due times.
pub async fn run_script(h: &mut Harness, s: &Subject, script: &Script) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for (i, step) in script.steps.iter().enumerate() {
        let label = format!("step {}", i + 1);
        verdicts.extend(run_step(h, s, step, &label).await);
    }
    match each_due_once(h) {
        Some(v) => verdicts.push(v),
        None if script.require_runs => verdicts.push(Verdict::new(
            "each due time completed once",
            false,
            "no scheduled run ended",
        )),
        None => {}
    }
    verdicts
}

/// One step: its action's verdict, then its expectations'.
pub async fn run_step(h: &mut Harness, s: &Subject, step: &Step, label: &str) -> Vec<Verdict> {
    let marks = Marks::now(h);
    let mut verdicts = vec![act(h, s, step, label).await];
    verdicts.extend(expectations(h, s, &step.expect, &marks, label).await);
    verdicts
}

async fn act(h: &mut Harness, s: &Subject, step: &Step, label: &str) -> Verdict {
    let seen = h.recorder.events().len();
    match &step.action {
        Action::Lead => lead(h, seen, label).await,
        Action::Lose => {
            let was_done = returned(h);
            h.lose();
            let limit = step.expect.returns_within.unwrap_or(h.grace());
            expect_return(h, seen, was_done, limit, label).await
        }
        Action::Pause(span) => pause(h, seen, *span, label).await,
        Action::Crash => crash(h, seen, label).await,
        Action::Advance(by) => advance(h, None, *by, label).await,
        Action::AdvanceTo(to) => advance(h, Some(*to), Duration::ZERO, label).await,
        Action::Wait(span) => {
            expect_running(h, seen, *span, &format!("{label}: wait {}", spoken(*span))).await
        }
        Action::RunNow => run_now(h, seen, label).await,
        Action::KvPut { bucket, key, value } => kv_put(h, s, bucket.as_deref(), key, value, label).await,
        Action::Health(healthy) => health(h, *healthy, label).await,
    }
}

async fn lead(h: &mut Harness, seen: usize, label: &str) -> Verdict {
    if let Some(term) = h.term() {
        return Verdict::new(
            format!("{label}: lead"),
            false,
            format!("this host leads already, in term {term}: lose it first"),
        );
    }
    let term = h.lead();
    if h.scheduled() {
        return Verdict::new(
            format!("{label}: lead in term {term}"),
            true,
            "leading: its runs start at their due times",
        );
    }
    expect_start(h, seen, term, label).await
}

/// Waits for the task's end after a stop at once; says how it went.
async fn stopped_at_once(h: &Harness, seen: usize, was_done: bool) -> (bool, String) {
    if was_done {
        return (true, "no task was running".into());
    }
    let gone = |e: &Event| matches!(e, Event::Stopped { .. });
    match h.recorder.wait_for(seen, Duration::from_secs(5), gone).await {
        Some(_) => (true, "its task was stopped at once".into()),
        None => (
            false,
            "its task was not gone 5 s after its force-stop time".into(),
        ),
    }
}

async fn pause(h: &mut Harness, seen: usize, span: Duration, label: &str) -> Verdict {
    let lease = h.lease_duration();
    if span < lease {
        jump(h, span);
        return Verdict::new(
            format!("{label}: pause {}", spoken(span)),
            true,
            format!("within the lease ({}): the term goes on", spoken(lease)),
        );
    }
    let step = format!(
        "{label}: pause {} past the lease ({}): the term ends during the pause",
        spoken(span),
        spoken(lease)
    );
    match stop_and_jump(h, seen, span).await {
        None => Verdict::new(step, true, "not leading: nothing to stop"),
        Some((term, ok, detail)) => Verdict::new(step, ok, format!("term {term} over; {detail} on resuming")),
    }
}

async fn crash(h: &mut Harness, seen: usize, label: &str) -> Verdict {
    let lease = h.lease_duration();
    let step = format!(
        "{label}: crash: the task is gone at once; the lease expires after {}",
        spoken(lease)
    );
    match stop_and_jump(h, seen, lease).await {
        None => Verdict::new(step, true, "not leading: nothing to stop"),
        Some((_, ok, detail)) => Verdict::new(step, ok, detail),
    }
}

/// The host stops at once (its term ends without grace) and virtual time
/// moves on by `span`: the term, whether its task was gone at once, and
/// how; `None` if it led none.
async fn stop_and_jump(h: &mut Harness, seen: usize, span: Duration) -> Option<(u64, bool, String)> {
    let stopped = match h.term() {
        None => None,
        Some(term) => {
            let was_done = returned(h);
            h.stop_at_once();
            let (ok, detail) = stopped_at_once(h, seen, was_done).await;
            Some((term, ok, detail))
        }
    };
    jump(h, span);
    stopped
}

/// Moves virtual time on by `span` (nothing on the real clock).
fn jump(h: &Harness, span: Duration) {
    if let Some(v) = h.virtual_time() {
        v.jump_to(v.now() + span);
    }
}

async fn advance(h: &mut Harness, to: Option<SystemTime>, by: Duration, label: &str) -> Verdict {
    let Some(v) = h.virtual_time().cloned() else {
        return Verdict::new(
            format!("{label}: advance"),
            false,
            "time is real (--real-time): advance needs virtual time",
        );
    };
    let target = to.unwrap_or_else(|| v.now() + by);
    let step = match to {
        Some(t) => format!("{label}: advance to {}", stamp(t)),
        None => format!(
            "{label}: advance {} to {}",
            spoken(by),
            stamp(whole_seconds(target))
        ),
    };
    let watching = h.scheduled() && h.term().is_some();
    let (ended, settled) = v.advance_to(target, watching, SETTLE).await;
    if !settled {
        let ends = h.recorder.events().len();
        return Verdict::new(
            step,
            false,
            format!(
                "the schedule did not get back to waiting within {} of a due time (a run that does not return?); {ends} events so far",
                human(SETTLE)
            ),
        );
    }
    let detail = if watching {
        format!("{ended} due times on the way")
    } else {
        "nothing runs: not leading".to_owned()
    };
    Verdict::new(step, true, detail)
}

/// `at` without its part of a second (time flows while a scenario runs:
/// an `advance` from now ends a few milliseconds past the second).
fn whole_seconds(at: SystemTime) -> SystemTime {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs())
}

async fn run_now(h: &mut Harness, seen: usize, label: &str) -> Verdict {
    let step = format!("{label}: run-now: a run starts at once");
    if !h.scheduled() {
        return Verdict::new(step, false, "the plugin has no schedule");
    }
    if h.term().is_none() {
        return Verdict::new(step, false, "not leading: a run-now waits for the next term");
    }
    h.run_now();
    let started = |e: &Event| *e == Event::Started;
    match h.recorder.wait_for(seen, SETTLE, started).await {
        Some(_) => Verdict::new(step, true, "started"),
        None => Verdict::new(step, false, format!("no run started within {}", human(SETTLE))),
    }
}

async fn kv_put(
    h: &Harness,
    s: &Subject,
    bucket: Option<&str>,
    key: &str,
    value: &str,
    label: &str,
) -> Verdict {
    let step = format!("{label}: kv-put {key}");
    let name = match s.bucket(h, bucket) {
        Ok(n) => n,
        Err(e) => return Verdict::new(step, false, e),
    };
    let write = Write::new(
        h.newest(),
        vec![Op::Set {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
        }],
        Limits::default(),
    );
    match s.store.apply(&name, write).await {
        Ok(_) => Verdict::new(step, true, format!("{} {key} = {value:?}", name.bucket)),
        Err(e) => Verdict::new(step, false, format!("the write was refused: {e}")),
    }
}

async fn health(h: &Harness, healthy: bool, label: &str) -> Verdict {
    let said = if healthy { "ok" } else { "fail" };
    let step = format!("{label}: health: the check says {said}");
    let Some(term) = h.leading().cloned() else {
        return Verdict::new(step, false, "the check runs while this host leads: lead first");
    };
    let timeout = h
        .plugin()
        .health_check()
        .map_or(Duration::from_secs(2), |c| c.timeout);
    let Some(mut checker) = h.plugin().health_checker(term, h.view()) else {
        return Verdict::new(step, false, "the plugin exports no health check");
    };
    let outcome = checker.check(timeout).await;
    let detail = match &outcome {
        CheckOutcome::Healthy => "it said ok".to_owned(),
        CheckOutcome::Unhealthy(m) => format!("it said unhealthy: {m}"),
        CheckOutcome::Trapped(t) => format!("it trapped: {t}"),
        CheckOutcome::TimedOut(d) => format!(
            "it did not answer within its timeout ({}): a check must return",
            human(*d)
        ),
    };
    let was_healthy = matches!(outcome, CheckOutcome::Healthy);
    let fair = matches!(outcome, CheckOutcome::Healthy | CheckOutcome::Unhealthy(_));
    Verdict::new(step, fair && was_healthy == healthy, detail)
}
