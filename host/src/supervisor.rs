//! Leader tasks: k0s's `RunLeaderTasks`, for components.
//!
//! For each plugin: wait until this host leads its lease in a [`Term`]; run
//! the task in a fresh instance; once the term is over, let the task return
//! by itself until the term's force-stop time, then drop its instance. A
//! task that returns `ok` is done for the term; one that fails or traps is
//! retried, in a fresh instance, after an exponential back-off, while the
//! term lasts.
//!
//! The supervisor owns the task's future (nothing is spawned), so dropping
//! it, or the supervisor, ends the instance wherever it is; and it holds
//! the term's [`TermTask`](crate::election::TermTask) until then, so the
//! lease is not released while an instance of the term exists. The forced
//! stop is armed from the term itself ([`Term::stop_due`]), not from the
//! elector's news: a stuck elector cannot delay it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::sleep;

use crate::election::{LeaseView, Term};
use crate::runtime::{Plugin, TaskOutcome};

/// The first retry of a failed task waits this long; each further failure
/// in the same term doubles it, up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between retries of a failing task: long enough not to
/// flood the logs, short enough to recover soon after a dependency does.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs `plugin`'s leader task in every term in which this host leads the
/// lease behind `view`. Returns once the elector is gone (its sender
/// dropped) and no task of the plugin runs.
pub async fn run_leader_tasks(plugin: Arc<Plugin>, mut view: watch::Receiver<LeaseView>) {
    loop {
        let term = match view.wait_for(|v| v.leading_term().is_some()).await {
            Ok(v) => v.leading_term().cloned(),
            Err(_) => return, // the elector is gone: no term will come
        };
        let Some(term) = term else { continue };
        if let Some(_entry) = term.enter() {
            run_term(&plugin, &term, &view).await;
        }
        // Not again in this term.
        term.over().await;
    }
}

/// Runs one term: tries the task until it finishes or the term is over,
/// and returns once no instance of this plugin runs in it any more.
async fn run_term(plugin: &Arc<Plugin>, term: &Arc<Term>, view: &watch::Receiver<LeaseView>) {
    let name = plugin.name();
    let (lease, number) = (term.lease(), term.number());
    let after_ms = || crate::logging::ms(term.clock().now() - term.over_at());
    let mut backoff = INITIAL_BACKOFF;
    for attempt in 1u32.. {
        if term.is_over() {
            return;
        }
        tracing::info!(
            plugin = name,
            lease,
            term = number,
            attempt,
            "leader task started"
        );
        let started = term.clock().now();
        let mut task = Box::pin(plugin.run_task(term.clone(), view.clone()));
        let outcome = tokio::select! {
            biased;
            _ = term.stop_due() => None,
            outcome = &mut task => Some(outcome),
        };
        let Some(outcome) = outcome else {
            // Dropping the task drops its Store: the instance ends
            // wherever it is, even inside a host call.
            drop(task);
            tracing::warn!(plugin = name, term = number, after_ms = after_ms(), how = "forced", force_stop_at = %term.stop_at_wall(), "leader task stopped");
            return;
        };
        drop(task);
        if let TaskOutcome::NotStarted = outcome {
            tracing::info!(
                plugin = name,
                term = number,
                "leader task not started: the term was over before its instance was ready"
            );
            return;
        }
        if term.is_over() {
            // It returned because its term is over, or the host's fence or
            // epoch check stopped it at the force-stop time.
            let how = if outcome.stopped_by_host() {
                "forced"
            } else {
                "cooperative"
            };
            tracing::info!(plugin = name, term = number, after_ms = after_ms(), how, outcome = %outcome, force_stop_at = %term.stop_at_wall(), "leader task stopped");
            return;
        }
        let ran_ms = crate::logging::ms(term.clock().now() - started);
        match outcome {
            TaskOutcome::Finished | TaskOutcome::NotStarted => {
                tracing::info!(
                    plugin = name,
                    term = number,
                    ran_ms,
                    "leader task finished for this term"
                );
                return;
            }
            TaskOutcome::Failed(error) => {
                tracing::warn!(
                    plugin = name,
                    term = number,
                    error,
                    retry_in_ms = backoff.as_millis() as u64,
                    "leader task failed"
                );
            }
            TaskOutcome::Trapped(trap) => {
                tracing::warn!(plugin = name, term = number, error = %trap, retry_in_ms = backoff.as_millis() as u64, "leader task trapped");
                tracing::debug!(
                    plugin = name,
                    term = number,
                    detail = %trap.detail(),
                    "trap details"
                );
            }
        }
        tokio::select! {
            _ = sleep(backoff) => {}
            _ = term.over() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
