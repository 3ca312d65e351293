//! A scheduled plugin's term: each due time run once, in a fresh instance,
//! its progress kept in the lease's fenced bucket of schedules.
//!
//! At the term's start the bucket is claimed for the term; from then on no
//! older term writes it. Then, until the term is over: read the progress,
//! ask [`schedule::next`](crate::schedule::next) what to do, and do it: a
//! skip is recorded; a run is recorded as started, run, and recorded as
//! ended with its outcome; or wait for the next due time, a `baton run-now`
//! or a new schedule (a reload). A run that returned ok counts as ended
//! (within the grace after its term too); one that failed after its term
//! ended, or was stopped by force, is cut off: it stays recorded as
//! started, so the next leader runs it again within its deadline.
//! `scheduled run ended` is logged once its end is written, and a skip
//! once the write that carries it is known to have landed: a write the
//! store did not answer is settled by the next read (the progress read back
//! is the one written, or not), and one still *unsettled* when the term ends
//! is logged as `scheduled runs skipped, unconfirmed`. Every write carries
//! the term: a write refused by the fence ends the term's work here.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::{mpsc, watch};

use super::time::HostTime;
use super::{TaskObserver, run_attempt};
use crate::election::{LeaseView, Term};
use crate::runtime::{Plugin, TaskOutcome};
use crate::schedule::ScheduledRun;
use crate::schedule::{Next, Overlap, Progress, RunRecord, Schedule, SkipReason, from_millis, millis};
use crate::store::buckets::{BucketError, BucketName, BucketStore, Limits, Op, Write};

/// The bucket of every scheduled plugin's progress under a lease (one key
/// per plugin); a name no `keyvalue` grant may take.
pub const SCHEDULES_BUCKET: &str = "baton-schedules";

/// What a scheduled plugin's supervisor needs besides the plugin.
#[derive(Clone)]
pub struct Scheduling {
    /// The schedule as configured (a reload sends a new one; `None`: no
    /// longer scheduled, runs once per term).
    pub schedule: watch::Receiver<Option<Schedule>>,
    /// Where the progress is kept.
    pub store: Arc<dyn BucketStore>,
    /// This host's identity, recorded with each run.
    pub host: String,
    /// `baton run-now`: one extra run each.
    pub run_now: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>>,
}

/// A scheduled term's state: the plugin, the term, where its progress is.
struct Ctx<'a> {
    plugin: &'a Arc<Plugin>,
    term: &'a Arc<Term>,
    view: &'a watch::Receiver<LeaseView>,
    observer: &'a dyn TaskObserver,
    scheduling: &'a Scheduling,
    /// The time the schedule runs by (`baton run`: the system's).
    time: &'a HostTime,
    bucket: BucketName,
    /// A skip whose write went unanswered, with the progress written.
    unsettled: Mutex<Option<(Skip, Progress)>>,
}

/// Due times skipped: `count` of them up to `upto`, for `reason`.
#[derive(Clone, Copy)]
struct Skip {
    upto: SystemTime,
    count: u64,
    reason: SkipReason,
}

/// Why a scheduled term's work ended.
enum Stop {
    /// The term is over (or its writes are fenced).
    Term,
}

/// Runs `plugin` on its schedule for as long as `term` lasts.
pub(super) async fn run_scheduled_term(
    plugin: &Arc<Plugin>,
    term: &Arc<Term>,
    view: &watch::Receiver<LeaseView>,
    observer: &dyn TaskObserver,
    scheduling: &Scheduling,
    time: &HostTime,
) {
    let bucket = BucketName::new(term.lease(), SCHEDULES_BUCKET);
    let ctx = Ctx {
        plugin,
        term,
        view,
        observer,
        scheduling,
        time,
        bucket,
        unsettled: Mutex::new(None),
    };
    if let Err(e) = scheduling.store.claim(&ctx.bucket, term.number()).await {
        tracing::warn!(plugin = plugin.name(), term = term.number(), error = %e, "cannot claim the schedule's progress for the term; no run in it");
        return;
    }
    let mut run_now = scheduling.run_now.lock().await;
    while !term.is_over() {
        if let Err(Stop::Term) = ctx.step(&mut run_now).await {
            break;
        }
    }
    ctx.unsettled_said();
}

