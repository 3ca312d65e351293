//! Leader tasks: k0s's `RunLeaderTasks`, for components.
//!
//! For each plugin: wait until this host leads its lease in a [`Term`]; run
//! the task in a fresh instance; once the term is over, let the task return
//! by itself until the term's force-stop time, then drop its instance. A
//! task that returns `ok` is done for the term; one that fails or traps is
//! retried, in a fresh instance, after an exponential back-off, while the
//! term lasts.
//!
//! While it waits for a term, it prepares the instance of the next term's
//! first run ([`Plugin::prepare`]: instantiated, its term unset), so that
//! taking the lead costs only the call into `run`; a plugin with a schedule
//! is not prepared for. A new version (a reload) drops the prepared
//! instance.
//!
//! The supervisor owns the task's future (nothing is spawned), so dropping
//! it, or the supervisor, ends the instance wherever it is; and it holds
//! the term's [`TermTask`](crate::election::TermTask) until then, so the
//! lease is not released while an instance of the term exists. The forced
//! stop is armed from the term itself ([`Term::stop_due`]), not from the
//! elector's news: a stuck elector cannot delay it.
//!
//! Before a term's first instance starts, its plugin passes the lease's
//! *admission* ([`Admission`]), if it has one: the term's records claim
//! the plugin and no other lease's do (see [`crate::election::claims`]), so
//! that it never runs under two leases at once, on this host or another.
//!
//! A plugin with a schedule runs each due time instead, in a fresh
//! instance, while the term lasts ([`scheduled`]).
//!
//! Beside a term's task, a plugin's health check, if configured, is called
//! every period; one that keeps failing hands the lease over ([`health`]).
//!
//! What happens to each task is told to a [`TaskObserver`] (metrics, at
//! the edge); the supervisor itself keeps no counts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::election::{ClaimGate, Intent, LeaseClaims, LeaseView, Moment, Term};
use crate::runtime::{Plugin, Prepared, TaskOutcome};
use crate::schedule::ScheduledRun;

mod health;
mod scheduled;
pub mod time;

pub use scheduled::{SCHEDULES_BUCKET, Scheduling};
use time::HostTime;

/// The first retry of a failed task waits this long; each further failure
/// in the same term doubles it, up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between retries of a failing task: long enough not to
/// flood the logs, short enough to recover soon after a dependency does.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where a plugin's leader task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskState {
    /// No term to run in: this host does not lead the lease (or the task
    /// is done with the last term and waits for the next).
    Waiting,
    /// An instance runs in a term that lasts.
    Running,
    /// Its term is over: the task was told and has until the term's
    /// force-stop time to return.
    Stopping,
    /// It failed or trapped, and waits out its back-off before a retry.
    Backoff,
    /// It returned `ok`: done for this term.
    Finished,
}

impl TaskState {
    /// Every state, in order.
    pub const ALL: [TaskState; 5] = [
        TaskState::Waiting,
        TaskState::Running,
        TaskState::Stopping,
        TaskState::Backoff,
        TaskState::Finished,
    ];

    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Running => "running",
            TaskState::Stopping => "stopping",
            TaskState::Backoff => "backoff",
            TaskState::Finished => "finished",
        }
    }
}

/// How one run of a task ended, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskEnd {
    /// It returned `ok`.
    Finished,
    /// It returned an error.
    Failed,
    /// It trapped (not stopped by the host).
    Trapped,
    /// The host stopped it at its term's force-stop time (its instance
    /// dropped, or trapped by the fence or the epoch check).
    Forced,
    /// Its term was over before its instance was ready.
    NotStarted,
}

