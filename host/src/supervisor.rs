//! Leader tasks: k0s's `RunLeaderTasks`, for components.
//!
//! For each plugin: wait until this host leads its lease; run the task in a
//! fresh instance; when the term ends, let the task stop by itself within
//! the grace period, then stop it by force. A task that returns `ok` is done
//! for the term; one that fails or traps is retried, in a fresh instance,
//! after an exponential back-off, while the term lasts. A plugin never
//! outlives its term, and nothing a plugin does affects the lease or other
//! plugins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::election::LeaseView;
use crate::runtime::{Plugin, TaskGuard, TaskOutcome};

/// The first retry of a failed task waits this long; each further failure
/// in the same term doubles it, up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between retries of a failing task: long enough not to
/// flood the logs, short enough to recover soon after a dependency does.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs `plugin`'s leader task whenever the lease behind `view` is led by
/// this host, until `stop` is cancelled and no task is running.
///
/// `grace` is how long a task may take to return after its term ended.
pub async fn run_leader_tasks(
    plugin: Arc<Plugin>,
    mut view: watch::Receiver<LeaseView>,
    grace: Duration,
    stop: CancellationToken,
) {
    loop {
        let leading = tokio::select! {
            v = view.wait_for(|v| v.status.is_leading()) => match v {
                Ok(v) => v.clone(),
                Err(_) => return, // the elector is gone
            },
            _ = stop.cancelled() => return,
        };
        let term = leading.status.term;
        run_term(&plugin, &leading, view.clone(), grace).await;
        // Not again in this term.
        tokio::select! {
            _ = view.wait_for(|v| !in_term(v, term)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

fn in_term(v: &LeaseView, term: u64) -> bool {
    v.status.is_leading() && v.status.term == term
}

/// Runs one term: tries the task until it finishes or the term ends, and
/// returns once no instance of this plugin runs any more.
async fn run_term(
    plugin: &Arc<Plugin>,
    leading: &LeaseView,
    view: watch::Receiver<LeaseView>,
    grace: Duration,
) {
    let name = plugin.name();
    let status = &leading.status;
    let term = status.term;
    let Some(deadline) = leading.deadline.clone() else {
        tracing::error!(plugin = name, lease = %status.lease, term, "leading without a term deadline; not starting");
        return;
    };
    let mut backoff = INITIAL_BACKOFF;
    let mut attempt = 0u32;
    loop {
        if Instant::now() >= deadline.until() {
            // The term ended while we backed off (or the process was paused).
            return;
        }
        attempt += 1;
        let kill = Arc::new(AtomicBool::new(false));
        let guard = TaskGuard {
            deadline: deadline.clone(),
            grace,
            kill: kill.clone(),
        };
        let stop_check = guard.clone();
        let started = Instant::now();
        tracing::info!(plugin = name, lease = %status.lease, term, attempt, "leader task started");
        let task = {
            let plugin = plugin.clone();
            let status = status.clone();
            let view = view.clone();
            tokio::spawn(async move { plugin.run_task(status, view, guard).await })
        };
        tokio::pin!(task);
        let mut term_watch = view.clone();
        let ended = tokio::select! {
            // A task that returns because its term ended is a stop, not a
            // finish: look at the term first.
            biased;
            _ = term_watch.wait_for(|v| !in_term(v, term)) => None,
            outcome = &mut task => Some(outcome),
        };
        match ended {
            Some(outcome) => {
                let outcome = outcome.unwrap_or_else(|e| TaskOutcome::Trapped(format!("task panicked: {e}")));
                let ran_ms = started.elapsed().as_secs_f64() * 1e3;
                if matches!(outcome, TaskOutcome::Trapped(_)) && stop_check.must_stop() {
                    // The guest itself noticed, at an epoch tick, that its
                    // term deadline plus grace had passed (the elector had
                    // not run yet, e.g. right after a pause).
                    let after_ms = (Instant::now() - deadline.until()).as_secs_f64() * 1e3;
                    tracing::warn!(
                        plugin = name,
                        term,
                        after_ms,
                        how = "forced",
                        "leader task stopped"
                    );
                    return;
                }
                match outcome {
                    TaskOutcome::Finished => {
                        tracing::info!(plugin = name, term, ran_ms, "leader task finished for this term");
                        return;
                    }
                    TaskOutcome::Failed(error) => {
                        tracing::warn!(
                            plugin = name,
                            term,
                            error,
                            retry_in_ms = backoff.as_millis() as u64,
                            "leader task failed"
                        );
                    }
                    TaskOutcome::Trapped(error) => {
                        tracing::warn!(
                            plugin = name,
                            term,
                            error,
                            retry_in_ms = backoff.as_millis() as u64,
                            "leader task trapped"
                        );
                    }
                }
                let mut term_watch = view.clone();
                tokio::select! {
                    _ = sleep(backoff) => {}
                    _ = term_watch.wait_for(|v| !in_term(v, term)) => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            None => {
                // The term is over: the guest's change signal has fired.
                let changed_at = term_watch.borrow().since;
                let kill_at = deadline.until().min(changed_at) + grace;
                tokio::select! {
                    outcome = &mut task => {
                        let after_ms = changed_at.elapsed().as_secs_f64() * 1e3;
                        let outcome = match outcome {
                            Ok(TaskOutcome::Finished) => "ok".to_owned(),
                            Ok(TaskOutcome::Failed(e)) => format!("error: {e}"),
                            Ok(TaskOutcome::Trapped(e)) => format!("trap: {e}"),
                            Err(e) => format!("panic: {e}"),
                        };
                        tracing::info!(plugin = name, term, after_ms, how = "cooperative", outcome, "leader task stopped");
                    }
                    _ = sleep_until(kill_at) => {
                        kill.store(true, Ordering::Relaxed);
                        task.abort();
                        let _ = (&mut task).await;
                        let after_ms = changed_at.elapsed().as_secs_f64() * 1e3;
                        tracing::warn!(plugin = name, term, after_ms, how = "forced", "leader task stopped");
                    }
                }
                return;
            }
        }
    }
}
