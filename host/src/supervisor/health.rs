//! The health check while this host leads (`baton:leader@0.4.0`): for a
//! plugin with a `health-check` table whose component exports a check,
//! the check is called every period, from one period after the term's
//! task began until the term is over or the task is done with it, in an
//! instance of its own ([`HealthChecker`]). A check that fails, traps or
//! times out counts one failure; `threshold` failures in a row hand the
//! whole lease over the graceful way of `baton yield`
//! ([`Intent::StandBy`]: every task of the lease is told, drained, then
//! the lease released) and keep this host out of contention for the
//! back-off. A success resets the count.
//!
//! Invariants: no check runs before its term's task is admitted or once
//! the term is over (the check's future, and so its instance, is dropped
//! then), and no check that ends after its term counts; a hand-over never overrides a stop, nor a stand-by that lasts
//! longer, nor any intent other than contending.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::TaskObserver;
use super::time::HostTime;
use crate::election::{Intent, LeaseView, Term};
use crate::runtime::{CheckOutcome, HealthCheck, HealthChecker, Plugin};
use crate::support::rounding::human;

/// Something whose health can be checked: a plugin's [`HealthChecker`],
/// or a script in tests.
pub(super) trait Check {
    /// One check, within `timeout`.
    fn check(&mut self, timeout: std::time::Duration) -> impl Future<Output = CheckOutcome> + Send;
}

impl Check for HealthChecker<'_> {
    fn check(&mut self, timeout: std::time::Duration) -> impl Future<Output = CheckOutcome> + Send {
        HealthChecker::check(self, timeout)
    }
}

/// Failures in a row, against a threshold.
#[derive(Debug)]
pub(super) struct FailureCount {
    threshold: u32,
    in_a_row: u32,
}

impl FailureCount {
    pub(super) fn new(threshold: u32) -> FailureCount {
        FailureCount {
            threshold: threshold.max(1),
            in_a_row: 0,
        }
    }

    /// Counts one check: a success resets the count. Returns the failures
    /// in a row so far, and whether they reach the threshold.
    pub(super) fn record(&mut self, healthy: bool) -> (u32, bool) {
        self.in_a_row = if healthy { 0 } else { self.in_a_row + 1 };
        (self.in_a_row, self.in_a_row >= self.threshold)
    }
}

/// Checks `checker` every `settings.period` (the first a period from now)
/// until `over` resolves (`None`) or `threshold` checks in a row failed:
/// then the last failure. `report` is told each outcome and the failures
/// in a row.
///
/// A check that comes back once its term is over (`is_over`) counts for
/// nothing and is not reported: its answer (often a trap *because* the term
/// ended, or a timeout stretched by a paused process) says nothing of the
/// plugin's health, and a hand-over for a lease this host no longer leads
/// would only keep it out of the next election. `is_over` is asked, not
/// `over` polled, because both may be ready at once.
pub(super) async fn watch_health<C: Check>(
    checker: &mut C,
    settings: &HealthCheck,
    time: &HostTime,
    over: impl Future<Output = ()>,
    is_over: impl Fn() -> bool,
    mut report: impl FnMut(&CheckOutcome, u32),
) -> Option<CheckOutcome> {
    let mut over = pin!(over);
    let mut count = FailureCount::new(settings.threshold);
    let mut next = time.deadline(settings.period);
    loop {
        tokio::select! {
            biased;
            _ = &mut over => return None,
            _ = next.reached() => {}
        }
        let outcome = tokio::select! {
            biased;
            _ = &mut over => return None,
            outcome = checker.check(settings.timeout) => outcome,
        };
        if is_over() {
            return None;
        }
        // The timeout is below the period: the next check is due after
        // this one ended.
        next.next(settings.period);
        let (failures, reached) = count.record(outcome.is_healthy());
        report(&outcome, failures);
        if reached {
            return Some(outcome);
        }
    }
}

/// Runs `work` (the term's task) and, beside it, the plugin's health
/// check if it has one configured and `intent` (its lease's) is given;
/// hands the lease over if the check keeps failing. Returns once `work`
/// does.
pub(super) async fn beside(
    plugin: &Arc<Plugin>,
    term: &Arc<Term>,
    view: &watch::Receiver<LeaseView>,
    observer: &dyn TaskObserver,
    intent: Option<&watch::Sender<Intent>>,
    time: &HostTime,
    work: impl Future<Output = ()>,
) {
    let checks = async {
        let (Some(settings), Some(intent)) = (plugin.health_check(), intent) else {
            return std::future::pending().await;
        };
        let Some(mut checker) = plugin.health_checker(term.clone(), view.clone()) else {
            return std::future::pending().await;
        };
        let (name, lease, number) = (plugin.name(), term.lease(), term.number());
        let failing = watch_health(&mut checker, settings, time, term.over(), || term.is_over(), |outcome, failures| {
            observer.health_check(name, outcome.as_str());
            if !outcome.is_healthy() {
                tracing::warn!(plugin = name, lease, term = number, failures, threshold = settings.threshold, reason = %outcome, "health check failed");
            }
        })
        .await;
        // Its instance goes at once.
        drop(checker);
        if let Some(last) = failing
            && stand_by(intent, Instant::now() + settings.back_off)
        {
            observer.health_handover(lease);
            tracing::warn!(plugin = name, lease, term = number, failures = settings.threshold, reason = %last,
                back_off = %human(settings.back_off),
                "plugin unhealthy: handing the lease over (its tasks are told, then drained; the lease released) and staying out of contention for the back-off");
        }
    };
    let mut work = pin!(work);
    tokio::select! {
        _ = &mut work => return,
        () = checks => {}
    }
    work.await
}

/// Sets the lease's elector to hand the lead over and stand by until
/// `until`, as `baton yield` does, if it contends now (or stands by for
/// less long). `false` if it is stopping, draining or stands by longer.
fn stand_by(intent: &watch::Sender<Intent>, until: Instant) -> bool {
    intent.send_if_modified(|intent| match *intent {
        Intent::Contend | Intent::Defer { .. } | Intent::HandOver { .. } => {
            *intent = Intent::StandBy { until };
            true
        }
        Intent::StandBy { until: before } if before < until => {
            *intent = Intent::StandBy { until };
            true
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests;