/// What a supervisor reports as it goes. Called on the supervisor's task:
/// cheap, never blocking. Every method has an empty default.
pub trait TaskObserver: Send + Sync + 'static {
    /// `plugin`'s task is now in `state`.
    fn state(&self, plugin: &str, state: TaskState) {
        let _ = (plugin, state);
    }

    /// An instance of `plugin` was started in a term.
    fn started(&self, plugin: &str) {
        let _ = plugin;
    }

    /// A run of `plugin`'s task ended so.
    fn ended(&self, plugin: &str, end: TaskEnd) {
        let _ = (plugin, end);
    }

    /// A run of `plugin`'s task was gone `after` the end of its term (by
    /// itself, or stopped by the host if `forced`).
    fn stopped(&self, plugin: &str, forced: bool, after: Duration) {
        let _ = (plugin, forced, after);
    }

    /// A scheduled run of `plugin`, `run`, ended with `outcome` (`ok`,
    /// `failed`, `trapped`), its end recorded; it started `lateness` after
    /// its due time.
    fn scheduled_run(&self, plugin: &str, run: &ScheduledRun, outcome: &'static str, lateness: Duration) {
        let _ = (plugin, run, outcome, lateness);
    }

    /// `count` due times of `plugin` were skipped for `reason`.
    fn schedule_skipped(&self, plugin: &str, reason: &'static str, count: u64) {
        let _ = (plugin, reason, count);
    }

    /// A health check of `plugin` ended with `outcome` (`ok`, `failed`,
    /// `trapped`, `timed-out`).
    fn health_check(&self, plugin: &str, outcome: &'static str) {
        let _ = (plugin, outcome);
    }

    /// A plugin's failing health check made this host hand `lease` over.
    fn health_handover(&self, lease: &str) {
        let _ = lease;
    }
}

/// A task observer that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTaskObserver;

impl TaskObserver for NoTaskObserver {}

/// What a plugin's task passes before it starts in a term: this host's
/// claims under the lease, and the gate that checks no other lease claims
/// the plugin ([`ClaimGate::admit`]).
#[derive(Clone)]
pub struct Admission {
    /// The gate, one per store.
    pub gate: Arc<ClaimGate>,
    /// This host's claims under the plugin's lease.
    pub claims: LeaseClaims,
    /// How often to look again while another lease claims the plugin.
    pub poll: Duration,
}

/// Runs `plugin`'s leader task in every term in which this host leads the
/// lease behind `view`. Returns once the elector is gone (its sender
/// dropped) and no task of the plugin runs. Tells `observer` what happens.
pub async fn run_leader_tasks(
    plugin: Arc<Plugin>,
    view: watch::Receiver<LeaseView>,
    observer: Arc<dyn TaskObserver>,
) {
    let (_keep, versions) = watch::channel(plugin);
    run_leader_tasks_of(versions, view, observer, Supervision::default()).await
}

/// What a plugin's supervision takes besides the plugin, its lease's view
/// and its observer; the default: none of it, on the system's time.
#[derive(Clone, Default)]
pub struct Supervision {
    /// A term's task starts only once this admits the plugin.
    pub admission: Option<Admission>,
    /// With a schedule in it, each term runs the plugin's due times instead
    /// of one task.
    pub scheduling: Option<Scheduling>,
    /// The lease's intent: a plugin whose health check keeps failing hands
    /// the lease over through it.
    pub intent: Option<watch::Sender<Intent>>,
    /// The time the schedule, the health checks' periods and the back-off
    /// between retries run by (a term's end never: [`time`]).
    pub time: HostTime,
}