impl Ctx<'_> {
    fn name(&self) -> &str {
        self.plugin.name()
    }

    /// The time now, as the schedule runs by.
    fn now(&self) -> SystemTime {
        self.time.now()
    }

    /// One decision, and what it takes.
    async fn step(&self, run_now: &mut mpsc::UnboundedReceiver<()>) -> Result<(), Stop> {
        let Some(schedule) = self.scheduling.schedule.borrow().clone() else {
            self.term.over().await;
            return Err(Stop::Term);
        };
        let Some(mut progress) = self.read().await? else {
            return Ok(());
        };
        match crate::schedule::next(&schedule, &progress, self.now()) {
            Next::Skip { upto, count, reason } => self.skip(&mut progress, upto, count, reason).await,
            Next::Run {
                due,
                attempt,
                on_demand,
            } => {
                let run = ScheduledRun {
                    due,
                    attempt,
                    on_demand,
                };
                self.run(&schedule, &mut progress, run).await
            }
            Next::GiveUp { due } => self.give_up(&mut progress, due).await,
            Next::Wait(until) => self.wait(Some(until), run_now).await,
            Next::Idle => self.wait(None, run_now).await,
        }
    }

    /// Waits until `until` (`None`: a reload), the term's end, or `baton
    /// run-now` (then runs on demand).
    async fn wait(
        &self,
        until: Option<SystemTime>,
        run_now: &mut mpsc::UnboundedReceiver<()>,
    ) -> Result<(), Stop> {
        let mut schedule = self.scheduling.schedule.clone();
        tokio::select! {
            _ = self.time.wait_until(until) => Ok(()),
            _ = self.term.over() => Err(Stop::Term),
            _ = schedule.changed() => Ok(()),
            asked = run_now.recv(), if !run_now.is_closed() => {
                if asked.is_some() {
                    self.on_demand().await?;
                }
                Ok(())
            }
        }
    }

    /// One run asked by `baton run-now`: recorded, but its due time (now)
    /// is not a scheduled one.
    async fn on_demand(&self) -> Result<(), Stop> {
        let Some(mut progress) = self.read().await? else {
            return Ok(());
        };
        let schedule = self.scheduling.schedule.borrow().clone();
        // Whole milliseconds, as recorded: a run cut off and run again
        // gets the very due time the first attempt got.
        let run = ScheduledRun {
            due: from_millis(millis(self.now())),
            attempt: 0,
            on_demand: true,
        };
        match schedule {
            Some(s) => self.run(&s, &mut progress, run).await,
            None => Ok(()),
        }
    }

    /// A cut-off `baton run-now` run past its deadline: recorded as cut
    /// off, nothing else.
    async fn give_up(&self, progress: &mut Progress, due: SystemTime) -> Result<(), Stop> {
        progress.cut_off();
        if self.write(progress, None).await? {
            tracing::info!(plugin = self.name(), term = self.term.number(), due = %humantime::format_rfc3339_millis(due),
                "a run asked by `baton run-now`, cut off, is past its starting deadline: not run again");
        }
        Ok(())
    }

    async fn skip(
        &self,
        progress: &mut Progress,
        upto: SystemTime,
        count: u64,
        reason: SkipReason,
    ) -> Result<(), Stop> {
        progress.cut_off();
        progress.skipped(upto, count, reason);
        self.write(progress, Some(Skip { upto, count, reason })).await?;
        Ok(())
    }

    /// Runs `run`: recorded as started, its jitter waited, run until it
    /// returns, the term's force-stop, or (with `overlap = "replace"`) the
    /// next due time; then recorded as ended, and the due times that came
    /// meanwhile skipped if `overlap = "skip"`.
    async fn run(&self, schedule: &Schedule, progress: &mut Progress, run: ScheduledRun) -> Result<(), Stop> {
        let jitter = if run.on_demand {
            Duration::ZERO
        } else {
            self.jitter(schedule).await?
        };
        progress.cut_off();
        progress.started(self.record(&run));
        if !self.write(progress, None).await? {
            return Ok(());
        }
        let lateness = self.now().duration_since(run.due).unwrap_or(Duration::ZERO);
        tracing::info!(plugin = self.name(), term = self.term.number(), due = %humantime::format_rfc3339_millis(run.due),
            attempt = run.attempt, on_demand = run.on_demand, late_ms = crate::support::rounding::ms(lateness),
            jitter_ms = crate::support::rounding::ms(jitter), "scheduled run started");
        let outcome = self.attempt(schedule, &run).await;
        // A run that returned ok completed, also within the grace after its
        // term ended (its end is still written then, unless a newer term
        // has claimed the progress). One stopped at the force-stop, not
        // started, or failing after its term ended (told to stop, it could
        // not finish) stays recorded as started: the next leader runs it
        // again.
        let outcome = outcome.filter(|o| !matches!(o, TaskOutcome::NotStarted) && !o.stopped_by_host());
        let completed = |o: &TaskOutcome| matches!(o, TaskOutcome::Finished) || !self.term.is_over();
        let Some(outcome) = outcome.filter(completed) else {
            tracing::info!(plugin = self.name(), term = self.term.number(), due = %humantime::format_rfc3339_millis(run.due),
                "scheduled run cut off by its term's end: the next leader runs it again");
            return Err(Stop::Term);
        };
        let label = label(&outcome);
        self.ended(schedule, &run, &label).await?;
        tracing::info!(plugin = self.name(), term = self.term.number(), due = %humantime::format_rfc3339_millis(run.due),
            outcome = %label, "scheduled run ended");
        self.observer
            .scheduled_run(self.name(), &run, outcome_kind(&outcome), lateness);
        Ok(())
    }

    /// Records the run's end (and the overlap's skips), trying again until
    /// it is written or the term's writes are refused: a run that ended and
    /// is not recorded would run again.
    async fn ended(&self, schedule: &Schedule, run: &ScheduledRun, label: &str) -> Result<(), Stop> {
        let (due, term) = (millis(run.due), self.term.number());
        loop {
            let Some(mut progress) = self.read().await? else {
                continue;
            };
            let mine = |r: &RunRecord| r.term == term && r.due == due;
            if !progress.running.as_ref().is_some_and(mine) {
                // Written by an earlier try whose answer was lost, or taken
                // over by a newer term: only the former counts as ended.
                let written = progress.history.iter().any(|r| mine(r) && r.ended.is_some());
                return if written { Ok(()) } else { Err(Stop::Term) };
            }
            let skip = self.overlapped(schedule, run, &mut progress, label);
            if self.write(&progress, skip).await? {
                return Ok(());
            }
        }
    }

    /// The run ended with `label`; under `overlap = "skip"`, the due times
    /// that came while it ran are skipped.
    /// Returns the skip it recorded.
    fn overlapped(
        &self,
        schedule: &Schedule,
        run: &ScheduledRun,
        progress: &mut Progress,
        label: &str,
    ) -> Option<Skip> {
        progress.ended(self.now(), label);
        if schedule.overlap == Overlap::Skip
            && !run.on_demand
            && let Some(upto) = schedule.when.last_at_or_before(self.now())
            && Some(millis(upto)) > progress.handled
        {
            let count = schedule.when.count_between(run.due, upto);
            let reason = SkipReason::Overlap;
            progress.skipped(upto, count, reason);
            return Some(Skip { upto, count, reason });
        }
        None
    }

    /// A skip written: logged and counted.
    fn skipped_said(&self, skip: Skip) {
        let Skip { upto, count, reason } = skip;
        if count == 0 {
            return;
        }
        tracing::warn!(plugin = self.name(), term = self.term.number(), count, reason = reason.label(),
            upto = %humantime::format_rfc3339_millis(upto), "scheduled runs skipped");
        self.observer.schedule_skipped(self.name(), reason.label(), count);
    }

    /// The skip whose write went unanswered, if any. Every change is one
    /// assignment: a poisoned lock is used as is.
    fn unsettled(&self) -> std::sync::MutexGuard<'_, Option<(Skip, Progress)>> {
        self.unsettled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The progress read: settles a skip whose write went unanswered (it
    /// landed if the progress is the one written; no other write of this
    /// term came between).
    fn settle(&self, read: &Progress) {
        match self.unsettled().take() {
            Some((skip, written)) if written == *read => self.skipped_said(skip),
            Some((skip, _)) => tracing::debug!(
                plugin = self.name(),
                term = self.term.number(),
                count = skip.count,
                reason = skip.reason.label(),
                "a skip whose write went unanswered did not land"
            ),
            None => {}
        }
    }

    /// The term's work ended with a skip's write unanswered: whether it
    /// landed, the progress will tell (`baton status`).
    fn unsettled_said(&self) {
        if let Some((Skip { upto, count, reason }, _)) = self.unsettled().take().filter(|(s, _)| s.count > 0)
        {
            tracing::warn!(plugin = self.name(), term = self.term.number(), count, reason = reason.label(),
                upto = %humantime::format_rfc3339_millis(upto),
                "scheduled runs skipped, unconfirmed: the store did not answer the write before the term ended");
        }
    }

    /// The run's task, until it returns (`Some`) or is stopped (`None`): at
    /// the term's force-stop, or at the next due time under `replace`.
    async fn attempt(&self, schedule: &Schedule, run: &ScheduledRun) -> Option<TaskOutcome> {
        let task = self
            .plugin
            .run_scheduled(self.term.clone(), self.view.clone(), run.clone());
        let attempt = run_attempt(self.plugin, self.term, self.observer, task);
        let next_due = schedule.when.next_after(run.due.max(self.now()));
        match (schedule.overlap, next_due) {
            (Overlap::Replace, Some(next)) if !run.on_demand => {
                tokio::select! {
                    outcome = attempt => outcome,
                    _ = self.time.sleep_until(next) => {
                        tracing::warn!(plugin = self.name(), term = self.term.number(), "scheduled run replaced by the next due time");
                        Some(TaskOutcome::Failed("replaced by the next due time".into()))
                    }
                }
            }
            _ => attempt.await,
        }
    }

    /// Waits a random part of the schedule's jitter; returns how long.
    async fn jitter(&self, schedule: &Schedule) -> Result<Duration, Stop> {
        if schedule.jitter.is_zero() {
            return Ok(Duration::ZERO);
        }
        let wait = rand::rng().random_range(Duration::ZERO..schedule.jitter);
        tokio::select! {
            _ = self.time.wait_until(Some(self.now() + wait)) => Ok(wait),
            _ = self.term.over() => Err(Stop::Term),
        }
    }

    fn record(&self, run: &ScheduledRun) -> RunRecord {
        RunRecord {
            due: millis(run.due),
            attempt: run.attempt,
            on_demand: run.on_demand,
            started: millis(self.now()),
            ended: None,
            outcome: None,
            host: self.scheduling.host.clone(),
            term: self.term.number(),
        }
    }

    /// The plugin's progress (`None`: the store failed, and was waited
    /// out); a malformed one is logged and read as empty (so the schedule
    /// starts from now).
    async fn read(&self) -> Result<Option<Progress>, Stop> {
        let read = match self.scheduling.store.get(&self.bucket, self.name()).await {
            Ok(None) => Progress::default(),
            Ok(Some(entry)) => Progress::from_bytes(&entry.value).unwrap_or_else(|e| {
                tracing::error!(plugin = self.name(), bucket = %self.bucket, error = %e, "the schedule's progress is unreadable; starting from now");
                Progress::default()
            }),
            Err(e) => return self.failed(e).await.map(|()| None),
        };
        self.settle(&read);
        Ok(Some(read))
    }

    /// Writes the progress in the term, with the `skip` it carries (logged
    /// once known written): `true` once written, `false` if the store failed
    /// (waited out); a refusal (fenced, or past the force-stop) ends the
    /// term's work here.
    async fn write(&self, progress: &Progress, skip: Option<Skip>) -> Result<bool, Stop> {
        let mut progress = progress.clone();
        if let Some(s) = self.scheduling.schedule.borrow().as_ref() {
            progress.when = Some(s.when.to_string());
        }
        progress.written_in = Some(self.term.number());
        let term = self.term.clone();
        let write = Write {
            term: term.number(),
            ops: vec![Op::Set {
                key: self.name().to_owned(),
                value: progress.to_bytes(),
            }],
            limits: Limits::default(),
            may_commit: Arc::new(move || !term.must_stop()),
        };
        match self.scheduling.store.apply(&self.bucket, write).await {
            Ok(_) => {
                if let Some(s) = skip {
                    self.skipped_said(s);
                }
                Ok(true)
            }
            Err(e) => {
                if let Some(s) = skip.filter(|_| !e.is_stale()) {
                    *self.unsettled() = Some((s, progress));
                }
                self.failed(e).await.map(|()| false)
            }
        }
    }

    /// A store failure: a stale term stops here; anything else is logged and
    /// waited out (one second, or the term's end).
    async fn failed(&self, e: BucketError) -> Result<(), Stop> {
        if e.is_stale() {
            tracing::warn!(plugin = self.name(), term = self.term.number(), error = %e, "the schedule's progress is fenced: a newer term leads");
            return Err(Stop::Term);
        }
        tracing::warn!(plugin = self.name(), term = self.term.number(), error = %e, "cannot read or write the schedule's progress; retrying");
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => Ok(()),
            _ = self.term.over() => Err(Stop::Term),
        }
    }
}

/// The outcome as recorded.
fn label(outcome: &TaskOutcome) -> String {
    match outcome {
        TaskOutcome::Finished => "ok".into(),
        other => other.to_string(),
    }
}

/// The outcome's kind, for metrics: `ok`, `failed`, `trapped`.
fn outcome_kind(outcome: &TaskOutcome) -> &'static str {
    match outcome {
        TaskOutcome::Finished => "ok",
        TaskOutcome::Failed(_) => "failed",
        TaskOutcome::NotStarted => "not-started",
        TaskOutcome::Trapped(_) => "trapped",
    }
}

#[cfg(test)]
mod tests;