/// [`run_leader_tasks`], for a plugin whose version may change (a reload):
/// each term runs the version current when it starts, so a new version
/// runs from the next term and never beside the old one. Returns, too,
/// once the versions' sender is dropped (the plugin was removed) and no
/// task of it runs. See [`Supervision`] for the rest.
pub async fn run_leader_tasks_of(
    mut versions: watch::Receiver<Arc<Plugin>>,
    mut view: watch::Receiver<LeaseView>,
    observer: Arc<dyn TaskObserver>,
    supervision: Supervision,
) {
    let Supervision {
        admission,
        scheduling,
        intent,
        time,
    } = supervision;
    let name = versions.borrow().name().to_owned();
    // The instance prepared for the next term, and the version it is of.
    let mut ahead: Option<(Arc<Plugin>, Prepared)> = None;
    let mut tried_ahead = false;
    loop {
        observer.state(&name, TaskState::Waiting);
        let wants_ahead = ahead.is_none() && !tried_ahead && on_schedule(scheduling.as_ref()).is_none();
        let following = view.clone();
        let current = versions.borrow().clone();
        let term = tokio::select! {
            biased;
            v = view.wait_for(|v| v.leading_term().is_some()) => match v {
                Ok(v) => v.leading_term().cloned(),
                Err(_) => return, // the elector is gone: no term will come
            },
            changed = versions.changed() => match changed {
                Ok(()) => {
                    (ahead, tried_ahead) = (None, false);
                    continue;
                }
                Err(_) => return, // removed: no term of it will come
            },
            made = current.prepare(&following), if wants_ahead => {
                // Once per wait: one that cannot be prepared now is made
                // as the term starts, which says why.
                tried_ahead = true;
                ahead = made.map(|p| (current.clone(), p));
                continue;
            },
        };
        let Some(term) = term else { continue };
        if versions.has_changed().is_err() {
            return;
        }
        let admitted = match &admission {
            Some(a) => tokio::select! {
                admitted = a.gate.admit(&name, &term, &a.claims, a.poll) => admitted,
                _ = removed(&mut versions) => return,
            },
            None => true,
        };
        if admitted && versions.has_changed().is_err() {
            return;
        }
        let plugin = versions.borrow_and_update().clone();
        if admitted && let Some(_entry) = term.enter() {
            // The prepared instance, if of this version.
            let prepared = ahead
                .take()
                .filter(|(of, _)| Arc::ptr_eq(of, &plugin))
                .map(|(_, p)| p);
            let work = async {
                match on_schedule(scheduling.as_ref()) {
                    Some(s) => {
                        scheduled::run_scheduled_term(&plugin, &term, &view, &*observer, s, &time).await
                    }
                    None => run_term(&plugin, &term, &view, &*observer, prepared, &time).await,
                }
            };
            health::beside(&plugin, &term, &view, &*observer, intent.as_ref(), &time, work).await;
        }
        // Not again in this term.
        term.over().await;
        tried_ahead = false;
    }
}

/// The scheduling, if the plugin runs on a schedule now (then each due
/// time makes its own instance: none is prepared ahead).
fn on_schedule(scheduling: Option<&Scheduling>) -> Option<&Scheduling> {
    scheduling.filter(|s| s.schedule.borrow().is_some())
}

/// Resolves once the versions' sender is dropped (the plugin was removed).
async fn removed(versions: &mut watch::Receiver<Arc<Plugin>>) {
    while versions.changed().await.is_ok() {}
}

/// Runs one term: tries the task until it finishes or the term is over,
/// and returns once no instance of this plugin runs in it any more. The
/// first try runs in `prepared`, if an instance was made ahead.
async fn run_term(
    plugin: &Arc<Plugin>,
    term: &Arc<Term>,
    view: &watch::Receiver<LeaseView>,
    observer: &dyn TaskObserver,
    mut prepared: Option<Prepared>,
    time: &HostTime,
) {
    let name = plugin.name();
    let mut backoff = INITIAL_BACKOFF;
    for attempt in 1u32.. {
        if term.is_over() {
            return;
        }
        tracing::info!(
            plugin = name,
            lease = term.lease(),
            term = term.number(),
            attempt,
            world = plugin.wit_world(),
            digest = plugin.digest(),
            prepared = prepared.is_some(),
            "leader task started"
        );
        let started = term.clock().now();
        let task = plugin.run_task_in(prepared.take(), term.clone(), view.clone());
        let Some(outcome) = run_attempt(plugin, term, observer, task).await else {
            return;
        };
        if !try_again(name, term, outcome, started, backoff, observer) {
            return;
        }
        observer.state(name, TaskState::Backoff);
        tokio::select! {
            _ = time.sleep(backoff) => {}
            _ = term.over() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Runs one attempt of the task, `task`, until it returns, or until the
/// term's force-stop time, when it is dropped (`None`). Reports how it
/// ended.
async fn run_attempt(
    plugin: &Arc<Plugin>,
    term: &Arc<Term>,
    observer: &dyn TaskObserver,
    task: impl std::future::Future<Output = TaskOutcome>,
) -> Option<TaskOutcome> {
    let name = plugin.name();
    observer.started(name);
    observer.state(name, TaskState::Running);
    let mut task = Box::pin(task);
    let mut told = false;
    let outcome = loop {
        tokio::select! {
            biased;
            _ = term.stop_due() => break None,
            outcome = &mut task => break Some(outcome),
            // Only reported: the task learns of it through its status.
            _ = term.over(), if !told => {
                told = true;
                observer.state(name, TaskState::Stopping);
            }
        }
    };
    // Dropping the task drops its Store: the instance ends wherever it is,
    // even inside a host call.
    drop(task);
    let Some(outcome) = outcome else {
        let after = term.clock().now().since(term.over_at());
        observer.ended(name, TaskEnd::Forced);
        observer.stopped(name, true, after);
        tracing::warn!(plugin = name, term = term.number(), after_ms = crate::support::rounding::ms(after), how = "forced", force_stop_at = %term.stop_at_wall(), "leader task stopped");
        return None;
    };
    observer.ended(
        name,
        match &outcome {
            TaskOutcome::Finished => TaskEnd::Finished,
            TaskOutcome::NotStarted => TaskEnd::NotStarted,
            TaskOutcome::Failed(_) => TaskEnd::Failed,
            o if o.stopped_by_host() => TaskEnd::Forced,
            TaskOutcome::Trapped(_) => TaskEnd::Trapped,
        },
    );
    Some(outcome)
}

/// Whether a task whose attempt (begun at `started`) ended with `outcome`
/// is tried again after `backoff`: only a failure or a trap while its term
/// goes on. Says how it ended.
fn try_again(
    name: &str,
    term: &Term,
    outcome: TaskOutcome,
    started: Moment,
    backoff: Duration,
    observer: &dyn TaskObserver,
) -> bool {
    let number = term.number();
    if let TaskOutcome::NotStarted = outcome {
        tracing::info!(
            plugin = name,
            term = number,
            "leader task not started: the term was over before its instance was ready"
        );
        return false;
    }
    if term.is_over() {
        // It returned because its term is over, or the host's fence or
        // epoch check stopped it at the force-stop time.
        let how = if outcome.stopped_by_host() {
            "forced"
        } else {
            "cooperative"
        };
        let after = term.clock().now().since(term.over_at());
        observer.stopped(name, outcome.stopped_by_host(), after);
        tracing::info!(plugin = name, term = number, after_ms = crate::support::rounding::ms(after), how, outcome = %outcome, force_stop_at = %term.stop_at_wall(), "leader task stopped");
        return false;
    }
    let retry_in_ms = backoff.as_millis() as u64;
    match outcome {
        TaskOutcome::Finished | TaskOutcome::NotStarted => {
            let ran_ms = crate::support::rounding::ms(term.clock().now() - started);
            tracing::info!(
                plugin = name,
                term = number,
                ran_ms,
                "leader task finished for this term"
            );
            observer.state(name, TaskState::Finished);
            false
        }
        TaskOutcome::Failed(error) => {
            tracing::warn!(
                plugin = name,
                term = number,
                error,
                retry_in_ms,
                "leader task failed"
            );
            true
        }
        TaskOutcome::Trapped(trap) => {
            tracing::warn!(plugin = name, term = number, error = %trap, retry_in_ms, "leader task trapped");
            tracing::debug!(plugin = name, term = number, detail = %trap.detail(), "trap details");
            true
        }
    }
}
